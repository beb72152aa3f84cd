/*
 * flashattn: exact, fused attention (FlashAttention) across OpenCL, HIP and CUDA.
 *
 * One public header, C11. Handles are opaque; no vendor type appears in a
 * signature (native objects cross the boundary as void *).
 *
 * Thread safety
 * -------------
 * - fa_version, fa_status_string, fa_last_error, fa_device_count,
 *   fa_device_get_info, fa_backend_get_status, fa_attention_desc_init,
 *   fa_plan_for_device and fa_plan_info_format may be called from any thread
 *   at any time.
 * - fa_last_error is per thread: it describes the last failing call made by
 *   the calling thread.
 * - Objects (context, buffer, plan) of DIFFERENT contexts may be used from
 *   different threads concurrently.
 * - Calls that touch the SAME context, or a buffer or plan created from it,
 *   must be serialised by the caller (as with a cuBLAS handle or a
 *   cl_command_queue shared between threads).
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

/* FA_API marks the library's public functions: exported from the shared
 * library, which hides every other symbol. FLASHATTN_STATIC: define it when
 * linking the static archive on Windows (elsewhere it changes nothing). */
#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(FLASHATTN_STATIC)
#    define FA_API
#  elif defined(FA_BUILDING_LIBRARY)
#    define FA_API __declspec(dllexport)
#  else
#    define FA_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define FA_API __attribute__((visibility("default")))
#else
#  define FA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

typedef enum fa_status {
    FA_SUCCESS = 0,
    FA_ERR_NULL_POINTER,        /* a required pointer argument is NULL */
    FA_ERR_INVALID_SIZE,        /* a size is zero, negative or too large */
    FA_ERR_UNSUPPORTED_HEAD_DIM,/* head_dim not a multiple of 8 in [8, 256] */
    FA_ERR_HEADS_MISMATCH,      /* heads_q is not a multiple of heads_kv */
    FA_ERR_BAD_STRIDE,          /* strides overlap or are not representable */
    FA_ERR_OUT_OF_BOUNDS,       /* a tensor runs past the end of its buffer */
    FA_ERR_MISALIGNED,          /* offset or stride not 16-byte aligned */
    FA_ERR_FOREIGN_BUFFER,      /* a buffer belongs to another context */
    FA_ERR_DTYPE_MISMATCH,      /* tensors of one call disagree on dtype */
    FA_ERR_BAD_DROPOUT,         /* dropout p outside [0, 1) or not finite */
    FA_ERR_BAD_MASK,            /* block mask of the wrong size, bad window */
    FA_ERR_BAD_SCALE,           /* softmax scale not finite or not > 0 */
    FA_ERR_BAD_SEQLENS,         /* variable-length offsets not valid */
    FA_ERR_INVALID_ARGUMENT,    /* any other argument out of its domain */
    FA_ERR_BACKEND_UNAVAILABLE, /* runtime library missing or no devices */
    FA_ERR_DEVICE_NOT_FOUND,    /* no device with that backend and index */
    FA_ERR_OUT_OF_MEMORY,       /* host or device allocation failed */
    FA_ERR_COMPILE,             /* a kernel failed to compile (log attached) */
    FA_ERR_LAUNCH,              /* a kernel launch or device call failed */
    FA_ERR_UNSUPPORTED,         /* valid request this backend cannot run */
    FA_ERR_IO,                  /* file system error (kernel cache) */
    FA_ERR_INTERNAL,            /* a bug: please report it */
    FA_STATUS_COUNT
} fa_status;

/* A fixed, human-readable name for a status code; never NULL. */
FA_API const char *fa_status_string(fa_status status);

/* Details of the last failure on the calling thread (names the argument,
 * carries compiler logs and runtime messages); "" if none. The pointer stays
 * valid until the next failing call on the same thread. */
FA_API const char *fa_last_error(void);

/* For code built on the library (a transport of fa_transport,
 * libflashattn_mpi): record message as the calling thread's details of a
 * failure, as the library's own calls do, and return status. A transport
 * that fails a call this way has its message kept in the one the library
 * reports for the pass. */
FA_API fa_status fa_set_last_error(fa_status status, const char *message);

/* Library version as "MAJOR.MINOR.PATCH"; the numbers through the pointers
 * when they are not NULL. */
FA_API const char *fa_version(int *major, int *minor, int *patch);

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum fa_backend {
    FA_BACKEND_ANY = -1,      /* only as an argument: pick the best device */
    FA_BACKEND_REFERENCE = 0, /* the CPU reference (fp64), always present */
    FA_BACKEND_OPENCL = 1,
    FA_BACKEND_CUDA = 2,
    FA_BACKEND_HIP = 3,
    FA_BACKEND_COUNT = 4
} fa_backend;

FA_API const char *fa_backend_name(fa_backend backend);

/* Whether a backend was compiled in and its runtime could be loaded. On
 * failure the reason (e.g. "libcuda.so.1: cannot open shared object file")
 * is written to reason. Never fails because a runtime is missing: returns
 * FA_ERR_BACKEND_UNAVAILABLE with the reason instead. */
FA_API fa_status fa_backend_get_status(fa_backend backend, char *reason, size_t reason_size);

typedef enum fa_device_type {
    FA_DEVICE_CPU = 0,
    FA_DEVICE_GPU = 1,
    FA_DEVICE_ACCELERATOR = 2
} fa_device_type;

/* What the planner knows of a device. Filled from run-time queries by the
 * backends; can also be filled by hand to plan for a device that is not here. */
typedef struct fa_device_desc {
    char name[128];
    char vendor[64];
    char arch[32];              /* "sm_90", "gfx90a", "" if unknown */
    fa_backend backend;
    fa_device_type type;
    size_t local_mem_bytes;     /* usable local/shared memory per work-group */
    int max_work_group_size;
    int simd_width;             /* warp / wavefront / preferred sub-group */
    int compute_units;          /* SMs, CUs, Xe-cores, CPU cores */
    int clock_mhz;
    double bandwidth_gbs;       /* global memory, GB/s (read + write) */
    int bandwidth_measured;     /* 1: measured by a copy kernel; 0: queried */
    size_t global_mem_bytes;
    double fp32_flops_per_clock_cu;   /* vector FMA rate: 2 * lanes */
    double matrix_flops_per_clock_cu; /* fp16/bf16 matrix units; 0: none */
    int matrix_m, matrix_n, matrix_k; /* matrix-instruction shape; 0: none */
    size_t l2_cache_bytes;      /* last-level cache the compute units share; 0: unknown */
} fa_device_desc;

typedef struct fa_device_info {
    fa_backend backend;
    int index;                  /* index within its backend */
    char driver_version[64];
    fa_device_desc desc;
} fa_device_info;

/* Devices of every backend compiled in whose runtime loaded, in a stable
 * order (backend, then index). Backends that are unavailable contribute none
 * and do not make these calls fail. */
FA_API fa_status fa_device_count(int *count);
FA_API fa_status fa_device_get_info(int global_index, fa_device_info *info);

/* ------------------------------------------------------------------------ */
/* Contexts and buffers                                                     */
/* ------------------------------------------------------------------------ */

typedef struct fa_context_s *fa_context;
typedef struct fa_buffer_s *fa_buffer;

/* Object lifetimes
 * ----------------
 * Buffers and plans keep their context alive, as OpenCL and CUDA objects
 * do: fa_context_destroy drops the caller's reference, and the device
 * context is released when the last of its buffers and plans is freed or
 * destroyed. Contexts, buffers and plans may therefore be destroyed in any
 * order; a buffer or plan whose context the caller destroyed stays usable
 * (fa_forward, fa_buffer_download, ...) until it is freed itself. After
 * fa_context_destroy the context handle itself may not be passed to any
 * call.
 * Undefined (the caller's bug, as with free()): destroying or freeing a
 * handle twice, or using a handle after its own destroy or free. */

/* Open a context. backend = FA_BACKEND_ANY and index = -1 pick the best
 * device: a GPU before a CPU, CUDA before HIP before OpenCL, the reference
 * last. With a backend and index = -1, the best device of that backend.
 * Any other negative index is FA_ERR_INVALID_ARGUMENT. */
FA_API fa_status fa_context_create(fa_backend backend, int index, fa_context *ctx);
FA_API fa_status fa_context_get_info(fa_context ctx, fa_device_info *info);
/* Wait for all work queued on the context to finish (on the queue in use,
 * which is ordered after every queue the context used before). */
FA_API fa_status fa_context_synchronize(fa_context ctx);
/* Native objects: OpenCL: cl_context and cl_command_queue; CUDA: CUcontext
 * and CUstream; HIP: the device ordinal (as intptr_t) and hipStream_t. The
 * queue is the one in use: the context's own, or the caller's set with
 * fa_context_set_native_queue. The reference backend reports NULL for both.
 * Either pointer may be NULL. */
FA_API fa_status fa_context_get_native(fa_context ctx, void **native_context, void **native_queue);
/* Run the context's later work on a queue of the caller's, so that it is
 * ordered with the caller's own work on that queue without host waits (as
 * a cuBLAS handle takes cublasSetStream). NULL, or the context's own queue,
 * restores the context's own.
 * - OpenCL: a cl_command_queue whose CL_QUEUE_CONTEXT and CL_QUEUE_DEVICE
 *   are the context's (clGetCommandQueueInfo; else FA_ERR_INVALID_ARGUMENT)
 *   and that executes in order (an out-of-order queue is
 *   FA_ERR_UNSUPPORTED: the passes rely on order). The context retains it
 *   and releases it when it is replaced or the context goes.
 *   fa_plan_last_time_ms needs CL_QUEUE_PROFILING_ENABLE on it, and
 *   answers FA_ERR_UNSUPPORTED without.
 * - CUDA: a CUstream of the context's CUcontext (the device's primary
 *   context, which the runtime API and PyTorch share), checked with
 *   cuStreamGetCtx. The default streams are CU_STREAM_LEGACY (what
 *   cudaStream_t 0 and PyTorch's default stream mean) and
 *   CU_STREAM_PER_THREAD (then, at every call, the calling thread's):
 *   NULL cannot name them, as it restores the context's own
 *   (non-blocking) stream.
 * - HIP: a hipStream_t of the context's device (checked with
 *   hipStreamGetDevice where the runtime has it, ROCm 6 on); the null
 *   stream cannot be named, hipStreamPerThread can.
 * - Reference: NULL only; any other queue is FA_ERR_UNSUPPORTED.
 * Everything the context, its buffers and its plans do afterwards goes to
 * that queue: uploads and downloads (still synchronous for the host: they
 * wait for the queue, so for the caller's work queued before them),
 * kernels, workspace clears, the events fa_plan_last_time_ms reads, and
 * what fa_context_synchronize, fa_plan_destroy and fa_buffer_free wait
 * for. Switching makes the new queue wait, on the device, for
 * what the context queued on the previous one (no host wait), so passes
 * of one context never overlap: use a context per queue for concurrent
 * passes. Setting the queue in use again does nothing.
 * Lifetime: the library never destroys a queue it did not create. A CUDA
 * or HIP stream has no reference count: it must stay valid while the
 * context uses it (until replaced, or until the context, its last buffer
 * and plan are gone). Undefined, as with fa_buffer_wrap: a pointer that
 * is not a live queue of the backend's kind.
 * Thread safety: as every call on a context (see the top of this file). */
FA_API fa_status fa_context_set_native_queue(fa_context ctx, void *queue);
/* Drops the caller's reference (see "Object lifetimes" above). */
FA_API fa_status fa_context_destroy(fa_context ctx);

FA_API fa_status fa_buffer_alloc(fa_context ctx, size_t bytes, fa_buffer *buf);
/* Wrap memory owned by the caller (zero copy): a cl_mem, a CUdeviceptr cast
 * through uintptr_t to void *, a HIP device pointer, or host memory on the
 * reference device. The buffer does not free it.
 * Checked: native is not NULL and bytes not 0; OpenCL: the runtime accepts
 * native as a memory object (clGetMemObjectInfo), it belongs to the
 * context's cl_context (else FA_ERR_FOREIGN_BUFFER) and holds at least
 * bytes (else FA_ERR_OUT_OF_BOUNDS); CUDA and HIP: native lies in a device
 * allocation (cuMemGetAddressRange, hipMemGetAddressRange) with at least
 * bytes from it to the allocation's end.
 * The caller's contract (undefined otherwise, as the runtimes dereference
 * it): native is a live object of that kind (a pointer that is not a
 * cl_mem, or a released one, cannot be detected), on the reference device
 * a host pointer to at least bytes bytes, and it outlives the buffer. */
FA_API fa_status fa_buffer_wrap(fa_context ctx, void *native, size_t bytes, fa_buffer *buf);
FA_API fa_status fa_buffer_upload(fa_buffer buf, size_t offset, const void *src, size_t bytes);
FA_API fa_status fa_buffer_download(fa_buffer buf, size_t offset, void *dst, size_t bytes);
FA_API fa_status fa_buffer_size(fa_buffer buf, size_t *bytes);
FA_API fa_status fa_buffer_get_native(fa_buffer buf, void **native);
FA_API fa_status fa_buffer_free(fa_buffer buf);

/* ------------------------------------------------------------------------ */
/* Attention descriptor                                                     */
/* ------------------------------------------------------------------------ */

typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,
    FA_DTYPE_F16 = 1,
    FA_DTYPE_BF16 = 2,
    /* 8-bit float, OCP "E4M3FN": 1 sign bit, 4 exponent bits (bias 7), 3
     * mantissa bits; subnormals down to 2^-9, largest finite value 448, no
     * infinities, one NaN per sign (0x7f, 0xff). Storage of the forward's
     * inputs only (see the descriptor's rules under descale_q). Values
     * are converted to it with round to nearest even, saturating: a finite
     * value or an infinity beyond +-448 becomes +-448, a NaN stays NaN
     * (NVIDIA's cvt.rn.satfinite). */
    FA_DTYPE_FP8_E4M3 = 3
} fa_dtype;

FA_API size_t fa_dtype_size(fa_dtype dtype);
FA_API const char *fa_dtype_name(fa_dtype dtype);

/* Layout of one 4-D tensor [batch, seq, heads, head_dim] in a buffer.
 * Strides and offset count ELEMENTS of the tensor's dtype; head_dim is
 * contiguous. A stride of 0 means "packed" (the FlashAttention layout
 * [batch, seq, heads, head_dim]). Offsets and non-zero strides must be
 * multiples of 16 bytes, and the tensor's last byte (offset included) must
 * lie below 2^62 bytes from the buffer start (FA_ERR_BAD_STRIDE, or
 * FA_ERR_INVALID_SIZE where the sizes alone span more). With
 * variable-length batches, stride_batch is ignored: tokens of all
 * sequences are packed along seq. */
typedef struct fa_tensor_desc {
    fa_dtype dtype;
    int64_t offset;
    int64_t stride_batch;
    int64_t stride_seq;
    int64_t stride_head;
} fa_tensor_desc;

typedef enum fa_algorithm {
    FA_ALGO_FUSED = 0,    /* FlashAttention: tiled, N x N never in memory */
    FA_ALGO_STANDARD = 1  /* S and P materialised in global memory */
} fa_algorithm;

typedef struct fa_attention_desc {
    int batch;
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int heads_kv;               /* heads_q % heads_kv == 0 (MQA, GQA) */
    int head_dim;               /* multiple of 8, 8 .. 256 */

    /* Layouts. O, dO and dQ use q's dtype (except with fp8 inputs: see
     * descale_q below); dO and O use o's layout, dQ q's,
     * dK k's, dV v's. The log-sum-exp is fp32, packed
     * [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]). */
    fa_tensor_desc q, k, v, o;

    float softmax_scale;        /* 0: 1 / sqrt(head_dim) */

    /* Masks combine (a key is visible when every enabled mask allows it).
     * causal: key j is visible to query i iff j <= i + seqlen_k - seqlen_q
     * (bottom-right aligned). window: iff
     *   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
     * every negative bound (INT_MIN included) meaning unlimited on that
     * side. Any int is valid: a bound that cannot bind for the shape
     * (window_left >= seqlen_k - 1, window_right >= seqlen_q - 1) is
     * unlimited too, so INT_MAX is another way to say it. */
    int causal;                 /* 0 or 1 */
    int window_left;            /* -1: unlimited */
    int window_right;           /* -1: unlimited */

    /* Block-sparse: one byte per (block_q x block_k) block, row-major
     * [ceil(seqlen_q / block_q)][ceil(seqlen_k / block_k)], shared by all
     * batches and heads; 0 masks the block. Host memory, copied at plan
     * creation; NULL disables the mask. */
    const uint8_t *block_mask;
    size_t block_mask_bytes;
    int block_q;
    int block_k;

    /* Dropout on P with probability p; the mask is Philox4x32-10 of
     * (seed, offset, batch, head, row, column): see fa_dropout_keep. A
     * plan may change seed and offset later (fa_plan_set_dropout_seed). */
    float dropout_p;
    uint64_t dropout_seed;
    uint64_t dropout_offset;

    /* Variable-length batches (flash_attn_varlen): batch + 1 cumulative
     * token offsets for queries and keys, host memory, copied at plan
     * creation. seqlen_q / seqlen_k then give the longest sequence. NULL
     * for fixed-length batches. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;

    fa_algorithm algorithm;
    int deterministic;          /* 0 or 1: bit-identical results run to run */
    int allow_tf32;             /* 0 or 1: fp32 inputs may use TF32 matrix units */

    /* Score options (appended; zero leaves each off). For query i and key j
     * of a sequence of len_q queries and len_k keys (varlen: that
     * sequence's lengths), batch b, query head h, the logit is, in order:
     *   s  = softmax_scale * q_i . k_j
     *   s  = softcap * tanh(s / softcap)               if softcap > 0
     *   s += bias[b, h, i, j]                          if bias_batch > 0
     *   s -= alibi_slopes[h] * |i + len_k - len_q - j| if alibi_slopes
     * then the masks hide keys as above, and the softmax runs over the
     * visible ones. ALiBi is bottom-right aligned like the causal mask (the
     * last query is at distance 0 from the last key), as FlashAttention's
     * alibi_slopes with its causal convention.
     * Non-finite values: softcap maps an infinite s to +-softcap (finite),
     * a NaN stays NaN. A bias of -inf weighs its key 0 but does not mask
     * it: a row whose visible logits are all -inf has L = NaN and O NaN
     * (the rules below fa_forward); a bias of +inf or NaN makes its row
     * NaN. Backward: dS of the softcapped score is multiplied by
     * 1 - tanh^2(s / softcap); bias and ALiBi add nothing to the chain
     * (no gradient for the bias or the slopes is produced).
     * Support: the reference backend runs every option (fused algorithm);
     * a backend's plan refuses, with FA_ERR_UNSUPPORTED naming the option,
     * what its kernels cannot compute (the README's support matrix). */
    float softcap;              /* 0: off; else finite and > 0 */
    /* heads_q fp32 slopes, each finite, host memory copied at plan creation
     * (as block_mask); NULL: no ALiBi. */
    const float *alibi_slopes;
    /* Additive bias [bias_batch, bias_heads, seqlen_q, seqlen_k]: dtype
     * fp32 or q's; key index contiguous; strides in elements (stride_seq
     * between query rows, stride_head, stride_batch; 0: packed), offset in
     * elements, no alignment asked; last byte below 2^62 bytes from the
     * buffer start. bias_batch is 0 (no bias), 1 (broadcast over the
     * batch) or batch; bias_heads 1 (broadcast over heads) or heads_q. Not
     * with variable-length batches (FA_ERR_INVALID_ARGUMENT). The bias
     * data is a buffer of each pass (fa_pass_args.bias). */
    fa_tensor_desc bias;
    int bias_batch;
    int bias_heads;

    /* KV cache (appended; kv_cache 0 leaves all of it off). A plan with
     * kv_cache = 1 runs fa_forward_kvcache only (a forward; no backward),
     * as FlashAttention's flash_attn_with_kvcache:
     * - seqlen_k is the cache's capacity per sequence: its length after
     *   this call's append may not exceed it. The lengths themselves are
     *   data (fa_kvcache_args.cache_seqlens, int32 [batch], device memory:
     *   tokens in each sequence's cache before the call), so one plan
     *   serves every step. Sequence b then attends to len_k =
     *   cache_seqlens[b] + seqlen_new keys, its seqlen_q queries bottom-
     *   right aligned as everywhere (causal, windows, ALiBi).
     * - page_size 0: k and v describe contiguous caches [batch, seqlen_k,
     *   heads_kv, head_dim]. page_size > 0 (a multiple of 16 up to 256):
     *   k and v describe pools of num_pages pages [num_pages, page_size,
     *   heads_kv, head_dim] (stride_batch is the page stride), and token
     *   t of sequence b lies in page block_table[b][t / page_size] at row
     *   t % page_size (fa_kvcache_args.block_table, int32 [batch,
     *   ceil(seqlen_k / page_size)], device memory).
     * - seqlen_new > 0: each call first writes k_new and v_new ([batch,
     *   seqlen_new, heads_kv, head_dim], layouts k_new / v_new, dtype q's)
     *   into the cache at positions cache_seqlens[b] .. + seqlen_new - 1,
     *   then attends to them; cache_seqlens is not updated (the caller
     *   owns it, as in FlashAttention).
     * - rotary_dim > 0 (even, <= head_dim): rotary embedding of the first
     *   rotary_dim dimensions of q and of k_new (never of the keys already
     *   cached), with fp32 tables cos, sin [seqlen_k, rotary_dim / 2]
     *   (fa_kvcache_args.rotary_cos / rotary_sin). rotary_interleaved 1
     *   rotates pairs (2i, 2i + 1), 0 pairs (i, i + rotary_dim / 2). Token
     *   t of k_new is at position cache_seqlens[b] + t; query i at
     *   cache_seqlens[b] + i under a causal mask or a window, else every
     *   query at cache_seqlens[b] (FlashAttention's convention; a window
     *   bound that cannot bind for the shape counts as none, as above).
     *   Rotation is computed in fp32 or better and the rotated q and k_new
     *   are rounded once to q's dtype (the cache holds the rotated keys).
     * Softcap and ALiBi apply; a bias, dropout, block masks, variable-
     * length batches and FA_ALGO_STANDARD do not (FA_ERR_INVALID_ARGUMENT,
     * naming the field); with kv_cache = 0 every field below must be 0.
     * Lengths or page indices in the device arrays that break these rules
     * (a negative length, an append past seqlen_k, a page outside [0,
     * num_pages) among the ceil(len_k / page_size) a sequence uses, a
     * rotary position past seqlen_k - 1: a query's, possible where
     * seqlen_q > seqlen_new) make that sequence's O NaN and its L NaN, and
     * nothing is read or written outside the tensors: such a sequence
     * appends nothing. Block-table entries past a sequence's pages are
     * never read. */
    int kv_cache;               /* 0 or 1 */
    int page_size;              /* 0: contiguous cache */
    int num_pages;              /* pages in each pool (page_size > 0) */
    int seqlen_new;             /* tokens appended per sequence per call; 0: none */
    fa_tensor_desc k_new, v_new;
    int rotary_dim;             /* 0: no rotary embedding */
    int rotary_interleaved;     /* 0 or 1 */

    /* FP8 inputs (appended). With q.dtype = FA_DTYPE_FP8_E4M3, k and v
     * must be e4m3 too (FA_ERR_DTYPE_MISMATCH otherwise) and o.dtype is
     * fp16 or bf16: the dtype O is written in (FA_ERR_DTYPE_MISMATCH for
     * fp32 or e4m3). Rules that come with it:
     * - head_dim is a multiple of 16, so that packed rows of 1-byte
     *   elements stay 16-byte aligned (FA_ERR_UNSUPPORTED_HEAD_DIM);
     *   offsets and strides are multiples of 16 elements (16 bytes), as
     *   for every dtype.
     * - Forward only: plan creation succeeds, fa_backward and
     *   fa_backward_ex on the plan return FA_ERR_UNSUPPORTED. Not with
     *   kv_cache = 1 or FA_ALGO_STANDARD, nor in a distributed plan
     *   (FA_ERR_UNSUPPORTED at plan creation).
     * - A bias is fp32 or o's dtype.
     * - Backends: the reference runs it, and CUDA on sm_90 (fixed-length
     *   sequences, head_dim 64, 128, 192 or 256, without dropout, block
     *   masks or score options: FA_ERR_UNSUPPORTED naming what stands in
     *   the way otherwise, or the device); OpenCL and HIP refuse the plan
     *   (FA_ERR_UNSUPPORTED naming the dtype) until they have fp8
     *   kernels.
     * Per-tensor descale factors (FlashAttention-3's q_descale, k_descale,
     * v_descale): the stored e4m3 values times the factor are the real
     * tensors. The logit is
     *   s = (descale_q * descale_k) * softmax_scale * q_i . k_j
     * before the score options (softcap, bias, ALiBi), and
     *   o_i = descale_v * sum_j p_ij v_j
     * (dropout's 1 / (1 - p) included in p). L is the log-sum-exp of those
     * logits. Products are accumulated in fp32 or better; the reference
     * computes in fp64 on the exact e4m3 values. Each factor is 0 (meaning
     * 1) or finite and > 0 (FA_ERR_BAD_SCALE otherwise); with other dtypes
     * all three must be 0 (FA_ERR_INVALID_ARGUMENT). A plan may change them
     * later (fa_plan_set_descale), as the scales of FP8 training change
     * every step. */
    float descale_q;            /* 0: 1 */
    float descale_k;            /* 0: 1 */
    float descale_v;            /* 0: 1 */
} fa_attention_desc;

/* Defaults: fp32 packed tensors, no masks, no dropout, fused, scale from
 * head_dim, windows unlimited. Shapes are zero and must be set. */
FA_API void fa_attention_desc_init(fa_attention_desc *desc);

/* Total number of query / key tokens (sum over the batch). */
FA_API int64_t fa_attention_total_q(const fa_attention_desc *desc);
FA_API int64_t fa_attention_total_k(const fa_attention_desc *desc);

/* Full argument check of a descriptor, without a device; the message names
 * the offending field. */
FA_API fa_status fa_attention_desc_check(const fa_attention_desc *desc);

/* The dropout decision every backend makes for one element (1 keep, 0 drop);
 * batch is the sequence index, row and col are positions within it. */
FA_API int fa_dropout_keep(uint64_t seed, uint64_t offset, float p, int batch, int head,
                    int heads_q, int row, int col);

/* ------------------------------------------------------------------------ */
/* Plans                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum fa_pass {
    FA_PASS_FORWARD = 0,
    FA_PASS_BACKWARD = 1
} fa_pass;

typedef enum fa_variant {
    FA_VARIANT_SIMT = 0,      /* scalar FMA, any device */
    FA_VARIANT_MMA = 1,       /* matrix units (tensor cores, MFMA, XMX) */
    FA_VARIANT_SPLITK = 2,    /* decoding: keys split, merged through L */
    FA_VARIANT_STANDARD = 3,  /* unfused: S and P in global memory */
    FA_VARIANT_SIMT_STREAM = 4, /* scalar FMA, operands streamed through local
                                  memory in head_dim chunks (OpenCL, large d) */
    FA_VARIANT_WGMMA = 5,      /* matrix units driven by whole warpgroups, operands
                                  from local memory (CUDA sm_90, forward) */
    FA_VARIANT_DECODE = 6,     /* decoding on matrix units: the query rows of a
                                  GQA group packed into one tile, so each KV head's
                                  keys are read once; keys split, merged through L
                                  (CUDA, forward) */
    FA_VARIANT_WGMMA_TMA = 7   /* warp-specialised warpgroup MMA: a producer warp's
                                  tensor-map copies (TMA) feed consumer warpgroups
                                  through a ring of stages (CUDA sm_90, forward) */
} fa_variant;

FA_API const char *fa_variant_name(fa_variant variant);

/* Predicted cost of one pass (the IO model). */
typedef struct fa_cost {
    double hbm_read_bytes;
    double hbm_write_bytes;
    double flops;               /* useful FLOPs (masked scores not counted) */
    double compute_ms;          /* executed tiles (masked cells included) over
                                   the peak rate, with the last wave's tail */
    double memory_ms;           /* bytes over the bandwidth the work-groups
                                   in flight can draw */
    double roofline_ms;         /* max of the two */
    /* What reaches DRAM: hbm_* counts every tile load (the traffic the tile
     * shape decides, which the planner minimises); where the work-groups in
     * flight re-read a working set that fits in the device's last-level
     * cache, those re-reads are cache hits and DRAM sees each tensor once.
     * Equal to hbm_* where it does not fit or the cache size is unknown. */
    double dram_read_bytes;
    double dram_write_bytes;
} fa_cost;

typedef struct fa_kernel_plan {
    fa_variant variant;
    int br;                     /* tile rows (queries) */
    int bc;                     /* tile columns (keys) */
    int work_group_size;
    int simd_width;
    int thread_rows;            /* rows of the tile held per work-item */
    int thread_cols;            /* columns of the tile per work-item */
    int split_k;                /* key splits merged through L; 1: none */
    int stages;                 /* local-memory buffers for K/V tiles */
    int num_work_groups;
    size_t local_mem_bytes;     /* local memory one work-group uses */
    size_t workspace_bytes;     /* global scratch (dQ accumulator, splits) */
    fa_cost cost;
} fa_kernel_plan;

typedef struct fa_plan_info {
    fa_algorithm algorithm;
    fa_kernel_plan forward;
    fa_kernel_plan backward;
    fa_cost standard_forward;   /* unfused attention on the same shape */
    fa_cost standard_backward;
    fa_cost fused_forward;      /* fused attention on the same shape */
    fa_cost fused_backward;
    /* 1: the plan of a KV-cache step (desc.kv_cache): forward is the step
     * planned over the cache's capacity (seqlen_k), with K and V read once
     * per KV head; backward and the standard costs are empty. */
    int kv_cache;
    /* 1: a plan of fp8 (e4m3) inputs (desc.q.dtype FA_DTYPE_FP8_E4M3),
     * which run the forward only: backward is the planner's figure for
     * the shape, never run (appended). */
    int fp8;
} fa_plan_info;

/* The planner alone: plan a problem for a described device (which need not
 * be present). Deterministic: same inputs, same plan. */
FA_API fa_status fa_plan_for_device(const fa_device_desc *device, const fa_attention_desc *desc,
                             fa_plan_info *info);
/* A printable description of a plan; truncated to fit out (always
 * NUL-terminated). Returns the length it needed, excluding the NUL. */
FA_API size_t fa_plan_info_format(const fa_plan_info *info, char *out, size_t out_size);

typedef struct fa_plan_s *fa_plan;

/* Plan a problem on a context: checks the descriptor, runs the planner on the
 * context's device, compiles (or loads from the kernel cache) the kernels,
 * allocates workspace. */
FA_API fa_status fa_plan_create(fa_context ctx, const fa_attention_desc *desc, fa_plan *plan);
FA_API fa_status fa_plan_get_info(fa_plan plan, fa_plan_info *info);
/* The dropout mask of the plan's later fa_forward and fa_backward calls:
 * the same as a plan created with desc.dropout_seed = seed and
 * desc.dropout_offset = offset, without compiling anything (the kernels
 * take both as arguments), so a training loop reuses one plan with a fresh
 * seed per step. The backward pass must use its forward's seed and offset.
 * Only for plans whose descriptor has dropout_p > 0 (else
 * FA_ERR_INVALID_ARGUMENT). Thread safety: as every call on the plan's
 * context. */
FA_API fa_status fa_plan_set_dropout_seed(fa_plan plan, uint64_t seed, uint64_t offset);
/* The descale factors of the plan's later fa_forward calls: the same as a
 * plan created with desc.descale_q = q, descale_k = k, descale_v = v
 * (each 0, meaning 1, or finite and > 0: FA_ERR_BAD_SCALE naming the
 * factor), without compiling anything. Only for plans with fp8 inputs
 * (else FA_ERR_INVALID_ARGUMENT). Thread safety: as every call on the
 * plan's context. */
FA_API fa_status fa_plan_set_descale(fa_plan plan, float q, float k, float v);
FA_API fa_status fa_plan_destroy(fa_plan plan);

/* Aliasing, for fa_forward and fa_backward: the inputs (q, k, v; and o,
 * lse and dout of the backward) may share buffers and bytes freely. An
 * output (o and lse of the forward; dq, dk and dv of the backward) may
 * share a buffer with another argument only where their bytes are
 * disjoint: tensors at separate offsets, or interleaved row by row (dQ, dK
 * and dV packed per token in one buffer, as Q, K and V often are).
 * Overlapping bytes are FA_ERR_INVALID_ARGUMENT. This is checked between
 * arguments that are the same fa_buffer; two buffers wrapping overlapping
 * native memory are the caller's to keep apart. L always starts at byte 0
 * of its buffer. */

/* O and the log-sum-exp L. Buffers must belong to the plan's context and
 * hold their tensors as the descriptor lays them out.
 *
 * Non-finite values. Every backend computes in IEEE fp32 arithmetic (the
 * CPU reference in fp64) and hides no NaN or infinity:
 * - A row is fully masked, O = 0 and L = -inf (and in fa_backward no
 *   gradient from it), exactly when the masks (causal, window, block mask,
 *   sequence lengths) leave it no key; never because of its values.
 * - Otherwise L and O are what IEEE arithmetic makes of the softmax over
 *   the row's visible keys: a NaN in its query or in a visible key, a
 *   logit of +inf, or visible logits that are all -inf give L = NaN and O
 *   all NaN; a logit of -inf among finite ones weighs 0; a NaN or an
 *   infinity in a visible key's value reaches O in that dimension. Dropout
 *   multiplies P by 0 or 1 / (1 - p): a dropped key's NaN or infinite
 *   value still gives NaN.
 * - Logits are computed in fp32 (scale * q.k accumulated in fp32, whatever
 *   the dtype): where that overflows, the result is fp32's, NaN or
 *   infinite, where the fp64 reference may still be finite. fp16 inputs
 *   cannot get there; fp32 and bf16 ones of about 1e19 and more can.
 * - fa_backward differentiates the same arithmetic: a NaN or an infinity
 *   in Q, K, V, O, dO or L reaches the gradients of the (query, key) pairs
 *   it enters. A row with L = -inf is taken as fully masked (fa_forward
 *   writes -inf for those rows only).
 * - A pair the masks hide never enters a softmax: the key of a hidden pair
 *   never changes O or L. But inside the tiles a kernel computes, hidden
 *   pairs take part in the products as exact zeros, and 0 * inf and
 *   0 * NaN are NaN: a NaN or an infinity in V (fa_forward), or in Q, K,
 *   V, O or dO (fa_backward), may reach the outputs of a row or a key the
 *   masks hide it from (standard attention's too). Finite inputs never
 *   make NaN so: keep hidden padding finite (varlen padding outside the
 *   sequences is never read). */
FA_API fa_status fa_forward(fa_plan plan, fa_buffer q, fa_buffer k, fa_buffer v,
                     fa_buffer o, fa_buffer lse);
/* dQ, dK, dV from Q, K, V, O, L and dO (P recomputed from L). */
FA_API fa_status fa_backward(fa_plan plan, fa_buffer q, fa_buffer k, fa_buffer v,
                      fa_buffer o, fa_buffer lse, fa_buffer dout,
                      fa_buffer dq, fa_buffer dk, fa_buffer dv);

/* The tensors of one pass, for fa_forward_ex and fa_backward_ex
 * (zero-initialise, then set what the pass takes). fa_forward and
 * fa_backward are these with bias NULL. */
typedef struct fa_pass_args {
    fa_buffer q, k, v;
    fa_buffer o, lse;              /* outputs of the forward, inputs of the backward */
    fa_buffer dout, dq, dk, dv;    /* backward only; NULL in a forward */
    /* The additive bias as the descriptor's bias lays it out: required
     * exactly when the plan's descriptor has bias_batch > 0, else NULL.
     * An input like q, k and v (the aliasing rules above apply). */
    fa_buffer bias;
} fa_pass_args;

FA_API fa_status fa_forward_ex(fa_plan plan, const fa_pass_args *args);
FA_API fa_status fa_backward_ex(fa_plan plan, const fa_pass_args *args);

/* The tensors of one step against a KV cache (a plan whose descriptor has
 * kv_cache = 1; see the descriptor's KV-cache fields). k_cache and v_cache
 * are read and, where seqlen_new > 0, written (the appended tokens); lse
 * may be NULL. Buffers other than the descriptor's options asks for must
 * be NULL. The int32 and fp32 arrays start at byte 0 of their buffers.
 * Aliasing as for fa_forward: o and lse may not share a byte with any
 * other argument, nor k_cache and v_cache where seqlen_new > 0 (they are
 * written then); the inputs may share theirs. fa_forward and fa_backward
 * refuse a KV-cache plan, and fa_forward_kvcache any other; a backend
 * without KV-cache kernels refuses the plan (FA_ERR_UNSUPPORTED naming
 * kv_cache). fa_plan_last_time_ms times the whole step. */
typedef struct fa_kvcache_args {
    fa_buffer q, k_cache, v_cache, o, lse;
    fa_buffer cache_seqlens;       /* int32 [batch] */
    fa_buffer block_table;         /* int32 [batch, ceil(seqlen_k / page_size)]; page_size > 0 */
    fa_buffer k_new, v_new;        /* seqlen_new > 0 */
    fa_buffer rotary_cos, rotary_sin; /* fp32 [seqlen_k, rotary_dim / 2]; rotary_dim > 0 */
} fa_kvcache_args;

FA_API fa_status fa_forward_kvcache(fa_plan plan, const fa_kvcache_args *args);

/* Device time of the last fa_forward / fa_backward on this plan, measured
 * with the backend's events; FA_ERR_UNSUPPORTED where it cannot time. */
FA_API fa_status fa_plan_last_time_ms(fa_plan plan, double *ms);

/* ------------------------------------------------------------------------ */
/* Context parallelism: one attention over several ranks                    */
/* ------------------------------------------------------------------------ */

/* How a sequence of n tokens is cut over world ranks (the token axis of
 * Q, K, V, O, dO and the gradients alike; with variable-length batches,
 * the packed token axis of the whole batch, so sequences may cross rank
 * borders).
 * - FA_CP_CONTIGUOUS: n / world tokens a rank, in rank order. For
 *   attention without a causal mask, where every rank has the same work.
 * - FA_CP_ZIGZAG: 2 * world chunks of n / (2 * world) tokens; rank r holds
 *   chunk r followed by chunk 2 * world - 1 - r. Under a causal mask every
 *   rank then has the same work (ring-flash-attn's zigzag layout).
 * n must be a multiple of world (contiguous) or 2 * world (zigzag). */
typedef enum fa_cp_layout {
    FA_CP_CONTIGUOUS = 0,
    FA_CP_ZIGZAG = 1
} fa_cp_layout;

/* Where this rank's part `part` (0, or 0 and 1 for zigzag) of a sequence of
 * n tokens lies: tokens [*start, *start + *len) of the whole sequence, and
 * at *local in this rank's tensors. FA_ERR_INVALID_SIZE where n does not
 * divide as above; FA_ERR_INVALID_ARGUMENT for a bad rank, world or part. */
FA_API fa_status fa_cp_part(fa_cp_layout layout, int64_t n, int world, int rank, int part,
                            int64_t *start, int64_t *len, int64_t *local);
/* Host helpers: copy this rank's tokens of a whole tensor out of it
 * (scatter) or into it (gather). whole is [outer][n][token_bytes] and
 * local [outer][n / world][token_bytes] (outer = batch, or 1 for packed
 * variable-length tokens; token_bytes = heads * head_dim * element size). */
FA_API fa_status fa_cp_scatter(fa_cp_layout layout, int world, int rank, int64_t outer, int64_t n,
                               size_t token_bytes, const void *whole, void *local);
FA_API fa_status fa_cp_gather(fa_cp_layout layout, int world, int rank, int64_t outer, int64_t n,
                              size_t token_bytes, const void *local, void *whole);

/* A transport: how the ranks of one attention exchange bytes. The library
 * brings two, over communicators the caller already has: MPI
 * (libflashattn_mpi, flashattn_mpi.h) and NCCL or RCCL
 * (fa_comm_create_nccl). A caller may bring its own.
 * - device_memory 0: send and recv are host memory; the library stages
 *   device buffers through it. 1 (CUDA and HIP contexts): they are device
 *   pointers of the context's device (a CUdeviceptr or HIP pointer as
 *   void *), and queue is the context's native queue, which the transport
 *   orders its transfers after and before (on the device, no host wait).
 * - start: begin sending send_bytes from send to rank `to` and receiving
 *   recv_bytes into recv from rank `from` (the ring's neighbours); returns
 *   a token for wait. The library starts at most two at a time.
 * - wait: the transfer is complete for what the library queues next (for
 *   device_memory 1, work queued on queue after wait sees the data).
 * - agree: a collective over all ranks; each values[i] becomes its
 *   maximum over the ranks. Every rank calls it at the same points: it is
 *   how ranks learn of each other's errors, so that none waits forever.
 * - release: called once by fa_comm_destroy. */
typedef struct fa_transport {
    int rank;
    int world;
    int device_memory;
    void *impl;
    fa_status (*start)(void *impl, void *queue, const void *send, size_t send_bytes, int to, void *recv,
                       size_t recv_bytes, int from, void **pending);
    fa_status (*wait)(void *impl, void *queue, void *pending);
    fa_status (*agree)(void *impl, int64_t *values, int count);
    void (*release)(void *impl);
} fa_transport;

typedef struct fa_comm_s *fa_comm;

/* A communicator over a transport (copied; rank and world checked). */
FA_API fa_status fa_comm_create(const fa_transport *transport, fa_comm *comm);
/* Over a ncclComm_t (CUDA contexts) or rcclComm_t (HIP contexts) the caller
 * initialised for the context's device, passed as void *. The library
 * loads NCCL (libnccl.so.2) or RCCL (librccl.so.1) at run time, or the
 * library named by FLASHATTN_NCCL_LIBRARY; FA_ERR_BACKEND_UNAVAILABLE says
 * why where it cannot, and other contexts are FA_ERR_UNSUPPORTED.
 * Transfers run on a stream of their own, ordered with the context's queue
 * by events. The communicator holds a reference on the context (as a
 * buffer does) until fa_comm_destroy; the NCCL communicator stays the
 * caller's, and must outlive it. */
FA_API fa_status fa_comm_create_nccl(fa_context ctx, void *nccl_comm, fa_comm *comm);
FA_API fa_status fa_comm_get_rank(fa_comm comm, int *rank, int *world);
FA_API fa_status fa_comm_destroy(fa_comm comm);

typedef struct fa_dist_plan_s *fa_dist_plan;

/* A plan for one attention whose tokens are spread over the ranks of comm
 * (ring attention: K and V travel around the ring, forward; K, V, dK and
 * dV, backward; partial results merge through the log-sum-exp in fp32).
 * Collective: every rank calls it with the same problem, and every rank
 * gets the same status (a rank whose descriptor or world differs fails
 * them all, with a message that says so).
 * desc describes the WHOLE problem: seqlen_q and seqlen_k (and
 * cu_seqlens_q / cu_seqlens_k) are those of the sequences before the
 * cut; masks, scale and options as for fa_plan_create. Its tensor layouts
 * (offsets, strides; 0: packed) describe this rank's local tensors: Q, O,
 * dO, dQ [batch, seqlen_q / world, heads_q, head_dim], K, V, dK, dV
 * [batch, seqlen_k / world, heads_kv, head_dim] (varlen: the packed
 * tokens, total / world of them), and the log-sum-exp [batch, heads_q,
 * seqlen_q / world] (varlen: [heads_q, total_q / world]), in the order
 * fa_cp_part gives. The results equal one device's on the whole sequence
 * within rounding: the ring adds the same terms in another order, and
 * rounds each piece's O to the dtype before its fp32 merge.
 * Dropout draws the mask one device draws on the whole sequence with the
 * same dropout_seed and dropout_offset (every rank must give the same):
 * each element keeps or drops by its global row and column. It needs
 * every chunk of keys (seqlen_k / world tokens contiguous, seqlen_k /
 * (2 * world) zigzag) to start at a multiple of 4 tokens, as the mask is
 * drawn four keys at a time.
 * FA_ERR_UNSUPPORTED, with a message, for what the ring cannot do yet:
 * dropout with variable-length batches or with chunks of keys that do not
 * start at multiples of 4; windows or block masks with variable-length
 * batches; causal masks with variable-length batches whose query and key
 * offsets differ; the score options. */
FA_API fa_status fa_dist_plan_create(fa_context ctx, fa_comm comm, const fa_attention_desc *desc,
                                     fa_cp_layout layout, fa_dist_plan *plan);
/* Collective, as fa_forward and fa_backward on the local tensors. */
FA_API fa_status fa_dist_forward(fa_dist_plan plan, fa_buffer q, fa_buffer k, fa_buffer v, fa_buffer o,
                                 fa_buffer lse);
FA_API fa_status fa_dist_backward(fa_dist_plan plan, fa_buffer q, fa_buffer k, fa_buffer v, fa_buffer o,
                                  fa_buffer lse, fa_buffer dout, fa_buffer dq, fa_buffer dk, fa_buffer dv);
/* The dropout mask of the plan's later passes, as fa_plan_set_dropout_seed
 * sets a plan's: the same as a plan created with desc.dropout_seed = seed
 * and desc.dropout_offset = offset, compiling nothing. Not collective, but
 * every rank must set the same seed and offset before its next pass, or
 * the ranks draw a mask that no one device draws. Only for plans whose
 * descriptor has dropout_p > 0 (else FA_ERR_INVALID_ARGUMENT). */
FA_API fa_status fa_dist_plan_set_dropout_seed(fa_dist_plan plan, uint64_t seed, uint64_t offset);
/* How many local plans the ring runs and a printable summary (steps, the
 * pieces of each step, bytes moved a step). */
FA_API size_t fa_dist_plan_format(fa_dist_plan plan, char *out, size_t out_size);
FA_API fa_status fa_dist_plan_destroy(fa_dist_plan plan);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
