#include "test_util.h"

#include "dtype.h"

#include <math.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fa_rng_seed(fa_rng *rng, uint64_t seed) {
    rng->s[0] = splitmix64(&seed);
    rng->s[1] = splitmix64(&seed);
}

uint64_t fa_rng_next(fa_rng *rng) {
    /* xoroshiro128+ */
    uint64_t s0 = rng->s[0], s1 = rng->s[1];
    uint64_t result = s0 + s1;
    s1 ^= s0;
    rng->s[0] = ((s0 << 24) | (s0 >> 40)) ^ s1 ^ (s1 << 16);
    rng->s[1] = (s1 << 37) | (s1 >> 27);
    return result;
}

double fa_rng_uniform(fa_rng *rng, double lo, double hi) {
    double u = (double)(fa_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

double fa_rng_normal(fa_rng *rng) {
    double u1 = fa_rng_uniform(rng, 0.0, 1.0);
    double u2 = fa_rng_uniform(rng, 0.0, 1.0);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void *fa_test_random_tensor(fa_rng *rng, fa_dtype dtype, int64_t count) {
    void *data = malloc((size_t)count * fa_dtype_size(dtype) + 1);
    if (!data) return NULL;
    for (int64_t i = 0; i < count; i++) fa_store_elem(data, dtype, i, fa_rng_normal(rng));
    return data;
}

void fa_test_poison(void *data, fa_dtype dtype, int64_t count) {
    for (int64_t i = 0; i < count; i++) fa_store_elem(data, dtype, i, NAN);
}

double fa_test_rel_error(const void *a, const void *b, fa_dtype dtype, int64_t count) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < count; i++) {
        double x = fa_load_elem(a, dtype, i), y = fa_load_elem(b, dtype, i);
        if (isfinite(y) && !isfinite(x)) return INFINITY;
        if (!isfinite(y)) continue;
        num += (x - y) * (x - y);
        den += y * y;
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}
