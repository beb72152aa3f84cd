/* Tensor-core building blocks for sm_80 and later: asynchronous copies,
 * ldmatrix, mma.sync, and the fragment loaders of the attention kernels.
 *
 * Shared tiles are row-major with one 16-byte chunk of padding per row: a
 * tile W chunks wide has rows of W + 1 chunks, and chunk c of row r is at
 * byte (r * (W + 1) + c) * 16 (tile_bytes, chunk_off). W is even in every
 * tensor-core tile, so eight consecutive rows of one chunk column (one
 * ldmatrix block) fall in eight different bank groups, and the eight
 * threads that copy eight consecutive chunks of a row (one 128-byte line of
 * global memory) write 128 consecutive bytes. An address is a per-row part
 * plus a per-chunk constant, so a fragment loop keeps one address register
 * per tile. (A chunk-major layout cost the forward a shared-memory
 * wavefront per thread and copy, 8x the ideal, and an XOR swizzle 15% more
 * instructions and registers the kernels do not have; both measured on the
 * H200 in bench/results/h200.md.)
 *
 * Fragments (warp lane = 4 * g + t):
 * - fp16/bf16: mma.m16n8k16. A (16 x 16) in 4 registers, B (16 x 8) in 2,
 *   C (16 x 8 fp32) in 4: c0, c1 = (row g, cols 2t, 2t + 1), c2, c3 = row g + 8.
 * - fp32 inputs on TF32 units: a "k16 step" is two mma.m16n8k8, so A takes
 *   8 registers and B 4, and C is laid out as above. Products whose k runs
 *   over head dimensions use the natural k order (ldmatrix delivers it on
 *   32-bit data too). Products whose k runs over the keys or queries of a
 *   score tile take A straight from a C fragment: within each group of 8, k
 *   slot t stands for column 2t and slot t + 4 for column 2t + 1 (a sum does
 *   not care about the order), and the B operand is read in the same order. */
#ifndef FA_CUDA_MMA_CUH
#define FA_CUDA_MMA_CUH

#include "common.cuh"

#if ELEM_BYTES == 2
#define AREGS 4
#define BREGS 2
#else
#define AREGS 8
#define BREGS 4
#endif

FA_DEV u32 smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared; src_bytes 0 writes zeros (rows past the end of
 * a sequence) and reads nothing. */
FA_DEV void cp_async16(u32 dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
/* The same with an L2 policy (l2_evict_first): data read once, such as a
 * decoding step's K and V, leaves L2 first instead of what is reused. */
FA_DEV u64 l2_evict_first() {
    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}
FA_DEV void cp_async16_policy(u32 dst, const void *src, int src_bytes, u64 pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(pol));
}
/* 4 bytes global -> shared (through L1: these are small and scattered);
 * src_bytes 0 writes zeros. */
FA_DEV void cp_async4(u32 dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
FA_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> FA_DEV void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

FA_DEV void ldsm_x4(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
FA_DEV void ldsm_x4_t(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

FA_DEV u32 to_tf32(float f) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

/* Two fp32 values as one register of the storage type's pairs (lo in the
 * low half), rounded to nearest even. */
FA_DEV u32 pack2(float lo, float hi) {
    u32 r;
#if defined(DTYPE_F16)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#elif defined(DTYPE_BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    r = 0;
    (void)lo;
    (void)hi;
#endif
    return r;
}

/* c += a b over one k16 step. */
FA_DEV void mma16(float c[4], const u32 *a, const u32 *b) {
#if defined(DTYPE_F16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(DTYPE_BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
#pragma unroll
    for (int h = 0; h < 2; h++)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[4 * h]), "r"(a[4 * h + 1]), "r"(a[4 * h + 2]), "r"(a[4 * h + 3]),
                       "r"(b[2 * h]), "r"(b[2 * h + 1]));
#endif
}

/* Bytes of a tile of ROWS rows by WIDTH_BYTES bytes (core/planner.c's
 * fa_mma_tile_bytes counts the same). */
#define TILE_BYTES(ROWS, WIDTH_BYTES) ((ROWS) * ((WIDTH_BYTES) + 16))

/* Byte offset of chunk c of row r in a tile W chunks wide. */
template <int W = ROW_CHUNKS> FA_DEV int chunk_off(int r, int c) { return (r * (W + 1) + c) * 16; }

/* Byte address of chunk c of row r in a tile W chunks wide. */
template <int W = ROW_CHUNKS> FA_DEV u32 chunk_addr(u32 base, int r, int c) { return base + (u32)chunk_off<W>(r, c); }

/* Word address (4-byte units from base) of fp32 element (r, x) of an fp32
 * tile W chunks wide. */
template <int W = ROW_CHUNKS> FA_DEV int f32_word(int r, int x) { return chunk_off<W>(r, x >> 2) / 4 + (x & 3); }

/* A operand: rows r0 .. r0 + 15 of a tile whose rows are the m dimension,
 * k16 step s over its columns. */
template <int W = ROW_CHUNKS> FA_DEV void load_a(u32 base, int r0, int s, u32 *a, int lane) {
    const int bi = lane >> 3, r = r0 + (bi & 1) * 8 + (lane & 7);
#if ELEM_BYTES == 2
    ldsm_x4(chunk_addr<W>(base, r, 2 * s + (bi >> 1)), a[0], a[1], a[2], a[3]);
#else
#pragma unroll
    for (int h = 0; h < 2; h++) {
        ldsm_x4(chunk_addr<W>(base, r, 4 * s + 2 * h + (bi >> 1)), a[4 * h], a[4 * h + 1], a[4 * h + 2],
                a[4 * h + 3]);
#pragma unroll
        for (int i = 0; i < 4; i++) a[4 * h + i] = to_tf32(__uint_as_float(a[4 * h + i]));
    }
#endif
}

/* B operands of two n-tiles (rows n0 .. n0 + 15 of a tile whose rows are
 * the n dimension, k along its columns), k16 step s. */
template <int W = ROW_CHUNKS> FA_DEV void load_b2(u32 base, int n0, int s, u32 *b0, u32 *b1, int lane) {
    const int bi = lane >> 3;
#if ELEM_BYTES == 2
    ldsm_x4(chunk_addr<W>(base, n0 + (bi >> 1) * 8 + (lane & 7), 2 * s + (bi & 1)), b0[0], b0[1], b1[0],
            b1[1]);
#else
    ldsm_x4(chunk_addr<W>(base, n0 + (lane & 7), 4 * s + bi), b0[0], b0[1], b0[2], b0[3]);
    ldsm_x4(chunk_addr<W>(base, n0 + 8 + (lane & 7), 4 * s + bi), b1[0], b1[1], b1[2], b1[3]);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        b0[i] = to_tf32(__uint_as_float(b0[i]));
        b1[i] = to_tf32(__uint_as_float(b1[i]));
    }
#endif
}

/* B operands of n-tiles j and j + 1 from a tile whose rows are the k
 * dimension (k16 step s: rows 16 s ..) and whose columns are n. */
template <int W = ROW_CHUNKS> FA_DEV void load_bt2(u32 base, int s, int j, u32 *b0, u32 *b1, int lane) {
#if ELEM_BYTES == 2
    const int bi = lane >> 3;
    ldsm_x4_t(chunk_addr<W>(base, 16 * s + (bi & 1) * 8 + (lane & 7), j + (bi >> 1)), b0[0], b0[1], b1[0],
              b1[1]);
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < 2; n++) {
        u32 *b = n ? b1 : b0;
        const int x = 8 * (j + n) + g;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * s + 8 * h + 2 * t;
            float v0, v1;
            asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v0) : "r"(base + 4u * (u32)f32_word<W>(r, x)));
            asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v1) : "r"(base + 4u * (u32)f32_word<W>(r + 1, x)));
            b[2 * h] = to_tf32(v0);
            b[2 * h + 1] = to_tf32(v1);
        }
    }
#endif
}

/* A operand (m-tile of rows m0 .. m0 + 15, k16 step s) from a tile stored
 * transposed: its rows are the k dimension, its columns the m dimension. */
template <int W = ROW_CHUNKS> FA_DEV void load_at(u32 base, int m0, int s, u32 *a, int lane) {
#if ELEM_BYTES == 2
    const int bi = lane >> 3;
    ldsm_x4_t(chunk_addr<W>(base, 16 * s + (bi >> 1) * 8 + (lane & 7), (m0 >> 3) + (bi & 1)), a[0], a[1], a[2],
              a[3]);
#else
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = 16 * s + 8 * h + 2 * t;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* slot order: (g, 2t), (g + 8, 2t), (g, 2t + 1), (g + 8, 2t + 1) */
            const int m = m0 + g + 8 * (i & 1), k = r + (i >> 1);
            float v;
            asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(base + 4u * (u32)f32_word<W>(k, m)));
            a[4 * h + i] = to_tf32(v);
        }
    }
#endif
}

/* A operand for k16 step s from two C fragments (n-tiles 2s and 2s + 1 of
 * a score tile the warp holds). */
FA_DEV void c_to_a(const float *c0, const float *c1, u32 *a) {
#if ELEM_BYTES == 2
    a[0] = pack2(c0[0], c0[1]);
    a[1] = pack2(c0[2], c0[3]);
    a[2] = pack2(c1[0], c1[1]);
    a[3] = pack2(c1[2], c1[3]);
#else
    a[0] = to_tf32(c0[0]);
    a[1] = to_tf32(c0[2]);
    a[2] = to_tf32(c0[1]);
    a[3] = to_tf32(c0[3]);
    a[4] = to_tf32(c1[0]);
    a[5] = to_tf32(c1[2]);
    a[6] = to_tf32(c1[1]);
    a[7] = to_tf32(c1[3]);
#endif
}

#ifdef SCORE_OPTIONS
/* The score options (common.cuh score_log2) on a warp's C fragments of raw
 * products, query rows down, keys across: MT strips of 16 rows, NT n-tiles
 * of 8 keys. rows0 and keys0: what is left of the sequences from the
 * lane's first row (g of the first strip) and first key (column 2 t), as
 * the forward's mask test counts them; rows past the end read the bias of
 * the last row (their results are never stored), keys past it none (the
 * masks hide them). One conversion a tile for ALiBi's distances: an
 * element's is the lane's plus constants. */
template <int MT, int NT>
FA_DEV void score_rows_by_keys(float (*s)[NT][4], const fa_score &sc, const fa_mask &m, int rows0, int keys0) {
    (void)m;
#ifdef ALIBI
    const float base = alibi_dist_left(rows0, keys0);
#endif
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
#ifdef BIAS
            const int rl = rows0 - (mt * 16 + 8 * hf);
            const bias_t *rp = sc.bias + (i64)(rl > 0 ? m.len_q - rl : m.len_q - 1) * sc.bias_ss + (m.len_k - keys0);
#endif
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 2 * hf; e < 2 * hf + 2; e++) {
                    const int c = 8 * j + (e & 1);
                    float bv = 0.0f, dist = 0.0f, t;
                    (void)c;
#ifdef BIAS
                    if (c < keys0) bv = bias_to_f32(rp[c]);
#endif
#ifdef ALIBI
                    dist = base + (float)(mt * 16 + 8 * hf - c);
#endif
                    s[mt][j][e] = score_log2(sc, s[mt][j][e], bv, dist, &t);
                }
        }
}
#endif

/* One key tile's step of the online softmax (base 2) over the score
 * fragments a warp holds: MT strips of 16 rows, NT n-tiles of 8 keys. Per
 * row (two a strip and lane, their four lanes reduced by shuffles): the new
 * maximum m_run in score units, the scores replaced by their
 * probabilities exp2(s sl2 - m sl2), l_run rescaled and summed (the lane's
 * share), and alpha_of, the factor the row's accumulators take. A row that
 * has seen no visible key keeps m = -inf and exponentiates against 0
 * instead (no inf - inf). Returns whether any of the lane's rows moved
 * (alpha != 1). A kernel that defines PROB_LOG2 gets probabilities (and
 * l) 2^PROB_LOG2 times as large: fwd_tma.cu's FP8 build, whose e4m3 P
 * would otherwise lose every probability below 2^-9. */
template <int MT, int NT>
FA_DEV bool online_softmax(float (*s)[NT][4], float (*m_run)[2], float (*l_run)[2], float (*alpha_of)[2],
                           float sl2) {
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = m_run[mt][hf];
#pragma unroll
            for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hf], s[mt][j][2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_use = mx == -FA_INF ? 0.0f : mx * sl2;
            const float alpha = fa_exp2(m_run[mt][hf] * sl2 - m_use);
            /* Whether the maximum moved, from the maxima themselves: alpha
             * is not exactly 1 where it stayed (m sl2 - m_use contracts to
             * an FMA of the unrounded product), and tested for 1 it had
             * every tile rescale O. Where it stayed alpha is within a
             * rounding of 1, which l takes and O may leave out. */
            moved |= mx != m_run[mt][hf];
            m_run[mt][hf] = mx;
#ifdef PROB_LOG2
            const float m_prob = m_use - PROB_LOG2;
#else
            const float m_prob = m_use;
#endif
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 2 * hf; e < 2 * hf + 2; e++) {
                    const float pv = fa_exp2(fmaf(s[mt][j][e], sl2, -m_prob));
                    s[mt][j][e] = pv;
                    sum += pv;
                }
            l_run[mt][hf] = l_run[mt][hf] * alpha + sum;
            alpha_of[mt][hf] = alpha;
        }
    }
    return moved;
}

/* One key tile's scores to probabilities in the forward kernels
 * (fwd_mma.cu, fwd_tma.cu), over a warp's MT strips of 16 rows from
 * row_base in a BR x BC tile (query tile tq from q0, key tile t): the score
 * options turn raw products into logits in log2 units, the masks hide what
 * the rows may not see (whole tiles test no element), the online softmax
 * step moves m, l and alpha_of (the factor the rows' accumulators take),
 * and with DROPOUT the dropped probabilities become 0 after the row sums
 * took them. Lanes t and t ^ 1 hold the two halves of one group of four
 * keys: each computes the Philox words of one of the two rows and hands
 * the other its half. Returns whether any row of the warp moved its
 * maximum (alpha != 1); while no row's does, the rescale can be left out. */
template <int MT, int NT, int BR_, int BC_>
FA_DEV bool scores_to_probs(const fa_params &p, const fa_mask &mask, const fa_score &sc, float (*s)[NT][4],
                            float (*m_run)[2], float (*l_run)[2], float (*alpha_of)[2], int tq, int t, int q0,
                            int row_base, int lane, u32 bh) {
    const int g = lane >> 2, t4 = lane & 3, k0 = t * BC_;
    (void)sc;
    (void)bh;
#ifdef SCORE_OPTIONS
    score_rows_by_keys<MT, NT>(s, sc, mask, mask.len_q - q0 - (row_base + g), mask.len_k - k0 - 2 * t4);
#endif
    if (!tile_full(p, mask, tq, t, q0, k0, BR_, BC_, ROWS_STORED)) {
        /* What is left of the sequences from the thread's first row and key. */
        const int rows0 = mask.len_q - q0 - (row_base + g), keys0 = mask.len_k - k0 - 2 * t4;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!visible_left(mask, rows0 - (mt * 16 + 8 * (e >> 1)), keys0 - (8 * j + (e & 1))))
                        s[mt][j][e] = -FA_INF;
    }
    const bool moved = online_softmax<MT, NT>(s, m_run, l_run, alpha_of, SCORE_SL2(p));
#ifdef DROPOUT
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const u32 r_g = (u32)q0 + (u32)(row_base + mt * 16 + g);
        const int odd = t4 & 1;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const u32 col4 = ((u32)k0 + (u32)(8 * j + 2 * t4)) & ~3u;
            const uint4 w = dropout_words(p, bh, r_g + 8u * (u32)odd, col4);
            const u32 give0 = odd ? w.x : w.z, give1 = odd ? w.y : w.w;
            const u32 got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
            const u32 got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
            const u32 lo0 = odd ? got0 : w.x, lo1 = odd ? got1 : w.y; /* row g */
            const u32 hi0 = odd ? w.z : got0, hi1 = odd ? w.w : got1; /* row g + 8 */
            if (lo0 < p.drop_threshold) s[mt][j][0] = 0.0f;
            if (lo1 < p.drop_threshold) s[mt][j][1] = 0.0f;
            if (hi0 < p.drop_threshold) s[mt][j][2] = 0.0f;
            if (hi1 < p.drop_threshold) s[mt][j][3] = 0.0f;
        }
    }
#endif
    return __any_sync(0xffffffffu, moved);
}

/* Thread tid's share of a tile's chunks for copies between global memory
 * and a tile of ROWS rows: consecutive threads take consecutive chunks of a
 * row, so eight threads cover one 128-byte line of global memory and eight
 * bank groups of the tile. Where the threads split the rows evenly every
 * thread keeps one column and steps down the rows. */
#define TILE_CHUNK_STEP(ROWS, NTHREADS)                                                                     \
    (NTHREADS % ROW_CHUNKS == 0 && (ROWS) % (NTHREADS / ROW_CHUNKS) == 0 ? NTHREADS / ROW_CHUNKS : 0)

/* Fills a tile of ROWS rows from global memory rows src + r * stride
 * (elements); rows >= valid are zero-filled. EVICT_FIRST: read once, the
 * rows leave L2 first. */
template <int ROWS, int NTHREADS, bool EVICT_FIRST = false>
FA_DEV void load_tile_async(u32 dst, const elem_t *src, i64 stride, int valid, int tid) {
    constexpr int STEP = TILE_CHUNK_STEP(ROWS, NTHREADS);
    const u64 pol = EVICT_FIRST ? l2_evict_first() : 0;
    if constexpr (STEP > 0) {
        /* A loop, not unrolled: unrolled, the compiler computes every
         * step's address up front, and at the loads in the middle of the
         * forward's softmax those registers push the tiles into spills. */
        asm volatile("" : "+r"(tid), "+l"(stride)); /* nor hoisted out of the caller's loop */
        const int c = tid % ROW_CHUNKS;
        int r = tid / ROW_CHUNKS;
        const elem_t *g = src + (i64)r * stride + c * CHUNK_ELEMS;
        const i64 g_step = (i64)STEP * stride;
        u32 s = chunk_addr(dst, r, c);
#pragma unroll 1
        for (; r < ROWS; r += STEP, g += g_step) {
            const bool ok = r < valid;
            if constexpr (EVICT_FIRST)
                cp_async16_policy(s, ok ? g : src, ok ? 16 : 0, pol);
            else
                cp_async16(s, ok ? g : src, ok ? 16 : 0);
            s += STEP * (ROW_CHUNKS + 1) * 16;
        }
    } else {
        /* The same reasons; chunk e of the tile is chunk e + e / ROW_CHUNKS
         * of the padded rows. */
        asm volatile("" : "+r"(tid), "+l"(stride));
#pragma unroll 1
        for (int e = tid; e < ROWS * ROW_CHUNKS; e += NTHREADS) {
            const int r = e / ROW_CHUNKS, c = e - r * ROW_CHUNKS;
            const bool ok = r < valid;
            const elem_t *g = ok ? src + (i64)r * stride + c * CHUNK_ELEMS : src;
            if constexpr (EVICT_FIRST)
                cp_async16_policy(dst + (u32)(e + r) * 16, g, ok ? 16 : 0, pol);
            else
                cp_async16(dst + (u32)(e + r) * 16, g, ok ? 16 : 0);
        }
    }
}

/* Writes the first `valid` rows of a tile to global memory, 16 bytes per
 * thread and access, chunks shared out as load_tile_async does; of a
 * padded build's rows (IO_DIM < HEAD_DIM) the tensors' columns only. */
template <int ROWS, int NTHREADS>
FA_DEV void store_tile(elem_t *dst, i64 stride, const unsigned char *tile, int valid, int tid) {
#pragma unroll 4
    for (int e = tid; e < ROWS * ROW_CHUNKS; e += NTHREADS) {
        const int r = e / ROW_CHUNKS, c = e % ROW_CHUNKS;
        if (r < valid && c < IO_DIM / CHUNK_ELEMS)
            *(uint4 *)(dst + (i64)r * stride + c * CHUNK_ELEMS) = *(const uint4 *)(tile + chunk_off(r, c));
    }
}

/* Stores the C fragment values (row g / g + 8 of an m-tile at r0, n-tile
 * columns 8 j + 2 t, + 1) into a tile of the storage type, rounded once. */
template <int W = ROW_CHUNKS> FA_DEV void store_c(unsigned char *tile, int r0, int j, const float *c, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = r0 + g + 8 * hf, x = 8 * j + 2 * t;
#if ELEM_BYTES == 2
        (void)x;
        *(u32 *)(tile + chunk_off<W>(r, j) + t * 4) = pack2(c[2 * hf], c[2 * hf + 1]);
#else
        *(float2 *)(tile + 4 * f32_word<W>(r, x)) = make_float2(c[2 * hf], c[2 * hf + 1]);
#endif
    }
}

#endif
