/* Standard (unfused) attention checks shared by the backends
 * (tests/standard_suite.c). A backend's test file names its backend, then
 * wraps the shared runs and cases in FA_TEST cases of its own, keeping only
 * what belongs to that backend (its BLAS library, its chunking and packing
 * hooks, its memory limits). */
#ifndef FA_STANDARD_SUITE_H
#define FA_STANDARD_SUITE_H

#include "flashattn.h"

#include <stddef.h>

typedef struct standard_backend {
    fa_backend backend;
    const char *name;         /* "CUDA", "OpenCL" */
    int compiled;             /* the backend is built into this library */
    /* A further requirement of a created context (a kernel compiler); NULL
     * where none. Returns 0 with the reason in why when unmet. */
    int (*usable)(char *why, size_t len);
    /* fp16 and bf16: the share of O's elements that may differ in their bits
     * from the same-rounding reference. */
    double same_rounding_share;
    /* fp16 and bf16: the relative error of L allowed against the
     * same-rounding reference. */
    double lse_same_tol;
} standard_backend;

void standard_use_backend(const standard_backend *backend);

/* The backend's best device, shared by the cases; NULL when absent (the
 * reason in standard_skip_reason()). */
fa_context standard_context(void);
/* The same device where its BLAS library can run a standard plan (probed
 * with a real plan, so the reason is the library's own); NULL otherwise. */
fa_context standard_blas_context(void);
const char *standard_skip_reason(void);

#define STANDARD_REQUIRE_BLAS()                                                            \
    do {                                                                                   \
        if (!standard_blas_context()) FA_SKIP(standard_skip_reason());                     \
    } while (0)

/* A descriptor with packed tensors of one dtype and FA_ALGO_STANDARD. */
fa_attention_desc standard_desc(fa_dtype dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                                int head_dim);

typedef struct standard_run_opts {
    int backward; /* also run and check the backward pass */
    int twice;    /* run each pass twice: bit-identical results */
} standard_run_opts;

/* One problem, forward (and backward) on the device and on the references,
 * from fresh random inputs into NaN-poisoned outputs. */
void standard_run_case(const char *name, const fa_attention_desc *d, standard_run_opts opt);
/* standard_run_case with the backward pass, run once. */
void standard_run(const char *name, const fa_attention_desc *d);

extern const fa_dtype standard_all_dtypes[3];

/* Runs the backends share, each with its own sizes. */
/* Causal masks on 50x140, 100x100 and 140x50, in each of the n dtypes. */
void standard_causal_shapes(const fa_dtype *dtypes, int n);
/* Three windows (one-sided, open left, causal), the i-th in dtypes[i]. */
void standard_sliding_windows(const fa_dtype dtypes[3], int head_dim);
/* About half the blocks visible, one block row masked: a 16x24 grid in
 * fp32 and a 40x8 causal one in fp16 of head_dim. */
void standard_block_sparse(int head_dim, const char *fp16_name);
/* Dropout 0.17 in fp32 and 0.5 with a causal mask and MQA in fp16. */
void standard_dropout(int head_dim, const char *fp16_name);
/* Four sequences, one without queries and one without keys. */
void standard_varlen(fa_dtype dtype, int heads_q, int heads_kv, int head_dim, int causal_dropout, const char *name);
/* [batch, heads, seq, dim] layouts. */
void standard_bhsd(fa_dtype dtype, int head_dim, const char *name);
/* Padded rows and offsets, every tensor its own, causal. */
void standard_padded_strides(fa_dtype dtype, const char *name);
/* Variable lengths with an offset and padded rows in Q and O, in bf16 then
 * fp32. */
void standard_varlen_strides(int head_dim, const char *bf16_name, const char *f32_name);
/* One query per sequence whose token stride is narrower than a row. */
void standard_single_query(fa_dtype dtype);

/* O of an identity V carries the dropout decisions, which must be
 * fa_dropout_keep's bit for bit. */
void standard_dropout_mask_bits(void);

/* Nine buffers of dtype for fa_forward and fa_backward (Q, K, V, O, L, dO,
 * dQ, dK, dV) of sizes[i] elements, Q, K, V, O and dO random; returns 0 on
 * a failed allocation (bufs then holds what was allocated). */
int standard_io_buffers(fa_context ctx, fa_dtype dtype, const size_t sizes[9], fa_buffer bufs[9]);
void standard_free_buffers(fa_buffer *bufs, int n);

/* A BLAS library that cannot be loaded: with env set to missing, a standard
 * plan of head_dim fails with FA_ERR_UNSUPPORTED and a message naming lib
 * and the file, and the fused path still plans. loaded: whether this process
 * has loaded the library already, in which case a fresh process runs the
 * case named case_name of exe. */
void standard_blas_missing(const char *env, const char *missing, const char *lib, int head_dim, int loaded,
                           const char *exe, const char *case_name);

#endif
