/* Split-K merge (decoding): fa_forward built with SPLITK left, for every
 * split s, a normalised partial output O_s and its log-sum-exp L_s. The
 * full row is their log-sum-exp weighted mean:
 *   L = log sum_s exp(L_s),   O = sum_s exp(L_s - L) O_s
 * A split that saw no key has L_s = -inf and weighs nothing; a row no split
 * saw anything of gets O = 0, L = -inf.
 *
 * One work-item per (dim x, row t, sequence * heads_q + head). */
__kernel void fa_splitk_merge(__global const float *part_o, __global const float *part_l,
                              __global store_t *o, __global float *lse,
                              long o_off, long o_sb, long o_ss, long o_sh,
                              int seqlen_q, int heads_q, long total_q,
                              __global const int *cu_q, int num_splits) {
    const int x = get_global_id(0);
    const int t = get_global_id(1);
    const int b = get_global_id(2) / heads_q, h = get_global_id(2) % heads_q;
    if (x >= HEAD_DIM) return;
#ifdef VARLEN
    const long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const long start_q = (long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    if (t >= len_q) return;
    const long row = start_q + t;
    const long split_stride = (long)heads_q * total_q;

    float mx = -INFINITY;
    for (int s = 0; s < num_splits; s++)
        mx = fmax(mx, part_l[s * split_stride + (long)h * total_q + row]);
    float out = 0.0f, lse_r = -INFINITY;
    if (mx != -INFINITY) {
        float wsum = 0.0f;
        for (int s = 0; s < num_splits; s++) {
            long i = s * split_stride + (long)h * total_q + row;
            float w = exp(part_l[i] - mx);
            wsum += w;
            out = fma(w, part_o[i * HEAD_DIM + x], out);
        }
        out /= wsum;
        lse_r = mx + log(wsum);
    }
    fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    STORE1(o, fa_row_index(lo, b, start_q, t, h) + x, out);
    if (x == 0) lse[fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q)] = lse_r;
}
