/* Split-K merge (decoding): fa_forward built with SPLITK left, for every
 * split s, a normalised partial output O_s and its log-sum-exp L_s. The
 * full row is their log-sum-exp weighted mean:
 *   L = log sum_s exp(L_s),   O = sum_s exp(L_s - L) O_s
 * A split with L_s = -inf has no mass and weighs nothing; its O_s is 0 if
 * the masks leave the row no key at all, else NaN (0 / 0). A row no split
 * has mass of gets O = 0, L = -inf in the first case, NaN in the other
 * (its visible scores were all -inf: softmax is 0 / 0 there). A NaN L_s
 * spreads to the whole row. The twin of kernels_cl/splitk.cl.
 *
 * One work-item per head dimension x (threadIdx.x, a block of HEAD_DIM),
 * one work-group per (row t, head, sequence) = (blockIdx.x, .y, .z): rows
 * go along x, whose grid limit is far above any sequence length. Also the
 * merge of kvcache.hip's split KV-cache step. */
extern "C" __global__ __launch_bounds__(HEAD_DIM) void
fa_splitk_merge(const float *__restrict__ part_o, const float *__restrict__ part_l, store_t *__restrict__ o,
                float *__restrict__ lse, fa_long o_off, fa_long o_sb, fa_long o_ss, fa_long o_sh, int seqlen_q,
                int heads_q, fa_long total_q, const int *cu_q, int num_splits) {
    const int x = (int)threadIdx.x;
    const int t = (int)blockIdx.x;
    const int h = (int)blockIdx.y, b = (int)blockIdx.z;
    (void)cu_q;
#ifdef VARLEN
    const fa_long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const fa_long start_q = (fa_long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    if (t >= len_q) return;
    const fa_long row = start_q + t;
    const fa_long split_stride = (fa_long)heads_q * total_q;

    float mx = -FA_INF;
    bool mass = false; /* a split with L_s > -inf, or NaN */
    for (int s = 0; s < num_splits; s++) {
        const float ls = part_l[s * split_stride + (fa_long)h * total_q + row];
        mx = fmaxf(mx, ls);
        mass |= ls != -FA_INF;
    }
    float out = 0.0f, lse_r = -FA_INF;
    if (mass) {
        /* mx = -inf here only when every split with mass has L_s = NaN: the
         * weights come out NaN, as they must. */
        const float m_use = mx == -FA_INF ? 0.0f : mx;
        float wsum = 0.0f;
        for (int s = 0; s < num_splits; s++) {
            const fa_long i = s * split_stride + (fa_long)h * total_q + row;
            if (part_l[i] == -FA_INF) continue;
            const float w = expf(part_l[i] - m_use);
            wsum += w;
            out = fmaf(w, part_o[i * HEAD_DIM + x], out);
        }
        out /= wsum;
        lse_r = m_use + logf(wsum);
    } else {
        for (int s = 0; s < num_splits; s++) {
            const fa_long i = s * split_stride + (fa_long)h * total_q + row;
            if (fa_isnan(part_o[i * HEAD_DIM + x])) out = lse_r = FA_NAN;
        }
    }
    const fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    fa_store1(o, fa_row_index(lo, b, start_q, t, h) + x, out);
    /* A KV-cache step's L is optional (fa_forward_kvcache). */
    if (x == 0 && lse) lse[fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q)] = lse_r;
}
