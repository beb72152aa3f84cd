/* Split-K merge (decoding): fa_forward built with SPLITK left, for every
 * split s, a normalised partial output O_s and its log-sum-exp L_s. The
 * full row is their log-sum-exp weighted mean:
 *   L = log sum_s exp(L_s),   O = sum_s exp(L_s - L) O_s
 * A split with L_s = -inf has no mass and weighs nothing; its O_s is 0 if
 * the masks leave the row no key at all, else NaN (0 / 0). A row no split
 * has mass of gets O = 0, L = -inf in the first case, NaN in the other
 * (its visible scores were all -inf: softmax is 0 / 0 there). A NaN L_s
 * spreads to the whole row.
 *
 * One work-item per (dim x, row t, sequence * heads_q + head). */
__kernel void fa_splitk_merge(__global const float *part_o, __global const float *part_l,
                              __global store_t *o, __global float *lse,
                              long o_off, long o_sb, long o_ss, long o_sh,
                              int seqlen_q, int heads_q, long total_q,
                              __global const int *cu_q, int num_splits) {
    const int x = get_global_id(0);
    const int b = get_global_id(2) / heads_q, h = get_global_id(2) % heads_q;
    if (x >= HEAD_DIM) return;
#ifdef VARLEN
    const long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const long start_q = (long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    /* Compared before narrowing: past a sequence near 2^31 tokens the row
     * passes INT_MAX. */
    if (get_global_id(1) >= (size_t)len_q) return;
    const int t = (int)get_global_id(1);
    const long row = start_q + t;
    const long split_stride = (long)heads_q * total_q;

    float mx = -INFINITY;
    bool mass = false; /* a split with L_s > -inf, or NaN */
    for (int s = 0; s < num_splits; s++) {
        const float ls = part_l[s * split_stride + (long)h * total_q + row];
        mx = fmax(mx, ls);
        mass |= ls != -INFINITY;
    }
    float out = 0.0f, lse_r = -INFINITY;
    if (mass) {
        /* mx = -inf here only when every split with mass has L_s = NaN: the
         * weights come out NaN, as they must. */
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        float wsum = 0.0f;
        for (int s = 0; s < num_splits; s++) {
            long i = s * split_stride + (long)h * total_q + row;
            if (part_l[i] == -INFINITY) continue;
            float w = exp(part_l[i] - m_use);
            wsum += w;
            out = fma(w, part_o[i * HEAD_DIM + x], out);
        }
        out /= wsum;
        lse_r = m_use + log(wsum);
    } else {
        for (int s = 0; s < num_splits; s++) {
            long i = s * split_stride + (long)h * total_q + row;
            if (isnan(part_o[i * HEAD_DIM + x])) out = lse_r = NAN;
        }
    }
    fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    STORE1(o, fa_row_index(lo, b, start_q, t, h) + x, out);
    if (x == 0) lse[fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q)] = lse_r;
}
