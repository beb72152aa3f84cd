/* Small kernels the programs of a pass share: the backward pre-pass
 * D = rowsum(dO * O) and the conversion of the fp32 dQ accumulator (with
 * BWD), the split-K merge of the forward pass (with FWD and SPLITK).
 * Memory-bound: 16-byte accesses, eight threads per row. */
#ifndef FA_CUDA_ROWWISE_CUH
#define FA_CUDA_ROWWISE_CUH

#include "common.cuh"

#define ROWWISE_THREADS 256
#define ROWWISE_ROWS (ROWWISE_THREADS / 8) /* rows per block */

/* Block (x: group of ROWWISE_ROWS rows, y: query head, z: sequence); thread
 * (row, lane8) covers chunks lane8, lane8 + 8, ... of its row. The row is
 * compared unsigned: past a sequence near 2^31 tokens it passes INT_MAX. */
#define ROWWISE_SETUP()                                                      \
    const int lane8 = threadIdx.x & 7;                                       \
    const u32 r_ = blockIdx.x * ROWWISE_ROWS + (threadIdx.x >> 3);           \
    const int h = blockIdx.y, b = blockIdx.z;                                \
    const fa_seq seq = seq_of(p, b);                                         \
    if (r_ >= (u32)seq.len_q) return;                                        \
    const int r = (int)r_

#ifdef BWD
/* D = rowsum(dO * O) of the values as stored, in fp32 (IO_DIM of them). */
extern "C" __global__ void __launch_bounds__(ROWWISE_THREADS) fa_bwd_dot(const fa_params p) {
    ROWWISE_SETUP();
    const i64 row = O_ROW(p, b, seq, r, h);
    const elem_t *o = (const elem_t *)p.o + row, *g = (const elem_t *)p.dout + row;
    float acc = 0.0f;
    for (int x0 = lane8 * 8; x0 < IO_DIM; x0 += 64) {
        float a[8], c[8];
        load8(o + x0, a);
        load8(g + x0, c);
#pragma unroll
        for (int i = 0; i < 8; i++) acc = fmaf(a[i], c[i], acc);
    }
    /* The eight lanes of a row leave together or not at all. */
    const unsigned lanes = 0xffu << (threadIdx.x & 24);
    acc += __shfl_xor_sync(lanes, acc, 4);
    acc += __shfl_xor_sync(lanes, acc, 2);
    acc += __shfl_xor_sync(lanes, acc, 1);
    if (lane8 == 0) p.dvec[lse_index(p, b, h, r, seq.start_q)] = acc;
}

/* dQ = scale * accumulator, rounded once to the storage dtype (the first
 * IO_DIM of each accumulator row of HEAD_DIM). */
extern "C" __global__ void __launch_bounds__(ROWWISE_THREADS) fa_bwd_dq_convert(const fa_params p) {
    ROWWISE_SETUP();
    const float *acc = p.dq_acc + lse_index(p, b, h, r, seq.start_q) * HEAD_DIM;
    elem_t *dq = (elem_t *)p.dq + Q_ROW(p, b, seq, r, h);
    for (int x0 = lane8 * 8; x0 < IO_DIM; x0 += 64) {
        float v[8];
        const float4 a = *(const float4 *)(acc + x0), c = *(const float4 *)(acc + x0 + 4);
        v[0] = a.x * p.scale;
        v[1] = a.y * p.scale;
        v[2] = a.z * p.scale;
        v[3] = a.w * p.scale;
        v[4] = c.x * p.scale;
        v[5] = c.y * p.scale;
        v[6] = c.z * p.scale;
        v[7] = c.w * p.scale;
        store8(dq + x0, v);
    }
}

#endif

#if defined(FWD) && defined(SPLITK)
/* Split-K merge (decoding): every split s left a normalised partial output
 * O_s and its log-sum-exp L_s (fp32, [split][heads_q][total_q]); the row is
 * their log-sum-exp weighted mean:
 *   L = log sum_s exp(L_s),   O = sum_s exp(L_s - L) O_s.
 * A split with L_s = -inf has no mass and weighs nothing; its O_s is 0 if
 * the masks leave the row no key at all, else NaN (0 / 0). A row no split
 * has mass of gets O = 0, L = -inf in the first case, NaN in the other
 * (its visible scores were all -inf: softmax is 0 / 0 there). A NaN L_s
 * spreads to the whole row. The splits are summed in order: the
 * result does not depend on timing. */
extern "C" __global__ void __launch_bounds__(ROWWISE_THREADS) fa_splitk_merge(const fa_params p) {
    ROWWISE_SETUP();
    const i64 row = (i64)h * p.total_q + seq.start_q + r;
    const i64 split_stride = (i64)p.heads_q * p.total_q;
    float mx = -FA_INF;
    bool mass = false; /* a split with L_s > -inf, or NaN */
    for (int s = 0; s < p.num_splits; s++) {
        const float ls = p.part_l[s * split_stride + row];
        mx = fmaxf(mx, ls);
        mass |= ls != -FA_INF;
    }
    /* mx = -inf with mass only when every split with mass has L_s = NaN:
     * the weights come out NaN, as they must. */
    const float m_use = mx == -FA_INF ? 0.0f : mx;
    float lse_r = -FA_INF, wsum = 0.0f;
    if (mass) {
        for (int s = 0; s < p.num_splits; s++) {
            const float ls = p.part_l[s * split_stride + row];
            if (ls != -FA_INF) wsum += expf(ls - m_use);
        }
        lse_r = m_use + logf(wsum);
    }
    elem_t *o = (elem_t *)p.o + O_ROW(p, b, seq, r, h);
    for (int x0 = lane8 * 8; x0 < HEAD_DIM; x0 += 64) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = 0.0f;
        for (int s = 0; s < p.num_splits; s++) {
            const i64 i = s * split_stride + row;
            const float *po = p.part_o + i * HEAD_DIM + x0;
            if (p.part_l[i] != -FA_INF) {
                const float w = expf(p.part_l[i] - m_use) / wsum;
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = fmaf(w, po[e], v[e]);
            } else if (!mass) {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (fa_isnan(po[e])) v[e] = FA_NAN;
            }
        }
        store8(o + x0, v);
    }
    if (lane8 == 0) {
        /* No split with mass: NaN where one saw keys (its O_s is NaN). */
        if (!mass)
            for (int s = 0; s < p.num_splits; s++)
                if (fa_isnan(p.part_o[(s * split_stride + row) * HEAD_DIM])) lse_r = FA_NAN;
#ifdef KV_CACHE
        if (!p.lse) return; /* fa_forward_kvcache's lse is optional */
#endif
        p.lse[lse_index(p, b, h, r, seq.start_q)] = lse_r;
    }
}
#endif

#endif
