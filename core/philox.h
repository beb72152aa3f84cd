/* Philox4x32-10 (Salmon et al., SC'11) and the dropout mask built on it.
 *
 * The dropout decision is a pure function of (seed, offset, batch, head,
 * row, col), never of thread or tile layout, so every backend and the CPU
 * reference drop exactly the same elements and the backward pass regenerates
 * the forward pass's mask. The exact definition, which the OpenCL, HIP and
 * CUDA kernels reimplement bit for bit:
 *
 *   key     = { (uint32)seed, (uint32)(seed >> 32) + (uint32)(offset >> 32) }
 *   counter = { col >> 2, row, batch * heads_q + head, (uint32)offset }
 *   r       = philox4x32_10(counter, key)[col & 3]
 *   keep    = r >= threshold,  threshold = fa_dropout_threshold(p)
 *
 * batch is the sequence index (also with variable-length batches), row and
 * col are positions within that sequence, plus the plan's dropout origin
 * where its problem is part of a larger one (plan.h drop_row0, drop_col0),
 * all modulo 2^32. One Philox call serves four neighbouring columns. */
#ifndef FA_PHILOX_H
#define FA_PHILOX_H

#include <stdint.h>

typedef struct fa_philox_u32x4 {
    uint32_t v[4];
} fa_philox_u32x4;

fa_philox_u32x4 fa_philox4x32_10(fa_philox_u32x4 counter, uint32_t key0, uint32_t key1);

/* floor(p * 2^32) clamped to 2^32 - 1: an element is dropped when its random
 * word is below this. p in [0, 1). */
uint32_t fa_dropout_threshold(float p);

/* What the kernels take of (seed, offset): the key and the counter's last
 * word (see above). Plans keep it beside the descriptor and hand it to the
 * kernels as arguments at every pass, so a new seed needs no new program. */
typedef struct fa_dropout_key {
    uint32_t key0, key1, offset_lo;
} fa_dropout_key;

fa_dropout_key fa_dropout_key_of(uint64_t seed, uint64_t offset);

/* The random word of one element (see above). */
uint32_t fa_dropout_random(uint64_t seed, uint64_t offset, int batch, int head, int heads_q,
                           uint32_t row, uint32_t col);

#endif
