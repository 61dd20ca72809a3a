"""The fitting problem: the unknowns, the data, and the residual function.

`fit` checks its input on the host (`_unknowns`, `_data`) and builds a `Problem`, an Equinox
module whose array leaves are the data and the system, and whose static fields say how to
assemble the model. Its methods are pure and jittable: `fit` hands `residuals_unconstrained`
to Optimistix (in forward mode through `forward_residual_function`), and differentiates
`residuals_physical` only when the solver's own linearisation cannot be used.

The vector of unknowns is flat: the free parameter entries (raveled, in the order given),
then the fitted entries of the initial state, then (multiple shooting) the full start state
of every segment after the first. "Physical" vectors `v` hold the values in the user's
units; "unconstrained" vectors `u` are what the optimiser moves (`v = T(u)` elementwise).
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._unknowns import Block, StateLayout


def identity(state):
    return state


class Problem(eqx.Module):
    """Everything the residual function needs; pure and jittable."""

    system: eqx.Module
    state0: object
    param_values: tuple  # initial physical values of every selected leaf (fixed ones stay)
    observed: tuple  # leaves, zero where missing
    inv_sigma: tuple  # 1/sigma per observed leaf (ones when sigma is not given)
    keep: jax.Array  # flat indices of the observed (unmasked) entries
    plan: eqx.Module
    obs_segment: jax.Array
    obs_position: jax.Array
    end_position: jax.Array  # (n_segments - 1,)
    continuity_weight: jax.Array
    state_index: jax.Array  # flat indices of fitted initial-state entries
    rollout: eqx.Module
    blocks: tuple[Block, ...]
    state_block: Block | None
    leaf_index: tuple[int, ...] = eqx.field(static=True)
    layout: StateLayout = eqx.field(static=True)
    observe: Callable = eqx.field(static=True)
    obs_treedef: object = eqx.field(static=True)
    n_segments: int = eqx.field(static=True)
    n_unknowns: int = eqx.field(static=True)
    n_interest: int = eqx.field(static=True)
    dtype: np.dtype = eqx.field(static=True)  # the state's dtype: the model runs in it
    args: object = None

    # -- unknown vector <-> values ------------------------------------------------------------

    def _free_blocks(self):
        blocks = [b for b in self.blocks if not b.fixed]
        if self.state_block is not None:
            blocks.append(self.state_block)
        return blocks

    def to_physical(self, u):
        parts = [b.transform.to_physical(u[b.start:b.start + b.size]) for b in self._free_blocks()]
        parts.append(u[self.n_interest:])  # segment states: no transform
        return jnp.concatenate(parts)

    def to_unconstrained(self, v):
        parts = [b.transform.to_unconstrained(v[b.start:b.start + b.size]) for b in self._free_blocks()]
        parts.append(v[self.n_interest:])
        return jnp.concatenate(parts)

    def initial_physical(self, segment_states):
        parts = [jnp.ravel(val) for b, val in zip(self.blocks, self.param_values) if not b.fixed]
        if self.state_block is not None:
            parts.append(self.layout.flatten(self.state0)[self.state_index])
        parts.append(jnp.ravel(segment_states))
        return jnp.concatenate(parts)

    def values(self, v):
        """(system, state0, segment start states (n_segments-1, size)) from a physical vector."""
        system = self.with_params([val if b.fixed else v[b.start:b.start + b.size].reshape(b.shape)
                                   for b, val in zip(self.blocks, self.param_values)])
        flat0 = self.layout.flatten(self.state0).astype(v.dtype)
        if self.state_block is not None:
            sb = self.state_block
            flat0 = flat0.at[self.state_index].set(v[sb.start:sb.start + sb.size])
        segments = v[self.n_interest:].reshape(self.n_segments - 1, self.layout.size)
        return system, flat0, segments

    def with_params(self, values):
        """The system with its selected leaves (`leaf_index`, in order) replaced by `values`."""
        leaves, treedef = jtu.tree_flatten(self.system)
        for i, value in zip(self.leaf_index, values, strict=True):
            leaves[i] = value
        return jtu.tree_unflatten(treedef, leaves)

    # -- model ----------------------------------------------------------------------------------

    def model_states(self, v):
        """States at every save time of every segment: leading axes (n_segments, n_save)."""
        system, flat0, segments = self.values(v)
        starts = jax.vmap(self.layout.unflatten)(jnp.concatenate([flat0[None], segments]))
        run = eqx.filter_vmap(lambda s, plan: self.rollout.run_plan(system, s, plan, self.args))
        return run(starts, self.plan), segments

    def residuals_physical(self, v):
        states, segments = self.model_states(v)
        data = jtu.tree_map(lambda x: x[self.obs_segment, self.obs_position], states)
        predicted = jtu.tree_leaves(jax.vmap(self.observe)(data))
        parts = []
        for k, (pred, obs) in enumerate(zip(predicted, self.observed)):
            parts.append(jnp.ravel((pred - obs) * self.inv_sigma[k]))
        r_data = jnp.concatenate(parts)[self.keep]
        if self.n_segments == 1:
            return r_data
        ends = jtu.tree_map(lambda x: x[jnp.arange(self.n_segments - 1), self.end_position], states)
        ends = jax.vmap(self.layout.flatten)(ends)
        r_cont = self.continuity_weight * (ends - segments)
        return jnp.concatenate([r_data, jnp.ravel(r_cont)])

    def residuals_unconstrained(self, u):
        r = self.residuals_physical(self.to_physical(u).astype(self.dtype))
        return r.astype(self.optimiser_dtype)

    @property
    def optimiser_dtype(self):
        """The dtype of the optimiser's unknowns: the state's dtype, promoted to the default
        float (Optimistix's trust-region radius is created in the default float and Lineax needs
        one dtype per operator, so a float32 fit with x64 enabled runs its model in float32 and
        its optimiser's linear algebra in float64)."""
        return jnp.result_type(self.dtype, jnp.zeros(()).dtype)

    @property
    def n_data(self) -> int:
        return int(self.keep.shape[0])


def residual_function(u, problem: Problem):
    """`fn(y, args)` in the form Optimistix expects."""
    return problem.residuals_unconstrained(u)


@eqx.filter_custom_jvp
def forward_residual_function(u, problem: Problem):
    """`residual_function` for forward-mode Jacobians: its JVP runs one rollout that carries
    the residuals r(u) and all n_unknowns tangents (`jacfwd`), then returns J·u̇.

    Optimistix linearises `fn` once per step (`jax.linearize`) and then applies the linear map
    several times (materialising J for the QR solve, Jᵀr for the gradient). Through a plain
    rollout that is a primal scan that stores every step's linearisation point, a tangent
    scan per application and a transposed scan; here the linear map is the small dense J, so
    a step costs one forward pass with n_unknowns tangents and compiles one rollout, not three.
    """
    return problem.residuals_unconstrained(u)


@forward_residual_function.def_jvp
def _forward_residual_jvp(primals, tangents):
    u, problem = primals
    u_dot, problem_dot = tangents
    if jtu.tree_leaves(problem_dot) or u_dot is None:
        # Differentiated with respect to the data or system as well (not what `fit` does):
        # the ordinary JVP, exactly.
        return eqx.filter_jvp(residual_function, primals, tangents)
    jacobian, r = jax.jacfwd(lambda x: (problem.residuals_unconstrained(x),) * 2, has_aux=True)(u)
    # Full precision: a float32 matmul may otherwise run in TF32 on GPUs (~1e-3 relative).
    return r, jnp.matmul(jacobian, u_dot, precision=jax.lax.Precision.HIGHEST)
