"""One process of a multi-process sweep, started by tests/test_distributed.py.

Usage: python _distributed_worker.py OUT.npz
Environment: SCIAX_COORDINATOR, SCIAX_NUM_PROCESSES, SCIAX_PROCESS_ID (read by
`sciax.ensemble.initialize_distributed`), XLA_FLAGS for the number of local CPU devices.

Every process runs the same sweep (each computes its share of the members); each writes the
gathered result and the members it computed itself, so the test can check that the shares do
not overlap and that the gathered ensemble equals a single-process run.
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import sciax  # noqa: E402
from sciax.ensemble import initialize_distributed  # noqa: E402


def z_frames(traj):
    return traj.states[..., 2]  # z at the 11 saved frames


def case(gather=True):
    """The sweep every process runs: 5 x 3 = 15 members (shares 8 and 7), of which the 5 with
    sigma = 1e4 blow up (RK4 is unstable there) and must be reported, not stop the others."""
    import jax.numpy as jnp

    from sciax.ensemble import Quantile
    from sciax.integrators import RK4
    from sciax.systems import Lorenz

    return sciax.sweep(
        Lorenz(), jnp.array([1.0, 0.0, 0.0]),
        axes={"rho": jnp.linspace(10.0, 30.0, 5), "sigma": jnp.array([8.0, 10.0, 1e4])},
        rollout=sciax.Simulate(RK4(), dt=0.01, n_steps=200, save_every=20),
        output=z_frames,
        reduce={"mean": "mean", "var": "var", "max": "max", "q": Quantile([0.25, 0.75])},
        reduce_over="rho", keep=True, batch_size=4, gather=gather,
    )


def one_member():
    """A sweep with fewer members than processes: process 1 has none of its own and must still
    take part in the gathers (one all-padding chunk) instead of failing or hanging."""
    import jax.numpy as jnp

    from sciax.integrators import RK4
    from sciax.systems import Lorenz

    return sciax.sweep(
        Lorenz(), jnp.array([1.0, 0.0, 0.0]), axes={"rho": jnp.array([28.0])},
        rollout=sciax.Simulate(RK4(), dt=0.01, n_steps=100, save_every=100),
        output=lambda traj: traj.final_state, reduce="mean", keep=True,
    )


def main(path):
    started = initialize_distributed(initialization_timeout=60)
    assert started, "SCIAX_* environment variables were not set"
    result, local, single = case(), case(gather=False), one_member()
    try:  # every process's devices: a process can only shard its share over its own
        sciax.sweep(sciax.systems.Lorenz(), np.array([1.0, 0.0, 0.0]), axes={"rho": np.array([28.0])},
                    run=lambda system, y0, key: y0, devices=jax.devices())
        foreign_devices_error = ""
    except ValueError as e:
        foreign_devices_error = str(e)
    # The gather in rounds of a few bytes (instead of 64 MiB): the same ensemble, and a direct
    # gather of odd-sized leaves (a 0-d array, bools, a size that is not a multiple of the round).
    from sciax.ensemble import _devices

    _devices.ALLGATHER_PIECE_BYTES = 40
    pieces = case()
    me = jax.process_index()
    direct = _devices.allgather({"x": np.arange(37, dtype=np.float32).reshape(37, 1) + 100 * me,
                                 "flag": np.arange(11) % (2 + me) == 0, "scalar": np.float64(me) / 3,
                                 "empty": np.zeros((0, 3)), "big": np.array([2**62 + 1 + me], np.int64)})
    np.savez(
        path,
        piece_outputs=pieces.outputs,
        piece_q=pieces.reductions["q"],
        direct_x=direct["x"], direct_flag=direct["flag"], direct_scalar=direct["scalar"],
        direct_empty_shape=direct["empty"].shape, direct_big=direct["big"],
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        global_devices=len(jax.devices()),
        outputs=result.outputs,
        ok=result.ok,
        mean=result.reductions["mean"],
        var=result.reductions["var"],
        max=result.reductions["max"],
        q=result.reductions["q"],
        local_outputs=local.outputs,
        local_indices=local.member_indices,
        n_failures=len(result.failures),
        failure_index=[f["index"] for f in result.failures],
        one_outputs=single.outputs,
        one_mean=single.reductions["mean"],
        one_process_members=single.info["process_members"],
        foreign_devices_error=foreign_devices_error,
    )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
