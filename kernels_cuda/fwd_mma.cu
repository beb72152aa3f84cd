/* Forward pass on tensor cores (FlashAttention-2 work partitioning): one
 * thread block per (query tile of BR rows, query head, sequence). Each warp
 * owns MT strips of 16 query rows and keeps their scores, running maxima,
 * row sums and output accumulator in registers, so the softmax needs no
 * exchange between warps. K and V tiles stream through shared memory with
 * cp.async; O is rescaled once per key tile and normalised once at the end.
 *
 * Options: BR BC WARPS STAGES (1: K and V single-buffered, the load of one
 * overlapping the use of the other; 2: both double-buffered, the next tile
 * loading during the whole current one), QREG (Q fragments held in
 * registers for the whole kernel, else re-read from shared memory), WGMMA
 * (sm_90a: each group of four warps computes its 64 rows' S = Q K^T and
 * O += P V as warpgroup products straight from shared memory, P from
 * registers; one 16-row strip per warp, so the softmax below is the same).
 *
 * Shared memory, exactly fa_plan_local_mem's MMA (WGMMA) forward figure:
 *   Qs [BR x HEAD_DIM], Ks [STAGES][BC x HEAD_DIM], Vs [STAGES][BC x HEAD_DIM]
 * laid out as mma.cuh says (TILE_BYTES), or wgmma.cuh (SW_TILE_BYTES); the
 * start of it holds O at the end, in mma.cuh's layout, for coalesced stores.
 *
 * Softmax in base 2: the row maximum m is kept in score units and every
 * probability is one ex2 of fma(s, scale * log2 e, -m * scale * log2 e).
 * With score options (SOFTCAP ALIBI BIAS) the scores are turned into
 * logits in log2 units right after S = Q K^T (mma.cuh score_rows_by_keys),
 * before the masks, and the factor is 1. */
#include "common.cuh"
#include "mma.cuh"
#ifdef WGMMA
#include "wgmma.cuh"
#endif

#define THREADS (WARPS * 32)
#define MT (BR / (16 * WARPS))
#define NT (BC / 8)
#define DT (HEAD_DIM / 8)
#define KS (HEAD_DIM / 16)
#define KP (BC / 16)

#if BR % (16 * WARPS) != 0 || BC % 16 != 0 || HEAD_DIM % 16 != 0
#error "fwd_mma: BR must be a multiple of 16 * WARPS, BC and HEAD_DIM of 16"
#endif

#ifdef WGMMA
#if MT != 1 || WARPS % 4 != 0 || defined(QREG)
#error "fwd_mma: WGMMA runs one 16-row strip per warp in whole warpgroups, Q in shared memory"
#endif
#define SMEM_ALIGN 1024
#define Q_BYTES SW_TILE_BYTES(BR)
#define KV_TILE_BYTES SW_TILE_BYTES(BC)
#define LOAD_TILE(ROWS) load_tile_sw<ROWS, THREADS>
#define FENCE_ASYNC_SMEM() fence_async_smem()
#else
#define SMEM_ALIGN 128
#define Q_BYTES TILE_BYTES(BR, HEAD_DIM * ELEM_BYTES)
#define KV_TILE_BYTES TILE_BYTES(BC, HEAD_DIM * ELEM_BYTES)
#define LOAD_TILE(ROWS) load_tile_async<ROWS, THREADS>
#define FENCE_ASYNC_SMEM() ((void)0)
#endif

/* Blocks the registers must leave room for on one SM (a build option to
 * try: FLASHATTN_CUDA_OPTIONS). */
#ifndef FWD_MIN_BLOCKS
#define FWD_MIN_BLOCKS 1
#endif

extern "C" __global__ void __launch_bounds__(THREADS, FWD_MIN_BLOCKS) fa_fwd_mma(const fa_params p) {
    extern __shared__ __align__(SMEM_ALIGN) unsigned char smem[];
    const u32 q_sm = smem_u32(smem);
#ifdef WGMMA
    /* The swizzle is on address bits: a misplaced window would read wrong
     * operands, not fail. */
    if (q_sm & (SMEM_ALIGN - 1)) __trap();
#endif
    constexpr u32 KV_BYTES = KV_TILE_BYTES;
    const u32 k_sm = q_sm + Q_BYTES;
    const u32 v_sm = k_sm + STAGES * KV_BYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    int tq = blockIdx.x;
#ifdef CAUSAL
    /* The last query tiles see the most keys: start them first. */
    tq = (int)gridDim.x - 1 - tq;
#endif
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
    const fa_seq seq = seq_of(p, b);
    const int q0 = tq * BR;
    if (q0 >= seq.len_q) return;
    const fa_mask mask = mask_of(p, seq);

    const elem_t *qg = (const elem_t *)p.q + Q_ROW(p, b, seq, q0, h);
    const elem_t *kg = (const elem_t *)p.k + K_ROW(p, b, seq, 0, hk);
    const elem_t *vg = (const elem_t *)p.v + V_ROW(p, b, seq, 0, hk);

    int k_lo, k_hi, t_begin, t_end;
    key_range(mask, q0, tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
    const int row_base = warp * MT * 16; /* first row of this warp in the tile */
    const float sl2 = SCORE_SL2(p);
    const fa_score sc = score_of(p, b, h);
    const u32 bh = (u32)b * (u32)p.heads_q + (u32)h; /* dropout's stream */

    float o_acc[MT][DT][4];
    float m_run[MT][2], l_run[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int j = 0; j < DT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o_acc[mt][j][e] = 0.0f;
        m_run[mt][0] = m_run[mt][1] = -FA_INF;
        l_run[mt][0] = l_run[mt][1] = 0.0f;
    }
#ifdef QREG
    u32 qa[MT][KS][AREGS];
#endif

    int t = next_key_tile(p, tq, t_begin, t_end);
    LOAD_TILE(BR)(q_sm, qg, p.q_ss, seq.len_q - q0, tid);
    if (t < t_end) {
        LOAD_TILE(BC)(k_sm, kg + (i64)t * BC * p.k_ss, p.k_ss, seq.len_k - t * BC, tid);
#if STAGES == 2
        LOAD_TILE(BC)(v_sm, vg + (i64)t * BC * p.v_ss, p.v_ss, seq.len_k - t * BC, tid);
#endif
    }
    cp_async_commit();

    int stage = 0;
#ifdef QREG
    bool first = true;
#endif
#ifdef BIAS
    if (t < t_end) bias_prefetch<BR, BC, THREADS>(p, mask, b, h, q0, t * BC, tid);
#endif
    while (t < t_end) {
        const int tn = next_key_tile(p, tq, t + 1, t_end);
#ifdef BIAS
        /* The next tile's bias into L2 while this one computes. */
        if (tn < t_end) bias_prefetch<BR, BC, THREADS>(p, mask, b, h, q0, tn * BC, tid);
#endif
        const u32 kb = k_sm + (u32)stage * KV_BYTES, vb = v_sm + (u32)stage * KV_BYTES;
#if STAGES == 2
        if (tn < t_end) {
            const u32 off = (u32)(stage ^ 1) * KV_BYTES;
            LOAD_TILE(BC)(k_sm + off, kg + (i64)tn * BC * p.k_ss, p.k_ss, seq.len_k - tn * BC, tid);
            LOAD_TILE(BC)(v_sm + off, vg + (i64)tn * BC * p.v_ss, p.v_ss, seq.len_k - tn * BC, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        FENCE_ASYNC_SMEM();
        __syncthreads();
#else
        cp_async_wait<0>();
        FENCE_ASYNC_SMEM();
        __syncthreads(); /* K(t) is in; every warp is done with V(t - 1) */
        LOAD_TILE(BC)(v_sm, vg + (i64)t * BC * p.v_ss, p.v_ss, seq.len_k - t * BC, tid);
        cp_async_commit();
#endif
#ifdef QREG
        if (first) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int ks = 0; ks < KS; ks++) load_a(q_sm, row_base + mt * 16, ks, qa[mt][ks], lane);
        }
        first = false;
#endif

        /* S = Q K^T */
        float s[MT][NT][4];
#ifndef WGMMA /* its first product overwrites */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][j][e] = 0.0f;
#endif
#ifdef WGMMA
        {
            /* The warpgroup's 64 rows of Q. */
            const u32 qd = desc_fresh(desc_lo_k_major(q_sm + (u32)(warp / 4) * 64 * 128)), kd = desc_lo_k_major(kb);
            wg_fence();
            wg_rows_by_rows<BC, BR>(s[0], qd, kd);
            wg_commit();
            wg_wait<0>();
            wg_hold<NT>(s[0]);
        }
#else
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
#ifdef QREG
#define A_FRAG(mt) qa[mt][ks]
#else
            u32 a[MT][AREGS];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) load_a(q_sm, row_base + mt * 16, ks, a[mt], lane);
#define A_FRAG(mt) a[mt]
#endif
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 b0[BREGS], b1[BREGS];
                load_b2(kb, j * 8, ks, b0, b1, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16(s[mt][j], A_FRAG(mt), b0);
                    mma16(s[mt][j + 1], A_FRAG(mt), b1);
                }
            }
#undef A_FRAG
        }
#endif

        /* Probabilities; the one rescale of O and l where a row's maximum
         * moved (once the maxima settle, most tiles move none of the
         * warp's rows: alpha is then exactly 1). */
        float alpha_of[MT][2];
        if (scores_to_probs<MT, NT, BR, BC>(p, mask, sc, s, m_run, l_run, alpha_of, tq, t, q0, row_base, lane, bh)) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < DT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o_acc[mt][j][e] *= alpha_of[mt][e >> 1];
        }

        /* P as the next product's A operand now: in fp16/bf16 that halves
         * the registers the scores hold through the P V loop. */
        u32 pa[MT][KP][AREGS];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kp = 0; kp < KP; kp++) c_to_a(s[mt][2 * kp], s[mt][2 * kp + 1], pa[mt][kp]);

#if STAGES == 1
        cp_async_wait<0>();
        FENCE_ASYNC_SMEM();
        __syncthreads(); /* V(t) is in; every warp is done with K(t) */
        if (tn < t_end) {
            LOAD_TILE(BC)(k_sm, kg + (i64)tn * BC * p.k_ss, p.k_ss, seq.len_k - tn * BC, tid);
        }
        cp_async_commit();
#endif

        /* O += P V */
#ifdef WGMMA
        const u32 vd = desc_lo_n_major(vb, BC * 128);
        wg_fence();
        wg_regs_by_rows<KP>(o_acc[0], pa[0], vd);
        wg_commit();
        wg_wait<0>();
        wg_hold<DT>(o_acc[0]);
#else
#pragma unroll
        for (int kp = 0; kp < KP; kp++) {
#pragma unroll
            for (int j = 0; j < DT; j += 2) {
                u32 b0[BREGS], b1[BREGS];
                load_bt2(vb, kp, j, b0, b1, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16(o_acc[mt][j], pa[mt][kp], b0);
                    mma16(o_acc[mt][j + 1], pa[mt][kp], b1);
                }
            }
        }
#endif
#if STAGES == 2
        __syncthreads(); /* this stage may be refilled next iteration */
        stage ^= 1;
#endif
        t = tn;
    }
    cp_async_wait<0>();
    __syncthreads(); /* Qs is free for O */

    /* Normalise once; a row the masks leave no key gives O = 0 (whatever
     * 0 * NaN its accumulator met) and L = -inf (row_sees_key). */
    unsigned char *o_tile = smem;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float l = l_run[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float m = m_run[mt][hf];
            const int r = row_base + mt * 16 + g + 8 * hf;
            const bool masked = m == -FA_INF && !row_sees_key(mask, q0, r);
            const float inv = p.drop_scale / l;
#pragma unroll
            for (int j = 0; j < DT; j++) {
                o_acc[mt][j][2 * hf] = masked ? 0.0f : o_acc[mt][j][2 * hf] * inv;
                o_acc[mt][j][2 * hf + 1] = masked ? 0.0f : o_acc[mt][j][2 * hf + 1] * inv;
            }
            if (t4 == 0 && r < seq.len_q - q0)
                p.lse[lse_index(p, b, h, q0 + r, seq.start_q)] = masked ? -FA_INF : row_lse(m * sl2, l);
        }
#pragma unroll
        for (int j = 0; j < DT; j++) store_c(o_tile, row_base + mt * 16, j, o_acc[mt][j], lane);
    }
    __syncthreads();
    store_tile<BR, THREADS>((elem_t *)p.o + O_ROW(p, b, seq, q0, h), p.o_ss, o_tile, seq.len_q - q0, tid);
}
