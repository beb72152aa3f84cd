/* Device-to-device copies and plain reads on a context's stream for the
 * benchmarks: a timed copy (the copy bandwidth fa-bench --decode puts
 * beside the kernels it times, measured in the same run on the same
 * buffers), a timed read of two buffers (kernels_cuda/stream_read.cu: the
 * least time any kernel needs to bring a step's K and V in, timed the same
 * way), and untimed ones left in flight (the cache flushes before a timed
 * run, which must not leave the device idle while the host prepares the
 * next launch: a copy leaves the last-level cache full of dirty lines, a
 * read leaves it clean). */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"
#include "cuda_compile.h"

#include "fa_internal.h"
#include "plan.h"

#include <stdint.h>

static fa_status check_copy(fa_buffer dst, fa_buffer src, size_t bytes) {
    if (!dst || !src) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !dst ? "dst" : "src");
    if (dst->ctx != src->ctx) return fa_fail(FA_ERR_INVALID_ARGUMENT, "dst and src belong to different contexts");
    if (dst->ctx->info.backend != FA_BACKEND_CUDA)
        return fa_fail(FA_ERR_UNSUPPORTED, "a device copy here needs a CUDA context, not %s",
                       fa_backend_name(dst->ctx->info.backend));
    if (bytes > dst->bytes || bytes > src->bytes)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "bytes = %zu exceeds dst (%zu) or src (%zu)", bytes, dst->bytes,
                       src->bytes);
    return FA_SUCCESS;
}

fa_status fa_cuda_copy_async(fa_buffer dst, fa_buffer src, size_t bytes) {
    FA_CHECK(check_copy(dst, src, bytes));
    const fa_cuda_context *ctx = dst->ctx->impl;
    const fa_cuda_buffer *d = dst->impl, *s = src->impl;
    FA_CHECK(fa_cuda_push(ctx));
    const CUresult r = fa_cuda_api()->cuMemcpyDtoDAsync_v2(d->ptr, s->ptr, bytes, ctx->stream);
    fa_cuda_pop();
    return r == CUDA_SUCCESS ? FA_SUCCESS : fa_cuda_error(r, "cuMemcpyDtoDAsync");
}

/* What a timed operation enqueues between its two events. */
typedef struct timed_op {
    fa_status (*enqueue)(fa_cuda_context *ctx, const void *arg);
    const void *arg;
} timed_op;

/* The device time of op on ctx's stream, waiting for it (ctx current). */
static fa_status time_op(fa_cuda_context *ctx, timed_op op, double *ms) {
    const fa_cu_api *cu = fa_cuda_api();
    CUevent start = NULL, stop = NULL;
    const char *what = "cuEventCreate";
    CUresult r = cu->cuEventCreate(&start, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = cu->cuEventCreate(&stop, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) {
        what = "cuEventRecord";
        r = cu->cuEventRecord(start, ctx->stream);
    }
    fa_status st = FA_SUCCESS;
    if (r == CUDA_SUCCESS) st = op.enqueue(ctx, op.arg);
    if (r == CUDA_SUCCESS && st == FA_SUCCESS) r = cu->cuEventRecord(stop, ctx->stream);
    float t = 0.0f;
    if (r == CUDA_SUCCESS && st == FA_SUCCESS) {
        what = "cuEventElapsedTime";
        r = cu->cuEventSynchronize(stop);
        if (r == CUDA_SUCCESS) r = cu->cuEventElapsedTime_v2(&t, start, stop);
    }
    if (start) (void)cu->cuEventDestroy_v2(start);
    if (stop) (void)cu->cuEventDestroy_v2(stop);
    if (st != FA_SUCCESS) return st;
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, what);
    *ms = (double)t;
    return FA_SUCCESS;
}

typedef struct copy_args {
    CUdeviceptr dst, src;
    size_t bytes;
} copy_args;

static fa_status enqueue_copy(fa_cuda_context *ctx, const void *arg) {
    const copy_args *c = arg;
    const CUresult r = fa_cuda_api()->cuMemcpyDtoDAsync_v2(c->dst, c->src, c->bytes, ctx->stream);
    return r == CUDA_SUCCESS ? FA_SUCCESS : fa_cuda_error(r, "cuMemcpyDtoDAsync");
}

fa_status fa_cuda_time_copy(fa_buffer dst, fa_buffer src, size_t bytes, double *ms) {
    if (!ms) return fa_fail(FA_ERR_NULL_POINTER, "ms is NULL");
    *ms = 0.0;
    FA_CHECK(check_copy(dst, src, bytes));
    fa_cuda_context *ctx = dst->ctx->impl;
    const copy_args c = {((const fa_cuda_buffer *)dst->impl)->ptr, ((const fa_cuda_buffer *)src->impl)->ptr, bytes};
    FA_CHECK(fa_cuda_push(ctx));
    const fa_status st = time_op(ctx, (timed_op){enqueue_copy, &c}, ms);
    fa_cuda_pop();
    return st;
}

/* ------------------------------------------------------------------------ */
/* Reads                                                                    */

static const char *const stream_headers[] = {"kernels_cuda/dtype.cuh"};
static const char *const stream_kernels[] = {"fa_stream_read"};

/* Blocks an SM of the read: 2048 threads, every SM's most. */
#define FA_STREAM_BLOCKS_PER_SM 4
/* Never the XOR of the benchmarks' random fp16/bf16 data in practice; if it
 * were, the kernel writes one word of the context's sink, nothing else. */
#define FA_STREAM_KEY 0x5eedf00du

static const fa_cuda_program read_program = {"kernels_cuda/stream_read.cu", stream_headers,
                                             (int)FA_ARRAY_SIZE(stream_headers), "", stream_kernels,
                                             (int)FA_ARRAY_SIZE(stream_kernels), 0};

fa_status fa_cuda_read_compile(int cc_major, int cc_minor, fa_cuda_kernel_report *reports, int max_reports,
                               int *count) {
    return fa_cuda_program_report(&read_program, cc_major, cc_minor, FA_STREAM_THREADS, reports, max_reports, count);
}

/* The read's module and its sink word, made on the context's first read
 * (the context is current). */
static fa_status load_read(fa_cuda_context *ctx) {
    if (ctx->read_module) return FA_SUCCESS;
    CUmodule module = NULL;
    CUfunction fn = NULL;
    FA_CHECK(fa_cuda_program_load(&read_program, ctx, &module, &fn));
    CUdeviceptr sink = 0;
    const CUresult r = fa_cuda_api()->cuMemAlloc_v2(&sink, sizeof(uint32_t));
    if (r != CUDA_SUCCESS) {
        (void)fa_cuda_api()->cuModuleUnload(module);
        return fa_cuda_error(r, "cuMemAlloc(4 bytes for the read's sink)");
    }
    ctx->read_module = module;
    ctx->read_fn = fn;
    ctx->read_sink = sink;
    return FA_SUCCESS;
}

void fa_cuda_read_release(fa_cuda_context *ctx) {
    if (!ctx->read_module) return;
    (void)fa_cuda_api()->cuMemFree_v2(ctx->read_sink);
    (void)fa_cuda_api()->cuModuleUnload(ctx->read_module);
    ctx->read_module = NULL;
    ctx->read_sink = 0;
}

typedef struct read_args {
    CUdeviceptr a, b;
    uint64_t na, nb; /* 16-byte words */
} read_args;

static fa_status enqueue_read(fa_cuda_context *ctx, const void *arg) {
    const read_args *ra = arg;
    read_args a = *ra;
    uint32_t key = FA_STREAM_KEY;
    void *params[] = {&a.a, &a.na, &a.b, &a.nb, &key, &ctx->read_sink};
    const unsigned blocks = (unsigned)(ctx->sm_count > 0 ? ctx->sm_count : 1) * FA_STREAM_BLOCKS_PER_SM;
    const CUresult r = fa_cuda_api()->cuLaunchKernel(ctx->read_fn, blocks, 1, 1, FA_STREAM_THREADS, 1, 1, 0,
                                                     ctx->stream, params, NULL);
    return r == CUDA_SUCCESS ? FA_SUCCESS : fa_cuda_error(r, "cuLaunchKernel(fa_stream_read)");
}

/* The words of a and b (b may be NULL with b_bytes 0): whole 16-byte words
 * within each buffer, on one CUDA context. */
static fa_status check_read(fa_buffer a, size_t a_bytes, fa_buffer b, size_t b_bytes, read_args *out) {
    if (!a) return fa_fail(FA_ERR_NULL_POINTER, "a is NULL");
    if (a->ctx->info.backend != FA_BACKEND_CUDA)
        return fa_fail(FA_ERR_UNSUPPORTED, "a device read here needs a CUDA context, not %s",
                       fa_backend_name(a->ctx->info.backend));
    if (!b && b_bytes) return fa_fail(FA_ERR_NULL_POINTER, "b is NULL with b_bytes = %zu", b_bytes);
    if (b && b->ctx != a->ctx) return fa_fail(FA_ERR_INVALID_ARGUMENT, "a and b belong to different contexts");
    if (a_bytes > a->bytes || (b && b_bytes > b->bytes))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "a_bytes = %zu or b_bytes = %zu exceeds its buffer (%zu, %zu)", a_bytes,
                       b_bytes, a->bytes, b ? b->bytes : (size_t)0);
    if (a_bytes % 16 || b_bytes % 16)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "a_bytes = %zu and b_bytes = %zu must be multiples of 16", a_bytes,
                       b_bytes);
    out->a = ((const fa_cuda_buffer *)a->impl)->ptr;
    out->b = b ? ((const fa_cuda_buffer *)b->impl)->ptr : out->a;
    out->na = a_bytes / 16;
    out->nb = b_bytes / 16;
    return FA_SUCCESS;
}

fa_status fa_cuda_read_async(fa_buffer src, size_t bytes) {
    read_args ra;
    FA_CHECK(check_read(src, bytes, NULL, 0, &ra));
    fa_cuda_context *ctx = src->ctx->impl;
    FA_CHECK(fa_cuda_push(ctx));
    fa_status st = load_read(ctx);
    if (st == FA_SUCCESS) st = enqueue_read(ctx, &ra);
    fa_cuda_pop();
    return st;
}

fa_status fa_cuda_time_read(fa_buffer a, size_t a_bytes, fa_buffer b, size_t b_bytes, double *ms) {
    if (!ms) return fa_fail(FA_ERR_NULL_POINTER, "ms is NULL");
    *ms = 0.0;
    read_args ra;
    FA_CHECK(check_read(a, a_bytes, b, b_bytes, &ra));
    fa_cuda_context *ctx = a->ctx->impl;
    FA_CHECK(fa_cuda_push(ctx));
    fa_status st = load_read(ctx);
    if (st == FA_SUCCESS) st = time_op(ctx, (timed_op){enqueue_read, &ra}, ms);
    fa_cuda_pop();
    return st;
}
