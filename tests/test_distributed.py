"""Multi-process sweeps with jax.distributed: two local processes over loopback (CPU, Gloo)
give the same ensemble as one process; starting the runtime from environment variables."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sciax.ensemble import _devices

HERE = Path(__file__).parent
TIMEOUT = 240  # seconds for the whole two-process run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n_processes, tmp_path, local_devices=(1,)):
    """Start `n_processes` workers (process i with `local_devices[i % len]` CPU devices); wait for
    all; kill every child if one fails or hangs."""
    port = free_port()
    procs, logs = [], []
    for i in range(n_processes):
        env = dict(os.environ, SCIAX_COORDINATOR=f"127.0.0.1:{port}", SCIAX_NUM_PROCESSES=str(n_processes),
                   SCIAX_PROCESS_ID=str(i), JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={local_devices[i % len(local_devices)]}")
        log = open(tmp_path / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, str(HERE / "_distributed_worker.py"),
                                       str(tmp_path / f"out{i}.npz")], env=env, stdout=log,
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    if any(p.returncode != 0 for p in procs):
        detail = "\n".join(f"--- worker {i} (exit {p.returncode}):\n{(tmp_path / f'worker{i}.log').read_text()[-3000:]}"
                           for i, p in enumerate(procs))
        pytest.fail(f"distributed workers failed or timed out:\n{detail}")
    return [dict(np.load(tmp_path / f"out{i}.npz")) for i in range(n_processes)]


def test_two_processes_equal_one(tmp_path):
    sys.path.insert(0, str(HERE))
    try:
        import _distributed_worker as worker
    finally:
        sys.path.remove(str(HERE))
    single = worker.case()  # this process: 4 local devices, one process
    one = worker.one_member()
    # Unequal local device counts (nodes with different GPU counts): the final gather runs over
    # one device per process, so it does not need them equal.
    outs = launch(2, tmp_path, local_devices=(1, 3))
    shares = []
    for p, out in enumerate(outs):
        assert int(out["process_index"]) == p and int(out["process_count"]) == 2
        assert int(out["global_devices"]) == 4  # 1 + 3 local devices
        np.testing.assert_array_equal(out["outputs"], single.outputs)  # bitwise, failed members' NaNs too
        np.testing.assert_array_equal(out["ok"], single.ok)
        assert out["failure_index"].tolist() == [f["index"] for f in single.failures] == [2, 5, 8, 11, 14]
        for name in ("mean", "var", "max"):
            np.testing.assert_allclose(out[name], single.reductions[name], rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(out["q"], single.reductions["q"], rtol=1e-13)
        # gather=False: each process holds only the members it computed
        local = out["local_outputs"]
        np.testing.assert_array_equal(local, single.outputs.reshape(15, -1)[out["local_indices"]])
        shares.append(out["local_indices"])
        # One member, two processes: process 1 computes nothing but still gets the result.
        np.testing.assert_array_equal(out["one_outputs"], one.outputs)
        np.testing.assert_array_equal(out["one_mean"], one.reductions["mean"])
        assert out["one_process_members"].tolist() == ([0, 1] if p == 0 else [1, 1])
        assert "device(s) of other processes" in str(out["foreign_devices_error"])
        # The final gather in rounds of 40 bytes per process: the same ensemble, bitwise.
        np.testing.assert_array_equal(out["piece_outputs"], single.outputs)
        np.testing.assert_array_equal(out["piece_q"], out["q"])
        np.testing.assert_array_equal(out["direct_x"], np.stack([np.arange(37.0).reshape(37, 1) + 100 * q
                                                                 for q in range(2)]).astype(np.float32))
        assert out["direct_x"].dtype == np.float32
        np.testing.assert_array_equal(out["direct_flag"], [np.arange(11) % (2 + q) == 0 for q in range(2)])
        np.testing.assert_array_equal(out["direct_scalar"], [0.0, 1 / 3])
        assert out["direct_empty_shape"].tolist() == [2, 0, 3]
        assert out["direct_big"].dtype == np.int64 and out["direct_big"].tolist() == [[2**62 + 1], [2**62 + 2]]
    assert np.array_equal(np.sort(np.concatenate(shares)), np.arange(15))  # no member twice, none missing
    assert [len(s) for s in shares] == [8, 7]


# ------------------------------------------------------------------- starting the runtime
@pytest.fixture
def clean_env(monkeypatch):
    for name in ("SCIAX_COORDINATOR", "SCIAX_NUM_PROCESSES", "SCIAX_PROCESS_ID", "SLURM_NTASKS", "SLURM_JOB_ID",
                 "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_single_process_without_settings(clean_env):
    assert _devices.initialize_distributed() is False


def test_released_names_still_import():
    """`sciax.parallel` (0.1.0's module) is the ensemble package's devices module under its old
    name, and `initialize_distributed` is public in `sciax.ensemble`."""
    import sciax.parallel
    from sciax.parallel import initialize_distributed, member_mesh

    import sciax

    assert sciax.parallel is _devices and sciax.ensemble.initialize_distributed is initialize_distributed
    assert initialize_distributed is _devices.initialize_distributed and member_mesh is _devices.member_mesh


def test_slurm_batch_script_outside_srun_is_single_process(clean_env):
    """`sbatch --ntasks=4` sets the job's variables in the batch script itself, where there is
    no job step (no SLURM_STEP_NODELIST) for JAX to read a coordinator from: run single-process
    instead of failing."""
    for name, value in dict(SLURM_JOB_ID="200505", SLURM_NTASKS="4", SLURM_PROCID="0",
                            SLURM_NODELIST="gnode[10,20,25,37]").items():
        clean_env.setenv(name, value)
    assert _devices.initialize_distributed() is False
    assert not _devices._in_slurm_step()
    clean_env.setenv("SLURM_STEP_NODELIST", "gnode[10,20,25,37]")
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "4")
    assert _devices._in_slurm_step()  # inside srun: JAX's SLURM detection takes over
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert not _devices._in_slurm_step()


def test_partial_settings_name_what_is_missing(clean_env):
    clean_env.setenv("SCIAX_COORDINATOR", "127.0.0.1:1234")
    with pytest.raises(ValueError, match=r"missing \['SCIAX_NUM_PROCESSES', 'SCIAX_PROCESS_ID'\]"):
        _devices.initialize_distributed()


def test_bad_settings(clean_env):
    clean_env.setenv("SCIAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="SCIAX_NUM_PROCESSES must be an integer, got 'two'"):
        _devices.initialize_distributed()
    with pytest.raises(ValueError, match="0 <= process_id < num_processes, got num_processes=2, process_id=2"):
        _devices.initialize_distributed("127.0.0.1:1234", 2, 2)


def test_process_shares_cover_members_once():
    for n_members in (1, 7, 15, 100):
        for n_proc in (1, 2, 3, 8):
            ranges = [_devices.process_share(n_members, p, n_proc) for p in range(n_proc)]
            members = np.concatenate([np.arange(a, b) for a, b in ranges])
            assert np.array_equal(members, np.arange(n_members))
            assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1
