/* Philox4x32-10 and the dropout mask. Kept deliberately plain: the device
 * kernels restate these few lines and must agree bit for bit. */
#include "philox.h"

#include "flashattn.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

fa_philox_u32x4 fa_philox4x32_10(fa_philox_u32x4 counter, uint32_t key0, uint32_t key1) {
    uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            key0 += PHILOX_W0;
            key1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ key0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ key1;
        c3 = lo0;
    }
    fa_philox_u32x4 out = {{c0, c1, c2, c3}};
    return out;
}

uint32_t fa_dropout_threshold(float p) {
    /* p * 2^32 is exact in double (a float has 24 significant bits). */
    if (!(p > 0.0f)) return 0;
    double t = (double)p * 4294967296.0;
    if (t >= 4294967295.0) return UINT32_MAX;
    return (uint32_t)t; /* truncation is floor for t >= 0 */
}

fa_dropout_key fa_dropout_key_of(uint64_t seed, uint64_t offset) {
    /* Unsigned arithmetic: wraps identically on every device. */
    fa_dropout_key k = {(uint32_t)seed, (uint32_t)(seed >> 32) + (uint32_t)(offset >> 32), (uint32_t)offset};
    return k;
}

uint32_t fa_dropout_random(uint64_t seed, uint64_t offset, int batch, int head, int heads_q,
                           uint32_t row, uint32_t col) {
    const fa_dropout_key key = fa_dropout_key_of(seed, offset);
    fa_philox_u32x4 counter = {{col >> 2, row, (uint32_t)batch * (uint32_t)heads_q + (uint32_t)head,
                                key.offset_lo}};
    fa_philox_u32x4 r = fa_philox4x32_10(counter, key.key0, key.key1);
    return r.v[col & 3u];
}

int fa_dropout_keep(uint64_t seed, uint64_t offset, float p, int batch, int head, int heads_q,
                    int row, int col) {
    if (!(p > 0.0f)) return 1;
    return fa_dropout_random(seed, offset, batch, head, heads_q, (uint32_t)row, (uint32_t)col) >=
           fa_dropout_threshold(p);
}
