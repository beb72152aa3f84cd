/* Runs one attention problem on one context and as a ring of threads (one
 * context a rank, tests/ring_threads.h), and compares the two. Shared by
 * the ring's tests on the reference and on every device backend. */
#ifndef FA_DIST_CHECK_H
#define FA_DIST_CHECK_H

#include "flashattn.h"

#include <stdint.h>

typedef struct dist_case {
    fa_backend backend;
    fa_dtype dtype;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int causal, window_left, window_right;
    int block_q, block_k;        /* > 0: a random block mask of these blocks */
    const int32_t *cu_q, *cu_k;  /* variable-length batch (cu_k NULL: as cu_q) */
    float dropout_p;
    int reseed;      /* 1: the ring's plans get another seed and offset through
                        fa_dist_plan_set_dropout_seed, the one context's plan
                        is created with them */
    fa_cp_layout layout;
    int world;
    int backward;
    int nccl;        /* 1: one device a rank over NCCL; 0: threads over host memory */
} dist_case;

/* A case with no masks, fp32, forward and backward. */
dist_case dist_case_default(fa_backend backend, int world, fa_cp_layout layout);

typedef struct dist_result {
    fa_status plan_status[8], pass_status[8];
    char plan_message[8][512];
    double err_o, err_lse, err_dq, err_dk, err_dv;
    int lse_mismatch;  /* -inf or NaN where the other is finite */
    int ran;           /* the one-context run succeeded */
} dist_result;

/* mutate_rank: when >= 0, that rank's descriptor is changed by mutate
 * before it creates its plan (to check that every rank hears of it). */
dist_result dist_check_run(const dist_case *c, int mutate_rank, void (*mutate)(fa_attention_desc *));

/* Runs c and checks (the harness's CHECKs) that every rank succeeded and
 * the ring matches one context within dist_check_tolerance; prints a line
 * of the errors, named by what. */
void dist_check_expect(const char *what, const dist_case *c);

/* The tolerance of the ring against one context: the ring rounds each
 * piece's O to the dtype before merging it in fp32. */
double dist_check_tolerance(fa_dtype dtype);

#endif
