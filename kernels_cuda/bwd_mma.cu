/* Backward pass on tensor cores (FlashAttention-2): dQ, dK, dV from Q, K, V,
 * O, L and dO, P recomputed on chip from L. Run in this order:
 *
 *   fa_bwd_dot          D = rowsum(dO * O) (rowwise.cuh)
 *   fa_bwd_dkdv_mma     one block per (key tile of BC keys, kv head, sequence):
 *                       K and V stay in shared memory while the block loops
 *                       over the query heads sharing the kv head and over the
 *                       query tiles that see the keys; each warp owns KT strips
 *                       of 16 keys and keeps their dK and dV in registers (GQA
 *                       sums there, no atomics). With DQ_ATOMIC the block also
 *                       adds dS K into the fp32 dQ accumulator.
 *   fa_bwd_dq_convert   dQ = scale * accumulator (rowwise.cuh), or, without
 *                       DQ_ATOMIC (deterministic mode):
 *   fa_bwd_dq_mma       one block per (query tile, query head, sequence),
 *                       looping over key tiles with P and dS recomputed; every
 *                       sum has a fixed order, so results are bit-identical
 *                       run to run.
 *
 * The key-side kernel computes the transposed products, so the warp that
 * owns a key strip holds S^T and dP^T as C fragments and feeds them straight
 * back as A operands:
 *   S^T = K Q^T,  dP^T = V dO^T,  P = exp2(S^T * scale log2 e - L log2 e),
 *   dS = P * (z keep_scale dP - D),  dV += (z keep_scale P)^T dO,  dK += dS^T Q
 * (z the dropout keep bit). A row with L = -inf (no visible key) takes
 * L = +inf here, which makes its P exactly 0 instead of exp(-inf + inf).
 * With score options (SOFTCAP ALIBI BIAS) P is exp2 of the forward's logit
 * (common.cuh score_log2 of the raw product) minus L log2 e, and dS takes
 * the cap's derivative 1 - tanh^2 (score_dcap), in every kernel here.
 *
 * Options: BWD, BR BC WARPS STAGES (query tiles in flight), DQ_ATOMIC; the
 * dQ kernel DQ_BR DQ_BC DQ_WARPS; DK_SPLIT (fp16/bf16; with WGMMA only the
 * TMA build at head_dim 192 and 256, below):
 * DK_SPLIT warps share each key strip, so that dK and dV fit the registers
 * at head dimensions above 128. Each computes S^T and dP^T for its
 * 1 / DK_SPLIT of the tile's queries and stores (z keep_scale) P^T and dS^T
 * into shared memory; the products dV += P^T dO and dK += dS^T Q then
 * read the whole strip from there, each warp for its 1 / DK_SPLIT of the
 * head dimensions (the layout of FlashAttention-2's head_dim 256
 * backward). Per thread that leaves d / DK_SPLIT accumulators of dK and dV
 * and br / DK_SPLIT of the scores. WGMMA (sm_90a): each group of four warps
 * owns 64 keys and runs the key-side kernel's products as warpgroup
 * products from shared memory (S^T, dP^T; dQ += dS K from the stored dS^T)
 * and with P and dS from registers (dV, dK); one 16-key strip a warp, so
 * P and dS are computed by the same code (the dQ kernel stays on mma.sync).
 *
 * Shared memory of fa_bwd_dkdv_mma, exactly fa_plan_local_mem's MMA (WGMMA)
 * backward figure: Ks, Vs [BC x HEAD_DIM]; Qs, dOs [STAGES][BR x HEAD_DIM];
 * dSt [BC x BR] (dS transposed, for dQ), laid out as mma.cuh says
 * (TILE_BYTES), or wgmma.cuh (unpadded, swizzled); with DK_SPLIT > 1 Pt
 * [BC x BR] (z keep_scale P transposed) as dSt; Ls, Ds [STAGES][BR]
 * fp32. */
#include "rowwise.cuh"
#include "common.cuh"
#include "mma.cuh"
#ifdef WGMMA
#include "wgmma.cuh"
#endif

#ifndef DK_SPLIT
#define DK_SPLIT 1
#endif
#define THREADS (WARPS * 32)
#define KEY_WARPS (WARPS / DK_SPLIT) /* warps with strips of their own */
#define KT (BC / (16 * KEY_WARPS))
#define NQ (BR / 8)
#define NQW (NQ / DK_SPLIT) /* n-tiles of S^T and dP^T a warp computes */
#define KQ (BR / 16)
#define DT (HEAD_DIM / 8)
#if DK_SPLIT > 1 && defined(WGMMA) && HEAD_DIM == 192
/* Head_dim 192: the warpgroups split the products, not the head
 * dimensions (a split into 128 + 64 needs two product shapes, which ptxas
 * serialises behind a branch on the warpgroup): the first holds dV, the
 * second dK, each for all 192 dimensions, in one accumulator. At 256 the
 * same split ran level with the halves (H200, bench/results/h200.md,
 * 2026-11-29): 256 keeps them. */
#define BWD_SPLIT_BY_PRODUCT
#define DTW DT
#else
#define DTW (DT / DK_SPLIT) /* n-tiles of dK and dV a warp holds */
#endif
#define KS (HEAD_DIM / 16)
#define DS_CHUNKS (BR * ELEM_BYTES / 16) /* width of the dS^T tile */

#if DK_SPLIT != 1 && DK_SPLIT != 2 && DK_SPLIT != 4
#error "bwd_mma: DK_SPLIT must be 1, 2 or 4"
#endif
#if DK_SPLIT > 1 && (ELEM_BYTES != 2 || WARPS % DK_SPLIT != 0 || NQW % 2 != 0 || DTW % 2 != 0)
#error "bwd_mma: DK_SPLIT > 1 takes fp16/bf16, WARPS a multiple of it, BR and HEAD_DIM of 16 DK_SPLIT"
#endif
/* With WGMMA (and TMA) the two consumer warpgroups share the 64 keys: each
 * computes S^T and dP^T for half the queries, both meet over P^T and dS^T
 * in shared memory, and each holds dK and dV for its half of the head
 * dimensions (whole 128-column pairs of swizzled blocks) and adds dQ for
 * its units (at head_dim 192 each holds one of dK and dV whole:
 * BWD_SPLIT_BY_PRODUCT). Head_dim 256: the registers of dK and dV for 64
 * keys x 256 dimensions would not fit one warpgroup. */
#if DK_SPLIT > 1 && defined(WGMMA) && \
    (!defined(TMA) || DK_SPLIT != 2 || WARPS != 8 || BC != 64 || BR != 64 || (HEAD_DIM != 256 && HEAD_DIM != 192) || \
     defined(DROPOUT))
#error "bwd_mma: WGMMA with DK_SPLIT takes TMA, DK_SPLIT 2, 8 warps, 64 x 64 tiles at head_dim 192 or 256, no dropout"
#endif
#if BC % (16 * KEY_WARPS) != 0 || BR % 16 != 0 || HEAD_DIM % 16 != 0
#error "bwd_mma: BC must be a multiple of 16 * WARPS / DK_SPLIT, BR and HEAD_DIM of 16"
#endif

#ifdef WGMMA
#if KT != 1 || WARPS % 4 != 0 || BR % 64 != 0
#error "bwd_mma: WGMMA runs one 16-key strip per warp in whole warpgroups, query tiles of 64 rows"
#endif
#define SMEM_ALIGN 1024
#define KV_TILE_BYTES SW_TILE_BYTES(BC)
#define QT_TILE_BYTES SW_TILE_BYTES(BR)
#define DS_TILE_BYTES (BC * BR * ELEM_BYTES)
#define PT_TILE_BYTES (DK_SPLIT > 1 ? DS_BUFFERS * DS_TILE_BYTES : 0) /* P^T beside each dS^T */
#define LOAD_TILE(ROWS) load_tile_sw<ROWS, THREADS>
#define FENCE_ASYNC_SMEM() fence_async_smem()
/* dQ = dS K in units of 64 queries x DQ_N head dimensions, shared out over
 * the warpgroups (at head_dim 96 one unit of all 96: 64 would leave a half
 * unit). */
#if HEAD_DIM == 96
#define DQ_N 96
#else
#define DQ_N 64
#endif
#define DQ_UNITS ((BR / 64) * (HEAD_DIM / DQ_N))
#else
#define SMEM_ALIGN 128
#define KV_TILE_BYTES TILE_BYTES(BC, HEAD_DIM * ELEM_BYTES)
#define QT_TILE_BYTES TILE_BYTES(BR, HEAD_DIM * ELEM_BYTES)
#define DS_TILE_BYTES TILE_BYTES(BC, BR * ELEM_BYTES)
#define PT_TILE_BYTES (DK_SPLIT > 1 ? DS_TILE_BYTES : 0)
#define LOAD_TILE(ROWS) load_tile_async<ROWS, THREADS>
#define FENCE_ASYNC_SMEM() ((void)0)
#endif

/* TMA (sm_90a, with WGMMA): a producer warpgroup ahead of the WARPS
 * consumer warps (threadIdx.x 0-127; the consumers' tid counts from 0):
 * one thread loads K and V once and each step's Q and dO by tensor-map
 * copies, its warp L and D, into a ring of STAGES stages, each with a full
 * transaction barrier (the copies' bytes and the warp's 32 arrivals after
 * its L and D) and an empty one (every consumer thread after the step's
 * products). dS^T alternates between two tiles (three with BWD_DQ_LAG), so
 * the consumers meet once a step (before dQ += dS K reads every warp's
 * rows), not three times.
 * Measured on an H100 (bench/results/h100.md, 2026-11-28 backward): the
 * split step alone gained nothing; dQ in turns, one warpgroup a step, 5%
 * (the warpgroups no longer run in lockstep); the bulk reductions of dQ
 * at head_dim 128 a further 0-6%. */
/* A padded build (IO_DIM below HEAD_DIM, cuda_attention.c backward_spec)
 * is the warp-specialised one adding dQ into the accumulator: the tensor
 * maps' copies fill the padding with zeros, store_tile and the rowwise
 * kernels keep to IO_DIM columns, and no other load reads the tensors. */
#if IO_DIM != HEAD_DIM && !(defined(TMA) && defined(DQ_ATOMIC))
#error "bwd_mma: a padded build (IO_DIM) is the warp-specialised one with dQ by accumulator"
#endif
#ifdef TMA
#if !defined(WGMMA) || defined(VARLEN)
#error "bwd_mma: TMA builds on WGMMA, fixed-length sequences"
#endif
#include "tma.cuh"
#define PRODUCER_THREADS 128
/* The split step (probs, dscores) where no score option asks for
 * p_and_ds's dS, and not with windows above head_dim 64 (the masked
 * halves spilled there, 8 bytes, NVRTC 13.0); dQ in turns (below) with
 * two consumer warpgroups. BWD_WHOLE_STEP and BWD_DQ_SHARED turn them
 * off. */
#if !defined(SCORE_OPTIONS) && !defined(BWD_WHOLE_STEP) && !(defined(WINDOW) && HEAD_DIM > 64) && DK_SPLIT == 1
#define BWD_SPLIT
#endif
#if WARPS == 8 && !defined(BWD_DQ_SHARED) && DK_SPLIT == 1
#define BWD_DQ_ALT
/* Above head_dim 64 the warpgroup in turn leaves its dQ tile in shared
 * memory and each of its warps adds its 16 rows to the accumulator by bulk
 * reductions, a row a lane (no per-element atomics). The rows are padded
 * by 8 floats: the fragments' 8-byte stores then fill whole wavefronts.
 * BWD_DQ_RED keeps the atomics (the tile stays allocated: fa_plan_local_mem
 * counts it for every such plan). */
#if HEAD_DIM > 64
#define DQ_STRIDE (HEAD_DIM + 8)
#ifndef BWD_DQ_RED
#define BWD_DQ_BULK
#endif
#if defined(BWD_DQ_BULK) && BR != 64
#error "bwd_mma: the bulk reductions of dQ take 64 queries a step (a warp's 16 rows)"
#endif
#endif
#endif
/* BWD_DQ_LAG (with dQ in turns and bulk reductions): the warpgroup in turn
 * adds the previous step's dQ, not this step's, so it waits for the other
 * warpgroup's dS^T of a step that one finished a step ago, where it waited
 * for the dS^T the other was computing beside it (the profile's largest
 * stall: bench/results/h100.md, 2026-11-28 third session; 0.915 -> 1.037x
 * cuDNN at d128 non-causal on an H200). A third dS^T tile: a step's is
 * read during the next and written again two steps later. The planner
 * asks for the build and counts the tile (fa_tma_bwd_dq_lag). Under a
 * causal mask too (0.94 -> 1.06x cuDNN at d128, H200, 2026-11-28 fifth
 * session), not a window. */
#if defined(BWD_DQ_LAG) && (!(defined(BWD_DQ_BULK) && defined(DQ_ATOMIC)) || defined(WINDOW))
#undef BWD_DQ_LAG
#endif
#ifdef BWD_DQ_LAG
#define DS_BUFFERS 3
#else
#define DS_BUFFERS 2
#endif
#define BLOCK_SYNC() named_sync(1, THREADS)
#if THREADS != 128 && THREADS != 256
#error "bwd_mma: TMA takes one or two consumer warpgroups (the register hand-over below)"
#endif
#if THREADS == 256
/* setmaxnreg moves registers within the block's launch allocation
 * (384 threads of 168): 128 x 24 + 256 x 240 is all of it. */
#define PRODUCER_REGS 24
#define CONSUMER_REGS 240
#else
#define PRODUCER_REGS 56
#define CONSUMER_REGS 256
#endif
#define TMA_PARAMS                                                                                          \
    , const __grid_constant__ fa_tensor_map tm_k, const __grid_constant__ fa_tensor_map tm_v,               \
        const __grid_constant__ fa_tensor_map tm_q, const __grid_constant__ fa_tensor_map tm_do
#else
#define PRODUCER_THREADS 0
#define DS_BUFFERS 1
#define BLOCK_SYNC() __syncthreads()
#define TMA_PARAMS
#endif

#ifndef BWD_DQ_BULK
#define DQ_RELEASE() ((void)0)
#endif

#if defined(DQ_ATOMIC) && !defined(WGMMA)
/* n-tiles of dQ per warp and unit: four share each dS fragment where the
 * head dimension allows. */
#if DT % 4 == 0
#define DQ_UNIT 4
#else
#define DQ_UNIT 2
#endif
/* m-tiles of dQ per unit: two share each K fragment (a third fewer shared
 * loads per product) where that still leaves a unit for every warp. */
#if KQ % 2 == 0 && (KQ / 2) * (DT / DQ_UNIT) >= WARPS
#define DQ_M 2
#else
#define DQ_M 1
#endif
#endif

#ifdef DQ_ATOMIC

/* acc += v, two neighbouring floats of the fp32 accumulator. */
FA_DEV void red_add2(float *addr, float v0, float v1) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(addr), "f"(v0), "f"(v1) : "memory");
#else
    atomicAdd(addr, v0);
    atomicAdd(addr + 1, v1);
#endif
}

/* Adds a warp's C fragments of dQ to the fp32 accumulator: 16 queries from
 * q0 + r0 (q0 the tile's first; rows past the end of the sequence are not
 * there), N n-tiles from head dimension c0 + 8 j0. c0 (a warpgroup's block
 * of columns) and j0 (a warp's unit of n-tiles) stay apart: so written,
 * both callers compile to the binaries measured before this helper
 * existed. */
template <int N>
FA_DEV void add_dq_strip(const fa_params &p, const fa_seq &seq, int b, int h, int q0, int r0, int c0, int j0,
                         const float (*acc)[4], int g, int t4) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = r0 + g + 8 * hf;
        if (r < seq.len_q - q0) {
            float *row = p.dq_acc + lse_index(p, b, h, q0 + r, seq.start_q) * HEAD_DIM + c0;
#pragma unroll
            for (int n = 0; n < N; n++) red_add2(row + 8 * (j0 + n) + 2 * t4, acc[n][2 * hf], acc[n][2 * hf + 1]);
        }
    }
}
#endif

#ifndef WGMMA
/* acc[kt][j] += A B^T over head_dim for the warp's key strips: A the
 * key-side tile (K or V, BC rows), B the query-side one (Q or dO, BR
 * rows), NJ n-tiles of it from row q_base. */
template <int NJ>
FA_DEV void keys_by_queries(float (&acc)[KT][NJ][4], u32 a_sm, u32 b_sm, int key_base, int q_base, int lane) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        u32 a[KT][AREGS];
#pragma unroll
        for (int kt = 0; kt < KT; kt++) load_a(a_sm, key_base + kt * 16, ks, a[kt], lane);
#pragma unroll
        for (int j = 0; j < NJ; j += 2) {
            u32 b0[BREGS], b1[BREGS];
            load_b2(b_sm, q_base + j * 8, ks, b0, b1, lane);
#pragma unroll
            for (int kt = 0; kt < KT; kt++) {
                mma16(acc[kt][j], a[kt], b0);
                mma16(acc[kt][j + 1], a[kt], b1);
            }
        }
    }
}
#endif

/* Dropout's keep bits of the warpgroup build: one bit a score the thread
 * holds (bit 4 j + e of n-tile j, element e), drawn while the S^T and dP^T
 * products run, so that the Philox rounds do not share the registers of
 * p_and_ds (inline there they spilled the d128 build, 32-80 bytes, NVRTC
 * 13.0). Rows and columns as p_and_ds numbers them. */
#if defined(DROPOUT) && defined(WGMMA)
#define DROP_BITS
#if KT * NQ * 4 > 32
#error "bwd_mma: the keep bits of a thread's scores must fit 32 bits"
#endif
FA_DEV u32 keep_bits(const fa_params &p, u32 bh, int q0, int k0, int k_w, int g, int t4) {
    u32 bits = 0;
#if defined(KEEP_BITS_SHARED) || !defined(CAUSAL)
    /* One Philox call covers four keys, those of the four lanes whose g
     * share a group of four (and t4): they split the calls, lane r = g & 3
     * drawing element e = r's for every n-tile and keeping the verdicts on
     * all four words as a nibble, then swap nibbles: a quarter of the
     * Philox rounds. On an H100 (d128, N 4k-8k, bench/results/h100.md) the
     * backward ran 227-234 TFLOP/s this way against 147-151 with a call a
     * score, bit-identical with the reference. Not with causal masks (the
     * d128 build spilled 8 bytes there, NVRTC 13.0) unless asked for
     * (FLASHATTN_CUDA_OPTIONS=-DKEEP_BITS_SHARED). */
    const int r = g & 3;
    const u32 col4 = (u32)k0 + (u32)(k_w + (g & ~3) + 8 * (r >> 1)), t = p.drop_threshold;
    u32 mine = 0;
#pragma unroll 1
    for (int j = 0; j < NQ; j++) {
        const uint4 w = dropout_words(p, bh, (u32)q0 + (u32)(8 * j + 2 * t4 + (r & 1)), col4);
        mine |= ((u32)(w.x >= t) | (u32)(w.y >= t) << 1 | (u32)(w.z >= t) << 2 | (u32)(w.w >= t) << 3) << (4 * j);
    }
    /* Bit r of each of e's nibbles is this lane's verdict on element e. */
#pragma unroll
    for (int e = 0; e < 4; e++)
        bits |= (__shfl_sync(0xffffffffu, mine, ((g & ~3) + e) * 4 + t4) >> r & 0x11111111u) << e;
#else
#pragma unroll 1
    for (int j = 0; j < NQ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int ql = 8 * j + 2 * t4 + (e & 1), kl = g + 8 * (e >> 1);
            bits |= (u32)dropout_keep(p, bh, (u32)q0 + (u32)ql, (u32)k0 + (u32)(k_w + kl)) << (4 * j + e);
        }
#endif
    return bits;
}
#endif

/* P = exp2(S^T * scale log2 e - L log2 e) into sacc (times z keep_scale)
 * and dS = P * (z keep_scale dP - D) into pacc, for the warp's key strips
 * (first key k0 + k_w) and the tile's queries from q0, with L (natural
 * log, as the forward stored it) and D of those queries in Lb, Db. MASKED:
 * hidden pairs give P = dS = 0, selected rather than multiplied (their S
 * or dP may be NaN); they still enter the products below as zeros, where
 * 0 times a NaN or inf in Q, K or dO is NaN (the header's last rule).
 * Rows past the end of the sequence read L = D = 0 and are hidden (the
 * dK/dV kernel's tiles count them, ROWS_FEED_KEYS). */
template <bool MASKED, int NJ>
FA_DEV void p_and_ds(float (&sacc)[KT][NJ][4], float (&pacc)[KT][NJ][4], const float *Lb, const float *Db,
                     const fa_params &p, const fa_mask &mask, const fa_score &sc, int q0, int k0, int k_w, int g,
                     int t4, float sl2, u32 bh, u32 keep) {
    (void)sc;
    (void)keep;
    (void)p;
    (void)mask;
    (void)q0;
    (void)k0;
    (void)k_w;
    (void)g;
    (void)bh;
    /* What is left of the sequences from the thread's first query and key
     * (per-tile values for the per-element test, common.cuh). */
    const int rows0 = mask.len_q - q0 - 2 * t4, keys0 = mask.len_k - k0 - (k_w + g);
    (void)rows0;
    (void)keys0;
#ifdef ALIBI
    const float dbase = alibi_dist_left(rows0, keys0);
#endif
#ifdef BIAS
    /* The bias rows of the lane's two queries of n-tile j (stepping 8 rows
     * a tile), from its first key: an element is one of them plus a
     * constant. Not read unless the element lies inside the sequence
     * (whole tiles: every element does). */
    const bias_t *brow = sc.bias + (i64)(mask.len_q - rows0) * sc.bias_ss + (mask.len_k - keys0);
    const i64 bstep = 8 * sc.bias_ss;
#endif
#pragma unroll
    for (int j = 0; j < NJ; j++) {
#ifdef BIAS
        const bias_t *brows[2] = {brow + j * bstep, brow + j * bstep + sc.bias_ss};
#endif
        /* Two neighbouring queries per thread and n-tile: one load each
         * (masked tiles, with more live state, load per element). */
        float2 l2 = make_float2(0.0f, 0.0f), d2 = l2;
        if constexpr (!MASKED) {
            l2 = *(const float2 *)(Lb + 8 * j + 2 * t4);
            d2 = *(const float2 *)(Db + 8 * j + 2 * t4);
        }
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ql = 8 * j + 2 * t4 + (e & 1), kl = kt * 16 + g + 8 * (e >> 1);
                (void)kl;
                const bool seen = !MASKED || visible_left(mask, rows0 - (8 * j + (e & 1)), keys0 - (kt * 16 + 8 * (e >> 1)));
                const float lse = MASKED ? Lb[ql] : e & 1 ? l2.y : l2.x, dq = MASKED ? Db[ql] : e & 1 ? d2.y : d2.x;
                const float lq = lse == -FA_INF ? FA_INF : lse * FA_LOG2E;
#ifdef SCORE_OPTIONS
                /* The forward's logit (score_log2), offsets from the lane's
                 * first query and key. */
                const int qo = 8 * j + (e & 1), ko = kt * 16 + 8 * (e >> 1);
                float bv = 0.0f, dist = 0.0f, t;
                (void)qo;
                (void)ko;
#ifdef BIAS
                if (!MASKED || (qo < rows0 && ko < keys0)) bv = bias_to_f32(brows[e & 1][ko]);
#endif
#ifdef ALIBI
                dist = dbase + (float)(qo - ko);
#endif
                const float pv = fa_exp2(score_log2(sc, sacc[kt][j][e], bv, dist, &t) - lq);
                const float dcap = score_dcap(t);
#else
                const float pv = fa_exp2(fmaf(sacc[kt][j][e], sl2, -lq));
                const float dcap = 1.0f;
#endif
                float z = 1.0f;
#if defined(DROP_BITS)
                z = keep >> (4 * j + e) & 1u ? p.drop_scale : 0.0f;
#elif defined(DROPOUT)
                z = dropout_keep(p, bh, (u32)q0 + (u32)ql, (u32)k0 + (u32)(k_w + kl)) ? p.drop_scale : 0.0f;
#endif
                pacc[kt][j][e] = seen ? pv * (pacc[kt][j][e] * z - dq) * dcap : 0.0f;
                sacc[kt][j][e] = seen ? pv * z : 0.0f;
            }
    }
}

#ifdef BWD_SPLIT
/* The split step (TMA builds without score options): p_and_ds in two
 * halves, so that P comes from S^T while dP^T's product still runs and
 * dV += (z P)^T dO runs while dS is formed. probs leaves P without the
 * keep factor in sacc (hidden pairs 0); dscores then takes dS = P (z
 * keep_scale dP - D) into pacc, testing visibility again rather than
 * trusting P = 0 (a visible P may underflow to 0 with a NaN dP, which
 * must give NaN, as p_and_ds gives it). */
template <bool MASKED, int NJ>
FA_DEV void probs(float (&sacc)[KT][NJ][4], const float *Lb, const fa_mask &mask, int q0, int k0, int k_w, int g,
                  int t4, float sl2) {
    (void)mask;
    const int rows0 = mask.len_q - q0 - 2 * t4, keys0 = mask.len_k - k0 - (k_w + g);
    (void)rows0;
    (void)keys0;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const float2 l2 = *(const float2 *)(Lb + 8 * j + 2 * t4);
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool seen = !MASKED || visible_left(mask, rows0 - (8 * j + (e & 1)), keys0 - (kt * 16 + 8 * (e >> 1)));
                const float lse = e & 1 ? l2.y : l2.x, lq = lse == -FA_INF ? FA_INF : lse * FA_LOG2E;
                sacc[kt][j][e] = seen ? fa_exp2(fmaf(sacc[kt][j][e], sl2, -lq)) : 0.0f;
            }
    }
}

/* The keep factor z keep_scale of score (n-tile j, element e). */
FA_DEV float keep_factor(const fa_params &p, u32 keep, int j, int e) {
    (void)p;
    (void)keep;
    (void)j;
    (void)e;
#ifdef DROP_BITS
    return keep >> (4 * j + e) & 1u ? p.drop_scale : 0.0f;
#else
    return 1.0f;
#endif
}

template <bool MASKED, int NJ>
FA_DEV void dscores(const float (&sacc)[KT][NJ][4], float (&pacc)[KT][NJ][4], const float *Db, const fa_params &p,
                    const fa_mask &mask, int q0, int k0, int k_w, int g, int t4, u32 keep) {
    (void)mask;
    const int rows0 = mask.len_q - q0 - 2 * t4, keys0 = mask.len_k - k0 - (k_w + g);
    (void)rows0;
    (void)keys0;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const float2 d2 = *(const float2 *)(Db + 8 * j + 2 * t4);
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool seen = !MASKED || visible_left(mask, rows0 - (8 * j + (e & 1)), keys0 - (kt * 16 + 8 * (e >> 1)));
                const float dq = e & 1 ? d2.y : d2.x;
                pacc[kt][j][e] = seen ? sacc[kt][j][e] * (pacc[kt][j][e] * keep_factor(p, keep, j, e) - dq) : 0.0f;
            }
    }
}
#endif


#if defined(WGMMA) && defined(DQ_ATOMIC)
/* acc = dS K over the whole key tile for dQ unit u (64 queries x DQ_N head
 * dimensions; its rows at mb * 64, columns at n0): dS^T from tile dst. */
FA_DEV void dq_unit(float (*acc)[4], u32 dst, u32 k_sm, int u, int *mb, int *n0) {
    *mb = u % (BR / 64);
    *n0 = (u / (BR / 64)) * DQ_N;
    const u32 sd = desc_lo_n_major(dst + (u32)*mb * BC * 128, BC * 128);
    const u32 kd = desc_lo_n_major(k_sm + (u32)(*n0 / 64) * BC * 128, BC * 128);
    wg_fence();
#pragma unroll
    for (int kb = 0; kb < BC / 16; kb++)
        wgmma_ss_mn<DQ_N>(acc, sw_desc_at(sd, (u32)kb * 16 * 128), sw_desc_at(kd, (u32)kb * 16 * 128), kb);
    wg_commit();
    wg_wait<0>();
    wg_hold<DQ_N / 8>(acc);
}
#endif

#if defined(BWD_DQ_BULK) && defined(DQ_ATOMIC)
/* dQ = dS K over the whole key tile, its units of 64 queries x DQ_N
 * dimensions into the dQ tile dq_st (dS^T from tile dst): the warp's rows
 * once their barrier dq_empty has completed phase parity (the other
 * warpgroup's reductions have read them). */
FA_DEV void dq_units_to_tile(u32 dst, u32 k_sm, int warp, int g, int t4, u32 dq_st, u32 dq_empty, u32 parity) {
    for (int u = 0; u < DQ_UNITS; u++) {
        float acc[DQ_N / 8][4];
        int mb, n0;
        dq_unit(acc, dst, k_sm, u, &mb, &n0);
        if (u == 0) mbar_wait(dq_empty, parity);
        /* One shared address a thread, the rest immediate offsets: the
         * consumers have no registers to spare. */
        const u32 st0 = dq_st + 4u * (u32)((mb * 64 + (warp % 4) * 16 + g) * DQ_STRIDE + n0 + 2 * t4);
#pragma unroll
        for (int j = 0; j < DQ_N / 8; j++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(st0 + 4u * (u32)(8 * hf * DQ_STRIDE + 8 * j)),
                             "f"(acc[j][2 * hf]), "f"(acc[j][2 * hf + 1])
                             : "memory");
    }
}

/* The warp's 16 rows of the dQ tile dq_st (queries from q0q of head hq),
 * one bulk reduction a lane into the accumulator. */
FA_DEV void reduce_dq_rows(const fa_params &p, const fa_seq &seq, int b, int hq, int q0q, int warp, int lane,
                           u32 dq_st) {
    fence_async_smem();
    __syncwarp();
    const int r = (warp % 4) * 16 + lane;
    if (lane < 16 && r < seq.len_q - q0q)
        bulk_reduce_add_f32(p.dq_acc + lse_index(p, b, hq, q0q + r, seq.start_q) * HEAD_DIM,
                            dq_st + 4u * (u32)(r * DQ_STRIDE), HEAD_DIM * 4);
    tma_store_commit();
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS + PRODUCER_THREADS, 1)
    fa_bwd_dkdv_mma(const fa_params p TMA_PARAMS) {
    extern __shared__ __align__(SMEM_ALIGN) unsigned char smem[];
    constexpr u32 KV_BYTES = KV_TILE_BYTES, QT_BYTES = QT_TILE_BYTES;
    /* The epilogue stages dK and dV in mma.cuh's padded layout. */
    static_assert(2 * KV_BYTES + 2 * STAGES * QT_BYTES + DS_BUFFERS * DS_TILE_BYTES + PT_TILE_BYTES >=
                      2 * TILE_BYTES(BC, HEAD_DIM * ELEM_BYTES),
                  "bwd_mma: no room for the dK and dV tiles");
    const u32 k_sm = smem_u32(smem);
#ifdef WGMMA
    /* The swizzle is on address bits: a misplaced window would read wrong
     * operands, not fail. */
    if (k_sm & (SMEM_ALIGN - 1)) __trap();
#endif
    const u32 v_sm = k_sm + KV_BYTES;
    const u32 q_sm = v_sm + KV_BYTES;
    const u32 do_sm = q_sm + STAGES * QT_BYTES;
    const u32 ds_sm = do_sm + STAGES * QT_BYTES;
    const u32 pt_sm = ds_sm + DS_BUFFERS * DS_TILE_BYTES;
    (void)pt_sm;
    float *Ls = (float *)(smem + 2 * KV_BYTES + 2 * STAGES * QT_BYTES + DS_BUFFERS * DS_TILE_BYTES + PT_TILE_BYTES);
    float *Ds = Ls + STAGES * BR;

    /* The consumers' thread index (the producer's is negative). */
    const int tid = (int)threadIdx.x - PRODUCER_THREADS, lane = (int)threadIdx.x & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int tk = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const fa_seq seq = seq_of(p, b);
    const int k0 = tk * BC;
    if (k0 >= seq.len_k) return;
    const fa_mask mask = mask_of(p, seq);
    const float sl2 = SCORE_SL2(p);
    /* The warp's key strips and its share of the queries (S^T, dP^T) and
     * of the head dimensions (dK, dV). */
    const int key_base = (DK_SPLIT > 1 ? warp % KEY_WARPS : warp) * KT * 16;
    /* 0 at compile time where warps do not share strips: the unsplit
     * kernels keep the registers they had. */
#ifdef BWD_SPLIT_BY_PRODUCT
    const int part = warp / KEY_WARPS, q_part = part * NQW * 8, j_part = 0;
    (void)j_part;
#else
    const int part = DK_SPLIT > 1 ? warp / KEY_WARPS : 0, q_part = part * NQW * 8, j_part = part * DTW;
#endif
    (void)q_part;

    int r_lo, r_hi, t_begin, t_end;
    query_range(mask, k0, tile_last(k0, BC, seq.len_k), &r_lo, &r_hi);
    tile_span(r_lo, r_hi, BR, &t_begin, &t_end);

    /* The (query head, query tile) steps, in order; the query range and the
     * tile map do not depend on the head. */
    int hh = 0, tq = next_query_tile(p, tk, t_begin, t_end);
    if (tq >= t_end) hh = p.group;

#ifdef TMA
    const u32 bars = smem_u32(Ds + STAGES * BR);
#define KV_FULL bars
#define FULL(s) (bars + 8u * (1u + (u32)(s)))
#define EMPTY(s) (bars + 8u * (1u + STAGES + (u32)(s)))
/* Per consumer warp's 16 rows of the dQ tile: each of its lanes has seen
 * its reductions read them (the other warpgroup's warp of the same rows
 * writes them next). */
#define DQ_EMPTY(w) (bars + 8u * (1u + 2u * STAGES + (u32)(w)))
#ifdef DQ_STRIDE
    /* After the barriers, 16-byte aligned, at an offset fixed at compile
     * time (the block's window is 1024-byte aligned). */
    constexpr u32 DQ_TILE = (2 * KV_BYTES + 2 * STAGES * QT_BYTES + DS_BUFFERS * DS_TILE_BYTES + PT_TILE_BYTES +
                             4 * 2 * STAGES * BR + 8 * (5 + 2 * STAGES) + 15) &
                            ~15u;
    const u32 dq_st = k_sm + DQ_TILE;
#endif
    if (threadIdx.x == 0) {
        mbar_init(KV_FULL, 1);
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(FULL(s), 33);
            /* The stage's empty barrier and (below) the dQ rows' count one
             * arrival a consumer thread, each after its own reads. One
             * lane's arrival for its warp after __syncwarp was as fast (H200,
             * bench/results/h200.md) and as correct, but compute-sanitizer's
             * racecheck follows a thread's own arrival only
             * (bench/probes/mbarrier_racecheck.cu, "warp") and reported
             * every refill as a race. */
            mbar_init(EMPTY(s), THREADS);
        }
#pragma unroll
        for (int w = 0; w < 4; w++) mbar_init(DQ_EMPTY(w), 32);
        mbar_init_fence();
    }
    __syncthreads();
    if (tid < 0) {
        /* The producer: its warp 0 alone. */
        regs_shrink<PRODUCER_REGS>();
        if (threadIdx.x >= 32) return;
        if (lane == 0) {
            tma_prefetch_map(&tm_q);
            tma_prefetch_map(&tm_do);
            mbar_expect_tx(KV_FULL, 2 * KV_BYTES);
#pragma unroll
            for (int cb = 0; cb < SW_LINES; cb++) {
                tma_load(k_sm + cb * BC * 128, &tm_k, cb * 64, k0, hk, b, KV_FULL);
                tma_load(v_sm + cb * BC * 128, &tm_v, cb * 64, k0, hk, b, KV_FULL);
            }
        }
        int s = 0;
        u32 ph = 0;
        for (int ph_h = hh, ph_t = tq; ph_h < p.group;) {
            const int h_ = hk * p.group + ph_h, q0_ = ph_t * BR;
            mbar_wait(EMPTY(s), ph ^ 1u);
            if (lane == 0) {
                mbar_expect_tx(FULL(s), 2 * QT_BYTES);
#pragma unroll
                for (int cb = 0; cb < SW_LINES; cb++) {
                    tma_load(q_sm + (u32)s * QT_BYTES + cb * BR * 128, &tm_q, cb * 64, q0_, h_, b, FULL(s));
                    tma_load(do_sm + (u32)s * QT_BYTES + cb * BR * 128, &tm_do, cb * 64, q0_, h_, b, FULL(s));
                }
            }
            for (int i = lane; i < BR; i += 32) {
                const bool ok = i < seq.len_q - q0_;
                const i64 li = ok ? lse_index(p, b, h_, q0_ + i, seq.start_q) : 0;
                Ls[s * BR + i] = ok ? p.lse[li] : 0.0f;
                Ds[s * BR + i] = ok ? p.dvec[li] : 0.0f;
            }
            mbar_arrive(FULL(s));
            ph_t = next_query_tile(p, tk, ph_t + 1, t_end);
            if (ph_t >= t_end) {
                ph_h++;
                ph_t = next_query_tile(p, tk, t_begin, t_end);
            }
            if (++s == STAGES) {
                s = 0;
                ph ^= 1u;
            }
        }
        return;
    }
    regs_grow<CONSUMER_REGS>();
    mbar_wait(KV_FULL, 0);
    u32 phase = 0, nstep = 0;
    int dsb = 0; /* the dS^T tile of this step */
    (void)nstep;
#ifdef BWD_DQ_LAG
    /* The last step, as (head in the group) * t_end + query tile: its dQ is
     * added during this step, from the dS^T tile before this step's. One
     * register where two spilled under a causal mask (NVRTC 13.0); the
     * planner takes the lag only where the product fits an int
     * (fa_tma_bwd_dq_lag). */
    int lag_step = 0;
#define LAG_H (hk * p.group + lag_step / t_end)
#define LAG_Q0 (lag_step % t_end * BR)
#define LAG_DSC (ds_sm + (u32)(dsb == 0 ? DS_BUFFERS - 1 : dsb - 1) * DS_TILE_BYTES)
#endif
#ifdef BWD_DQ_BULK
    bool dq_reading = false; /* this warp's last reductions may still read its rows */
/* While a step's first products run: the rows this warp left for the
 * reductions last time are read by now, or soon; the other warpgroup's
 * warp of the same rows may refill them. */
#define DQ_RELEASE()                                                                                               \
    do {                                                                                                           \
        if (dq_reading) {                                                                                          \
            tma_store_wait_read();                                                                                 \
            mbar_arrive(DQ_EMPTY(warp % 4));                                                                       \
            dq_reading = false;                                                                                    \
        }                                                                                                          \
    } while (0)
#endif
#else
    LOAD_TILE(BC)(k_sm, (const elem_t *)p.k + K_ROW(p, b, seq, k0, hk), p.k_ss, seq.len_k - k0, tid);
    LOAD_TILE(BC)(v_sm, (const elem_t *)p.v + V_ROW(p, b, seq, k0, hk), p.v_ss, seq.len_k - k0, tid);

/* Queue the loads of step (hh, tq) into buffer st. */
#define LOAD_STEP(HH, TQ, ST)                                                                          \
    do {                                                                                               \
        const int h_ = hk * p.group + (HH), q0_ = (TQ) * BR;                                           \
        LOAD_TILE(BR)(q_sm + (ST) * QT_BYTES, (const elem_t *)p.q + Q_ROW(p, b, seq, q0_, h_), p.q_ss,   \
                      seq.len_q - q0_, tid);                                                           \
        LOAD_TILE(BR)(do_sm + (ST) * QT_BYTES, (const elem_t *)p.dout + O_ROW(p, b, seq, q0_, h_), p.o_ss, \
                      seq.len_q - q0_, tid);                                                           \
        for (int i_ = tid; i_ < BR; i_ += THREADS) {                                                   \
            const bool ok_ = i_ < seq.len_q - q0_;                                                     \
            const i64 li_ = ok_ ? lse_index(p, b, h_, q0_ + i_, seq.start_q) : 0;                      \
            cp_async4(smem_u32(Ls + (ST) * BR + i_), p.lse + li_, ok_ ? 4 : 0);                        \
            cp_async4(smem_u32(Ds + (ST) * BR + i_), p.dvec + li_, ok_ ? 4 : 0);                       \
        }                                                                                              \
    } while (0)

    if (hh < p.group) LOAD_STEP(hh, tq, 0);
    cp_async_commit();
    const int dsb = 0;
#endif
#ifdef BIAS
    if (hh < p.group) bias_prefetch<BR, BC, THREADS>(p, mask, b, hk * p.group + hh, tq * BR, k0, tid);
#endif

    float dk[KT][DTW][4], dv[KT][DTW][4];
#pragma unroll
    for (int kt = 0; kt < KT; kt++)
#pragma unroll
        for (int j = 0; j < DTW; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[kt][j][e] = dv[kt][j][e] = 0.0f;

    int st = 0;
    while (hh < p.group) {
        const int h = hk * p.group + hh, q0 = tq * BR, cur_t = tq;
        /* The next step. */
        tq = next_query_tile(p, tk, tq + 1, t_end);
        if (tq >= t_end) {
            hh++;
            tq = next_query_tile(p, tk, t_begin, t_end);
        }
        const bool more = hh < p.group;
#ifdef BIAS
        /* The next step's bias into L2 while this one computes. */
        if (more) bias_prefetch<BR, BC, THREADS>(p, mask, b, hk * p.group + hh, tq * BR, k0, tid);
#endif
#ifdef TMA
        mbar_wait(FULL(st), phase);
#else
#if STAGES == 2
        if (more) LOAD_STEP(hh, tq, st ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
#else
        cp_async_wait<0>();
#endif
        FENCE_ASYNC_SMEM();
        __syncthreads();
#endif
        const u32 dsc = ds_sm + (u32)dsb * DS_TILE_BYTES; /* this step's dS^T */
        (void)dsc;
        const u32 qb = q_sm + (u32)st * QT_BYTES, ob = do_sm + (u32)st * QT_BYTES;
        const float *Lb = Ls + st * BR, *Db = Ds + st * BR;

#ifdef DROPOUT
        const u32 bh = (u32)b * (u32)p.heads_q + (u32)h;
#else
        const u32 bh = 0;
#endif
        const fa_score sc = score_of(p, b, h);
        u32 keep = 0;
        /* S^T = K Q^T and dP^T = V dO^T */
        float sacc[KT][NQW][4], pacc[KT][NQW][4];
#ifdef BWD_SPLIT
        u32 ap[KT][KQ][AREGS], as[KT][KQ][AREGS];
        {
            const u32 wg_rows = (u32)(warp / 4) * 64 * 128;
            const u32 kd = desc_fresh(desc_lo_k_major(k_sm + wg_rows)), vd = desc_fresh(desc_lo_k_major(v_sm + wg_rows));
            const u32 qd = desc_lo_k_major(qb), od = desc_lo_k_major(ob);
            wg_fence();
            wg_rows_by_rows<BR, BC>(sacc[0], kd, qd);
            wg_commit();
            wg_rows_by_rows<BR, BC>(pacc[0], vd, od);
            wg_commit();
#ifdef DROP_BITS
            keep = keep_bits(p, bh, q0, k0, key_base, g, t4);
#endif
            DQ_RELEASE();
            wg_wait<1>();
            wg_hold<NQ>(sacc[0]);
        }
        const bool full = tile_full(p, mask, cur_t, tk, q0, k0, BR, BC, ROWS_FEED_KEYS);
        if (full)
            probs<false>(sacc, Lb, mask, q0, k0, key_base, g, t4, sl2);
        else
            probs<true>(sacc, Lb, mask, q0, k0, key_base, g, t4, sl2);
#pragma unroll
        for (int kq = 0; kq < KQ; kq++) {
            float z0[4], z1[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                z0[e] = sacc[0][2 * kq][e] * keep_factor(p, keep, 2 * kq, e);
                z1[e] = sacc[0][2 * kq + 1][e] * keep_factor(p, keep, 2 * kq + 1, e);
            }
            c_to_a(z0, z1, ap[0][kq]);
        }
        wg_wait<0>();
        wg_hold<NQ>(pacc[0]);
        const u32 od_n = desc_lo_n_major(ob, BR * 128), qd_n = desc_lo_n_major(qb, BR * 128);
        wg_fence();
        wg_regs_by_rows<KQ>(dv[0], ap[0], od_n); /* dV += (z P)^T dO */
        wg_commit();
        if (full)
            dscores<false>(sacc, pacc, Db, p, mask, q0, k0, key_base, g, t4, keep);
        else
            dscores<true>(sacc, pacc, Db, p, mask, q0, k0, key_base, g, t4, keep);
#ifdef DQ_ATOMIC
#pragma unroll
        for (int j = 0; j < NQ; j++) store_c_sw<BC>(smem + (dsc - k_sm), key_base, j, pacc[0][j], lane);
#endif
#pragma unroll
        for (int kq = 0; kq < KQ; kq++) c_to_a(pacc[0][2 * kq], pacc[0][2 * kq + 1], as[0][kq]);
        wg_fence();
        wg_regs_by_rows<KQ>(dk[0], as[0], qd_n); /* dK += dS^T Q */
        wg_commit();
        (void)sc;
#elif defined(WGMMA)
        {
            /* The warpgroup's 64 keys of K and V against the tile's
             * queries (with DK_SPLIT: all 64 keys against its share of the
             * queries); each first product overwrites. */
            const u32 wg_rows = DK_SPLIT > 1 ? 0u : (u32)(warp / 4) * 64 * 128;
            const u32 kd = desc_fresh(desc_lo_k_major(k_sm + wg_rows)), vd = desc_fresh(desc_lo_k_major(v_sm + wg_rows));
            const u32 qd = desc_lo_k_major(qb + (u32)q_part * 128), od = desc_lo_k_major(ob + (u32)q_part * 128);
            wg_fence();
            wg_rows_by_rows<NQW * 8, BC, BR>(sacc[0], kd, qd);
            wg_rows_by_rows<NQW * 8, BC, BR>(pacc[0], vd, od);
            wg_commit();
#ifdef DROP_BITS
            keep = keep_bits(p, bh, q0, k0, key_base, g, t4);
#endif
            DQ_RELEASE();
            wg_wait<0>();
            wg_hold<NQW>(sacc[0]);
            wg_hold<NQW>(pacc[0]);
        }
#else
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int j = 0; j < NQW; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) sacc[kt][j][e] = pacc[kt][j][e] = 0.0f;
        /* One product after the other: the operand fragments of only one
         * are live at a time (registers are this kernel's limit). */
        keys_by_queries(sacc, k_sm, qb, key_base, q_part, lane); /* S^T = K Q^T */
        keys_by_queries(pacc, v_sm, ob, key_base, q_part, lane); /* dP^T = V dO^T */
#endif

#ifndef BWD_SPLIT
        /* P and dS, element by element; whole tiles test no element. */
        if (tile_full(p, mask, cur_t, tk, q0, k0, BR, BC, ROWS_FEED_KEYS))
            p_and_ds<false>(sacc, pacc, Lb + q_part, Db + q_part, p, mask, sc, q0 + q_part, k0, key_base, g, t4, sl2,
                            bh, keep);
        else
            p_and_ds<true>(sacc, pacc, Lb + q_part, Db + q_part, p, mask, sc, q0 + q_part, k0, key_base, g, t4, sl2,
                           bh, keep);
#endif

#if DK_SPLIT > 1 && defined(WGMMA)
        {
            /* The warpgroup's queries of P^T and dS^T into this step's
             * swizzled tiles (each alternates, as dS^T does, so one meeting
             * a step orders them), then each warpgroup's half of the head
             * dimensions: dV += P^T dO and dK += dS^T Q over all the
             * step's queries, from shared memory; dQ += dS K over its
             * units. */
            const u32 ptc = pt_sm + (u32)dsb * DS_TILE_BYTES;
#pragma unroll
            for (int j = 0; j < NQW; j++) {
                store_c_sw<BC>(smem + (ptc - k_sm), key_base, q_part / 8 + j, sacc[0][j], lane);
                store_c_sw<BC>(smem + (dsc - k_sm), key_base, q_part / 8 + j, pacc[0][j], lane);
            }
            FENCE_ASYNC_SMEM();
            BLOCK_SYNC();
#ifdef BWD_SPLIT_BY_PRODUCT
            /* dV += P^T dO in the first warpgroup, dK += dS^T Q in the
             * second, into dv: the operands chosen by data, one product
             * shape, no branch. */
            const u32 ad = desc_lo_k_major(part ? dsc : ptc), bd = desc_lo_n_major(part ? qb : ob, BR * 128);
            wg_fence();
#pragma unroll
            for (int kq = 0; kq < KQ; kq++)
                wgmma_ss_kn<HEAD_DIM>(dv[0], sw_desc_at(ad, k_step_off<BC>(kq)), sw_desc_at(bd, (u32)kq * 16 * 128),
                                      1);
            wg_commit();
#else
            const u32 cols = (u32)part * (HEAD_DIM / DK_SPLIT / 64) * BR * 128;
            const u32 pd = desc_lo_k_major(ptc), sd = desc_lo_k_major(dsc);
            const u32 od_n = desc_lo_n_major(ob + cols, BR * 128), qd_n = desc_lo_n_major(qb + cols, BR * 128);
            wg_fence();
#pragma unroll
            for (int kq = 0; kq < KQ; kq++) {
                wgmma_ss_kn<HEAD_DIM / DK_SPLIT>(dv[0], sw_desc_at(pd, k_step_off<BC>(kq)),
                                                 sw_desc_at(od_n, (u32)kq * 16 * 128), 1);
                wgmma_ss_kn<HEAD_DIM / DK_SPLIT>(dk[0], sw_desc_at(sd, k_step_off<BC>(kq)),
                                                 sw_desc_at(qd_n, (u32)kq * 16 * 128), 1);
            }
            wg_commit();
#endif
#ifdef DQ_ATOMIC
            for (int u = part; u < DQ_UNITS; u += DK_SPLIT) {
                float acc[DQ_N / 8][4];
                int mb, n0;
                dq_unit(acc, dsc, k_sm, u, &mb, &n0);
                add_dq_strip<DQ_N / 8>(p, seq, b, h, q0, mb * 64 + (warp % 4) * 16, n0, 0, acc, g, t4);
            }
#endif
            wg_wait<0>();
            wg_hold<DTW>(dv[0]);
#ifndef BWD_SPLIT_BY_PRODUCT
            wg_hold<DTW>(dk[0]);
#endif
            (void)sc;
            (void)h;
        }
#elif DK_SPLIT > 1
        /* The warp's queries of (z keep_scale) P^T and dS^T into shared
         * memory, rounded as c_to_a rounds them: the products below (and
         * dQ += dS K) read whole strips, every part of them. */
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int j = 0; j < NQW; j++) {
                store_c<DS_CHUNKS>(smem + (pt_sm - k_sm), key_base + kt * 16, q_part / 8 + j, sacc[kt][j], lane);
                store_c<DS_CHUNKS>(smem + (ds_sm - k_sm), key_base + kt * 16, q_part / 8 + j, pacc[kt][j], lane);
            }
        __syncthreads();

        /* dV += (z P)^T dO and dK += dS^T Q over the warp's head
         * dimensions, k over the tile's queries. */
#pragma unroll
        for (int kq = 0; kq < KQ; kq++) {
            u32 ap[KT][AREGS], as[KT][AREGS];
#pragma unroll
            for (int kt = 0; kt < KT; kt++) {
                load_a<DS_CHUNKS>(pt_sm, key_base + kt * 16, kq, ap[kt], lane);
                load_a<DS_CHUNKS>(ds_sm, key_base + kt * 16, kq, as[kt], lane);
            }
#pragma unroll
            for (int j = 0; j < DTW; j += 2) {
                u32 b0[BREGS], b1[BREGS];
                load_bt2(ob, kq, j_part + j, b0, b1, lane);
#pragma unroll
                for (int kt = 0; kt < KT; kt++) {
                    mma16(dv[kt][j], ap[kt], b0);
                    mma16(dv[kt][j + 1], ap[kt], b1);
                }
                load_bt2(qb, kq, j_part + j, b0, b1, lane);
#pragma unroll
                for (int kt = 0; kt < KT; kt++) {
                    mma16(dk[kt][j], as[kt], b0);
                    mma16(dk[kt][j + 1], as[kt], b1);
                }
            }
        }
#else /* DK_SPLIT == 1 */
#ifndef BWD_SPLIT
#ifdef DQ_ATOMIC
        /* dS^T into shared memory for dQ += dS K below, before the floats
         * are packed into operands and die. */
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int j = 0; j < NQ; j++)
#ifdef WGMMA
                store_c_sw<BC>(smem + (dsc - k_sm), key_base + kt * 16, j, pacc[kt][j], lane);
#else
                store_c<DS_CHUNKS>(smem + (ds_sm - k_sm), key_base + kt * 16, j, pacc[kt][j], lane);
#endif
#endif
        /* P and dS as operands, all at once: in fp16/bf16 that halves the
         * registers they hold through the products (this kernel's limit). */
        u32 ap[KT][KQ][AREGS], as[KT][KQ][AREGS];
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int kq = 0; kq < KQ; kq++) {
                c_to_a(sacc[kt][2 * kq], sacc[kt][2 * kq + 1], ap[kt][kq]);
                c_to_a(pacc[kt][2 * kq], pacc[kt][2 * kq + 1], as[kt][kq]);
            }

        /* dV += (z P)^T dO and dK += dS^T Q, k over the tile's queries. */
#ifdef WGMMA
        {
            const u32 od = desc_lo_n_major(ob, BR * 128), qd = desc_lo_n_major(qb, BR * 128);
            wg_fence();
            wg_regs_by_rows<KQ>(dv[0], ap[0], od);
            wg_regs_by_rows<KQ>(dk[0], as[0], qd);
            wg_commit();
        }
#endif
#endif /* !BWD_SPLIT */
#ifdef WGMMA
#ifdef DQ_ATOMIC
        /* dQ += dS K over the whole key tile: every warp's dS^T is in. The
         * units of 64 queries x DQ_N dimensions go round the warpgroups. */
        FENCE_ASYNC_SMEM();
#ifdef BWD_DQ_ALT
        /* One warpgroup a step takes all of dQ, the two in turns; the other
         * only announces its dS^T and goes on to its next step, so the two
         * drift apart and one's softmax runs beside the other's products.
         * A barrier of its own a step parity: the warpgroup ahead cannot
         * complete this step's barrier with its arrival at the next. Its
         * dS^T tile is the one read two steps back, whose reader has passed
         * the meeting of the step between. With BWD_DQ_LAG the warpgroup in
         * turn waits for the other's announcement of the last step, adds
         * that step's dQ, then announces its own dS^T (and that it has read
         * the last step's tile, which the other writes again next). */
#ifdef BWD_DQ_LAG
        const bool dq_mine = warp / 4 == (int)(nstep & 1u), dq_now = dq_mine && nstep > 0;
        if (dq_now) named_sync(2 + (int)((nstep - 1u) & 1u), THREADS);
#else
        const bool dq_mine = warp / 4 == dsb, dq_now = dq_mine;
        if (dq_mine)
            named_sync(2 + dsb, THREADS);
        else
            named_arrive(2 + dsb, THREADS);
#endif
#ifdef BWD_DQ_BULK
        if (dq_now) {
            /* dV and dK done first: their P and dS operands then die, which
             * the dQ tile's stores need (spills otherwise, NVRTC 13.0). */
            wg_wait<0>();
            wg_hold<DT>(dv[0]);
            wg_hold<DT>(dk[0]);
            wg_keep<KQ>(ap[0]);
            wg_keep<KQ>(as[0]);
#ifdef BWD_DQ_LAG
            dq_units_to_tile(LAG_DSC, k_sm, warp, g, t4, dq_st, DQ_EMPTY(warp % 4), nstep & 1u);
            reduce_dq_rows(p, seq, b, LAG_H, LAG_Q0, warp, lane, dq_st);
#else
            dq_units_to_tile(dsc, k_sm, warp, g, t4, dq_st, DQ_EMPTY(warp % 4), (nstep & 1u) ^ 1u);
            reduce_dq_rows(p, seq, b, h, q0, warp, lane, dq_st);
#endif
            dq_reading = true;
        }
#ifdef BWD_DQ_LAG
        if (dq_mine) named_arrive(2 + (int)(nstep & 1u), THREADS);
        lag_step = (h - hk * p.group) * t_end + cur_t;
#endif
#else
        for (int u = dq_now ? 0 : DQ_UNITS; u < DQ_UNITS; u++) {
#endif
#else
        BLOCK_SYNC();
        for (int u = warp / 4; u < DQ_UNITS; u += WARPS / 4) {
#endif
#ifndef BWD_DQ_BULK
            float acc[DQ_N / 8][4];
            int mb, n0;
            dq_unit(acc, dsc, k_sm, u, &mb, &n0);
            add_dq_strip<DQ_N / 8>(p, seq, b, h, q0, mb * 64 + (warp % 4) * 16, n0, 0, acc, g, t4);
        }
#endif
#endif
        wg_wait<0>();
        wg_hold<DT>(dv[0]);
        wg_hold<DT>(dk[0]);
        wg_keep<KQ>(ap[0]);
        wg_keep<KQ>(as[0]);
        (void)h;
#else
#pragma unroll
        for (int kq = 0; kq < KQ; kq++) {
#pragma unroll
            for (int j = 0; j < DT; j += 2) {
                u32 b0[BREGS], b1[BREGS];
                load_bt2(ob, kq, j, b0, b1, lane);
#pragma unroll
                for (int kt = 0; kt < KT; kt++) {
                    mma16(dv[kt][j], ap[kt][kq], b0);
                    mma16(dv[kt][j + 1], ap[kt][kq], b1);
                }
                load_bt2(qb, kq, j, b0, b1, lane);
#pragma unroll
                for (int kt = 0; kt < KT; kt++) {
                    mma16(dk[kt][j], as[kt][kq], b0);
                    mma16(dk[kt][j + 1], as[kt][kq], b1);
                }
            }
        }

#endif /* WGMMA */
#endif /* DK_SPLIT */

#if defined(DQ_ATOMIC) && !defined(WGMMA)
        /* dQ += dS K: each warp takes units of (16 DQ_M queries x 8 DQ_UNIT
         * dims) of the tile's dQ and adds them to the accumulator. */
        __syncthreads();
        for (int u = warp; u < (KQ / DQ_M) * (DT / DQ_UNIT); u += WARPS) {
            const int mq = (u % (KQ / DQ_M)) * DQ_M, j0 = (u / (KQ / DQ_M)) * DQ_UNIT;
            float acc[DQ_M][DQ_UNIT][4];
#pragma unroll
            for (int m = 0; m < DQ_M; m++)
#pragma unroll
                for (int n = 0; n < DQ_UNIT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[m][n][e] = 0.0f;
#pragma unroll
            for (int kb = 0; kb < BC / 16; kb++) {
                u32 a[DQ_M][AREGS];
#pragma unroll
                for (int m = 0; m < DQ_M; m++) load_at<DS_CHUNKS>(ds_sm, (mq + m) * 16, kb, a[m], lane);
#pragma unroll
                for (int n = 0; n < DQ_UNIT; n += 2) {
                    u32 b0[BREGS], b1[BREGS];
                    load_bt2(k_sm, kb, j0 + n, b0, b1, lane);
#pragma unroll
                    for (int m = 0; m < DQ_M; m++) {
                        mma16(acc[m][n], a[m], b0);
                        mma16(acc[m][n + 1], a[m], b1);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < DQ_M; m++) add_dq_strip<DQ_UNIT>(p, seq, b, h, q0, (mq + m) * 16, 0, j0, acc[m], g, t4);
        }
#elif !defined(DQ_ATOMIC)
        (void)ds_sm;
        (void)h;
#endif
#ifdef TMA
        /* This thread's products and its reads of L and D are done with
         * the stage (the producer refills the rows); the dS^T tiles take
         * turns, so only the meetings around dQ order them. */
        mbar_arrive(EMPTY(st));
        if (++st == STAGES) {
            st = 0;
            phase ^= 1u;
        }
#if DS_BUFFERS == 3
        dsb = dsb == 2 ? 0 : dsb + 1;
#else
        dsb ^= DS_BUFFERS - 1;
#endif
        nstep++;
        (void)more;
    }
#if defined(BWD_DQ_ALT) && !defined(BWD_DQ_LAG)
    /* An odd walk ends with one more, empty turn on the other barrier, so
     * that every block ends its walk as an even one does. Without it,
     * compute-sanitizer's racecheck reported the epilogue's dK tile (written
     * before, read after the meeting at barrier 1 that all 256 consumers
     * run) in the blocks whose walk is odd, hundreds of thousands of times
     * at d64 (N 1536, causal); with it, 0 hazards, at no measurable cost
     * (bench/results/h200.md, twelfth session). */
    if (nstep & 1u) {
        if (warp / 4 == dsb)
            named_sync(2 + dsb, THREADS);
        else
            named_arrive(2 + dsb, THREADS);
    }
#endif
#ifdef BWD_DQ_LAG
    /* The last step's dQ, by the warpgroup whose turn the next step would
     * be, once the other has released the dQ tile's rows. */
    DQ_RELEASE();
    if (nstep > 0 && warp / 4 == (int)(nstep & 1u)) {
        named_sync(2 + (int)((nstep - 1u) & 1u), THREADS);
        dq_units_to_tile(LAG_DSC, k_sm, warp, g, t4, dq_st, DQ_EMPTY(warp % 4), nstep & 1u);
        reduce_dq_rows(p, seq, b, LAG_H, LAG_Q0, warp, lane, dq_st);
    }
#endif
#ifdef BWD_DQ_BULK
    /* The last reductions complete before the block ends. */
    bulk_wait_all();
#endif
#else
        __syncthreads(); /* the buffers of this step may be refilled */
#if STAGES == 2
        st ^= 1;
#else
        if (more) LOAD_STEP(hh, tq, 0);
        cp_async_commit();
#endif
    }
    cp_async_wait<0>();
#endif
#undef LOAD_STEP
    BLOCK_SYNC();

    /* dK (scaled) and dV through padded tiles over K and V, then 16-byte
     * stores. */
    unsigned char *k_tile = smem, *v_tile = smem + TILE_BYTES(BC, HEAD_DIM * ELEM_BYTES);
#pragma unroll
    for (int kt = 0; kt < KT; kt++)
#pragma unroll
        for (int j = 0; j < DTW; j++) {
#ifdef BWD_SPLIT_BY_PRODUCT
            /* dv holds the first warpgroup's dV, the second's dK. */
            float sv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) sv[e] = part ? dv[kt][j][e] * p.scale : dv[kt][j][e];
            store_c(part ? k_tile : v_tile, key_base + kt * 16, j, sv, lane);
            (void)dk;
#else
            float sk[4];
#pragma unroll
            for (int e = 0; e < 4; e++) sk[e] = dk[kt][j][e] * p.scale;
            store_c(k_tile, key_base + kt * 16, j_part + j, sk, lane);
            store_c(v_tile, key_base + kt * 16, j_part + j, dv[kt][j], lane);
#endif
        }
    BLOCK_SYNC();
    store_tile<BC, THREADS>((elem_t *)p.dk + K_ROW(p, b, seq, k0, hk), p.k_ss, k_tile, seq.len_k - k0, tid);
    store_tile<BC, THREADS>((elem_t *)p.dv + V_ROW(p, b, seq, k0, hk), p.v_ss, v_tile, seq.len_k - k0, tid);
}

#ifndef DQ_ATOMIC
/* ------------------------------------------------------------------------ */
/* dQ without atomics: one block per (query tile, query head, sequence).      */
/* Shared memory: Qs, dOs [DQ_BR x HEAD_DIM], Ks, Vs [DQ_BC x HEAD_DIM].      */
/* (TILE_BYTES each).                                                        */

#define DQ_THREADS (DQ_WARPS * 32)
#define DQ_MT (DQ_BR / (16 * DQ_WARPS))
#define DQ_NT (DQ_BC / 8)
#define DQ_KP (DQ_BC / 16)

#if DQ_BR % (16 * DQ_WARPS) != 0 || DQ_BC % 16 != 0
#error "bwd_mma: DQ_BR must be a multiple of 16 * DQ_WARPS, DQ_BC of 16"
#endif

extern "C" __global__ void __launch_bounds__(DQ_THREADS, 1) fa_bwd_dq_mma(const fa_params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr u32 QT_BYTES = TILE_BYTES(DQ_BR, HEAD_DIM * ELEM_BYTES), KV_BYTES = TILE_BYTES(DQ_BC, HEAD_DIM * ELEM_BYTES);
    const u32 q_sm = smem_u32(smem), do_sm = q_sm + QT_BYTES, k_sm = do_sm + QT_BYTES, v_sm = k_sm + KV_BYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    int tq = blockIdx.x;
#ifdef CAUSAL
    tq = (int)gridDim.x - 1 - tq;
#endif
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
    const fa_seq seq = seq_of(p, b);
    const int q0 = tq * DQ_BR;
    if (q0 >= seq.len_q) return;
    const fa_mask mask = mask_of(p, seq);
    const float sl2 = SCORE_SL2(p);
    const int row_base = warp * DQ_MT * 16;
#ifdef DROPOUT
    const u32 bh = (u32)b * (u32)p.heads_q + (u32)h;
#endif
#ifdef SCORE_OPTIONS
    const fa_score sc = score_of(p, b, h);
    (void)sl2;
#endif

    /* L (in log2 units, +inf for rows without keys or past the end) and D
     * of the thread's rows. */
    float l2[DQ_MT][2], dd[DQ_MT][2];
#pragma unroll
    for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = row_base + mt * 16 + g + 8 * hf;
            l2[mt][hf] = FA_INF;
            dd[mt][hf] = 0.0f;
            if (r < seq.len_q - q0) {
                const i64 li = lse_index(p, b, h, q0 + r, seq.start_q);
                const float lv = p.lse[li];
                l2[mt][hf] = lv == -FA_INF ? FA_INF : lv * FA_LOG2E;
                dd[mt][hf] = p.dvec[li];
            }
        }

    const elem_t *kg = (const elem_t *)p.k + K_ROW(p, b, seq, 0, hk);
    const elem_t *vg = (const elem_t *)p.v + V_ROW(p, b, seq, 0, hk);
    load_tile_async<DQ_BR, DQ_THREADS>(q_sm, (const elem_t *)p.q + Q_ROW(p, b, seq, q0, h), p.q_ss,
                                       seq.len_q - q0, tid);
    load_tile_async<DQ_BR, DQ_THREADS>(do_sm, (const elem_t *)p.dout + O_ROW(p, b, seq, q0, h), p.o_ss,
                                       seq.len_q - q0, tid);
    cp_async_commit();

    int k_lo, k_hi, t_begin, t_end;
    key_range(mask, q0, tile_last(q0, DQ_BR, seq.len_q), &k_lo, &k_hi);
    tile_span(k_lo, k_hi, DQ_BC, &t_begin, &t_end);

    float acc[DQ_MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
        for (int j = 0; j < DT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][j][e] = 0.0f;

    for (int t = next_key_tile(p, tq, t_begin, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
        const int k0 = t * DQ_BC;
#ifdef BIAS
        bias_prefetch<DQ_BR, DQ_BC, DQ_THREADS>(p, mask, b, h, q0, k0, tid);
#endif
        load_tile_async<DQ_BC, DQ_THREADS>(k_sm, kg + (i64)k0 * p.k_ss, p.k_ss, seq.len_k - k0, tid);
        load_tile_async<DQ_BC, DQ_THREADS>(v_sm, vg + (i64)k0 * p.v_ss, p.v_ss, seq.len_k - k0, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();

        float s[DQ_MT][DQ_NT][4], dp[DQ_MT][DQ_NT][4];
#pragma unroll
        for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
            for (int j = 0; j < DQ_NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][j][e] = dp[mt][j][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            u32 aq[DQ_MT][AREGS], ao[DQ_MT][AREGS];
#pragma unroll
            for (int mt = 0; mt < DQ_MT; mt++) {
                load_a(q_sm, row_base + mt * 16, ks, aq[mt], lane);
                load_a(do_sm, row_base + mt * 16, ks, ao[mt], lane);
            }
#pragma unroll
            for (int j = 0; j < DQ_NT; j += 2) {
                u32 b0[BREGS], b1[BREGS];
                load_b2(k_sm, j * 8, ks, b0, b1, lane);
#pragma unroll
                for (int mt = 0; mt < DQ_MT; mt++) {
                    mma16(s[mt][j], aq[mt], b0);
                    mma16(s[mt][j + 1], aq[mt], b1);
                }
                load_b2(v_sm, j * 8, ks, b0, b1, lane);
#pragma unroll
                for (int mt = 0; mt < DQ_MT; mt++) {
                    mma16(dp[mt][j], ao[mt], b0);
                    mma16(dp[mt][j + 1], ao[mt], b1);
                }
            }
        }

        const bool full = tile_full(p, mask, tq, t, q0, k0, DQ_BR, DQ_BC, ROWS_STORED);
#ifdef SCORE_OPTIONS
        /* The lane's first row and key. */
        const fa_score_at so = score_at(sc, mask, seq.len_q - q0 - (row_base + g), seq.len_k - k0 - 2 * t4);
#endif
#pragma unroll
        for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
            for (int j = 0; j < DQ_NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hf = e >> 1;
                    const int r = row_base + mt * 16 + g + 8 * hf, c = 8 * j + 2 * t4 + (e & 1);
                    const bool seen = full || visible(mask, q0, r, k0, c);
#ifdef SCORE_OPTIONS
                    /* The forward's logit (score_log2). */
                    float t;
                    const float lg = score_elem<true>(sc, so, s[mt][j][e], mt * 16 + 8 * hf, 8 * j + (e & 1), &t);
                    const float pv = fa_exp2(lg - l2[mt][hf]), dcap = score_dcap(t);
#else
                    const float pv = fa_exp2(fmaf(s[mt][j][e], sl2, -l2[mt][hf])), dcap = 1.0f;
#endif
                    float z = 1.0f;
#ifdef DROPOUT
                    z = dropout_keep(p, bh, (u32)q0 + (u32)r, (u32)k0 + (u32)c) ? p.drop_scale : 0.0f;
#endif
                    dp[mt][j][e] = seen ? pv * (dp[mt][j][e] * z - dd[mt][hf]) * dcap : 0.0f;
                }

        /* dQ += dS K */
#pragma unroll
        for (int kp = 0; kp < DQ_KP; kp++) {
            u32 a[DQ_MT][AREGS];
#pragma unroll
            for (int mt = 0; mt < DQ_MT; mt++) c_to_a(dp[mt][2 * kp], dp[mt][2 * kp + 1], a[mt]);
#pragma unroll
            for (int j = 0; j < DT; j += 2) {
                u32 b0[BREGS], b1[BREGS];
                load_bt2(k_sm, kp, j, b0, b1, lane);
#pragma unroll
                for (int mt = 0; mt < DQ_MT; mt++) {
                    mma16(acc[mt][j], a[mt], b0);
                    mma16(acc[mt][j + 1], a[mt], b1);
                }
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();

    unsigned char *q_tile = smem;
#pragma unroll
    for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
        for (int j = 0; j < DT; j++) {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = acc[mt][j][e] * p.scale;
            store_c(q_tile, row_base + mt * 16, j, v, lane);
        }
    __syncthreads();
    store_tile<DQ_BR, DQ_THREADS>((elem_t *)p.dq + Q_ROW(p, b, seq, q0, h), p.q_ss, q_tile, seq.len_q - q0, tid);
}
#endif
