/* What every backward program shares (bwd.cl, bwd_mma.cl): the kernels'
 * common arguments and their setup, D = rowsum(dO * O) (fa_bwd_dot, run
 * first; with DQ_ATOMIC it also zeroes the fp32 dQ accumulator), and, with
 * DQ_ATOMIC, the conversion of that accumulator into dQ (fa_bwd_dq_convert,
 * run last). */

/* The arguments every backward kernel shares after its tensors. */
#define FA_BWD_PARAMS                                                                      \
    long q_off, long q_sb, long q_ss, long q_sh,                                           \
    long k_off, long k_sb, long k_ss, long k_sh,                                           \
    long v_off, long v_sb, long v_ss, long v_sh,                                           \
    long o_off, long o_sb, long o_ss, long o_sh,                                           \
    int seqlen_q, int seqlen_k, int heads_q, int group, long total_q, float scale_log2,    \
    float scale, __global const int *cu_q, __global const int *cu_k,                       \
    int window_left, int window_right,                                                     \
    __global const uchar *block_mask, int block_q, int block_k, int block_cols,            \
    __global const uchar *tile_map, int tile_cols,                                         \
    uint drop_key0, uint drop_key1, uint drop_offset_lo, uint drop_threshold,              \
    float drop_scale, uint drop_row0, uint drop_col0, FA_SCORE_PARAMS

#define FA_BWD_SETUP()                                                                     \
    fa_mask mask;                                                                          \
    mask.len_q = seq.len_q;                                                                \
    mask.len_k = seq.len_k;                                                                \
    mask.window_left = window_left;                                                        \
    mask.window_right = window_right;                                                      \
    mask.block_q = block_q;                                                                \
    mask.block_k = block_k;                                                                \
    mask.block_cols = block_cols;                                                          \
    fa_dropout drop;                                                                       \
    drop.key0 = drop_key0;                                                                 \
    drop.key1 = drop_key1;                                                                 \
    drop.offset_lo = drop_offset_lo;                                                       \
    drop.threshold = drop_threshold;                                                       \
    drop.keep_scale = drop_scale;                                                          \
    drop.row0 = drop_row0;                                                                 \
    drop.col0 = drop_col0;                                                                 \
    fa_layout lq = {q_off, q_sb, q_ss, q_sh}, lk = {k_off, k_sb, k_ss, k_sh};              \
    fa_layout lv = {v_off, v_sb, v_ss, v_sh}, lo = {o_off, o_sb, o_ss, o_sh}

/* ------------------------------------------------------------------------ */

__kernel void fa_bwd_dot(__global const store_t *o, __global const store_t *dout,
                         __global float *dvec, long o_off, long o_sb, long o_ss, long o_sh,
                         int seqlen_q, int heads_q, long total_q, __global const int *cu_q
#ifdef DQ_ATOMIC
                         , __global float *dq_acc
#endif
                         ) {
    const int b = get_global_id(1) / heads_q, h = get_global_id(1) % heads_q;
#ifdef VARLEN
    const long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const long start_q = (long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    /* Compared before narrowing: past a sequence near 2^31 tokens the row
     * passes INT_MAX. */
    if (get_global_id(0) >= (size_t)len_q) return;
    const int t = (int)get_global_id(0);
    fa_layout lo = {o_off, o_sb, o_ss, o_sh};
    const long row = fa_row_index(lo, b, start_q, t, h);
    float8 acc = (float8)(0.0f);
    for (int x0 = 0; x0 < HEAD_DIM; x0 += 8)
        acc = fma(LOAD8(o, row + x0), LOAD8(dout, row + x0), acc);
    float4 a4 = acc.lo + acc.hi;
    float2 a2 = a4.lo + a4.hi;
    const long li = fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q);
    dvec[li] = a2.x + a2.y;
#ifdef DQ_ATOMIC
    for (int x0 = 0; x0 < HEAD_DIM; x0 += 8) vstore8((float8)(0.0f), 0, dq_acc + li * HEAD_DIM + x0);
#endif
}

#ifdef DQ_ATOMIC
/* dQ = scale * the fp32 accumulator, in the storage dtype: one work-item
 * per (8 dimensions, row t, sequence * heads_q + head). */
__kernel void fa_bwd_dq_convert(__global const float *dq_acc, __global store_t *dq, long q_off, long q_sb,
                                long q_ss, long q_sh, int seqlen_q, int heads_q, long total_q,
                                __global const int *cu_q, float scale) {
    const int x0 = get_global_id(0) * 8;
    const int b = get_global_id(2) / heads_q, h = get_global_id(2) % heads_q;
    if (x0 >= HEAD_DIM) return;
#ifdef VARLEN
    const long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const long start_q = (long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    if (get_global_id(1) >= (size_t)len_q) return; /* before narrowing, as in fa_bwd_dot */
    const int t = (int)get_global_id(1);
    fa_layout lq = {q_off, q_sb, q_ss, q_sh};
    const long row = fa_row_index(lq, b, start_q, t, h);
    const float8 val = vload8(0, dq_acc + fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q) * HEAD_DIM + x0);
    float out[8];
    vstore8(val * scale, 0, out);
    for (int e = 0; e < 8; e++) STORE1(dq, row + x0 + e, out[e]);
}
#endif
