/* The fragment layer: the only place the matrix-unit kernels (fwd_mma.cl,
 * bwd_mma.cl) meet a vendor's matrix instruction. A program is built from
 *   common.h, mma_frag.h, mma_<layout>.h, mma_generic.h, <kernel>.cl
 * with one layout selected by the host (backends/opencl/cl_mma.c):
 *   FA_MMA_NVIDIA      mma.sync m16n8k16, 32 lanes              (mma_nvidia.h)
 *   FA_MMA_INTEL       DPAS 8x8x16, sub-groups of 8             (mma_intel.h)
 *   FA_MMA_AMD_MFMA    MFMA 32x32x8, 64 lanes                   (mma_amd_mfma.h)
 *   FA_MMA_AMD_MFMA16  MFMA 16x16x16, 64 lanes                  (mma_amd_mfma.h)
 *   FA_MMA_AMD_WMMA    WMMA 16x16x16, 32 lanes                  (mma_amd_wmma.h)
 * and FA_MMA_EMULATE for the same layout in plain OpenCL C 1.2 (every
 * work-item holds exactly the elements the instruction would give it; the
 * lanes exchange through local memory), which runs anywhere (PoCL in CI).
 *
 * Vocabulary. A sub-group is FA_SG consecutive work-items of the
 * (one-dimensional) work-group; its lanes are 0 .. FA_SG - 1. The layer's
 * operation computes C (FA_M x FA_N, fp32) += A (FA_M x FA_K) B (FA_K x
 * FA_N), A and B 16-bit (fp16 or bf16, as DTYPE_F16 / DTYPE_BF16 say). A
 * layer may run the instruction on swapped operands (C^T = B^T A^T), so
 * that a lane holds whole rows of C; FA_M x FA_N is then the transpose of
 * the instruction's shape. Each lane holds a fragment of each:
 *   fa_a  FA_A_WORDS 32-bit words, two 16-bit elements a word (element i is
 *         the low half of word i / 2 when i is even): element i of lane l
 *         is A[FA_A_ROW(l, i)][FA_A_COL(l, i)]
 *   fa_b  FA_B_WORDS words likewise: element i is B[FA_B_K(l, i)][FA_B_N(l, i)]
 *   fa_c  FA_C_ELEMS floats: element e is C[FA_C_ROW(l, e)][FA_C_COL(l, e)]
 * (an element of A or B may be held by several lanes: WMMA's two halves).
 * A lane's accumulator elements lie on FA_C_ROWS distinct rows, its row
 * slots: element e is on slot FA_C_SLOT(e), slot s is row FA_C_SLOT_ROW(l,
 * s). The lanes that share a row hold it in the same slot, and they are
 * exactly the lanes l ^ x for the xor-combinations x of the masks
 * FA_RED_MASK(0 .. FA_RED_STEPS - 1): a row's maximum or sum over a tile is
 * a butterfly of FA_RED_STEPS exchanges (none where a lane holds whole
 * rows). Elements e .. e + FA_C_RUN - 1 (e a multiple of FA_C_RUN, which
 * divides 4) are consecutive columns of one row from a multiple of
 * FA_C_RUN: forward they share one Philox call.
 *
 * Operations (a layout defines them natively or takes mma_generic.h's,
 * which are written on the index functions above):
 *   fa_load_a(&a, tile, ld, r0, k0, ctx)   A = tile rows r0.., columns k0..:
 *                                          element (m, k) at tile[(r0 + m) * ld + k0 + k]
 *   fa_load_b_nk(&b, tile, ld, n0, k0, ctx) B from a tile whose rows are n
 *                                          (K of Q K^T): (k, n) at tile[(n0 + n) * ld + k0 + k]
 *   fa_load_b_kn(&b, tile, ld, k0, n0, ctx) B from a tile whose rows are k
 *                                          (V of P V): (k, n) at tile[(k0 + k) * ld + n0 + n]
 *   fa_load_b2_nk(&b0, &b1, tile, ld, n0, k0, ctx)
 *   fa_load_b2_kn(&b0, &b1, tile, ld, k0, n0, ctx)
 *                                          the n-tiles n0 and n0 + FA_N at once
 *                                          (one ldmatrix.x4 on NVIDIA instead of two .x2)
 *   fa_mma(&c, &a, &b, ctx)                c += a b, fp32 accumulation
 *   fa_shfl_xor(v, n, mask, ctx)           v[i] = v[i] of lane ^ mask, i < n
 *   fa_exp2(x)                             2^x to the hardware's approximation
 *                                          (a few ulp; 0 for -inf, results below
 *                                          2^-126 may flush to 0)
 * Tiles are __local ushort (the 16-bit patterns) with ld a multiple of 8
 * and r0, k0, n0 multiples of the shape, so every row of a fragment starts
 * on a 16-byte boundary (ldmatrix needs it). Every operation is called by
 * all work-items of the work-group together, outside any branch that
 * depends on the work-item: emulated, each is a pair of work-group
 * barriers around an exchange in local memory. A layer whose operations
 * need only the lanes of one sub-group together (warp-synchronous
 * instructions) says so with FA_SG_UNIFORM_OPS 1: the kernels may then
 * leave out fragment work under a condition that is the same for every
 * lane of a sub-group.
 *
 * P V (and dV, dK, dQ backward) take an accumulator as the A operand. With
 * FA_C2A_REGS the layout turns the accumulators of a row strip (its
 * n-tiles c[0], c[1], ...) into the A fragment of k-step s in registers,
 * fa_c_to_a(&a, c, s, ctx): A element i of lane l is element
 * FA_C2A_ELEM(s, i) of n-tile FA_C2A_TILE(s, i), held by lane
 * FA_C2A_LANE(l, s, i) (lane l itself where the layout leaves that macro
 * undefined; otherwise the lanes exchange, as the instruction's operands
 * require: WMMA). Without FA_C2A_REGS the kernels write the accumulators
 * to a local tile (16-bit) and load A from it.
 *
 * The per-layout headers start with their index functions as plain macros
 * (valid C as well as OpenCL C: tests/test_mma_layouts.c feeds them through
 * the documented lane layouts of each instruction, tests/mma_model.c, with
 * FA_HOST_MODEL defined), then their device code under #ifndef
 * FA_HOST_MODEL. */

#ifndef FA_HOST_MODEL

#define FA_MMA_UNROLL_(text) _Pragma(#text)
/* Loops over fragments are unrolled whole on GPUs (FA_GPU), so that the
 * fragment arrays live in registers; a CPU compiler gains only compile time
 * from it. */
#ifdef FA_GPU
#define FA_MMA_UNROLL FA_MMA_UNROLL_(unroll)
#else
#define FA_MMA_UNROLL
#endif

#define FA_MMA_MAX(a, b) ((a) > (b) ? (a) : (b))

/* The fragment types, declared by each layout once it has set their sizes. */
#define FA_DECLARE_FRAGMENTS()                                                 \
    typedef struct fa_a {                                                      \
        uint w[FA_A_WORDS];                                                    \
    } fa_a;                                                                    \
    typedef struct fa_b {                                                      \
        uint w[FA_B_WORDS];                                                    \
    } fa_b;                                                                    \
    typedef struct fa_c {                                                      \
        float x[FA_C_ELEMS];                                                   \
    } fa_c

/* Where a work-item is in the layer's terms, and the local scratch an
 * emulated (or local-memory) operation exchanges through: FA_SCR_WORDS
 * words per sub-group, which the kernel declares (FA_FRAG_SCRATCH). */
typedef struct fa_frag_ctx {
    int lane, sg;
    __local uint *scratch; /* this sub-group's FA_SCR_WORDS words */
} fa_frag_ctx;

/* 16-bit patterns of the storage dtype, to and from fp32; rounding to
 * nearest even, as the stores of common.h. */
#if defined(DTYPE_F16)
FA_FN float fa_h2f(ushort h) { return vload_half(0, (const half *)&h); }
FA_FN ushort fa_f2h(float f) {
    ushort h;
    vstore_half_rte(f, 0, (half *)&h);
    return h;
}
#elif defined(DTYPE_BF16)
FA_FN float fa_h2f(ushort h) { return as_float((uint)h << 16); }
FA_FN ushort fa_f2h(float f) { return bf16_round(f); }
#else
#error "the matrix-unit kernels take DTYPE_F16 or DTYPE_BF16"
#endif

FA_FN ushort fa_word_half(uint w, int i) { return (ushort)(i & 1 ? w >> 16 : w & 0xffffu); }

#endif /* FA_HOST_MODEL */
