"""The host side of sciax: scenario files, the jobs that run them, and the `sciax` command.

- `schema`: what every scenario file shares (`ScenarioError`, value checkers, `--set`, reading a
  file); `classes`: what a scenario can name (library classes, the user's `module:Class`).
- `scenario` with `scenario_settings`: the model (`[system]`, `[initial_state]`) and how to
  integrate it (`[integrator]` + `[run]`, or `[solve]`), and the objects they describe.
- One module per job, each with `run(scenario, out_dir, *, resume, progress)` and `report`:
  `runner` (a fixed-step run in jitted chunks with checkpoints and `--resume`, with
  `run_layout`), `solve_job` (`[solve]`), `sweep_job` (`[sweep]`, with `sweep_settings` and
  `sweep_plot`), `fit_job` (`[fit]`, with `fit_settings`), `md_run` (`[md]`, with
  `md_scenario`, `md_settings` and `md_analysis`).
- `folder`: the output folder every job writes (its lock, the progress line, the scenario copy).
- `cli`: `sciax info | list | validate | run | bench` (also `python -m sciax`).
"""
