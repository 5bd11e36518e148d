/* Decode attention read in place from servelab's paged KV cache (float32, AVX2 + FMA, one thread).
 *
 * Why: torch has no op that attends over scattered cache blocks, so the torch path copies every
 * row's K and V out of the cache (index_select) and then runs the fused flash kernel, which is
 * built for many query rows and spends most of its time on per-(row, head) overhead with the four
 * query rows of a GQA decode (docs/benchmarks/decode_kernels.md). Here each row walks its own
 * blocks once, in the cache's order (token, KV head, dim), keeping FlashDecoding's running max,
 * sum and output per query head (online softmax), so K and V are read once and never copied.
 *
 * Layout (servelab.engine.kv_cache): one layer is [2, num_blocks, block_size, kv_heads, head_dim];
 * q and out are [rows, q_heads, head_dim]; tables [rows, width] block ids; lens[r] the number of
 * cache slots row r attends to (its context, the new token included). head_dim % 32 == 0.
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

/* e^x for x <= 0 (scores minus their running max): 2^n * 2^f, f in [-0.5, 0.5], the Taylor
 * series of 2^f to degree 7 (relative error below 1e-7 there); x is clamped to [-87, 88]. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.5252733804059840e-5f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381608e-4f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Scores of one block for every query head: s[i * stride + t] = q_i . k_t * scale. Token-major
 * (t outer, KV head inner) so the block is read front to back. With each token it asks for the
 * same token's K and V of the next block (nk, nv; may be NULL): spread over the block's work, the
 * next block's lines arrive while this one computes (one layer, batch 32, context 1,152: 11 ms
 * against 15-16 with the whole next block asked for at once, which the core's few outstanding
 * misses cannot take in). */
static void block_scores(const float *qr, const float *K, int64_t n, int64_t hkv, int64_t group, int64_t d,
                         float scale, float *s, int64_t stride, const char *nk, const char *nv) {
    const int64_t tok = hkv * d, line_floats = 16;
    for (int64_t t = 0; t < n; t++) {
        if (nk) {
            for (int64_t c = t * tok; c < (t + 1) * tok; c += line_floats) {
                _mm_prefetch(nk + c * sizeof(float), _MM_HINT_T0);
                _mm_prefetch(nv + c * sizeof(float), _MM_HINT_T0);
            }
        }
        for (int64_t h = 0; h < hkv; h++) {
            const float *k = K + t * tok + h * d;
            for (int64_t g = 0; g < group; g++) {
                const float *qq = qr + (h * group + g) * d;
                __m256 a = _mm256_setzero_ps();
                for (int64_t e = 0; e < d; e += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(qq + e), _mm256_loadu_ps(k + e), a);
                s[(h * group + g) * stride + t] = sum8(a) * scale;
            }
        }
    }
}

void paged_decode_f32(const float *kv, int64_t num_blocks, int64_t block_size, int64_t hkv, int64_t d,
                      const float *q, int64_t rows, int64_t hq, const int64_t *tables, int64_t width,
                      const int64_t *lens, float scale, float *out) {
    const int64_t group = hq / hkv, tok = hkv * d, stride = (block_size + 7) & ~7;
    const float *vbase = kv + num_blocks * block_size * tok;  /* V blocks follow all K blocks */
    float m[hq], l[hq];
    float s[hq * stride] __attribute__((aligned(32)));
    float acc[hq * d] __attribute__((aligned(32)));
    for (int64_t r = 0; r < rows; r++) {
        const float *qr = q + r * hq * d;
        const int64_t len = lens[r], nblocks = (len + block_size - 1) / block_size;
        for (int64_t i = 0; i < hq; i++) { m[i] = -FLT_MAX; l[i] = 0.f; }
        memset(acc, 0, sizeof(float) * hq * d);
        for (int64_t j = 0; j < nblocks; j++) {
            const int64_t b = tables[r * width + j];
            const int64_t n = len - j * block_size < block_size ? len - j * block_size : block_size;
            const float *K = kv + b * block_size * tok, *V = vbase + b * block_size * tok;
            /* the next block to read is elsewhere in memory: this row's next, else the next row's first */
            const int64_t next = j + 1 < nblocks ? tables[r * width + j + 1] : r + 1 < rows ? tables[(r + 1) * width] : -1;
            const char *nk = next < 0 ? NULL : (const char *)(kv + next * block_size * tok);
            const char *nv = next < 0 ? NULL : (const char *)(vbase + next * block_size * tok);
            block_scores(qr, K, n, hkv, group, d, scale, s, stride, nk, nv);
            for (int64_t i = 0; i < hq; i++) {  /* online softmax: fold this block into the running max and sum */
                float *si = s + i * stride, peak = m[i];
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
                if (peak > m[i]) {
                    const float alpha = expf(m[i] - peak);
                    const __m256 va = _mm256_set1_ps(alpha);
                    float *a = acc + i * d;
                    for (int64_t e = 0; e < d; e += 8) _mm256_store_ps(a + e, _mm256_mul_ps(_mm256_load_ps(a + e), va));
                    l[i] *= alpha;
                    m[i] = peak;
                }
                l[i] += total;
            }
            for (int64_t i = 0; i < hq; i++) {  /* acc_i += p_i V over the block, 32 dims in registers at a time */
                const float *v = V + (i / group) * d, *p = s + i * stride;
                float *a = acc + i * d;
                for (int64_t e = 0; e < d; e += 32) {
                    __m256 a0 = _mm256_load_ps(a + e), a1 = _mm256_load_ps(a + e + 8);
                    __m256 a2 = _mm256_load_ps(a + e + 16), a3 = _mm256_load_ps(a + e + 24);
                    for (int64_t t = 0; t < n; t++) {
                        const __m256 pt = _mm256_broadcast_ss(p + t);
                        const float *vt = v + t * tok + e;
                        a0 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt), a0);
                        a1 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8), a1);
                        a2 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 16), a2);
                        a3 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 24), a3);
                    }
                    _mm256_store_ps(a + e, a0);
                    _mm256_store_ps(a + e + 8, a1);
                    _mm256_store_ps(a + e + 16, a2);
                    _mm256_store_ps(a + e + 24, a3);
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
