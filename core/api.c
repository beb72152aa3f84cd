/* The public API: backend registry, devices, contexts, buffers and plans.
 * Every entry point checks its arguments here, so backends receive only
 * valid requests. */
#include "desc.h"
#include "fa_internal.h"
#include "overlap.h"
#include "philox.h"
#include "plan.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- backends */

const fa_backend_ops *fa_backend_ops_get(fa_backend backend) {
    switch (backend) {
    case FA_BACKEND_REFERENCE: return &fa_reference_backend;
#ifdef FA_WITH_OPENCL
    case FA_BACKEND_OPENCL: return &fa_opencl_backend;
#endif
#ifdef FA_WITH_CUDA
    case FA_BACKEND_CUDA: return &fa_cuda_backend;
#endif
#ifdef FA_WITH_HIP
    case FA_BACKEND_HIP: return &fa_hip_backend;
#endif
    default: return NULL;
    }
}

const char *fa_backend_name(fa_backend backend) {
    switch (backend) {
    case FA_BACKEND_ANY: return "any";
    case FA_BACKEND_REFERENCE: return "reference";
    case FA_BACKEND_OPENCL: return "opencl";
    case FA_BACKEND_CUDA: return "cuda";
    case FA_BACKEND_HIP: return "hip";
    default: return "unknown";
    }
}

/* Each backend's runtime is loaded once, on first use, under one lock. */
typedef struct backend_state {
    int initialised;
    fa_status status;
    char reason[512];
} backend_state;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static backend_state backend_states[FA_BACKEND_COUNT];

static fa_status backend_init(fa_backend backend, const fa_backend_ops **ops_out) {
    if ((int)backend < 0 || backend >= FA_BACKEND_COUNT)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "backend = %d is not a fa_backend", (int)backend);
    const fa_backend_ops *ops = fa_backend_ops_get(backend);
    if (!ops)
        return fa_fail(FA_ERR_BACKEND_UNAVAILABLE, "the %s backend was not compiled into this build",
                       fa_backend_name(backend));
    pthread_mutex_lock(&registry_lock);
    backend_state *st = &backend_states[backend];
    if (!st->initialised) {
        st->reason[0] = '\0';
        st->status = ops->init(st->reason, sizeof st->reason);
        if (st->status != FA_SUCCESS && st->reason[0] == '\0')
            snprintf(st->reason, sizeof st->reason, "%s", fa_last_error());
        st->initialised = 1;
    }
    fa_status status = st->status;
    pthread_mutex_unlock(&registry_lock);
    if (status != FA_SUCCESS)
        return fa_fail(FA_ERR_BACKEND_UNAVAILABLE, "%s backend unavailable: %s", fa_backend_name(backend),
                       st->reason);
    *ops_out = ops;
    return FA_SUCCESS;
}

fa_status fa_backend_get_status(fa_backend backend, char *reason, size_t reason_size) {
    const fa_backend_ops *ops = NULL;
    fa_status status = backend_init(backend, &ops);
    if (reason && reason_size) snprintf(reason, reason_size, "%s", status == FA_SUCCESS ? "" : fa_last_error());
    return status;
}

/* ----------------------------------------------------------------- devices */

fa_status fa_device_count(int *count) {
    if (!count) return fa_fail(FA_ERR_NULL_POINTER, "count is NULL");
    int total = 0;
    for (int b = 0; b < FA_BACKEND_COUNT; b++) {
        const fa_backend_ops *ops = NULL;
        if (backend_init((fa_backend)b, &ops) == FA_SUCCESS) total += ops->device_count();
    }
    *count = total;
    return FA_SUCCESS;
}

/* Global device index -> (backend, index within it). */
static fa_status locate_device(int global_index, const fa_backend_ops **ops_out, int *local) {
    if (global_index < 0) return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "device index %d is negative", global_index);
    int base = 0;
    for (int b = 0; b < FA_BACKEND_COUNT; b++) {
        const fa_backend_ops *ops = NULL;
        if (backend_init((fa_backend)b, &ops) != FA_SUCCESS) continue;
        int n = ops->device_count();
        if (global_index < base + n) {
            *ops_out = ops;
            *local = global_index - base;
            return FA_SUCCESS;
        }
        base += n;
    }
    return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "device index %d: only %d devices present", global_index, base);
}

fa_status fa_device_get_info(int global_index, fa_device_info *info) {
    if (!info) return fa_fail(FA_ERR_NULL_POINTER, "info is NULL");
    const fa_backend_ops *ops = NULL;
    int local = 0;
    FA_CHECK(locate_device(global_index, &ops, &local));
    memset(info, 0, sizeof *info);
    return ops->device_info(local, info);
}

/* Rank for "the best available device": GPUs first, then vendor runtimes
 * before the portable one, the reference last. Lower is better. */
static int device_rank(const fa_device_info *info) {
    int backend_order = info->backend == FA_BACKEND_CUDA ? 0 : info->backend == FA_BACKEND_HIP ? 1
                      : info->backend == FA_BACKEND_OPENCL ? 2 : 3;
    int type_order = info->desc.type == FA_DEVICE_GPU ? 0 : info->desc.type == FA_DEVICE_ACCELERATOR ? 1 : 2;
    if (info->backend == FA_BACKEND_REFERENCE) type_order = 3;
    return type_order * 4 + backend_order;
}

static fa_status pick_best(fa_backend only, const fa_backend_ops **ops_out, int *local_out) {
    int best_rank = 1 << 30;
    const fa_backend_ops *best_ops = NULL;
    int best_local = -1;
    for (int b = 0; b < FA_BACKEND_COUNT; b++) {
        if (only != FA_BACKEND_ANY && b != (int)only) continue;
        const fa_backend_ops *ops = NULL;
        if (backend_init((fa_backend)b, &ops) != FA_SUCCESS) {
            if (only != FA_BACKEND_ANY) return FA_ERR_BACKEND_UNAVAILABLE; /* message already set */
            continue;
        }
        for (int i = 0; i < ops->device_count(); i++) {
            fa_device_info info;
            memset(&info, 0, sizeof info);
            if (ops->device_info(i, &info) != FA_SUCCESS) continue;
            int rank = device_rank(&info);
            if (rank < best_rank) {
                best_rank = rank;
                best_ops = ops;
                best_local = i;
            }
        }
    }
    if (!best_ops)
        return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "no device found for backend %s", fa_backend_name(only));
    *ops_out = best_ops;
    *local_out = best_local;
    return FA_SUCCESS;
}

/* ---------------------------------------------------------------- contexts */

fa_status fa_context_create(fa_backend backend, int index, fa_context *ctx) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    *ctx = NULL;
    if (backend < FA_BACKEND_ANY || backend >= FA_BACKEND_COUNT)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "backend = %d is not a fa_backend", (int)backend);
    if (index < -1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "index = %d: a device index is >= 0, or -1 for the best device",
                       index);
    const fa_backend_ops *ops = NULL;
    int local = index;
    if (index == -1) {
        FA_CHECK(pick_best(backend, &ops, &local));
    } else if (backend == FA_BACKEND_ANY) {
        FA_CHECK(locate_device(index, &ops, &local));
    } else {
        FA_CHECK(backend_init(backend, &ops));
        if (index >= ops->device_count())
            return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "%s device %d: the backend has %d devices",
                           fa_backend_name(backend), index, ops->device_count());
    }
    struct fa_context_s *c = calloc(1, sizeof *c);
    if (!c) return fa_fail(FA_ERR_OUT_OF_MEMORY, "context allocation failed");
    c->ops = ops;
    atomic_init(&c->refs, 1);
    fa_status st = ops->context_create(local, &c->impl);
    /* Read the description after creation: creating a context may measure
     * what enumeration only estimated (memory bandwidth). */
    if (st == FA_SUCCESS) st = ops->device_info(local, &c->info);
    void *native_context = NULL;
    if (st == FA_SUCCESS) st = ops->context_native(c->impl, &native_context, &c->own_queue);
    if (st != FA_SUCCESS) {
        if (c->impl) ops->context_destroy(c->impl);
        free(c);
        return st;
    }
    *ctx = c;
    return FA_SUCCESS;
}

fa_status fa_context_get_info(fa_context ctx, fa_device_info *info) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!info) return fa_fail(FA_ERR_NULL_POINTER, "info is NULL");
    *info = ctx->info;
    return FA_SUCCESS;
}

fa_status fa_context_synchronize(fa_context ctx) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    return ctx->ops->context_synchronize(ctx->impl);
}

fa_status fa_context_get_native(fa_context ctx, void **native_context, void **native_queue) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    void *c = NULL, *q = NULL;
    FA_CHECK(ctx->ops->context_native(ctx->impl, &c, &q));
    if (native_context) *native_context = c;
    if (native_queue) *native_queue = q;
    return FA_SUCCESS;
}

/* Later work goes to queue (NULL: the context's own), which the backend
 * has adopted; the caller's previous queue is dropped. */
static void queue_use(fa_context ctx, void *queue) {
    ctx->ops->queue_select(ctx->impl, queue);
    if (ctx->user_queue && ctx->ops->queue_drop) ctx->ops->queue_drop(ctx->impl, ctx->user_queue);
    ctx->user_queue = queue;
}

/* Switching orders the new queue after everything the context queued on the
 * old one, on the device: passes of one plan never overlap (they share its
 * workspace), and waiting for the queue in use waits for all the context's
 * work (fa_context_synchronize, frees). */
static fa_status queue_switch(fa_context ctx, void *queue) {
    void *from = ctx->user_queue ? ctx->user_queue : ctx->own_queue;
    void *to = queue ? queue : ctx->own_queue;
    fa_status st = ctx->ops->queue_order(ctx->impl, to, from);
    if (st != FA_SUCCESS) {
        if (queue && ctx->ops->queue_drop) ctx->ops->queue_drop(ctx->impl, queue);
        return st;
    }
    queue_use(ctx, queue);
    return FA_SUCCESS;
}

fa_status fa_context_set_native_queue(fa_context ctx, void *queue) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (queue == ctx->own_queue) queue = NULL; /* the context's own, given back by its handle */
    if (queue == ctx->user_queue) return FA_SUCCESS;
    const fa_backend_ops *ops = ctx->ops;
    if (!ops->queue_select)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "queue: the %s backend runs on the calling thread and has no queue to replace; "
                       "only NULL is accepted",
                       ops->name);
    if (queue) FA_CHECK(ops->queue_adopt(ctx->impl, queue));
    return queue_switch(ctx, queue);
}

void fa_context_retain(fa_context ctx) { atomic_fetch_add(&ctx->refs, 1); }

/* The backend's context goes with the last reference: its buffers and plans
 * are released by then. The backend tears down its own queue alone, so the
 * caller's is handed back first (still ordered before the own queue's last
 * wait where the runtime allows). */
void fa_context_release(fa_context ctx) {
    if (atomic_fetch_sub(&ctx->refs, 1) != 1) return;
    if (ctx->user_queue && queue_switch(ctx, NULL) != FA_SUCCESS) queue_use(ctx, NULL);
    ctx->ops->context_destroy(ctx->impl);
    free(ctx);
}

fa_status fa_context_destroy(fa_context ctx) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fa_context_release(ctx);
    return FA_SUCCESS;
}

/* ----------------------------------------------------------------- buffers */

static fa_status buffer_new(fa_context ctx, void *impl, size_t bytes, fa_buffer *buf) {
    struct fa_buffer_s *b = calloc(1, sizeof *b);
    if (!b) {
        ctx->ops->buffer_free(ctx->impl, impl);
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "buffer handle allocation failed");
    }
    fa_context_retain(ctx);
    b->ctx = ctx;
    b->impl = impl;
    b->bytes = bytes;
    *buf = b;
    return FA_SUCCESS;
}

fa_status fa_buffer_alloc(fa_context ctx, size_t bytes, fa_buffer *buf) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!buf) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *buf = NULL;
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    void *impl = NULL;
    FA_CHECK(ctx->ops->buffer_alloc(ctx->impl, bytes, &impl));
    return buffer_new(ctx, impl, bytes, buf);
}

fa_status fa_buffer_wrap(fa_context ctx, void *native, size_t bytes, fa_buffer *buf) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!native) return fa_fail(FA_ERR_NULL_POINTER, "native is NULL");
    if (!buf) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    *buf = NULL;
    if (bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "bytes is 0");
    void *impl = NULL;
    FA_CHECK(ctx->ops->buffer_wrap(ctx->impl, native, bytes, &impl));
    return buffer_new(ctx, impl, bytes, buf);
}

static fa_status check_range(fa_buffer buf, size_t offset, const void *host, size_t bytes, const char *host_name) {
    if (!buf) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    if (!host) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", host_name);
    if (offset > buf->bytes || bytes > buf->bytes - offset)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "range [%zu, %zu + %zu) runs past the buffer's %zu bytes", offset,
                       offset, bytes, buf->bytes);
    return FA_SUCCESS;
}

fa_status fa_buffer_upload(fa_buffer buf, size_t offset, const void *src, size_t bytes) {
    FA_CHECK(check_range(buf, offset, src, bytes, "src"));
    if (bytes == 0) return FA_SUCCESS;
    return buf->ctx->ops->buffer_upload(buf->ctx->impl, buf->impl, offset, src, bytes);
}

fa_status fa_buffer_download(fa_buffer buf, size_t offset, void *dst, size_t bytes) {
    FA_CHECK(check_range(buf, offset, dst, bytes, "dst"));
    if (bytes == 0) return FA_SUCCESS;
    return buf->ctx->ops->buffer_download(buf->ctx->impl, buf->impl, offset, dst, bytes);
}

fa_status fa_buffer_size(fa_buffer buf, size_t *bytes) {
    if (!buf) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    if (!bytes) return fa_fail(FA_ERR_NULL_POINTER, "bytes is NULL");
    *bytes = buf->bytes;
    return FA_SUCCESS;
}

fa_status fa_buffer_get_native(fa_buffer buf, void **native) {
    if (!buf) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    if (!native) return fa_fail(FA_ERR_NULL_POINTER, "native is NULL");
    *native = buf->ctx->ops->buffer_native(buf->ctx->impl, buf->impl);
    return FA_SUCCESS;
}

fa_status fa_buffer_free(fa_buffer buf) {
    if (!buf) return fa_fail(FA_ERR_NULL_POINTER, "buf is NULL");
    fa_context ctx = buf->ctx;
    ctx->ops->buffer_free(ctx->impl, buf->impl);
    free(buf);
    fa_context_release(ctx);
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------- plans */

static void plan_free(struct fa_plan_s *p) {
    if (!p) return;
    fa_context ctx = p->ctx;
    if (p->impl) ctx->ops->plan_release(ctx->impl, p->impl);
    free(p->block_mask);
    free(p->cu_seqlens_q);
    free(p->cu_seqlens_k);
    free(p->alibi_slopes);
    free(p);
    fa_context_release(ctx);
}

/* The plan keeps its own copies of host arrays the descriptor points to, so
 * the caller may free or change them after fa_plan_create. */
static fa_status plan_copy_desc(struct fa_plan_s *p, const fa_attention_desc *desc) {
    p->desc = *desc;
    if (desc->block_mask) {
        p->block_mask = malloc(desc->block_mask_bytes);
        if (!p->block_mask) return fa_fail(FA_ERR_OUT_OF_MEMORY, "block mask copy failed");
        memcpy(p->block_mask, desc->block_mask, desc->block_mask_bytes);
        p->desc.block_mask = p->block_mask;
    }
    if (desc->cu_seqlens_q) {
        /* batch + 1 <= 2^31 entries: no overflow in size_t. */
        size_t bytes = ((size_t)desc->batch + 1) * sizeof(int32_t);
        p->cu_seqlens_q = malloc(bytes);
        p->cu_seqlens_k = malloc(bytes);
        if (!p->cu_seqlens_q || !p->cu_seqlens_k) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cu_seqlens copy failed");
        memcpy(p->cu_seqlens_q, desc->cu_seqlens_q, bytes);
        memcpy(p->cu_seqlens_k, desc->cu_seqlens_k, bytes);
        p->desc.cu_seqlens_q = p->cu_seqlens_q;
        p->desc.cu_seqlens_k = p->cu_seqlens_k;
    }
    if (desc->alibi_slopes) {
        /* heads_q >= 1 floats, checked by fa_attention_desc_check. */
        const size_t bytes = (size_t)desc->heads_q * sizeof(float);
        p->alibi_slopes = malloc(bytes);
        if (!p->alibi_slopes) return fa_fail(FA_ERR_OUT_OF_MEMORY, "alibi_slopes copy failed");
        memcpy(p->alibi_slopes, desc->alibi_slopes, bytes);
        p->desc.alibi_slopes = p->alibi_slopes;
    }
    return FA_SUCCESS;
}

/* fp8 inputs: the reference's fused forward runs them, and CUDA's
 * warp-specialised forward on sm_90 (its plan_prepare refuses the rest,
 * naming why); the other device backends have no fp8 kernels, so they are
 * refused here, before their plan_prepare maps dtypes to kernel options
 * they do not have. */
static fa_status refuse_fp8(fa_context ctx, const fa_attention_desc *desc) {
    if (!fa_desc_is_fp8(desc)) return FA_SUCCESS;
    const char *dt = fa_dtype_name(desc->q.dtype);
    if (desc->kv_cache)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache: a KV-cache step with %s inputs is not supported", dt);
    if (desc->algorithm == FA_ALGO_STANDARD)
        return fa_fail(FA_ERR_UNSUPPORTED, "algorithm: FA_ALGO_STANDARD has no %s path (q.dtype = %s)", dt, dt);
    if (ctx->info.backend != FA_BACKEND_REFERENCE && ctx->info.backend != FA_BACKEND_CUDA)
        return fa_fail(FA_ERR_UNSUPPORTED, "q.dtype = %s: the %s backend has no %s kernels yet", dt, ctx->ops->name,
                       dt);
    return FA_SUCCESS;
}

fa_status fa_plan_create(fa_context ctx, const fa_attention_desc *desc, fa_plan *plan) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    *plan = NULL;
    FA_CHECK(fa_attention_desc_check(desc));
    /* A backend without the KV-cache entry cannot run such a plan: refused
     * here, before its plan_prepare sees a descriptor it does not know. */
    if (desc->kv_cache && !ctx->ops->forward_kvcache)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache: the %s backend has no KV-cache kernels", ctx->ops->name);
    FA_CHECK(refuse_fp8(ctx, desc));
    struct fa_plan_s *p = calloc(1, sizeof *p);
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "plan allocation failed");
    p->ctx = ctx;
    fa_context_retain(ctx);
    fa_status st = plan_copy_desc(p, desc);
    if (st == FA_SUCCESS) {
        fa_desc_normalize_windows(&p->desc);
        p->scale = (float)fa_desc_scale(&p->desc);
        p->dropout_threshold = fa_dropout_threshold(p->desc.dropout_p);
        p->dropout_key = fa_dropout_key_of(p->desc.dropout_seed, p->desc.dropout_offset);
        p->total_q = fa_attention_total_q(&p->desc);
        p->total_k = fa_attention_total_k(&p->desc);
        st = fa_plan_for_device(&ctx->info.desc, &p->desc, &p->info);
    }
    if (st == FA_SUCCESS) st = ctx->ops->plan_prepare(ctx->impl, p, &p->impl);
    if (st != FA_SUCCESS) {
        plan_free(p);
        return st;
    }
    *plan = p;
    return FA_SUCCESS;
}

fa_status fa_plan_get_info(fa_plan plan, fa_plan_info *info) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!info) return fa_fail(FA_ERR_NULL_POINTER, "info is NULL");
    *info = plan->info;
    return FA_SUCCESS;
}

fa_status fa_plan_set_dropout_seed(fa_plan plan, uint64_t seed, uint64_t offset) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!(plan->desc.dropout_p > 0.0f))
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "seed: the plan's descriptor has dropout_p = 0, so there is no dropout mask to seed");
    plan->desc.dropout_seed = seed;
    plan->desc.dropout_offset = offset;
    plan->dropout_key = fa_dropout_key_of(seed, offset);
    return FA_SUCCESS;
}

fa_status fa_plan_set_descale(fa_plan plan, float q, float k, float v) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!fa_desc_is_fp8(&plan->desc))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "descale: the plan's inputs are %s, descale factors apply to %s only",
                       fa_dtype_name(plan->desc.q.dtype), fa_dtype_name(FA_DTYPE_FP8_E4M3));
    FA_CHECK(fa_check_descale(q, "descale_q"));
    FA_CHECK(fa_check_descale(k, "descale_k"));
    FA_CHECK(fa_check_descale(v, "descale_v"));
    plan->desc.descale_q = q;
    plan->desc.descale_k = k;
    plan->desc.descale_v = v;
    return FA_SUCCESS;
}

fa_status fa_plan_set_dropout_origin(fa_plan plan, int64_t row0, int64_t col0) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    const int64_t limit = INT64_C(1) << 31;
    if (row0 < 0 || row0 >= limit || col0 < 0 || col0 >= limit)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "dropout origin (%lld, %lld): rows and columns must lie in [0, 2^31)",
                       (long long)row0, (long long)col0);
    /* The kernels draw one Philox call for columns 4g .. 4g + 3 of their
     * own numbering: only a shift by whole groups keeps those groups the
     * larger problem's. */
    if (col0 % 4 != 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "dropout origin: column %lld is not a multiple of 4", (long long)col0);
    plan->drop_row0 = row0;
    plan->drop_col0 = col0;
    return FA_SUCCESS;
}

fa_status fa_refuse_score_options(const fa_attention_desc *desc, const char *backend) {
    const char *option = fa_desc_option_in_use(desc);
    if (option) return fa_fail(FA_ERR_UNSUPPORTED, "%s: not supported by the %s backend yet", option, backend);
    return FA_SUCCESS;
}

fa_status fa_plan_destroy(fa_plan plan) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    plan_free(plan);
    return FA_SUCCESS;
}

/* One tensor argument of a pass: its buffer and the bytes it may touch. */
typedef struct tensor_arg {
    const char *name;
    fa_buffer buf;
    int64_t needed;      /* buffer bytes the tensor needs (-1: not representable) */
    fa_footprint bytes;
    int is_output;
} tensor_arg;

static tensor_arg tensor_of(const fa_attention_desc *d, const char *name, fa_buffer buf, fa_tensor_role role,
                            int is_output) {
    tensor_arg t = {name, buf, fa_desc_tensor_bytes(d, role), fa_tensor_footprint(d, role), is_output};
    return t;
}

static tensor_arg lse_of(const fa_attention_desc *d, fa_buffer buf, int is_output) {
    const int64_t bytes = fa_desc_lse_bytes(d);
    tensor_arg t = {"lse", buf, bytes, fa_range_footprint(0, (uint64_t)bytes), is_output};
    return t;
}

/* Every argument present, of the context and large enough; no output
 * sharing a byte with another argument (inputs may share theirs). */
static fa_status check_tensors(fa_context ctx, const tensor_arg *t, int n) {
    for (int i = 0; i < n; i++) {
        if (!t[i].buf) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", t[i].name);
        if (t[i].buf->ctx != ctx)
            return fa_fail(FA_ERR_FOREIGN_BUFFER, "%s belongs to another context than the plan", t[i].name);
        if (t[i].needed < 0 || (uint64_t)t[i].needed > (uint64_t)t[i].buf->bytes)
            return fa_fail(FA_ERR_OUT_OF_BOUNDS, "%s: the tensor spans %lld bytes but the buffer holds %zu",
                           t[i].name, (long long)t[i].needed, t[i].buf->bytes);
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if ((t[i].is_output || t[j].is_output) && t[i].buf == t[j].buf &&
                fa_footprints_overlap(&t[i].bytes, &t[j].bytes))
                return fa_fail(FA_ERR_INVALID_ARGUMENT,
                               "%s and %s share a buffer and their bytes overlap: an output may not alias "
                               "another argument",
                               t[i].name, t[j].name);
    return FA_SUCCESS;
}

/* The bias of a pass: present exactly when the descriptor has one, of the
 * plan's context, large enough, and an input (no output may share its
 * bytes; its footprint is the whole span from the buffer start, which
 * errs towards overlap). */
static fa_status check_bias(fa_context ctx, const fa_attention_desc *d, fa_buffer bias, const tensor_arg *t, int n) {
    if (d->bias_batch == 0) {
        if (bias) return fa_fail(FA_ERR_INVALID_ARGUMENT, "bias is given but the plan's descriptor has no bias (bias_batch = 0)");
        return FA_SUCCESS;
    }
    if (!bias)
        return fa_fail(FA_ERR_NULL_POINTER, "bias is NULL but the plan's descriptor has bias_batch = %d",
                       d->bias_batch);
    if (bias->ctx != ctx) return fa_fail(FA_ERR_FOREIGN_BUFFER, "bias belongs to another context than the plan");
    const int64_t needed = fa_desc_bias_bytes(d);
    if (needed < 0 || (uint64_t)needed > (uint64_t)bias->bytes)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "bias: the tensor spans %lld bytes but the buffer holds %zu",
                       (long long)needed, bias->bytes);
    const fa_footprint fp = fa_range_footprint(0, (uint64_t)needed);
    for (int i = 0; i < n; i++)
        if (t[i].is_output && t[i].buf == bias && fa_footprints_overlap(&fp, &t[i].bytes))
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "bias and %s share a buffer and their bytes overlap: an output may not alias another "
                           "argument",
                           t[i].name);
    return FA_SUCCESS;
}

static fa_status check_forward(fa_context ctx, const fa_attention_desc *d, const fa_pass_args *a) {
    const tensor_arg t[] = {tensor_of(d, "q", a->q, FA_TENSOR_Q, 0), tensor_of(d, "k", a->k, FA_TENSOR_K, 0),
                            tensor_of(d, "v", a->v, FA_TENSOR_V, 0), tensor_of(d, "o", a->o, FA_TENSOR_O, 1),
                            lse_of(d, a->lse, 1)};
    FA_CHECK(check_tensors(ctx, t, (int)FA_ARRAY_SIZE(t)));
    return check_bias(ctx, d, a->bias, t, (int)FA_ARRAY_SIZE(t));
}

static fa_status check_backward(fa_context ctx, const fa_attention_desc *d, const fa_pass_args *a) {
    const tensor_arg t[] = {tensor_of(d, "q", a->q, FA_TENSOR_Q, 0),      tensor_of(d, "k", a->k, FA_TENSOR_K, 0),
                            tensor_of(d, "v", a->v, FA_TENSOR_V, 0),      tensor_of(d, "o", a->o, FA_TENSOR_O, 0),
                            lse_of(d, a->lse, 0),                         tensor_of(d, "dout", a->dout, FA_TENSOR_O, 0),
                            tensor_of(d, "dq", a->dq, FA_TENSOR_Q, 1),    tensor_of(d, "dk", a->dk, FA_TENSOR_K, 1),
                            tensor_of(d, "dv", a->dv, FA_TENSOR_V, 1)};
    FA_CHECK(check_tensors(ctx, t, (int)FA_ARRAY_SIZE(t)));
    return check_bias(ctx, d, a->bias, t, (int)FA_ARRAY_SIZE(t));
}

fa_status fa_check_forward_args(fa_context ctx, const fa_attention_desc *d, fa_buffer q, fa_buffer k, fa_buffer v,
                                fa_buffer o, fa_buffer lse) {
    const fa_pass_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse};
    return check_forward(ctx, d, &a);
}

fa_status fa_check_backward_args(fa_context ctx, const fa_attention_desc *d, fa_buffer q, fa_buffer k,
                                 fa_buffer v, fa_buffer o, fa_buffer lse, fa_buffer dout, fa_buffer dq,
                                 fa_buffer dk, fa_buffer dv) {
    const fa_pass_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse, .dout = dout, .dq = dq, .dk = dk, .dv = dv};
    return check_backward(ctx, d, &a);
}

/* A KV-cache plan runs fa_forward_kvcache only. */
static fa_status refuse_kvcache_plan(fa_plan plan, const char *call) {
    if (plan->desc.kv_cache)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "plan: its descriptor has kv_cache = 1, a KV-cache step: run it with fa_forward_kvcache, not %s",
                       call);
    return FA_SUCCESS;
}

static fa_status forward_checked(fa_plan plan, const fa_pass_args *a) {
    FA_CHECK(refuse_kvcache_plan(plan, "fa_forward"));
    FA_CHECK(check_forward(plan->ctx, &plan->desc, a));
    const fa_fwd_args args = {a->q->impl, a->k->impl, a->v->impl, a->o->impl, a->lse->impl,
                              a->bias ? a->bias->impl : NULL};
    return plan->ctx->ops->forward(plan->ctx->impl, plan->impl, plan, &args);
}

static fa_status backward_checked(fa_plan plan, const fa_pass_args *a) {
    FA_CHECK(refuse_kvcache_plan(plan, "fa_backward (a KV-cache step has no backward)"));
    if (fa_desc_is_fp8(&plan->desc))
        return fa_fail(FA_ERR_UNSUPPORTED, "plan: its inputs are %s, which run the forward only (no backward yet)",
                       fa_dtype_name(plan->desc.q.dtype));
    FA_CHECK(check_backward(plan->ctx, &plan->desc, a));
    const fa_bwd_args args = {a->q->impl,    a->k->impl,  a->v->impl,  a->o->impl,  a->lse->impl,
                              a->dout->impl, a->dq->impl, a->dk->impl, a->dv->impl, a->bias ? a->bias->impl : NULL};
    return plan->ctx->ops->backward(plan->ctx->impl, plan->impl, plan, &args);
}

fa_status fa_forward(fa_plan plan, fa_buffer q, fa_buffer k, fa_buffer v, fa_buffer o, fa_buffer lse) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    const fa_pass_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse};
    return forward_checked(plan, &a);
}

fa_status fa_forward_ex(fa_plan plan, const fa_pass_args *args) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!args) return fa_fail(FA_ERR_NULL_POINTER, "args is NULL");
    return forward_checked(plan, args);
}

fa_status fa_backward(fa_plan plan, fa_buffer q, fa_buffer k, fa_buffer v, fa_buffer o, fa_buffer lse,
                      fa_buffer dout, fa_buffer dq, fa_buffer dk, fa_buffer dv) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    const fa_pass_args a = {.q = q, .k = k, .v = v, .o = o, .lse = lse, .dout = dout, .dq = dq, .dk = dk, .dv = dv};
    return backward_checked(plan, &a);
}

fa_status fa_backward_ex(fa_plan plan, const fa_pass_args *args) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!args) return fa_fail(FA_ERR_NULL_POINTER, "args is NULL");
    return backward_checked(plan, args);
}

/* An int32 or fp32 array of a KV-cache step: byte 0 of its buffer on. */
static tensor_arg array_of(const char *name, fa_buffer buf, int64_t bytes) {
    tensor_arg t = {name, buf, bytes, fa_range_footprint(0, (uint64_t)bytes), 0};
    return t;
}

/* A buffer the descriptor does not ask for must be NULL: one given would
 * be ignored, which is more likely a mistake than an intent. */
static fa_status check_absent(fa_buffer buf, const char *name, const char *why) {
    if (buf) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s is given but the plan's descriptor has %s", name, why);
    return FA_SUCCESS;
}

static fa_status check_kvcache(fa_context ctx, const fa_attention_desc *d, const fa_kvcache_args *a) {
    const int paged = d->page_size > 0, append = d->seqlen_new > 0, rotary = d->rotary_dim > 0;
    if (!paged) FA_CHECK(check_absent(a->block_table, "block_table", "page_size = 0 (a contiguous cache)"));
    if (!append) {
        FA_CHECK(check_absent(a->k_new, "k_new", "seqlen_new = 0"));
        FA_CHECK(check_absent(a->v_new, "v_new", "seqlen_new = 0"));
    }
    if (!rotary) {
        FA_CHECK(check_absent(a->rotary_cos, "rotary_cos", "rotary_dim = 0"));
        FA_CHECK(check_absent(a->rotary_sin, "rotary_sin", "rotary_dim = 0"));
    }
    /* The caches are written where tokens are appended: then they are
     * outputs, whose bytes no other argument may share. */
    tensor_arg t[11];
    int n = 0;
    t[n++] = tensor_of(d, "q", a->q, FA_TENSOR_Q, 0);
    t[n++] = tensor_of(d, "k_cache", a->k_cache, FA_TENSOR_K, append);
    t[n++] = tensor_of(d, "v_cache", a->v_cache, FA_TENSOR_V, append);
    t[n++] = tensor_of(d, "o", a->o, FA_TENSOR_O, 1);
    /* batch <= INT32_MAX: no overflow. */
    t[n++] = array_of("cache_seqlens", a->cache_seqlens, (int64_t)d->batch * (int64_t)sizeof(int32_t));
    if (paged) t[n++] = array_of("block_table", a->block_table, fa_desc_block_table_entries(d) * (int64_t)sizeof(int32_t));
    if (append) {
        t[n++] = tensor_of(d, "k_new", a->k_new, FA_TENSOR_K_NEW, 0);
        t[n++] = tensor_of(d, "v_new", a->v_new, FA_TENSOR_V_NEW, 0);
    }
    if (rotary) {
        t[n++] = array_of("rotary_cos", a->rotary_cos, fa_desc_rotary_table_bytes(d));
        t[n++] = array_of("rotary_sin", a->rotary_sin, fa_desc_rotary_table_bytes(d));
    }
    if (a->lse) t[n++] = lse_of(d, a->lse, 1);
    return check_tensors(ctx, t, n);
}

fa_status fa_forward_kvcache(fa_plan plan, const fa_kvcache_args *args) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!args) return fa_fail(FA_ERR_NULL_POINTER, "args is NULL");
    if (!plan->desc.kv_cache)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "plan: its descriptor has kv_cache = 0: run it with fa_forward");
    FA_CHECK(check_kvcache(plan->ctx, &plan->desc, args));
    const fa_backend_ops *ops = plan->ctx->ops;
    if (!ops->forward_kvcache)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache: the %s backend has no KV-cache kernels", ops->name);
#define FA_IMPL_OF(b) ((b) ? (b)->impl : NULL)
    const fa_kvcache_call call = {FA_IMPL_OF(args->q),          FA_IMPL_OF(args->k_cache),
                                  FA_IMPL_OF(args->v_cache),    FA_IMPL_OF(args->o),
                                  FA_IMPL_OF(args->lse),        FA_IMPL_OF(args->cache_seqlens),
                                  FA_IMPL_OF(args->block_table), FA_IMPL_OF(args->k_new),
                                  FA_IMPL_OF(args->v_new),      FA_IMPL_OF(args->rotary_cos),
                                  FA_IMPL_OF(args->rotary_sin)};
#undef FA_IMPL_OF
    return ops->forward_kvcache(plan->ctx->impl, plan->impl, plan, &call);
}

fa_status fa_plan_last_time_ms(fa_plan plan, double *ms) {
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    if (!ms) return fa_fail(FA_ERR_NULL_POINTER, "ms is NULL");
    if (!plan->ctx->ops->last_time_ms)
        return fa_fail(FA_ERR_UNSUPPORTED, "the %s backend cannot time passes", plan->ctx->ops->name);
    return plan->ctx->ops->last_time_ms(plan->ctx->impl, plan->impl, ms);
}
