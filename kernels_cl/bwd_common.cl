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

/* fa_bwd_dot and fa_bwd_dq_convert give a row's HEAD_DIM / 8 chunks of 8
 * to as many work-items of one work-group (dimension 0; the host gives it
 * that local size and FA_ROW_GROUP_ITEMS work-items at most), so that a
 * row's accesses are one coalesced run: a work-item a row made each
 * access touch 32 rows, and these two kernels took 0.7-0.9 ms of a
 * 16k-token backward on an H200 where a copy of their bytes takes 0.1. */
#define FA_ROW_CHUNKS (HEAD_DIM / 8)
#define FA_ROW_GROUP_ITEMS 256

__kernel void fa_bwd_dot(__global const store_t *o, __global const store_t *dout,
                         __global float *dvec, long o_off, long o_sb, long o_ss, long o_sh,
                         int seqlen_q, int heads_q, long total_q, __global const int *cu_q
#ifdef DQ_ATOMIC
                         , __global float *dq_acc
#endif
                         ) {
    __local float part[FA_ROW_GROUP_ITEMS];
    const int b = get_global_id(2) / heads_q, h = get_global_id(2) % heads_q;
    const int x = (int)get_local_id(0), r = (int)get_local_id(1);
#ifdef VARLEN
    const long start_q = cu_q[b];
    const int len_q = cu_q[b + 1] - cu_q[b];
#else
    const long start_q = (long)b * seqlen_q;
    const int len_q = seqlen_q;
#endif
    /* Compared before narrowing: past a sequence near 2^31 tokens the row
     * passes INT_MAX. */
    const int valid = get_global_id(1) < (size_t)len_q;
    const int t = valid ? (int)get_global_id(1) : 0;
    long li = 0;
    float sum = 0.0f;
    if (valid) {
        fa_layout lo = {o_off, o_sb, o_ss, o_sh};
        const long row = fa_row_index(lo, b, start_q, t, h);
        const float8 prod = LOAD8(o, row + 8 * x) * LOAD8(dout, row + 8 * x);
        const float4 p4 = prod.lo + prod.hi;
        sum = p4.x + p4.y + p4.z + p4.w;
        li = fa_lse_index(b, h, t, heads_q, seqlen_q, start_q, total_q);
#ifdef DQ_ATOMIC
        vstore8((float8)(0.0f), 0, dq_acc + li * HEAD_DIM + 8 * x);
#endif
    }
    part[r * FA_ROW_CHUNKS + x] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (valid && x == 0) {
        for (int c = 1; c < FA_ROW_CHUNKS; c++) sum += part[r * FA_ROW_CHUNKS + c];
        dvec[li] = sum;
    }
}

#ifdef DQ_ATOMIC
/* dQ = scale * the fp32 accumulator, in the storage dtype: one work-item
 * per (8 dimensions, row t, sequence * heads_q + head), a row's chunks in
 * one work-group as in fa_bwd_dot. */
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
    STORE8(dq, row + x0, val * scale);
}
#endif
