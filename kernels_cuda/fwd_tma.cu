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
 *   then 1 + 4 STAGES transaction barriers.
 *
 * Built with FP8, Q, K and V are e4m3 (one byte, 128 head dimensions a
 * swizzled line: wgmma.cuh) and the products e4m3 ones, k32 a step, while
 * O, the storage dtype (DTYPE_F16 or DTYPE_BF16), leaves as above. The
 * host folds the descale factors into the parameters: descale_q descale_k
 * into scale_log2 (the logits' factor), descale_v into drop_scale (O's
 * factor at the normalisation; FP8 plans have no dropout), so that a new
 * factor needs no new build. What differs:
 * - P. The probabilities become the A operand of P V in registers,
 *   converted to e4m3 four at a time (no exchange between lanes: see
 *   transpose_v for the order of the keys), scaled by 2^PROB_LOG2 first:
 *   unscaled, P <= 1 would keep 3 bits of precision only down to 2^-6 and
 *   lose everything below 2^-10; at 2^8 (P <= 256, below e4m3's 448) every
 *   probability from 2^-14 on keeps them. l carries the same factor, and
 *   L takes it out.
 * - V. 8-bit products read B K-major only, and V arrives N-major (head
 *   dimensions along the line). The producer warpgroup's warps 1-3
 *   (TRANSPOSERS threads; thread 0 issues the copies) transpose each V
 *   stage into a V^T stage, the keys of a head dimension along its row,
 *   and arrive on its full barrier; the consumers release V^T as they
 *   released V. A second ring of barriers (V^T full and empty) joins the
 *   two of V, whose empty one the transposers now arrive at.
 * - Shared memory: Q [BR x SW_LINES 128], K and V [STAGES][BC x SW_LINES
 *   128], V^T [STAGES][VT_LINES][HEAD_DIM x 128], O [BR x HEAD_DIM] in
 *   the storage dtype (a 16-bit O no longer fits the rows of the Q tile),
 *   then 1 + 6 STAGES barriers.
 * - VT_GLOBAL (128-key tiles, one line of keys a row of V^T): the host
 *   runs fa_fp8_vt first, which writes V^T once to global memory in the
 *   stage's order of keys, and passes its tensor map in place of V's; the
 *   producer copies V^T stages as it copies K, and there are no
 *   transposers, no V stages and no V^T barriers (1 + 4 STAGES). The
 *   transposers' shared-memory traffic cost the forward a third of its
 *   rate without the softmax (bench/results/h200.md, seventh session);
 *   the pre-pass reads and writes V once more in global memory. */
#ifdef FP8
#define PROB_LOG2 8.0f /* P in e4m3 carries 2^8 (mma.cuh online_softmax) */
#endif
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
#define KP (BC * IN_BYTES / 32) /* k steps of P V */
#define BOX_COLS (128 / IN_BYTES) /* elements of a 128-byte line, a box's width */
#define O_LINES (HEAD_DIM / 64) /* O's 128-byte lines a row (fp16/bf16) */
#define Q_BYTES SW_TILE_BYTES(BR)
#define KV_BYTES SW_TILE_BYTES(BC)
#ifdef FP8
#define VT_LINES ((BC + 127) / 128) /* 128-byte lines of keys a row of V^T */
#define VT_BYTES (HEAD_DIM * VT_LINES * 128) /* a V^T stage: a head dimension a row */
#define O_BYTES (BR * HEAD_DIM * ELEM_BYTES)
#ifdef VT_GLOBAL
#define O_OFFSET (Q_BYTES + STAGES * (KV_BYTES + VT_BYTES))
#define V_READERS (4 * CWG) /* the consumers' warps, as V's */
#else
#define O_OFFSET (Q_BYTES + STAGES * (2 * KV_BYTES + VT_BYTES))
#define TRANSPOSERS 96 /* the producer warpgroup's warps 1-3 */
#ifndef TRANSPOSE_BURST
#define TRANSPOSE_BURST 3
#endif
#define V_READERS TRANSPOSERS
#endif
#else
#define O_OFFSET 0 /* O goes into the Q tile */
#define V_READERS (4 * CWG) /* the consumers' warps */
#endif

#if BR % 64 != 0 || CWG < 1 || CWG > 3 || BC % 16 != 0 || BC > 256
#error "fwd_tma: BR 64, 128 or 192 (one consumer warpgroup a 64 rows), BC a multiple of 16"
#endif
#if STAGES < 2
#error "fwd_tma: at least two stages"
#endif
#if defined(FP8) && BC != 64 && BC != 128 && BC != 192
#error "fwd_tma: FP8 takes 64, 128 or 192 keys"
#endif
#if defined(VT_GLOBAL) && (!defined(FP8) || BC != 128)
#error "fwd_tma: VT_GLOBAL takes FP8 and 128 keys (a row of V^T one 128-byte line)"
#endif

/* Registers a thread after the hand-over: the producer keeps what one
 * thread's loop of copies needs, the consumers share the rest of the
 * register file (64K a block: 24 x 128 + 240 x 256, 32 x 128 + 160 x 384).
 * NVRTC 13.0 reports the launch's count (168 registers with two consumer
 * warpgroups, 128 with three) and allocates the consumers' code within
 * their budget here: at head_dim 256 O alone takes 128 registers a thread
 * and the planner's builds do not spill (tests/test_cuda_compile.c).
 * With FP8 the producer's transposers take more (their loads, byte
 * permutes and addresses), and the consumers need less: their P is a
 * quarter of the scores' registers, not half. With VT_GLOBAL the producer
 * is one copying thread again. */
#if defined(FP8) && !defined(VT_GLOBAL) && CWG == 3
#define PRODUCER_REGS 40
#define CONSUMER_REGS 152
#elif defined(FP8) && !defined(VT_GLOBAL) && CWG == 2
#define PRODUCER_REGS 40
#define CONSUMER_REGS 232
#elif CWG == 3
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

/* FWD_TRACE (a diagnostic option, FLASHATTN_CUDA_OPTIONS): in block
 * (0, 0, 0), lane 0 of each consumer warpgroup's first warp and of the
 * first transposer warp keep the SM's clock at each phase of their first
 * TRACE_TILES key tiles (the consumers in the OVERLAP schedule's loop) and
 * print them at the end, one line a tile: where a tile's time goes,
 * warpgroup by warpgroup (bench/fwd_trace.sh). Its printf, a function
 * call, makes ptxas wait for each product before the next (its C7510
 * note; 16 waits where the plain FP8 build has 4): the product phases it
 * shows are that build's, and the compile checks refuse it. */
/* FWD_SKIP_SOFTMAX and FWD_SKIP_TRANSPOSE (diagnostic options, wrong
 * results: timing only): the OVERLAP loop's consumers skip the softmax and
 * the e4m3 conversion, and the transposers the transpose, each keeping
 * every barrier and every product; what the rest of the pipeline costs
 * alone (bench/results/h200.md, seventh session). */
#ifdef FWD_TRACE
#define TRACE_TILES 48
#define TRACE_PHASES 9
#define TRACE_DECL long long trace_c[TRACE_TILES][TRACE_PHASES]; int trace_i = 0
#define TRACE_AT(k) (trace_i < TRACE_TILES ? (void)(trace_c[trace_i][k] = clock64()) : (void)0)
#define TRACE_FROM(k0)                                                                                     \
    do {                                                                                                   \
        for (int k_ = (k0); k_ < TRACE_PHASES; k_++) TRACE_AT(k_);                                         \
    } while (0)
#define TRACE_NEXT() (trace_i++)
#define TRACE_PRINT(who, on)                                                                               \
    do {                                                                                                   \
        if ((on) && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)                                 \
            for (int i_ = 0; i_ < trace_i && i_ < TRACE_TILES; i_++)                                       \
                printf("fwd-trace %d %d %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", (who), i_,         \
                       trace_c[i_][0], trace_c[i_][1], trace_c[i_][2], trace_c[i_][3], trace_c[i_][4],       \
                       trace_c[i_][5], trace_c[i_][6], trace_c[i_][7], trace_c[i_][8]);                     \
    } while (0)
#else
#define TRACE_DECL
#define TRACE_AT(k) ((void)0)
#define TRACE_FROM(k0) ((void)0)
#define TRACE_NEXT() ((void)0)
#define TRACE_PRINT(who, on) ((void)0)
#endif

FA_DEV void rescale(float (*o_acc)[4], const float (*alpha_of)[2]) {
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o_acc[j][e] *= alpha_of[0][e >> 1];
}

#ifdef FP8
/* Four fp32 values as e4m3 bytes, a in the lowest (nearest even,
 * saturating). */
FA_DEV u32 e4m3x4(float a, float b, float c, float d) {
    u32 r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

/* The 8-bit A fragment of k32 step kp holds, in lane (g, t), byte i of
 * register 0 (row g) and 2 at k = 4 t + i and 16 + 4 t + i (1 and 3: row
 * g + 8), where a C fragment holds keys 2 t, 2 t + 1 of each n-tile of 8.
 * Rather than move bytes between lanes, the lane packs its own: k slot
 * 4 t + i of the step's first 16 is key 2 t + (i & 1) + 8 (i >> 1) (n-tiles
 * 4 kp and 4 kp + 1), the second 16 likewise (4 kp + 2, + 3); transpose_v
 * stores V^T in the same order of keys, and the sum does not care. */
FA_DEV void probs_to_a(const float (*s)[NT][4], u32 (*pa)[AREGS]) {
#pragma unroll
    for (int kp = 0; kp < KP; kp++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float *c0 = s[0][4 * kp + 2 * h], *c1 = s[0][4 * kp + 2 * h + 1];
            pa[kp][2 * h] = e4m3x4(c0[0], c0[1], c1[0], c1[1]);
            pa[kp][2 * h + 1] = e4m3x4(c0[2], c0[3], c1[2], c1[3]);
        }
}

#ifndef VT_GLOBAL
FA_DEV void stsm_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

/* One V stage (BC keys by HEAD_DIM, as the tensor map wrote it: a key a
 * row of 128-byte lines, 16-byte chunk c of row r at c ^ (r & 7)) into its
 * V^T stage (a head dimension a row, its keys in 128-byte lines of
 * HEAD_DIM rows each, swizzled the same way), K-major for the P V products, with the keys of each group of 16 in
 * probs_to_a's order: the 4-byte word t of the group holds keys 2 t,
 * 2 t + 1, 8 + 2 t, 9 + 2 t.
 *
 * A warp's step moves 16 keys by 32 head dimensions (512 bytes): one
 * ldmatrix.trans of four 8 x 8 16-bit matrices (keys 0-7 and 8-15 by
 * dimensions 0-15, then by 16-31), which hands lane (g, t) the bytes of
 * keys 2 t, 2 t + 1 at dimensions 2 g, 2 g + 1 from each; two byte permutes
 * a pair of them make the words of dimensions 2 g and 2 g + 1, in exactly
 * that order of keys; one stmatrix of four matrices stores them, a
 * matrix's row a dimension's 16 key slots. Lanes 16-31 (g >= 4) swap
 * their two words between matrices, so that each matrix's eight rows are
 * dimensions 0, 2, 4, 6, 9, 11, 13, 15 (or the other eight): eight
 * different chunks under the swizzle, no bank conflict (the loads' eight
 * keys are eight different chunks already). tw: the transposer's warp, 0
 * to 2, taking every third step. */
FA_DEV void transpose_v(u32 src, u32 dst, int tw, int lane) {
    constexpr int KB = BC / 16, STEPS = KB * HEAD_DIM / 32;
    /* This lane's row of matrix m: a key of the load, a dimension of the store. */
    const int m = lane >> 3, r = lane & 7;
    const u32 key_row = src + (u32)(8 * (m & 1) + r) * 128;
    const int dim = 16 * (m >> 1) + 2 * r + ((m & 1) ^ (r >> 2));
    const u32 dim_row = dst + (u32)dim * 128;
    const u32 even = lane < 16 ? 0x6420u : 0x7531u, odd = even ^ 0x1111u;
    /* TRANSPOSE_BURST steps' loads in flight at once, then their stores:
     * one step at a time a warp's share of a 128 x 128 stage took 1600
     * clocks (FWD_TRACE, an H200), and the forward ran 1-6% slower
     * (bench/results/h200.md). Three keep the transposers' registers
     * within PRODUCER_REGS; four spilled. */
    constexpr u32 WSTEP = TRANSPOSERS / 32;
#pragma unroll 1
    for (u32 step0 = (u32)tw; step0 < STEPS; step0 += WSTEP * TRANSPOSE_BURST) {
        u32 v[TRANSPOSE_BURST][4];
#pragma unroll
        for (int i = 0; i < TRANSPOSE_BURST; i++) {
            const u32 step = step0 + (u32)i * WSTEP;
            const u32 kb = step % KB, c2 = step / KB; /* keys 16 kb .., dimensions 32 c2 .. */
            const u32 chunk = 2 * c2 + (u32)(m >> 1); /* the load's 16-byte chunk of dimensions */
            if (step < STEPS)
                ldsm_x4_t(key_row + kb * 16 * 128 + (chunk >> 3) * BC * 128 + (((chunk & 7) ^ (u32)r) << 4), v[i][0],
                          v[i][1], v[i][2], v[i][3]);
        }
#pragma unroll
        for (int i = 0; i < TRANSPOSE_BURST; i++) {
            const u32 step = step0 + (u32)i * WSTEP;
            const u32 kb = step % KB, c2 = step / KB;
            if (step < STEPS)
                stsm_x4(dim_row + c2 * 32 * 128 + (kb >> 3) * HEAD_DIM * 128 + (((kb & 7) ^ (u32)(dim & 7)) << 4),
                        __byte_perm(v[i][0], v[i][1], even), __byte_perm(v[i][0], v[i][1], odd),
                        __byte_perm(v[i][2], v[i][3], even), __byte_perm(v[i][2], v[i][3], odd));
        }
    }
}
#else
/* V^T for the P V products, once in global memory before the forward
 * (launched first, one block a 128-key tile, grid (tiles, KV heads,
 * sequences)): for each (sequence, KV head) HEAD_DIM rows of keys_pad
 * bytes, row c holding head dimension c of every key, each group of 16
 * keys in probs_to_a's order (word t: keys 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t),
 * keys past the sequence zero as the tensor map's fill was. A box of BC
 * keys by HEAD_DIM rows then lands, under the 128-byte swizzle, exactly
 * where transpose_v put it. The V tile goes through shared memory so
 * that both the loads (a key's row) and the stores (a dimension's row)
 * are whole 16-byte chunks. */
#define VT_THREADS 256
#define VT_ROW (HEAD_DIM + 16) /* bytes a key in shared memory, padded against bank conflicts */
extern "C" __global__ void __launch_bounds__(VT_THREADS) fa_fp8_vt(const fa_params p, u8 *vt, i64 keys_pad) {
    __shared__ __align__(16) u8 tile[BC * VT_ROW];
    const int k0 = blockIdx.x * BC, hk = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
    const fa_seq seq = seq_of(p, b);
    const u8 *vg = (const u8 *)p.v + V_ROW(p, b, seq, k0, hk);
    constexpr int KEY_CHUNKS = HEAD_DIM / 16, KEY_GROUPS = BC / 16; /* 16-byte chunks a key, groups of 16 keys */
#pragma unroll 4
    for (int i = tid; i < BC * KEY_CHUNKS; i += VT_THREADS) {
        const int r = i / KEY_CHUNKS, c = i % KEY_CHUNKS;
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (r < seq.len_k - k0) w = *(const uint4 *)(vg + (i64)r * p.v_ss + c * 16);
        *(uint4 *)(tile + r * VT_ROW + c * 16) = w;
    }
    __syncthreads();
    u8 *out = vt + ((i64)b * gridDim.y + hk) * HEAD_DIM * keys_pad + k0;
#pragma unroll 2
    for (int i = tid; i < HEAD_DIM * KEY_GROUPS; i += VT_THREADS) {
        const int c = i / KEY_GROUPS, kb = i % KEY_GROUPS; /* neighbouring threads: neighbouring chunks of a row */
        const u8 *col = tile + 16 * kb * VT_ROW + c;
        u32 w[4];
#pragma unroll
        for (int t = 0; t < 4; t++)
            w[t] = (u32)col[2 * t * VT_ROW] | (u32)col[(2 * t + 1) * VT_ROW] << 8 | (u32)col[(2 * t + 8) * VT_ROW] << 16 |
                   (u32)col[(2 * t + 9) * VT_ROW] << 24;
        *(uint4 *)(out + (i64)c * keys_pad + 16 * kb) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}
#endif
#else
FA_DEV void probs_to_a(const float (*s)[NT][4], u32 (*pa)[AREGS]) {
#pragma unroll
    for (int kp = 0; kp < KP; kp++) c_to_a(s[0][2 * kp], s[0][2 * kp + 1], pa[kp]);
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    fa_fwd_tma(const fa_params p, const __grid_constant__ fa_tensor_map tm_q, const __grid_constant__ fa_tensor_map tm_k,
               const __grid_constant__ fa_tensor_map tm_v, const __grid_constant__ fa_tensor_map tm_o) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const u32 q_sm = smem_u32(smem);
    if (q_sm & 1023u) __trap(); /* the swizzle is on address bits */
    const u32 k_sm = q_sm + Q_BYTES;
    const u32 v_sm = k_sm + STAGES * KV_BYTES;
#if defined(FP8) && defined(VT_GLOBAL)
    const u32 vt_sm = v_sm; /* V^T stages in place of V's */
    const u32 bars = q_sm + O_OFFSET + O_BYTES;
#elif defined(FP8)
    const u32 vt_sm = v_sm + STAGES * KV_BYTES;
    const u32 bars = q_sm + O_OFFSET + O_BYTES;
#else
    const u32 bars = v_sm + STAGES * KV_BYTES;
#endif
    const u32 q_full = bars;
#define K_FULL(s) (bars + 8u * (1u + (u32)(s)))
#define K_EMPTY(s) (bars + 8u * (1u + STAGES + (u32)(s)))
#define V_FULL(s) (bars + 8u * (1u + 2 * STAGES + (u32)(s)))
#define V_EMPTY(s) (bars + 8u * (1u + 3 * STAGES + (u32)(s)))
/* The stages the P V products read, and their descriptors. */
#if defined(FP8) && defined(VT_GLOBAL)
#define PV_FULL(s) V_FULL(s)
#define PV_EMPTY(s) V_EMPTY(s)
#define PV_DESC(s) desc_lo_k_major(vt_sm + (u32)(s) * VT_BYTES)
#elif defined(FP8)
#define VT_FULL(s) (bars + 8u * (1u + 4 * STAGES + (u32)(s)))
#define VT_EMPTY(s) (bars + 8u * (1u + 5 * STAGES + (u32)(s)))
#define PV_FULL(s) VT_FULL(s)
#define PV_EMPTY(s) VT_EMPTY(s)
#define PV_DESC(s) desc_lo_k_major(vt_sm + (u32)(s) * VT_BYTES)
#else
#define PV_FULL(s) V_FULL(s)
#define PV_EMPTY(s) V_EMPTY(s)
#define PV_DESC(s) desc_lo_n_major(v_sm + (u32)(s) * KV_BYTES, BC * 128)
#endif

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
            mbar_init(V_EMPTY(s), V_READERS);
#if defined(FP8) && !defined(VT_GLOBAL)
            mbar_init(VT_FULL(s), TRANSPOSERS);
            mbar_init(VT_EMPTY(s), 4 * CWG);
#endif
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
            for (int cb = 0; cb < SW_LINES; cb++)
                tma_load(q_sm + cb * BR * 128, &tm_q, cb * BOX_COLS, q0, h, b, q_full);
            int stage = 0;
            u32 phase = 0;
#pragma unroll 1
            for (int t = next_key_tile(p, tq, t_begin, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
                const u32 off = (u32)stage * KV_BYTES;
                mbar_wait(K_EMPTY(stage), phase ^ 1u);
                mbar_expect_tx(K_FULL(stage), KV_BYTES);
#pragma unroll
                for (int cb = 0; cb < SW_LINES; cb++)
                    tma_load(k_sm + off + cb * BC * 128, &tm_k, cb * BOX_COLS, t * BC, hk, b, K_FULL(stage));
                mbar_wait(V_EMPTY(stage), phase ^ 1u);
#ifdef VT_GLOBAL
                /* (keys, head dimension 0, KV head, sequence): one box */
                mbar_expect_tx(V_FULL(stage), VT_BYTES);
                tma_load(vt_sm + (u32)stage * VT_BYTES, &tm_v, t * BC, 0, hk, b, V_FULL(stage));
#else
                mbar_expect_tx(V_FULL(stage), KV_BYTES);
#pragma unroll
                for (int cb = 0; cb < SW_LINES; cb++)
                    tma_load(v_sm + off + cb * BC * 128, &tm_v, cb * BOX_COLS, t * BC, hk, b, V_FULL(stage));
#endif
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1u;
                }
            }
        }
#if defined(FP8) && !defined(VT_GLOBAL)
        else if (tid >= 32) {
            /* The transposers, through the tiles in the copies' order. */
            int stage = 0;
            u32 phase = 0;
            TRACE_DECL;
#pragma unroll 1
            for (int t = next_key_tile(p, tq, t_begin, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
                TRACE_AT(0);
                mbar_wait(V_FULL(stage), phase);
                TRACE_AT(1);
                mbar_wait(VT_EMPTY(stage), phase ^ 1u);
                TRACE_AT(2);
#ifndef FWD_SKIP_TRANSPOSE
                transpose_v(v_sm + (u32)stage * KV_BYTES, vt_sm + (u32)stage * VT_BYTES, (tid >> 5) - 1, tid & 31);
#endif
                mbar_arrive(V_EMPTY(stage));
                fence_async_smem(); /* the stores, before the products read V^T */
                mbar_arrive(VT_FULL(stage));
                TRACE_FROM(3);
                TRACE_NEXT();
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1u;
                }
            }
            TRACE_PRINT(9, tid == 32);
        }
#endif
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
        mbar_wait(PV_FULL(st), ph);
        turn_begin(cw);
        wg_fence();
        wg_regs_by_rows<KP>(o_acc, pv, PV_DESC(st));
        wg_commit();
        turn_end(cw);
        wg_wait<0>();
        wg_hold<DT>(o_acc);
        wg_keep<KP>(pv);
        if (lane == 0) mbar_arrive(PV_EMPTY(st));
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
        TRACE_DECL;
#pragma unroll 1
        for (t = next_key_tile(p, tq, t + 1, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
            bias_next(t);
            /* This tile's S and the previous one's P V, issued together;
             * the softmax of S runs while P V is on the tensor cores, and O
             * takes its rescale after. */
            TRACE_AT(0);
            mbar_wait(K_FULL(stage), phase);
            TRACE_AT(1);
            turn_begin(cw);
            TRACE_AT(2);
            wg_fence();
            wg_rows_by_rows<BC, BR>(s[0], qd, desc_lo_k_major(k_sm + (u32)stage * KV_BYTES));
            wg_commit();
            mbar_wait(PV_FULL(prev), prev_phase);
            TRACE_AT(3);
            wg_regs_by_rows<KP>(o_acc, pa, PV_DESC(prev));
            wg_commit();
            turn_end(cw);
            TRACE_AT(4);
            wg_wait<1>();
            wg_hold<NT>(s[0]);
            TRACE_AT(5);
            if (lane == 0) mbar_arrive(K_EMPTY(stage));
#ifdef FWD_SKIP_SOFTMAX
            /* One use of the last S register keeps ptxas from dropping the
             * chain of S products whose results nothing else reads; in a
             * register no product accumulates into (written into o_acc, it
             * made ptxas wait for each product before the next). */
            m_run[0][0] += s[0][NT - 1][3] * 0.0f;
            const bool moved = false;
#else
            const bool moved =
                scores_to_probs<1, NT, BR, BC>(p, mask, sc, s, m_run, l_run, alpha_of, tq, t, q0, row_base, lane, bh);
#endif
            TRACE_AT(6);
            wg_wait<0>();
            wg_hold<DT>(o_acc);
            wg_keep<KP>(pa);
            TRACE_AT(7);
            if (lane == 0) mbar_arrive(PV_EMPTY(prev));
            if (moved) rescale(o_acc, alpha_of);
#ifndef FWD_SKIP_SOFTMAX
            probs_to_a(s, pa);
#endif
            TRACE_AT(8);
            TRACE_NEXT();
            prev = stage;
            prev_phase = phase;
            next_stage(stage, phase);
        }
        pv_product(pa, prev, prev_phase);
        TRACE_PRINT(cw, (ctid & 127) == 0);
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
     * which only its own products read (with FP8 into its rows of the O
     * tile). */
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
#ifdef PROB_LOG2
            p.lse[lse_index(p, b, h, q0 + r, seq.start_q)] =
                masked ? -FA_INF : row_lse(m * SCORE_SL2(p) - PROB_LOG2, l); /* l carries 2^PROB_LOG2 */
#else
            p.lse[lse_index(p, b, h, q0 + r, seq.start_q)] = masked ? -FA_INF : row_lse(m * SCORE_SL2(p), l);
#endif
    }
#pragma unroll
    for (int j = 0; j < DT; j++) store_c_sw<BR>(smem + O_OFFSET, row_base, j, o_acc[j], lane);
    fence_async_smem();
    named_sync(BAR_OUT + cw, 128);
    if ((ctid & 127) == 0 && cw * 64 < seq.len_q - q0) {
#pragma unroll
        for (int cb = 0; cb < O_LINES; cb++)
            tma_store(&tm_o, q_sm + O_OFFSET + (u32)(cb * BR + cw * 64) * 128, cb * 64, q0 + cw * 64, h, b);
        tma_store_commit();
        tma_store_wait_read();
    }
}
