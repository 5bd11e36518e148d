/* The small elementwise parts of a decoder layer, fused, in float32 (AVX2 + FMA, one thread).
 *
 * Why: at a decode step's 32 rows each of these is a few torch ops over a few hundred KiB, and
 * the op overheads and intermediate tensors, not the arithmetic, were their cost: in issue 27's
 * breakdown of a bench-200m step (batch 32, context 1,152) RoPE with its split and views took
 * 0.5-0.7 ms a layer and the two RMSNorms 0.4-0.6 ms, against microseconds of arithmetic. Each
 * function here is one pass over its rows.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)), as model.RMSNorm in float32. Rows are
 * row_stride floats apart in x, dim apart in out. */
void rms_norm_f32(const float *x, int64_t rows, int64_t dim, int64_t row_stride, const float *weight, float eps,
                  float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * row_stride;
        float *o = out + r * dim;
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= dim; i += 8) {
            const __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum8(acc);
        for (; i < dim; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        const __m256 vinv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= dim; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i),
                                                  _mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv)));
        for (; i < dim; i++) o[i] = weight[i] * (xr[i] * inv);
    }
}

/* h[r] = x[r] + a[r], and out[r] = RMSNorm(h[r]) as rms_norm_f32 (the decoder layer's residual
 * add and the norm after it, one pass instead of a torch add and a norm). All [rows][dim]. */
void add_rms_norm_f32(const float *x, const float *a, int64_t rows, int64_t dim, const float *weight, float eps,
                      float *h, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim, *ar = a + r * dim;
        float *hr = h + r * dim;
        int64_t i = 0;
        for (; i + 8 <= dim; i += 8) _mm256_storeu_ps(hr + i, _mm256_add_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(ar + i)));
        for (; i < dim; i++) hr[i] = xr[i] + ar[i];
        rms_norm_f32(hr, 1, dim, dim, weight, eps, out + r * dim);  /* the row just written, still in L1 */
    }
}

/* RoPE in place, HF Llama's rotate-half convention: for each row r and head h of x (rows
 * row_stride floats apart, heads d apart), x1 = x[:d/2], x2 = x[d/2:] become
 * (x1 cos1 - x2 sin1, x2 cos2 + x1 sin2), with cos and sin [rows][d] (the same for every head). */
void rope_f32(float *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t d, const float *cos_t,
              const float *sin_t) {
    const int64_t half = d / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_t + r * d, *s = sin_t + r * d;
        for (int64_t h = 0; h < heads; h++) {
            float *x1 = x + r * row_stride + h * d, *x2 = x1 + half;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                const __m256 a = _mm256_loadu_ps(x1 + i), b = _mm256_loadu_ps(x2 + i);
                _mm256_storeu_ps(x1 + i, _mm256_fnmadd_ps(b, _mm256_loadu_ps(s + i),
                                                          _mm256_mul_ps(a, _mm256_loadu_ps(c + i))));
                _mm256_storeu_ps(x2 + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(s + half + i),
                                                         _mm256_mul_ps(b, _mm256_loadu_ps(c + half + i))));
            }
            for (; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}

#include "simd_exp.h"  /* exp8 */

/* The MLP's activation: out[r] = silu(gate) * up, gate and up the two halves of gate_up[r]
 * ([rows][2 * inter], rows row_stride floats apart), out [rows][inter]; silu(g) = g / (1 + e^-g).
 * One pass instead of torch's chunk, silu and mul over a [rows, inter] intermediate. */
void silu_mul_f32(const float *gate_up, int64_t rows, int64_t inter, int64_t row_stride, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * row_stride, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gv))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
        for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
