"""`sciax._compile.operation_count.operation_count`: the arithmetic of a jaxpr, counted before compiling."""

import math

import jax
import jax.numpy as jnp
from jax import lax

from sciax._compile.operation_count import operation_count


def count(fn, *args):
    return operation_count(jax.make_jaxpr(fn)(*args))


def test_elementwise_operations_count_their_output_elements():
    x = jnp.ones((3, 4))
    assert count(lambda x: jnp.sin(x) * x + x, x) == 3 * 12  # sin, mul, add
    assert count(lambda x: jnp.sum(x * x, axis=1), x) == 12 + 12  # mul (3, 4); the reduction reads 12
    assert count(lambda x: jnp.argmax(x), jnp.ones(1000)) == 1000


def test_a_matrix_product_counts_each_output_once_per_contracted_term():
    a, b = jnp.ones((4, 8)), jnp.ones((8, 3))
    assert count(jnp.matmul, a, b) == 4 * 3 * 8
    batched = jnp.ones((5, 4, 8))
    assert count(lambda a, b: jnp.einsum("bij,jk->bik", a, b), batched, b) == 5 * 4 * 3 * 8


def test_convolutions_and_dense_linear_algebra_count_their_arithmetic():
    signal, kernel = jnp.ones(1000), jnp.ones(30)
    # 'valid' mode: 971 outputs x 30 kernel terms, plus layout: the kernel's flip (30), the
    # operands broadcast to (1, 1, n) (1,000 + 30) and the result squeezed back (971).
    assert count(lambda a, b: jnp.convolve(a, b, mode="valid"), signal, kernel) == 971 * 30 + 30 + 1030 + 971
    a = jnp.eye(50) + 0.01
    assert count(jnp.linalg.cholesky, a) >= 50**3  # plus symmetrisation and checks, O(n²)
    assert count(jnp.linalg.cholesky, a) < 1.2 * 50**3
    solve = count(lambda a, b: jax.scipy.linalg.solve_triangular(a, b), a, jnp.ones(50))
    assert 50 * 50 <= solve <= 50 * 50 + 2 * 50  # n² for one right-hand side, plus reshaping it


def test_a_scan_body_counts_once_per_iteration():
    def body(c, _):
        return jnp.cos(c) * c, None  # 2 x 5 elements

    x = jnp.ones(5)
    assert count(lambda x: lax.scan(body, x, None, length=10)[0], x) == 10 * 2 * 5
    nested = lambda x: lax.scan(lambda c, _: (lax.scan(body, c, None, length=3)[0], None), x, None, length=7)[0]  # noqa: E731
    assert count(nested, x) == 7 * 3 * 2 * 5


def test_a_cond_counts_its_dearest_branch_and_a_call_its_body():
    x = jnp.ones(6)
    cheap, dear = (lambda x: x + 1.0), (lambda x: jnp.exp(x) * jnp.sin(x) - x)  # 1 and 4 ops on (6,)

    def branching(first, second):
        return count(lambda x: lax.cond(x[0] > 0, first, second, x), x)

    assert branching(cheap, dear) == branching(dear, cheap) == branching(dear, dear)
    assert branching(dear, dear) - branching(cheap, cheap) == 4 * 6 - 6
    assert count(lambda x: jax.jit(dear)(x) + x, x) == 4 * 6 + 6


def test_a_loop_of_unknown_length_is_infinite():
    x = jnp.ones(3)
    assert count(lambda x: lax.while_loop(lambda c: c[0] < 10.0, lambda c: c * 2.0, x), x) == math.inf
    # A fori_loop with static bounds is a scan: finite.
    assert count(lambda x: lax.fori_loop(0, 4, lambda i, c: c * 2.0, x), x) < math.inf
    # A loop of unknown length run zero times costs nothing (not 0 · inf = NaN).
    never = lambda x: lax.scan(lambda c, _: (lax.while_loop(lambda c: c[0] < 10.0, lambda c: c * 2.0, c), None),  # noqa: E731
                               x, None, length=0)[0]
    assert count(never, x) == 0
