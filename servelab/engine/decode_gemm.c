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
 * 16 output columns, [N / 16][K][16]: one panel's column block for one k is one 64-byte line, and
 * the whole weight is one stream in the order the loop below reads it. Loop: per panel, per block
 * of KC k's (kept in L1 while every row group uses it), per group of up to 6 rows: 6 x 16 outputs
 * in 12 accumulators, two panel loads and up to six broadcasts of x per k. Rows go in groups of
 * 6, with 8 left split 4 + 4.
 *
 * x is first copied per call into the order the groups read it ([k block][row group][k][row]),
 * so a group's broadcasts walk one contiguous run: read in place, x's rows are K floats apart,
 * and at K = 1,024 (4 KiB) every row's line k falls in the same L1 set, so the 32 rows of a k
 * block contended for the set's 8 ways. The weight's next block is asked for (prefetch) a few
 * lines at a time by every row group of the current block, not by the first group alone (whose
 * k loop wants a line every 6 cycles, twice what one core reads from memory here). K is cut
 * into chunks of KS k's, each packed panel after panel, so that x's part for one chunk (128 KiB
 * at 32 rows) stays in L2 while the chunk's panels stream by: down's x (32 x 2,816, 352 KiB)
 * and its 176 KiB panels did not fit L2 together.
 * Issue 27, AMD Zen 3 under load 4-5 (nice 19), the weights cold (a new copy each call), 32
 * rows, against the kernel before (x in place, the first group prefetching), alternated call by
 * call, medians of 60: qkv 75 vs 68 GFLOP/s, gate_up 66 vs 62, o and down within the machine's
 * noise (+-5%); a whole bench-200m decode step (batch 32, context 1,152) 380 vs 403 ms (medians
 * of 8 alternated rounds, load 4.2-4.3).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef KC
#define KC 256
#endif
#ifndef KS
#define KS 1024  /* k's per chunk of the packed weight (a multiple of KC); decode_gemm.CHUNK */
#endif

/* One row group's tile over one k block: c[mr][16] (+)= a[kc][mr] . b[kc][16]. Asks for
 * pf_lines lines from pf, one every pf_every k's (the next block's share of this group). */
static inline __attribute__((always_inline)) void kernel(int mr, const float *a, const float *b, int64_t kc,
                                                         float *c, int64_t ldc, int first, const float *bias,
                                                         const char *pf, int64_t pf_lines, int64_t pf_every) {
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
    int64_t next_pf = 0;
    for (int64_t k = 0; k < kc; k++, a += mr) {
        const __m256 b0 = _mm256_loadu_ps(b + k * 16), b1 = _mm256_loadu_ps(b + k * 16 + 8);
        if (k == next_pf && pf_lines) {
            _mm_prefetch(pf, _MM_HINT_T0);
            pf += 64, pf_lines--, next_pf += pf_every;
        }
        for (int i = 0; i < mr; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_ps(c + i * ldc, acc[i][0]);
        _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
    }
}

static void rows(int mr, const float *a, const float *b, int64_t kc, float *c, int64_t ldc, int first,
                 const float *bias, const char *pf, int64_t pf_lines, int64_t pf_every) {
    switch (mr) {  /* constant mr per call: each case compiles to a fully unrolled register kernel */
    case 6: kernel(6, a, b, kc, c, ldc, first, bias, pf, pf_lines, pf_every); break;
    case 5: kernel(5, a, b, kc, c, ldc, first, bias, pf, pf_lines, pf_every); break;
    case 4: kernel(4, a, b, kc, c, ldc, first, bias, pf, pf_lines, pf_every); break;
    case 3: kernel(3, a, b, kc, c, ldc, first, bias, pf, pf_lines, pf_every); break;
    case 2: kernel(2, a, b, kc, c, ldc, first, bias, pf, pf_lines, pf_every); break;
    default: kernel(1, a, b, kc, c, ldc, first, bias, pf, pf_lines, pf_every); break;
    }
}

static inline int group_rows(int64_t left) { return left == 8 ? 4 : left >= 6 ? 6 : (int)left; }

/* x's copy in the groups' order, one per thread (ctypes calls run without the GIL) */
static __thread float *xbuf;
static __thread int64_t xbuf_floats;

/* x: [m][k] row-major; packed: per chunk of KS k's (the last one shorter), [n / 16][ks][16], the
 * chunks one after another (decode_gemm.pack); bias: [n] or NULL; y: [m][n]. n % 16 == 0.
 * Returns 0, or -1 when the copy of x could not be allocated (y untouched). */
int decode_linear_f32(const float *x, int64_t m, int64_t k, const float *packed, int64_t n, const float *bias,
                      float *y) {
    if (m <= 0 || k <= 0) return 0;  /* no rows (a step that samples nothing): nothing to write */
    if (m * k > xbuf_floats) {
        float *grown = aligned_alloc(64, (size_t)((m * k * 4 + 63) / 64 * 64));
        if (!grown) return -1;
        free(xbuf);
        xbuf = grown, xbuf_floats = m * k;
    }
    /* [k block k0][group starting at row i][kk][r] = x[i + r][k0 + kk], at xbuf + k0 * m + i * kc */
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
        const int64_t kc = k - k0 < KC ? k - k0 : KC;
        for (int64_t i = 0; i < m;) {
            const int mr = group_rows(m - i);
            float *dst = xbuf + k0 * m + i * kc;
            for (int r = 0; r < mr; r++) {
                const float *src = x + (i + r) * k + k0;
                for (int64_t kk = 0; kk < kc; kk++) dst[kk * mr + r] = src[kk];
            }
            i += mr;
        }
    }
    int64_t groups = 0;
    for (int64_t i = 0; i < m; groups++) i += group_rows(m - i);
    const char *end = (const char *)(packed + n * k);
    for (int64_t c0 = 0; c0 < k; c0 += KS) {  /* a chunk of k's: its part of x stays in L2 over all panels */
        const int64_t ks = k - c0 < KS ? k - c0 : KS;
        for (int64_t j = 0; j < n / 16; j++) {
            const float *panel = packed + c0 * n + j * ks * 16;
            const float *pb = bias ? bias + j * 16 : 0;
            for (int64_t k0 = c0; k0 < c0 + ks; k0 += KC) {
                const int64_t kc = c0 + ks - k0 < KC ? c0 + ks - k0 : KC;
                const float *b = panel + (k0 - c0) * 16;
                /* the next block in the stream (the rest of this panel, else the next panel or chunk):
                 * KC lines or what is left, shared out between the groups */
                const char *next = (const char *)(b + kc * 16);
                int64_t lines = next < end ? (end - next) / 64 : 0;
                lines = lines < KC ? lines : KC;
                const int64_t share = (lines + groups - 1) / groups;
                int64_t g = 0;
                for (int64_t i = 0; i < m; g++) {
                    const int mr = group_rows(m - i);
                    int64_t mine = lines - g * share;
                    mine = mine < 0 ? 0 : mine < share ? mine : share;
                    const int64_t every = mine ? (kc / mine > 0 ? kc / mine : 1) : kc;
                    rows(mr, xbuf + k0 * m + i * kc, b, kc, y + i * n + j * 16, n, k0 == 0, pb,
                         next + g * share * 64, mine, every);
                    i += mr;
                }
            }
        }
    }
    return 0;
}
