/* Standard attention on OpenCL: the unfused baseline the FlashAttention
 * papers measure against. Every N x N matrix goes through global memory:
 *
 *   forward   S = scale Q K^T (CLBlast), P = softmax(S) in place and L
 *             (std_softmax), O = P V (CLBlast);
 *   backward  S = scale Q K^T, P = exp(S - L) in place (std_probs),
 *             dP = dO V^T, D = rowsum(dO * O) (std_rowdot),
 *             dS = P * (dP - D) into dP's buffer (std_dscores),
 *             dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q (CLBlast),
 *
 * which is the traffic core/iomodel.c (fa_io_standard) counts. Masks are
 * applied by the element-wise kernels, never skipped: standard attention
 * computes the whole matrix.
 *
 * Products are fp32 GEMMs (accumulation in fp32 whatever the dtype, and
 * NVIDIA's OpenCL has no cl_khr_fp16 for CLBlast's half routines). fp16 and
 * bf16 tensors are first converted to packed fp32 copies, and the scores
 * are rounded to the storage dtype where they are read or written, so the
 * results are those of matrices held in that dtype, as
 * fa_ref_standard_forward computes them. fp32 tensors are used in place,
 * strides and all: CLBlast's leading dimensions and per-matrix offsets
 * express every layout the descriptor allows.
 *
 * Batched GEMMs (CLBlastSgemmBatched) take one offset per matrix, which
 * covers (batch, head) pairs whose strides are unrelated and query heads
 * that share a kv head (GQA: the K and V offsets repeat); dK and dV sum over
 * the query heads of a group through beta = 1. Variable-length batches run
 * one batched product per sequence, as the shapes differ.
 *
 * CLBlast indexes with 32-bit integers (its batched routine narrows every
 * offset to int, and pads operands into temporaries indexed the same way),
 * and one OpenCL buffer is limited to CL_DEVICE_MAX_MEM_ALLOC_SIZE. So the
 * score matrices are held in chunks: buffers of whole (sequence, head)
 * blocks, each under 2^31 elements, the allocation limit and an eighth of
 * the device memory (which bounds CLBlast's temporaries too); a product
 * never spans two chunks, and the matrices of one call are few enough that
 * CLBlast's padded copies stay indexable. */
#include "cl_standard.h"

#include "desc.h"
#include "dtype.h"
#include "dynlib.h"
#include "fa_internal.h"
#include "plan_data.h"
#include "cl_runtime_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* CLBlast, loaded at run time                                               */
/*                                                                           */
/* The few declarations of CLBlast's C API (clblast_c.h, CLBlast 1.x) used   */
/* here, restated so that no CLBlast header is needed to build. The enum     */
/* values are the API's; the status enum keeps a negative member so that it  */
/* has CLBlast's underlying type (int).                                      */

typedef enum fa_clblast_layout { FA_CLBLAST_ROW_MAJOR = 101, FA_CLBLAST_COL_MAJOR = 102 } fa_clblast_layout;
typedef enum fa_clblast_transpose {
    FA_CLBLAST_NO_TRANS = 111,
    FA_CLBLAST_TRANS = 112,
    FA_CLBLAST_CONJ_TRANS = 113
} fa_clblast_transpose;
typedef enum fa_clblast_status {
    FA_CLBLAST_SUCCESS = 0,
    FA_CLBLAST_TEMP_ALLOC_FAILURE = -4,     /* CL_MEM_OBJECT_ALLOCATION_FAILURE */
    FA_CLBLAST_OUT_OF_RESOURCES = -5,       /* CL_OUT_OF_RESOURCES */
    FA_CLBLAST_OUT_OF_HOST_MEMORY = -6,     /* CL_OUT_OF_HOST_MEMORY */
    FA_CLBLAST_BUILD_FAILURE = -11,         /* CL_BUILD_PROGRAM_FAILURE */
    FA_CLBLAST_INVALID_BUFFER_SIZE = -61,   /* CL_INVALID_BUFFER_SIZE */
    FA_CLBLAST_NOT_IMPLEMENTED = -1024,
    FA_CLBLAST_INSUFFICIENT_MEMORY_TEMP = -2050,
    FA_CLBLAST_INVALID_LOCAL_MEM_USAGE = -2046,
    FA_CLBLAST_UNEXPECTED_ERROR = -2039
} fa_clblast_status;

/* CLBlastSgemmBatched: C_i = alpha_i op(A_i) op(B_i) + beta_i C_i for
 * i < batch_count, matrix i of each operand starting at its own offset
 * (elements) in one buffer, all of one shape and leading dimension. */
typedef fa_clblast_status (*fa_clblast_sgemm_batched_fn)(
    fa_clblast_layout layout, fa_clblast_transpose a_transpose, fa_clblast_transpose b_transpose, size_t m,
    size_t n, size_t k, const float *alphas, cl_mem a_buffer, const size_t *a_offsets, size_t a_ld,
    cl_mem b_buffer, const size_t *b_offsets, size_t b_ld, const float *betas, cl_mem c_buffer,
    const size_t *c_offsets, size_t c_ld, size_t batch_count, cl_command_queue *queue, cl_event *event);

#define FA_CLBLAST_ENV "FLASHATTN_CLBLAST_LIBRARY"

static fa_lazy_library blas_lib = FA_LAZY_LIBRARY_INIT;
static fa_clblast_sgemm_batched_fn blas_sgemm_batched; /* set under blas_lib.lock, fixed once loaded */

static int blas_resolve(void *lib, char *reason, size_t reason_size) {
    return fa_dynlib_load(lib, "CLBlastSgemmBatched", NULL, &blas_sgemm_batched, reason, reason_size);
}

/* CLBlast, loaded once it can be (fa_lazy_library): its compiled kernels
 * live in its own caches, which a process keeps. */
static fa_status blas_load(fa_clblast_sgemm_batched_fn *out) {
    static const char *const defaults[] = {"libclblast.so.1", "libclblast.so", NULL};
    char reason[1024];
    if (!fa_lazy_library_load(&blas_lib, FA_CLBLAST_ENV, defaults, blas_resolve, reason, sizeof reason)) {
        *out = NULL;
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "FA_ALGO_STANDARD on OpenCL runs its matrix products in CLBlast, which is not "
                       "available: %s (install libclblast or set " FA_CLBLAST_ENV " to its path)",
                       reason);
    }
    *out = blas_sgemm_batched;
    return FA_SUCCESS;
}

int fa_cl_standard_blas_loaded(void) { return fa_lazy_library_loaded(&blas_lib); }

static const char *blas_status_name(fa_clblast_status s) {
    switch (s) {
    case FA_CLBLAST_TEMP_ALLOC_FAILURE: return "CLBlastTempBufferAllocFailure";
    case FA_CLBLAST_OUT_OF_RESOURCES: return "CLBlastOpenCLOutOfResources";
    case FA_CLBLAST_OUT_OF_HOST_MEMORY: return "CLBlastOpenCLOutOfHostMemory";
    case FA_CLBLAST_BUILD_FAILURE: return "CLBlastOpenCLBuildProgramFailure";
    case FA_CLBLAST_INVALID_BUFFER_SIZE: return "CLBlastInvalidBufferSize";
    case FA_CLBLAST_NOT_IMPLEMENTED: return "CLBlastNotImplemented";
    case FA_CLBLAST_INSUFFICIENT_MEMORY_TEMP: return "CLBlastInsufficientMemoryTemp";
    case FA_CLBLAST_INVALID_LOCAL_MEM_USAGE: return "CLBlastInvalidLocalMemUsage";
    case FA_CLBLAST_UNEXPECTED_ERROR: return "CLBlastUnexpectedError";
    default: return NULL;
    }
}

static fa_status blas_error(fa_clblast_status s, const char *what) {
    const char *name = blas_status_name(s);
    fa_status status = FA_ERR_LAUNCH;
    if (s == FA_CLBLAST_TEMP_ALLOC_FAILURE || s == FA_CLBLAST_OUT_OF_RESOURCES ||
        s == FA_CLBLAST_OUT_OF_HOST_MEMORY || s == FA_CLBLAST_INVALID_BUFFER_SIZE)
        status = FA_ERR_OUT_OF_MEMORY;
    return fa_fail(status, "CLBlastSgemmBatched (%s) failed: %s (%d)", what, name ? name : "CLBlast status",
                   (int)s);
}

/* ------------------------------------------------------------------------ */
/* The plan                                                                  */

/* Which index of the batch selects an operand's matrix: query-side tensors
 * (Q, O, dO, dQ) the query head, key-side ones (K, V, dK, dV) the kv head,
 * score operands the (sequence, query head) block. */
typedef enum std_side { STD_SIDE_Q = 0, STD_SIDE_K = 1, STD_SIDE_WORK = 2 } std_side;

typedef struct std_operand {
    cl_mem mem;                /* a tensor's buffer; score operands: none */
    std_side side;
    int second;                /* score operands: dP / dS rather than S / P */
    cl_long offset, stride_batch, stride_seq, stride_head;
} std_operand;

typedef struct std_layout {
    cl_long offset, stride_batch, stride_seq, stride_head;
} std_layout;

/* One buffer of each score matrix: S then P (s1), dP then dS (s2, on the
 * first backward), for the pairs [pair0, pair1). */
typedef struct std_chunk {
    int pair0, pair1;
    size_t elems;
    cl_mem s1, s2;
} std_chunk;

typedef struct fa_cl_std_plan {
    fa_cl_plan_kind kind;        /* FA_CL_PLAN_STANDARD; first, see cl_backend.h */
    fa_cl_context *ctx;
    fa_clblast_sgemm_batched_fn sgemm;

    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, group, dim, varlen, convert;
    int64_t total_q, total_k;
    std_layout q, k, v, o;
    float scale;
    float drop_scale;
    int block_q, block_k, block_cols;

    /* Score blocks: pair = b * heads_q + h lives in chunk pair_chunk[pair]
     * at element pair_off[pair]. */
    int pairs;
    int *pair_chunk;
    cl_long *pair_off_host;
    int chunk_count;
    std_chunk *chunks;
    double score_elems;          /* of one score matrix, all chunks */
    cl_mem pair_off, cu_q, cu_k, block_mask, dummy;
    cl_mem dvec;                 /* D = rowsum(dO * O), on the first backward */
    cl_mem qf, kf, vf, of;       /* fp32 copies (fp16 / bf16): Q, K, V, O and then dO */
    cl_mem dqf, dkf, dvf;        /* fp32 gradients before rounding, on the first backward */
    size_t device_bytes;

    cl_program program;
    cl_kernel k_begin, k_convert_in, k_convert_out, k_zero, k_softmax, k_rowdot, k_probs, k_dscores;
    int wg;

    /* Host arrays of one batched call: one entry per matrix. */
    size_t batch_cap;
    size_t *off_a, *off_b, *off_c;
    float *alphas, *betas;

    cl_event first, last;        /* the last pass's first and last commands */
} fa_cl_std_plan;

/* Guards the test hook below. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;

int fa_cl_standard_owns(const void *plan_impl) {
    return plan_impl && *(const fa_cl_plan_kind *)plan_impl == FA_CL_PLAN_STANDARD;
}

static void release_events(fa_cl_std_plan *p) {
    if (p->first) fa_cl.clReleaseEvent(p->first);
    if (p->last) fa_cl.clReleaseEvent(p->last);
    p->first = p->last = NULL;
}

/* Keeps the first and the latest event of a pass (the span timed). */
static void track(fa_cl_std_plan *p, cl_event ev) {
    if (!ev) return;
    if (!p->first) {
        p->first = ev;
        return;
    }
    if (p->last) fa_cl.clReleaseEvent(p->last);
    p->last = ev;
}

void fa_cl_standard_release(void *plan_impl) {
    fa_cl_std_plan *p = plan_impl;
    if (!p) return;
    release_events(p);
    cl_kernel kernels[] = {p->k_begin, p->k_convert_in, p->k_convert_out, p->k_zero,
                           p->k_softmax, p->k_rowdot, p->k_probs, p->k_dscores};
    for (size_t i = 0; i < FA_ARRAY_SIZE(kernels); i++)
        if (kernels[i]) fa_cl.clReleaseKernel(kernels[i]);
    if (p->program) fa_cl.clReleaseProgram(p->program);
    cl_mem mems[] = {p->pair_off, p->cu_q, p->cu_k, p->block_mask, p->dummy, p->dvec,
                     p->qf, p->kf, p->vf, p->of, p->dqf, p->dkf, p->dvf};
    for (size_t i = 0; i < FA_ARRAY_SIZE(mems); i++)
        if (mems[i]) fa_cl.clReleaseMemObject(mems[i]);
    for (int c = 0; c < p->chunk_count; c++) {
        if (p->chunks[c].s1) fa_cl.clReleaseMemObject(p->chunks[c].s1);
        if (p->chunks[c].s2) fa_cl.clReleaseMemObject(p->chunks[c].s2);
    }
    free(p->chunks);
    free(p->pair_chunk);
    free(p->pair_off_host);
    free(p->off_a);
    free(p->off_b);
    free(p->off_c);
    free(p->alphas);
    free(p->betas);
    free(p);
}

static fa_status create_buffer(fa_cl_std_plan *p, size_t bytes, const void *host, const char *what, cl_mem *out) {
    cl_int err = CL_SUCCESS;
    if (bytes == 0) bytes = 16; /* a zero-sized buffer is an error in OpenCL */
    const fa_cl_device *dev = fa_cl_device_get(p->ctx->index);
    if (dev && (cl_ulong)bytes > dev->max_alloc_bytes)
        return fa_fail(FA_ERR_OUT_OF_MEMORY,
                       "standard attention needs %zu bytes for %s, more than the %llu bytes %s allows in one "
                       "buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                       bytes, what, (unsigned long long)dev->max_alloc_bytes, p->ctx->info.desc.name);
    cl_mem_flags flags = CL_MEM_READ_WRITE | (host ? CL_MEM_COPY_HOST_PTR : 0);
    *out = fa_cl.clCreateBuffer(p->ctx->context, flags, bytes, (void *)host, &err);
    if (!*out || err != CL_SUCCESS) {
        *out = NULL;
        if (err == CL_SUCCESS || err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
            err == CL_OUT_OF_HOST_MEMORY || err == CL_INVALID_BUFFER_SIZE)
            return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for %s on the device (clCreateBuffer: %d)",
                           bytes, what, (int)err);
        return fa_cl_error(err, "clCreateBuffer");
    }
    p->device_bytes += bytes;
    return FA_SUCCESS;
}

/* One score matrix (S, or dP for the backward pass), chunk by chunk:
 * refused up front when the device cannot hold it at all, so that the
 * failure is a status, not a driver's late allocation error. */
static fa_status create_scores(fa_cl_std_plan *p, int second, const char *what) {
    /* The backward pass holds both matrices at once. */
    const double bytes = (second ? 2.0 : 1.0) * p->score_elems * (double)sizeof(float);
    const fa_device_desc *dd = &p->ctx->info.desc;
    if (dd->global_mem_bytes > 0 && bytes > (double)dd->global_mem_bytes)
        return fa_fail(FA_ERR_OUT_OF_MEMORY,
                       "standard attention needs %.0f bytes for %s (heads_q x seqlen_q x seqlen_k fp32 per "
                       "sequence%s), more than the %zu bytes of global memory of %s",
                       bytes, what, second ? ", beside S" : "", dd->global_mem_bytes, dd->name);
    for (int c = 0; c < p->chunk_count; c++) {
        cl_mem *slot = second ? &p->chunks[c].s2 : &p->chunks[c].s1;
        if (!*slot) FA_CHECK(create_buffer(p, p->chunks[c].elems * sizeof(float), NULL, what, slot));
    }
    return FA_SUCCESS;
}

static fa_status build_program(fa_cl_std_plan *p, const fa_attention_desc *d) {
    static const char *const paths[] = {"kernels_cl/common.h", "kernels_cl/standard.cl"};
    int window = fa_desc_has_window(d);
    char options[512];
    /* BR, BC, TR and TC only satisfy common.h: nothing here is tiled. */
    int n = snprintf(options, sizeof options, "-DHEAD_DIM=%d %s -DBR=4 -DBC=4 -DTR=1 -DTC=1 -DSTD_WG=%d%s%s%s%s%s",
                     d->head_dim, fa_dtype_build_option(d->q.dtype), p->wg, d->causal ? " -DCAUSAL" : "",
                     window ? " -DWINDOW" : "", d->block_mask ? " -DBLOCK_MASK" : "",
                     d->dropout_p > 0.0f ? " -DDROPOUT" : "", p->varlen ? " -DVARLEN" : "");
    if (n < 0 || (size_t)n >= sizeof options)
        return fa_fail(FA_ERR_INTERNAL, "kernel build options do not fit in %zu bytes", sizeof options);
    FA_CHECK(fa_cl_build(p->ctx, paths, 2, options, &p->program));
    static const char *const names[] = {"std_begin", "std_convert_in", "std_convert_out", "std_zero_rows",
                                        "std_softmax", "std_rowdot",     "std_probs",       "std_dscores"};
    cl_kernel *slots[] = {&p->k_begin, &p->k_convert_in, &p->k_convert_out, &p->k_zero,
                          &p->k_softmax, &p->k_rowdot, &p->k_probs, &p->k_dscores};
    for (size_t i = 0; i < FA_ARRAY_SIZE(names); i++) FA_CHECK(fa_cl_create_kernel(p->program, names[i], slots[i]));
    return FA_SUCCESS;
}

static std_layout resolve_layout(const fa_attention_desc *d, fa_tensor_role role) {
    fa_layout r = fa_desc_layout(d, role);
    std_layout l = {r.offset, r.stride_batch, r.stride_seq, r.stride_head};
    return l;
}

/* Lengths of sequence b. */
static void seq_lengths(const fa_plan_s *plan, int b, int *sq, int *sk) {
    if (plan->cu_seqlens_q) {
        *sq = (int)(plan->cu_seqlens_q[b + 1] - plan->cu_seqlens_q[b]);
        *sk = (int)(plan->cu_seqlens_k[b + 1] - plan->cu_seqlens_k[b]);
    } else {
        *sq = plan->desc.seqlen_q;
        *sk = plan->desc.seqlen_k;
    }
}

/* CLBlast computes indices in int: a buffer it reads or writes, and each
 * of its tile-padded temporaries, must stay below 2^31 elements. Its tiles
 * are at most 128 wide; STD_TILE_PAD bounds what padding adds to a side. */
#define STD_INT_LIMIT 2147483647.0
#define STD_TILE_PAD 256.0

/* Test hook: a cap on the bytes of one score chunk (0: none). */
static size_t chunk_cap_bytes;

void fa_cl_standard_set_chunk_limit(size_t bytes) {
    pthread_mutex_lock(&hook_lock);
    chunk_cap_bytes = bytes;
    pthread_mutex_unlock(&hook_lock);
}

/* The tensors CLBlast reads in place (fp32) or the packed fp32 copies must
 * be indexable with int. */
static fa_status check_index_range(const fa_cl_std_plan *p, const fa_plan_s *plan) {
    const fa_attention_desc *d = &plan->desc;
    for (int r = FA_TENSOR_Q; r <= FA_TENSOR_O; r++) {
        double elems = p->convert ? (double)(r == FA_TENSOR_Q || r == FA_TENSOR_O ? p->total_q * p->heads_q
                                                                                    : p->total_k * p->heads_kv) *
                                        (double)p->dim
                                  : (double)fa_desc_tensor_extent(d, (fa_tensor_role)r);
        if (elems > STD_INT_LIMIT)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "standard attention on OpenCL: tensor %s spans %.0f elements, but CLBlast indexes "
                           "with 32-bit integers (at most 2^31 - 1)",
                           fa_tensor_role_name((fa_tensor_role)r), elems);
    }
    return FA_SUCCESS;
}

/* Places the (sequence, head) blocks of a score matrix in chunks. */
static fa_status layout_scores(fa_cl_std_plan *p, const fa_plan_s *plan) {
    const fa_device_desc *dd = &p->ctx->info.desc;
    const fa_cl_device *dev = fa_cl_device_get(p->ctx->index);
    const double max_alloc = dev ? (double)dev->max_alloc_bytes : STD_INT_LIMIT * 4.0;
    double cap = max_alloc < STD_INT_LIMIT * 4.0 ? max_alloc : STD_INT_LIMIT * 4.0;
    if (dd->global_mem_bytes > 0 && (double)dd->global_mem_bytes / 8.0 < cap) cap = (double)dd->global_mem_bytes / 8.0;
    pthread_mutex_lock(&hook_lock);
    if (chunk_cap_bytes > 0 && (double)chunk_cap_bytes < cap) cap = (double)chunk_cap_bytes;
    pthread_mutex_unlock(&hook_lock);
    const double cap_elems = cap / (double)sizeof(float);

    double total = 0.0;
    for (int b = 0; b < p->batch; b++) {
        int sq, sk;
        seq_lengths(plan, b, &sq, &sk);
        total += (double)p->heads_q * (double)sq * (double)sk;
    }
    p->score_elems = total;
    if (dd->global_mem_bytes > 0 && total * 4.0 > (double)dd->global_mem_bytes)
        return fa_fail(FA_ERR_OUT_OF_MEMORY,
                       "standard attention needs %.0f bytes for the score matrix S (heads_q x seqlen_q x "
                       "seqlen_k fp32 per sequence), more than the %zu bytes of global memory of %s",
                       total * 4.0, dd->global_mem_bytes, dd->name);

    if ((double)p->batch * (double)p->heads_q > STD_INT_LIMIT)
        return fa_fail(FA_ERR_UNSUPPORTED, "standard attention on OpenCL: batch x heads_q = %.0f score blocks",
                       (double)p->batch * (double)p->heads_q);
    p->pairs = p->batch * p->heads_q;
    p->pair_chunk = malloc((size_t)p->pairs * sizeof *p->pair_chunk);
    p->pair_off_host = malloc((size_t)p->pairs * sizeof *p->pair_off_host);
    if (!p->pair_chunk || !p->pair_off_host)
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for the offsets of %d score blocks", p->pairs);
    int capacity = 0;
    double used = 0.0;
    for (int b = 0; b < p->batch; b++) {
        int sq, sk;
        seq_lengths(plan, b, &sq, &sk);
        const double block = (double)sq * (double)sk;
        if (block * 4.0 > max_alloc)
            return fa_fail(FA_ERR_OUT_OF_MEMORY,
                           "standard attention needs %.0f bytes for one %d x %d block of S, more than the %.0f "
                           "bytes %s allows in one buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                           block * 4.0, sq, sk, max_alloc, dd->name);
        if ((sq + STD_TILE_PAD) * (sk + STD_TILE_PAD) > STD_INT_LIMIT)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "standard attention on OpenCL: a %d x %d score matrix is beyond CLBlast's 32-bit "
                           "indexing (2^31 - 1 elements, padding included)",
                           sq, sk);
        for (int h = 0; h < p->heads_q; h++) {
            const int pair = b * p->heads_q + h;
            if (p->chunk_count == 0 || (used > 0.0 && used + block > cap_elems)) {
                if (p->chunk_count == capacity) {
                    int grown = capacity ? 2 * capacity : 4;
                    std_chunk *more = realloc(p->chunks, (size_t)grown * sizeof *more);
                    if (!more) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %d score chunks", grown);
                    p->chunks = more;
                    capacity = grown;
                }
                if (p->chunk_count > 0) p->chunks[p->chunk_count - 1].pair1 = pair;
                std_chunk fresh = {pair, p->pairs, 0, NULL, NULL};
                p->chunks[p->chunk_count++] = fresh;
                used = 0.0;
            }
            p->pair_chunk[pair] = p->chunk_count - 1;
            p->pair_off_host[pair] = (cl_long)used;
            used += block;
            p->chunks[p->chunk_count - 1].elems = (size_t)used;
        }
    }
    return FA_SUCCESS;
}

/* The softmax's work-group: a power of two the device takes, 128 at most
 * (a row's reduction needs no more). */
static int pick_work_group(const fa_cl_context *ctx) {
    int limit = ctx->info.desc.max_work_group_size > 0 ? ctx->info.desc.max_work_group_size : 1;
    int wg = 128;
    while (wg > limit) wg /= 2;
    return wg;
}

fa_status fa_cl_standard_prepare(fa_cl_context *ctx, const fa_plan_s *plan, void **plan_impl) {
    if (!plan_impl) return fa_fail(FA_ERR_NULL_POINTER, "plan_impl is NULL");
    *plan_impl = NULL;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    const fa_attention_desc *d = &plan->desc;
    if (d->algorithm != FA_ALGO_STANDARD)
        return fa_fail(FA_ERR_INTERNAL, "desc.algorithm is %d, not FA_ALGO_STANDARD", (int)d->algorithm);
    if (d->head_dim % 8 || d->head_dim < 8 || d->head_dim > 256)
        return fa_fail(FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim %d is not a multiple of 8 in [8, 256]", d->head_dim);
    if (d->q.dtype != d->k.dtype || d->q.dtype != d->v.dtype || d->q.dtype != d->o.dtype)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "standard attention needs q, k, v and o of one dtype");
    fa_clblast_sgemm_batched_fn sgemm = NULL;
    FA_CHECK(blas_load(&sgemm));

    fa_cl_std_plan *p = calloc(1, sizeof *p);
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for an OpenCL standard-attention plan");
    p->kind = FA_CL_PLAN_STANDARD;
    p->ctx = ctx;
    p->sgemm = sgemm;
    p->batch = d->batch;
    p->seqlen_q = d->seqlen_q;
    p->seqlen_k = d->seqlen_k;
    p->heads_q = d->heads_q;
    p->heads_kv = d->heads_kv;
    p->group = d->heads_q / d->heads_kv;
    p->dim = d->head_dim;
    p->varlen = plan->cu_seqlens_q != NULL;
    p->convert = d->q.dtype != FA_DTYPE_F32;
    p->total_q = plan->total_q;
    p->total_k = plan->total_k;
    p->q = resolve_layout(d, FA_TENSOR_Q);
    p->k = resolve_layout(d, FA_TENSOR_K);
    p->v = resolve_layout(d, FA_TENSOR_V);
    p->o = resolve_layout(d, FA_TENSOR_O);
    p->scale = plan->scale;
    p->drop_scale = d->dropout_p > 0.0f ? (float)(1.0 / (1.0 - (double)d->dropout_p)) : 1.0f;
    p->block_q = d->block_mask ? d->block_q : 1;
    p->block_k = d->block_mask ? d->block_k : 1;
    p->block_cols = fa_block_cols(d);
    p->wg = pick_work_group(ctx);

    fa_status st = FA_SUCCESS;
    p->batch_cap = (size_t)d->batch * (size_t)d->heads_q;
    p->off_a = malloc(p->batch_cap * sizeof *p->off_a);
    p->off_b = malloc(p->batch_cap * sizeof *p->off_b);
    p->off_c = malloc(p->batch_cap * sizeof *p->off_c);
    p->alphas = malloc(p->batch_cap * sizeof *p->alphas);
    p->betas = malloc(p->batch_cap * sizeof *p->betas);
    if (!p->off_a || !p->off_b || !p->off_c || !p->alphas || !p->betas)
        st = fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for the offsets of %zu matrices", p->batch_cap);
    if (st == FA_SUCCESS) st = check_index_range(p, plan);
    if (st == FA_SUCCESS) st = layout_scores(p, plan);

    if (st == FA_SUCCESS) st = create_buffer(p, 16, NULL, "a placeholder buffer", &p->dummy);
    if (st == FA_SUCCESS)
        st = create_buffer(p, (size_t)p->pairs * sizeof(cl_long), p->pair_off_host, "the score offsets",
                           &p->pair_off);
    if (st == FA_SUCCESS && p->varlen) {
        size_t bytes = ((size_t)d->batch + 1) * sizeof(int32_t);
        st = create_buffer(p, bytes, plan->cu_seqlens_q, "cu_seqlens_q", &p->cu_q);
        if (st == FA_SUCCESS) st = create_buffer(p, bytes, plan->cu_seqlens_k, "cu_seqlens_k", &p->cu_k);
    }
    if (st == FA_SUCCESS && d->block_mask)
        st = create_buffer(p, d->block_mask_bytes, plan->block_mask, "the block mask", &p->block_mask);
    if (st == FA_SUCCESS) st = create_scores(p, 0, "the score matrix S");
    if (st == FA_SUCCESS && p->convert) {
        size_t qbytes = (size_t)p->total_q * (size_t)d->heads_q * (size_t)d->head_dim * sizeof(float);
        size_t kbytes = (size_t)p->total_k * (size_t)d->heads_kv * (size_t)d->head_dim * sizeof(float);
        st = create_buffer(p, qbytes, NULL, "the fp32 copy of Q", &p->qf);
        if (st == FA_SUCCESS) st = create_buffer(p, kbytes, NULL, "the fp32 copy of K", &p->kf);
        if (st == FA_SUCCESS) st = create_buffer(p, kbytes, NULL, "the fp32 copy of V", &p->vf);
        if (st == FA_SUCCESS) st = create_buffer(p, qbytes, NULL, "the fp32 O", &p->of);
    }
    if (st == FA_SUCCESS) st = build_program(p, d);
    if (st != FA_SUCCESS) {
        fa_cl_standard_release(p);
        return st;
    }
    *plan_impl = p;
    return FA_SUCCESS;
}

/* The backward pass's buffers, on its first run: a forward-only user never
 * pays for the second score matrix. */
static fa_status ensure_backward(fa_cl_std_plan *p) {
    FA_CHECK(create_scores(p, 1, "the gradient matrix dP / dS"));
    if (!p->dvec)
        FA_CHECK(create_buffer(p, (size_t)p->total_q * (size_t)p->heads_q * sizeof(float), NULL,
                               "the row sums D = rowsum(dO * O)", &p->dvec));
    if (p->convert) {
        size_t qbytes = (size_t)p->total_q * (size_t)p->heads_q * (size_t)p->dim * sizeof(float);
        size_t kbytes = (size_t)p->total_k * (size_t)p->heads_kv * (size_t)p->dim * sizeof(float);
        if (!p->dqf) FA_CHECK(create_buffer(p, qbytes, NULL, "the fp32 dQ", &p->dqf));
        if (!p->dkf) FA_CHECK(create_buffer(p, kbytes, NULL, "the fp32 dK", &p->dkf));
        if (!p->dvf) FA_CHECK(create_buffer(p, kbytes, NULL, "the fp32 dV", &p->dvf));
    }
    return FA_SUCCESS;
}

int fa_cl_standard_chunk_count(const void *plan_impl) {
    return plan_impl ? ((const fa_cl_std_plan *)plan_impl)->chunk_count : 0;
}

fa_status fa_cl_standard_device_bytes(const void *plan_impl, size_t *bytes) {
    if (!plan_impl || !bytes) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !plan_impl ? "plan_impl" : "bytes");
    *bytes = ((const fa_cl_std_plan *)plan_impl)->device_bytes;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Kernel arguments and launches                                             */

typedef struct std_args {
    cl_kernel kernel;
    const char *name;
    cl_uint index;
    cl_int err;
    cl_uint failed_index;
} std_args;

static void arg_raw(std_args *a, size_t size, const void *value) {
    if (a->err == CL_SUCCESS) {
        a->err = fa_cl.clSetKernelArg(a->kernel, a->index, size, value);
        if (a->err != CL_SUCCESS) a->failed_index = a->index;
    }
    a->index++;
}

static void arg_mem(std_args *a, cl_mem m) { arg_raw(a, sizeof m, &m); }
static void arg_int(std_args *a, int v) {
    cl_int x = v;
    arg_raw(a, sizeof x, &x);
}
static void arg_uint(std_args *a, cl_uint v) { arg_raw(a, sizeof v, &v); }
static void arg_long(std_args *a, cl_long v) { arg_raw(a, sizeof v, &v); }
static void arg_float(std_args *a, float v) {
    cl_float x = v;
    arg_raw(a, sizeof x, &x);
}
static void arg_layout(std_args *a, const std_layout *l) {
    arg_long(a, l->offset);
    arg_long(a, l->stride_batch);
    arg_long(a, l->stride_seq);
    arg_long(a, l->stride_head);
}

static fa_status args_done(const std_args *a) {
    if (a->err == CL_SUCCESS) return FA_SUCCESS;
    char what[96];
    snprintf(what, sizeof what, "clSetKernelArg(%s, %u)", a->name, (unsigned)a->failed_index);
    return fa_cl_error(a->err, what);
}

static cl_mem or_dummy(const fa_cl_std_plan *p, cl_mem m) { return m ? m : p->dummy; }
static cl_mem mem_of(void *buffer) { return ((fa_cl_buffer *)buffer)->mem; }

static fa_status launch(fa_cl_std_plan *p, const std_args *a, cl_uint dims, const size_t *global,
                        const size_t *local) {
    FA_CHECK(args_done(a));
    cl_event ev = NULL;
    FA_CHECK(fa_cl_launch(p->ctx, a->kernel, dims, global, local, &ev));
    track(p, ev);
    return FA_SUCCESS;
}

/* The shape and mask arguments the score kernels share (STD_SHAPE_PARAMS,
 * STD_MASK_PARAMS in standard.cl), for the pairs of chunk c. */
static void shape_mask_args(std_args *a, const fa_cl_std_plan *p, const fa_attention_desc *d, int c) {
    arg_int(a, p->seqlen_q);
    arg_int(a, p->seqlen_k);
    arg_int(a, p->heads_q);
    arg_mem(a, or_dummy(p, p->cu_q));
    arg_mem(a, or_dummy(p, p->cu_k));
    arg_mem(a, p->pair_off);
    arg_int(a, p->chunks[c].pair0);
    arg_int(a, d->window_left);
    arg_int(a, d->window_right);
    arg_mem(a, or_dummy(p, p->block_mask));
    arg_int(a, p->block_q);
    arg_int(a, p->block_k);
    arg_int(a, p->block_cols);
}

static void dropout_args(std_args *a, const fa_cl_std_plan *p, const fa_plan_s *plan) {
    arg_uint(a, plan->dropout_key.key0);
    arg_uint(a, plan->dropout_key.key1);
    arg_uint(a, plan->dropout_key.offset_lo);
    arg_uint(a, plan->dropout_threshold);
    arg_float(a, p->drop_scale);
    /* Read at every pass, like the seed: a ring sets the origin after the
     * plan is prepared (fa_plan_set_dropout_origin). */
    arg_uint(a, (cl_uint)plan->drop_row0);
    arg_uint(a, (cl_uint)plan->drop_col0);
}

/* The packed [tokens][heads][head_dim] layout of the fp32 copies. */
static std_layout packed_layout(const fa_cl_std_plan *p, int heads, int seqlen) {
    std_layout l;
    l.offset = 0;
    l.stride_head = p->dim;
    l.stride_seq = (cl_long)heads * p->dim;
    l.stride_batch = (cl_long)seqlen * l.stride_seq;
    return l;
}

static fa_status convert(fa_cl_std_plan *p, int inward, cl_mem user, const std_layout *l, int heads, int seqlen,
                         int64_t tokens, cl_mem packed) {
    std_args a = {inward ? p->k_convert_in : p->k_convert_out, inward ? "std_convert_in" : "std_convert_out", 0,
                  CL_SUCCESS, 0};
    if (inward) {
        arg_mem(&a, user);
        arg_layout(&a, l);
        arg_int(&a, heads);
        arg_int(&a, seqlen);
        arg_mem(&a, packed);
    } else {
        arg_mem(&a, packed);
        arg_mem(&a, user);
        arg_layout(&a, l);
        arg_int(&a, heads);
        arg_int(&a, seqlen);
    }
    size_t global[3] = {(size_t)p->dim / 8, (size_t)heads, (size_t)tokens};
    return launch(p, &a, 3, global, NULL);
}

/* Zeroes the rows of sequences whose other side is empty: no product
 * writes them. keys_empty selects sequences without keys (rows of a
 * query-side tensor), else sequences without queries (key side). */
static fa_status zero_empty_rows(fa_cl_std_plan *p, const fa_plan_s *plan, cl_mem target, const std_layout *l,
                                 int heads, int keys_empty) {
    for (int b = 0; b < p->batch; b++) {
        int sq, sk;
        seq_lengths(plan, b, &sq, &sk);
        int len = keys_empty ? sq : sk, other = keys_empty ? sk : sq;
        if (len == 0 || other != 0) continue;
        const int32_t *cu = keys_empty ? plan->cu_seqlens_q : plan->cu_seqlens_k;
        cl_long base = l->offset + (cu ? (cl_long)cu[b] * l->stride_seq : (cl_long)b * l->stride_batch);
        std_args a = {p->k_zero, "std_zero_rows", 0, CL_SUCCESS, 0};
        arg_mem(&a, target);
        arg_long(&a, base);
        arg_long(&a, l->stride_seq);
        arg_long(&a, l->stride_head);
        size_t global[3] = {(size_t)p->dim, (size_t)heads, (size_t)len};
        FA_CHECK(launch(p, &a, 3, global, NULL));
    }
    return FA_SUCCESS;
}

/* The score kernels, chunk by chunk. */
typedef enum std_score_kernel { STD_SOFTMAX = 0, STD_PROBS = 1, STD_DSCORES = 2 } std_score_kernel;

static fa_status score_kernel(fa_cl_std_plan *p, const fa_plan_s *plan, std_score_kernel which, cl_mem lse) {
    static const char *const names[] = {"std_softmax", "std_probs", "std_dscores"};
    cl_kernel kernels[] = {p->k_softmax, p->k_probs, p->k_dscores};
    for (int c = 0; c < p->chunk_count; c++) {
        const std_chunk *ch = &p->chunks[c];
        std_args a = {kernels[which], names[which], 0, CL_SUCCESS, 0};
        arg_mem(&a, ch->s1);
        if (which == STD_DSCORES) {
            arg_mem(&a, ch->s2);
            arg_mem(&a, p->dvec);
        } else {
            arg_mem(&a, lse);
        }
        arg_long(&a, p->total_q);
        shape_mask_args(&a, p, &plan->desc, c);
        if (which != STD_PROBS) dropout_args(&a, p, plan);
        const size_t pairs = (size_t)(ch->pair1 - ch->pair0);
        if (which == STD_SOFTMAX) {
            size_t global[2] = {(size_t)p->wg * (size_t)p->seqlen_q, pairs};
            size_t local[2] = {(size_t)p->wg, 1};
            FA_CHECK(launch(p, &a, 2, global, local));
        } else {
            size_t global[3] = {((size_t)p->seqlen_k + 3) / 4, (size_t)p->seqlen_q, pairs};
            FA_CHECK(launch(p, &a, 3, global, NULL));
        }
    }
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Batched products                                                          */

typedef enum std_extent { STD_EXT_Q = 0, STD_EXT_K = 1, STD_EXT_D = 2 } std_extent;

typedef struct std_gemm {
    const char *what;
    fa_clblast_transpose ta, tb;
    std_extent m, n, k;
    float alpha, beta;
    const std_operand *a, *b, *c;
} std_gemm;

static size_t extent_of(std_extent e, int sq, int sk, int dim) {
    return e == STD_EXT_Q ? (size_t)sq : e == STD_EXT_K ? (size_t)sk : (size_t)dim;
}

static std_operand user_operand(cl_mem mem, std_side side, const std_layout *l) {
    std_operand o = {mem, side, 0, l->offset, l->stride_batch, l->stride_seq, l->stride_head};
    return o;
}

static std_operand score_operand(int second) {
    std_operand o = {NULL, STD_SIDE_WORK, second, 0, 0, 0, 0};
    return o;
}

/* Offset of the matrix of sequence b, query head h, kv head hk. */
static size_t operand_offset(const fa_cl_std_plan *p, const fa_plan_s *plan, const std_operand *o, int b, int h,
                             int hk) {
    if (o->side == STD_SIDE_WORK) return (size_t)p->pair_off_host[b * p->heads_q + h];
    const int32_t *cu = o->side == STD_SIDE_Q ? plan->cu_seqlens_q : plan->cu_seqlens_k;
    cl_long seq = cu ? (cl_long)cu[b] * o->stride_seq : (cl_long)b * o->stride_batch;
    return (size_t)(o->offset + seq + (cl_long)(o->side == STD_SIDE_Q ? h : hk) * o->stride_head);
}

static cl_mem operand_mem(const fa_cl_std_plan *p, const std_operand *o, int chunk) {
    if (o->side != STD_SIDE_WORK) return o->mem;
    return o->second ? p->chunks[chunk].s2 : p->chunks[chunk].s1;
}

/* A tensor's leading dimension is its token stride; a tensor with a
 * single token per sequence may carry any stride there, CLBlast wants one
 * at least as wide as a row. */
static size_t operand_ld(const fa_cl_std_plan *p, const std_operand *o, int sk) {
    if (o->side == STD_SIDE_WORK) return (size_t)sk;
    return o->stride_seq >= p->dim ? (size_t)o->stride_seq : (size_t)p->dim;
}

/* How many matrices of this shape one call may take: CLBlast pads each
 * operand to its tiles in temporaries it indexes with int. */
static size_t call_capacity(size_t m, size_t n, size_t k) {
    const double pm = (double)m + STD_TILE_PAD, pn = (double)n + STD_TILE_PAD, pk = (double)k + STD_TILE_PAD;
    double per = pm * pk;
    if (pk * pn > per) per = pk * pn;
    if (pm * pn > per) per = pm * pn;
    return per > STD_INT_LIMIT ? 0 : (size_t)(STD_INT_LIMIT / per);
}

static fa_status gemm_call(fa_cl_std_plan *p, const std_gemm *g, int chunk, int sq, int sk, size_t count) {
    cl_event ev = NULL;
    fa_clblast_status s = p->sgemm(
        FA_CLBLAST_ROW_MAJOR, g->ta, g->tb, extent_of(g->m, sq, sk, p->dim), extent_of(g->n, sq, sk, p->dim),
        extent_of(g->k, sq, sk, p->dim), p->alphas, operand_mem(p, g->a, chunk), p->off_a, operand_ld(p, g->a, sk),
        operand_mem(p, g->b, chunk), p->off_b, operand_ld(p, g->b, sk), p->betas, operand_mem(p, g->c, chunk),
        p->off_c, operand_ld(p, g->c, sk), count, &p->ctx->queue, &ev);
    if (s != FA_CLBLAST_SUCCESS) {
        if (ev) fa_cl.clReleaseEvent(ev);
        return blas_error(s, g->what);
    }
    track(p, ev);
    return FA_SUCCESS;
}

/* One product over every sequence that has queries and keys, in as few
 * calls as the shapes (one per sequence with varlen), the chunks and
 * CLBlast's indexing allow. With per_kv_head, the batch runs over kv heads
 * hk and takes query head hk * group + member; else over the query heads,
 * hk = h / group. */
static fa_status gemm(fa_cl_std_plan *p, const fa_plan_s *plan, const std_gemm *g, int per_kv_head, int member) {
    const int heads = per_kv_head ? p->heads_kv : p->heads_q;
    size_t count = 0, capacity = 0;
    int chunk = -1, seq = -1, sq = 0, sk = 0;
    for (int b = 0; b < p->batch; b++) {
        int bsq, bsk;
        seq_lengths(plan, b, &bsq, &bsk);
        if (bsq == 0 || bsk == 0) continue;
        for (int j = 0; j < heads; j++) {
            const int h = per_kv_head ? j * p->group + member : j;
            const int hk = per_kv_head ? j : j / p->group;
            const int c = p->pair_chunk[b * p->heads_q + h];
            if (count > 0 && (c != chunk || (p->varlen && b != seq) || count == capacity)) {
                FA_CHECK(gemm_call(p, g, chunk, sq, sk, count));
                count = 0;
            }
            if (count == 0) {
                capacity = call_capacity(extent_of(g->m, bsq, bsk, p->dim), extent_of(g->n, bsq, bsk, p->dim),
                                         extent_of(g->k, bsq, bsk, p->dim));
                if (capacity == 0)
                    return fa_fail(FA_ERR_UNSUPPORTED, "%s: a %d x %d problem is beyond CLBlast's 32-bit indexing",
                                   g->what, bsq, bsk);
            }
            chunk = c;
            seq = b;
            sq = bsq;
            sk = bsk;
            p->off_a[count] = operand_offset(p, plan, g->a, b, h, hk);
            p->off_b[count] = operand_offset(p, plan, g->b, b, h, hk);
            p->off_c[count] = operand_offset(p, plan, g->c, b, h, hk);
            p->alphas[count] = g->alpha;
            p->betas[count] = g->beta;
            count++;
        }
    }
    return count > 0 ? gemm_call(p, g, chunk, sq, sk, count) : FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Passes                                                                    */

fa_status fa_cl_standard_forward(void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args) {
    fa_cl_std_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    release_events(p);

    std_operand q, k, v, o;
    std_layout pq = packed_layout(p, p->heads_q, p->seqlen_q), pk = packed_layout(p, p->heads_kv, p->seqlen_k);
    const std_layout *o_layout = p->convert ? &pq : &p->o;
    cl_mem o_target = p->convert ? p->of : mem_of(args->o);
    if (p->convert) {
        FA_CHECK(convert(p, 1, mem_of(args->q), &p->q, p->heads_q, p->seqlen_q, p->total_q, p->qf));
        FA_CHECK(convert(p, 1, mem_of(args->k), &p->k, p->heads_kv, p->seqlen_k, p->total_k, p->kf));
        FA_CHECK(convert(p, 1, mem_of(args->v), &p->v, p->heads_kv, p->seqlen_k, p->total_k, p->vf));
        q = user_operand(p->qf, STD_SIDE_Q, &pq);
        k = user_operand(p->kf, STD_SIDE_K, &pk);
        v = user_operand(p->vf, STD_SIDE_K, &pk);
    } else {
        std_args a = {p->k_begin, "std_begin", 0, CL_SUCCESS, 0};
        arg_mem(&a, p->dummy);
        size_t one = 1;
        FA_CHECK(launch(p, &a, 1, &one, NULL));
        q = user_operand(mem_of(args->q), STD_SIDE_Q, &p->q);
        k = user_operand(mem_of(args->k), STD_SIDE_K, &p->k);
        v = user_operand(mem_of(args->v), STD_SIDE_K, &p->v);
    }
    o = user_operand(o_target, STD_SIDE_Q, o_layout);
    const std_operand s = score_operand(0);

    const std_gemm qk = {"S = scale Q K^T", FA_CLBLAST_NO_TRANS, FA_CLBLAST_TRANS, STD_EXT_Q, STD_EXT_K, STD_EXT_D,
                         p->scale, 0.0f, &q, &k, &s};
    FA_CHECK(gemm(p, plan, &qk, 0, 0));
    FA_CHECK(score_kernel(p, plan, STD_SOFTMAX, mem_of(args->lse)));
    const std_gemm pv = {"O = P V", FA_CLBLAST_NO_TRANS, FA_CLBLAST_NO_TRANS, STD_EXT_Q, STD_EXT_D, STD_EXT_K,
                         1.0f, 0.0f, &s, &v, &o};
    FA_CHECK(gemm(p, plan, &pv, 0, 0));
    FA_CHECK(zero_empty_rows(p, plan, o_target, o_layout, p->heads_q, 1));
    if (p->convert)
        FA_CHECK(convert(p, 0, mem_of(args->o), &p->o, p->heads_q, p->seqlen_q, p->total_q, p->of));
    return FA_SUCCESS;
}

fa_status fa_cl_standard_backward(void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args) {
    fa_cl_std_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    FA_CHECK(ensure_backward(p));
    release_events(p);

    /* D = rowsum(dO * O) from the caller's tensors, in their dtype. */
    std_args r = {p->k_rowdot, "std_rowdot", 0, CL_SUCCESS, 0};
    arg_mem(&r, mem_of(args->o));
    arg_mem(&r, mem_of(args->dout));
    arg_layout(&r, &p->o);
    arg_mem(&r, p->dvec);
    arg_long(&r, p->total_q);
    arg_int(&r, p->seqlen_q);
    arg_int(&r, p->heads_q);
    arg_mem(&r, or_dummy(p, p->cu_q));
    size_t rglobal[3] = {(size_t)p->seqlen_q, (size_t)p->heads_q, (size_t)p->batch};
    FA_CHECK(launch(p, &r, 3, rglobal, NULL));

    std_operand q, k, v, dout, dq, dk, dv;
    std_layout pq = packed_layout(p, p->heads_q, p->seqlen_q), pk = packed_layout(p, p->heads_kv, p->seqlen_k);
    if (p->convert) {
        FA_CHECK(convert(p, 1, mem_of(args->q), &p->q, p->heads_q, p->seqlen_q, p->total_q, p->qf));
        FA_CHECK(convert(p, 1, mem_of(args->k), &p->k, p->heads_kv, p->seqlen_k, p->total_k, p->kf));
        FA_CHECK(convert(p, 1, mem_of(args->v), &p->v, p->heads_kv, p->seqlen_k, p->total_k, p->vf));
        FA_CHECK(convert(p, 1, mem_of(args->dout), &p->o, p->heads_q, p->seqlen_q, p->total_q, p->of));
        q = user_operand(p->qf, STD_SIDE_Q, &pq);
        k = user_operand(p->kf, STD_SIDE_K, &pk);
        v = user_operand(p->vf, STD_SIDE_K, &pk);
        dout = user_operand(p->of, STD_SIDE_Q, &pq);
        dq = user_operand(p->dqf, STD_SIDE_Q, &pq);
        dk = user_operand(p->dkf, STD_SIDE_K, &pk);
        dv = user_operand(p->dvf, STD_SIDE_K, &pk);
    } else {
        q = user_operand(mem_of(args->q), STD_SIDE_Q, &p->q);
        k = user_operand(mem_of(args->k), STD_SIDE_K, &p->k);
        v = user_operand(mem_of(args->v), STD_SIDE_K, &p->v);
        dout = user_operand(mem_of(args->dout), STD_SIDE_Q, &p->o);
        dq = user_operand(mem_of(args->dq), STD_SIDE_Q, &p->q);
        dk = user_operand(mem_of(args->dk), STD_SIDE_K, &p->k);
        dv = user_operand(mem_of(args->dv), STD_SIDE_K, &p->v);
    }
    const std_operand s1 = score_operand(0), s2 = score_operand(1);

    const std_gemm qk = {"S = scale Q K^T", FA_CLBLAST_NO_TRANS, FA_CLBLAST_TRANS, STD_EXT_Q, STD_EXT_K, STD_EXT_D,
                         p->scale, 0.0f, &q, &k, &s1};
    FA_CHECK(gemm(p, plan, &qk, 0, 0));
    FA_CHECK(score_kernel(p, plan, STD_PROBS, mem_of(args->lse)));
    const std_gemm dov = {"dP = dO V^T", FA_CLBLAST_NO_TRANS, FA_CLBLAST_TRANS, STD_EXT_Q, STD_EXT_K, STD_EXT_D,
                          1.0f, 0.0f, &dout, &v, &s2};
    FA_CHECK(gemm(p, plan, &dov, 0, 0));
    FA_CHECK(score_kernel(p, plan, STD_DSCORES, NULL));

    /* dV and dK: one product per member of a kv head's group, the first
     * overwriting, the others adding (beta = 1). */
    for (int member = 0; member < p->group; member++) {
        const float beta = member ? 1.0f : 0.0f;
        const std_gemm pdo = {"dV = P^T dO", FA_CLBLAST_TRANS, FA_CLBLAST_NO_TRANS, STD_EXT_K, STD_EXT_D,
                              STD_EXT_Q, 1.0f, beta, &s1, &dout, &dv};
        FA_CHECK(gemm(p, plan, &pdo, 1, member));
    }
    const std_gemm dsk = {"dQ = scale dS K", FA_CLBLAST_NO_TRANS, FA_CLBLAST_NO_TRANS, STD_EXT_Q, STD_EXT_D,
                          STD_EXT_K, p->scale, 0.0f, &s2, &k, &dq};
    FA_CHECK(gemm(p, plan, &dsk, 0, 0));
    for (int member = 0; member < p->group; member++) {
        const float beta = member ? 1.0f : 0.0f;
        const std_gemm dsq = {"dK = scale dS^T Q", FA_CLBLAST_TRANS, FA_CLBLAST_NO_TRANS, STD_EXT_K, STD_EXT_D,
                              STD_EXT_Q, p->scale, beta, &s2, &q, &dk};
        FA_CHECK(gemm(p, plan, &dsq, 1, member));
    }

    const std_layout *lq = p->convert ? &pq : &p->q, *lk = p->convert ? &pk : &p->k, *lv = p->convert ? &pk : &p->v;
    FA_CHECK(zero_empty_rows(p, plan, dq.mem, lq, p->heads_q, 1));
    FA_CHECK(zero_empty_rows(p, plan, dk.mem, lk, p->heads_kv, 0));
    FA_CHECK(zero_empty_rows(p, plan, dv.mem, lv, p->heads_kv, 0));
    if (p->convert) {
        FA_CHECK(convert(p, 0, mem_of(args->dq), &p->q, p->heads_q, p->seqlen_q, p->total_q, p->dqf));
        FA_CHECK(convert(p, 0, mem_of(args->dk), &p->k, p->heads_kv, p->seqlen_k, p->total_k, p->dkf));
        FA_CHECK(convert(p, 0, mem_of(args->dv), &p->v, p->heads_kv, p->seqlen_k, p->total_k, p->dvf));
    }
    return FA_SUCCESS;
}

fa_status fa_cl_standard_last_time_ms(void *plan_impl, double *ms) {
    fa_cl_std_plan *p = plan_impl;
    if (!p || !ms) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "ms");
    if (!p->first) return fa_fail(FA_ERR_UNSUPPORTED, "no standard-attention pass has run on this plan");
    cl_event end_event = p->last ? p->last : p->first;
    cl_ulong start = 0, end = 0;
    if (fa_cl.clWaitForEvents(1, &end_event) != CL_SUCCESS ||
        fa_cl.clGetEventProfilingInfo(p->first, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) !=
            CL_SUCCESS ||
        fa_cl.clGetEventProfilingInfo(end_event, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) != CL_SUCCESS ||
        end < start)
        return fa_fail(FA_ERR_UNSUPPORTED, "the OpenCL queue could not time the last standard-attention pass");
    *ms = (double)(end - start) * 1e-6;
    return FA_SUCCESS;
}
