"""Writing your own system: a driven, damped Duffing oscillator as an `AbstractODE`.

    x'' + δ x' + α x + β x³ = γ cos(ω t),   state y = (x, v)

The conventions, in the class below:

- Parameters are fields. Give them as arrays (`jnp.asarray`) so that `jax.grad`, `jax.vmap` and
  `sciax.sweep` reach them; configuration that selects code (a flag, a number of terms) is
  `eqx.field(static=True)`.
- `vector_field(t, y, args)` returns dy/dt with exactly the structure, shape and dtype of `y`
  (`simulate` and `solve` check this when they compile, and name the system if it does not).
- Optional: `default_state()` (scenario files' `default = true`), `conserved_quantities(t, y)`
  (what the runner reports drift for), `check_state(y)` (refuse a wrong state early).

Then the system runs with every integrator and `solve`, differentiates, and vectorises. The
script checks what it shows (fixed-step RK4 against Diffrax's adaptive Dopri8, the energy of the
undamped, undriven oscillator, a gradient against a central finite difference) and exits
non-zero if any check fails.

Run: python examples/custom_system.py   (writes examples/output/custom_system.png)
"""

import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import sciax  # noqa: E402
from sciax.integrators import RK4  # noqa: E402

jax.config.update("jax_enable_x64", True)


class Duffing(sciax.systems.AbstractODE):
    """Driven, damped Duffing oscillator; state `[x, v]` (position, velocity)."""

    delta: jax.Array = eqx.field(converter=jnp.asarray, default=0.2)  # damping rate
    alpha: jax.Array = eqx.field(converter=jnp.asarray, default=-1.0)  # linear stiffness
    beta: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)  # cubic stiffness
    gamma: jax.Array = eqx.field(converter=jnp.asarray, default=0.3)  # drive amplitude
    omega: jax.Array = eqx.field(converter=jnp.asarray, default=1.2)  # drive frequency

    def vector_field(self, t, y, args=None):
        x, v = y[0], y[1]
        a = -self.delta * v - self.alpha * x - self.beta * x**3 + self.gamma * jnp.cos(self.omega * t)
        return jnp.stack([v, a])  # the state's shape (2,) and dtype

    def check_state(self, y):
        if jnp.shape(y) != (2,):
            raise sciax.StateMismatchError(f"Duffing expects a state [x, v] of shape (2,), got {jnp.shape(y)}.")

    def default_state(self):
        return jnp.array([1.0, 0.0])

    def conserved_quantities(self, t, y):
        """E = v²/2 + α x²/2 + β x⁴/4, conserved when δ = γ = 0."""
        x, v = y[0], y[1]
        return {"energy": 0.5 * v**2 + 0.5 * self.alpha * x**2 + 0.25 * self.beta * x**4}


failures = []


def check(ok: bool, what: str):
    print(("ok    " if ok else "FAILED ") + what)
    if not ok:
        failures.append(what)


system, y0 = Duffing(), jnp.array([1.0, 0.0])
dt, n_steps = 0.01, 5000  # t = 0 .. 50

# 1. Fixed-step RK4 (simulate) against Diffrax's adaptive 8th-order solver (solve), an independent method.
traj = sciax.simulate(system, y0, integrator=RK4(), dt=dt, n_steps=n_steps, save_every=10)
ref = sciax.solve(system, y0, t0=0.0, t1=dt * n_steps, save_at=traj.times, solver="dopri8", rtol=1e-12, atol=1e-12)
error = float(jnp.max(jnp.abs(traj.states - ref.states)))
check(error < 1e-5, f"RK4 (dt = {dt}) agrees with Dopri8 to {error:.1e} over t = 0..50")

# 2. Undamped and undriven, the energy is conserved (RK4's error is O(dt^4) per unit time), on an
#    orbit through both wells (y0 = [1, 0] is the bottom of the right-hand well: nothing would move).
free = Duffing(delta=0.0, gamma=0.0)
energy = {"energy": lambda t, y, s: s.conserved_quantities(t, y)["energy"]}
free_traj = sciax.simulate(free, jnp.array([0.5, 0.8]), integrator=RK4(), dt=dt, n_steps=n_steps, save_every=10,
                           observables=energy)
drift = float(jnp.max(jnp.abs(free_traj.observables["energy"] - free_traj.observables["energy"][0])))
check(drift < 1e-8, f"energy drift without damping or drive: {drift:.1e}")


# 3. Gradient of the final position with respect to the drive amplitude, through all 1,000 steps.
def final_x(gamma):
    return sciax.simulate(Duffing(gamma=gamma), y0, integrator=RK4(), dt=dt, n_steps=1000,
                          save_every=1000).final_state[0]


grad = float(jax.grad(final_x)(0.3))
h = 1e-5
fd = float((final_x(0.3 + h) - final_x(0.3 - h)) / (2 * h))
check(abs(grad - fd) < 1e-6 * max(1.0, abs(fd)), f"d x(10) / d gamma = {grad:.6f} (finite difference {fd:.6f})")

# 4. An ensemble over the drive amplitude with vmap, one compiled program for the four members.
gammas = jnp.linspace(0.2, 0.5, 4)
ensemble = jax.vmap(lambda g: sciax.simulate(Duffing(gamma=g), y0, integrator=RK4(), dt=dt, n_steps=n_steps,
                                             save_every=10).states)(gammas)

fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
axes[0].plot(traj.times, traj.states[:, 0], label="RK4 (simulate)")
axes[0].plot(ref.times, ref.states[:, 0], "--", label="Dopri8 (solve)")
axes[0].set(xlabel="t", ylabel="x", title="Duffing(δ=0.2, α=-1, β=1, γ=0.3, ω=1.2)")
axes[0].legend()
for g, states in zip(gammas, ensemble):
    axes[1].plot(states[len(states) // 2:, 0], states[len(states) // 2:, 1], lw=0.7, label=f"γ = {float(g):.2f}")
axes[1].set(xlabel="x", ylabel="v", title="phase portraits, t = 25..50 (vmap over γ)")
axes[1].legend(fontsize=8)
fig.tight_layout()

out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "output" / "custom_system.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
print(f"wrote {out}")
sys.exit(1 if failures else 0)
