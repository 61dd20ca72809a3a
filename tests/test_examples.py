"""Every example runs to completion and writes its figure; the four fitting examples also check
what they show (fitted values within 3 standard errors of the truth; single shooting failing
and multiple shooting recovering Lorenz) and exit non-zero when it stops being true.

The two foundation examples run by default, and the MD examples at a reduced size (`--quick`);
the longer ones (fits and sweeps, 5-40 s each, whose behaviour the unit tests in test_fit.py and
test_sweep.py cover; the MD examples at full size) are marked slow:
`python -m pytest -m slow tests/test_examples.py` runs them.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
QUICK = {"lorenz_quickstart.py", "kepler_energy.py"}
REDUCED = {"md_lj_liquid.py", "md_temperature_sweep.py"}  # run by default with --quick (a smaller size)
ALL = sorted(p.name for p in EXAMPLES.glob("*.py"))


def run_example(name, tmp_path, *args):
    out = tmp_path / (Path(name).stem + ".png")
    env = dict(os.environ, MPLBACKEND="Agg")
    env.pop("XLA_FLAGS", None)  # the example's own process: one CPU device, as a user would run it
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), str(out), *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.exists() and out.stat().st_size > 10_000, f"{name} wrote no figure"
    return proc.stdout


@pytest.mark.parametrize("name", sorted(QUICK))
def test_quick_example_runs(name, tmp_path):
    stdout = run_example(name, tmp_path)
    assert "wrote" in stdout


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_reduced_example_runs(name, tmp_path):
    stdout = run_example(name, tmp_path, "--quick")
    assert "wrote" in stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ALL if n not in QUICK])
def test_example_runs(name, tmp_path):
    run_example(name, tmp_path)


def test_every_example_is_listed():
    assert QUICK <= set(ALL) and REDUCED <= set(ALL) and len(ALL) >= 9
