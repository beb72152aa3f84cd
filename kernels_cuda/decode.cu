/* Decoding forward on tensor cores: few query rows against a long key
 * sequence, bound by the bytes of K and V. One thread block per (row tile,
 * KV head, sequence x key split): its BR rows are the query rows of a whole
 * GQA group packed together (row r = token * group + head in the group), so
 * the group's heads and tokens share every K/V tile and each KV head's keys
 * and values are read once per step instead of once per query head.
 *
 * The rows are few (a decoding step has one to a few tokens), so the warps
 * split the keys, not the rows: each of the WARPS warps owns 16 keys of
 * every BC = 16 * WARPS key tile and keeps its own running maxima, sums
 * and output accumulator for all BR rows (MT strips of 16, padded). K and
 * V stream through STAGES buffers with cp.async, STAGES - 1 tiles ahead of
 * the products, so the copies stay in flight while a tile is computed. At
 * the end the warps' partial rows meet in shared memory (the K/V buffers,
 * reused) and are combined by their maxima.
 *
 * With SPLITK the block covers one of num_splits equal runs of the key
 * tiles and writes a normalised fp32 partial O and its L, merged by
 * rowwise.cuh's fa_splitk_merge (the same layout as simt.cu's splits), or
 * with SPLIT_MERGE_LAST by the last block of the splits (arrive_last,
 * merge_splits).
 *
 * With KV_CACHE (kvcache.cuh) the kernel is one step against a KV cache
 * (fa_forward_kvcache): the lengths are device data (len_k = cache_seqlens
 * + seqlen_new per sequence); K and V rows come from the cache,
 * contiguous or through the block table's pages (PAGED: a ring of the
 * next tiles' page indices rides with the copies), the step's new rows
 * from k_new and v_new (APPEND), rotated where ROTARY_DIM asks, as are
 * the queries; softcap and ALiBi transform the scores (SCORE_OPTIONS).
 * One block of each (sequence, KV head) also writes the new rows into the
 * cache, once the whole sequence is known to keep the rules (with splits,
 * the last block of row tile 0 to arrive); every block reads them from
 * k_new and v_new, so no block of the launch reads a cache row the launch
 * writes, and one launch is a whole step. A sequence whose lengths or page
 * indices break the descriptor's rules gets NaN rows, appends nothing and
 * has nothing read or written outside the tensors.
 *
 * Options: BR BC WARPS STAGES, common.cuh's and kvcache.cuh's. Dropout and
 * the block mask are not built here (the planner does not plan this
 * kernel for them). Layout of the dynamic shared memory
 * (core/planner_decode.c counts the same bytes):
 *   Qs [BR x HEAD_DIM] (mma.cuh's padded tile; PAGED keeps the page ring
 *   in its rows' padding chunks), then either the stages' Ks, Vs
 *   [STAGES][BC x HEAD_DIM] (swizzled rows, kv_off; the planner counts
 *   padded ones, a little more) or, at the end, the warps' partial O
 *   [WARPS][BR][HEAD_DIM + 4] and (m, l) [WARPS][BR][2] in fp32; the merge
 *   (SPLIT_MERGE_LAST) reuses it all for per-row values, the splits'
 *   weights and, where they fit, every split's partial rows
 *   (stage_partials). */
#include "common.cuh"
#include "mma.cuh"
#include "rowwise.cuh"
#ifdef KV_CACHE
#include "kvcache.cuh"
#endif

#if defined(DROPOUT) || defined(BLOCK_MASK)
#error "decode.cu: dropout and block masks run in the other forward kernels"
#endif
#if ELEM_BYTES != 2
#error "decode.cu: fp16 or bf16"
#endif

#define THREADS (WARPS * 32)
#define MT (BR / 16)
#define WK 16 /* keys of a tile per warp */
#define NT (WK / 8)
#define DT (HEAD_DIM / 8)
#define KS (HEAD_DIM / 16)
#define O_STRIDE (HEAD_DIM + 4) /* fp32 words a partial row: 16-byte rows, fewer bank conflicts */

#if BR % 16 != 0 || BC != WK * WARPS || HEAD_DIM % 16 != 0 || STAGES < 2
#error "decode: BR a multiple of 16, BC = 16 * WARPS, HEAD_DIM a multiple of 16, STAGES >= 2"
#endif

#define Q_BYTES TILE_BYTES(BR, HEAD_DIM * ELEM_BYTES)
#define KV_TILE_BYTES TILE_BYTES(BC, HEAD_DIM * ELEM_BYTES)

/* KV_EVICT_FIRST (a tuning option, FLASHATTN_CUDA_OPTIONS): K and V are
 * read once a step, so they may leave L2 first. */
#ifdef KV_EVICT_FIRST
#define KV_ONCE true
#else
#define KV_ONCE false
#endif

/* The K/V copies of a tile: 16 bytes a thread and copy, no L2 prefetch
 * size (.L2::256B added 45% to the traffic between the two halves of the
 * H200's L2 and nothing to the speed). */
FA_DEV void cp_async16_kv(u32 dst, const void *src, int src_bytes, u64 pol) {
#ifdef KV_EVICT_FIRST
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(pol));
#else
    (void)pol;
    cp_async16(dst, src, src_bytes);
#endif
}

/* A thread's share of a K/V tile where the work-group's threads divide
 * into whole rows of chunks: chunk column tid % ROW_CHUNKS of rows
 * tid / ROW_CHUNKS + KV_STEP i. The passes are unrolled, K's and V's copies
 * side by side, so that a tile's copies leave in one burst (a loop of one
 * copy a trip, with its index arithmetic in between, leaves the memory
 * system idle for part of each tile: what capped paged steps at 0.68 of
 * the copy bandwidth on the H200). */
#if THREADS % ROW_CHUNKS == 0 && BC % (THREADS / ROW_CHUNKS) == 0
#define KV_STEP (THREADS / ROW_CHUNKS)
#define KV_PASSES (BC / KV_STEP)
/* Eight passes at once at most: sixteen (head_dim 256) spilled the
 * addresses on sm_80. */
#define KV_UNROLL 8
#endif

/* Layout of the K and V tiles: rows of exactly ROW_CHUNKS chunks, chunk c
 * of row r at c ^ (r % 8), where rows have 8 chunks or more and the copies
 * go in whole rows (KV_STEP); mma.cuh's padded rows otherwise, or with
 * KV_PADDED (a tuning option). Eight consecutive rows of one chunk column
 * fall in eight bank groups either way (ldmatrix without conflicts), but a
 * padded row starts 16 bytes further on each row: the copies into it
 * brought 1.5 times the bytes of K and V from L2 to the SMs, which held a
 * long step at 0.93 of cuDNN's speed on the H200; swizzled rows on 128-byte
 * boundaries bring each byte once (bench/results/h200.md). */
#if !defined(KV_PADDED) && defined(KV_STEP) && ROW_CHUNKS % 8 == 0
FA_DEV int kv_off(int r, int c) { return (r * ROW_CHUNKS + (c ^ (r & 7))) * 16; }
#else
FA_DEV int kv_off(int r, int c) { return chunk_off(r, c); }
#endif
FA_DEV u32 kv_addr(u32 base, int r, int c) { return base + (u32)kv_off(r, c); }

/* mma.cuh's load_b2 (K's rows n0 .., k16 step s) and load_bt2 (V's rows
 * r0 .. r0 + 15, n-tiles j, j + 1) on that layout. */
FA_DEV void kv_load_b2(u32 base, int n0, int s, u32 *b0, u32 *b1, int lane) {
    const int bi = lane >> 3;
    ldsm_x4(kv_addr(base, n0 + (bi >> 1) * 8 + (lane & 7), 2 * s + (bi & 1)), b0[0], b0[1], b1[0], b1[1]);
}
FA_DEV void kv_load_bt2(u32 base, int r0, int j, u32 *b0, u32 *b1, int lane) {
    const int bi = lane >> 3;
    ldsm_x4_t(kv_addr(base, r0 + (bi & 1) * 8 + (lane & 7), j + (bi >> 1)), b0[0], b0[1], b1[0], b1[1]);
}

#ifdef KV_STEP
/* Rows [0, BC) of K and V from kg and vg (row strides kss, vss): rows from
 * valid on are zero-filled. */
FA_DEV void load_kv_rows(u32 kd, u32 vd, const elem_t *kg, i64 kss, const elem_t *vg, i64 vss, int valid, int tid) {
    const u64 pol = KV_ONCE ? l2_evict_first() : 0;
    const int c = tid % ROW_CHUNKS, r0 = tid / ROW_CHUNKS;
    const elem_t *kr = kg + (i64)r0 * kss + c * CHUNK_ELEMS, *vr = vg + (i64)r0 * vss + c * CHUNK_ELEMS;
    const i64 kstep = (i64)KV_STEP * kss, vstep = (i64)KV_STEP * vss;
#pragma unroll KV_UNROLL
    for (int i = 0; i < KV_PASSES; i++, kr += kstep, vr += vstep) {
        const int r = r0 + i * KV_STEP, bytes = r < valid ? 16 : 0;
        cp_async16_kv(kv_addr(kd, r, c), bytes ? kr : kg, bytes, pol);
        cp_async16_kv(kv_addr(vd, r, c), bytes ? vr : vg, bytes, pol);
    }
}
#endif

#ifndef KV_CACHE
/* K and V of key tile t into stage buffer st: rows past the sequence are
 * zero-filled. */
FA_DEV void load_kv(u32 k_sm, u32 v_sm, int st, const elem_t *kg, const elem_t *vg, const fa_params &p, int t,
                    int len_k, int tid) {
#ifdef KV_STEP
    load_kv_rows(k_sm + (u32)st * KV_TILE_BYTES, v_sm + (u32)st * KV_TILE_BYTES, kg + (i64)t * BC * p.k_ss, p.k_ss,
                 vg + (i64)t * BC * p.v_ss, p.v_ss, len_k - t * BC, tid);
#else
    load_tile_async<BC, THREADS, KV_ONCE>(k_sm + (u32)st * KV_TILE_BYTES, kg + (i64)t * BC * p.k_ss, p.k_ss,
                                          len_k - t * BC, tid);
    load_tile_async<BC, THREADS, KV_ONCE>(v_sm + (u32)st * KV_TILE_BYTES, vg + (i64)t * BC * p.v_ss, p.v_ss,
                                          len_k - t * BC, tid);
#endif
}
#endif

#ifdef KV_CACHE
#ifdef VARLEN
#error "decode.cu: a KV-cache step has fixed-length batches"
#endif
#if defined(SPLITK) && !defined(SPLIT_MERGE_LAST)
#error "decode.cu: a split KV-cache step merges (and appends) in its last block"
#endif
/* Where a cache step's key tiles come from: sequence b's cache rows below
 * cs (contiguous, or in the pages the ring names), k_new / v_new rows from
 * cs to len_k (APPEND), zeros past len_k. */
struct kv_src {
    const elem_t *k, *v;   /* the cache at (sequence b, or page 0), token 0, head hk */
    const elem_t *kn, *vn; /* k_new and v_new at (b, token 0, head hk); APPEND */
    int cs, len_k, b;
};

#ifdef PAGED
FA_DEV int ld_shared_s32(u32 addr) {
    int v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
FA_DEV void st_shared_s32(u32 addr, int v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v)); }

/* The page ring: the page indices of the four 16-row groups of key tile X
 * (a page holds a multiple of 16 tokens and tiles start at multiples of
 * 64, so each group lies in one page, and a tile spans at most four pages
 * whatever the page size) in the padding chunk of Q tile row X % PG_SLOTS:
 * 16 bytes the products never read. Tile X's entries are loaded with
 * cp.async in the group of tile X - (STAGES - 1)'s K and V, so they have
 * landed when tile X's own copies are issued STAGES - 1 iterations later;
 * the first PG_SLOTS tiles' are read before the loop. Entries are checked
 * where they are used (page_ok); groups past the sequence are never read. */
#define PG_SLOTS (2 * STAGES - 2)
#if PG_SLOTS > BR || BC != 64
#error "decode.cu: the page ring needs 2 * STAGES - 2 <= BR and 64-key tiles"
#endif
FA_DEV u32 pg_slot(u32 q_sm, int tile) { return q_sm + (u32)chunk_off(tile % PG_SLOTS, ROW_CHUNKS); }

#ifdef KV_STEP
/* Key tile t wholly in sequence s's paged cache: the ring's four page
 * indices read once, each row's source from its 16-row group's page, K and
 * V together (load_kv_rows' burst). A page outside the pool gives zeros. */
FA_DEV void load_kv_paged(u32 kd, u32 vd, const fa_params &p, const fa_kv_params &kv, const kv_src &s, u32 slot,
                          int t, int tid) {
    const u64 pol = KV_ONCE ? l2_evict_first() : 0;
    int pg[4];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(pg[0]), "=r"(pg[1]), "=r"(pg[2]), "=r"(pg[3])
                 : "r"(slot));
    const int c = tid % ROW_CHUNKS, r0 = tid / ROW_CHUNKS;
    /* t * BC + r < len_k fits an int; a page's first row on the tile. */
    const int j0 = t * BC;
#pragma unroll KV_UNROLL
    for (int i = 0; i < KV_PASSES; i++) {
        const int r = r0 + i * KV_STEP;
        /* r0 < KV_STEP: at up to 16 rows a pass the group is a constant. */
        const int grp = KV_STEP <= 16 ? i * KV_STEP / 16 : r >> 4;
        const int page = grp == 0 ? pg[0] : grp == 1 ? pg[1] : grp == 2 ? pg[2] : pg[3];
        const bool ok = page_ok(kv, page);
        const i64 row = (j0 + r) % PAGED, pc = ok ? page : 0;
        const elem_t *ks = s.k + pc * p.k_sb + row * p.k_ss + c * CHUNK_ELEMS;
        const elem_t *vs = s.v + pc * p.v_sb + row * p.v_ss + c * CHUNK_ELEMS;
        cp_async16_kv(kv_addr(kd, r, c), ok ? ks : s.k, ok ? 16 : 0, pol);
        cp_async16_kv(kv_addr(vd, r, c), ok ? vs : s.v, ok ? 16 : 0, pol);
    }
}
#endif
#endif

/* Rows [0, BC) of key tile t of one tensor into the tile at dst: cache
 * rows from c_base (page stride sb with PAGED, row stride ss), new rows
 * from n_base (row stride nss), zeros past len_k or in a page outside the
 * pool. skip_new leaves the new rows' chunks to rotate_new_keys. */
FA_DEV void load_tile_kv_cache(u32 dst, const elem_t *c_base, i64 sb, i64 ss, const elem_t *n_base, i64 nss, int t,
                               const kv_src &s, u32 slot, const fa_kv_params &kv, bool skip_new, int tid) {
    (void)sb;
    (void)n_base;
    (void)nss;
    (void)slot;
    (void)kv;
    (void)skip_new;
    /* t * BC < len_k: the rows left of each part fit an int. */
    const int cache_left = s.cs - t * BC;
#pragma unroll 1
    for (int e = tid; e < BC * ROW_CHUNKS; e += THREADS) {
        const int r = e / ROW_CHUNKS, c = e - r * ROW_CHUNKS;
        const elem_t *src = c_base;
        int bytes = 0;
        if (r < cache_left) {
            const int j = t * BC + r;
#ifdef PAGED
            const int pg = ld_shared_s32(slot + 4u * (u32)(r >> 4));
            if (page_ok(kv, pg)) {
                src = c_base + (i64)pg * sb + (i64)(j % PAGED) * ss + c * CHUNK_ELEMS;
                bytes = 16;
            }
#else
            src = c_base + (i64)j * ss + c * CHUNK_ELEMS;
            bytes = 16;
#endif
        }
#ifdef APPEND
        else if (r < s.len_k - t * BC) {
            if (skip_new) continue;
            src = n_base + (i64)(r - cache_left) * nss + c * CHUNK_ELEMS;
            bytes = 16;
        }
#endif
        cp_async16(kv_addr(dst, r, c), src, bytes);
    }
}

#if defined(APPEND) && defined(ROTARY_DIM)
/* The new rows of key tile t (cs <= j < len_k) from k_new into the K tile
 * at dst, rotated at their positions j: the rotated chunks through this
 * thread's loads and stores (they are in shared memory before the barrier
 * that precedes the tile's use), the others with cp.async. */
FA_DEV void rotate_new_keys(u32 dst, const kv_src &s, const fa_kv_params &kv, int t, int tid) {
    const int cache_left = s.cs - t * BC;
    const int r0 = max(cache_left, 0), r1 = min(s.len_k - t * BC, BC);
#pragma unroll 1
    for (int e = r0 * ROW_CHUNKS + tid; e < r1 * ROW_CHUNKS; e += THREADS) {
        const int r = e / ROW_CHUNKS, c = e - r * ROW_CHUNKS, n = r - cache_left;
        const elem_t *row = s.kn + (i64)n * kv.kn_ss;
        const u32 a = kv_addr(dst, r, c);
        if (c * CHUNK_ELEMS < ROTARY_DIM) {
            float v[8];
            rotary8(row, c * CHUNK_ELEMS, s.cs + n, kv, v);
            st_shared16(a, pack8(v));
        } else {
            cp_async16(a, row + c * CHUNK_ELEMS, 16);
        }
    }
}
#endif

/* K and V of key tile t into stage buffer st. Tiles wholly in a
 * contiguous cache take the plain decoding copies. */
FA_DEV void load_kv_step(u32 k_sm, u32 v_sm, u32 q_sm, int st, const fa_params &p, const fa_kv_params &kv,
                         const kv_src &s, int t, int tid) {
    (void)q_sm;
    const u32 kd = k_sm + (u32)st * KV_TILE_BYTES, vd = v_sm + (u32)st * KV_TILE_BYTES;
#ifndef PAGED
#ifdef APPEND
    if (s.cs - t * BC >= BC)
#endif
    {
#ifdef KV_STEP
        load_kv_rows(kd, vd, s.k + (i64)t * BC * p.k_ss, p.k_ss, s.v + (i64)t * BC * p.v_ss, p.v_ss, s.len_k - t * BC,
                     tid);
#else
        load_tile_async<BC, THREADS, KV_ONCE>(kd, s.k + (i64)t * BC * p.k_ss, p.k_ss, s.len_k - t * BC, tid);
        load_tile_async<BC, THREADS, KV_ONCE>(vd, s.v + (i64)t * BC * p.v_ss, p.v_ss, s.len_k - t * BC, tid);
#endif
        return;
    }
#endif
#if defined(PAGED) && defined(KV_STEP)
    if (s.cs - t * BC >= BC) {
        load_kv_paged(kd, vd, p, kv, s, pg_slot(q_sm, t), t, tid);
        return;
    }
#endif
#ifdef PAGED
    const u32 slot = pg_slot(q_sm, t);
#else
    const u32 slot = 0;
#endif
#ifdef ROTARY_DIM
    const bool rotated = true;
#else
    const bool rotated = false;
#endif
    load_tile_kv_cache(kd, s.k, p.k_sb, p.k_ss, s.kn, kv.kn_ss, t, s, slot, kv, rotated, tid);
    load_tile_kv_cache(vd, s.v, p.v_sb, p.v_ss, s.vn, kv.vn_ss, t, s, slot, kv, false, tid);
#if defined(APPEND) && defined(ROTARY_DIM)
    if (s.len_k - t * BC > 0 && s.cs - t * BC < BC) rotate_new_keys(kd, s, kv, t, tid);
#endif
}

#ifdef APPEND
/* The step's new keys and values of KV head hk written into sequence b's
 * cache at cs .. cs + seqlen_new - 1 (keys rotated with ROTARY_DIM,
 * through the same rotary8 as the attention's copies, so the bits agree),
 * by one block of the (sequence, KV head), for a sequence known to keep
 * the rules. No block of the launch reads those cache rows (every block
 * takes the new rows from k_new and v_new), so nothing orders these
 * writes against the attention; the next step's launch reads them. The
 * page check stays (a page outside the pool is never written). */
FA_DEV void append_new(const fa_params &p, const fa_kv_params &kv, const kv_src &s, int hk, int tid) {
    const i64 chunks = (i64)kv.seqlen_new * ROW_CHUNKS;
    for (i64 e = tid; e < chunks; e += THREADS) {
        const int n = (int)(e / ROW_CHUNKS), c = (int)(e - (i64)n * ROW_CHUNKS), j = s.cs + n;
#ifdef PAGED
        const int pg = __ldg(table_entry(kv, s.b, j));
        if (!page_ok(kv, pg)) continue;
        const i64 kr = cache_row(p.k_off, p.k_sb, p.k_ss, p.k_sh, pg, j, hk);
        const i64 vr = cache_row(p.v_off, p.v_sb, p.v_ss, p.v_sh, pg, j, hk);
#else
        const i64 kr = cache_row(p.k_off, p.k_sb, p.k_ss, p.k_sh, s.b, j, hk);
        const i64 vr = cache_row(p.v_off, p.v_sb, p.v_ss, p.v_sh, s.b, j, hk);
#endif
        const elem_t *krow = s.kn + (i64)n * kv.kn_ss, *vrow = s.vn + (i64)n * kv.vn_ss;
#ifdef ROTARY_DIM
        float v[8];
        rotary8(krow, c * CHUNK_ELEMS, j, kv, v);
        *(uint4 *)((elem_t *)p.k + kr + c * CHUNK_ELEMS) = pack8(v);
#else
        *(uint4 *)((elem_t *)p.k + kr + c * CHUNK_ELEMS) = *(const uint4 *)(krow + c * CHUNK_ELEMS);
#endif
        *(uint4 *)((elem_t *)p.v + vr + c * CHUNK_ELEMS) = *(const uint4 *)(vrow + c * CHUNK_ELEMS);
    }
}
#endif
#endif /* KV_CACHE */

/* Four dimensions from x of row tok of head h, final, in the storage
 * dtype. */
FA_DEV void store_o4(const fa_params &p, int b, const fa_seq &seq, int tok, int h, int x, const float v[4]) {
    elem_t *orow = (elem_t *)p.o + O_ROW(p, b, seq, tok, h) + x;
    *(uint2 *)orow = make_uint2(pack2(v[0], v[1]), pack2(v[2], v[3]));
}

/* Token and head-in-group of packed row pr (pr < group * len_q). */
FA_DEV void unpack_row(int pr, int group, int *tok, int *gh) {
    *tok = pr / group;
    *gh = pr - *tok * group;
}

/* L of a finished row (fa_forward_kvcache's lse may be NULL: KV_CACHE
 * builds store it only where it was given). */
FA_DEV void store_lse(const fa_params &p, i64 index, float value) {
#ifdef KV_CACHE
    if (!p.lse) return;
#endif
    p.lse[index] = value;
}

#ifdef SPLIT_MERGE_LAST
/* The split merge in the step's own launch: the last of the num_splits
 * blocks of a (row tile, KV head, sequence) to finish merges their partial
 * rows (rowwise.cuh's fa_splitk_merge, the same weights and the same rules
 * for rows without mass), so a step is one launch and the merge runs on
 * many SMs at once. The arrivals are counted in a word per (row tile, KV
 * head, sequence) that follows the partial L's; atomicInc wraps it to 0 on
 * the last arrival, ready for the next step without a memset. The
 * partials are read through L2 (__ldcg): other blocks wrote them.
 *
 * The merge is a chain of L2 round trips on the step's critical path, so
 * every pass issues all its loads before it uses any: the row pass holds
 * MERGE_PER_LANE L_s in each of MERGE_LPR lanes a row (128 splits at
 * once), the output pass MERGE_SPLITS splits of MERGE_ELEMS output chunks
 * a thread. (Loads consumed one split at a time behind a branch each cost
 * one round trip a split and output chunk: 2 x 66 of them at batch 1, most
 * of that step's time.) */
#define MERGE_LPR 8
#define MERGE_PER_LANE 16
#define MERGE_ELEMS 2
#define MERGE_SPLITS 16
#if MERGE_LPR * MERGE_PER_LANE != 128
#error "decode.cu: merge_share takes 128 splits (cuda_attention.c CU_MEET_MAX_SPLITS)"
#endif
/* merge_share's lanes a chunk and splits a lane: 16 of up to 8 (at batch
 * 1, 33 splits of 8 rows: 8 chunks a split, one pass of every thread, up
 * to 3 splits' loads a lane, where 8 lanes of 16 left half the threads
 * idle with 5 each). */
#define SHARE_LPR 16
#define SHARE_PER_LANE 8
#if SHARE_LPR * SHARE_PER_LANE != 128 || SHARE_LPR > 32 || 32 % SHARE_LPR != 0
#error "decode.cu: merge_share takes 128 splits (cuda_attention.c CU_MEET_MAX_SPLITS) in lane groups of a warp"
#endif

/* Splits whose weights a row keeps in shared memory at once: what the
 * smallest dynamic shared memory of this build (Q and two stages of K and
 * V) holds beside the three per-row values. */
#define MERGE_SMEM_MIN (Q_BYTES + 2 * 2 * KV_TILE_BYTES)
#define MERGE_WCAP_FIT ((MERGE_SMEM_MIN - 3 * 4 * BR) / (4 * BR))
#define MERGE_WCAP (MERGE_WCAP_FIT < 128 ? MERGE_WCAP_FIT : 128)
#if MERGE_WCAP < MERGE_SPLITS
#error "decode.cu: the merge's weights do not fit the shared memory"
#endif

/* The weights of splits [c0, c0 + cnt) of each of the tile's rows,
 * exp(L_s - L_row) (NaN for a NaN L_s), or -1 for a split without mass,
 * into w[r][s - c0] (rows of MERGE_WCAP). */
FA_DEV void merge_weights(const fa_params &p, const fa_seq &seq, int hk, int pr0, int rows, int c0, int cnt, float *w,
                          const float *row_m, const float *row_inv) {
    const i64 split_stride = (i64)p.heads_q * p.total_q;
    for (int i = threadIdx.x; i < rows * cnt; i += THREADS) {
        const int r = i / cnt, s = c0 + i - r * cnt;
        int tok, gh;
        unpack_row(pr0 + r, p.group, &tok, &gh);
        const float l = __ldcg(p.part_l + s * split_stride + (i64)(hk * p.group + gh) * p.total_q + seq.start_q + tok);
        w[r * MERGE_WCAP + s - c0] = l == -FA_INF ? -1.0f : expf(l - row_m[r]) * row_inv[r];
    }
}

/* The workspace words of this block's (row tile, KV head, sequence) after
 * the partial L's: its arrival count; the group's flag word (KV_CACHE)
 * and meet_splits' generation word follow, each `*apart` words after the
 * one before (one word per group of every sequence). */
FA_DEV u32 *group_count(const fa_params &p, int b, int hk, i64 *apart) {
    const int ns = p.num_splits;
    *apart = (i64)(gridDim.z / ns) * gridDim.y * gridDim.x;
    return (u32 *)(p.part_l + (i64)ns * p.heads_q * p.total_q) + ((i64)b * gridDim.y + hk) * gridDim.x + blockIdx.x;
}

/* The arrival of this block at its (row tile, KV head, sequence): whether
 * it is the last of the num_splits blocks. Before arriving it ORs bits into
 * the group's flag word (KV_CACHE: a page outside the pool seen in this
 * split's share of the check); the last block takes the word's value,
 * every split's bits, into *flags and clears it for the next step. The
 * words follow the counters in the workspace. */
FA_DEV bool arrive_last(const fa_params &p, int b, int hk, u32 bits, u32 *flags) {
    const int tid = threadIdx.x, ns = p.num_splits;
    i64 apart;
    u32 *count = group_count(p, b, hk, &apart);
#ifdef KV_CACHE
    u32 *flag = count + apart;
    if (tid == 0 && bits) atomicOr(flag, bits);
#else
    (void)bits;
#endif
    __threadfence(); /* this block's partials (and bits) before its arrival */
    __syncthreads();
    bool arrived_last = false;
    if (tid == 0) arrived_last = atomicInc(count, (u32)(ns - 1)) == (u32)(ns - 1);
    if (!__syncthreads_or(arrived_last)) return false;
    __threadfence(); /* the other blocks' partials after their arrivals */
    *flags = 0;
#ifdef KV_CACHE
    *flags = __syncthreads_or(tid == 0 && atomicExch(flag, 0u) != 0u) ? 1u : 0u;
#endif
    return true;
}

/* Whether the blocks of this (row tile, KV head, sequence) meet instead
 * (tiles of up to 32 rows: beside four strips' state, merge_share's loads
 * spilled on sm_80; cuda_attention.c CU_MEET_MAX_ROWS):
 * with p.splits_meet the launch is cooperative, every block resident at
 * once, and each split waits at a barrier of its group until all
 * num_splits have stored their partials, then merges its own share of the
 * group's rows (merge_share): the merge is spread over the group's SMs and
 * costs one L2 round trip, where the last block to arrive reads every
 * split's rows alone (6-7 us of a 26 us batch-1 step at 16k keys on an
 * H100, bench/results/h100.md). The barrier is a generation word after
 * the flag words, counted as cooperative groups' grid barrier counts:
 * split 0 adds 2^31 - (ns - 1), every other split 1, so the ns arrivals
 * add exactly 2^31 and the top bit flips at the last of them and never
 * before (a partial sum without split 0 is below ns - 1, one with it
 * below 2^31); the low bits come back to where they were, ready for the
 * next step with no reset. Thread 0 arrives with one acq_rel atomic after
 * the block's barrier (its release covers every thread's partial stores
 * through the barrier, as the grid barrier's single fence does); the block
 * whose add flips the bit is the last and has acquired the others'
 * releases through the chain of read-modify-writes; the others poll with
 * acquire loads until the top bit differs from the value their own add
 * returned. An earlier barrier read the generation before arriving,
 * counted in a second word and fenced three times; with it (and
 * merge_share's 8 lanes a chunk) a batch-1 step at 16k keys took 21.4 us
 * on an H200 where it takes 20.1 now (bench/results/h200.md,
 * 2026-11-29). The count word stays 0 (arrive_last's, for a plain
 * launch's fallback). Before arriving a block ORs its bits into the flag
 * word as arrive_last does; split 0 of the group reads and clears it
 * beside its merge (the exchange issued before the merge's loads and
 * waited for after them; the append that needs the bits follows the
 * merge). */
FA_DEV u32 atom_add_acq_rel_gpu(u32 *a, u32 v) {
    u32 old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(a), "r"(v) : "memory");
    return old;
}
FA_DEV u32 ld_acquire_gpu(const u32 *a) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
    return v;
}
#define MEET_FLIP_BIT 0x80000000u

FA_DEV void meet_splits(const fa_params &p, int b, int hk, int split, u32 bits) {
    const int tid = threadIdx.x, ns = p.num_splits;
    i64 apart;
    u32 *count = group_count(p, b, hk, &apart);
#ifdef KV_CACHE
    u32 *gen = count + 2 * apart;
    if (tid == 0 && bits) atomicOr(count + apart, bits);
#else
    u32 *gen = count + apart;
    (void)bits;
#endif
    __syncthreads(); /* every thread's partials (and bits) before thread 0's release */
    if (tid == 0) {
        const u32 add = split == 0 ? MEET_FLIP_BIT - (u32)(ns - 1) : 1u;
        const u32 old = atom_add_acq_rel_gpu(gen, add);
        if (((old ^ (old + add)) & MEET_FLIP_BIT) == 0u) {
            u32 g;
            do {
                __nanosleep(32);
                g = ld_acquire_gpu(gen);
            } while (((g ^ old) & MEET_FLIP_BIT) == 0u);
        }
    }
    __syncthreads(); /* thread 0's acquire before every thread's loads */
}

/* Split `split`'s share of the merge after meet_splits: chunks [c0, c1) of
 * the tile's rows x HEAD_DIM / 4 four-dimension chunks, SHARE_LPR lanes a
 * chunk, each lane loading L_s and O_s of its splits (s = sub + SHARE_LPR
 * i, every load at once: one round trip) and the lanes meeting by shuffles.
 * The rules are merge_splits': the same maxima, sums and weights, NaN
 * where a split without mass saw a NaN, L for chunk 0 of each row. */
FA_DEV void merge_share(const fa_params &p, int b, const fa_seq &seq, int hk, int pr0, int rows_total, int split) {
    const int tid = threadIdx.x, lane = tid & 31, ns = p.num_splits, group = p.group;
    const int rows = min(BR, rows_total - pr0);
    constexpr int D4 = HEAD_DIM / 4, PER_PASS = THREADS / SHARE_LPR;
    const int chunks = rows * D4, per = (chunks + ns - 1) / ns;
    const int c0 = min(chunks, split * per), c1 = min(chunks, c0 + per);
    const int sub = lane & (SHARE_LPR - 1), gshift = lane & ~(SHARE_LPR - 1);
    const unsigned group_bits = (1u << SHARE_LPR) - 1u;
    const i64 split_stride = (i64)p.heads_q * p.total_q;
    /* The loop's bounds are the block's, so every lane takes the shuffles. */
    for (int base = c0; base < c1; base += PER_PASS) {
        const int c = base + tid / SHARE_LPR;
        const bool live = c < c1;
        const int r = live ? c / D4 : 0, x = live ? (c - r * D4) * 4 : 0;
        int tok = 0, gh = 0;
        unpack_row(pr0 + r, group, &tok, &gh);
        const i64 row = (i64)(hk * group + gh) * p.total_q + seq.start_q + tok;
        float l[SHARE_PER_LANE];
        float4 o[SHARE_PER_LANE];
#pragma unroll
        for (int i = 0; i < SHARE_PER_LANE; i++) {
            const int s = sub + SHARE_LPR * i;
            const bool in = live && s < ns;
            l[i] = in ? __ldcg(p.part_l + s * split_stride + row) : -FA_INF;
            o[i] = in ? __ldcg((const float4 *)(p.part_o + (s * split_stride + row) * HEAD_DIM + x))
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float m = -FA_INF;
#pragma unroll
        for (int i = 0; i < SHARE_PER_LANE; i++) m = fmaxf(m, l[i]);
#pragma unroll
        for (int off = 1; off < SHARE_LPR; off <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        /* fmaxf skips NaN, as in merge_splits. */
        const float base_m = m == -FA_INF ? 0.0f : m;
        float sum = 0.0f;
        bool mass = false, nan_seen = false;
#pragma unroll
        for (int i = 0; i < SHARE_PER_LANE; i++) {
            sum += expf(l[i] - base_m); /* 0 for -inf, NaN for NaN */
            mass |= l[i] != -FA_INF;
            nan_seen |= sub + SHARE_LPR * i < ns && fa_isnan(o[i].x);
        }
#pragma unroll
        for (int off = 1; off < SHARE_LPR; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        mass = (__ballot_sync(0xffffffffu, mass) >> gshift & group_bits) != 0;
        /* No split with mass: NaN where one saw keys (its O_s is NaN). The
         * ballot is taken by every lane: behind `!mass &&` only some lanes
         * took it, and the warp's shuffles paired up wrongly. */
        const bool any_nan = (__ballot_sync(0xffffffffu, nan_seen) >> gshift & group_bits) != 0;
        const bool nan_o = !mass && any_nan;
        const float inv = 1.0f / sum;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < SHARE_PER_LANE; i++) {
            const bool in = sub + SHARE_LPR * i < ns;
            const float w = l[i] == -FA_INF ? -1.0f : expf(l[i] - base_m) * inv;
            const bool has = in && !(w < 0.0f); /* a NaN weight spreads */
            const float oc[4] = {o[i].x, o[i].y, o[i].z, o[i].w};
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = has ? fmaf(w, oc[k], v[k]) : in && !mass && fa_isnan(oc[k]) ? FA_NAN : v[k];
        }
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int off = 1; off < SHARE_LPR; off <<= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
        if (live && sub == 0) {
            store_o4(p, b, seq, tok, hk * group + gh, x, v);
            if (x == 0)
                store_lse(p, lse_index(p, b, hk * group + gh, tok, seq.start_q),
                          mass ? base_m + logf(sum) : nan_o ? FA_NAN : -FA_INF);
        }
    }
}

/* Where the merge reads the splits' partial L and O: from L2, or, where
 * every split's rows fit the block's shared memory beside the merge's own
 * values, from copies staged there by stage_partials in one burst. A merge
 * reading L2 a few splits at a time waits one round trip per few splits
 * (five at batch 1 with 33 splits: 7 of a 22 us step on the H200); the
 * burst waits for one. */
struct merge_src {
    const float *l, *o; /* staged: [split][row] and [split][row][HEAD_DIM]; NULL: L2 */
    int rows;
};

FA_DEV float part_l_at(const fa_params &p, const merge_src &ms, int s, int r, i64 row) {
    return ms.l ? ms.l[s * ms.rows + r] : __ldcg(p.part_l + s * ((i64)p.heads_q * p.total_q) + row);
}

FA_DEV float4 part_o4_at(const fa_params &p, const merge_src &ms, int s, int r, i64 row, int x) {
    return ms.o ? *(const float4 *)(ms.o + ((i64)s * ms.rows + r) * HEAD_DIM + x)
                : __ldcg((const float4 *)(p.part_o + (s * ((i64)p.heads_q * p.total_q) + row) * HEAD_DIM + x));
}

/* Row r's index in the partials (head-major rows of the packed tile). */
FA_DEV i64 part_row(const fa_params &p, const fa_seq &seq, int hk, int pr) {
    int tok, gh;
    unpack_row(pr, p.group, &tok, &gh);
    return (i64)(hk * p.group + gh) * p.total_q + seq.start_q + tok;
}

/* Copies every split's partial O and L of the tile's rows into shared
 * memory from byte off on, when they fit the block's dynamic shared
 * memory: O with cp.async through L2 (other blocks wrote it), L through
 * __ldcg. Returns the staged source, or one that reads L2. */
FA_DEV merge_src stage_partials(const fa_params &p, const fa_seq &seq, int hk, int pr0, int rows, unsigned char *smem,
                                u32 off) {
    merge_src ms;
    ms.l = ms.o = nullptr;
    ms.rows = rows;
#if BR > 32
    /* Four strips of rows: the staged pass's registers beside the other
     * one's spilled (sm_80, head_dim 64), and so many rows' partials rarely
     * fit anyway. */
    (void)p, (void)seq, (void)hk, (void)pr0, (void)smem, (void)off;
    return ms;
#endif
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const int ns = p.num_splits;
    const u32 o_off = (off + 15u) & ~15u, l_off = o_off + (u32)ns * (u32)rows * HEAD_DIM * 4u;
    /* ns <= MERGE_WCAP (the weights of every split at once) and rows <=
     * BR: no overflow. */
    if (ns > MERGE_WCAP || l_off + (u32)ns * (u32)rows * 4u > dyn) return ms;
    const int tid = threadIdx.x;
    const i64 split_stride = (i64)p.heads_q * p.total_q;
    constexpr int C4 = HEAD_DIM / 4;
    float *so = (float *)(smem + o_off), *sl = (float *)(smem + l_off);
    /* A thread keeps its chunks of the rows and walks the splits with one
     * address step each: with the indices worked out per copy, the copies
     * were issue-bound (5.5 us for 135 KB at batch 1 on the H100). */
    const i64 o_step = split_stride * HEAD_DIM;
    const u32 s_step = (u32)rows * HEAD_DIM * 4u;
    for (int e = tid; e < rows * C4; e += THREADS) {
        const int r = e / C4, x = (e - r * C4) * 4;
        const float *src = p.part_o + part_row(p, seq, hk, pr0 + r) * HEAD_DIM + x;
        u32 dst = smem_u32(so + (i64)r * HEAD_DIM + x);
#pragma unroll 4
        for (int sp = 0; sp < ns; sp++, src += o_step, dst += s_step) cp_async16(dst, src, 16);
    }
    cp_async_commit();
    for (int e = tid; e < ns * rows; e += THREADS) {
        const int sp = e / rows, r = e - sp * rows;
        sl[e] = __ldcg(p.part_l + sp * split_stride + part_row(p, seq, hk, pr0 + r));
    }
    cp_async_wait<0>();
    __syncthreads();
    ms.l = sl;
    ms.o = so;
    return ms;
}

/* The merge, by the last block to arrive (arrive_last). */
FA_DEV void merge_splits(const fa_params &p, int b, const fa_seq &seq, int hk, int pr0, int rows_total,
                         unsigned char *smem) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, group = p.group, ns = p.num_splits;

    /* Per row (MERGE_LPR lanes): the max of the L_s, whether any split has
     * mass (L_s > -inf, or NaN), the sum of exp(L_s - max) and the merged
     * L. Each lane sums its own splits against the group's running max;
     * the group meets once at the end. Where every split's weight fits in
     * shared memory at once (one_chunk: up to MERGE_WCAP splits, never
     * more than one pass here), the lanes write the weights from the L_s
     * they hold; else merge_weights reads them again per chunk. */
    float *row_m = (float *)smem, *row_inv = row_m + BR;
    int *row_mass = (int *)(row_inv + BR);
    float *wts = (float *)(row_mass + BR);
    const bool one_chunk = ns <= MERGE_WCAP;
    const int rows = min(BR, rows_total - pr0);
    const merge_src ms =
        stage_partials(p, seq, hk, pr0, rows, smem, (u32)((unsigned char *)(wts + BR * MERGE_WCAP) - smem));
    const int sub = lane & (MERGE_LPR - 1), gshift = lane & ~(MERGE_LPR - 1);
    constexpr int ROWS_PER_WARP = 32 / MERGE_LPR;
    for (int r0 = warp * ROWS_PER_WARP; r0 < rows; r0 += WARPS * ROWS_PER_WARP) {
        const int r = r0 + lane / MERGE_LPR;
        const bool live = r < rows;
        int tok = 0, gh = 0;
        if (live) unpack_row(pr0 + r, group, &tok, &gh);
        const i64 row = (i64)(hk * group + gh) * p.total_q + seq.start_q + tok;
        float m = -FA_INF, sum = 0.0f, l[MERGE_PER_LANE];
        bool mass = false;
        for (int s0 = 0; s0 < ns; s0 += MERGE_LPR * MERGE_PER_LANE) {
#pragma unroll
            for (int i = 0; i < MERGE_PER_LANE; i++) {
                const int s = s0 + sub + MERGE_LPR * i;
                l[i] = live && s < ns ? part_l_at(p, ms, s, r, row) : -FA_INF;
            }
            float cm = -FA_INF;
#pragma unroll
            for (int i = 0; i < MERGE_PER_LANE; i++) cm = fmaxf(cm, l[i]);
#pragma unroll
            for (int o = 1; o < MERGE_LPR; o <<= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
            /* fmaxf skips NaN: the max stays -inf where every L_s with mass
             * is NaN, and the sum below comes out NaN, as it must. */
            const float nm = fmaxf(m, cm), base = nm == -FA_INF ? 0.0f : nm;
            float cs = 0.0f;
#pragma unroll
            for (int i = 0; i < MERGE_PER_LANE; i++) {
                cs += expf(l[i] - base); /* 0 for -inf, NaN for NaN */
                mass |= l[i] != -FA_INF;
            }
            sum = sum * expf(m - base) + cs; /* m = -inf: 0 x sum (NaN stays) */
            m = nm;
        }
#pragma unroll
        for (int o = 1; o < MERGE_LPR; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const unsigned group_bits = (1u << MERGE_LPR) - 1u;
        mass = (__ballot_sync(0xffffffffu, mass) >> gshift & group_bits) != 0;
        /* No split with mass: NaN where one saw keys (its O_s is NaN). */
        bool nan_o = false;
        if (live && !mass)
            for (int s = sub; s < ns; s += MERGE_LPR)
                nan_o |= fa_isnan(part_o4_at(p, ms, s, r, row, 0).x);
        nan_o = (__ballot_sync(0xffffffffu, nan_o) >> gshift & group_bits) != 0;
        const float m_use = m == -FA_INF ? 0.0f : m, inv = 1.0f / sum;
        if (live && one_chunk) {
#pragma unroll
            for (int i = 0; i < MERGE_PER_LANE; i++) {
                const int s = sub + MERGE_LPR * i;
                if (s < ns) wts[r * MERGE_WCAP + s] = l[i] == -FA_INF ? -1.0f : expf(l[i] - m_use) * inv;
            }
        }
        if (live && sub == 0) {
            row_m[r] = m_use;
            row_inv[r] = inv;
            row_mass[r] = mass;
            store_lse(p, lse_index(p, b, hk * group + gh, tok, seq.start_q),
                      mass ? m_use + logf(sum) : nan_o ? FA_NAN : -FA_INF);
        }
    }
    __syncthreads();

    /* O = sum_s exp(L_s - L) O_s, the splits in order (the result does not
     * depend on which block came last), from the weights in shared memory
     * (-1 for a split without mass): the pass over the partial outputs
     * loads nothing else, MERGE_ELEMS chunks of four dimensions a thread,
     * MERGE_SPLITS splits of each in flight at once. */
    constexpr int D4 = HEAD_DIM / 4;
    const int elems = rows * D4;
    if (ms.o) {
        /* Staged: every split in shared memory, one chunk of four
         * dimensions a thread at a time (the same sum in the same order). */
        for (int e = tid; e < elems; e += THREADS) {
            const int r = e / D4, x = (e - r * D4) * 4;
            int tok, gh;
            unpack_row(pr0 + r, group, &tok, &gh);
            const bool mass = row_mass[r] != 0;
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int sp = 0; sp < ns; sp++) {
                const float w = wts[r * MERGE_WCAP + sp];
                const bool has = !(w < 0.0f); /* a NaN weight spreads */
                const float4 o4 = part_o4_at(p, ms, sp, r, 0, x);
                const float o[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
                for (int c = 0; c < 4; c++)
                    v[c] = has ? fmaf(w, o[c], v[c]) : !mass && fa_isnan(o[c]) ? FA_NAN : v[c];
            }
            store_o4(p, b, seq, tok, hk * group + gh, x, v);
        }
        return;
    }
    const i64 split_stride = (i64)p.heads_q * p.total_q;
    for (int e_base = 0; e_base < elems; e_base += MERGE_ELEMS * THREADS) {
        i64 row[MERGE_ELEMS];
        int r_of[MERGE_ELEMS], tok[MERGE_ELEMS], h[MERGE_ELEMS], x[MERGE_ELEMS];
        float v[MERGE_ELEMS][4];
        bool mass[MERGE_ELEMS];
#pragma unroll
        for (int q = 0; q < MERGE_ELEMS; q++) {
            const int e = min(e_base + tid + q * THREADS, elems - 1), r = e / D4;
            int gh;
            r_of[q] = r;
            x[q] = (e - r * D4) * 4;
            unpack_row(pr0 + r, group, &tok[q], &gh);
            h[q] = hk * group + gh;
            row[q] = (i64)h[q] * p.total_q + seq.start_q + tok[q];
            mass[q] = row_mass[r] != 0;
#pragma unroll
            for (int c = 0; c < 4; c++) v[q][c] = 0.0f;
        }
        for (int c0 = 0; c0 < ns; c0 += MERGE_WCAP) {
            const int cnt = min(MERGE_WCAP, ns - c0);
            if (!one_chunk) {
                __syncthreads(); /* the last chunk's weights are read */
                merge_weights(p, seq, hk, pr0, rows, c0, cnt, wts, row_m, row_inv);
                __syncthreads();
            }
            for (int s0 = 0; s0 < cnt; s0 += MERGE_SPLITS) {
                float4 o4[MERGE_ELEMS][MERGE_SPLITS];
#pragma unroll
                for (int q = 0; q < MERGE_ELEMS; q++)
#pragma unroll
                    for (int j = 0; j < MERGE_SPLITS; j++) {
                        const i64 i = (i64)(c0 + min(s0 + j, cnt - 1)) * split_stride + row[q];
                        o4[q][j] = __ldcg((const float4 *)(p.part_o + i * HEAD_DIM + x[q]));
                    }
                /* A memory-ordering point between the loads and their use:
                 * the scheduler may not sink a load past it, so all of them
                 * are in flight together (without it, ptxas issues about
                 * half of them after the first products). */
                __syncwarp();
#pragma unroll
                for (int q = 0; q < MERGE_ELEMS; q++)
#pragma unroll
                    for (int j = 0; j < MERGE_SPLITS; j++) {
                        const bool in = s0 + j < cnt;
                        const float w = wts[r_of[q] * MERGE_WCAP + min(s0 + j, cnt - 1)];
                        const bool has = in && !(w < 0.0f); /* a NaN weight spreads */
                        const float o[4] = {o4[q][j].x, o4[q][j].y, o4[q][j].z, o4[q][j].w};
#pragma unroll
                        for (int c = 0; c < 4; c++)
                            v[q][c] = has ? fmaf(w, o[c], v[q][c]) : in && !mass[q] && fa_isnan(o[c]) ? FA_NAN : v[q][c];
                    }
            }
        }
#pragma unroll
        for (int q = 0; q < MERGE_ELEMS; q++)
            if (e_base + tid + q * THREADS < elems) store_o4(p, b, seq, tok[q], h[q], x[q], v[q]);
    }
}
#endif

#ifdef KV_CACHE
#define KV_PARAM , const fa_kv_params kv
#else
#define KV_PARAM
#endif

/* DECODE_TRACE (a diagnostic option, FLASHATTN_CUDA_OPTIONS): thread 0 of
 * every block prints the global timer (ns) at its start, when its first
 * tile is in, after its last tile, after its partial rows are stored,
 * after its arrival and after the merge (0 where it did not get there),
 * one line a block: where a step's time goes, block by block. */
#ifdef DECODE_TRACE
#define TRACE_MARK(i) (trace_t[i] = threadIdx.x == 0 ? global_ns() : 0ull)
#define TRACE_PRINT()                                                                                              \
    do {                                                                                                           \
        if (threadIdx.x == 0)                                                                                      \
            printf("decode-trace %d %d %d %d %llu %llu %llu %llu %llu %llu\n", blockIdx.x, blockIdx.y, blockIdx.z,   \
                   sm_id(), trace_t[0], trace_t[1], trace_t[2], trace_t[3], trace_t[4], trace_t[5]);               \
    } while (0)
FA_DEV unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
FA_DEV int sm_id() {
    int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
#else
#define TRACE_MARK(i) ((void)0)
#define TRACE_PRINT() ((void)0)
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1) fa_fwd_decode(const fa_params p KV_PARAM) {
    extern __shared__ __align__(128) unsigned char smem[];
    const u32 q_sm = smem_u32(smem);
    const u32 k_sm = q_sm + Q_BYTES;
    const u32 v_sm = k_sm + STAGES * KV_TILE_BYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int hk = blockIdx.y, group = p.group;
#ifdef DECODE_TRACE
    unsigned long long trace_t[6] = {0ull, 0ull, 0ull, 0ull, 0ull, 0ull};
#endif
    TRACE_MARK(0);
#ifdef SPLITK
    const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
#else
    const int b = blockIdx.z;
#endif
#ifdef KV_CACHE
    /* The lengths are device data: len_k = cache_seqlens[b] + seqlen_new,
     * 0 for a sequence whose lengths break the rules (kvs.bad). */
    const fa_kv_seq kvs = kv_seq_of(p, kv, b);
    fa_seq seq;
    seq.len_q = p.seqlen_q;
    seq.len_k = kvs.len_k;
    seq.start_q = (i64)b * p.seqlen_q;
    seq.start_k = 0;
#else
    const fa_seq seq = seq_of(p, b);
#endif
    /* Packed rows of the sequence: group * len_q <= heads_q * len_q, which
     * the host checked fits an int. */
    const int rows_total = group * seq.len_q;
    const int pr0 = blockIdx.x * BR;
    if (pr0 >= rows_total) return;
    const fa_mask mask = mask_of(p, seq);
    const int tok_lo = pr0 / group, tok_hi = (min(pr0 + BR, rows_total) - 1) / group;

    /* Q rows: each from its own (token, head). With ROTARY_DIM the rotated
     * chunks of the rows are written after the first K/V copies are on
     * their way (below). */
    for (int e = tid; e < BR * ROW_CHUNKS; e += THREADS) {
        const int r = e / ROW_CHUNKS, c = e - r * ROW_CHUNKS;
        const int pr = pr0 + r;
        const bool ok = pr < rows_total;
#ifdef ROTARY_DIM
        if (ok && !kvs.bad && c * CHUNK_ELEMS < ROTARY_DIM) continue;
#endif
        const elem_t *src = (const elem_t *)p.q;
        if (ok) {
            int tok, gh;
            unpack_row(pr, group, &tok, &gh);
            src += Q_ROW(p, b, seq, tok, hk * group + gh) + c * CHUNK_ELEMS;
        }
        cp_async16(chunk_addr(q_sm, r, c), src, ok ? 16 : 0);
    }

    int k_lo, k_hi, t_begin, t_end;
    key_range(mask, tok_lo, tok_hi, &k_lo, &k_hi);
    tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    split_tiles(split, p.num_splits, &t_begin, &t_end);
#endif

#ifdef KV_CACHE
    kv_src src;
    src.b = b;
    src.cs = kvs.cs;
    src.len_k = kvs.len_k;
#ifdef PAGED
    src.k = (const elem_t *)p.k + p.k_off + (i64)hk * p.k_sh;
    src.v = (const elem_t *)p.v + p.v_off + (i64)hk * p.v_sh;
#else
    src.k = (const elem_t *)p.k + p.k_off + (i64)b * p.k_sb + (i64)hk * p.k_sh;
    src.v = (const elem_t *)p.v + p.v_off + (i64)b * p.v_sb + (i64)hk * p.v_sh;
#endif
#ifdef APPEND
    src.kn = (const elem_t *)kv.k_new + kv.kn_off + (i64)b * kv.kn_sb + (i64)hk * kv.kn_sh;
    src.vn = (const elem_t *)kv.v_new + kv.vn_off + (i64)b * kv.vn_sb + (i64)hk * kv.vn_sh;
#else
    src.kn = src.vn = nullptr;
#endif
#ifdef PAGED
    /* The first PG_SLOTS tiles' pages, before their copies. X * BC < len_k
     * where X < t_end. */
    for (int i = tid; i < 4 * PG_SLOTS; i += THREADS) {
        const int x = t_begin + i / 4, m16 = 16 * (i % 4);
        int pg = -1;
        if (x < t_end && m16 < kvs.len_k - x * BC) pg = __ldg(table_entry(kv, b, x * BC + m16));
        st_shared_s32(pg_slot(q_sm, x) + 4u * (u32)(i % 4), pg);
    }
    __syncthreads();
#endif
#else
    const elem_t *kg = (const elem_t *)p.k + K_ROW(p, b, seq, 0, hk);
    const elem_t *vg = (const elem_t *)p.v + V_ROW(p, b, seq, 0, hk);
#endif
    /* The first STAGES - 1 tiles; a group is committed for every stage,
     * empty or not, so that the wait below counts the same groups. */
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
#ifdef KV_CACHE
        if (t_begin + st < t_end) load_kv_step(k_sm, v_sm, q_sm, st, p, kv, src, t_begin + st, tid);
#else
        if (t_begin + st < t_end) load_kv(k_sm, v_sm, st, kg, vg, p, t_begin + st, seq.len_k, tid);
#endif
        cp_async_commit();
    }

#ifdef KV_CACHE
    /* While those copies fly: the rotated chunks of Q (positions cs + token
     * under a causal mask or a window, else cs) and this block's share of
     * the check that every page of the sequence lies in the pool (all of
     * it without splits). */
#ifdef ROTARY_DIM
    if (!kvs.bad)
        for (int e = tid; e < BR * ROW_CHUNKS; e += THREADS) {
            const int r = e / ROW_CHUNKS, c = e - r * ROW_CHUNKS, pr = pr0 + r;
            if (c * CHUNK_ELEMS >= ROTARY_DIM || pr >= rows_total) continue;
            int tok, gh;
            unpack_row(pr, group, &tok, &gh);
#if defined(CAUSAL) || defined(WINDOW)
            const int pos = kvs.cs + tok;
#else
            const int pos = kvs.cs;
#endif
            float v[8];
            rotary8((const elem_t *)p.q + Q_ROW(p, b, seq, tok, hk * group + gh), c * CHUNK_ELEMS, pos, kv, v);
            st_shared16(chunk_addr(q_sm, r, c), pack8(v));
        }
#endif
#ifdef PAGED
    bool bad_page;
    {
        /* Pages [0, ceil(len_k / PAGED)), shared out over the splits. */
        const int npg = kvs.len_k / PAGED + (kvs.len_k % PAGED != 0);
        int lo = 0, hi = npg;
#ifdef SPLITK
        const int per = (npg + p.num_splits - 1) / p.num_splits;
        lo = min(npg, split * per);
        hi = min(npg, lo + per);
#endif
        bad_page = pages_bad(kv, b, lo, hi, tid, THREADS);
    }
#endif
#endif

    /* What is left of the sequence from each of the thread's rows (0 for
     * padding rows, which see nothing and are never stored). */
    int rows_left[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int pr = pr0 + mt * 16 + g + 8 * hf;
            rows_left[mt][hf] = pr < rows_total ? seq.len_q - pr / group : 0;
        }

#ifdef SCORE_OPTIONS
    /* Scores are transformed to their final (scaled) values below, so the
     * softmax takes them in units of 1. */
    const float sl2 = FA_LOG2E;
#else
    const float sl2 = p.scale_log2;
#endif
#ifdef ALIBI
    /* Per row: its head's slope and the key on its diagonal, tok + len_k -
     * len_q (bottom-right aligned; distances |diag - key|). */
    float slope[MT][2];
    int diag[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int pr = pr0 + mt * 16 + g + 8 * hf;
            slope[mt][hf] = 0.0f;
            diag[mt][hf] = 0;
            if (pr < rows_total) {
                int tok, gh;
                unpack_row(pr, group, &tok, &gh);
                slope[mt][hf] = __ldg(kv.alibi + hk * group + gh);
                diag[mt][hf] = (seq.len_k - seq.len_q) + tok;
            }
        }
#endif
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

    const int key_base = warp * WK; /* this warp's keys in a tile */
    int stage = 0;
    for (int t = t_begin; t < t_end; t++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* tile t is in; every warp is done with tile t - 1 */
#ifdef DECODE_TRACE
        if (t == t_begin) TRACE_MARK(1);
#endif
        {
            const int tn = t + STAGES - 1;
            const int sn = (stage + STAGES - 1) % STAGES;
#ifdef KV_CACHE
            if (tn < t_end) load_kv_step(k_sm, v_sm, q_sm, sn, p, kv, src, tn, tid);
#ifdef PAGED
            /* Tile t + PG_SLOTS's pages, in tile tn's group. */
            const int x = t + PG_SLOTS;
            if (tid < 4 && x < t_end && 16 * tid < kvs.len_k - x * BC)
                cp_async4(pg_slot(q_sm, x) + 4u * (u32)tid, table_entry(kv, b, x * BC + 16 * tid), 4);
#endif
#else
            if (tn < t_end) load_kv(k_sm, v_sm, sn, kg, vg, p, tn, seq.len_k, tid);
#endif
            cp_async_commit();
        }
        const int k0 = t * BC;
        const u32 kb = k_sm + (u32)stage * KV_TILE_BYTES, vb = v_sm + (u32)stage * KV_TILE_BYTES;

        /* S = Q K^T over this warp's 16 keys. */
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][j][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            u32 b0[BREGS], b1[BREGS];
            kv_load_b2(kb, key_base, ks, b0, b1, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                u32 a[AREGS];
                load_a(q_sm, mt * 16, ks, a, lane);
                mma16(s[mt][0], a, b0);
                mma16(s[mt][1], a, b1);
            }
        }

#ifdef SCORE_OPTIONS
        /* The score options, in the order include/flashattn.h gives: the
         * scale, softcap, ALiBi's -slope |i + len_k - len_q - j|; then the
         * masks. diag - k0 and the offset in the tile each fit an int. */
        {
#ifdef ALIBI
            const int kcol = key_base + 2 * t4;
#endif
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = s[mt][j][e] * p.scale;
#ifdef SOFTCAP
                        x = kv.softcap * fa_tanh(x * kv.softcap_inv);
#endif
#ifdef ALIBI
                        const int dist = (diag[mt][e >> 1] - k0) - (kcol + 8 * j + (e & 1));
                        x = fmaf(-slope[mt][e >> 1], fabsf((float)dist), x);
#endif
                        s[mt][j][e] = x;
                    }
        }
#endif

        /* Masks, per element where the tile is not wholly visible to every
         * token of the block. */
        if (!tile_full(p, mask, 0, t, tok_lo, k0, tok_hi - tok_lo + 1, BC, ROWS_STORED)) {
            const int keys0 = seq.len_k - k0 - key_base - 2 * t4;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (!visible_left(mask, rows_left[mt][e >> 1], keys0 - (8 * j + (e & 1))))
                            s[mt][j][e] = -FA_INF;
        }

        /* Online softmax of the warp's keys; the accumulators are
         * rescaled only where a row's maximum moved (mma.cuh). */
        float alpha_of[MT][2];
        if (__any_sync(0xffffffffu, online_softmax<MT, NT>(s, m_run, l_run, alpha_of, sl2))) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < DT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o_acc[mt][j][e] *= alpha_of[mt][e >> 1];
        }

        /* O += P V over the warp's 16 keys (rows key_base .. of V). */
#pragma unroll
        for (int j = 0; j < DT; j += 2) {
            u32 b0[BREGS], b1[BREGS];
            kv_load_bt2(vb, key_base, j, b0, b1, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                u32 pa[AREGS];
                c_to_a(s[mt][0], s[mt][1], pa);
                mma16(o_acc[mt][j], pa, b0);
                mma16(o_acc[mt][j + 1], pa, b1);
            }
        }
        stage = (stage + 1) % STAGES;
    }
    cp_async_wait<0>();
    TRACE_MARK(2);
    /* The K/V buffers are free for the partial rows. */
#if defined(KV_CACHE) && defined(PAGED)
    const bool bad_page_block = __syncthreads_or(bad_page) != 0;
    const bool bad = bad_page_block || kvs.bad;
#else
    __syncthreads();
#ifdef KV_CACHE
    const bool bad = kvs.bad;
#endif
#endif

    /* Each warp's partial rows: O unnormalised, m in score units, l. */
    float *po = (float *)(smem + Q_BYTES);
    float *pml = po + WARPS * BR * O_STRIDE;
    /* Only rows the combine reads (pr < rows_total): at batch 1 with a
     * group of 8 in a 16-row tile, half the stores. The sums' shuffles
     * first, by every lane. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = mt * 16 + g + 8 * hf;
            float l = l_run[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (pr0 + r >= rows_total) continue;
            float *orow = po + (warp * BR + r) * O_STRIDE;
#pragma unroll
            for (int j = 0; j < DT; j++)
                *(float2 *)(orow + 8 * j + 2 * t4) = make_float2(o_acc[mt][j][2 * hf], o_acc[mt][j][2 * hf + 1]);
            if (t4 == 0) {
                pml[2 * (warp * BR + r)] = m_run[mt][hf];
                pml[2 * (warp * BR + r) + 1] = l;
            }
        }
    __syncthreads();

    /* Combine the warps by their maxima and normalise once; a row the
     * masks leave no key gives O = 0 and L = -inf (row_sees_key). Four
     * dimensions a thread and step. */
    constexpr int D4 = HEAD_DIM / 4;
    for (int e = tid; e < BR * D4; e += THREADS) {
        const int r = e / D4, x = (e - r * D4) * 4;
        const int pr = pr0 + r;
        if (pr >= rows_total) continue;
        int tok, gh;
        unpack_row(pr, group, &tok, &gh);
        const int h = hk * group + gh;
        float mx = -FA_INF;
#pragma unroll
        for (int w = 0; w < WARPS; w++) mx = fmaxf(mx, pml[2 * (w * BR + r)]);
        const float m_use = mx == -FA_INF ? 0.0f : mx * sl2;
        float l = 0.0f, v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            const float f = fa_exp2(pml[2 * (w * BR + r)] * sl2 - m_use);
            l = fmaf(f, pml[2 * (w * BR + r) + 1], l);
            const float4 o = *(const float4 *)(po + (w * BR + r) * O_STRIDE + x);
            v[0] = fmaf(f, o.x, v[0]);
            v[1] = fmaf(f, o.y, v[1]);
            v[2] = fmaf(f, o.z, v[2]);
            v[3] = fmaf(f, o.w, v[3]);
        }
        const bool masked = mx == -FA_INF && !row_sees_key(mask, tok, 0);
        const float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = masked ? 0.0f : v[i] * inv;
        float lse_r = masked ? -FA_INF : row_lse(mx * sl2, l);
#ifdef KV_CACHE
        /* A sequence whose lengths or pages break the rules: O and L NaN
         * (a split's NaN partial spreads through the merge). */
        if (bad) {
#pragma unroll
            for (int i = 0; i < 4; i++) v[i] = FA_NAN;
            lse_r = FA_NAN;
        }
#endif
#ifdef SPLITK
        const i64 row = (i64)(split * p.heads_q + h) * p.total_q + seq.start_q + tok;
        *(float4 *)(p.part_o + row * HEAD_DIM + x) = make_float4(v[0], v[1], v[2], v[3]);
        if (x == 0) p.part_l[row] = lse_r;
#else
        store_o4(p, b, seq, tok, h, x, v);
        if (x == 0) store_lse(p, lse_index(p, b, h, tok, seq.start_q), lse_r);
#endif
    }
    /* The step's append, by one block of each (sequence, KV head) once the
     * whole sequence is known to keep the rules (a sequence that breaks
     * them appends nothing): without splits the block that checked all of
     * its pages, with splits the last of row tile 0's blocks to arrive,
     * from every split's verdict on its share. */
    TRACE_MARK(3);
#ifdef SPLIT_MERGE_LAST
    u32 flags = 0;
#if defined(KV_CACHE) && defined(PAGED)
    const u32 my_bits = blockIdx.x == 0 && bad_page_block ? 1u : 0u;
#else
    const u32 my_bits = 0;
#endif
#if BR <= 32
    if (p.splits_meet) {
        meet_splits(p, b, hk, split, my_bits);
        TRACE_MARK(4);
#ifdef KV_CACHE
        /* Split 0 takes every split's flag bits and clears them (the
         * meeting's acquire orders the exchange after their ORs), issued
         * before its share of the merge and waited for after it: only the
         * append needs them. */
        u32 taken = 0;
        i64 apart;
        if (split == 0 && tid == 0) taken = atomicExch(group_count(p, b, hk, &apart) + apart, 0u);
#endif
        merge_share(p, b, seq, hk, pr0, rows_total, split);
        TRACE_MARK(5);
#ifdef KV_CACHE
        if (split == 0) flags = __syncthreads_or(taken != 0u) ? 1u : 0u;
#endif
#ifdef APPEND
        if (blockIdx.x == 0 && split == 0 && !kvs.bad && flags == 0) append_new(p, kv, src, hk, tid);
#endif
        TRACE_PRINT();
        return;
    }
#endif
    if (!arrive_last(p, b, hk, my_bits, &flags)) {
        TRACE_PRINT();
        return;
    }
    TRACE_MARK(4);
#ifdef APPEND
    if (blockIdx.x == 0 && !kvs.bad && flags == 0) append_new(p, kv, src, hk, tid);
#endif
    merge_splits(p, b, seq, hk, pr0, rows_total, smem);
    TRACE_MARK(5);
#elif defined(APPEND)
    if (blockIdx.x == 0 && !bad) append_new(p, kv, src, hk, tid);
#endif
    TRACE_PRINT();
}
