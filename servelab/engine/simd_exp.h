/* exp8: e^x on eight floats with AVX2 + FMA, shared by the engine's C kernels (paged_decode.c's
 * online softmax, layer_ops.c's SiLU). One copy, so both kernels round the same way.
 *
 * e^x for x in [-87, 88] (clamped there): 2^n * 2^f, f in [-0.5, 0.5], the Taylor series of 2^f
 * to degree 7 (relative error below 1e-7). Include after <immintrin.h>; a change here rebuilds
 * both libraries (core/native_build hashes a source's local includes with it). */
#ifndef SERVELAB_SIMD_EXP_H
#define SERVELAB_SIMD_EXP_H

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

#endif
