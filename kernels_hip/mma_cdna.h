/* Fragment layer, AMD CDNA2 / CDNA3 (gfx90a, gfx94x): the MFMA
 * instructions with fp32 accumulators on 64-lane wavefronts, in one of two
 * shapes the host picks with the plan:
 *   FA_MFMA32  v_mfma_f32_32x32x8f16 / v_mfma_f32_32x32x8bf16_1k
 *   FA_MFMA16  v_mfma_f32_16x16x16f16 / v_mfma_f32_16x16x16bf16_1k
 * The contract is mma_frag.h's. The accumulators are vectors the compiler
 * keeps in AGPRs where it can; the operands are 4 elements a lane.
 *
 * Lane layouts, after AMD's matrix instruction tables (the CDNA3 ISA guide,
 * section 7; the bf16_1k forms lay out their operands as the f16 ones):
 *   32x32x8   A[i][k]: lane i + 32 (k / 4), element k % 4;
 *             B[k][j]: lane j + 32 (k / 4), element k % 4;
 *             D[i][j]: lane j + 32 ((i / 4) % 2), element 4 (i / 8) + i % 4
 *   16x16x16  A[i][k]: lane i + 16 (k / 4), element k % 4;
 *             B[k][j]: lane j + 16 (k / 4), element k % 4;
 *             D[i][j]: lane j + 16 (i / 4), element i % 4
 * Scores are held transposed (FA_OWN_N 1: S^T = K Q^T forward, S = Q K^T in
 * the dK/dV kernel): a lane holds one own row (its column of D), shared
 * with lane l ^ 32 (32x32) or l ^ 16, l ^ 32 (16x16); and the elements of
 * D a lane holds for one k-step of the next product are exactly its
 * elements of that product's B operand (P^T, dS^T), in the same order. */

#if defined(FA_MFMA32)
#define FA_LAYER_NAME "mfma32"
#define FA_M 32
#define FA_N 32
#define FA_K 8
#define FA_C_ELEMS 16
#define FA_HALF_LANES 32
#define FA_C_ROW(l, e) (8 * ((e) / 4) + 4 * ((l) / 32) + (e) % 4)
#define FA_RED_STEPS 1
#define FA_RED_MASK(i) 32
/* B of k-step ks (8 others): elements 4 (ks % 4) .. + 3 of fragment ks / 4. */
#define FA_X2P_FRAG(ks, i) ((ks) / 4)
#define FA_X2P_ELEM(ks, i) (4 * ((ks) % 4) + (i))
#define FA_INSTR_F16 "v_mfma_f32_32x32x8f16"
#define FA_INSTR_BF16 "v_mfma_f32_32x32x8bf16_1k"
#elif defined(FA_MFMA16)
#define FA_LAYER_NAME "mfma16"
#define FA_M 16
#define FA_N 16
#define FA_K 16
#define FA_C_ELEMS 4
#define FA_HALF_LANES 16
#define FA_C_ROW(l, e) (4 * ((l) / 16) + (e))
#define FA_RED_STEPS 2
#define FA_RED_MASK(i) (16 << (i))
#define FA_X2P_FRAG(ks, i) (ks)
#define FA_X2P_ELEM(ks, i) (i)
#define FA_INSTR_F16 "v_mfma_f32_16x16x16f16"
#define FA_INSTR_BF16 "v_mfma_f32_16x16x16bf16_1k"
#else
#error "mma_cdna.h: define FA_MFMA32 or FA_MFMA16"
#endif

#define FA_SG 64
#define FA_A_ELEMS 4
#define FA_B_ELEMS 4
#define FA_A_ROW(l, i) ((l) % FA_HALF_LANES)
#define FA_A_COL(l, i) (4 * ((l) / FA_HALF_LANES) + (i))
#define FA_B_K(l, i) (4 * ((l) / FA_HALF_LANES) + (i))
#define FA_B_N(l, i) ((l) % FA_HALF_LANES)
#define FA_C_COL(l, e) ((l) % FA_HALF_LANES)

#define FA_OWN_N 1
#define FA_OWN_SLOTS 1
#define FA_OWN_SLOT(e) 0
#define FA_OWN_IDX(l, s) ((l) % FA_HALF_LANES)
#define FA_X2P_LANE(l, ks, i) (l)

/* A lane's elements 4 q .. 4 q + 3 are neighbouring rows of one column. */
#define FA_C_RUN_M 4
#define FA_C_RUN_N 1
#define FA_A_KRUN 4
#define FA_B_KRUN 4

#ifndef FA_HOST_MODEL

typedef fa_uint fa_u32x2v __attribute__((ext_vector_type(2)));
typedef _Float16 fa_f16x4v __attribute__((ext_vector_type(4)));
typedef short fa_i16x4v __attribute__((ext_vector_type(4)));
typedef float fa_cvec __attribute__((ext_vector_type(FA_C_ELEMS)));

struct fa_a {
    fa_u32x2v w;
};
struct fa_b {
    fa_u32x2v w;
};
struct fa_c {
    fa_cvec x;
};

FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b) {
#if defined(FA_MFMA32) && defined(DTYPE_F16)
    c->x = __builtin_amdgcn_mfma_f32_32x32x8f16(__builtin_bit_cast(fa_f16x4v, a->w), __builtin_bit_cast(fa_f16x4v, b->w),
                                                c->x, 0, 0, 0);
#elif defined(FA_MFMA32)
    c->x = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(fa_i16x4v, a->w),
                                                    __builtin_bit_cast(fa_i16x4v, b->w), c->x, 0, 0, 0);
#elif defined(DTYPE_F16)
    c->x = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(fa_f16x4v, a->w),
                                                 __builtin_bit_cast(fa_f16x4v, b->w), c->x, 0, 0, 0);
#else
    c->x = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(fa_i16x4v, a->w),
                                                     __builtin_bit_cast(fa_i16x4v, b->w), c->x, 0, 0, 0);
#endif
}

#endif /* FA_HOST_MODEL */
