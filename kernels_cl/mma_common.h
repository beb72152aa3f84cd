/* Shared by the matrix-unit kernels (fwd_mma.cl, bwd_mma.cl), on top of the
 * fragment layer: tile geometry, copies of head_dim-wide tiles between
 * global and local memory, and masks and dropout on accumulator fragments.
 *
 * Build options beyond common.h's: WARPS (sub-groups per work-group; the
 * work-group is WARPS * FA_SG work-items, and the host passes TR and TC
 * with (BR / TR) * (BC / TC) equal to it), QREG (forward: Q's fragments
 * stay in registers and its tile shares local memory with K and V).
 *
 * Tiles over head_dim are 16-bit, row-major, HEAD_DIM padded with zeros to
 * D_PAD (a multiple of the instruction's k and n, so head_dims that are not
 * multiples of 16 run on the same fragments), and every row padded by one
 * 16-byte chunk (LDS) so that the rows a fragment load reads fall on
 * different banks. core/planner_cl_mma.c budgets the same sizes. */

#define FA_THREADS (WARPS * FA_SG)
#if FA_THREADS != WG_SIZE
#error "the work-group must be WARPS sub-groups: (BR / TR) * (BC / TC) = WARPS * FA_SG"
#endif

#define FA_DALIGN FA_MMA_MAX(FA_K, FA_N)
#define D_PAD ((HEAD_DIM + FA_DALIGN - 1) / FA_DALIGN * FA_DALIGN)
#define LDS (D_PAD + 8)
#define D_CHUNKS (D_PAD / 8)

/* fa_fetch_rows unrolls up to this many copies a work-item; not in the
 * backward with V in registers and dropout above head_dim 64, which
 * unrolled took NVIDIA's 255 registers and spilled 8 bytes at head_dim 128
 * (H200). */
#if defined(VREG) && defined(DROPOUT) && HEAD_DIM > 64
#define FA_FETCH_UNROLLED 0
#else
#define FA_FETCH_UNROLLED 4
#endif

/* Rows [0, rows) of a head_dim-wide operand (row r at src + r * stride)
 * into a tile; rows from `valid` on and dimensions past HEAD_DIM are
 * zero. The copies land by the caller's fa_copy_wait. */
FA_FN void fa_fetch_rows(__local ushort *dst, __global const ushort *src, long stride, int rows, int valid,
                         int lid) {
#if FA_THREADS % D_CHUNKS == 0
    /* A work-item copies the same 16-byte column of every rstep-th row:
     * its addresses move by constants, with no division a copy (the
     * general loop below spent about 20 integer instructions a copy on
     * NVIDIA, as many as the step's matrix products issue). */
    const int rstep = FA_THREADS / D_CHUNKS, c = lid % D_CHUNKS, r0 = lid / D_CHUNKS;
    const int col_ok = c * 8 < HEAD_DIM;
    const long src_step = (long)rstep * stride;
    __global const ushort *s = src + (long)r0 * stride + c * 8;
    __local ushort *d = dst + r0 * LDS + c * 8;
    if (rows % rstep == 0 && rows / rstep <= FA_FETCH_UNROLLED) {
        /* Few copies a work-item (every call's rows, BR or BC, are
         * constants here): unrolled, and a native copy of no bytes reads
         * nothing, so its address needs no select. On an H200 (NVIDIA's
         * OpenCL, 16k tokens) +7-9% on the forward at head_dim 64 and
         * +1-3% on the backward; the forward's eight copies at head_dim 128
         * took 167 -> 216 registers unrolled and ran 1-4% slower causal,
         * so they stay a loop (bench/results/h200.md, twelfth session). */
        FA_MMA_UNROLL for (int i = 0; i < rows / rstep; i++) {
            const int ok = col_ok && r0 + i * rstep < valid;
#ifdef FA_NATIVE_COPY
            fa_copy16(d + i * rstep * LDS, s, ok);
#else
            fa_copy16(d + i * rstep * LDS, ok ? s : src, ok);
#endif
            s += src_step;
        }
        return;
    }
    /* More copies stay a loop: unrolled, their addresses stay live. */
    FA_MMA_UNROLL_(unroll 1)
    for (int r = r0; r < rows; r += rstep) {
        const int ok = col_ok && r < valid;
        fa_copy16(d, ok ? s : src, ok);
        s += src_step;
        d += rstep * LDS;
    }
#else
    for (int e = lid; e < rows * D_CHUNKS; e += FA_THREADS) {
        const int r = e / D_CHUNKS, c = e - r * D_CHUNKS;
        const int ok = r < valid && c * 8 < HEAD_DIM;
        fa_copy16(dst + r * LDS + c * 8, src + (ok ? (long)r * stride + c * 8 : 0), ok);
    }
#endif
}

/* N-tiles a kernel's B load takes: two where the layer loads a pair at
 * once (NVIDIA's ldmatrix.x4, and its emulated form, which checks the
 * pairing's loops on any device), one elsewhere, where a pair only keeps a
 * second fragment live longer (RDNA3's WMMA forward spilled so). */
#if defined(FA_NATIVE_LOADS2) || defined(FA_MMA_NVIDIA)
#define FA_BP 2
#else
#define FA_BP 1
#endif

/* B of the n-tiles n0 and, where `two` (a constant of the unrolled loop)
 * and FA_BP is 2, n0 + FA_N into b[0] and b[1]: a pair in one load where
 * the layer has one, the odd last n-tile of a row alone. */
FA_FN void fa_load_bp_nk(fa_b *b, int two, __local const ushort *tile, int ld, int n0, int k0, fa_frag_ctx ctx) {
    if (FA_BP == 2 && two)
        fa_load_b2_nk(&b[0], &b[1], tile, ld, n0, k0, ctx);
    else
        fa_load_b_nk(&b[0], tile, ld, n0, k0, ctx);
}

FA_FN void fa_load_bp_kn(fa_b *b, int two, __local const ushort *tile, int ld, int k0, int n0, fa_frag_ctx ctx) {
    if (FA_BP == 2 && two)
        fa_load_b2_kn(&b[0], &b[1], tile, ld, k0, n0, ctx);
    else
        fa_load_b_kn(&b[0], tile, ld, k0, n0, ctx);
}

/* An A fragment straight from global memory: rows r0.. of an operand whose
 * row r starts at src + r * stride, columns k0..; zero in rows from `valid`
 * on and in columns from HEAD_DIM on. For fragments a kernel holds from
 * start to end, read once. */
FA_FN void fa_load_a_global(fa_a *a, __global const ushort *src, long stride, int r0, int k0, int valid,
                            fa_frag_ctx ctx) {
    FA_MMA_UNROLL for (int w = 0; w < FA_A_WORDS; w++) {
        uint word = 0u;
        FA_MMA_UNROLL for (int i = 0; i < 2; i++) {
            const int r = r0 + FA_A_ROW(ctx.lane, 2 * w + i), c = k0 + FA_A_COL(ctx.lane, 2 * w + i);
            if (r < valid && c < HEAD_DIM) word |= (uint)src[(long)r * stride + c] << (16 * i);
        }
        a->w[w] = word;
    }
}

/* A sub-group's A or B fragment from a packed copy in global memory
 * (bwd_mma.cl's KPACK), laid out as the lanes hold it: lane l's words at p
 * + l FA_A_WORDS (FA_B_WORDS). One 16- (8-) byte load a lane on NVIDIA,
 * whose packed fragments start on such boundaries. */
FA_FN void fa_load_a_packed(fa_a *a, __global const uint *p, fa_frag_ctx ctx) {
#if defined(FA_MMA_NVIDIA) && !defined(FA_MMA_EMULATE) && FA_A_WORDS == 4
    const uint4 v = *(__global const uint4 *)(p + 4 * ctx.lane);
    a->w[0] = v.x;
    a->w[1] = v.y;
    a->w[2] = v.z;
    a->w[3] = v.w;
#else
    FA_MMA_UNROLL for (int w = 0; w < FA_A_WORDS; w++) a->w[w] = p[ctx.lane * FA_A_WORDS + w];
#endif
}

FA_FN void fa_load_b_packed(fa_b *b, __global const uint *p, fa_frag_ctx ctx) {
#if defined(FA_MMA_NVIDIA) && !defined(FA_MMA_EMULATE) && FA_B_WORDS == 2
    const uint2 v = *(__global const uint2 *)(p + 2 * ctx.lane);
    b->w[0] = v.x;
    b->w[1] = v.y;
#else
    FA_MMA_UNROLL for (int w = 0; w < FA_B_WORDS; w++) b->w[w] = p[ctx.lane * FA_B_WORDS + w];
#endif
}

/* The first `valid` of `rows` rows of a tile (HEAD_DIM dimensions) to
 * global memory, 16 bytes a store. */
FA_FN void fa_store_rows(__global ushort *dst, long stride, __local const ushort *src, int rows, int valid,
                         int lid) {
    const int n = min(rows, valid);
    for (int e = lid; e < n * (HEAD_DIM / 8); e += FA_THREADS) {
        const int r = e / (HEAD_DIM / 8), c = e - r * (HEAD_DIM / 8);
        *(__global uint4 *)(dst + (long)r * stride + c * 8) = *(__local const uint4 *)(src + r * LDS + c * 8);
    }
}

/* One value rounded to the 16-bit storage type through the layer's
 * packing (one instruction on NVIDIA, where bf16's rounding in integer
 * operations raised the bf16 backward at head_dim 64 from 165 to 189
 * registers, past three work-groups a multiprocessor). */
FA_FN ushort fa_round16(float f) { return (ushort)(fa_pack2(f, 0.0f) & 0xffffu); }

/* An accumulator of the rows r0.. and columns c0.. of a tile, times
 * `scale`, as 16-bit values into a local tile (row stride ld), or into its
 * transpose (element (r, c) at tile[c * ld + r]). */
FA_FN void fa_put_c(__local ushort *tile, int ld, int r0, int c0, const fa_c *c, float scale, fa_frag_ctx ctx) {
#if FA_C_RUN % 2 == 0
    /* Elements e, e + 1 (e even) of a run are neighbouring columns of a
     * row, the first even (ld and c0 are too): one 32-bit store a pair, as
     * packed, where 16-bit ones took NVIDIA a store and a byte permute an
     * element. */
    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e += 2)
        *(__local uint *)(tile + (r0 + FA_C_ROW(ctx.lane, e)) * ld + c0 + FA_C_COL(ctx.lane, e)) =
            fa_pack2(c->x[e] * scale, c->x[e + 1] * scale);
#else
    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++)
        tile[(r0 + FA_C_ROW(ctx.lane, e)) * ld + c0 + FA_C_COL(ctx.lane, e)] = fa_round16(c->x[e] * scale);
#endif
}

FA_FN void fa_put_c_t(__local ushort *tile, int ld, int r0, int c0, const fa_c *c, fa_frag_ctx ctx) {
    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++)
        tile[(c0 + FA_C_COL(ctx.lane, e)) * ld + r0 + FA_C_ROW(ctx.lane, e)] = fa_round16(c->x[e]);
}

/* An accumulator's elements set to `hidden` where the masks hide them; its
 * element e is query q0 + qr + FA_C_ROW(lane, e) against key k0 + kc +
 * FA_C_COL(lane, e), or, transposed (backward), key k0 + kc + row against
 * query q0 + qr + column (tile origins and offsets apart, as fa_visible
 * takes them). */
FA_FN void fa_frag_mask(fa_c *c, const fa_mask *m, __global const uchar *block_mask, int q0, int qr, int k0, int kc,
                        int transposed, float hidden, fa_frag_ctx ctx) {
    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
        const int row = FA_C_ROW(ctx.lane, e), col = FA_C_COL(ctx.lane, e);
        const int r = qr + (transposed ? col : row), k = kc + (transposed ? row : col);
        if (!fa_visible(m, block_mask, q0, r, k0, k)) c->x[e] = hidden;
    }
}

/* The dropout decisions of an accumulator's elements (bit e set: kept),
 * element e standing for query row0 + FA_C_ROW(lane, e) and key col0 +
 * FA_C_COL(lane, e), or the reverse, transposed; the plan's dropout origin
 * (dp->row0, dp->col0) comes on top. Unsigned: a padding row's position
 * may pass INT_MAX, and wraps harmlessly here. The same Philox words as
 * fa_dropout_mark: one call per four keys of a row. */
FA_FN uint fa_frag_keep(const fa_dropout *dp, uint bh, uint row0, uint col0, int transposed, fa_frag_ctx ctx) {
    uint keep = 0u;
    uint4 rnd = (uint4)(0u);
    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
        const uint r = row0 + (uint)FA_C_ROW(ctx.lane, e), k = col0 + (uint)FA_C_COL(ctx.lane, e);
        const uint q = dp->row0 + (transposed ? k : r), key = dp->col0 + (transposed ? r : k);
        /* A run of elements (FA_C_RUN) shares its row and group of four
         * keys, untransposed. */
        if (transposed || e % FA_C_RUN == 0)
            rnd = fa_philox((uint4)(key >> 2, q, bh, dp->offset_lo), dp->key0, dp->key1);
        const uint w = (key & 3u) == 0u ? rnd.x : (key & 3u) == 1u ? rnd.y : (key & 3u) == 2u ? rnd.z : rnd.w;
        if (w >= dp->threshold) keep |= 1u << e;
    }
    return keep;
}

#ifdef FA_SCORE_OPTIONS
/* The score options' hook (common.h): an accumulator of products q.k
 * turned into base-2 logits; its element e is query q0 + qr + FA_C_ROW(e)
 * against key k0 + kc + FA_C_COL(e), or, transposed (backward), key k0 + kc
 * + row against query q0 + qr + column (tile origins and offsets apart, as
 * fa_frag_mask takes them). With SOFTCAP g receives each element's
 * cap_grad. */
FA_FN void fa_frag_logit2(fa_c *c, fa_c *g, const fa_score *sc, int q0, int qr, int k0, int kc, int transposed,
                          fa_frag_ctx ctx) {
    FA_MMA_UNROLL for (int e = 0; e < FA_C_ELEMS; e++) {
        const int row = FA_C_ROW(ctx.lane, e), col = FA_C_COL(ctx.lane, e);
        const uint i = (uint)q0 + (uint)(qr + (transposed ? col : row));
        const uint j = (uint)k0 + (uint)(kc + (transposed ? row : col));
        c->x[e] = fa_logit2(sc, c->x[e], i, j, &g->x[e]);
    }
}
#endif
