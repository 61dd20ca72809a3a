"""`sweep(order="cost")`: members ordered by a pilot estimate of their step count, run in
buckets of similar cost; and the check of a user's member order."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .._rollout import Solve
from .._validation import describe
from . import _chunking, _devices

# Cost ordering for adaptive solves. Under `vmap` Diffrax's while-loop runs until the slowest
# member of the batch finishes, and every lane computes every iteration, so a batch costs
# (batch size) x (its largest step count). Sorting members by estimated cost and running
# buckets of similar cost removes most of that waste; buckets of 32 members per device were the
# best compromise with the per-iteration overhead in our measurements on CPU (docs/multihost.md).
# Buckets run one after another, so on an accelerator 32 members would leave it nearly idle:
# there every device gets ACCELERATOR_COST_BUCKETS buckets of at least ACCELERATOR_MIN_BUCKET
# members (a GPU needs tens of thousands of members in flight; not yet measured on one).
COST_BUCKET = 32
ACCELERATOR_COST_BUCKETS = 8
ACCELERATOR_MIN_BUCKET = 16384
PILOT_STEPS = 256
PILOT_FRAMES = 257


def _cost_order(order, system, state0, axes, mode, rollout, key, batch_size, memory_budget, devices):
    """Order members by a pilot estimate of their step count (most expensive first).

    The pilot solves every member with the same solver and tolerances but at most
    `PILOT_STEPS` steps, saving `PILOT_FRAMES` times over [t0, t1]; a member that finishes
    gives its exact step count, one that does not gives steps x span / time reached. The
    pilot costs at most `PILOT_STEPS` steps per member.
    """
    if order != "cost":
        raise ValueError(f"sweep: `order` must be None, 'cost' or a permutation of member indices, got {order!r}.")
    if not isinstance(rollout, Solve) or rollout.t0 is None or rollout.t1 is None:
        raise ValueError("sweep: order='cost' estimates the cost of adaptive solves; it needs "
                         "rollout=sciax.Solve(..., t0=..., t1=...). For other runs pass `order=` a permutation.")
    t0, t1 = rollout.t0, rollout.t1
    pilot = Solve(rollout.solver, t0=t0, t1=t1, save_at=np.linspace(t0, t1, PILOT_FRAMES), rtol=rollout.rtol,
                  atol=rollout.atol, dt0=rollout.dt0, max_steps=PILOT_STEPS, adjoint=rollout.adjoint)
    with warnings.catch_warnings():  # the sweep itself warns about its axes once
        warnings.filterwarnings("ignore", r"sweep: axis .* rounds? onto another", RuntimeWarning)
        from ._sweep import sweep  # the pilot is a sweep itself

        costs = sweep(system, state0, axes=axes, mode=mode, rollout=pilot, output=_pilot_cost, key=key,
                      memory_budget=memory_budget, devices=devices, check_finite=False).outputs
    costs = np.asarray(costs).reshape(-1)
    ranked = np.argsort(-costs, kind="stable")
    n_proc = jax.process_count()
    if n_proc > 1:  # deal members round-robin so every process gets a similar mix of costs
        ranked = np.concatenate([ranked[p::n_proc] for p in range(n_proc)])
    if batch_size is None:
        mesh = _devices.member_mesh(devices)
        n_dev = mesh.devices.size
        per_device = math.ceil(costs.size / (n_proc * n_dev))
        batch_size = _cost_bucket(per_device, _chunking._platform(mesh)) * n_dev
    return ranked, batch_size


def _cost_bucket(members_per_device: int, platform: str) -> int:
    """Members per device per cost bucket: `COST_BUCKET` on CPU; on accelerators the members
    split into `ACCELERATOR_COST_BUCKETS` buckets, each at least `ACCELERATOR_MIN_BUCKET`."""
    if platform == "cpu":
        return COST_BUCKET
    return max(ACCELERATOR_MIN_BUCKET, math.ceil(members_per_device / ACCELERATOR_COST_BUCKETS))


def _pilot_cost(traj):
    n = traj.stats["num_steps"].astype(jnp.float32)
    frames = traj.finite.shape[-1]
    reached = jnp.max(jnp.where(traj.finite, jnp.arange(frames), 0)).astype(jnp.float32)
    return jnp.where(traj.stats["success"], n, n * (frames - 1) / jnp.maximum(reached, 0.5))


def _check_order(order, n):
    if order is None:
        return None
    order = np.asarray(order)
    if order.shape != (n,) or not np.issubdtype(order.dtype, np.integer) or \
            not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"sweep: `order` must be a permutation of the {n} flat member indices, got "
                         f"{describe(order)}.")
    return order.astype(np.int32)
