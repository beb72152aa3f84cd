/* The interface every backend implements (a table of function pointers, as
 * ggml's backends). Core owns argument checks, planning and the public
 * objects; a backend only discovers devices, moves memory, compiles and
 * launches what a plan asks for. It knows nothing of tiling policy.
 *
 * Handles: a backend's context, buffer and plan objects are opaque void *
 * to core. Errors are reported with fa_fail() (core/fa_internal.h). */
#ifndef FA_BACKEND_H
#define FA_BACKEND_H

#include "flashattn.h"

#include <stddef.h>

typedef struct fa_plan_s fa_plan_s;

/* Tensors of one call, as backend buffer handles. Offsets and strides are in
 * the plan's descriptor. bias: NULL exactly when the descriptor has no
 * additive bias (bias_batch 0). */
typedef struct fa_fwd_args {
    void *q, *k, *v, *o, *lse;
    void *bias;
} fa_fwd_args;

typedef struct fa_bwd_args {
    void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    void *bias;
} fa_bwd_args;

/* One step against a KV cache (fa_forward_kvcache): backend handles, NULL
 * where the descriptor does not ask for the tensor (lse may be NULL). */
typedef struct fa_kvcache_call {
    void *q, *k_cache, *v_cache, *o, *lse;
    void *cache_seqlens, *block_table, *k_new, *v_new, *rotary_cos, *rotary_sin;
} fa_kvcache_call;

/* Element-wise passes of the ring (context parallelism, core/dist.c) over
 * [batch, rows, heads, dim] views of buffers: strides and offset in
 * elements of the view's dtype, every stride explicit, dim contiguous. A
 * log-sum-exp [batch, heads, rows] is the view with dim 1, stride_seq 1,
 * stride_head rows, stride_batch heads * rows. */
typedef struct fa_rows_view {
    void *buf;                  /* the backend's buffer handle */
    fa_dtype dtype;
    int64_t offset, stride_batch, stride_seq, stride_head;
} fa_rows_view;

typedef struct fa_rows_shape {
    int batch, rows, heads, dim;
} fa_rows_shape;

typedef enum fa_rows_op {
    FA_ROWS_COPY = 0, /* dst = src, converted to dst's dtype (nearest even) */
    FA_ROWS_ADD = 1,  /* dst = dst + src, summed in fp32 */
    FA_ROWS_FILL = 2  /* dst = value; src unused (may be NULL) */
} fa_rows_op;

typedef struct fa_backend_ops {
    fa_backend id;
    const char *name;

    /* Load the runtime and enumerate devices. Called once by core; returns
     * FA_ERR_BACKEND_UNAVAILABLE with the reason written to reason when the
     * runtime or any device is missing. */
    fa_status (*init)(char *reason, size_t reason_size);
    int (*device_count)(void);
    fa_status (*device_info)(int index, fa_device_info *info);

    fa_status (*context_create)(int index, void **ctx);
    void (*context_destroy)(void *ctx);
    fa_status (*context_synchronize)(void *ctx);
    /* The queue reported is the one in use (queue_select's). */
    fa_status (*context_native)(void *ctx, void **native_context, void **native_queue);

    /* Caller queues (fa_context_set_native_queue): core decides when to
     * switch and in which order; these speak only to the runtime. All NULL
     * in a backend without a queue (the reference); queue_drop may be NULL
     * alone, where the runtime counts no references.
     * queue_adopt: check that queue can carry this context's work (its
     *   context and device, in-order) and take a reference where the
     *   runtime counts them; nothing changes on failure.
     * queue_drop: give that reference back.
     * queue_order: make later wait, on the device, for all work queued on
     *   earlier so far; the host does not wait.
     * queue_select: later work goes to queue; NULL: the context's own. */
    fa_status (*queue_adopt)(void *ctx, void *queue);
    void (*queue_drop)(void *ctx, void *queue);
    fa_status (*queue_order)(void *ctx, void *later, void *earlier);
    void (*queue_select)(void *ctx, void *queue);

    fa_status (*buffer_alloc)(void *ctx, size_t bytes, void **buf);
    fa_status (*buffer_wrap)(void *ctx, void *native, size_t bytes, void **buf);
    void (*buffer_free)(void *ctx, void *buf);
    fa_status (*buffer_upload)(void *ctx, void *buf, size_t offset, const void *src, size_t bytes);
    fa_status (*buffer_download)(void *ctx, void *buf, size_t offset, void *dst, size_t bytes);
    void *(*buffer_native)(void *ctx, void *buf);

    /* Compile or load from the kernel cache what the plan needs; allocate
     * its workspace. FA_ERR_UNSUPPORTED (with the reason) for an option the
     * backend cannot run. */
    fa_status (*plan_prepare)(void *ctx, const fa_plan_s *plan, void **plan_impl);
    void (*plan_release)(void *ctx, void *plan_impl);
    fa_status (*forward)(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args);
    fa_status (*backward)(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args);
    /* A KV-cache step (append, rotary, attention) for a plan whose
     * descriptor has kv_cache = 1; NULL where the backend has none (its
     * plan_prepare refuses such plans). */
    fa_status (*forward_kvcache)(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args);
    /* The ring's element-wise passes, queued like the attention passes.
     * rows: op over every element of shape (see fa_rows_op); src and dst
     *   never overlap.
     * rows_merge: fold a partial attention result (part_o in any dtype,
     *   part_l fp32) into an fp32 accumulator (acc_o, acc_l) through the
     *   log-sum-exp, per (batch, row, head) in fp32:
     *     lp == -inf: unchanged (the part saw no key);
     *     la == -inf: acc_o = part_o, acc_l = lp;
     *     else m = (la > lp ? la : lp), l = m + log1p(exp(-|la - lp|)),
     *          acc_o = acc_o * exp(la - l) + part_o * exp(lp - l), acc_l = l
     *   (NaN in either L makes the row NaN). The L views have dim 1. */
    fa_status (*rows)(void *ctx, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                      const fa_rows_view *src, float value);
    fa_status (*rows_merge)(void *ctx, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                            const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l);
    /* A transport over the vendor's collective library (NCCL, RCCL) for
     * fa_comm_create_nccl; NULL where the backend has none. */
    fa_status (*transport_nccl)(void *ctx, void *nccl_comm, fa_transport *transport);
    /* Device time of the plan's last pass; NULL where the backend cannot time. */
    fa_status (*last_time_ms)(void *ctx, void *plan_impl, double *ms);
} fa_backend_ops;

/* Backends compiled into this build (NULL entries for those left out). */
const fa_backend_ops *fa_backend_ops_get(fa_backend backend);

extern const fa_backend_ops fa_reference_backend;
#ifdef FA_WITH_OPENCL
extern const fa_backend_ops fa_opencl_backend;
#endif
#ifdef FA_WITH_CUDA
extern const fa_backend_ops fa_cuda_backend;
#endif
#ifdef FA_WITH_HIP
extern const fa_backend_ops fa_hip_backend;
#endif

#endif
