"""NumPy baseline: a Lorenz ensemble stepped by fixed-step RK4 or Tsit5, vectorised over members.

Written as a competent NumPy user would: struct-of-arrays state (three `(B,)` arrays, not one
`(B, 3)` array), every buffer allocated once and reused through ``out=`` and in-place
operators, zero tableau coefficients skipped. Each stage is computed as sciax computes it,
``y + dt * (Σ_j a_ij k_j)``, so the arithmetic is the same up to rounding order.
"""

from __future__ import annotations

import numpy as np

# Classical RK4 and Tsitouras 5(4) (solution weights only; the FSAL 7th stage has weight 0
# and is not evaluated). Coefficients as in Tsitouras (2011) / Diffrax's `Tsit5`.
RK4_A = ((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0))
RK4_B = (1 / 6, 1 / 3, 1 / 3, 1 / 6)

TSIT5_A = (
    (),
    (0.161,),
    (-0.008480655492356989, 0.335480655492357),
    (2.8971530571054935, -6.359448489975075, 4.3622954328695815),
    (5.325864828439257, -11.748883564062828, 7.4955393428898365, -0.09249506636175525),
    (5.86145544294642, -12.92096931784711, 8.159367898576159, -0.071584973281401,
     -0.028269050394068383),
)
TSIT5_B = (0.09646076681806523, 0.01, 0.4798896504144996, 1.379008574103742,
           -3.290069515436081, 2.324710524099774)

TABLEAUX = {"rk4": (RK4_A, RK4_B), "tsit5": (TSIT5_A, TSIT5_B)}


def lorenz_ensemble(rho: np.ndarray, u0=(1.0, 0.0, 0.0), *, dt: float = 0.001, n_steps: int = 1000,
                    method: str = "rk4", sigma: float = 10.0, beta: float = 8.0 / 3.0) -> np.ndarray:
    """Final states `(B, 3)` of B Lorenz systems (one ρ each) after `n_steps` fixed steps.

    The dtype of `rho` is the working precision (float32 or float64); scalars are Python
    floats, which NumPy 2 treats as weak, so nothing is promoted.
    """
    a_tab, b_tab = TABLEAUX[method]
    rho = np.asarray(rho)
    dtype = rho.dtype
    n = rho.shape[0]
    dt, sigma, beta = float(dt), float(sigma), float(beta)

    state = [np.full(n, float(c), dtype=dtype) for c in u0]
    stage = [np.empty(n, dtype) for _ in range(3)]
    ks = [[np.empty(n, dtype) for _ in range(3)] for _ in b_tab]
    tmp = np.empty(n, dtype)

    def rhs(x, y, z, out):
        dx, dy, dz = out
        np.subtract(y, x, out=dx)
        dx *= sigma
        np.subtract(rho, z, out=dy)
        dy *= x
        dy -= y
        np.multiply(x, y, out=dz)
        np.multiply(z, beta, out=tmp)
        dz -= tmp

    def combine(out, coeffs, base):
        """out = base + dt * Σ_j coeffs[j] k_j (componentwise), skipping zero coefficients."""
        terms = [(c, j) for j, c in enumerate(coeffs) if c != 0.0]
        for comp in range(3):
            o = out[comp]
            c0, j0 = terms[0]
            if c0 == 1.0:  # no pass for a unit coefficient (RK4's stage 4): bitwise the same
                np.copyto(o, ks[j0][comp])
            else:
                np.multiply(ks[j0][comp], c0, out=o)
            for c, j in terms[1:]:
                if c == 1.0:
                    o += ks[j][comp]
                else:
                    np.multiply(ks[j][comp], c, out=tmp)
                    o += tmp
            o *= dt
            o += base[comp]

    for _ in range(n_steps):
        rhs(*state, ks[0])
        for i in range(1, len(b_tab)):
            combine(stage, a_tab[i], state)
            rhs(*stage, ks[i])
        combine(stage, b_tab, state)
        state, stage = stage, state
    return np.stack(state, axis=-1)
