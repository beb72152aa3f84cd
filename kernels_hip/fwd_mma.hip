/* Forward pass on matrix cores (FlashAttention-2 partitioning), on the
 * fragment layer (mma_frag.h): one work-group per (query tile of BR rows,
 * query head, sequence), the same grid and arguments as fa_forward
 * (fwd.hip). Each wavefront owns STRIPS strips of FA_OWN_T query rows:
 * their scores, output accumulators and softmax state (running maximum,
 * lane-partial row sums) stay in fragments, and their Q operands in
 * registers for the whole pass, or, with Q_LOCAL (where registers cannot
 * hold them beside two strips' accumulators), in local memory, read again
 * for every key tile. K and V tiles of BC keys stream through local
 * memory: K's next tile is copied while this tile's softmax and P V run,
 * V's while the next scores are computed (asynchronously where the layer
 * copies so: cp.async on NVIDIA). A second strip shares every K and V
 * operand a wavefront loads between two products.
 *
 * Softmax in base 2: scores are scaled by scale * log2(e) once (with score
 * options, the logit of common.h's fa_logit2), so exp2 does the work of
 * exp and L converts back to natural log at the end. A row
 * that has seen no visible key exponentiates against 0 (no inf - inf); the
 * row sums take the probabilities before dropout, O the kept ones. P
 * becomes the next product's operands all at once, so the fp32 scores die
 * before P V (a strip's operands take half their registers).
 *
 * With CAUSAL the last query tiles, which see the most keys, start first.
 *
 * Local memory (FA_LOCAL_BLOCK), exactly core/planner_hip_mma.c's forward
 * figure: with Q_LOCAL the Q tile (BR rows of LD 16-bit elements), then
 * the K and V tiles (BC rows each). Without Q_LOCAL, Q comes in through
 * the K and V tiles (BR <= 2 BC); O goes out through the start of the
 * block either way. */

#define NJ (BC / FA_OTHER_T) /* score fragments of a strip */
#define PK (BC / FA_K)       /* k-steps of P V */

#if BR != WARPS * STRIPS * FA_OWN_T || BC % FA_OTHER_T != 0 || BC % FA_K != 0
#error "fwd_mma: BR must be WARPS * STRIPS * FA_OWN_T; BC a multiple of the fragments"
#endif
#if !defined(Q_LOCAL) && BR > 2 * BC
#error "fwd_mma: without Q_LOCAL, Q passes through the K and V tiles: BR at most 2 BC"
#endif

#ifdef Q_LOCAL
#define SM_KV (BR * LD)
#else
#define SM_KV 0
#endif

FA_MMA_KERNEL(WG_SIZE) void fa_forward_mma(const store_t *__restrict__ q, const store_t *__restrict__ k,
                              const store_t *__restrict__ v, store_t *__restrict__ o, float *__restrict__ lse,
                              fa_long q_off, fa_long q_sb, fa_long q_ss, fa_long q_sh,
                              fa_long k_off, fa_long k_sb, fa_long k_ss, fa_long k_sh,
                              fa_long v_off, fa_long v_sb, fa_long v_ss, fa_long v_sh,
                              fa_long o_off, fa_long o_sb, fa_long o_ss, fa_long o_sh,
                              int seqlen_q, int seqlen_k, int heads_q, int group, fa_long total_q, float scale_log2,
                              const int *cu_q, const int *cu_k,
                              int window_left, int window_right,
                              const fa_uchar *block_mask, int block_q, int block_k, int block_cols,
                              const fa_uchar *tile_map, int tile_cols,
                              fa_uint drop_key0, fa_uint drop_key1, fa_uint drop_offset_lo, fa_uint drop_threshold,
                              float drop_scale, fa_uint drop_row0, fa_uint drop_col0,
                              int num_splits, float *__restrict__ part_o, float *__restrict__ part_l,
                              FA_SCORE_PARAMS) {
    FA_LOCAL_BLOCK(smem);
    fa_ushort *const Ks = smem + SM_KV, *const Vs = smem + SM_KV + BC * LD;

    const int lid = (int)threadIdx.x, warp = lid / FA_SG, lane = lid % FA_SG;
#ifdef CAUSAL
    const int q0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * BR;
#else
    const int q0 = (int)blockIdx.x * BR;
#endif
    const int h = (int)blockIdx.y, b = (int)blockIdx.z;
    const int hk = h / group;
    (void)num_splits;
    (void)part_o;
    (void)part_l;

    const fa_seq seq = fa_seq_of(b, seqlen_q, seqlen_k, cu_q, cu_k);
    if (q0 >= seq.len_q) return; /* the whole work-group: no barrier missed */

    fa_mask mask;
    mask.len_q = seq.len_q;
    mask.len_k = seq.len_k;
    mask.window_left = window_left;
    mask.window_right = window_right;
    mask.block_q = block_q;
    mask.block_k = block_k;
    mask.block_cols = block_cols;
    const fa_score sc = fa_score_of(scale_log2, FA_SCORE_ARGS, b, h, seq);

    const fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};
    const fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh};
    const store_t *const kp = k + fa_row_index(lk, b, seq.start_k, 0, hk);
    const store_t *const vp = v + fa_row_index(lv, b, seq.start_k, 0, hk);
#ifdef DROPOUT
    const fa_dropout drop =
        fa_dropout_of(drop_key0, drop_key1, drop_offset_lo, drop_threshold, drop_scale, drop_row0, drop_col0);
    const fa_uint bh = (fa_uint)b * (fa_uint)heads_q + (fa_uint)h;
#else
    (void)drop_key0;
    (void)drop_key1;
    (void)drop_offset_lo;
    (void)drop_threshold;
    (void)drop_row0;
    (void)drop_col0;
#endif

    /* Q into local memory: with Q_LOCAL it stays there (its copies land
     * with the first K tile's, an earlier group); otherwise it passes on
     * into the wavefronts' registers. */
    fa_fetch_rows(smem, q + fa_row_index(lq, b, seq.start_q, q0, h), q_ss, BR, seq.len_q - q0, lid, FA_THREADS);
    fa_copy_commit();
#ifndef Q_LOCAL
    fa_copy_wait(0);
    __syncthreads();
    fa_own_op qf[STRIPS][KT];
#pragma unroll
    for (int st = 0; st < STRIPS; st++)
#pragma unroll
        for (int ks = 0; ks < KT; ks++) fa_load_own(&qf[st][ks], smem, LD, (warp * STRIPS + st) * FA_OWN_T, ks * FA_K, lane);
    __syncthreads();
#endif

    /* The key tiles this query tile can see. */
    int k_lo, k_hi, t_begin, t_end;
    fa_key_range(mask, q0, fa_tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    fa_tile_span(k_lo, k_hi, BC, &t_begin, &t_end);

    float m[STRIPS][FA_OWN_SLOTS], l[STRIPS][FA_OWN_SLOTS];
    fa_c acc[STRIPS][NF];
#pragma unroll
    for (int st = 0; st < STRIPS; st++) {
#pragma unroll
        for (int s = 0; s < FA_OWN_SLOTS; s++) {
            m[st][s] = -FA_INF;
            l[st][s] = 0.0f;
        }
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int e = 0; e < FA_C_ELEMS; e++) acc[st][f].x[e] = 0.0f;
    }

    /* Copies in flight, in order: K of tile t, V of tile t; from then on
     * every tile commits one group for the next K and one for the next V
     * (empty past the last tile), so "all but one" is always the group
     * needed next. */
    int t = fa_next_key_tile(tile_map, tile_cols, q0, t_begin, t_end);
    if (t < t_end) {
        fa_fetch_rows(Ks, kp + (fa_long)t * BC * k_ss, k_ss, BC, seq.len_k - t * BC, lid, FA_THREADS);
        fa_copy_commit();
        fa_fetch_rows(Vs, vp + (fa_long)t * BC * v_ss, v_ss, BC, seq.len_k - t * BC, lid, FA_THREADS);
        fa_copy_commit();
    }
    while (t < t_end) {
        const int k0 = t * BC;
        const int tn = fa_next_key_tile(tile_map, tile_cols, q0, t + 1, t_end);
        const int cls = fa_tile_class(mask, tile_map, tile_cols, q0, k0, FA_ROWS_STORED);

        fa_copy_wait(1);
        __syncthreads();
        fa_c s[STRIPS][NJ];
#pragma unroll
        for (int st = 0; st < STRIPS; st++)
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < FA_C_ELEMS; e++) s[st][j].x[e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KT; ks++) {
#ifdef Q_LOCAL
            fa_own_op qo[STRIPS];
#pragma unroll
            for (int st = 0; st < STRIPS; st++)
                fa_load_own(&qo[st], smem, LD, (warp * STRIPS + st) * FA_OWN_T, ks * FA_K, lane);
#define FA_Q_OP(st) qo[st]
#else
#define FA_Q_OP(st) qf[st][ks]
#endif
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                fa_other_op ko;
                fa_load_other(&ko, Ks, LD, j * FA_OTHER_T, ks * FA_K, lane);
#pragma unroll
                for (int st = 0; st < STRIPS; st++) fa_score_mma(&s[st][j], &FA_Q_OP(st), &ko);
            }
#undef FA_Q_OP
        }
        __syncthreads();
        if (tn < t_end) fa_fetch_rows(Ks, kp + (fa_long)tn * BC * k_ss, k_ss, BC, seq.len_k - tn * BC, lid, FA_THREADS);
        fa_copy_commit();

#pragma unroll
        for (int st = 0; st < STRIPS; st++) {
            const int own0 = (warp * STRIPS + st) * FA_OWN_T; /* from q0 */
            float mx[FA_OWN_SLOTS], m_use[FA_OWN_SLOTS], alpha[FA_OWN_SLOTS], sum[FA_OWN_SLOTS];
#pragma unroll
            for (int sl = 0; sl < FA_OWN_SLOTS; sl++) {
                mx[sl] = m[st][sl];
                sum[sl] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                fa_frag_logits(&s[st][j], sc, q0, k0, own0, j * FA_OTHER_T, false, lane);
                if (cls == FA_TILE_PARTIAL)
                    fa_frag_mask(&s[st][j], mask, block_mask, q0, k0, own0, j * FA_OTHER_T, false, -FA_INF, lane);
#pragma unroll
                for (int e = 0; e < FA_C_ELEMS; e++) mx[FA_OWN_SLOT(e)] = fa_fmax(mx[FA_OWN_SLOT(e)], s[st][j].x[e]);
            }
            fa_rows_max(mx);
#pragma unroll
            for (int sl = 0; sl < FA_OWN_SLOTS; sl++) {
                m_use[sl] = mx[sl] == -FA_INF ? 0.0f : mx[sl];
                alpha[sl] = fa_exp2(m[st][sl] - m_use[sl]);
                m[st][sl] = mx[sl];
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
#ifdef DROPOUT
                const fa_uint keep = fa_frag_keep(drop, bh, q0, k0, own0, j * FA_OTHER_T, false, lane);
#endif
#pragma unroll
                for (int e = 0; e < FA_C_ELEMS; e++) {
                    const float p = fa_exp2(s[st][j].x[e] - m_use[FA_OWN_SLOT(e)]);
                    sum[FA_OWN_SLOT(e)] += p;
#ifdef DROPOUT
                    s[st][j].x[e] = (keep >> e) & 1u ? p : 0.0f;
#else
                    s[st][j].x[e] = p;
#endif
                }
            }
#pragma unroll
            for (int sl = 0; sl < FA_OWN_SLOTS; sl++) l[st][sl] = l[st][sl] * alpha[sl] + sum[sl];
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int e = 0; e < FA_C_ELEMS; e++) acc[st][f].x[e] *= alpha[FA_OWN_SLOT(e)];
        }

        fa_p_op p[STRIPS][PK];
#pragma unroll
        for (int st = 0; st < STRIPS; st++)
#pragma unroll
            for (int pk = 0; pk < PK; pk++) fa_x_to_p(&p[st][pk], s[st], pk, lane);

        fa_copy_wait(1);
        __syncthreads();
#pragma unroll
        for (int pk = 0; pk < PK; pk++)
#pragma unroll
            for (int f = 0; f < NF; f++) {
                fa_z_op z;
                fa_load_z(&z, Vs, LD, pk * FA_K, f * FA_DIM_T, lane);
#pragma unroll
                for (int st = 0; st < STRIPS; st++) fa_acc_mma(&acc[st][f], &p[st][pk], &z);
            }
        __syncthreads();
        if (tn < t_end) fa_fetch_rows(Vs, vp + (fa_long)tn * BC * v_ss, v_ss, BC, seq.len_k - tn * BC, lid, FA_THREADS);
        fa_copy_commit();
        t = tn;
    }

    /* Q's copies (no key tile ran) and every wavefront's reads of the
     * block are done before O overwrites its start. */
    fa_copy_wait(0);
    __syncthreads();

    /* Normalise once; a row the masks leave no key gives O = 0 (whatever
     * 0 * NaN its accumulator met) and L = -inf (fa_row_sees_key). O
     * leaves through local memory, as whole rows. */
#pragma unroll
    for (int st = 0; st < STRIPS; st++) {
        const int r0 = (warp * STRIPS + st) * FA_OWN_T;
        fa_rows_sum(l[st]);
        float inv[FA_OWN_SLOTS];
#pragma unroll
        for (int sl = 0; sl < FA_OWN_SLOTS; sl++) {
            const int r = r0 + FA_OWN_IDX(lane, sl);
            const bool masked = m[st][sl] == -FA_INF && !fa_row_sees_key(mask, block_mask, q0, r);
            /* 0 marks a masked row below: no other row's factor is 0. */
            inv[sl] = masked ? 0.0f : drop_scale / l[st][sl];
            if (fa_row_leader(lane) && r < seq.len_q - q0)
                lse[fa_lse_index(b, h, q0 + r, heads_q, seqlen_q, seq.start_q, total_q)] =
                    masked ? -FA_INF : fa_row_lse(m[st][sl], l[st][sl]);
        }
#pragma unroll
        for (int f = 0; f < NF; f++) {
#pragma unroll
            for (int e = 0; e < FA_C_ELEMS; e++) {
                const float fct = inv[FA_OWN_SLOT(e)];
                acc[st][f].x[e] = fct == 0.0f ? 0.0f : acc[st][f].x[e] * fct;
            }
            fa_put_acc(smem, LD, r0, f * FA_DIM_T, &acc[st][f], 1.0f, lane);
        }
    }
    __syncthreads();
    fa_store_rows(o + fa_row_index(lo, b, seq.start_q, q0, h), o_ss, smem, BR, seq.len_q - q0, lid, FA_THREADS);
}
