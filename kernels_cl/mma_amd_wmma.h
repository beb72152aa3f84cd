/* AMD RDNA3 (gfx11): v_wmma_f32_16x16x16_f16 / _bf16 on 32-lane
 * wavefronts (the _w32 built-ins), fp32 accumulators. See mma_frag.h for
 * the contract; kernels_hip/mma_rdna3.h is the HIP twin.
 *
 * The instruction's lane layout (AMD's RDNA3 ISA guide, section 7.9),
 * D = A' B':
 *   A'[i][k]: lanes i and i + 16 (both halves hold the whole matrix),
 *             element k;
 *   B'[k][j]: lanes j and j + 16, element k;
 *   D[i][j]:  lane j + 16 (i % 2), element i / 2.
 * This layer runs it on swapped operands (A' = B^T, B' = A^T, C = D^T):
 * a lane holds half of one row of C (lane l % 16, columns 2 e + l / 16),
 * shared with lane l ^ 16. The next product's A operand wants the whole
 * row in both lanes: one exchange with that lane per k-step (fa_c_to_a,
 * FA_C2A_LANE). */

#define FA_SG 32
#define FA_M 16
#define FA_N 16
#define FA_K 16
#define FA_A_WORDS 8
#define FA_B_WORDS 8
#define FA_C_ELEMS 8
#define FA_C_ROWS 1

#define FA_A_ROW(l, i) ((l) % 16)
#define FA_A_COL(l, i) (i)
#define FA_B_K(l, i) (i)
#define FA_B_N(l, i) ((l) % 16)
#define FA_C_ROW(l, e) ((l) % 16)
#define FA_C_COL(l, e) (2 * (e) + (l) / 16)
#define FA_C_SLOT(e) 0
#define FA_C_SLOT_ROW(l, s) ((l) % 16)
#define FA_C_RUN 1

#define FA_RED_STEPS 1
#define FA_RED_MASK(i) 16

/* A element i (column i of the k-step) is element i / 2 of n-tile ks,
 * held by the lane of the row's half i % 2. */
#define FA_C2A_REGS 1
#define FA_C2A_TILE(ks, i) (ks)
#define FA_C2A_ELEM(ks, i) ((i) / 2)
#define FA_C2A_LANE(l, ks, i) ((l) % 16 + 16 * ((i) % 2))

/* The instruction as tests/mma_model.c names it, run on swapped operands. */
#define FA_INSTR_F16 "v_wmma_f32_16x16x16_f16"
#define FA_INSTR_BF16 "v_wmma_f32_16x16x16_bf16"
#define FA_SWAPPED 1

#ifndef FA_HOST_MODEL
FA_DECLARE_FRAGMENTS();
#endif

#if !defined(FA_HOST_MODEL) && !defined(FA_MMA_EMULATE)

#pragma OPENCL EXTENSION cl_khr_fp16 : enable

#define FA_NATIVE_MMA 1
FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b, fa_frag_ctx ctx) {
    (void)ctx;
    const uint8 ta = vload8(0, b->w), tb = vload8(0, a->w);
    float8 acc = vload8(0, c->x);
#if defined(DTYPE_F16)
    acc = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(as_half16(ta), as_half16(tb), acc);
#else
    acc = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(as_short16(ta), as_short16(tb), acc);
#endif
    vstore8(acc, 0, c->x);
}

#define FA_NATIVE_SHFL 1
FA_FN void fa_shfl_xor(float *v, int n, int mask, fa_frag_ctx ctx) {
    const int from = (ctx.lane ^ mask) << 2;
    for (int i = 0; i < n; i++) v[i] = as_float(__builtin_amdgcn_ds_bpermute(from, as_int(v[i])));
}

/* Word w of the A fragment holds columns 2 w (half 0's element w) and
 * 2 w + 1 (half 1's): each lane packs its own elements in pairs, swaps
 * them with lane l ^ 16, and interleaves. */
#define FA_NATIVE_C2A 1
FA_FN uint fa_pack2(float lo, float hi); /* mma_generic.h */
FA_FN void fa_c_to_a(fa_a *a, const fa_c *c, int ks, fa_frag_ctx ctx) {
    const int upper = ctx.lane >= 16, from = (ctx.lane ^ 16) << 2;
    FA_MMA_UNROLL for (int u = 0; u < 4; u++) {
        const uint mine = fa_pack2(c[ks].x[2 * u], c[ks].x[2 * u + 1]);
        const uint theirs = (uint)__builtin_amdgcn_ds_bpermute(from, (int)mine);
        const uint h0 = upper ? theirs : mine, h1 = upper ? mine : theirs;
        a->w[2 * u] = (h0 & 0xffffu) | (h1 << 16);
        a->w[2 * u + 1] = (h0 >> 16) | (h1 & 0xffff0000u);
    }
}

#endif
