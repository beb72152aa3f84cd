/* Fragment layer, AMD RDNA3 (gfx11): v_wmma_f32_16x16x16_f16 / _bf16 on
 * 32-lane wavefronts (the _w32 built-ins), fp32 accumulators. The contract
 * is mma_frag.h's.
 *
 * Lane layouts, after the RDNA3 ISA guide (section 7.9, WMMA):
 *   A[i][k]: lanes i and i + 16 (both halves hold the whole matrix),
 *            element k;
 *   B[k][j]: lanes j and j + 16, element k;
 *   D[i][j]: lane j + 16 (i % 2), element i / 2.
 * Scores are held transposed (FA_OWN_N 1): a lane holds one own row (its
 * column of D), shared with lane l ^ 16, which holds the other half of its
 * elements: the next product's B operand (all 16 others of the column, in
 * both halves) takes one exchange with that lane per k-step
 * (fa_x_to_p). */

#define FA_LAYER_NAME "wmma"
#define FA_SG 32
#define FA_M 16
#define FA_N 16
#define FA_K 16
#define FA_A_ELEMS 16
#define FA_B_ELEMS 16
#define FA_C_ELEMS 8

#define FA_A_ROW(l, i) ((l) % 16)
#define FA_A_COL(l, i) (i)
#define FA_B_K(l, i) (i)
#define FA_B_N(l, i) ((l) % 16)
#define FA_C_ROW(l, e) (2 * (e) + (l) / 16)
#define FA_C_COL(l, e) ((l) % 16)

#define FA_OWN_N 1
#define FA_OWN_SLOTS 1
#define FA_OWN_SLOT(e) 0
#define FA_OWN_IDX(l, s) ((l) % 16)
#define FA_RED_STEPS 1
#define FA_RED_MASK(i) 16

/* B element i (other i of the k-step) is element i / 2 of the lane of the
 * column's half i % 2. */
#define FA_X2P_FRAG(ks, i) (ks)
#define FA_X2P_ELEM(ks, i) ((i) / 2)
#define FA_X2P_LANE(l, ks, i) ((l) % 16 + 16 * ((i) % 2))

#define FA_C_RUN_M 1
#define FA_C_RUN_N 1
#define FA_A_KRUN 16
#define FA_B_KRUN 16

#define FA_INSTR_F16 "v_wmma_f32_16x16x16_f16"
#define FA_INSTR_BF16 "v_wmma_f32_16x16x16_bf16"

#ifndef FA_HOST_MODEL

typedef fa_uint fa_u32x8v __attribute__((ext_vector_type(8)));
typedef _Float16 fa_f16x16v __attribute__((ext_vector_type(16)));
typedef short fa_i16x16v __attribute__((ext_vector_type(16)));
typedef float fa_cvec __attribute__((ext_vector_type(8)));

struct fa_a {
    fa_u32x8v w;
};
struct fa_b {
    fa_u32x8v w;
};
struct fa_c {
    fa_cvec x;
};

FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b) {
#if defined(DTYPE_F16)
    c->x = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(__builtin_bit_cast(fa_f16x16v, a->w),
                                                      __builtin_bit_cast(fa_f16x16v, b->w), c->x);
#else
    c->x = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(__builtin_bit_cast(fa_i16x16v, a->w),
                                                       __builtin_bit_cast(fa_i16x16v, b->w), c->x);
#endif
}

/* The B operand of k-step ks: word w holds others 2 w (from the lanes of
 * half 0, element w) and 2 w + 1 (half 1, element w). Each lane packs its
 * own elements in pairs, swaps them with lane l ^ 16, and interleaves. */
#define FA_NATIVE_X2P 1
FA_FN fa_uint fa_pack2(float lo, float hi); /* mma_frag.h */
FA_FN void fa_x_to_p(fa_b *p, const fa_c *x, int ks, int lane) {
    const bool upper = lane >= 16;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const fa_uint mine = fa_pack2(x[ks].x[2 * u], x[ks].x[2 * u + 1]);
        const fa_uint theirs = (fa_uint)__shfl_xor((int)mine, 16, FA_SG);
        const fa_uint h0 = upper ? theirs : mine, h1 = upper ? mine : theirs;
        p->w[2 * u] = (h0 & 0xffffu) | (h1 << 16);
        p->w[2 * u + 1] = (h0 >> 16) | (h1 & 0xffff0000u);
    }
}

#endif /* FA_HOST_MODEL */
