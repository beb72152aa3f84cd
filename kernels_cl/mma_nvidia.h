/* NVIDIA tensor cores (sm_80 and later): mma.sync.aligned.m16n8k16.row.col
 * with fp32 accumulators, as PTX in OpenCL C (NVIDIA's OpenCL compiler
 * takes inline PTX; 16-bit values travel as 32-bit integers). See
 * mma_frag.h for the contract.
 *
 * Lane l = 4 g + t (g = l / 4, t = l % 4), per the PTX ISA's fragment
 * figures for m16n8k16 with .f16/.bf16:
 *   A (16 x 16, 4 words)  word w holds row g + 8 (w % 2), columns
 *                         2 t + 8 (w / 2) and the next one
 *   B (16 x 8, 2 words)   word w holds rows (k) 2 t + 8 w and the next one,
 *                         column (n) g
 *   C (16 x 8, 4 floats)  element e is row g + 8 (e / 2), column 2 t + e % 2
 * The four lanes of a group g share rows g and g + 8 (xor 1, 2). Two
 * n-tiles of C side by side are, element for element, the A fragment of the
 * 16 columns they cover: P and dS feed the next product from registers. */

#define FA_SG 32
#define FA_M 16
#define FA_N 8
#define FA_K 16
#define FA_A_WORDS 4
#define FA_B_WORDS 2
#define FA_C_ELEMS 4
#define FA_C_ROWS 2

#define FA_A_ROW(l, i) ((l) / 4 + 8 * ((i) / 2 % 2))
#define FA_A_COL(l, i) (2 * ((l) % 4) + (i) % 2 + 8 * ((i) / 4))
#define FA_B_K(l, i) (2 * ((l) % 4) + (i) % 2 + 8 * ((i) / 2))
#define FA_B_N(l, i) ((l) / 4)
#define FA_C_ROW(l, e) ((l) / 4 + 8 * ((e) / 2))
#define FA_C_COL(l, e) (2 * ((l) % 4) + (e) % 2)
#define FA_C_SLOT(e) ((e) / 2)
#define FA_C_SLOT_ROW(l, s) ((l) / 4 + 8 * (s))
/* Elements 2 i and 2 i + 1 are neighbouring columns of one row, the first
 * even: one Philox call (four columns) serves both. */
#define FA_C_RUN 2

#define FA_RED_STEPS 2
#define FA_RED_MASK(i) (1 << (i))

#define FA_C2A_REGS 1
#define FA_C2A_TILE(ks, i) (2 * (ks) + (i) / 4)
#define FA_C2A_ELEM(ks, i) ((i) % 4)

/* The instruction as tests/mma_model.c names it, operands not swapped. */
#define FA_INSTR_F16 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define FA_INSTR_BF16 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define FA_SWAPPED 0

#ifndef FA_HOST_MODEL
FA_DECLARE_FRAGMENTS();
#endif

#if !defined(FA_HOST_MODEL) && !defined(FA_MMA_EMULATE)

/* The shared-memory window address of a local element (NVIDIA's OpenCL:
 * the low 32 bits of its generic address). Local tiles must be 16-byte
 * aligned: ldmatrix and cp.async fault on anything less. */
FA_FN uint fa_shared_addr(__local const void *p) { return (uint)(size_t)p; }

/* The window address of element (r, c) of a local tile of row stride ld,
 * the offset in 32-bit unsigned arithmetic. As a pointer sum (tile +
 * index: 64-bit, the index sign-extended) NVIDIA's compiler formed every
 * fragment's address anew, two integer instructions an ldmatrix;
 * unsigned, the constant part of (r, c) folds into the instruction's
 * offset. On an H200 (bench/results/h200.md, 2026-11-29) this took
 * the forward from 246 to 162 registers at head_dim 128 and the backward
 * from 220 to 163 at 64: forward +8-12%, backward +11% at 64. */
/* A row stride of FA_LD_SW(rows) (not positive) names a tile laid out for
 * the warpgroup products (bwd_mma.cl's FA_BWD_WGMMA): rows of 64 elements
 * (128 bytes), the 16-byte chunk c of row r at chunk c ^ (r & 7), as the
 * 128-byte swizzle reads them, and columns from 64 on (head_dim 128) in a
 * second block of the tile's rows. ldmatrix's row addresses (c a multiple
 * of 8) find the same elements there. */
#define FA_LD_SW(rows) (-(rows))
FA_FN uint fa_tile_addr(__local const ushort *tile, int r, int ld, int c) {
    if (ld <= 0)
        return fa_shared_addr(tile) + (HEAD_DIM > 64 ? ((uint)c >> 6) * (uint)(-ld) * 128u : 0u) + (uint)r * 128u +
               ((((uint)c >> 3) ^ (uint)r) & 7u) * 16u + ((uint)c & 7u) * 2u;
    return fa_shared_addr(tile) + 2u * ((uint)r * (uint)ld + (uint)c);
}

#define FA_NATIVE_LOADS 1
FA_FN void fa_load_a(fa_a *a, __local const ushort *tile, int ld, int r0, int k0, fa_frag_ctx ctx) {
    const int l = ctx.lane, bi = l / 8;
    const uint addr = fa_tile_addr(tile, r0 + (bi % 2) * 8 + l % 8, ld, k0 + (bi / 2) * 8);
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(a->w[0]), "=r"(a->w[1]), "=r"(a->w[2]), "=r"(a->w[3])
                         : "r"(addr));
}

FA_FN void fa_load_b_nk(fa_b *b, __local const ushort *tile, int ld, int n0, int k0, fa_frag_ctx ctx) {
    const int l = ctx.lane % 16;
    const uint addr = fa_tile_addr(tile, n0 + l % 8, ld, k0 + (l / 8) * 8);
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                         : "=r"(b->w[0]), "=r"(b->w[1])
                         : "r"(addr));
}

FA_FN void fa_load_b_kn(fa_b *b, __local const ushort *tile, int ld, int k0, int n0, fa_frag_ctx ctx) {
    const int l = ctx.lane % 16;
    const uint addr = fa_tile_addr(tile, k0 + l, ld, n0);
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                         : "=r"(b->w[0]), "=r"(b->w[1])
                         : "r"(addr));
}

/* ldmatrix.x4: lanes 8 m .. 8 m + 7 address the rows of matrix m, which
 * lands in word m; matrices 0, 1 are n-tile n0 (k halves), 2, 3 n-tile
 * n0 + 8. */
#define FA_NATIVE_LOADS2 1
FA_FN void fa_load_b2_nk(fa_b *b0, fa_b *b1, __local const ushort *tile, int ld, int n0, int k0, fa_frag_ctx ctx) {
    const int l = ctx.lane, m = l / 8;
    const uint addr = fa_tile_addr(tile, n0 + (m / 2) * 8 + l % 8, ld, k0 + (m % 2) * 8);
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(b0->w[0]), "=r"(b0->w[1]), "=r"(b1->w[0]), "=r"(b1->w[1])
                         : "r"(addr));
}

FA_FN void fa_load_b2_kn(fa_b *b0, fa_b *b1, __local const ushort *tile, int ld, int k0, int n0, fa_frag_ctx ctx) {
    const int l = ctx.lane, m = l / 8;
    const uint addr = fa_tile_addr(tile, k0 + (m % 2) * 8 + l % 8, ld, n0 + (m / 2) * 8);
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(b0->w[0]), "=r"(b0->w[1]), "=r"(b1->w[0]), "=r"(b1->w[1])
                         : "r"(addr));
}

#define FA_NATIVE_MMA 1
FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b, fa_frag_ctx ctx) {
    (void)ctx;
#if defined(DTYPE_F16)
    __asm__ __volatile__("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                         "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                         : "+f"(c->x[0]), "+f"(c->x[1]), "+f"(c->x[2]), "+f"(c->x[3])
                         : "r"(a->w[0]), "r"(a->w[1]), "r"(a->w[2]), "r"(a->w[3]), "r"(b->w[0]), "r"(b->w[1]));
#else
    __asm__ __volatile__("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                         "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                         : "+f"(c->x[0]), "+f"(c->x[1]), "+f"(c->x[2]), "+f"(c->x[3])
                         : "r"(a->w[0]), "r"(a->w[1]), "r"(a->w[2]), "r"(a->w[3]), "r"(b->w[0]), "r"(b->w[1]));
#endif
}

#define FA_NATIVE_SHFL 1
FA_FN void fa_shfl_xor(float *v, int n, int mask, fa_frag_ctx ctx) {
    (void)ctx;
    FA_MMA_UNROLL for (int i = 0; i < n; i++) {
        uint r;
        __asm__ __volatile__("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                             : "=r"(r)
                             : "r"(as_uint(v[i])), "r"(mask));
        v[i] = as_float(r);
    }
}

/* Every operation above is warp-synchronous: a branch that is the same
 * for the 32 lanes of a warp may skip it. */
#define FA_SG_UNIFORM_OPS 1

/* One MUFU instruction: OpenCL's exp2 adds range fixups for subnormal
 * results, which the probabilities do not need. */
#define FA_NATIVE_EXP2 1
FA_FN float fa_exp2(float x) {
    float y;
    __asm__("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Two fp32 values as one word of 16-bit pairs (lo in the low half),
 * rounded to nearest even. */
#define FA_NATIVE_PACK 1
FA_FN uint fa_pack2(float lo, float hi) {
    uint r;
#if defined(DTYPE_F16)
    __asm__("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    __asm__("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

/* 16 bytes global -> local without a register stop; valid 0 writes zeros
 * and reads nothing. */
#define FA_NATIVE_COPY 1
FA_FN void fa_copy16(__local ushort *dst, __global const ushort *src, int valid) {
    __asm__ __volatile__("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                         :
                         : "r"(fa_shared_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
                         : "memory");
}
FA_FN void fa_copy_wait(void) {
    __asm__ __volatile__("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}

#endif
