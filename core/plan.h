/* The plan object shared by core and the backends. */
#ifndef FA_PLAN_H
#define FA_PLAN_H

#include "backend.h"
#include "flashattn.h"

#include <stdatomic.h>
#include <stdint.h>

/* A context lives while the caller's reference or any buffer or plan of it
 * does (fa_context_destroy drops the caller's): refs counts them all. */
struct fa_context_s {
    const fa_backend_ops *ops;
    void *impl;
    fa_device_info info;
    atomic_int refs;
};

struct fa_buffer_s {
    fa_context ctx;
    void *impl;
    size_t bytes;
};

struct fa_plan_s {
    fa_context ctx;
    /* A private copy: block_mask and cu_seqlens point into the copies below. */
    fa_attention_desc desc;
    uint8_t *block_mask;
    int32_t *cu_seqlens_q;
    int32_t *cu_seqlens_k;
    float scale;                 /* resolved softmax scale */
    uint32_t dropout_threshold;  /* fa_dropout_threshold(desc.dropout_p) */
    int64_t total_q, total_k;    /* tokens over the batch */
    fa_plan_info info;
    void *impl;
};

#endif
