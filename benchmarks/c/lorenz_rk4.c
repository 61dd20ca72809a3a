/* Hand-written C reference for the Lorenz ensemble: fixed-step classical RK4, struct of arrays.
 *
 * A measuring stick (the "floor" sciax is compared with), not part of the package. Compiled
 * at run time by benchmarks/baselines/c_lorenz.py with the machine's gcc:
 *
 *     gcc -O3 -march=native -shared -fPIC lorenz_rk4.c -o liblorenz_rk4.so
 *
 * No -ffast-math: the compiler may contract a*b+c into FMAs (GCC's default for GNU C,
 * -ffp-contract=fast) but it does not reorder sums, so the arithmetic is the same RK4 as
 * sciax's up to FMA contraction. The members are processed in blocks of BLOCK so that a
 * block's state and stages stay in L1 cache across all steps; the inner loop over the
 * members of a block has no dependencies and GCC vectorises it (AVX-512 on this machine).
 *
 * Each stage is computed as sciax computes it: y + dt * (sum_j a_ij k_j).
 */
#include <stddef.h>

#ifndef BLOCK
#define BLOCK 512
#endif

#define DEFINE_LORENZ_RK4(NAME, T)                                                         \
void NAME(T *restrict x, T *restrict y, T *restrict z, const T *restrict rho, ptrdiff_t n,  \
          T sigma, T beta, T dt, long n_steps)                                             \
{                                                                                          \
    const T half = (T)0.5, sixth = (T)1 / (T)6, third = (T)1 / (T)3;                       \
    for (ptrdiff_t start = 0; start < n; start += BLOCK) {                                 \
        ptrdiff_t m = (n - start < BLOCK) ? (n - start) : BLOCK;                           \
        T *restrict bx = x + start, *restrict by = y + start, *restrict bz = z + start;    \
        const T *restrict br = rho + start;                                                \
        for (long s = 0; s < n_steps; s++) {                                               \
            for (ptrdiff_t i = 0; i < m; i++) {                                            \
                const T x0 = bx[i], y0 = by[i], z0 = bz[i], r = br[i];                     \
                const T k1x = sigma * (y0 - x0);                                           \
                const T k1y = x0 * (r - z0) - y0;                                          \
                const T k1z = x0 * y0 - beta * z0;                                         \
                const T x1 = x0 + dt * (half * k1x);                                       \
                const T y1 = y0 + dt * (half * k1y);                                       \
                const T z1 = z0 + dt * (half * k1z);                                       \
                const T k2x = sigma * (y1 - x1);                                           \
                const T k2y = x1 * (r - z1) - y1;                                          \
                const T k2z = x1 * y1 - beta * z1;                                         \
                const T x2 = x0 + dt * (half * k2x);                                       \
                const T y2 = y0 + dt * (half * k2y);                                       \
                const T z2 = z0 + dt * (half * k2z);                                       \
                const T k3x = sigma * (y2 - x2);                                           \
                const T k3y = x2 * (r - z2) - y2;                                          \
                const T k3z = x2 * y2 - beta * z2;                                         \
                const T x3 = x0 + dt * k3x;                                                \
                const T y3 = y0 + dt * k3y;                                                \
                const T z3 = z0 + dt * k3z;                                                \
                const T k4x = sigma * (y3 - x3);                                           \
                const T k4y = x3 * (r - z3) - y3;                                          \
                const T k4z = x3 * y3 - beta * z3;                                         \
                bx[i] = x0 + dt * (sixth * k1x + third * k2x + third * k3x + sixth * k4x); \
                by[i] = y0 + dt * (sixth * k1y + third * k2y + third * k3y + sixth * k4y); \
                bz[i] = z0 + dt * (sixth * k1z + third * k2z + third * k3z + sixth * k4z); \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
}

DEFINE_LORENZ_RK4(lorenz_rk4_f32, float)
DEFINE_LORENZ_RK4(lorenz_rk4_f64, double)

/* Measured arithmetic peak of one core: 16 independent chains of vector FMAs (acc = acc*m + a),
 * LANES = 64 bytes / sizeof(T) (one AVX-512 register; GCC splits it on narrower machines), so
 * the loop is bound by the FMA units' throughput, not by latency or memory. Returns flop/s,
 * counting an FMA as two flops. The Lorenz suite divides its throughput x flops-per-step by this.
 */
#include <time.h>

#define PEAK_CHAINS 16
#define DEFINE_FMA_PEAK(NAME, T)                                                           \
double NAME(long iters)                                                                    \
{                                                                                          \
    enum { LANES = 64 / sizeof(T) };                                                       \
    typedef T vec __attribute__((vector_size(64)));                                        \
    vec acc[PEAK_CHAINS], mul, add;                                                        \
    for (int l = 0; l < LANES; l++) {                                                      \
        mul[l] = (T)0.999999;                                                              \
        add[l] = (T)1e-7;                                                                  \
        for (int j = 0; j < PEAK_CHAINS; j++) acc[j][l] = (T)(1 + j + l) * (T)1e-3;        \
    }                                                                                      \
    struct timespec t0, t1;                                                                \
    clock_gettime(CLOCK_MONOTONIC, &t0);                                                   \
    for (long i = 0; i < iters; i++)                                                       \
        for (int j = 0; j < PEAK_CHAINS; j++) acc[j] = acc[j] * mul + add;                 \
    clock_gettime(CLOCK_MONOTONIC, &t1);                                                   \
    T sum = 0;                                                                             \
    for (int j = 0; j < PEAK_CHAINS; j++)                                                  \
        for (int l = 0; l < LANES; l++) sum += acc[j][l];                                  \
    volatile T sink = sum; /* keeps the loop */                                            \
    (void)sink;                                                                            \
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec); \
    return 2.0 * LANES * PEAK_CHAINS * (double)iters / s;                                  \
}

DEFINE_FMA_PEAK(fma_peak_f32, float)
DEFINE_FMA_PEAK(fma_peak_f64, double)
