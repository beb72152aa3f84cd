/* The fragment layer of the matrix-core kernels (fwd_mma.hip, bwd_mma.hip):
 * the only place they meet a vendor's matrix instruction. A program is
 *   [hip_nvidia_prelude.h] common.h mma_<layer>.h mma_frag.h mma_tiles.h <kernel>.hip
 * with one layer, chosen by the host (backends/hip/hip_attention.c) from
 * the plan and the target:
 *   FA_MMA_NVIDIA  mma.sync m16n8k16, 32 lanes            mma_nvidia.h
 *   FA_MMA_MFMA32  v_mfma_f32_32x32x8 (f16, bf16_1k), 64  mma_cdna.h
 *   FA_MMA_MFMA16  v_mfma_f32_16x16x16 (f16, bf16_1k), 64 mma_cdna.h
 *   FA_MMA_WMMA    v_wmma_f32_16x16x16 (f16, bf16) w32    mma_rdna3.h
 * This is the twin of the OpenCL kernels' layer (kernels_cl/mma_frag.h),
 * with HIP's types and built-ins.
 *
 * Vocabulary. A wavefront of FA_SG lanes runs one instruction: C (FA_M x
 * FA_N, fp32) += A (FA_M x FA_K) B (FA_K x FA_N), A and B 16-bit (the
 * storage dtype, DTYPE_F16 or DTYPE_BF16). Each lane holds fragments:
 *   fa_a  FA_A_ELEMS 16-bit elements, two a word (element i: low half of
 *         word i / 2 when i is even): A[FA_A_ROW(l, i)][FA_A_COL(l, i)]
 *   fa_b  FA_B_ELEMS likewise: B[FA_B_K(l, i)][FA_B_N(l, i)]
 *   fa_c  FA_C_ELEMS floats: element e is C[FA_C_ROW(l, e)][FA_C_COL(l, e)]
 *
 * Orientation. A kernel's score tile pairs the rows its wavefront owns
 * (queries forward, keys in the dK/dV kernel) with the other side's (keys,
 * queries). FA_OWN_N says along which side of C the own rows run: 0, along
 * M (S = Q K^T forward: NVIDIA), 1, along N (S^T = K Q^T: the AMD layers,
 * whose accumulators then hold a whole own row in one lane or in lanes
 * l, l ^ 16, l ^ 32, so that a row's maximum takes one or two exchanges and
 * the probabilities are already the next product's operand). Products are
 * written once on that: the score product own x other over head_dim, and
 * the accumulating product acc[own][dim] += X[own][other] Z[other][dim],
 * whose X operand (P, dS) comes straight from the score fragments
 * (fa_x_to_p: element i of the k-step ks operand is element FA_X2P_ELEM of
 * score fragment FA_X2P_FRAG held by lane FA_X2P_LANE) and whose Z comes
 * from a local tile.
 *
 * Own rows: a lane holds FA_OWN_SLOTS distinct own rows of a C fragment;
 * element e is on slot FA_OWN_SLOT(e), slot s is row FA_OWN_IDX(l, s). The
 * lanes sharing a row hold it in the same slot, and they are exactly the
 * lanes l ^ x for the xor-combinations x of FA_RED_MASK(0 .. FA_RED_STEPS
 * - 1): a row's maximum or sum is a butterfly of FA_RED_STEPS exchanges.
 *
 * Loads from local tiles (16-bit, row stride ld a multiple of 8, origins
 * multiples of the shape):
 *   fa_load_a(&a, t, ld, r0, k0, lane)    A[m][k] = t[(r0 + m) ld + k0 + k]
 *   fa_load_a_t(&a, t, ld, m0, k0, lane)  A[m][k] = t[(k0 + k) ld + m0 + m]
 *   fa_load_b_nk(&b, t, ld, n0, k0, lane) B[k][n] = t[(n0 + n) ld + k0 + k]
 *   fa_load_b_kn(&b, t, ld, k0, n0, lane) B[k][n] = t[(k0 + k) ld + n0 + n]
 *   fa_mma(&c, &a, &b)                    c += a b, fp32 accumulation
 * and, where a layer loads two B fragments in one instruction
 * (FA_NATIVE_B2), fa_load_b_nk2 and fa_load_b_kn2: b[0] at n0, b[1] at
 * n0 + FA_N (FA_B_LOAD, below). Asynchronous copies: fa_copy16 (16 bytes),
 * fa_copy4 (4 bytes), fa_copy_commit, fa_copy_wait.
 *
 * The index macros of every layer are plain C (FA_HOST_MODEL selects them
 * alone): tests/test_mma_layouts.c feeds them through a model of each
 * instruction's documented lane layout (tests/mma_model.c) and checks that
 * the products, the operand conversion and the reductions reproduce a
 * plain matrix product, for every layer and dtype the planner plans. */

/* Derived geometry, in own / other terms. */
#define FA_OWN_T (FA_OWN_N ? FA_N : FA_M)   /* own rows per fragment */
#define FA_OTHER_T (FA_OWN_N ? FA_M : FA_N) /* other rows per score fragment */
#define FA_DIM_T FA_OTHER_T                 /* head dimensions per acc fragment */
#define FA_OWN_OF(l, e) (FA_OWN_N ? FA_C_COL(l, e) : FA_C_ROW(l, e))
#define FA_OTHER_OF(l, e) (FA_OWN_N ? FA_C_ROW(l, e) : FA_C_COL(l, e))
#define FA_P_ELEMS (FA_OWN_N ? FA_B_ELEMS : FA_A_ELEMS)
/* Elements in a row of a lane's C fragment whose other index runs on by
 * one from an aligned start: forward (others are keys) one Philox call
 * serves a run. */
#define FA_OTHER_RUN (FA_OWN_N ? FA_C_RUN_M : FA_C_RUN_N)

#ifndef FA_HOST_MODEL

#if !defined(DTYPE_F16) && !defined(DTYPE_BF16)
#error "the matrix-core kernels take DTYPE_F16 or DTYPE_BF16"
#endif

/* 16-bit patterns of the storage dtype from and to fp32 (nearest even). */
FA_FN float fa_h2f(fa_ushort h) {
#if defined(DTYPE_F16)
    return fa_half_to_float(h);
#else
    return __uint_as_float((fa_uint)h << 16);
#endif
}
FA_FN fa_ushort fa_f2h(float f) {
#if defined(DTYPE_F16)
    return fa_float_to_half(f);
#else
    return fa_bf16_round(f);
#endif
}

#ifndef FA_NATIVE_PACK
FA_FN fa_uint fa_pack2(float lo, float hi) { return (fa_uint)fa_f2h(lo) | (fa_uint)fa_f2h(hi) << 16; }
#endif

FA_FN fa_ushort fa_half_of(fa_uint w, int i) { return (fa_ushort)(i & 1 ? w >> 16 : w & 0xffffu); }

/* exp2, log2 and max without the device library: on AMD the compiler's
 * built-ins (one instruction each; gfx1100 is compiled here without its
 * device library, whose calls would cost scratch memory). */
#ifdef FA_HIP_ON_CUDA
#define fa_fmax fmaxf
FA_FN float fa_log2(float x) { return log2f(x); }
#else
#define fa_fmax __builtin_fmaxf
FA_FN float fa_log2(float x) { return __builtin_log2f(x); }
#endif
#ifndef FA_NATIVE_EXP2
FA_FN float fa_exp2(float x) { return __builtin_exp2f(x); }
#endif

#ifndef FA_NATIVE_LOADS
/* The loads written on the index functions: runs of FA_A_KRUN (FA_B_KRUN)
 * elements at consecutive k are one vector from a [row][k] tile (their
 * first element's address is a multiple of the run: rows are multiples of
 * 8 elements long, origins multiples of the shape), single elements from a
 * [k][row] one. */
struct alignas(8) fa_u32x2 {
    fa_uint x, y;
};
FA_FN void fa_lds_run(fa_uint *w, const fa_ushort *p, const int halves) {
    if (halves == 2) {
        w[0] = *(const fa_uint *)p;
    } else if (halves == 4) {
        const fa_u32x2 v = *(const fa_u32x2 *)p;
        w[0] = v.x;
        w[1] = v.y;
    } else {
        for (int i = 0; i < halves; i += 8) {
            const fa_u32x4 v = *(const fa_u32x4 *)(p + i);
            w[i / 2] = v.x;
            w[i / 2 + 1] = v.y;
            w[i / 2 + 2] = v.z;
            w[i / 2 + 3] = v.w;
        }
    }
}

FA_FN void fa_load_a(fa_a *a, const fa_ushort *tile, int ld, int r0, int k0, int lane) {
    fa_uint w[FA_A_ELEMS / 2];
#pragma unroll
    for (int i = 0; i < FA_A_ELEMS; i += FA_A_KRUN)
        fa_lds_run(w + i / 2, tile + (r0 + FA_A_ROW(lane, i)) * ld + k0 + FA_A_COL(lane, i), FA_A_KRUN);
#pragma unroll
    for (int i = 0; i < FA_A_ELEMS / 2; i++) a->w[i] = w[i];
}

FA_FN void fa_load_b_nk(fa_b *b, const fa_ushort *tile, int ld, int n0, int k0, int lane) {
    fa_uint w[FA_B_ELEMS / 2];
#pragma unroll
    for (int i = 0; i < FA_B_ELEMS; i += FA_B_KRUN)
        fa_lds_run(w + i / 2, tile + (n0 + FA_B_N(lane, i)) * ld + k0 + FA_B_K(lane, i), FA_B_KRUN);
#pragma unroll
    for (int i = 0; i < FA_B_ELEMS / 2; i++) b->w[i] = w[i];
}

FA_FN void fa_load_a_t(fa_a *a, const fa_ushort *tile, int ld, int m0, int k0, int lane) {
#pragma unroll
    for (int i = 0; i < FA_A_ELEMS / 2; i++)
        a->w[i] = (fa_uint)tile[(k0 + FA_A_COL(lane, 2 * i)) * ld + m0 + FA_A_ROW(lane, 2 * i)] |
                  (fa_uint)tile[(k0 + FA_A_COL(lane, 2 * i + 1)) * ld + m0 + FA_A_ROW(lane, 2 * i + 1)] << 16;
}

FA_FN void fa_load_b_kn(fa_b *b, const fa_ushort *tile, int ld, int k0, int n0, int lane) {
#pragma unroll
    for (int i = 0; i < FA_B_ELEMS / 2; i++)
        b->w[i] = (fa_uint)tile[(k0 + FA_B_K(lane, 2 * i)) * ld + n0 + FA_B_N(lane, 2 * i)] |
                  (fa_uint)tile[(k0 + FA_B_K(lane, 2 * i + 1)) * ld + n0 + FA_B_N(lane, 2 * i + 1)] << 16;
}
#endif

/* The operand types of the two products, by orientation: the own operand
 * and the other operand of the score product, the X (P, dS) and Z
 * operands of the accumulating product. */
#if FA_OWN_N
typedef fa_b fa_own_op;
typedef fa_a fa_other_op;
typedef fa_b fa_p_op;
typedef fa_a fa_z_op;
#else
typedef fa_a fa_own_op;
typedef fa_b fa_other_op;
typedef fa_a fa_p_op;
typedef fa_b fa_z_op;
#endif

/* Own rows r0 .. r0 + FA_OWN_T - 1 of a [row][dim] tile, dimensions k0 ..
 * k0 + FA_K - 1. */
FA_FN void fa_load_own(fa_own_op *o, const fa_ushort *tile, int ld, int r0, int k0, int lane) {
#if FA_OWN_N
    fa_load_b_nk(o, tile, ld, r0, k0, lane);
#else
    fa_load_a(o, tile, ld, r0, k0, lane);
#endif
}

/* Other rows o0 .. o0 + FA_OTHER_T - 1 of a [row][dim] tile. */
FA_FN void fa_load_other(fa_other_op *o, const fa_ushort *tile, int ld, int o0, int k0, int lane) {
#if FA_OWN_N
    fa_load_a(o, tile, ld, o0, k0, lane);
#else
    fa_load_b_nk(o, tile, ld, o0, k0, lane);
#endif
}

/* Z of the accumulating product: others k0 .. k0 + FA_K - 1 (rows of a
 * [other][dim] tile), dimensions d0 .. d0 + FA_DIM_T - 1. */
FA_FN void fa_load_z(fa_z_op *z, const fa_ushort *tile, int ld, int k0, int d0, int lane) {
#if FA_OWN_N
    fa_load_a_t(z, tile, ld, d0, k0, lane);
#else
    fa_load_b_kn(z, tile, ld, k0, d0, lane);
#endif
}

/* Loads of several fragments at once: FA_B_LOAD B fragments side by side
 * along n (b[0] at n0, b[1] at n0 + FA_N), two where the layer loads a pair
 * in one instruction (FA_NATIVE_B2: fa_load_b_nk2, fa_load_b_kn2), else
 * one; FA_OP_LOAD other or Z operands likewise, where those are B
 * operands. A kernel steps its loops over fragments by these counts. */
#ifdef FA_NATIVE_B2
#define FA_B_LOAD 2
#else
#define FA_B_LOAD 1
#endif
#define FA_OP_LOAD (FA_OWN_N ? 1 : FA_B_LOAD)

FA_FN void fa_load_b_kn_n(fa_b *b, const fa_ushort *tile, int ld, int k0, int n0, int lane) {
#if FA_B_LOAD == 2
    fa_load_b_kn2(b, tile, ld, k0, n0, lane);
#else
    fa_load_b_kn(b, tile, ld, k0, n0, lane);
#endif
}

/* FA_OP_LOAD other operands from other row o0 on (o[i] at o0 + i
 * FA_OTHER_T), FA_OP_LOAD Z operands from dimension d0 on. */
FA_FN void fa_load_other_n(fa_other_op *o, const fa_ushort *tile, int ld, int o0, int k0, int lane) {
#if FA_OP_LOAD == 2
    fa_load_b_nk2(o, tile, ld, o0, k0, lane);
#else
    fa_load_other(o, tile, ld, o0, k0, lane);
#endif
}

FA_FN void fa_load_z_n(fa_z_op *z, const fa_ushort *tile, int ld, int k0, int d0, int lane) {
#if FA_OP_LOAD == 2
    fa_load_b_kn2(z, tile, ld, k0, d0, lane);
#else
    fa_load_z(z, tile, ld, k0, d0, lane);
#endif
}

/* Score fragment += own x other^T over one k-step. */
FA_FN void fa_score_mma(fa_c *c, const fa_own_op *own, const fa_other_op *other) {
#if FA_OWN_N
    fa_mma(c, other, own);
#else
    fa_mma(c, own, other);
#endif
}

/* Acc fragment += X Z over one k-step. */
FA_FN void fa_acc_mma(fa_c *c, const fa_p_op *p, const fa_z_op *z) {
#if FA_OWN_N
    fa_mma(c, z, p);
#else
    fa_mma(c, p, z);
#endif
}

#ifndef FA_NATIVE_X2P
/* The X operand of k-step ks from the score fragments x[] of one strip,
 * rounded to the storage dtype; the layers whose operand lies in the
 * lane's own registers (FA_X2P_LANE(l, ks, i) == l). */
FA_FN void fa_x_to_p(fa_p_op *p, const fa_c *x, int ks, int lane) {
    (void)lane;
#pragma unroll
    for (int w = 0; w < FA_P_ELEMS / 2; w++)
        p->w[w] = fa_pack2(x[FA_X2P_FRAG(ks, 2 * w)].x[FA_X2P_ELEM(ks, 2 * w)],
                           x[FA_X2P_FRAG(ks, 2 * w + 1)].x[FA_X2P_ELEM(ks, 2 * w + 1)]);
}
#endif

/* The maxima and sums of a lane's FA_OWN_SLOTS rows over the lanes sharing
 * each row. */
FA_FN void fa_rows_max(float *v) {
#pragma unroll
    for (int step = 0; step < FA_RED_STEPS; step++)
#pragma unroll
        for (int s = 0; s < FA_OWN_SLOTS; s++) v[s] = fa_fmax(v[s], __shfl_xor(v[s], FA_RED_MASK(step), FA_SG));
}

FA_FN void fa_rows_sum(float *v) {
#pragma unroll
    for (int step = 0; step < FA_RED_STEPS; step++)
#pragma unroll
        for (int s = 0; s < FA_OWN_SLOTS; s++) v[s] += __shfl_xor(v[s], FA_RED_MASK(step), FA_SG);
}

/* Whether lane is the first of the lanes sharing its rows (it writes the
 * rows' single values, L for one). */
#define FA_RED_BIT_(i) (FA_RED_STEPS > (i) ? FA_RED_MASK(i) : 0)
#define FA_RED_ALL (FA_RED_BIT_(0) | FA_RED_BIT_(1) | FA_RED_BIT_(2) | FA_RED_BIT_(3) | FA_RED_BIT_(4))
FA_FN bool fa_row_leader(int lane) { return (lane & FA_RED_ALL) == 0; }

#ifndef FA_NATIVE_COPY
/* 16 bytes global -> local through registers (valid 0: zeros). The
 * commit and wait of the asynchronous copies have nothing to do: the
 * caller's barrier publishes the stores. */
FA_FN void fa_copy16(fa_ushort *dst, const fa_ushort *src, int valid) {
    fa_u32x4 v;
    v.x = v.y = v.z = v.w = 0u;
    if (valid) v = *(const fa_u32x4 *)src;
    *(fa_u32x4 *)dst = v;
}
FA_FN void fa_copy_commit(void) {}
#define fa_copy_wait(n) ((void)0)
/* 4 bytes likewise (valid 0: zero). */
FA_FN void fa_copy4(float *dst, const float *src, int valid) { *dst = valid ? *src : 0.0f; }
#endif

#ifndef FA_NATIVE_ATOMIC
/* Additions to dQ's fp32 accumulator, two neighbouring floats or one. It is
 * device memory from hipMalloc (coarse-grained), where AMD's floating-point
 * atomic instructions apply; atomicAdd would be a compare-and-swap loop on
 * gfx90a. */
FA_FN void fa_atomic_add(float *p, float v) { (void)unsafeAtomicAdd(p, v); }
FA_FN void fa_atomic_add2(float *p, float a, float b) {
    fa_atomic_add(p, a);
    fa_atomic_add(p + 1, b);
}
#endif

#endif /* FA_HOST_MODEL */
