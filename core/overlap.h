/* Which bytes of a buffer a tensor may touch, and whether two tensors in one
 * buffer can share a byte: the check that refuses outputs aliasing inputs
 * or each other (fa_forward, fa_backward). */
#ifndef FA_OVERLAP_H
#define FA_OVERLAP_H

#include "desc.h"

#include <stdint.h>

/* Bytes base + sum_k i_k * stride[k] + c for 0 <= i_k < extent[k] and
 * 0 <= c < run: a strided tensor (run: head_dim elements) or a contiguous
 * range (no dimensions). Empty when run or an extent is 0. */
typedef struct fa_footprint {
    uint64_t base, run;
    int ndims;
    uint64_t extent[3], stride[3];
} fa_footprint;

/* The footprint of a tensor of a descriptor that passed the check. */
fa_footprint fa_tensor_footprint(const fa_attention_desc *desc, fa_tensor_role role);
/* bytes contiguous bytes from base. */
fa_footprint fa_range_footprint(uint64_t base, uint64_t bytes);

/* 0 only when no byte can be in both. Exact for disjoint spans and for
 * tensors that interleave row by row (Q, K and V, or dQ, dK and dV, packed
 * in one buffer); otherwise it errs towards overlap. */
int fa_footprints_overlap(const fa_footprint *a, const fa_footprint *b);

#endif
