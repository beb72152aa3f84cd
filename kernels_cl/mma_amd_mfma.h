/* AMD CDNA2 / CDNA3 matrix cores (gfx90a, gfx94x): the MFMA instructions
 * with fp32 accumulators on 64-lane wavefronts, in one of two shapes the
 * plan picks (FA_MMA_AMD_MFMA16 selects the second):
 *   32x32x8    v_mfma_f32_32x32x8f16 / v_mfma_f32_32x32x8bf16_1k
 *   16x16x16   v_mfma_f32_16x16x16f16 / v_mfma_f32_16x16x16bf16_1k
 * See mma_frag.h for the contract; kernels_hip/mma_cdna.h is the HIP twin.
 *
 * The instructions' lane layouts (AMD's CDNA3 ISA guide, section 7; the
 * bf16_1k forms lay out their operands as the f16 ones), D = A' B':
 *   32x32x8   A'[i][k]: lane i + 32 (k / 4), element k % 4;
 *             B'[k][j]: lane j + 32 (k / 4), element k % 4;
 *             D[i][j]:  lane j + 32 ((i / 4) % 2), element 4 (i / 8) + i % 4
 *   16x16x16  A'[i][k]: lane i + 16 (k / 4), element k % 4;
 *             B'[k][j]: lane j + 16 (k / 4), element k % 4;
 *             D[i][j]:  lane j + 16 (i / 4), element i % 4
 * This layer runs them on swapped operands (A' = B^T, B' = A^T, C = D^T),
 * as the HIP layer holds its scores transposed: a lane then holds one row
 * of C (lane l % 32, or l % 16), shared with lane l ^ 32 (and l ^ 16,
 * l ^ 32 for 16x16x16), and its elements of a row strip's n-tiles are its
 * elements of the next product's A operand, in registers. */

#if defined(FA_MMA_AMD_MFMA16)
#define FA_M 16
#define FA_N 16
#define FA_K 16
#define FA_C_ELEMS 4
#define FA_HALF_LANES 16
#define FA_C_COL(l, e) (4 * ((l) / 16) + (e))
#define FA_RED_STEPS 2
#define FA_RED_MASK(i) (16 << (i))
#define FA_C2A_TILE(ks, i) (ks)
#define FA_C2A_ELEM(ks, i) (i)
#define FA_INSTR_F16 "v_mfma_f32_16x16x16f16"
#define FA_INSTR_BF16 "v_mfma_f32_16x16x16bf16_1k"
#else
#define FA_M 32
#define FA_N 32
#define FA_K 8
#define FA_C_ELEMS 16
#define FA_HALF_LANES 32
#define FA_C_COL(l, e) (8 * ((e) / 4) + 4 * ((l) / 32) + (e) % 4)
#define FA_RED_STEPS 1
#define FA_RED_MASK(i) 32
/* k-step ks (8 columns) is a quarter of n-tile ks / 4. */
#define FA_C2A_TILE(ks, i) ((ks) / 4)
#define FA_C2A_ELEM(ks, i) (4 * ((ks) % 4) + (i))
#define FA_INSTR_F16 "v_mfma_f32_32x32x8f16"
#define FA_INSTR_BF16 "v_mfma_f32_32x32x8bf16_1k"
#endif

#define FA_SG 64
#define FA_A_WORDS 2
#define FA_B_WORDS 2
#define FA_C_ROWS 1

#define FA_A_ROW(l, i) ((l) % FA_HALF_LANES)
#define FA_A_COL(l, i) (4 * ((l) / FA_HALF_LANES) + (i))
#define FA_B_K(l, i) (4 * ((l) / FA_HALF_LANES) + (i))
#define FA_B_N(l, i) ((l) % FA_HALF_LANES)
#define FA_C_ROW(l, e) ((l) % FA_HALF_LANES)
#define FA_C_SLOT(e) 0
#define FA_C_SLOT_ROW(l, s) ((l) % FA_HALF_LANES)
/* A lane's elements 4 q .. 4 q + 3 are neighbouring columns of its row. */
#define FA_C_RUN 4

#define FA_C2A_REGS 1
/* The instructions (tests/mma_model.c's names) run on swapped operands. */
#define FA_SWAPPED 1

#ifndef FA_HOST_MODEL
FA_DECLARE_FRAGMENTS();
#endif

#if !defined(FA_HOST_MODEL) && !defined(FA_MMA_EMULATE)

#pragma OPENCL EXTENSION cl_khr_fp16 : enable

#define FA_NATIVE_MMA 1
FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b, fa_frag_ctx ctx) {
    (void)ctx;
    const uint2 ta = vload2(0, b->w), tb = vload2(0, a->w);
#if defined(FA_MMA_AMD_MFMA16)
    float4 acc = vload4(0, c->x);
#if defined(DTYPE_F16)
    acc = __builtin_amdgcn_mfma_f32_16x16x16f16(as_half4(ta), as_half4(tb), acc, 0, 0, 0);
#else
    acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(as_short4(ta), as_short4(tb), acc, 0, 0, 0);
#endif
    vstore4(acc, 0, c->x);
#else
    float16 acc = vload16(0, c->x);
#if defined(DTYPE_F16)
    acc = __builtin_amdgcn_mfma_f32_32x32x8f16(as_half4(ta), as_half4(tb), acc, 0, 0, 0);
#else
    acc = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(as_short4(ta), as_short4(tb), acc, 0, 0, 0);
#endif
    vstore16(acc, 0, c->x);
#endif
}

/* ds_bpermute reads the value of the lane whose byte address it is given,
 * across the whole wavefront. */
#define FA_NATIVE_SHFL 1
FA_FN void fa_shfl_xor(float *v, int n, int mask, fa_frag_ctx ctx) {
    const int from = (ctx.lane ^ mask) << 2;
    for (int i = 0; i < n; i++) v[i] = as_float(__builtin_amdgcn_ds_bpermute(from, as_int(v[i])));
}

#endif
