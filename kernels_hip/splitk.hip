/* Split-K merge (decoding): fa_forward built with SPLITK left, for every
 * split s, a normalised partial output O_s and its log-sum-exp L_s. The
 * full row is their log-sum-exp weighted mean:
 *   L = log sum_s exp(L_s),   O = sum_s exp(L_s - L) O_s
 * A split that saw no key has L_s = -inf and weighs nothing; a row no split
 * saw anything of gets O = 0, L = -inf. The twin of kernels_cl/splitk.cl.
 *
 * One work-item per head dimension x (threadIdx.x, a block of HEAD_DIM),
 * one work-group per (row t, head, sequence) = (blockIdx.x, .y, .z): rows
 * go along x, whose grid limit is far above any sequence length. */
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
    for (int s = 0; s < num_splits; s++) mx = fmaxf(mx, part_l[s * split_stride + (fa_long)h * total_q + row]);
    float out = 0.0f, lse_r = -FA_INF;
    if (mx != -FA_INF) {
        float wsum = 0.0f;
        for (int s = 0; s < num_splits; s++) {
            const fa_long i = s * split_stride + (fa_long)h * total_q + row;
            const float w = expf(part_l[i] - mx);
            wsum += w;
            out = fmaf(w, part_o[i * HEAD_DIM + x], out);
        }
        out /= wsum;
        lse_r = mx + logf(wsum);
    }
    const fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    fa_store1(o, fa_row_index(lo, b, start_q, t, h) + x, out);
    if (x == 0) lse[fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q)] = lse_r;
}
