/* Shared by the matrix-core kernels (fwd_mma.hip, bwd_mma.hip) above the
 * fragment layer (mma_frag.h): tile geometry, copies of head_dim-wide
 * tiles between global and local memory, masks and dropout on score
 * fragments, and fragments into local tiles.
 *
 * Build options beyond common.h's: WARPS (wavefronts of a work-group; the
 * host passes TR and TC with (BR / TR) * (BC / TC) = WARPS * FA_SG) and
 * STRIPS (strips of FA_OWN_T own rows per wavefront). core/planner_hip_mma.c
 * budgets exactly the local memory the kernels declare.
 *
 * Tiles over head_dim are 16-bit, row-major, every row padded by one
 * 16-byte chunk (LD elements a row), so that the rows one fragment load
 * reads fall on different banks. */

#define FA_THREADS (WARPS * FA_SG)
#if FA_THREADS != WG_SIZE
#error "the work-group must be WARPS wavefronts: (BR / TR) * (BC / TC) = WARPS * FA_SG"
#endif
#if HEAD_DIM % FA_K != 0 || HEAD_DIM % FA_DIM_T != 0
#error "HEAD_DIM must be a multiple of the instruction's k and of its accumulator's head-dimension side"
#endif

/* Entry points of the matrix-core kernels: C names, the work-group size,
 * and one work-group per compute unit as the occupancy asked of the
 * register allocator (without it NVRTC held the dQ kernel to 168 registers
 * at 128 threads and spilled). */
#define FA_MMA_KERNEL(THREADS) extern "C" __global__ __launch_bounds__(THREADS, 1)

/* A kernel's local memory: one dynamic block of 16-bit elements, its size
 * passed at launch (core/planner_hip_mma.c's figure for the kernel). Static
 * tiles would stop at 48 KiB a block through the mapping on NVIDIA, where
 * the host opts the kernel in to the device's larger limit; on AMD the
 * whole LDS is there either way. */
#define FA_LOCAL_BLOCK(name) extern __shared__ __attribute__((aligned(16))) fa_ushort name[]

#define LD (HEAD_DIM + 8)
#define D_CHUNKS (HEAD_DIM / 8)
#define KT (HEAD_DIM / FA_K)     /* k-steps of a score product */
#define NF (HEAD_DIM / FA_DIM_T) /* accumulator fragments of a strip */

/* Rows [0, rows) of a head_dim-wide operand (row r at src + r * stride)
 * into a tile, shared out over nthreads work-items; rows from `valid` on
 * are zeros. The copies land by the caller's fa_copy_wait and barrier. */
FA_FN void fa_fetch_rows(fa_ushort *dst, const store_t *src, fa_long stride, int rows, int valid, int tid,
                         int nthreads) {
#ifdef FA_HIP_ON_CUDA
    asm volatile("" : "+r"(tid), "+l"(stride));
#endif
#pragma unroll 1
    for (int e = tid; e < rows * D_CHUNKS; e += nthreads) {
        const int r = e / D_CHUNKS, c = e - r * D_CHUNKS;
        const int ok = r < valid;
        fa_copy16(dst + r * LD + c * 8, src + (ok ? (fa_long)r * stride + c * 8 : 0), ok);
    }
}

/* The first `valid` of `rows` rows of a tile to global memory, 16 bytes a
 * store. */
FA_FN void fa_store_rows(store_t *dst, fa_long stride, const fa_ushort *src, int rows, int valid, int tid,
                         int nthreads) {
    const int n = fa_imin(rows, valid);
    for (int e = tid; e < n * D_CHUNKS; e += nthreads) {
        const int r = e / D_CHUNKS, c = e - r * D_CHUNKS;
        *(fa_u32x4 *)(dst + (fa_long)r * stride + c * 8) = *(const fa_u32x4 *)(src + r * LD + c * 8);
    }
}

/* An accumulator fragment (own rows own0.., head dimensions d0..) times
 * scale into a [own][dim] tile, rounded once; the runs of neighbouring
 * dimensions a lane holds go as 16-bit pairs. */
FA_FN void fa_put_acc(fa_ushort *tile, int ld, int own0, int d0, const fa_c *c, float scale, int lane) {
#if FA_OTHER_RUN >= 2
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e += 2)
        *(fa_uint *)(tile + (own0 + FA_OWN_OF(lane, e)) * ld + d0 + FA_OTHER_OF(lane, e)) =
            fa_pack2(c->x[e] * scale, c->x[e + 1] * scale);
#else
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e++)
        tile[(own0 + FA_OWN_OF(lane, e)) * ld + d0 + FA_OTHER_OF(lane, e)] = fa_f2h(c->x[e] * scale);
#endif
}

/* A score fragment (own rows own0.., other rows oth0..) transposed into an
 * [other][own] tile (dS as [query][key] from the key side). */
FA_FN void fa_put_score_t(fa_ushort *tile, int ld, int own0, int oth0, const fa_c *c, int lane) {
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e++)
        tile[(oth0 + FA_OTHER_OF(lane, e)) * ld + own0 + FA_OWN_OF(lane, e)] = fa_f2h(c->x[e]);
}

/* Query and key offsets of element e of a score fragment whose own rows
 * start at own0 and other rows at oth0: the own rows are queries unless
 * KEYS_OWN (the dK/dV kernel). Offsets from the tile's first query and
 * key (q0, k0), as fa_visible takes them. */
#define FA_ELEM_QUERY(KEYS_OWN, own0, oth0, lane, e) \
    ((KEYS_OWN) ? (oth0) + FA_OTHER_OF(lane, e) : (own0) + FA_OWN_OF(lane, e))
#define FA_ELEM_KEY(KEYS_OWN, own0, oth0, lane, e) \
    ((KEYS_OWN) ? (own0) + FA_OWN_OF(lane, e) : (oth0) + FA_OTHER_OF(lane, e))

/* A score fragment's dot products into logits in base 2 (common.h's
 * fa_logit2: scale log2(e) alone without score options). */
FA_FN void fa_frag_logits(fa_c *c, const fa_score &sc, int q0, int k0, int own0, int oth0, bool keys_own, int lane) {
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e++) {
        const int i = FA_ELEM_QUERY(keys_own, own0, oth0, lane, e), j = FA_ELEM_KEY(keys_own, own0, oth0, lane, e);
        float dcap;
        c->x[e] = fa_logit2(sc, c->x[e], q0, i, k0, j, &dcap);
    }
}

#ifdef FA_SCORE_OPTS
/* The backward's logits as the forward forms them, with the cap's
 * derivative of each element in g (1 without SOFTCAP). */
FA_FN void fa_frag_logits_grad(fa_c *c, fa_c *g, const fa_score &sc, int q0, int k0, int own0, int oth0,
                               bool keys_own, int lane) {
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e++) {
        const int i = FA_ELEM_QUERY(keys_own, own0, oth0, lane, e), j = FA_ELEM_KEY(keys_own, own0, oth0, lane, e);
        float dcap;
        c->x[e] = fa_logit2(sc, c->x[e], q0, i, k0, j, &dcap);
        g->x[e] = dcap;
    }
}
#endif

/* The backward's hooks where a score fragment S becomes P and dS (the
 * fa_score sc, the tile's q0 and k0 and the lane in scope): FA_LOGITS_GRAD
 * forms S's logits before the masks (declaring the derivatives g_),
 * FA_LOGIT2_OF is an element's logit in base 2 after it, FA_DS_CAP applies
 * element e's derivative to its dS. Without score options the logit is
 * formed in the exponent, as before. */
#ifdef FA_SCORE_OPTS
#define FA_LOGITS_GRAD(S, OWN0, OTH0, KEYS_OWN) \
    fa_c g_;                                     \
    fa_frag_logits_grad(&(S), &g_, sc, q0, k0, (OWN0), (OTH0), (KEYS_OWN), lane)
#define FA_LOGIT2_OF(x) (x)
#define FA_DS_CAP(ds, e) FA_CAP_GRAD(ds, g_.x[e])
#else
#define FA_LOGITS_GRAD(S, OWN0, OTH0, KEYS_OWN) ((void)0)
#define FA_LOGIT2_OF(x) ((x) * sc.scale_log2)
#define FA_DS_CAP(ds, e) (ds)
#endif

/* A score fragment's elements set to `hidden` where the masks hide them. */
FA_FN void fa_frag_mask(fa_c *c, const fa_mask &m, const fa_uchar *block_mask, int q0, int k0, int own0, int oth0,
                        bool keys_own, float hidden, int lane) {
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e++) {
        const int i = FA_ELEM_QUERY(keys_own, own0, oth0, lane, e), j = FA_ELEM_KEY(keys_own, own0, oth0, lane, e);
        if (!fa_visible(m, block_mask, q0, i, k0, j)) c->x[e] = hidden;
    }
}

/* The dropout decisions of a score fragment's elements (bit e set: kept),
 * the same Philox words as fa_dropout_mark (common.h): one call per four
 * keys of a query. Where keys are the other rows, a lane's runs of
 * FA_OTHER_RUN neighbouring keys (aligned) share one call. Positions are
 * unsigned: a padding row's may pass INT_MAX, and wraps harmlessly here. */
FA_FN fa_uint fa_frag_keep(const fa_dropout &dp, fa_uint bh, int q0, int k0, int own0, int oth0, bool keys_own,
                           int lane) {
    fa_uint keep = 0u;
    fa_u4 rnd;
    rnd.x = rnd.y = rnd.z = rnd.w = 0u;
#pragma unroll
    for (int e = 0; e < FA_C_ELEMS; e++) {
        const fa_uint q = dp.row0 + (fa_uint)q0 + (fa_uint)FA_ELEM_QUERY(keys_own, own0, oth0, lane, e);
        const fa_uint key = dp.col0 + (fa_uint)k0 + (fa_uint)FA_ELEM_KEY(keys_own, own0, oth0, lane, e);
        if (keys_own || e % FA_OTHER_RUN == 0) {
            fa_u4 ctr;
            ctr.x = key >> 2;
            ctr.y = q;
            ctr.z = bh;
            ctr.w = dp.offset_lo;
            rnd = fa_philox(ctr, dp.key0, dp.key1);
        }
        const fa_uint sel = key & 3u;
        const fa_uint w = sel == 0u ? rnd.x : sel == 1u ? rnd.y : sel == 2u ? rnd.z : rnd.w;
        if (w >= dp.threshold) keep |= 1u << e;
    }
    return keep;
}
