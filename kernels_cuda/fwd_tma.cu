/* Forward pass on Hopper, warp-specialised (sm_90a): one thread block per
 * (query tile of BR rows, query head, sequence), CWG = BR / 64 consumer
 * warpgroups of 64 query rows and one producer warpgroup.
 *
 * The producer (one thread of warpgroup 0, its registers handed to the
 * consumers with setmaxnreg) loads Q once and streams K and V by tensor-map
 * copies (TMA) into a ring of STAGES stages, each guarded by a "full"
 * transaction barrier the copy completes and an "empty" one the consumers'
 * warps arrive at when their products have read the stage. It runs ahead
 * of the consumers by the ring's depth and never waits for their softmax.
 *
 * Each consumer warpgroup runs S = Q K^T and O += P V as warpgroup
 * products (wgmma.cuh's swizzled tiles, which the tensor maps write
 * directly) with fwd_mma.cu's per-warp online softmax. With OVERLAP, the
 * products of tile t + 1's S and tile t's P V are issued together and the
 * softmax of t + 1 runs while P V of t is still on the tensor cores; with
 * PINGPONG (two consumer warpgroups), named barriers make the warpgroups
 * issue their products in turn, so that one's softmax fills the time of
 * the other's products. O leaves through the warpgroup's own rows of the Q
 * tile and a TMA store (rows past the sequence are not written).
 *
 * Options as fwd_mma.cu (masks, windows, block mask, dropout, GQA, score
 * options); no VARLEN: a tensor map's box would cross into the next
 * sequence, whose values (inf or NaN among them) must not reach this one's
 * products. Shared memory, fa_plan_local_mem's TMA forward figure:
 *   Q [BR x HEAD_DIM], K [STAGES][BC x HEAD_DIM], V [STAGES][BC x HEAD_DIM],
 *   then 1 + 4 STAGES transaction barriers. */
#include "common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"
#include "tma.cuh"

#ifdef VARLEN
#error "fwd_tma: no VARLEN (fwd_mma.cu's WGMMA build runs it)"
#endif

#define CWG (BR / 64)
#define CTHREADS (128 * CWG)
#define THREADS (CTHREADS + 128)
#define NT (BC / 8)
#define DT (HEAD_DIM / 8)
#define KP (BC / 16)
#define COL_BLOCKS (HEAD_DIM / 64)
#define Q_BYTES SW_TILE_BYTES(BR)
#define KV_BYTES SW_TILE_BYTES(BC)

#if BR % 64 != 0 || CWG < 1 || CWG > 3 || BC % 16 != 0 || BC > 256
#error "fwd_tma: BR 64, 128 or 192 (one consumer warpgroup a 64 rows), BC a multiple of 16"
#endif
#if STAGES < 2
#error "fwd_tma: at least two stages"
#endif

/* Registers a thread after the hand-over: the producer keeps what one
 * thread's loop of copies needs, the consumers share the rest of the
 * register file (64K a block: 24 x 128 + 240 x 256, 32 x 128 + 160 x 384).
 * NVRTC 13.0 reports the launch's count (168 registers with two consumer
 * warpgroups, 128 with three) and allocates the consumers' code within
 * their budget here: at head_dim 256 O alone takes 128 registers a thread
 * and the planner's builds do not spill (tests/test_cuda_compile.c). */
#if CWG == 3
#define PRODUCER_REGS 32
#define CONSUMER_REGS 160
#elif CWG == 2
#define PRODUCER_REGS 24
#define CONSUMER_REGS 240
#else
#define PRODUCER_REGS 56
#define CONSUMER_REGS 256
#endif

#if defined(PINGPONG) && CWG != 2
#error "fwd_tma: PINGPONG takes two consumer warpgroups"
#endif

/* Named barriers: 1 and 2 give consumer warpgroup 0 and 1 its turn on the
 * tensor cores (PINGPONG), 3 + w closes warpgroup w's O tile. */
#define BAR_TURN 1
#define BAR_OUT 3

/* One turn on the tensor cores: wait for it, then (after issuing) hand it
 * to the other warpgroup. */
FA_DEV void turn_begin(int cw) {
#ifdef PINGPONG
    named_sync(BAR_TURN + cw, 256);
#else
    (void)cw;
#endif
}
FA_DEV void turn_end(int cw) {
#ifdef PINGPONG
    named_arrive(BAR_TURN + (cw ^ 1), 256);
#else
    (void)cw;
#endif
}

FA_DEV void rescale(float (*o_acc)[4], const float (*alpha_of)[2]) {
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o_acc[j][e] *= alpha_of[0][e >> 1];
}

FA_DEV void probs_to_a(const float (*s)[NT][4], u32 (*pa)[AREGS]) {
#pragma unroll
    for (int kp = 0; kp < KP; kp++) c_to_a(s[0][2 * kp], s[0][2 * kp + 1], pa[kp]);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    fa_fwd_tma(const fa_params p, const __grid_constant__ fa_tensor_map tm_q, const __grid_constant__ fa_tensor_map tm_k,
               const __grid_constant__ fa_tensor_map tm_v, const __grid_constant__ fa_tensor_map tm_o) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const u32 q_sm = smem_u32(smem);
    if (q_sm & 1023u) __trap(); /* the swizzle is on address bits */
    const u32 k_sm = q_sm + Q_BYTES;
    const u32 v_sm = k_sm + STAGES * KV_BYTES;
    const u32 bars = v_sm + STAGES * KV_BYTES;
    const u32 q_full = bars;
#define K_FULL(s) (bars + 8u * (1u + (u32)(s)))
#define K_EMPTY(s) (bars + 8u * (1u + STAGES + (u32)(s)))
#define V_FULL(s) (bars + 8u * (1u + 2 * STAGES + (u32)(s)))
#define V_EMPTY(s) (bars + 8u * (1u + 3 * STAGES + (u32)(s)))

    const int tid = threadIdx.x;
    int tq = blockIdx.x;
#ifdef CAUSAL
    tq = (int)gridDim.x - 1 - tq; /* the last query tiles see the most keys: start them first */
#endif
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
    const fa_seq seq = seq_of(p, b);
    const int q0 = tq * BR;
    if (q0 >= seq.len_q) return;
    const fa_mask mask = mask_of(p, seq);
    int k_lo, k_hi, t_begin, t_end;
    key_range(mask, q0, tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    tile_span(k_lo, k_hi, BC, &t_begin, &t_end);

    if (tid == 0) {
        mbar_init(q_full, 1);
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(K_FULL(s), 1);
            mbar_init(V_FULL(s), 1);
            mbar_init(K_EMPTY(s), 4 * CWG);
            mbar_init(V_EMPTY(s), 4 * CWG);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (tid < 128) {
        /* The producer. */
        regs_shrink<PRODUCER_REGS>();
        if (tid == 0) {
            tma_prefetch_map(&tm_k);
            tma_prefetch_map(&tm_v);
            mbar_expect_tx(q_full, Q_BYTES);
#pragma unroll
            for (int cb = 0; cb < COL_BLOCKS; cb++) tma_load(q_sm + cb * BR * 128, &tm_q, cb * 64, q0, h, b, q_full);
            int stage = 0;
            u32 phase = 0;
#pragma unroll 1
            for (int t = next_key_tile(p, tq, t_begin, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
                const u32 off = (u32)stage * KV_BYTES;
                mbar_wait(K_EMPTY(stage), phase ^ 1u);
                mbar_expect_tx(K_FULL(stage), KV_BYTES);
#pragma unroll
                for (int cb = 0; cb < COL_BLOCKS; cb++)
                    tma_load(k_sm + off + cb * BC * 128, &tm_k, cb * 64, t * BC, hk, b, K_FULL(stage));
                mbar_wait(V_EMPTY(stage), phase ^ 1u);
                mbar_expect_tx(V_FULL(stage), KV_BYTES);
#pragma unroll
                for (int cb = 0; cb < COL_BLOCKS; cb++)
                    tma_load(v_sm + off + cb * BC * 128, &tm_v, cb * 64, t * BC, hk, b, V_FULL(stage));
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1u;
                }
            }
        }
        return;
    }

    /* The consumers. */
    regs_grow<CONSUMER_REGS>();
    const int ctid = tid - 128, cw = ctid >> 7, lane = tid & 31;
    const int row_base = (ctid >> 5) * 16; /* this warp's 16 rows in the tile */
    const int g = lane >> 2, t4 = lane & 3;
    const fa_score sc = score_of(p, b, h);
    const u32 bh = (u32)b * (u32)p.heads_q + (u32)h; /* dropout's stream */
#ifdef PINGPONG
    /* Warpgroup 0 takes the first turn; the count of turns is the same for
     * both (the tiles are the block's), so this arrival is the one the last
     * turn_begin of warpgroup 0 below consumes. */
    if (cw == 1) named_arrive(BAR_TURN, 256);
#endif

    float o_acc[DT][4];
    float m_run[1][2], l_run[1][2], alpha_of[1][2];
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o_acc[j][e] = 0.0f;
    m_run[0][0] = m_run[0][1] = -FA_INF;
    l_run[0][0] = l_run[0][1] = 0.0f;

    const u32 qd = desc_fresh(desc_lo_k_major(q_sm + (u32)cw * 64 * 128));
    mbar_wait(q_full, 0);

    int stage = 0;
    u32 phase = 0;
    const auto next_stage = [](int &st, u32 &ph) {
        if (++st == STAGES) {
            st = 0;
            ph ^= 1u;
        }
    };
    /* S = Q K^T of the tile in stage st, waited for; the stage's K is
     * released. */
    const auto s_product = [&](float (*sv)[NT][4], int st, u32 ph) {
        mbar_wait(K_FULL(st), ph);
        turn_begin(cw);
        wg_fence();
        wg_rows_by_rows<BC, BR>(sv[0], qd, desc_lo_k_major(k_sm + (u32)st * KV_BYTES));
        wg_commit();
        turn_end(cw);
        wg_wait<0>();
        wg_hold<NT>(sv[0]);
        if (lane == 0) mbar_arrive(K_EMPTY(st));
    };
    /* O += P V of the tile in stage st, waited for; the stage's V is
     * released. */
    const auto pv_product = [&](u32 (*pv)[AREGS], int st, u32 ph) {
        mbar_wait(V_FULL(st), ph);
        turn_begin(cw);
        wg_fence();
        wg_regs_by_rows<KP>(o_acc, pv, desc_lo_n_major(v_sm + (u32)st * KV_BYTES, BC * 128));
        wg_commit();
        turn_end(cw);
        wg_wait<0>();
        wg_hold<DT>(o_acc);
        wg_keep<KP>(pv);
        if (lane == 0) mbar_arrive(V_EMPTY(st));
    };
    /* The bias of the tile after t into L2 while t computes. */
    const auto bias_next = [&](int tc) {
#ifdef BIAS
        const int tn = next_key_tile(p, tq, tc + 1, t_end);
        if (tn < t_end) bias_prefetch<BR, BC, CTHREADS>(p, mask, b, h, q0, tn * BC, ctid);
#else
        (void)tc;
#endif
    };
    int t = next_key_tile(p, tq, t_begin, t_end);
#ifdef BIAS
    if (t < t_end) bias_prefetch<BR, BC, CTHREADS>(p, mask, b, h, q0, t * BC, ctid);
#endif
#ifdef OVERLAP
    if (t < t_end) {
        float s[1][NT][4];
        u32 pa[KP][AREGS];
        s_product(s, stage, phase);
        scores_to_probs<1, NT, BR, BC>(p, mask, sc, s, m_run, l_run, alpha_of, tq, t, q0, row_base, lane, bh);
        probs_to_a(s, pa);
        int prev = stage;
        u32 prev_phase = phase;
        next_stage(stage, phase);
#pragma unroll 1
        for (t = next_key_tile(p, tq, t + 1, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
            bias_next(t);
            /* This tile's S and the previous one's P V, issued together;
             * the softmax of S runs while P V is on the tensor cores, and O
             * takes its rescale after. */
            mbar_wait(K_FULL(stage), phase);
            turn_begin(cw);
            wg_fence();
            wg_rows_by_rows<BC, BR>(s[0], qd, desc_lo_k_major(k_sm + (u32)stage * KV_BYTES));
            wg_commit();
            mbar_wait(V_FULL(prev), prev_phase);
            wg_regs_by_rows<KP>(o_acc, pa, desc_lo_n_major(v_sm + (u32)prev * KV_BYTES, BC * 128));
            wg_commit();
            turn_end(cw);
            wg_wait<1>();
            wg_hold<NT>(s[0]);
            if (lane == 0) mbar_arrive(K_EMPTY(stage));
            const bool moved =
                scores_to_probs<1, NT, BR, BC>(p, mask, sc, s, m_run, l_run, alpha_of, tq, t, q0, row_base, lane, bh);
            wg_wait<0>();
            wg_hold<DT>(o_acc);
            wg_keep<KP>(pa);
            if (lane == 0) mbar_arrive(V_EMPTY(prev));
            if (moved) rescale(o_acc, alpha_of);
            probs_to_a(s, pa);
            prev = stage;
            prev_phase = phase;
            next_stage(stage, phase);
        }
        pv_product(pa, prev, prev_phase);
    }
#else
#pragma unroll 1
    for (; t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
        bias_next(t);
        float s[1][NT][4];
        s_product(s, stage, phase);
        if (scores_to_probs<1, NT, BR, BC>(p, mask, sc, s, m_run, l_run, alpha_of, tq, t, q0, row_base, lane, bh))
            rescale(o_acc, alpha_of);
        u32 pa[KP][AREGS];
        probs_to_a(s, pa);
        pv_product(pa, stage, phase);
        next_stage(stage, phase);
    }
#endif
#ifdef PINGPONG
    if (cw == 0) named_sync(BAR_TURN, 256);
#endif

    /* Normalise once; a row the masks leave no key gives O = 0 and L = -inf
     * (fwd_mma.cu). O goes into this warpgroup's own rows of the Q tile,
     * which only its own products read. */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_run[0][hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float m = m_run[0][hf];
        const int r = row_base + g + 8 * hf;
        const bool masked = m == -FA_INF && !row_sees_key(mask, q0, r);
        const float inv = p.drop_scale / l;
#pragma unroll
        for (int j = 0; j < DT; j++) {
            o_acc[j][2 * hf] = masked ? 0.0f : o_acc[j][2 * hf] * inv;
            o_acc[j][2 * hf + 1] = masked ? 0.0f : o_acc[j][2 * hf + 1] * inv;
        }
        if (t4 == 0 && r < seq.len_q - q0)
            p.lse[lse_index(p, b, h, q0 + r, seq.start_q)] = masked ? -FA_INF : row_lse(m * SCORE_SL2(p), l);
    }
#pragma unroll
    for (int j = 0; j < DT; j++) store_c_sw<BR>(smem, row_base, j, o_acc[j], lane);
    fence_async_smem();
    named_sync(BAR_OUT + cw, 128);
    if ((ctid & 127) == 0 && cw * 64 < seq.len_q - q0) {
#pragma unroll
        for (int cb = 0; cb < COL_BLOCKS; cb++)
            tma_store(&tm_o, q_sm + (u32)(cb * BR + cw * 64) * 128, cb * 64, q0 + cw * 64, h, b);
        tma_store_commit();
        tma_store_wait_read();
    }
}
