"""The host side of sciax: scenario files, the jobs that run them, and the `sciax` command.

- `schema`: what every scenario file shares (`ScenarioError`, value checkers, reading a file).
- `scenario`: the schema of a fixed-step run of an ODE or particle system, and the objects it
  describes; `runner`: runs it in jitted chunks with progress, streamed outputs and `--resume`.
- `md_scenario`, `md_run`: the same for a molecular-dynamics run (a top-level `[md]` table).
- `folder`: the output folder every job writes (its lock, the progress line, provenance).
- `cli`: `sciax info | run | bench` (also `python -m sciax`).
"""
