/* The attention test suite shared by the backends (tests/attention_suite.c).
 * A backend's test file names its backend, then wraps each suite_* case in
 * an FA_TEST of its own. */
#ifndef FA_ATTENTION_SUITE_H
#define FA_ATTENTION_SUITE_H

#include "flashattn.h"
#include "plan.h"

#include <stdint.h>

/* A tile shape to run instead of the planner's; mma: in the matrix-unit
 * kernels (tr x tc as FA_VARIANT_MMA plans count it), where the backend
 * has them. */
typedef struct suite_tiles {
    int br, bc, tr, tc, split, mma;
} suite_tiles;

typedef struct suite_backend {
    fa_backend backend;
    const char *name;
    int compiled;             /* the backend is built into this library */
    /* Rebuild a plan's kernels for other tiles (the test stands in for the
     * planner, so other vendors' tile shapes run on this device); NULL
     * where the backend cannot. fwd or bwd NULL: keep the plan's. On
     * failure plan->impl is left NULL. */
    fa_status (*force_tiles)(fa_plan plan, const suite_tiles *fwd, const suite_tiles *bwd);
    /* Backend-specific checks of a created plan (local memory); may be NULL. */
    void (*check_plan)(const char *name, fa_plan plan);
    /* Whether force_tiles runs a described device's matrix-unit (mma)
     * tiles on this context; NULL: never. */
    int (*runs_mma)(fa_context ctx, const fa_device_desc *dev);
    /* The score options the backend's plans compute (SUITE_SOFTCAP |
     * SUITE_ALIBI | SUITE_BIAS); suite_score_options checks that its plans
     * refuse the others by name. */
    int score_options;
} suite_backend;

enum { SUITE_SOFTCAP = 1, SUITE_ALIBI = 2, SUITE_BIAS = 4, SUITE_ALL_SCORE_OPTIONS = 7 };

void suite_use_backend(const suite_backend *backend);

/* Helpers the backends' own cases share with the suite. */
/* A descriptor with packed tensors of one dtype and no options set. */
fa_attention_desc suite_desc(fa_dtype dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                             int head_dim);
/* A random block mask (about half the blocks visible, one whole block row
 * masked) set into d; the caller frees the returned bytes. */
uint8_t *suite_random_block_mask(fa_attention_desc *d, int block_q, int block_k, uint64_t seed);
/* A seed per case name (and extra), varied run to run by FA_TEST_SEED. */
uint64_t suite_case_seed(const char *name, uint64_t extra);
/* The backend's best device, shared by the cases; NULL when absent. */
fa_context suite_context(void);
/* One checked forward (and backward) run of desc in the given tiles
 * (NULL: the planner's), as the suite's cases run them. */
void suite_run_tiles(const char *name, const fa_attention_desc *desc, const suite_tiles *fwd, const suite_tiles *bwd,
                     int backward);

void suite_dtypes(void);
void suite_head_dims(void);
void suite_causal(void);
void suite_sliding_window(void);
void suite_block_sparse(void);
void suite_block_sparse_skips_tiles(void);
void suite_dropout(void);
void suite_dropout_mask_bits(void);
void suite_gqa_mqa(void);
void suite_varlen(void);
void suite_decoding_splitk(void);
void suite_score_options(void);
void suite_lengths(void);
void suite_strides_offsets(void);
void suite_deterministic_backward(void);
void suite_described_devices(void);
void suite_rejects_bad_tiles(void);
void suite_long_sequences(void);
void suite_extreme_windows(void);
void suite_destroy_in_any_order(void);
void suite_huge_mask_blocks(void);
void suite_env_build_options(void);

#endif
