/* Overlap of two tensors in one buffer. Past the test of their spans, two
 * strided tensors are told apart modulo the strides of their outer
 * dimensions: every byte of a tensor is base + inner + outer, where inner
 * (the innermost dimensions' offsets) lies in [0, reach] and outer is a
 * multiple of g, the gcd of the outer strides of both tensors. When the two
 * arcs [base, base + reach] taken modulo g do not meet, no byte is in both.
 * Trying each split of each tensor's dimensions into inner and outer ones
 * recognises the packed layouts (QKV and dQKV interleaved per token, or per
 * head in BHSD order). */
#include "overlap.h"

#include <stddef.h>

fa_footprint fa_range_footprint(uint64_t base, uint64_t bytes) {
    fa_footprint f = {base, bytes, 0, {0, 0, 0}, {0, 0, 0}};
    return f;
}

fa_footprint fa_tensor_footprint(const fa_attention_desc *desc, fa_tensor_role role) {
    const uint64_t elem = (uint64_t)fa_dtype_size(fa_desc_tensor(desc, role)->dtype);
    fa_dim dims[4];
    fa_desc_dims(desc, role, dims);
    fa_footprint f = fa_range_footprint((uint64_t)fa_desc_tensor(desc, role)->offset * elem,
                                        (uint64_t)dims[0].extent * elem);
    for (int i = 1; i < 4; i++) {
        if (dims[i].extent <= 0) f.run = 0;
        if (dims[i].extent <= 1) continue; /* a single index adds nothing */
        /* Insertion by stride, smallest first. */
        int at = f.ndims++;
        for (; at > 0 && f.stride[at - 1] > (uint64_t)dims[i].stride * elem; at--) {
            f.extent[at] = f.extent[at - 1];
            f.stride[at] = f.stride[at - 1];
        }
        f.extent[at] = (uint64_t)dims[i].extent;
        f.stride[at] = (uint64_t)dims[i].stride * elem;
    }
    return f;
}

/* Offset of the last byte past base reached by dimensions [0, n). */
static uint64_t reach(const fa_footprint *f, int n) {
    uint64_t r = f->run - 1;
    for (int k = 0; k < n; k++) r += (f->extent[k] - 1) * f->stride[k];
    return r;
}

static uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int split_separates(const fa_footprint *a, int ia, const fa_footprint *b, int ib) {
    uint64_t g = 0;
    for (int k = ia; k < a->ndims; k++) g = gcd(g, a->stride[k]);
    for (int k = ib; k < b->ndims; k++) g = gcd(g, b->stride[k]);
    if (g == 0) return 0; /* no outer dimension: the spans decided */
    const uint64_t ra = reach(a, ia), rb = reach(b, ib);
    if (ra >= g || rb >= g) return 0;
    const uint64_t sa = a->base % g, sb = b->base % g;
    return (sb + g - sa) % g > ra && (sa + g - sb) % g > rb;
}

int fa_footprints_overlap(const fa_footprint *a, const fa_footprint *b) {
    if (a->run == 0 || b->run == 0) return 0;
    if (a->base + reach(a, a->ndims) < b->base || b->base + reach(b, b->ndims) < a->base) return 0;
    for (int ia = 0; ia <= a->ndims; ia++)
        for (int ib = 0; ib <= b->ndims; ib++)
            if (split_separates(a, ia, b, ib)) return 0;
    return 1;
}
