/* The attention test suite shared by the backends (tests/attention_suite.c).
 * A backend's test file names its backend, then wraps each suite_* case in
 * an FA_TEST of its own. */
#ifndef FA_ATTENTION_SUITE_H
#define FA_ATTENTION_SUITE_H

#include "flashattn.h"
#include "plan.h"

/* A tile shape to run instead of the planner's. */
typedef struct suite_tiles {
    int br, bc, tr, tc, split;
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
} suite_backend;

void suite_use_backend(const suite_backend *backend);
/* The backend's best device, shared by the cases; NULL when absent. */
fa_context suite_context(void);

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
void suite_lengths(void);
void suite_strides_offsets(void);
void suite_deterministic_backward(void);
void suite_described_devices(void);
void suite_rejects_bad_tiles(void);
void suite_long_sequences(void);

#endif
