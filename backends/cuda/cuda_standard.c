/* Standard attention on CUDA: the unfused baseline the FlashAttention papers
 * measure against. Every N x N matrix goes through device memory, in the
 * storage dtype:
 *
 *   forward   S = scale Q K^T (cuBLAS), P = softmax(S) and L (std_softmax),
 *             O = P V (cuBLAS);
 *   backward  D = rowsum(dO * O) (std_rowdot), S = scale Q K^T,
 *             P = exp(S - L) (std_probs), dP = dO V^T,
 *             dS = P * (dP - D) (std_dscores), dV = P^T dO,
 *             dQ = scale dS K, dK = scale dS^T Q (cuBLAS),
 *
 * which is the traffic core/iomodel.c (fa_io_standard) counts, and the
 * workspace core/planner.c (plan_standard) plans: S and P for the forward
 * pass, S, P, dP and dS and D for the backward. Masks are applied by the
 * element-wise kernels (kernels_cuda/standard.cu), never skipped: standard
 * attention computes the whole matrix.
 *
 * Products: cublasGemmStridedBatchedEx with fp32 accumulation
 * (CUBLAS_COMPUTE_32F; fp16 and bf16 on tensor cores, fp32 on the FP32 pipes
 * unless desc->allow_tf32), reading the caller's tensors in place (token
 * stride as the leading dimension, head stride as the batch stride) and
 * writing S, dP and the outputs in the storage dtype, so that each matrix
 * holds what a matrix of that dtype would: core/reference.c's
 * fa_ref_standard_forward. cuBLAS is column-major: a row-major C = op(A)
 * op(B) is the column-major C^T = op(B)^T op(A)^T, so every call passes B
 * before A with the two output extents swapped.
 *
 * Batches. One strided call covers the (sequence, query head) pairs whose
 * operands lie at constant distances: the query heads of one sequence when
 * every kv head serves one query head, the members of a GQA group (K and V
 * repeat: a batch stride of 0) or the kv heads of one member, and across
 * sequences too where the layouts line up (fixed lengths). Variable-length
 * batches differ in shape from sequence to sequence, and so get calls of
 * their own. dK and dV sum over the query heads of a group: one call per
 * member, the first overwriting, the others adding (beta = 1); fp16 and bf16
 * sums go through an fp32 buffer, rounded once into the caller's tensor.
 * A tensor whose token stride does not fit cuBLAS's 32-bit leading
 * dimension is copied to a packed one first (and results back).
 *
 * The score matrices are held in chunks (as on OpenCL): allocations of
 * whole (sequence, head) blocks, each at most FA_STD_CHUNK_BYTES unless one
 * block is larger; a product or a kernel launch never spans two. */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"

#include "cuda_compile.h"
#include "cuda_standard.h"

#include "desc.h"
#include "dtype.h"
#include "dynlib.h"
#include "plan_data.h"
#include "fa_internal.h"
#include "plan.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FA_CUBLAS_ENV "FLASHATTN_CUBLAS_LIBRARY"
/* Default cap on one score allocation. */
#define FA_STD_CHUNK_BYTES ((size_t)4 << 30)
/* Threads of every kernel of standard.cu (STD_THREADS), rows per block of
 * the row kernels (STD_WARPS). */
#define STD_THREADS 256
#define STD_WARPS (STD_THREADS / 32)
/* Matrices per strided call and score-kernel blocks along y: the grid's
 * y and z limit, which some cuBLAS releases inherit for their batch. */
#define STD_MAX_BATCH 65535

/* ------------------------------------------------------------------------ */
/* cuBLAS, loaded at run time                                                */
/*                                                                           */
/* The few declarations of cuBLAS's C API (cublas_api.h, library_types.h of  */
/* CUDA 11 to 13) used here, restated so that no cuBLAS header is needed to  */
/* build. Its enums are passed as int, as the C ABI passes them.             */

typedef struct fa_cublas_opaque *fa_cublas_handle; /* cublasHandle_t */

enum {
    FA_CUBLAS_STATUS_SUCCESS = 0,
    FA_CUBLAS_STATUS_NOT_INITIALIZED = 1,
    FA_CUBLAS_STATUS_ALLOC_FAILED = 3,
    FA_CUBLAS_STATUS_INVALID_VALUE = 7,
    FA_CUBLAS_STATUS_ARCH_MISMATCH = 8,
    FA_CUBLAS_STATUS_MAPPING_ERROR = 11,
    FA_CUBLAS_STATUS_EXECUTION_FAILED = 13,
    FA_CUBLAS_STATUS_INTERNAL_ERROR = 14,
    FA_CUBLAS_STATUS_NOT_SUPPORTED = 15,
    FA_CUBLAS_STATUS_LICENSE_ERROR = 16
};
enum { FA_CUBLAS_OP_N = 0, FA_CUBLAS_OP_T = 1 };                           /* cublasOperation_t */
enum { FA_CUDA_R_32F = 0, FA_CUDA_R_16F = 2, FA_CUDA_R_16BF = 14 };         /* cudaDataType */
enum { FA_CUBLAS_COMPUTE_32F = 68, FA_CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };  /* cublasComputeType_t */
enum { FA_CUBLAS_GEMM_DEFAULT = -1 };                                      /* cublasGemmAlgo_t */
enum { FA_CUBLAS_DEFAULT_MATH = 0, FA_CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16 }; /* cublasMath_t */

typedef int (*fa_cublas_create_fn)(fa_cublas_handle *handle);
typedef int (*fa_cublas_destroy_fn)(fa_cublas_handle handle);
typedef int (*fa_cublas_set_stream_fn)(fa_cublas_handle handle, CUstream stream);
typedef int (*fa_cublas_set_math_mode_fn)(fa_cublas_handle handle, int mode);
/* cublasGemmStridedBatchedEx: C_i = alpha op(A_i) op(B_i) + beta C_i,
 * column-major, matrix i of each operand at its pointer + i * stride. */
typedef int (*fa_cublas_gemm_fn)(fa_cublas_handle handle, int transa, int transb, int m, int n, int k,
                                 const void *alpha, const void *a, int a_type, int lda, long long stride_a,
                                 const void *b, int b_type, int ldb, long long stride_b, const void *beta, void *c,
                                 int c_type, int ldc, long long stride_c, int batch_count, int compute_type, int algo);
typedef const char *(*fa_cublas_status_string_fn)(int status);

typedef struct std_blas {
    fa_cublas_create_fn create;
    fa_cublas_destroy_fn destroy;
    fa_cublas_set_stream_fn set_stream;
    fa_cublas_set_math_mode_fn set_math_mode;
    fa_cublas_gemm_fn gemm;
    fa_cublas_status_string_fn status_string; /* NULL where missing */
} std_blas;

static fa_lazy_library blas_lib = FA_LAZY_LIBRARY_INIT;
static std_blas blas_api; /* filled under blas_lib.lock, fixed once loaded */

static int blas_resolve(void *lib, char *reason, size_t reason_size) {
    std_blas api;
    memset(&api, 0, sizeof api);
    int ok = fa_dynlib_load(lib, "cublasCreate_v2", NULL, &api.create, reason, reason_size);
    ok = ok && fa_dynlib_load(lib, "cublasDestroy_v2", NULL, &api.destroy, reason, reason_size);
    ok = ok && fa_dynlib_load(lib, "cublasSetStream_v2", NULL, &api.set_stream, reason, reason_size);
    ok = ok && fa_dynlib_load(lib, "cublasSetMathMode", NULL, &api.set_math_mode, reason, reason_size);
    ok = ok && fa_dynlib_load(lib, "cublasGemmStridedBatchedEx", NULL, &api.gemm, reason, reason_size);
    if (!ok) return 0;
    char unused[256];
    (void)fa_dynlib_load(lib, "cublasGetStatusString", NULL, &api.status_string, unused, sizeof unused);
    blas_api = api;
    return 1;
}

/* cuBLAS, loaded once it can be (fa_lazy_library). */
static fa_status blas_load(const std_blas **out) {
    static const char *const defaults[] = {"libcublas.so.13",
                                           "libcublas.so.12",
                                           "libcublas.so.11",
                                           "libcublas.so",
                                           "/usr/local/cuda/lib64/libcublas.so.13",
                                           "/usr/local/cuda/lib64/libcublas.so.12",
                                           "/usr/local/cuda/lib64/libcublas.so.11",
                                           "/usr/local/cuda/lib64/libcublas.so",
                                           NULL};
    char reason[2048];
    if (!fa_lazy_library_load(&blas_lib, FA_CUBLAS_ENV, defaults, blas_resolve, reason, sizeof reason)) {
        *out = NULL;
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "FA_ALGO_STANDARD on CUDA runs its matrix products in cuBLAS, which could not be loaded: "
                       "%s (install cuBLAS or set " FA_CUBLAS_ENV " to its path)",
                       reason);
    }
    *out = &blas_api;
    return FA_SUCCESS;
}

int fa_cuda_standard_blas_loaded(void) { return fa_lazy_library_loaded(&blas_lib); }

static const char *blas_status_name(int s) {
    switch (s) {
    case FA_CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case FA_CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case FA_CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case FA_CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case FA_CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case FA_CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case FA_CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case FA_CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case FA_CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "an unknown cuBLAS status";
    }
}

static fa_status blas_error(int s, const char *what) {
    fa_status status = FA_ERR_LAUNCH;
    if (s == FA_CUBLAS_STATUS_ALLOC_FAILED) status = FA_ERR_OUT_OF_MEMORY;
    if (s == FA_CUBLAS_STATUS_NOT_SUPPORTED || s == FA_CUBLAS_STATUS_ARCH_MISMATCH) status = FA_ERR_UNSUPPORTED;
    /* Only after blas_load succeeded: blas_api is fixed. */
    const char *text = blas_api.status_string ? blas_api.status_string(s) : NULL;
    return fa_fail(status, "cuBLAS %s failed: %s (status %d)%s%s", what, blas_status_name(s), s, text ? ": " : "",
                   text ? text : "");
}

/* ------------------------------------------------------------------------ */
/* The plan                                                                  */

enum { STD_S = 0, STD_P = 1, STD_DP = 2, STD_DS = 3, STD_MATRICES = 4 };
static const char *const matrix_names[STD_MATRICES] = {"S", "P", "dP", "dS"};

enum { K_SOFTMAX = 0, K_PROBS, K_DSCORES, K_ROWDOT, K_ROWS, K_COUNT };
static const char *const kernel_names[K_COUNT] = {"std_softmax", "std_probs", "std_dscores", "std_rowdot",
                                                  "std_rows"};

/* std_rows modes (STD_ROWS_* in standard.cu). */
enum { ROWS_COPY = 0, ROWS_F32 = 1, ROWS_ZERO = 2 };

/* struct std_params of standard.cu, field for field. */
typedef struct std_params {
    CUdeviceptr s, p, dp, ds, pair_off, lse, dvec, cu_q, cu_k, block_mask, src, dst, o, dout;
    int64_t total_q;
    int64_t src_off, src_sb, src_ss, src_sh;
    int64_t dst_off, dst_sb, dst_ss, dst_sh;
    int64_t o_off, o_sb, o_ss, o_sh;
    int64_t tok0, rows;
    int seqlen_q, seqlen_k, heads_q, pair0;
    int window_left, window_right, block_q, block_k;
    int block_cols, dim, heads, seqlen;
    int mode, pad0;
    uint32_t drop_key0, drop_key1, drop_offset_lo, drop_threshold;
    uint32_t drop_row0, drop_col0;
    float drop_scale, pad1;
} std_params;

_Static_assert(sizeof(std_params) == 14 * 8 + 15 * 8 + 22 * 4, "std_params has padding");

/* A tensor layout in elements, packed strides resolved. */
typedef struct std_layout {
    int64_t off, sb, ss, sh;
} std_layout;

/* One allocation of each score matrix: the blocks of pairs [pair0, pair1). */
typedef struct std_chunk {
    int pair0, pair1;
    int max_q;                    /* longest query side among them */
    size_t bytes;
    CUdeviceptr mat[STD_MATRICES];
} std_chunk;

enum { ROLE_Q = 0, ROLE_K = 1, ROLE_V = 2, ROLE_O = 3 };

typedef struct fa_cuda_std_plan {
    struct fa_cuda_std_plan *next; /* live plans (fa_cuda_standard_owns) */
    fa_cuda_context *ctx;
    const std_blas *blas;
    fa_cublas_handle handle;
    CUmodule module;
    CUfunction fn[K_COUNT];
    CUevent ev_start, ev_stop;
    int timed;                    /* a pass was recorded between the events */

    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, group, dim;
    int64_t total_q, total_k;
    fa_dtype dtype;
    size_t esize;
    int data_type, compute_type;
    float scale;
    std_layout lay[4];            /* the caller's Q, K, V, O (and dQ, dK, dV, dO) */
    std_layout packed_q, packed_k; /* [tokens][heads][head_dim] */
    int pack[4];                  /* roles that go through a packed copy */
    int acc;                      /* dK, dV summed over a group in fp32 */

    int pairs;
    int *pair_chunk;
    int64_t *pair_off;            /* element offset of each block in its chunk */
    int chunk_count;
    std_chunk *chunks;
    double score_elems;           /* of one matrix, all chunks */

    CUdeviceptr d_pair_off, d_cu_q, d_cu_k, d_block_mask;
    CUdeviceptr packed[4];        /* copies of Q, K, V, and O / dO */
    CUdeviceptr packed_grad[3];   /* dQ, dK, dV before they are unpacked */
    CUdeviceptr dvec, dk_acc, dv_acc;
    size_t packed_grad_bytes[3], dvec_bytes, acc_bytes;
    int backward_ready;
    size_t device_bytes;
    std_params base;
} fa_cuda_std_plan;

static const fa_cu_api *cu(void) { return fa_cuda_api(); }

/* Live plans: release and timing get only the pointer, and fused plans of
 * cuda_attention.c carry no tag, so ownership is looked up. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static fa_cuda_std_plan *registry;

static void registry_add(fa_cuda_std_plan *p) {
    pthread_mutex_lock(&registry_lock);
    p->next = registry;
    registry = p;
    pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(fa_cuda_std_plan *p) {
    pthread_mutex_lock(&registry_lock);
    for (fa_cuda_std_plan **at = &registry; *at; at = &(*at)->next)
        if (*at == p) {
            *at = p->next;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}

int fa_cuda_standard_owns(const void *plan_impl) {
    if (!plan_impl) return 0;
    pthread_mutex_lock(&registry_lock);
    int found = 0;
    for (const fa_cuda_std_plan *q = registry; q && !found; q = q->next) found = (const void *)q == plan_impl;
    pthread_mutex_unlock(&registry_lock);
    return found;
}

/* Test hooks. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t hook_chunk_bytes;
static int hook_force_pack;

void fa_cuda_standard_set_chunk_limit(size_t bytes) {
    pthread_mutex_lock(&hook_lock);
    hook_chunk_bytes = bytes;
    pthread_mutex_unlock(&hook_lock);
}

void fa_cuda_standard_set_force_pack(int on) {
    pthread_mutex_lock(&hook_lock);
    hook_force_pack = on != 0;
    pthread_mutex_unlock(&hook_lock);
}

int fa_cuda_standard_chunk_count(const void *plan_impl) {
    return plan_impl ? ((const fa_cuda_std_plan *)plan_impl)->chunk_count : 0;
}

fa_status fa_cuda_standard_device_bytes(const void *plan_impl, size_t *bytes) {
    if (!plan_impl || !bytes) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !plan_impl ? "plan_impl" : "bytes");
    *bytes = ((const fa_cuda_std_plan *)plan_impl)->device_bytes;
    return FA_SUCCESS;
}

/* Zero-sized allocations are errors: every one takes 256 bytes at least. */
static size_t alloc_size(size_t bytes) { return bytes < 256 ? 256 : bytes; }

/* Frees what device_alloc(bytes) allocated. */
static void device_free(fa_cuda_std_plan *p, CUdeviceptr *ptr, size_t bytes) {
    if (!*ptr) return;
    (void)cu()->cuMemFree_v2(*ptr);
    *ptr = 0;
    p->device_bytes -= alloc_size(bytes);
}

/* Device memory, filled from host when host is not NULL. */
static fa_status device_alloc(fa_cuda_std_plan *p, size_t bytes, const void *host, const char *what,
                              CUdeviceptr *out) {
    const size_t size = alloc_size(bytes);
    CUresult r = cu()->cuMemAlloc_v2(out, size);
    if (r != CUDA_SUCCESS) {
        *out = 0;
        char text[192];
        snprintf(text, sizeof text, "standard attention: cuMemAlloc(%zu bytes of %s)", size, what);
        return fa_cuda_error(r, text);
    }
    p->device_bytes += size;
    if (host && bytes > 0) {
        r = cu()->cuMemcpyHtoDAsync_v2(*out, host, bytes, p->ctx->stream);
        if (r == CUDA_SUCCESS) r = cu()->cuStreamSynchronize(p->ctx->stream);
        if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuMemcpyHtoD (standard-attention plan data)");
    }
    return FA_SUCCESS;
}

static void free_matrix(fa_cuda_std_plan *p, int m) {
    for (int c = 0; c < p->chunk_count; c++) device_free(p, &p->chunks[c].mat[m], p->chunks[c].bytes);
}

static fa_status alloc_matrix(fa_cuda_std_plan *p, int m) {
    for (int c = 0; c < p->chunk_count; c++) {
        std_chunk *ch = &p->chunks[c];
        if (ch->mat[m]) continue;
        char what[96];
        snprintf(what, sizeof what, "the score matrix %s, allocation %d of %d", matrix_names[m], c + 1,
                 p->chunk_count);
        FA_CHECK(device_alloc(p, ch->bytes, NULL, what, &ch->mat[m]));
    }
    return FA_SUCCESS;
}

void fa_cuda_standard_release(void *plan_impl) {
    fa_cuda_std_plan *p = plan_impl;
    if (!p) return;
    registry_remove(p);
    if (p->ctx && fa_cuda_push(p->ctx) == FA_SUCCESS) {
        /* Passes still queued may use the plan's memory. */
        (void)cu()->cuStreamSynchronize(p->ctx->stream);
        if (p->handle) (void)p->blas->destroy(p->handle);
        if (p->module) (void)cu()->cuModuleUnload(p->module);
        for (int m = 0; m < STD_MATRICES; m++) free_matrix(p, m);
        CUdeviceptr *small[] = {&p->d_pair_off, &p->d_cu_q, &p->d_cu_k, &p->d_block_mask, &p->packed[0],
                                &p->packed[1], &p->packed[2], &p->packed[3], &p->packed_grad[0],
                                &p->packed_grad[1], &p->packed_grad[2], &p->dvec, &p->dk_acc, &p->dv_acc};
        for (size_t i = 0; i < FA_ARRAY_SIZE(small); i++)
            if (*small[i]) (void)cu()->cuMemFree_v2(*small[i]);
        if (p->ev_start) (void)cu()->cuEventDestroy_v2(p->ev_start);
        if (p->ev_stop) (void)cu()->cuEventDestroy_v2(p->ev_stop);
        fa_cuda_pop();
    }
    free(p->chunks);
    free(p->pair_chunk);
    free(p->pair_off);
    free(p);
}

/* ------------------------------------------------------------------------ */
/* Compiling kernels_cuda/standard.cu (cuda_compile.c)                       */

#define STD_SOURCE "kernels_cuda/standard.cu"
#define STD_DEFINES_SIZE 256

static const char *const std_headers[] = {"kernels_cuda/dtype.cuh", "kernels_cuda/common.cuh"};

_Static_assert(K_COUNT <= FA_CUDA_MAX_KERNELS, "standard.cu has more kernels than a compile reports");

/* The program's options: the dtype and the descriptor's options; nothing
 * depends on the head dimension. */
static void std_defines(const fa_attention_desc *d, char *out, size_t size) {
    const int window = fa_desc_has_window(d);
    snprintf(out, size, "%s%s%s%s%s%s", fa_dtype_build_option(d->q.dtype), d->causal ? " -DCAUSAL" : "",
             window ? " -DWINDOW" : "", d->block_mask ? " -DBLOCK_MASK" : "", d->dropout_p > 0.0f ? " -DDROPOUT" : "",
             d->cu_seqlens_q ? " -DVARLEN" : "");
}

/* lookup: try the kernel cache first (plan creation does). */
static fa_status std_compile(const fa_attention_desc *d, int major, int minor, int lookup, fa_cuda_binary *out) {
    char defines[STD_DEFINES_SIZE];
    std_defines(d, defines, sizeof defines);
    const fa_cuda_program prog = {STD_SOURCE, std_headers, (int)FA_ARRAY_SIZE(std_headers), defines, kernel_names,
                                  K_COUNT, 0};
    return fa_cuda_compile(&prog, major, minor, lookup, out);
}

/* The arguments of the compile entry points that plan creation would have
 * checked (a device's compute capability is never out of range). */
static fa_status check_compile_args(const fa_attention_desc *desc, int cc_major, int cc_minor) {
    if (!desc) return fa_fail(FA_ERR_NULL_POINTER, "desc is NULL");
    if (desc->q.dtype != FA_DTYPE_F32 && desc->q.dtype != FA_DTYPE_F16 && desc->q.dtype != FA_DTYPE_BF16)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "desc->q.dtype = %d is not a fa_dtype", (int)desc->q.dtype);
    if (cc_major < 1 || cc_minor < 0 || cc_minor > 9)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "compute capability %d.%d", cc_major, cc_minor);
    return FA_SUCCESS;
}

fa_status fa_cuda_standard_compile(const fa_attention_desc *desc, int cc_major, int cc_minor, size_t *binary_bytes,
                                   int *real_code, char *log, size_t log_size) {
    FA_CHECK(check_compile_args(desc, cc_major, cc_minor));
    fa_cuda_binary bin;
    FA_CHECK(std_compile(desc, cc_major, cc_minor, 0, &bin));
    if (binary_bytes) *binary_bytes = bin.size;
    if (real_code) *real_code = bin.cubin;
    if (log && log_size) snprintf(log, log_size, "%s", bin.log);
    fa_cuda_binary_free(&bin);
    return FA_SUCCESS;
}

fa_status fa_cuda_standard_compile_kernels(const fa_attention_desc *desc, int cc_major, int cc_minor,
                                           fa_cuda_kernel_report *reports, int max_reports, int *count) {
    if (!count) return fa_fail(FA_ERR_NULL_POINTER, "count is NULL");
    *count = 0;
    FA_CHECK(check_compile_args(desc, cc_major, cc_minor));
    fa_cuda_binary bin;
    FA_CHECK(std_compile(desc, cc_major, cc_minor, 1, &bin));
    for (int i = 0; i < K_COUNT && i < max_reports && reports; i++) {
        fa_cuda_kernel_report *rep = &reports[i];
        *rep = bin.reports[i];
        /* std_rows packs and unpacks for both passes; it counts as forward. */
        rep->pass = i == K_SOFTMAX || i == K_ROWS ? FA_PASS_FORWARD : FA_PASS_BACKWARD;
        rep->threads = STD_THREADS;
        rep->shared_bytes = 0;
        rep->tensor_cores = 0;
    }
    *count = K_COUNT;
    fa_cuda_binary_free(&bin);
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Plan creation                                                             */

static std_layout resolve_layout(const fa_attention_desc *d, fa_tensor_role role) {
    const fa_layout r = fa_desc_layout(d, role);
    std_layout l = {r.offset, r.stride_batch, r.stride_seq, r.stride_head};
    return l;
}

static std_layout packed_layout(int heads, int seqlen, int dim) {
    std_layout l;
    l.off = 0;
    l.sh = dim;
    l.ss = (int64_t)heads * dim;
    l.sb = (int64_t)seqlen * l.ss;
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

/* A score row: len_k elements rounded up to 16 bytes (STD_ALIGN in
 * standard.cu). */
static int64_t score_ld(const fa_cuda_std_plan *p, int sk) {
    const int64_t align = (int64_t)(16 / p->esize);
    return ((int64_t)sk + align - 1) / align * align;
}

/* A tensor's leading dimension: its token stride. A tensor with a single
 * token per sequence may carry any stride there (the descriptor allows it),
 * cuBLAS wants one at least as wide as a row; with one row it is never
 * stepped over. */
static int64_t tensor_ld(const fa_cuda_std_plan *p, const std_layout *l) { return l->ss >= p->dim ? l->ss : p->dim; }

/* Places the (sequence, head) blocks of a score matrix in chunks. */
static fa_status layout_scores(fa_cuda_std_plan *p, const fa_plan_s *plan) {
    const fa_device_desc *dd = &plan->ctx->info.desc;
    pthread_mutex_lock(&hook_lock);
    const size_t cap_bytes = hook_chunk_bytes ? hook_chunk_bytes : FA_STD_CHUNK_BYTES;
    pthread_mutex_unlock(&hook_lock);
    const double cap = (double)cap_bytes / (double)p->esize;

    double total = 0.0;
    for (int b = 0; b < p->batch; b++) {
        int sq, sk;
        seq_lengths(plan, b, &sq, &sk);
        if (score_ld(p, sk) > INT_MAX)
            return fa_fail(FA_ERR_UNSUPPORTED, "standard attention: a score row of %d keys is beyond cuBLAS's 32-bit "
                           "leading dimension", sk);
        total += (double)p->heads_q * (double)sq * (double)score_ld(p, sk);
    }
    p->score_elems = total;
    const double need = 2.0 * total * (double)p->esize;
    if (dd->global_mem_bytes > 0 && need > (double)dd->global_mem_bytes)
        return fa_fail(FA_ERR_OUT_OF_MEMORY,
                       "standard attention needs %.0f bytes for the score matrices S and P (heads_q x seqlen_q x "
                       "seqlen_k elements of %s each), more than the %zu bytes of global memory of %s",
                       need, fa_dtype_name(p->dtype), dd->global_mem_bytes, dd->name);

    if ((double)p->batch * (double)p->heads_q > (double)INT_MAX)
        return fa_fail(FA_ERR_UNSUPPORTED, "standard attention: batch x heads_q = %.0f score blocks",
                       (double)p->batch * (double)p->heads_q);
    p->pairs = p->batch * p->heads_q;
    p->pair_chunk = malloc((size_t)p->pairs * sizeof *p->pair_chunk);
    p->pair_off = malloc((size_t)p->pairs * sizeof *p->pair_off);
    if (!p->pair_chunk || !p->pair_off)
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for the offsets of %d score blocks", p->pairs);
    int capacity = 0;
    double used = 0.0;
    for (int b = 0; b < p->batch; b++) {
        int sq, sk;
        seq_lengths(plan, b, &sq, &sk);
        const double block = (double)sq * (double)score_ld(p, sk);
        for (int h = 0; h < p->heads_q; h++) {
            const int pair = b * p->heads_q + h;
            if (p->chunk_count == 0 || (used > 0.0 && used + block > cap)) {
                if (p->chunk_count == capacity) {
                    const int grown = capacity ? 2 * capacity : 4;
                    std_chunk *more = realloc(p->chunks, (size_t)grown * sizeof *more);
                    if (!more) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %d score chunks", grown);
                    p->chunks = more;
                    capacity = grown;
                }
                if (p->chunk_count > 0) p->chunks[p->chunk_count - 1].pair1 = pair;
                std_chunk *fresh = &p->chunks[p->chunk_count++];
                memset(fresh, 0, sizeof *fresh);
                fresh->pair0 = pair;
                fresh->pair1 = p->pairs;
                used = 0.0;
            }
            std_chunk *ch = &p->chunks[p->chunk_count - 1];
            p->pair_chunk[pair] = p->chunk_count - 1;
            p->pair_off[pair] = (int64_t)used;
            used += block;
            ch->bytes = (size_t)used * p->esize;
            if (sq > ch->max_q) ch->max_q = sq;
        }
    }
    return FA_SUCCESS;
}

static size_t tensor_bytes(const fa_cuda_std_plan *p, int query_side, size_t esize) {
    return query_side ? (size_t)p->total_q * (size_t)p->heads_q * (size_t)p->dim * esize
                      : (size_t)p->total_k * (size_t)p->heads_kv * (size_t)p->dim * esize;
}

static fa_status load_module(fa_cuda_std_plan *p, const fa_attention_desc *d) {
    fa_cuda_binary bin;
    FA_CHECK(std_compile(d, p->ctx->cc_major, p->ctx->cc_minor, 1, &bin));
    CUresult r = cu()->cuModuleLoadData(&p->module, bin.data);
    fa_cuda_binary_free(&bin);
    if (r != CUDA_SUCCESS) {
        p->module = NULL;
        return fa_cuda_error(r, "cuModuleLoadData(" STD_SOURCE ")");
    }
    for (int i = 0; i < K_COUNT; i++) {
        r = cu()->cuModuleGetFunction(&p->fn[i], p->module, kernel_names[i]);
        if (r != CUDA_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "cuModuleGetFunction(%s)", kernel_names[i]);
            return fa_cuda_error(r, what);
        }
    }
    return FA_SUCCESS;
}

static fa_status prepare_inner(fa_cuda_std_plan *p, const fa_plan_s *plan) {
    const fa_attention_desc *d = &plan->desc;
    for (int r = 0; r < 4; r++) p->lay[r] = resolve_layout(d, (fa_tensor_role)r);
    p->packed_q = packed_layout(p->heads_q, p->seqlen_q, p->dim);
    p->packed_k = packed_layout(p->heads_kv, p->seqlen_k, p->dim);
    pthread_mutex_lock(&hook_lock);
    const int force = hook_force_pack;
    pthread_mutex_unlock(&hook_lock);
    for (int r = 0; r < 4; r++) p->pack[r] = force || tensor_ld(p, &p->lay[r]) > INT_MAX;
    if (p->packed_q.ss > INT_MAX || p->packed_k.ss > INT_MAX)
        return fa_fail(FA_ERR_UNSUPPORTED, "standard attention: heads x head_dim = %lld elements per token is beyond "
                       "cuBLAS's 32-bit leading dimension", (long long)p->packed_q.ss);
    FA_CHECK(layout_scores(p, plan));

    std_params *b = &p->base;
    memset(b, 0, sizeof *b);
    b->total_q = p->total_q;
    b->seqlen_q = p->seqlen_q;
    b->seqlen_k = p->seqlen_k;
    b->heads_q = p->heads_q;
    b->window_left = d->window_left;
    b->window_right = d->window_right;
    b->block_q = d->block_mask ? d->block_q : 1;
    b->block_k = d->block_mask ? d->block_k : 1;
    b->block_cols = fa_block_cols(d);
    b->dim = p->dim;
    b->drop_threshold = plan->dropout_threshold;
    b->drop_scale = d->dropout_p > 0.0f ? (float)(1.0 / (1.0 - (double)d->dropout_p)) : 1.0f;

    /* The score matrices first: at the sizes where standard attention runs
     * out of memory they are what does not fit. */
    FA_CHECK(alloc_matrix(p, STD_S));
    FA_CHECK(alloc_matrix(p, STD_P));
    FA_CHECK(device_alloc(p, (size_t)p->pairs * sizeof(int64_t), p->pair_off, "the score offsets", &p->d_pair_off));
    if (plan->cu_seqlens_q) {
        const size_t bytes = ((size_t)p->batch + 1) * sizeof(int32_t);
        FA_CHECK(device_alloc(p, bytes, plan->cu_seqlens_q, "cu_seqlens_q", &p->d_cu_q));
        FA_CHECK(device_alloc(p, bytes, plan->cu_seqlens_k, "cu_seqlens_k", &p->d_cu_k));
    }
    if (plan->block_mask)
        FA_CHECK(device_alloc(p, d->block_mask_bytes, plan->block_mask, "the block mask", &p->d_block_mask));
    for (int r = 0; r < 4; r++)
        if (p->pack[r]) {
            const int query_side = r == ROLE_Q || r == ROLE_O;
            static const char *const what[4] = {"the packed copy of Q", "the packed copy of K", "the packed copy of V",
                                                "the packed copy of O and dO"};
            FA_CHECK(device_alloc(p, tensor_bytes(p, query_side, p->esize), NULL, what[r], &p->packed[r]));
        }
    b->pair_off = p->d_pair_off;
    b->cu_q = p->d_cu_q;
    b->cu_k = p->d_cu_k;
    b->block_mask = p->d_block_mask;

    int s = p->blas->create(&p->handle);
    if (s != FA_CUBLAS_STATUS_SUCCESS) {
        p->handle = NULL;
        return blas_error(s, "cublasCreate");
    }
    /* Sums of a product stay in fp32 up to the one rounding of the result,
     * also where cuBLAS splits the inner dimension. */
    s = p->blas->set_math_mode(p->handle, FA_CUBLAS_DEFAULT_MATH | FA_CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    if (s != FA_CUBLAS_STATUS_SUCCESS) return blas_error(s, "cublasSetMathMode");

    FA_CHECK(load_module(p, d));
    CUresult r = cu()->cuEventCreate(&p->ev_start, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = cu()->cuEventCreate(&p->ev_stop, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuEventCreate");
    return FA_SUCCESS;
}

fa_status fa_cuda_standard_prepare(struct fa_cuda_context *ctx, const fa_plan_s *plan, void **plan_impl) {
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
    const std_blas *blas = NULL;
    FA_CHECK(blas_load(&blas));

    fa_cuda_std_plan *p = calloc(1, sizeof *p);
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a CUDA standard-attention plan");
    p->ctx = ctx;
    p->blas = blas;
    p->batch = d->batch;
    p->seqlen_q = d->seqlen_q;
    p->seqlen_k = d->seqlen_k;
    p->heads_q = d->heads_q;
    p->heads_kv = d->heads_kv;
    p->group = d->heads_q / d->heads_kv;
    p->dim = d->head_dim;
    p->total_q = plan->total_q;
    p->total_k = plan->total_k;
    p->dtype = d->q.dtype;
    p->esize = fa_dtype_size(d->q.dtype);
    p->data_type = p->dtype == FA_DTYPE_F16 ? FA_CUDA_R_16F : p->dtype == FA_DTYPE_BF16 ? FA_CUDA_R_16BF : FA_CUDA_R_32F;
    p->compute_type =
        p->dtype == FA_DTYPE_F32 && d->allow_tf32 ? FA_CUBLAS_COMPUTE_32F_FAST_TF32 : FA_CUBLAS_COMPUTE_32F;
    p->scale = plan->scale;
    p->acc = p->dtype != FA_DTYPE_F32 && p->group > 1;

    fa_status st = fa_cuda_push(ctx);
    if (st != FA_SUCCESS) {
        free(p);
        return st;
    }
    st = prepare_inner(p, plan);
    fa_cuda_pop();
    if (st != FA_SUCCESS) {
        fa_cuda_standard_release(p);
        return st;
    }
    registry_add(p);
    *plan_impl = p;
    return FA_SUCCESS;
}

/* The backward pass's memory, on its first run: a forward-only user never
 * pays for it. On failure nothing of it is kept. */
static fa_status ensure_backward(fa_cuda_std_plan *p, const fa_plan_s *plan) {
    if (p->backward_ready) return FA_SUCCESS;
    const fa_device_desc *dd = &plan->ctx->info.desc;
    const double need = 4.0 * p->score_elems * (double)p->esize + 4.0 * (double)p->heads_q * (double)p->total_q;
    if (dd->global_mem_bytes > 0 && need > (double)dd->global_mem_bytes)
        return fa_fail(FA_ERR_OUT_OF_MEMORY,
                       "the standard-attention backward pass needs %.0f bytes for S, P, dP, dS and D, more than the "
                       "%zu bytes of global memory of %s",
                       need, dd->global_mem_bytes, dd->name);
    fa_status st = alloc_matrix(p, STD_DP);
    if (st == FA_SUCCESS) st = alloc_matrix(p, STD_DS);
    p->dvec_bytes = (size_t)p->heads_q * (size_t)p->total_q * sizeof(float);
    if (st == FA_SUCCESS) st = device_alloc(p, p->dvec_bytes, NULL, "the row sums D = rowsum(dO * O)", &p->dvec);
    static const char *const grad_names[3] = {"the packed dQ", "the packed dK", "the packed dV"};
    for (int r = 0; r < 3 && st == FA_SUCCESS; r++) {
        p->packed_grad_bytes[r] = tensor_bytes(p, r == ROLE_Q, p->esize);
        if (p->pack[r] && !(r != ROLE_Q && p->acc))
            st = device_alloc(p, p->packed_grad_bytes[r], NULL, grad_names[r], &p->packed_grad[r]);
    }
    p->acc_bytes = tensor_bytes(p, 0, sizeof(float));
    if (st == FA_SUCCESS && p->acc) {
        st = device_alloc(p, p->acc_bytes, NULL, "the fp32 sum of dK over a group", &p->dk_acc);
        if (st == FA_SUCCESS) st = device_alloc(p, p->acc_bytes, NULL, "the fp32 sum of dV over a group", &p->dv_acc);
    }
    if (st != FA_SUCCESS) {
        free_matrix(p, STD_DP);
        free_matrix(p, STD_DS);
        device_free(p, &p->dvec, p->dvec_bytes);
        for (int r = 0; r < 3; r++) device_free(p, &p->packed_grad[r], p->packed_grad_bytes[r]);
        device_free(p, &p->dk_acc, p->acc_bytes);
        device_free(p, &p->dv_acc, p->acc_bytes);
        return st;
    }
    p->backward_ready = 1;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Kernel launches                                                           */

static fa_status launch(fa_cuda_std_plan *p, int kernel, unsigned gx, unsigned gy, const std_params *prm) {
    if (gx == 0 || gy == 0) return FA_SUCCESS;
    void *args[] = {(void *)prm};
    CUresult r = cu()->cuLaunchKernel(p->fn[kernel], gx, gy, 1, STD_THREADS, 1, 1, 0, p->ctx->stream, args, NULL);
    if (r != CUDA_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "cuLaunchKernel(%s, grid %u x %u, %d threads)", kernel_names[kernel], gx, gy,
                 STD_THREADS);
        return fa_cuda_error(r, what);
    }
    return FA_SUCCESS;
}

/* A row kernel over rows rows, a warp each. */
static fa_status launch_rows(fa_cuda_std_plan *p, int kernel, std_params *prm, int64_t rows) {
    if (rows <= 0) return FA_SUCCESS;
    const int64_t blocks = (rows + STD_WARPS - 1) / STD_WARPS;
    if (blocks > INT_MAX)
        return fa_fail(FA_ERR_UNSUPPORTED, "standard attention: %lld rows in one launch of %s", (long long)rows,
                       kernel_names[kernel]);
    prm->rows = rows;
    return launch(p, kernel, (unsigned)blocks, 1, prm);
}

/* Tokens [tok0, tok0 + ntok) of a tensor (all heads) through std_rows. */
static fa_status rows_kernel(fa_cuda_std_plan *p, int mode, CUdeviceptr src, const std_layout *sl, CUdeviceptr dst,
                             const std_layout *dl, int query_side, int64_t tok0, int64_t ntok) {
    std_params prm = p->base;
    prm.mode = mode;
    prm.src = src;
    prm.src_off = sl->off;
    prm.src_sb = sl->sb;
    prm.src_ss = sl->ss;
    prm.src_sh = sl->sh;
    prm.dst = dst;
    prm.dst_off = dl->off;
    prm.dst_sb = dl->sb;
    prm.dst_ss = dl->ss;
    prm.dst_sh = dl->sh;
    prm.heads = query_side ? p->heads_q : p->heads_kv;
    prm.seqlen = query_side ? p->seqlen_q : p->seqlen_k;
    prm.tok0 = tok0;
    return launch_rows(p, K_ROWS, &prm, ntok * prm.heads);
}

/* Zeroes the rows of sequences whose other side is empty (varlen only:
 * fixed lengths are at least 1): no product writes them. query_side: rows
 * of a query-side tensor (O, dQ) of sequences without keys, else rows of a
 * key-side one (dK, dV) of sequences without queries. */
static fa_status zero_empty_rows(fa_cuda_std_plan *p, const fa_plan_s *plan, CUdeviceptr dst, const std_layout *l,
                                 int query_side) {
    if (!plan->cu_seqlens_q) return FA_SUCCESS;
    for (int b = 0; b < p->batch; b++) {
        int sq, sk;
        seq_lengths(plan, b, &sq, &sk);
        const int len = query_side ? sq : sk, other = query_side ? sk : sq;
        if (len == 0 || other != 0) continue;
        const int32_t *cu_seq = query_side ? plan->cu_seqlens_q : plan->cu_seqlens_k;
        FA_CHECK(rows_kernel(p, ROWS_ZERO, dst, l, dst, l, query_side, cu_seq[b], len));
    }
    return FA_SUCCESS;
}

/* A score kernel over every chunk: one block per (query row, pair). */
static fa_status score_kernel(fa_cuda_std_plan *p, int kernel, CUdeviceptr lse) {
    for (int c = 0; c < p->chunk_count; c++) {
        const std_chunk *ch = &p->chunks[c];
        if (ch->max_q == 0) continue;
        std_params prm = p->base;
        prm.s = ch->mat[STD_S];
        prm.p = ch->mat[STD_P];
        prm.dp = ch->mat[STD_DP];
        prm.ds = ch->mat[STD_DS];
        prm.lse = lse;
        prm.dvec = p->dvec;
        for (int pair = ch->pair0; pair < ch->pair1; pair += STD_MAX_BATCH) {
            const int n = ch->pair1 - pair < STD_MAX_BATCH ? ch->pair1 - pair : STD_MAX_BATCH;
            prm.pair0 = pair;
            FA_CHECK(launch(p, kernel, (unsigned)ch->max_q, (unsigned)n, &prm));
        }
    }
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Batched products                                                          */

typedef enum std_side { SIDE_Q = 0, SIDE_K = 1, SIDE_SCORE = 2 } std_side;
typedef enum std_extent { EXT_Q = 0, EXT_K = 1, EXT_D = 2 } std_extent;

/* An operand of the products: a query-side tensor (Q, O, dO, dQ: the
 * query head picks its matrix), a key-side one (K, V, dK, dV: the kv head),
 * or a score matrix (the pair's block). */
typedef struct std_operand {
    std_side side;
    int matrix;          /* SIDE_SCORE: STD_S .. STD_DS */
    CUdeviceptr base;
    std_layout l;
    size_t esize;
    int type;            /* CUDA_R_* */
    int ld;
} std_operand;

static std_operand tensor_operand(const fa_cuda_std_plan *p, std_side side, CUdeviceptr base, const std_layout *l,
                                  int fp32) {
    std_operand o;
    memset(&o, 0, sizeof o);
    o.side = side;
    o.base = base;
    o.l = *l;
    o.esize = fp32 ? sizeof(float) : p->esize;
    o.type = fp32 ? FA_CUDA_R_32F : p->data_type;
    o.ld = (int)tensor_ld(p, l); /* at most INT_MAX: wider ones are packed */
    return o;
}

static std_operand score_operand(const fa_cuda_std_plan *p, int matrix) {
    std_operand o;
    memset(&o, 0, sizeof o);
    o.side = SIDE_SCORE;
    o.matrix = matrix;
    o.esize = p->esize;
    o.type = p->data_type;
    return o;
}

/* Address of the matrix of sequence b, query head h, kv head hk. */
static CUdeviceptr operand_address(const fa_cuda_std_plan *p, const fa_plan_s *plan, const std_operand *o, int b,
                                   int h, int hk) {
    if (o->side == SIDE_SCORE) {
        const int pair = b * p->heads_q + h;
        return p->chunks[p->pair_chunk[pair]].mat[o->matrix] + (CUdeviceptr)p->pair_off[pair] * p->esize;
    }
    const int32_t *cu_seq = o->side == SIDE_Q ? plan->cu_seqlens_q : plan->cu_seqlens_k;
    const int64_t seq = cu_seq ? (int64_t)cu_seq[b] * o->l.ss : (int64_t)b * o->l.sb;
    const int64_t e = o->l.off + seq + (int64_t)(o->side == SIDE_Q ? h : hk) * o->l.sh;
    return o->base + (CUdeviceptr)e * o->esize;
}

static int operand_ld(const fa_cuda_std_plan *p, const std_operand *o, int sk) {
    return o->side == SIDE_SCORE ? (int)score_ld(p, sk) : o->ld;
}

static int extent_of(const fa_cuda_std_plan *p, std_extent e, int sq, int sk) {
    return e == EXT_Q ? sq : e == EXT_K ? sk : p->dim;
}

/* Row-major C (m x n) = alpha op(A) op(B) (+ C for the later members of a
 * group when accumulate). */
typedef struct std_gemm {
    const char *what;
    int ta, tb;          /* FA_CUBLAS_OP_N or _T, of the row-major operands */
    std_extent m, n, k;
    float alpha;
    int accumulate;      /* C per kv head, summed over the group's query heads */
    const std_operand *a, *b, *c;
} std_gemm;

/* Matrices of one strided call: A, B, C at first + i * stride. */
typedef struct std_run {
    int count;
    CUdeviceptr first[3];
    long long stride[3];
    float beta;
    int m, n, k, ld[3];
} std_run;

static fa_status run_flush(fa_cuda_std_plan *p, const std_gemm *g, std_run *run) {
    if (run->count == 0) return FA_SUCCESS;
    const int count = run->count;
    run->count = 0;
    const float alpha = g->alpha, beta = run->beta;
    /* Column-major C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m): B first. */
    const int s = p->blas->gemm(p->handle, g->tb, g->ta, run->n, run->m, run->k, &alpha,
                                (const void *)(uintptr_t)run->first[1], g->b->type, run->ld[1], run->stride[1],
                                (const void *)(uintptr_t)run->first[0], g->a->type, run->ld[0], run->stride[0], &beta,
                                (void *)(uintptr_t)run->first[2], g->c->type, run->ld[2], run->stride[2], count,
                                p->compute_type, FA_CUBLAS_GEMM_DEFAULT);
    if (s != FA_CUBLAS_STATUS_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cublasGemmStridedBatchedEx (%s, %d x %d x %d, %d matrices)", g->what, run->m,
                 run->n, run->k, count);
        return blas_error(s, what);
    }
    return FA_SUCCESS;
}

/* Adds one matrix product to the run, or issues the run and starts another
 * when the shape, beta or the distances between operands differ. C never
 * repeats within a call (stride 0), A and B may. */
static fa_status run_add(fa_cuda_std_plan *p, const std_gemm *g, std_run *run, const CUdeviceptr addr[3],
                         float beta, int m, int n, int k, const int ld[3]) {
    if (run->count > 0) {
        int fits = run->count < STD_MAX_BATCH && run->beta == beta && run->m == m && run->n == n && run->k == k &&
                   run->ld[0] == ld[0] && run->ld[1] == ld[1] && run->ld[2] == ld[2];
        const std_operand *ops[3] = {g->a, g->b, g->c};
        if (fits && run->count == 1) {
            /* cuBLAS counts strides in elements. */
            long long st[3];
            for (int i = 0; i < 3; i++) {
                const long long bytes = (long long)addr[i] - (long long)run->first[i], es = (long long)ops[i]->esize;
                fits &= bytes % es == 0;
                st[i] = bytes / es;
            }
            fits &= st[2] != 0;
            if (fits) memcpy(run->stride, st, sizeof st);
        } else if (fits) {
            for (int i = 0; i < 3; i++)
                fits &= (long long)addr[i] ==
                        (long long)run->first[i] + (long long)run->count * run->stride[i] * (long long)ops[i]->esize;
        }
        if (!fits) FA_CHECK(run_flush(p, g, run));
    }
    if (run->count == 0) {
        for (int i = 0; i < 3; i++) {
            run->first[i] = addr[i];
            run->stride[i] = 0;
            run->ld[i] = ld[i];
        }
        run->beta = beta;
        run->m = m;
        run->n = n;
        run->k = k;
    }
    run->count++;
    return FA_SUCCESS;
}

/* One product over every (sequence, query head) pair whose sequence has
 * queries and keys, in as few strided calls as the layouts allow. With
 * accumulate, C belongs to the kv head: the members of its group run in
 * calls of their own, member 0 first with beta = 0, the others adding.
 * Else the query heads go in the order whose runs are longer: query head
 * order keeps K and V fixed over a group (runs of a group's length), kv
 * head order steps through the kv heads for one member (runs of heads_kv). */
static fa_status gemm(fa_cuda_std_plan *p, const fa_plan_s *plan, const std_gemm *g) {
    std_run run;
    memset(&run, 0, sizeof run);
    const int members = g->accumulate ? p->group : 1;
    const int heads = g->accumulate ? p->heads_kv : p->heads_q;
    const int query_order = p->group >= p->heads_kv;
    for (int member = 0; member < members; member++) {
        const float beta = g->accumulate && member > 0 ? 1.0f : 0.0f;
        for (int b = 0; b < p->batch; b++) {
            int sq, sk;
            seq_lengths(plan, b, &sq, &sk);
            if (sq == 0 || sk == 0) continue;
            const int m = extent_of(p, g->m, sq, sk), n = extent_of(p, g->n, sq, sk), k = extent_of(p, g->k, sq, sk);
            const int ld[3] = {operand_ld(p, g->a, sk), operand_ld(p, g->b, sk), operand_ld(p, g->c, sk)};
            for (int t = 0; t < heads; t++) {
                int h, hk;
                if (g->accumulate) {
                    hk = t;
                    h = hk * p->group + member;
                } else if (query_order) {
                    h = t;
                    hk = h / p->group;
                } else {
                    hk = t % p->heads_kv;
                    h = hk * p->group + t / p->heads_kv;
                }
                const CUdeviceptr addr[3] = {operand_address(p, plan, g->a, b, h, hk),
                                             operand_address(p, plan, g->b, b, h, hk),
                                             operand_address(p, plan, g->c, b, h, hk)};
                FA_CHECK(run_add(p, g, &run, addr, beta, m, n, k, ld));
            }
        }
        /* A member's sums must be complete before the next adds to them. */
        FA_CHECK(run_flush(p, g, &run));
    }
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Passes                                                                    */

static fa_status buffer_ptr(void *buf, const char *name, CUdeviceptr *out) {
    const fa_cuda_buffer *b = buf;
    if (!b) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", name);
    if (b->ptr % 16)
        return fa_fail(FA_ERR_MISALIGNED, "%s: device address 0x%llx is not 16-byte aligned", name,
                       (unsigned long long)b->ptr);
    *out = b->ptr;
    return FA_SUCCESS;
}

static fa_status record(fa_cuda_std_plan *p, CUevent ev) {
    CUresult r = cu()->cuEventRecord(ev, p->ctx->stream);
    return r == CUDA_SUCCESS ? FA_SUCCESS : fa_cuda_error(r, "cuEventRecord");
}

/* What may change between passes: the stream in use (the caller's may
 * replace the context's), the dropout seed and origin. Then the start
 * event. */
static fa_status begin_pass(fa_cuda_std_plan *p, const fa_plan_s *plan) {
    int s = p->blas->set_stream(p->handle, p->ctx->stream);
    if (s != FA_CUBLAS_STATUS_SUCCESS) return blas_error(s, "cublasSetStream");
    p->base.drop_key0 = plan->dropout_key.key0;
    p->base.drop_key1 = plan->dropout_key.key1;
    p->base.drop_offset_lo = plan->dropout_key.offset_lo;
    p->base.drop_row0 = (uint32_t)plan->drop_row0;
    p->base.drop_col0 = (uint32_t)plan->drop_col0;
    p->timed = 0;
    return record(p, p->ev_start);
}

/* An input tensor as the products read it: in place, or copied to its
 * packed form first. */
static fa_status input_operand(fa_cuda_std_plan *p, int role, CUdeviceptr user, std_operand *out) {
    const int query_side = role == ROLE_Q || role == ROLE_O;
    const std_side side = query_side ? SIDE_Q : SIDE_K;
    if (!p->pack[role]) {
        *out = tensor_operand(p, side, user, &p->lay[role], 0);
        return FA_SUCCESS;
    }
    const std_layout *pl = query_side ? &p->packed_q : &p->packed_k;
    FA_CHECK(rows_kernel(p, ROWS_COPY, user, &p->lay[role], p->packed[role], pl, query_side, 0,
                         query_side ? p->total_q : p->total_k));
    *out = tensor_operand(p, side, p->packed[role], pl, 0);
    return FA_SUCCESS;
}

static fa_status forward_inner(fa_cuda_std_plan *p, const fa_plan_s *plan, const fa_fwd_args *args) {
    CUdeviceptr uq = 0, uk = 0, uv = 0, uo = 0, ul = 0;
    FA_CHECK(buffer_ptr(args->q, "q", &uq));
    FA_CHECK(buffer_ptr(args->k, "k", &uk));
    FA_CHECK(buffer_ptr(args->v, "v", &uv));
    FA_CHECK(buffer_ptr(args->o, "o", &uo));
    FA_CHECK(buffer_ptr(args->lse, "lse", &ul));
    FA_CHECK(begin_pass(p, plan));

    std_operand q, k, v;
    FA_CHECK(input_operand(p, ROLE_Q, uq, &q));
    FA_CHECK(input_operand(p, ROLE_K, uk, &k));
    FA_CHECK(input_operand(p, ROLE_V, uv, &v));
    const std_operand o = p->pack[ROLE_O] ? tensor_operand(p, SIDE_Q, p->packed[ROLE_O], &p->packed_q, 0)
                                          : tensor_operand(p, SIDE_Q, uo, &p->lay[ROLE_O], 0);
    const std_operand s = score_operand(p, STD_S), pm = score_operand(p, STD_P);

    const std_gemm qk = {"S = scale Q K^T", FA_CUBLAS_OP_N, FA_CUBLAS_OP_T, EXT_Q, EXT_K, EXT_D, p->scale, 0,
                         &q, &k, &s};
    FA_CHECK(gemm(p, plan, &qk));
    FA_CHECK(score_kernel(p, K_SOFTMAX, ul));
    const std_gemm pv = {"O = P V", FA_CUBLAS_OP_N, FA_CUBLAS_OP_N, EXT_Q, EXT_D, EXT_K, 1.0f, 0, &pm, &v, &o};
    FA_CHECK(gemm(p, plan, &pv));
    if (p->pack[ROLE_O])
        FA_CHECK(rows_kernel(p, ROWS_COPY, p->packed[ROLE_O], &p->packed_q, uo, &p->lay[ROLE_O], 1, 0, p->total_q));
    FA_CHECK(zero_empty_rows(p, plan, uo, &p->lay[ROLE_O], 1));

    FA_CHECK(record(p, p->ev_stop));
    p->timed = 1;
    return FA_SUCCESS;
}

fa_status fa_cuda_standard_forward(void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args) {
    fa_cuda_std_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    FA_CHECK(fa_cuda_push(p->ctx));
    fa_status st = forward_inner(p, plan, args);
    fa_cuda_pop();
    return st;
}

/* Where a gradient's product writes: the caller's tensor, its packed form,
 * or (dK, dV of fp16 / bf16 GQA) the fp32 sum over the group. */
static std_operand grad_operand(fa_cuda_std_plan *p, int role, CUdeviceptr user) {
    const int query_side = role == ROLE_Q;
    const std_side side = query_side ? SIDE_Q : SIDE_K;
    if (!query_side && p->acc)
        return tensor_operand(p, side, role == ROLE_K ? p->dk_acc : p->dv_acc, &p->packed_k, 1);
    if (p->pack[role]) return tensor_operand(p, side, p->packed_grad[role], query_side ? &p->packed_q : &p->packed_k, 0);
    return tensor_operand(p, side, user, &p->lay[role], 0);
}

/* The gradient into the caller's tensor, where it was computed elsewhere. */
static fa_status grad_finish(fa_cuda_std_plan *p, int role, const std_operand *computed, CUdeviceptr user) {
    const int query_side = role == ROLE_Q;
    const int64_t tokens = query_side ? p->total_q : p->total_k;
    if (!query_side && p->acc)
        return rows_kernel(p, ROWS_F32, computed->base, &computed->l, user, &p->lay[role], 0, 0, tokens);
    if (p->pack[role]) return rows_kernel(p, ROWS_COPY, computed->base, &computed->l, user, &p->lay[role], query_side, 0, tokens);
    return FA_SUCCESS;
}

static fa_status backward_inner(fa_cuda_std_plan *p, const fa_plan_s *plan, const fa_bwd_args *args) {
    CUdeviceptr uq = 0, uk = 0, uv = 0, uo = 0, ul = 0, udo = 0, udq = 0, udk = 0, udv = 0;
    FA_CHECK(buffer_ptr(args->q, "q", &uq));
    FA_CHECK(buffer_ptr(args->k, "k", &uk));
    FA_CHECK(buffer_ptr(args->v, "v", &uv));
    FA_CHECK(buffer_ptr(args->o, "o", &uo));
    FA_CHECK(buffer_ptr(args->lse, "lse", &ul));
    FA_CHECK(buffer_ptr(args->dout, "dout", &udo));
    FA_CHECK(buffer_ptr(args->dq, "dq", &udq));
    FA_CHECK(buffer_ptr(args->dk, "dk", &udk));
    FA_CHECK(buffer_ptr(args->dv, "dv", &udv));
    FA_CHECK(ensure_backward(p, plan));
    FA_CHECK(begin_pass(p, plan));

    /* D = rowsum(dO * O) from the caller's tensors, in their dtype. */
    std_params prm = p->base;
    prm.o = uo;
    prm.dout = udo;
    prm.o_off = p->lay[ROLE_O].off;
    prm.o_sb = p->lay[ROLE_O].sb;
    prm.o_ss = p->lay[ROLE_O].ss;
    prm.o_sh = p->lay[ROLE_O].sh;
    prm.dvec = p->dvec;
    FA_CHECK(launch_rows(p, K_ROWDOT, &prm, (int64_t)p->heads_q * p->total_q));

    std_operand q, k, v, dout;
    FA_CHECK(input_operand(p, ROLE_Q, uq, &q));
    FA_CHECK(input_operand(p, ROLE_K, uk, &k));
    FA_CHECK(input_operand(p, ROLE_V, uv, &v));
    FA_CHECK(input_operand(p, ROLE_O, udo, &dout));
    const std_operand dq = grad_operand(p, ROLE_Q, udq), dk = grad_operand(p, ROLE_K, udk),
                      dv = grad_operand(p, ROLE_V, udv);
    const std_operand s = score_operand(p, STD_S), pm = score_operand(p, STD_P), dp = score_operand(p, STD_DP),
                      ds = score_operand(p, STD_DS);

    const std_gemm qk = {"S = scale Q K^T", FA_CUBLAS_OP_N, FA_CUBLAS_OP_T, EXT_Q, EXT_K, EXT_D, p->scale, 0,
                         &q, &k, &s};
    FA_CHECK(gemm(p, plan, &qk));
    FA_CHECK(score_kernel(p, K_PROBS, ul));
    const std_gemm dov = {"dP = dO V^T", FA_CUBLAS_OP_N, FA_CUBLAS_OP_T, EXT_Q, EXT_K, EXT_D, 1.0f, 0,
                          &dout, &v, &dp};
    FA_CHECK(gemm(p, plan, &dov));
    FA_CHECK(score_kernel(p, K_DSCORES, 0));
    const std_gemm pdo = {"dV = P^T dO", FA_CUBLAS_OP_T, FA_CUBLAS_OP_N, EXT_K, EXT_D, EXT_Q, 1.0f, 1,
                          &pm, &dout, &dv};
    FA_CHECK(gemm(p, plan, &pdo));
    const std_gemm dsk = {"dQ = scale dS K", FA_CUBLAS_OP_N, FA_CUBLAS_OP_N, EXT_Q, EXT_D, EXT_K, p->scale, 0,
                          &ds, &k, &dq};
    FA_CHECK(gemm(p, plan, &dsk));
    const std_gemm dsq = {"dK = scale dS^T Q", FA_CUBLAS_OP_T, FA_CUBLAS_OP_N, EXT_K, EXT_D, EXT_Q, p->scale, 1,
                          &ds, &q, &dk};
    FA_CHECK(gemm(p, plan, &dsq));

    FA_CHECK(grad_finish(p, ROLE_Q, &dq, udq));
    FA_CHECK(grad_finish(p, ROLE_K, &dk, udk));
    FA_CHECK(grad_finish(p, ROLE_V, &dv, udv));
    FA_CHECK(zero_empty_rows(p, plan, udq, &p->lay[ROLE_Q], 1));
    FA_CHECK(zero_empty_rows(p, plan, udk, &p->lay[ROLE_K], 0));
    FA_CHECK(zero_empty_rows(p, plan, udv, &p->lay[ROLE_V], 0));

    FA_CHECK(record(p, p->ev_stop));
    p->timed = 1;
    return FA_SUCCESS;
}

fa_status fa_cuda_standard_backward(void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args) {
    fa_cuda_std_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    FA_CHECK(fa_cuda_push(p->ctx));
    fa_status st = backward_inner(p, plan, args);
    fa_cuda_pop();
    return st;
}

fa_status fa_cuda_standard_last_time_ms(void *plan_impl, double *ms) {
    fa_cuda_std_plan *p = plan_impl;
    if (!p || !ms) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "ms");
    *ms = 0.0;
    if (!p->timed) return fa_fail(FA_ERR_UNSUPPORTED, "no standard-attention pass has run on this plan");
    return fa_cuda_events_ms(p->ctx, p->ev_start, p->ev_stop, ms);
}
