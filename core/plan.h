/* The plan object shared by core and the backends. */
#ifndef FA_PLAN_H
#define FA_PLAN_H

#include "backend.h"
#include "flashattn.h"
#include "philox.h"

#include <stdatomic.h>
#include <stdint.h>

/* A context lives while the caller's reference or any buffer or plan of it
 * does (fa_context_destroy drops the caller's): refs counts them all. */
struct fa_context_s {
    const fa_backend_ops *ops;
    void *impl;
    fa_device_info info;
    atomic_int refs;
    /* The backend's queue (NULL for the reference) and the caller's that
     * replaces it (fa_context_set_native_queue; NULL: none). */
    void *own_queue;
    void *user_queue;
};

struct fa_buffer_s {
    fa_context ctx;
    void *impl;
    size_t bytes;
};

struct fa_plan_s {
    fa_context ctx;
    /* A private copy: block_mask, cu_seqlens and alibi_slopes point into
     * the copies below. */
    fa_attention_desc desc;
    uint8_t *block_mask;
    int32_t *cu_seqlens_q;
    int32_t *cu_seqlens_k;
    float *alibi_slopes;
    float scale;                 /* resolved softmax scale */
    uint32_t dropout_threshold;  /* fa_dropout_threshold(desc.dropout_p) */
    /* desc.dropout_seed and dropout_offset as the kernels take them: read
     * at every pass, as fa_plan_set_dropout_seed may change them. */
    fa_dropout_key dropout_key;
    /* Where the plan's rows and columns lie in the larger problem whose
     * dropout mask it draws (fa_plan_set_dropout_origin): every kernel adds
     * them to the row and column of its dropout counter. 0 for a plan of a
     * whole problem; read at every pass, like dropout_key. */
    int64_t drop_row0, drop_col0;
    int64_t total_q, total_k;    /* tokens over the batch */
    fa_plan_info info;
    void *impl;
};

/* FA_ERR_UNSUPPORTED naming the first score option (softcap, ALiBi, bias)
 * the descriptor enables, for a backend whose kernels do not compute it;
 * FA_SUCCESS when it enables none. */
fa_status fa_refuse_score_options(const fa_attention_desc *desc, const char *backend);

/* A reference on a context for what holds on to it (buffers, plans, NCCL
 * communicators); the last release destroys it. */
void fa_context_retain(fa_context ctx);
void fa_context_release(fa_context ctx);

/* The dropout mask of a plan whose problem is the sub-rectangle of a
 * larger one from query row0 and key col0 on (a ring's piece, core/dist.c):
 * its element (i, j) then keeps or drops as element (row0 + i, col0 + j) of
 * the larger problem with the same seed. col0 must be a multiple of 4, as
 * one Philox call draws four neighbouring columns; both lie in [0, 2^31).
 * With variable-length batches the origin applies to every sequence. */
fa_status fa_plan_set_dropout_origin(fa_plan plan, int64_t row0, int64_t col0);

/* The argument checks of fa_forward and fa_backward against any descriptor
 * (the ring checks a rank's local tensors with them before it starts). */
fa_status fa_check_forward_args(fa_context ctx, const fa_attention_desc *d, fa_buffer q, fa_buffer k, fa_buffer v,
                                fa_buffer o, fa_buffer lse);
fa_status fa_check_backward_args(fa_context ctx, const fa_attention_desc *d, fa_buffer q, fa_buffer k,
                                 fa_buffer v, fa_buffer o, fa_buffer lse, fa_buffer dout, fa_buffer dq,
                                 fa_buffer dk, fa_buffer dv);

#endif
