/* Eight- and four-float vectors as GCC/Clang vector types, which the compiler maps to the machine's
 * registers (AVX2, AVX-512, NEON), and the few helpers the portable kernels share. Loads and stores go
 * through memcpy, so nothing needs to be aligned. */
#ifndef SLUICE_VEC8_H
#define SLUICE_VEC8_H

#include <stdint.h>
#include <string.h>

typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi8 __attribute__((vector_size(32)));

static inline vf8 load8(const float *p) {
    vf8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, vf8 v) { memcpy(p, &v, sizeof v); }

/* The four lane sums of a, b, c, d, as one vector. */
static inline vf4 sum4(vf8 a, vf8 b, vf8 c, vf8 d) {
    vf4 ha = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    vf4 hb = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    vf4 hc = __builtin_shufflevector(c, c, 0, 1, 2, 3) + __builtin_shufflevector(c, c, 4, 5, 6, 7);
    vf4 hd = __builtin_shufflevector(d, d, 0, 1, 2, 3) + __builtin_shufflevector(d, d, 4, 5, 6, 7);
    vf4 ab = __builtin_shufflevector(ha, hb, 0, 4, 1, 5) + __builtin_shufflevector(ha, hb, 2, 6, 3, 7);
    vf4 cd = __builtin_shufflevector(hc, hd, 0, 4, 1, 5) + __builtin_shufflevector(hc, hd, 2, 6, 3, 7);
    return __builtin_shufflevector(ab, cd, 0, 1, 4, 5) + __builtin_shufflevector(ab, cd, 2, 3, 6, 7);
}

#endif
