/* Decode attention read in place from servelab's paged KV cache (float32, AVX2 + FMA, one thread).
 *
 * Why: torch has no op that attends over scattered cache blocks, so the torch path copies every
 * row's K and V out of the cache (index_select) and then runs the fused flash kernel, which is
 * built for many query rows and spends most of its time on per-(row, head) overhead with the four
 * query rows of a GQA decode (docs/benchmarks/decode_kernels.md). Here each row walks its own
 * blocks once, in the cache's order (token, KV head, dim), keeping FlashDecoding's running max,
 * sum and output per query head (online softmax), so K and V are read once and never copied.
 *
 * GQA: the query heads that share a KV head are done together, so each K and V row of a block
 * is taken from memory once for its whole group: scores eight tokens at a time for one query head
 * (eight independent dot products, reduced together: no horizontal sum per token), and P V with
 * 16 dims of up to four query heads in registers while V's row streams by once. Measured (issue
 * 27, AMD Zen 3, one layer, 32 rows x 1,152 tokens, CPU time, a machine at load 11-14): with the
 * K/V in cache 3.7-4.0 ms against 5.9-6.8 for the token-at-a-time loop before it; read from
 * memory both took 10-14 ms (the read, not the arithmetic, bounds it there), and a decode step of
 * bench-200m alternated with the earlier kernel was within noise of it (block 32: 480 vs 496 ms,
 * block 16: 542 vs 540; medians of 7 rounds).
 *
 * Layout (servelab.engine.kv_cache): one layer is [2, num_blocks, block_size, kv_heads, head_dim];
 * q and out are [rows, q_heads, head_dim]; tables [rows, width] block ids; lens[r] the number of
 * cache slots row r attends to (its context, the new token included). head_dim % 32 == 0. The
 * caller checks ids and lengths (paged_decode.py): this loop reads raw memory.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The eight sums of a[0..7] as one vector (lane t = sum of a[t]'s lanes). */
static inline __m256 sum8x8(const __m256 a[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#include "simd_exp.h"  /* exp8: used for x <= 0 here (scores minus their running max) */

/* The block ``dist`` blocks after row r's block j in the order this call reads them (a later
 * row's once this row's run out); -1 past the last. */
static inline int64_t block_ahead(const int64_t *tables, int64_t width, const int64_t *lens, int64_t block_size,
                                  int64_t rows, int64_t r, int64_t j, int64_t dist) {
    j += dist;
    for (; r < rows; r++) {
        const int64_t nb = (lens[r] + block_size - 1) / block_size;
        if (j < nb) return tables[r * width + j];
        j -= nb;
    }
    return -1;
}

/* The next unit's lines, asked for a few at a time between pieces of this unit's work: the
 * core has few outstanding misses, and on this CPU (AMD Zen 3) every prefetch hint fills L1,
 * whose 32 KiB a whole block asked for at once (or two blocks ahead) overflows: one layer, batch
 * 32, context 1,152, blocks of 16: 15-16 ms with the whole next block asked for at once against
 * 11 spread (before the GQA grouping); 2-4 blocks ahead or eight tokens ahead at a time were
 * 10-60% slower than one block spread. The asks are spread over the whole unit, its scores and
 * its P V alike (issue 27: over the scores alone they came in a burst and left the P V without
 * any; one layer read from memory, 32 rows x 1,152, blocks of 16, alternated, at load 4-6: 12.5-
 * 14.0 ms against 13.2-15.6, and two blocks ahead spread the same way 13.9). */
typedef struct {
    const char *k, *v;  /* next line of the next block's K and V; NULL: nothing to ask for */
    int64_t left, per;  /* lines of each left, and how many each step asks for */
} Prefetch;

static inline void prefetch_step(Prefetch *pf) {
    if (!pf->k) return;
    const int64_t n = pf->left < pf->per ? pf->left : pf->per;
    for (int64_t i = 0; i < n; i++) {
        _mm_prefetch(pf->k + 64 * i, _MM_HINT_T0);
        _mm_prefetch(pf->v + 64 * i, _MM_HINT_T0);
    }
    pf->k += 64 * n, pf->v += 64 * n, pf->left -= n;
    if (!pf->left) pf->k = NULL;
}

/* Scores of eight tokens for one KV head's query group: s[g * stride + t] = q_g . k_t * scale,
 * t < 8. The eight K rows (tok floats apart) meet each query in eight accumulators, reduced
 * together (no horizontal sum per token). */
static inline void scores8(const float *qh, const float *K, int64_t group, int64_t d, int64_t tok, __m256 vscale,
                           float *s, int64_t stride, Prefetch *pf) {
    for (int64_t g = 0; g < group; g++) {
        const float *qq = qh + g * d;
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
        for (int64_t e = 0; e < d; e += 8) {
            const __m256 qv = _mm256_loadu_ps(qq + e);
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + u * tok + e), a[u]);
        }
        _mm256_store_ps(s + g * stride, _mm256_mul_ps(sum8x8(a), vscale));
        prefetch_step(pf);
    }
}

/* The same for one token (the tail of a row's last block). */
static inline void scores1(const float *qh, const float *k, int64_t group, int64_t d, float scale, float *s,
                           int64_t stride) {
    for (int64_t g = 0; g < group; g++) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t e = 0; e < d; e += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(qh + g * d + e), _mm256_loadu_ps(k + e), a);
        s[g * stride] = sum8(a) * scale;
    }
}

/* acc[g] += p_g V over one unit for G (1-4) query heads of one KV head: 16 dims of every head
 * in registers while the block's V rows (tok floats apart) stream by once. */
static inline void group_pv(float *acc, const float *p, int64_t stride, const float *V, int64_t n, int G,
                            int64_t d, int64_t tok, Prefetch *pf) {
    for (int64_t e = 0; e < d; e += 16) {
        __m256 a[4][2];
        for (int g = 0; g < G; g++) {
            a[g][0] = _mm256_load_ps(acc + g * d + e);
            a[g][1] = _mm256_load_ps(acc + g * d + e + 8);
        }
        const float *vt = V + e;
        for (int64_t t = 0; t < n; t++, vt += tok) {
            const __m256 v0 = _mm256_loadu_ps(vt), v1 = _mm256_loadu_ps(vt + 8);
            for (int g = 0; g < G; g++) {
                const __m256 pt = _mm256_broadcast_ss(p + g * stride + t);
                a[g][0] = _mm256_fmadd_ps(pt, v0, a[g][0]);
                a[g][1] = _mm256_fmadd_ps(pt, v1, a[g][1]);
            }
        }
        for (int g = 0; g < G; g++) {
            _mm256_store_ps(acc + g * d + e, a[g][0]);
            _mm256_store_ps(acc + g * d + e + 8, a[g][1]);
        }
        prefetch_step(pf);
    }
}

/* Fold one unit's scores of query head i into its running max m, sum l and output acc (the
 * scores become the unit's weights p in place). */
static inline void online_softmax(float *si, int64_t n, float *m, float *l, float *acc, int64_t d) {
    float peak = *m;
    for (int64_t t = 0; t < n; t++) peak = si[t] > peak ? si[t] : peak;
    const __m256 vpeak = _mm256_set1_ps(peak);
    __m256 vsum = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(si + t), vpeak));
        _mm256_store_ps(si + t, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    float total = sum8(vsum);
    for (; t < n; t++) { si[t] = expf(si[t] - peak); total += si[t]; }
    if (peak > *m) {
        const float alpha = expf(*m - peak);
        const __m256 va = _mm256_set1_ps(alpha);
        for (int64_t e = 0; e < d; e += 8) _mm256_store_ps(acc + e, _mm256_mul_ps(_mm256_load_ps(acc + e), va));
        *l *= alpha;
        *m = peak;
    }
    *l += total;
}

void paged_decode_f32(const float *kv, int64_t num_blocks, int64_t block_size, int64_t hkv, int64_t d,
                      const float *q, int64_t rows, int64_t hq, const int64_t *tables, int64_t width,
                      const int64_t *lens, float scale, float *out) {
    /* work unit: up to 8 tokens of a block, so that the unit at work and the next one asked for
     * fit L1 together (16 KiB of K+V each with bench-200m's 4 KV heads of 64 dims; L1 is 32 KiB)
     * at any block size. Units of 16 (32 KiB each) evicted the unit at work: one layer read from
     * memory, 32 rows x 1,152, blocks of 16, alternated at load 4-5: 8.6-9.5 ms against 11.1-12.1
     * (issue 27). */
    const int64_t group = hq / hkv, tok = hkv * d, unit = block_size < 8 ? block_size : 8, stride = (unit + 7) & ~7;
    const int64_t block_floats = block_size * tok;
    const float *vbase = kv + num_blocks * block_floats;  /* V blocks follow all K blocks */
    float m[hq], l[hq];
    float s[hq * stride] __attribute__((aligned(32)));
    float acc[hq * d] __attribute__((aligned(32)));
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < rows; r++) {
        const float *qr = q + r * hq * d;
        const int64_t len = lens[r], nblocks = (len + block_size - 1) / block_size;
        for (int64_t i = 0; i < hq; i++) { m[i] = -FLT_MAX; l[i] = 0.f; }
        memset(acc, 0, sizeof(float) * hq * d);
        for (int64_t j = 0; j < nblocks; j++) {
          const int64_t b = tables[r * width + j];
          const int64_t nb = len - j * block_size < block_size ? len - j * block_size : block_size;
          for (int64_t u = 0; u < nb; u += unit) {  /* the block in units of up to 16 tokens */
            const int64_t n = nb - u < unit ? nb - u : unit;
            const float *K = kv + b * block_floats + u * tok, *V = vbase + b * block_floats + u * tok;
            /* the next unit: the rest of this block, else the next block read (this row's or the next row's) */
            const int64_t next = u + unit < block_size ? b : block_ahead(tables, width, lens, block_size, rows, r, j, 1);
            const int64_t at = u + unit < block_size ? (u + unit) * tok : 0;
            const int64_t span = block_floats - at < unit * tok ? block_floats - at : unit * tok;
            const int64_t lines = span * (int64_t)sizeof(float) / 64,
                          steps = hq * (n / 8 > 0 ? n / 8 : 1) + hkv * (d / 16) * ((group + 3) / 4);
            Prefetch pf = {next < 0 ? NULL : (const char *)(kv + next * block_floats + at),
                           next < 0 ? NULL : (const char *)(vbase + next * block_floats + at), lines,
                           (lines + steps - 1) / steps};
            for (int64_t h = 0; h < hkv; h++) {  /* one KV head's K and V rows at a time, for its whole query group */
                const float *qh = qr + h * group * d, *Kh = K + h * d, *Vh = V + h * d;
                float *sh = s + h * group * stride;
                int64_t t = 0;
                for (; t + 8 <= n; t += 8) scores8(qh, Kh + t * tok, group, d, tok, vscale, sh + t, stride, &pf);
                for (; t < n; t++) scores1(qh, Kh + t * tok, group, d, scale, sh + t, stride);
                for (int64_t g = 0; g < group; g++) {
                    const int64_t i = h * group + g;
                    online_softmax(s + i * stride, n, m + i, l + i, acc + i * d, d);
                }
                for (int64_t g = 0; g < group; g += 4) {
                    const int G = group - g < 4 ? (int)(group - g) : 4;
                    float *a = acc + (h * group + g) * d;
                    const float *p = sh + g * stride;
                    switch (G) {  /* a constant G each, so the compiler keeps the accumulators in registers */
                    case 4: group_pv(a, p, stride, Vh, n, 4, d, tok, &pf); break;
                    case 3: group_pv(a, p, stride, Vh, n, 3, d, tok, &pf); break;
                    case 2: group_pv(a, p, stride, Vh, n, 2, d, tok, &pf); break;
                    default: group_pv(a, p, stride, Vh, n, 1, d, tok, &pf); break;
                    }
                }
            }
          }
        }
        float *o = out + r * hq * d;
        for (int64_t i = 0; i < hq; i++) {
            const __m256 inv = _mm256_set1_ps(1.f / l[i]);
            for (int64_t e = 0; e < d; e += 8) _mm256_storeu_ps(o + i * d + e, _mm256_mul_ps(_mm256_load_ps(acc + i * d + e), inv));
        }
    }
}
