/* A decoding step against a KV cache (decode.cu built with KV_CACHE;
 * include/flashattn.h's KV-cache fields): the second parameter block, the
 * cache's geometry (contiguous or paged), rotary embedding, and the score
 * options (softcap, ALiBi) of the cache path, shared by the tensor-core
 * step (decode.cu) and the FP32-pipe one (kvcache_simt.cu).
 *
 * Compile-time options (backends/cuda/cuda_attention.c sets them from the
 * plan):
 *   KV_CACHE                 the step reads its lengths from cache_seqlens
 *   PAGED=P                  K and V are pools of pages of P tokens (P a
 *                            multiple of 16), found through block_table
 *   APPEND                   seqlen_new > 0: k_new and v_new are written
 *                            into the cache and attended to
 *   ROTARY_DIM=R             rotary embedding of the first R dimensions
 *   ROTARY_INTERLEAVED       pairs (2i, 2i + 1), else (i, i + R / 2)
 *   SOFTCAP ALIBI            the score options
 * The host mirrors fa_kv_params field for field (cuda_attention.c,
 * fa_cuda_kv_params). */
#ifndef FA_CUDA_KVCACHE_CUH
#define FA_CUDA_KVCACHE_CUH

#include "common.cuh"

#if defined(SOFTCAP) || defined(ALIBI)
#define SCORE_OPTIONS
#endif

struct fa_kv_params {
    const int *cache_seqlens; /* [batch]: tokens cached before the step */
    const int *block_table;   /* [batch][max_pages] (PAGED) */
    const void *k_new, *v_new; /* [batch, seqlen_new, heads_kv, head_dim] (APPEND) */
    const float *rot_cos, *rot_sin; /* [seqlen_k][ROTARY_DIM / 2] (ROTARY_DIM) */
    const float *alibi;       /* [heads_q] (ALIBI) */
    int *status;              /* [batch]: 1 where the sequence keeps the rules (kvcache_simt.cu) */
    i64 kn_off, kn_sb, kn_ss, kn_sh;
    i64 vn_off, vn_sb, vn_ss, vn_sh;
    float softcap, softcap_inv; /* SOFTCAP: the cap and its inverse */
    int seqlen_new, num_pages, max_pages, reserved;
};

/* The lengths of sequence b's step, read from device memory: cs tokens in
 * its cache before the step, len_k = cs + seqlen_new keys. bad where the
 * lengths break the descriptor's rules (a negative length, an append past
 * the capacity seqlen_k, or, with rotary embedding, a query position, cs
 * or cs + i, past the cos/sin tables' seqlen_k rows); the
 * kernel then reads and writes no K, V or table row of the sequence, and
 * its outputs are NaN. seqlen_k - seqlen_new >= 0 (the host checked). */
struct fa_kv_seq {
    int cs, len_k;
    bool bad;
};

FA_DEV fa_kv_seq kv_seq_of(const fa_params &p, const fa_kv_params &kv, int b) {
    fa_kv_seq s;
    s.cs = __ldg(kv.cache_seqlens + b);
    s.bad = s.cs < 0 || s.cs > p.seqlen_k - kv.seqlen_new;
#if defined(ROTARY_DIM) && (defined(CAUSAL) || defined(WINDOW))
    /* The last query's position cs + seqlen_q - 1 must be a table row. */
    s.bad |= s.cs > p.seqlen_k - p.seqlen_q;
#elif defined(ROTARY_DIM)
    /* Every query at position cs: a table row (cs = seqlen_k is a full
     * cache with nothing appended). */
    s.bad |= s.cs > p.seqlen_k - 1;
#endif
    s.len_k = s.bad ? 0 : s.cs + kv.seqlen_new;
    return s;
}

#ifdef PAGED
#if PAGED % 16 != 0 || PAGED <= 0
#error "PAGED: a page holds a positive multiple of 16 tokens"
#endif
/* Entry of sequence b's block table for token j (j below the sequence's
 * length, so below seqlen_k: inside the row), unchecked. */
FA_DEV const int *table_entry(const fa_kv_params &kv, int b, int j) {
    return kv.block_table + (i64)b * kv.max_pages + j / PAGED;
}

FA_DEV bool page_ok(const fa_kv_params &kv, int pg) { return pg >= 0 && pg < kv.num_pages; }

/* Whether any of pages [lo, hi) of sequence b's table is outside the pool
 * (every thread of the block its share). */
FA_DEV bool pages_bad(const fa_kv_params &kv, int b, int lo, int hi, int tid, int nthreads) {
    const int *row = kv.block_table + (i64)b * kv.max_pages;
    bool bad = false;
#pragma unroll 4
    for (int i = lo + tid; i < hi; i += nthreads) bad |= !page_ok(kv, __ldg(row + i));
    return bad;
}
#endif

/* Element index of token j, head h, dimension 0 of a cache tensor (K or V:
 * off, sb, ss, sh) for sequence b: contiguous, or in page pg (PAGED; a page
 * of the pool). */
#ifdef PAGED
FA_DEV i64 cache_row(i64 off, i64 sb, i64 ss, i64 sh, int pg, int j, int h) {
    return off + (i64)pg * sb + (i64)(j % PAGED) * ss + (i64)h * sh;
}
#else
FA_DEV i64 cache_row(i64 off, i64 sb, i64 ss, i64 sh, int b, int j, int h) {
    return off + (i64)b * sb + (i64)j * ss + (i64)h * sh;
}
#endif

/* 16 bytes into shared memory at a shared-space address. */
FA_DEV void st_shared16(u32 addr, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

/* Eight fp32 values in the storage dtype, rounded to nearest even, as one
 * 16-byte chunk. */
FA_DEV uint4 pack8(const float v[8]) {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (u32)from_f32(v[2 * i]) | ((u32)from_f32(v[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

#ifdef ROTARY_DIM
#if ROTARY_DIM % 2 != 0 || ROTARY_DIM <= 0 || ROTARY_DIM > HEAD_DIM
#error "ROTARY_DIM: even, in (0, HEAD_DIM]"
#endif
#define ROT_HALF (ROTARY_DIM / 2)
/* Eight elements from dimension x0 (a multiple of 8) of the row at `row`
 * (dimension 0), in fp32, rotated at position pos where x < ROTARY_DIM:
 * pair (a, b) with angle index i becomes (a cos - b sin, a sin + b cos),
 * cos and sin from row pos of the fp32 tables [seqlen_k][ROTARY_DIM / 2].
 * Interleaved pairs are (2i, 2i + 1); otherwise (i, i + ROTARY_DIM / 2),
 * whose partner lies in another chunk and is read on its own. */
FA_DEV void rotary8(const elem_t *row, int x0, int pos, const fa_kv_params &kv, float v[8]) {
    load8(row + x0, v);
    if (x0 >= ROTARY_DIM) return;
    const float *cs = kv.rot_cos + (i64)pos * ROT_HALF, *sn = kv.rot_sin + (i64)pos * ROT_HALF;
#ifdef ROTARY_INTERLEAVED
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
        const int x = x0 + e;
        if (x < ROTARY_DIM) {
            const float c = __ldg(cs + (x >> 1)), s = __ldg(sn + (x >> 1)), a = v[e], bb = v[e + 1];
            v[e] = fmaf(a, c, -bb * s);
            v[e + 1] = fmaf(a, s, bb * c);
        }
    }
#else
    float r[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int x = x0 + e;
        r[e] = v[e];
        if (x < ROTARY_DIM) {
            const bool first = x < ROT_HALF;
            const int i = first ? x : x - ROT_HALF;
            const float c = __ldg(cs + i), s = __ldg(sn + i);
            const float other = to_f32(row[first ? x + ROT_HALF : i]);
            /* first half: a cos - b sin (a = own); second: a sin + b cos
             * (a = the first half's element, b = own) */
            r[e] = first ? fmaf(v[e], c, -other * s) : fmaf(other, s, v[e] * c);
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = r[e];
#endif
}
#endif

/* The cap's tanh is common.cuh's fa_tanh. */

#endif
