/* Projections at decode row counts: y[M][N] = x[M][K] W^T (+ bias), float32, AVX2 + FMA, one thread.
 *
 * Why: at a decode step's 32 rows the library GEMMs this CPU has (MKL through F.linear, oneDNN
 * with packed weights, MKL packed) multiply at 25-55 GFLOP/s on one core, about half of what the
 * same libraries reach at 2,048 rows (docs/benchmarks/decode_kernels.md), and the projections are
 * most of a decode step. With so few rows each weight element is used M times only, so what
 * matters is streaming the weight once, in the order the registers consume it, while x's rows
 * stay in cache.
 *
 * Layout: the weight is packed once at load (servelab.engine.decode_gemm.pack) into panels of
 * 16 output columns, [N / 16][K][16]: one panel's column block for one k is one 64-byte line.
 * Loop: per panel, per block of KC k's (16 KiB of the panel, kept in L1 while every row group
 * uses it), per group of up to 6 rows: 6 x 16 outputs in 12 accumulators, two panel loads and
 * up to six broadcasts of x per k. Rows go in groups of 6, with 8 left split 4 + 4.
 */
#include <immintrin.h>
#include <stdint.h>

#ifndef KC
#define KC 256
#endif
#ifndef PF
#define PF 128
#endif

static inline __attribute__((always_inline)) void kernel(int mr, const float *a, int64_t lda, const float *b,
                                                         int64_t kc, float *c, int64_t ldc, int first,
                                                         const float *bias, int prefetch) {
    __m256 acc[6][2];
    for (int i = 0; i < mr; i++) {
        if (!first) {
            acc[i][0] = _mm256_loadu_ps(c + i * ldc);
            acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);
        } else if (bias) {
            acc[i][0] = _mm256_loadu_ps(bias);
            acc[i][1] = _mm256_loadu_ps(bias + 8);
        } else {
            acc[i][0] = _mm256_setzero_ps();
            acc[i][1] = _mm256_setzero_ps();
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(b + k * 16), b1 = _mm256_loadu_ps(b + k * 16 + 8);
        if (prefetch)  /* the first row group pulls the panel from memory: ask PF lines ahead */
            _mm_prefetch((const char *)(b + (k + PF) * 16), _MM_HINT_T0);
        for (int i = 0; i < mr; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i * lda + k);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_ps(c + i * ldc, acc[i][0]);
        _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
    }
}

static void rows(int mr, const float *a, int64_t lda, const float *b, int64_t kc, float *c, int64_t ldc, int first,
                 const float *bias, int pf) {
    switch (mr) {  /* constant mr per call: each case compiles to a fully unrolled register kernel */
    case 6: if (pf) kernel(6, a, lda, b, kc, c, ldc, first, bias, 1); else kernel(6, a, lda, b, kc, c, ldc, first, bias, 0); break;
    case 5: if (pf) kernel(5, a, lda, b, kc, c, ldc, first, bias, 1); else kernel(5, a, lda, b, kc, c, ldc, first, bias, 0); break;
    case 4: if (pf) kernel(4, a, lda, b, kc, c, ldc, first, bias, 1); else kernel(4, a, lda, b, kc, c, ldc, first, bias, 0); break;
    case 3: if (pf) kernel(3, a, lda, b, kc, c, ldc, first, bias, 1); else kernel(3, a, lda, b, kc, c, ldc, first, bias, 0); break;
    case 2: if (pf) kernel(2, a, lda, b, kc, c, ldc, first, bias, 1); else kernel(2, a, lda, b, kc, c, ldc, first, bias, 0); break;
    default: if (pf) kernel(1, a, lda, b, kc, c, ldc, first, bias, 1); else kernel(1, a, lda, b, kc, c, ldc, first, bias, 0); break;
    }
}

/* x: [m][k] row-major; packed: [n / 16][k][16]; bias: [n] or NULL; y: [m][n]. n % 16 == 0. */
void decode_linear_f32(const float *x, int64_t m, int64_t k, const float *packed, int64_t n, const float *bias,
                       float *y) {
    for (int64_t j = 0; j < n / 16; j++) {
        const float *panel = packed + j * k * 16;
        const float *pb = bias ? bias + j * 16 : 0;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            int64_t kc = k - k0 < KC ? k - k0 : KC;
            for (int64_t i = 0; i < m;) {
                int64_t left = m - i;
                int mr = left == 8 ? 4 : left >= 6 ? 6 : (int)left;
                rows(mr, x + i * k + k0, k, panel + k0 * 16, kc, y + i * n + j * 16, n, k0 == 0, pb, i == 0);
                i += mr;
            }
        }
    }
}
