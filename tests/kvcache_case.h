/* One KV-cache step (fa_forward_kvcache) on a device against the CPU
 * reference (fa_ref_forward_kvcache), for tests/test_kvcache.c (every
 * device) and tests/test_kvcache_api.c (the reference device): random
 * queries, caches and appended tokens, a shuffled page pool, rotary tables
 * of FlashAttention's form, outputs poisoned before the step. Checked: O
 * and L against the reference (NaN exactly where it has NaN, finite where
 * it is finite), the caches after the append (the appended positions
 * against the reference, every other element of both pools bit-identical
 * to what it was). */
#ifndef FA_KVCACHE_CASE_H
#define FA_KVCACHE_CASE_H

#include "flashattn.h"

#define KV_MAX_BATCH 8

typedef struct kv_case {
    const char *name;
    fa_dtype dtype;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int page_size;              /* 0: contiguous */
    int seqlen_new;
    int rotary_dim, rotary_interleaved;
    int causal, window_left, window_right;
    float softcap;
    int alibi;                  /* ALiBi slopes 2^(-8 (h + 1) / heads_q) */
    int lens[KV_MAX_BATCH];     /* cache_seqlens; -1 in lens[0]: random lengths */
    int strided;                /* padded q, o and cache rows, k_new and v_new [batch, heads, seq, dim] */
    int no_lse;                 /* lse NULL */
    /* Sequences that break the rules: 1 << b marks sequence b; which rule
     * is broken cycles through a negative length, a length past the
     * capacity, a page outside the pool, and (with rotary) a query
     * position past the tables. */
    unsigned invalid;
    int force_split;            /* > 0: the plan re-prepared with this many key splits */
    /* br > 0: a SIMT or split plan re-prepared with this tile (packed rows
     * x keys) and micro-tile; a plan of another variant keeps its own. */
    struct {
        int br, bc, tr, tc;
    } force_tile;
    unsigned seed;
} kv_case;

/* A case with defaults: fp16, batch 1, one query and one appended token,
 * 2 query heads on 1 KV head, head_dim 64, a contiguous cache of 96,
 * random lengths, no options. */
kv_case kv_case_default(const char *name);

/* The result of one case on one context. */
typedef enum kv_outcome {
    KV_PASSED = 0,
    KV_FAILED = 1,
    KV_REFUSED = 2              /* the backend refused kv_cache (FA_ERR_UNSUPPORTED naming it) */
} kv_outcome;

/* Runs the case on ctx, reporting failures through the harness's checks
 * (names the case and the device). */
kv_outcome kv_case_run(fa_context ctx, const kv_case *c);

/* The descriptor the case runs (packed or its strided layouts). */
fa_attention_desc kv_case_desc(const kv_case *c);

#endif
