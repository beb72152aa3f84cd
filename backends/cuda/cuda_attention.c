/* The attention half of the CUDA backend: compiles the kernels of
 * kernels_cuda/ with NVRTC for a plan's tile shapes and options (through
 * cuda_compile.c: the kernel cache, CUBIN for the device's own
 * architecture), owns the plan's device copies (sequence offsets, block
 * mask, tile maps) and workspace, and launches the passes. The tiling
 * policy is the planner's; this file checks that a plan is one the kernels
 * can run and refuses anything else.
 *
 * Programs. A pass is one NVRTC program (one .cu file and the shared .cuh
 * headers) compiled with the plan's constants as -D options, so that every
 * loop over a tile unrolls:
 *   forward MMA     fwd_mma.cu   fa_fwd_mma
 *   forward WGMMA   fwd_mma.cu   fa_fwd_mma, built with -DWGMMA for sm_90a
 *   forward WGMMA_TMA fwd_tma.cu fa_fwd_tma (sm_90a; takes the tensor maps
 *                                of Q, K, V and O after the parameters);
 *                                with FP8 inputs built with -DFP8, the
 *                                storage dtype O's (no backward)
 *   forward SIMT    simt.cu      fa_fwd_simt [, fa_splitk_merge]
 *   forward DECODE  decode.cu    fa_fwd_decode [, fa_splitk_merge]
 *   KV-cache step   decode.cu    fa_fwd_decode built with KV_CACHE (no
 *                                backward; fa_cuda_forward_kvcache)
 *   KV-cache SIMT   kvcache_simt.cu  fa_kv_prepare, fa_kv_attend
 *                                [, fa_splitk_merge]
 *   backward MMA    bwd_mma.cu   fa_bwd_dot, fa_bwd_dkdv_mma, then
 *                                fa_bwd_dq_convert (dQ by atomics) or
 *                                fa_bwd_dq_mma (deterministic)
 *   backward WGMMA  bwd_mma.cu   the same, built with -DWGMMA for sm_90a
 *   backward SIMT   simt.cu      fa_bwd_dot, fa_bwd_dkdv_simt, then
 *                                fa_bwd_dq_convert or fa_bwd_dq_simt
 * The kernels take one parameter block (fa_cuda_params, mirrored field for
 * field by struct fa_params in kernels_cuda/common.cuh); the KV-cache
 * step a second one (core/kvcache_launch.h's fa_kv_params, struct
 * fa_kv_params in kernels_cuda/kvcache.cuh), whose build options, checks
 * and grid it shares with the HIP backend there. */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"
#include "cuda_compile.h"
#include "cuda_standard.h"
#include "cuda_tma.h"

#include "desc.h"
#include "dtype.h"
#include "build_options.h"
#include "checked.h"
#include "fa_internal.h"
#include "kvcache_launch.h"
#include "plan_data.h"
#include "plan.h"
#include "planner.h"
#include "planner_decode.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU_MAX_KERNELS 3
#define CU_DEFINES_SIZE 512
#define CU_ROWWISE_THREADS 256 /* ROWWISE_THREADS in kernels_cuda/rowwise.cuh */
#define CU_ROWWISE_ROWS 32     /* ROWWISE_ROWS */
#define CU_FP8_VT_THREADS 256  /* VT_THREADS in kernels_cuda/fwd_tma.cu */
#define CU_MAX_THREADS 1024
/* The deterministic dQ kernel's tile (bwd_mma.cu DQ_*): 64 query rows in
 * four warps of 16, 64 keys per step (32 on TF32, whose operands take
 * twice the registers, above head_dim 128, where dQ's accumulators do, and
 * at 128 with dropout, whose Philox rounds do: 64 keys spilled 84-240
 * bytes at 192 and 256, 40 at 128 with dropout and no causal mask, NVRTC
 * 13.0; 16 with score options), within the registers a thread has. */
#define CU_DQ_BR 64
#define CU_DQ_WARPS 4
#define CU_DQ_WIDE_MAX_DIM 128
static int dq_bc(const fa_attention_desc *d) {
    const int dim_max = d->dropout_p > 0.0f ? CU_DQ_WIDE_MAX_DIM - 1 : CU_DQ_WIDE_MAX_DIM;
    /* Score options take registers a score as well (the logit, the cap's
     * derivative, the bias): 16 keys a step. With 64 keys the kernel
     * spilled 20-60 bytes at head_dim 128; with 32, 28 at 192 and 12 at 128
     * with all three under a causal mask (NVRTC 13.0, sm_80 and sm_90). */
    if (fa_desc_option_in_use(d)) return 16;
    return d->q.dtype == FA_DTYPE_F32 || d->head_dim > dim_max ? 32 : 64;
}
/* Forward: Q fragments stay in registers while the thread's accumulators
 * leave them room (fwd_mma.cu QREG). */
#define CU_QREG_BUDGET 160

static const char *const cu_header_paths[] = {"kernels_cuda/dtype.cuh",   "kernels_cuda/common.cuh",
                                              "kernels_cuda/mma.cuh",     "kernels_cuda/rowwise.cuh",
                                              "kernels_cuda/wgmma.cuh",   "kernels_cuda/wgmma_ops.cuh",
                                              "kernels_cuda/kvcache.cuh", "kernels_cuda/simt_tiles.cuh",
                                              "kernels_cuda/tma.cuh"};
#define CU_HEADER_COUNT 9

/* ------------------------------------------------------------------------ */
/* Kernel parameters                                                         */

typedef struct fa_cuda_params {
    CUdeviceptr q, k, v, o, lse, dout, dq, dk, dv, dvec, dq_acc, cu_q, cu_k, block_mask, tile_map, part_o,
        part_l;
    int64_t q_off, q_sb, q_ss, q_sh;
    int64_t k_off, k_sb, k_ss, k_sh;
    int64_t v_off, v_sb, v_ss, v_sh;
    int64_t o_off, o_sb, o_ss, o_sh;
    int64_t total_q;
    int seqlen_q, seqlen_k, heads_q, group, batch;
    int window_left, window_right;
    int block_q, block_k, block_cols, tile_cols;
    uint32_t drop_key0, drop_key1, drop_offset_lo, drop_threshold;
    uint32_t drop_row0, drop_col0;
    float scale, scale_log2, drop_scale;
    int num_splits;
    /* The score options, appended: the offsets above stay the same. */
    float softcap_in;
    CUdeviceptr bias, alibi;
    int64_t bias_off, bias_sb, bias_ss, bias_sh;
    float softcap_out;
    int splits_meet; /* decode.cu: the splits merge together (a cooperative launch) */
} fa_cuda_params;

_Static_assert(offsetof(fa_cuda_params, bias) == 17 * 8 + 17 * 8 + 22 * 4, "fa_cuda_params has padding");
_Static_assert(sizeof(fa_cuda_params) == 17 * 8 + 17 * 8 + 22 * 4 + 6 * 8 + 4 + 4, "fa_cuda_params has padding");
_Static_assert(offsetof(fa_cuda_params, splits_meet) == 17 * 8 + 17 * 8 + 22 * 4 + 6 * 8 + 4,
               "fa_cuda_params: splits_meet is not in the tail");

/* ------------------------------------------------------------------------ */
/* Program specifications: what a pass compiles and launches                 */

typedef struct cu_kernel_spec {
    const char *name;
    int threads;
    size_t smem; /* dynamic shared memory per block */
} cu_kernel_spec;

typedef struct cu_program_spec {
    const char *file; /* "kernels_cuda/fwd_mma.cu" */
    const char *short_name;
    char defines[CU_DEFINES_SIZE];
    int nkernels;
    cu_kernel_spec kernels[CU_MAX_KERNELS];
    int tensor_cores;
    int arch_specific; /* fa_cuda_program's */
    /* 1: the first kernel asks the driver for an SM's largest shared-memory
     * carveout, so that the blocks the planner counts on share an SM (the
     * decoding kernel plans two a compute unit; left to itself the driver
     * may size the carveout for one). */
    int max_carveout;
} cu_program_spec;

static int cu_mma_ok(const fa_kernel_plan *kp) { return kp->variant == FA_VARIANT_MMA; }

/* The score options are compiled in only where the plan has them (the
 * kernels without them are the same binaries as before). An fp32 bias
 * beside 16-bit data is BIAS_F32; otherwise the bias has q's dtype. FP8
 * inputs: the storage dtype is O's, and FP8 says Q, K and V are e4m3. */
static void common_defines(const fa_attention_desc *d, char *out, size_t size) {
    int window = fa_desc_has_window(d);
    const int bias = d->bias_batch > 0, bias_f32 = bias && d->bias.dtype == FA_DTYPE_F32 && d->q.dtype != FA_DTYPE_F32;
    const int fp8 = fa_desc_is_fp8(d);
    snprintf(out, size, "-DHEAD_DIM=%d %s%s%s%s%s%s%s%s%s%s%s", d->head_dim,
             fa_dtype_build_option(fp8 ? d->o.dtype : d->q.dtype), fp8 ? " -DFP8" : "",
             d->causal ? " -DCAUSAL" : "", window ? " -DWINDOW" : "", d->block_mask ? " -DBLOCK_MASK" : "",
             d->dropout_p > 0.0f ? " -DDROPOUT" : "", d->cu_seqlens_q ? " -DVARLEN" : "",
             d->softcap > 0.0f ? " -DSOFTCAP" : "", d->alibi_slopes ? " -DALIBI" : "", bias ? " -DBIAS" : "",
             bias_f32 ? " -DBIAS_F32" : "");
}

static fa_status append_text(cu_program_spec *s, const char *text) {
    size_t len = strlen(s->defines);
    int n = snprintf(s->defines + len, sizeof s->defines - len, "%s", text);
    if (n < 0 || (size_t)n >= sizeof s->defines - len)
        return fa_fail(FA_ERR_INTERNAL, "kernel build options do not fit in %zu bytes", sizeof s->defines);
    return FA_SUCCESS;
}

static fa_status append_define(cu_program_spec *s, const char *fmt, int a, int b, int c, int e) {
    char text[CU_DEFINES_SIZE];
    int n = snprintf(text, sizeof text, fmt, a, b, c, e);
    if (n < 0 || (size_t)n >= sizeof text)
        return fa_fail(FA_ERR_INTERNAL, "kernel build options do not fit in %zu bytes", sizeof s->defines);
    return append_text(s, text);
}

/* kernels_cuda/bwd_mma.cu fa_bwd_dq_mma: Q and dO, K and V tiles. */
static size_t dq_mma_smem(const fa_attention_desc *d) {
    const size_t row_bytes = (d->q.dtype == FA_DTYPE_F32 ? 4 : 2) * (size_t)d->head_dim;
    return 2 * fa_mma_tile_bytes(CU_DQ_BR, row_bytes) + 2 * fa_mma_tile_bytes((size_t)dq_bc(d), row_bytes);
}

/* Shapes the kernels can run, with a message naming what is wrong. */
static fa_status check_mma(const fa_attention_desc *d, const fa_kernel_plan *kp, fa_pass pass, int cc_major) {
    const char *what = pass == FA_PASS_FORWARD ? "forward" : "backward";
    if (cc_major < 8)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: the tensor-core kernels need sm_80 or later (device: sm_%d)",
                       what, cc_major);
    if (d->q.dtype == FA_DTYPE_F32 && !d->allow_tf32)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: fp32 on tensor cores needs desc->allow_tf32", what);
    const int wgs = kp->work_group_size;
    if (wgs != 128 && wgs != 256)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: the tensor-core kernels run 4 or 8 warps, not %d threads", what,
                       wgs);
    const int warps = wgs / 32, rows = pass == FA_PASS_FORWARD ? kp->br : kp->bc;
    /* Backward warps share key strips above head_dim 128 (bwd_mma.cu
     * DK_SPLIT), each with its share of the queries and head dimensions. */
    const int split = pass == FA_PASS_FORWARD ? 1 : fa_mma_bwd_dk_split(d), key_warps = warps / split;
    if (rows % (16 * key_warps) || rows / (16 * key_warps) > 2 || kp->br % (16 * split) || kp->bc % 16 ||
        d->head_dim % (16 * split))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "%s plan: tile %d x %d with %d warps at head_dim %d is not a tensor-core shape (each warp "
                       "owns one or two strips of 16 %s, shared by %d warps; br, bc and head_dim multiples of 16, "
                       "br and head_dim of 16 times the warps a strip)",
                       what, kp->br, kp->bc, warps, d->head_dim, pass == FA_PASS_FORWARD ? "queries" : "keys", split);
    if (kp->stages != 1 && kp->stages != 2)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: %d stages (the kernels run 1 or 2)", what, kp->stages);
    return FA_SUCCESS;
}

static fa_status check_simt(const fa_attention_desc *d, const fa_kernel_plan *kp, fa_pass pass) {
    const char *what = pass == FA_PASS_FORWARD ? "forward" : "backward";
    (void)d;
    if (kp->br <= 0 || kp->bc <= 0 || kp->thread_rows <= 0 || kp->thread_cols <= 0 || kp->br % kp->thread_rows ||
        kp->bc % kp->thread_cols)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: tile %d x %d does not split into %d x %d micro-tiles", what,
                       kp->br, kp->bc, kp->thread_rows, kp->thread_cols);
    const int ntr = kp->br / kp->thread_rows, ntc = kp->bc / kp->thread_cols;
    if (kp->work_group_size > CU_MAX_THREADS)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: a block of %d threads (CUDA blocks hold at most %d)", what,
                       kp->work_group_size, CU_MAX_THREADS);
    if (kp->work_group_size != ntr * ntc)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: work_group_size %d is not (br / thread_rows) * (bc / thread_cols) = %d",
                       what, kp->work_group_size, ntr * ntc);
    if (pass == FA_PASS_FORWARD && kp->variant == FA_VARIANT_SPLITK && kp->split_k < 2)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: split-K with %d splits", kp->split_k);
    return FA_SUCCESS;
}

/* The warpgroup builds of fwd_mma.cu and bwd_mma.cu: sm_90a, fp16/bf16,
 * whole warpgroups of one 16-row strip a warp (query rows forward, keys
 * backward), 64-column blocks of head dimensions (the warp-specialised
 * backward also 96, in two blocks, the second half used). */
static fa_status check_wgmma(const fa_attention_desc *d, const fa_kernel_plan *kp, fa_pass pass, int cc_major,
                             int cc_minor) {
    const char *what = pass == FA_PASS_FORWARD ? "forward" : "backward";
    if (cc_major != 9 || cc_minor != 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: warpgroup MMA exists on sm_90 only (device: sm_%d%d)", what,
                       cc_major, cc_minor);
    if (d->q.dtype != FA_DTYPE_F16 && d->q.dtype != FA_DTYPE_BF16)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: the warpgroup kernels take fp16 or bf16, not %s", what,
                       fa_dtype_name(d->q.dtype));
    const int wgs = kp->work_group_size, br = kp->br, bc = kp->bc;
    if (pass == FA_PASS_FORWARD) {
        /* kernels_cuda/wgmma_ops.cuh has these S products */
        if (br % 64 || wgs != 2 * br || wgs > 256 || (bc != 16 && bc != 32 && bc != 64 && bc != 128) ||
            d->head_dim % 64 || d->head_dim > 256)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "forward plan: tile %d x %d with %d threads at head_dim %d is not a warpgroup shape (64 "
                           "or 128 query rows, 2 threads a row; 16, 32, 64 or 128 keys; head_dim 64, 128, 192 or "
                           "256)",
                           br, bc, wgs, d->head_dim);
    } else if (!(kp->variant == FA_VARIANT_WGMMA_TMA && br == 64 && bc == 64 && wgs == 256 &&
                 (d->head_dim == 256 || d->head_dim == 192) && !(d->dropout_p > 0.0f)) &&
               (!(br == 64 || (br == 128 && bc == 128 && d->head_dim == 64 && !(d->dropout_p > 0.0f))) || bc % 64 ||
                bc > 128 || wgs != 2 * bc || d->head_dim > 128 ||
                (d->head_dim % 64 && !(kp->variant == FA_VARIANT_WGMMA_TMA && d->head_dim == 96)))) {
        /* At head_dim 192 and 256 two warpgroups share 64 keys (the
         * warp-specialised backward, DK_SPLIT 2). */
        /* 128 queries a step only against 128 keys at head_dim 64 (the
         * registers: 64 keys spilled) and without dropout (a thread's keep
         * bits are one 32-bit word). */
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "backward plan: tile %d x %d with %d threads at head_dim %d is not a warpgroup shape (64 "
                       "queries, 128 against 128 keys at head_dim 64 without dropout; 64 or 128 keys, 2 threads a "
                       "key; head_dim 64 or 128, 96 on the warp-specialised kernel; 64 x 64 with two warpgroups a "
                       "key strip at head_dim 192 or 256 without dropout)",
                       br, bc, wgs, d->head_dim);
    }
    if (kp->stages != 1 && kp->stages != 2)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: %d stages (the kernels run 1 or 2)", what, kp->stages);
    return FA_SUCCESS;
}

/* With score options the scores count twice (as the planner counts them,
 * core/planner.c fwd_score_regs). */
static int qreg_fits(const fa_attention_desc *d, int strips, int bc) {
    int q_regs = d->q.dtype == FA_DTYPE_F32 ? d->head_dim / 2 : d->head_dim / 4;
    const int scores = fa_desc_option_in_use(d) ? bc : bc / 2;
    return strips * (d->head_dim / 2 + scores + q_regs) <= CU_QREG_BUDGET;
}

/* Where a split decoding step merges its splits: in the launch itself
 * (SPLIT_MERGE_LAST), by the splits of each group together after they
 * meet where the launch can be cooperative (decode.cu meet_splits), else
 * by the last of them to arrive; FLASHATTN_DECODE_MERGE=last keeps the
 * last block's merge and =kernel the separate fa_splitk_merge launch, so
 * that one GPU run can time all three. */
typedef enum { DECODE_MERGE_MEET, DECODE_MERGE_LAST, DECODE_MERGE_KERNEL } decode_merge;

static fa_status decode_merge_mode(decode_merge *mode) {
    const char *env = getenv("FLASHATTN_DECODE_MERGE");
    *mode = DECODE_MERGE_MEET;
    if (!env || !env[0] || strcmp(env, "meet") == 0) return FA_SUCCESS;
    if (strcmp(env, "last") == 0 || strcmp(env, "kernel") == 0) {
        *mode = env[0] == 'l' ? DECODE_MERGE_LAST : DECODE_MERGE_KERNEL;
        return FA_SUCCESS;
    }
    return fa_fail(FA_ERR_INVALID_ARGUMENT, "FLASHATTN_DECODE_MERGE=%s: expected \"meet\", \"last\" or \"kernel\"",
                   env);
}

/* The KV-cache step's build options (core/kvcache_launch.c checks what the
 * kernels need of the descriptor and names them; softcap and ALiBi come
 * with common_defines); the decoding kernel's page ring besides: 2 *
 * stages - 2 slots, one per 16-row group of the Q tile. */
static fa_status kvcache_defines(const fa_attention_desc *d, const fa_kernel_plan *kp, cu_program_spec *s) {
    fa_kv_defines kv;
    FA_CHECK(fa_kvcache_defines(d, &kv));
    if (kp->variant == FA_VARIANT_DECODE && d->page_size > 0 && 2 * kp->stages - 2 > kp->br)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "KV-cache step: %d stages need %d page-ring slots, more than the %d rows of the Q tile",
                       kp->stages, 2 * kp->stages - 2, kp->br);
    for (int i = 0; i < kv.count; i++) {
        FA_CHECK(append_text(s, " "));
        FA_CHECK(append_text(s, kv.text[i]));
    }
    return FA_SUCCESS;
}

/* kernels_cuda/kvcache_simt.cu: a KV-cache step on the FP32 pipes (the
 * planner's packed-row SIMT tiles), where the decoding kernel does not run
 * it: the sequences' check and the append, the attention, the merge. */
static fa_status kvcache_simt_spec(const fa_attention_desc *d, const fa_kernel_plan *kp, cu_program_spec *s) {
    FA_CHECK(fa_kvcache_check_simt(d, kp, "CUDA (beside its decoding kernel)"));
    FA_CHECK(check_simt(d, kp, FA_PASS_FORWARD));
    s->file = "kernels_cuda/kvcache_simt.cu";
    s->short_name = "kvcache_simt";
    FA_CHECK(append_define(s, " -DFWD -DBR=%d -DBC=%d -DTR=%d -DTC=%d", kp->br, kp->bc, kp->thread_rows,
                           kp->thread_cols));
    FA_CHECK(kvcache_defines(d, kp, s));
    s->nkernels = 2;
    s->kernels[0] = (cu_kernel_spec){"fa_kv_prepare", FA_KV_PREP_THREADS, 0};
    s->kernels[1] = (cu_kernel_spec){"fa_kv_attend", kp->work_group_size,
                                     fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_FORWARD, d, kp->br, kp->bc, 1)};
    if (kp->split_k > 1) {
        FA_CHECK(append_define(s, " -DSPLITK", 0, 0, 0, 0));
        s->kernels[s->nkernels++] = (cu_kernel_spec){"fa_splitk_merge", CU_ROWWISE_THREADS, 0};
    }
    return FA_SUCCESS;
}

/* kernels_cuda/decode.cu: the query rows of a GQA group packed into one
 * tile, four warps of 16 keys, keys split with SPLITK. */
static fa_status decode_spec(const fa_attention_desc *d, const fa_kernel_plan *kp, int cc_major, cu_program_spec *s) {
    if (cc_major < 8)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the decoding kernel needs sm_80 or later (device: sm_%d)",
                       cc_major);
    if (d->q.dtype != FA_DTYPE_F16 && d->q.dtype != FA_DTYPE_BF16)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the decoding kernel takes fp16 or bf16, not %s",
                       fa_dtype_name(d->q.dtype));
    if (d->dropout_p > 0.0f || d->block_mask)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the decoding kernel runs without dropout and block masks");
    /* The KV-cache build of the kernel computes softcap and ALiBi (a bias
     * never reaches a cache plan); the plain one has no score options. */
    const char *option = fa_desc_option_in_use(d);
    if (option && !d->kv_cache)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the decoding kernel has no score options (%s); the planner "
                       "gives such problems to the split-K forward", option);
    if (kp->br % 16 || kp->br <= 0 || kp->br > 64 || kp->bc != FA_DECODE_BC ||
        kp->work_group_size != FA_DECODE_WARPS * 32 || d->head_dim % 16 || kp->stages < 2 || kp->stages > 6 ||
        kp->split_k < 1)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "forward plan: decoding tile %d x %d, %d threads, %d stages, %d splits at head_dim %d is not "
                       "a shape of the kernel (16 to 64 rows in strips of 16, %d keys, %d threads, 2 to 6 stages, "
                       "head_dim a multiple of 16)",
                       kp->br, kp->bc, kp->work_group_size, kp->stages, kp->split_k, d->head_dim, FA_DECODE_BC,
                       FA_DECODE_WARPS * 32);
    s->file = "kernels_cuda/decode.cu";
    s->short_name = d->kv_cache ? "decode_kvcache" : "decode";
    s->tensor_cores = 1;
    FA_CHECK(append_define(s, " -DFWD -DBR=%d -DBC=%d -DWARPS=%d -DSTAGES=%d", kp->br, kp->bc, FA_DECODE_WARPS,
                           kp->stages));
    if (d->kv_cache) FA_CHECK(kvcache_defines(d, kp, s));
    s->nkernels = 1;
    s->kernels[0] = (cu_kernel_spec){"fa_fwd_decode", kp->work_group_size, fa_decode_local_mem(d, kp->br, kp->stages)};
    s->max_carveout = 1;
    if (kp->split_k > 1) {
        /* A cache step merges in its last block always: fa_splitk_merge
         * takes no second parameter block (and its L is never optional). */
        decode_merge mode = DECODE_MERGE_MEET;
        if (!d->kv_cache) FA_CHECK(decode_merge_mode(&mode));
        const int last = mode != DECODE_MERGE_KERNEL;
        FA_CHECK(append_define(s, last ? " -DSPLITK -DSPLIT_MERGE_LAST" : " -DSPLITK", 0, 0, 0, 0));
        if (!last) s->kernels[s->nkernels++] = (cu_kernel_spec){"fa_splitk_merge", CU_ROWWISE_THREADS, 0};
    }
    return FA_SUCCESS;
}

/* How fwd_tma.cu's consumer warpgroups schedule their products. Measured
 * on an H100 (fp16, 16k tokens, N 2k-16k, bench/tma_gpu.sh,
 * bench/results/h100.md): at head_dim 128 the softmax overlapped with the
 * next tile's products (OVERLAP) ran 582-662 TFLOP/s, 8-10% above neither;
 * adding the warpgroups' turns (PINGPONG) changed nothing, and turns alone
 * gained nothing. At head_dim 64 (three consumer warpgroups, where turns
 * do not apply) OVERLAP was 7% faster on long non-causal rows and 5-9%
 * slower causal, 2% slower over all: the products are half as long there,
 * and the issue of the softmax, not the tensor cores, binds. FP8 at head_dim
 * 128 takes both (its products take half as long, so the turns hide the
 * softmax the overlap leaves exposed): 1.22-1.23x the bf16 forward where
 * the overlap alone gave 1.18-1.20x (H100, bench/fp8_gpu.sh).
 * FLASHATTN_TMA_SCHEDULE=both, overlap, pingpong or plain replaces that
 * choice, so that one run can time each. */
static fa_status tma_schedule(const fa_attention_desc *d, const char **defines) {
    const char *env = getenv("FLASHATTN_TMA_SCHEDULE");
    static const char *const names[] = {"both", "overlap", "pingpong", "plain"};
    static const char *const opts[] = {" -DOVERLAP -DPINGPONG", " -DOVERLAP", " -DPINGPONG", ""};
    if (!env || !env[0]) env = fa_desc_is_fp8(d) && d->head_dim == 128 ? names[0] : d->head_dim >= 128 ? names[1] : names[3];
    for (size_t i = 0; i < FA_ARRAY_SIZE(names); i++)
        if (strcmp(env, names[i]) == 0) {
            *defines = opts[i];
            return FA_SUCCESS;
        }
    return fa_fail(FA_ERR_INVALID_ARGUMENT,
                   "FLASHATTN_TMA_SCHEDULE=%s: expected \"both\", \"overlap\", \"pingpong\" or \"plain\"", env);
}

/* FP8 (e4m3) inputs run on fwd_tma.cu's FP8 build alone: sm_90, the
 * planner's warp-specialised plan, fixed-length sequences, head_dim 64,
 * 128, 192 or 256, none of the options that build lacks. Each refusal
 * names what stands in the way. */
static fa_status check_fp8(const fa_attention_desc *d, const fa_kernel_plan *kp, int cc_major, int cc_minor) {
    const char *dt = fa_dtype_name(d->q.dtype), *option = fa_desc_option_in_use(d);
    if (cc_major != 9 || cc_minor != 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "q.dtype = %s: the CUDA backend runs %s inputs on sm_90 only (device: sm_%d%d)",
                       dt, dt, cc_major, cc_minor);
    if (d->dropout_p > 0.0f)
        return fa_fail(FA_ERR_UNSUPPORTED, "dropout_p = %g: the CUDA forward of %s inputs has no dropout",
                       (double)d->dropout_p, dt);
    if (d->block_mask)
        return fa_fail(FA_ERR_UNSUPPORTED, "block_mask: the CUDA forward of %s inputs has no block-sparse mask", dt);
    if (option)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s: the CUDA forward of %s inputs has no score options", option, dt);
    if (d->cu_seqlens_q)
        return fa_fail(FA_ERR_UNSUPPORTED, "cu_seqlens_q: the CUDA forward of %s inputs takes fixed-length sequences "
                       "(a tensor map's box would cross into the next sequence)", dt);
    if (d->head_dim % 64 || d->head_dim > 256)
        return fa_fail(FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim %d: the CUDA forward of %s inputs takes 64, 128, 192 or 256",
                       d->head_dim, dt);
    if (kp->variant != FA_VARIANT_WGMMA_TMA)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan %s: the CUDA backend runs %s inputs on the warp-specialised "
                       "kernel only (wgmma_tma), which the layouts (strides below 2^40 bytes) or the device's limits "
                       "(shared memory, threads a block) rule out here", fa_variant_name(kp->variant), dt);
    return FA_SUCCESS;
}

/* kernels_cuda/fwd_tma.cu: sm_90a, fp16/bf16 (or fp8 inputs: check_fp8),
 * fixed-length sequences, head_dims of whole 64-column blocks up to 256;
 * one producer warpgroup and br / 64 consumer warpgroups; 64- or 128-key
 * tiles (wgmma_ops.cuh's S products; 192 with fp8 inputs) in 2 to 4
 * stages. */
static fa_status tma_spec(const fa_attention_desc *d, const fa_kernel_plan *kp, int cc_major, int cc_minor,
                          cu_program_spec *s) {
    if (cc_major != 9 || cc_minor != 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the warp-specialised kernel runs on sm_90 only (device: sm_%d%d)",
                       cc_major, cc_minor);
    if (d->q.dtype != FA_DTYPE_F16 && d->q.dtype != FA_DTYPE_BF16 && !fa_desc_is_fp8(d))
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the warp-specialised kernel takes fp16 or bf16, not %s",
                       fa_dtype_name(d->q.dtype));
    if (d->cu_seqlens_q || d->kv_cache)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the warp-specialised kernel takes fixed-length sequences "
                       "(a tensor map's box would cross into the next sequence)");
    const int cwg = kp->br / 64;
    /* fp8: also 192 keys (wgmma_ops.cuh has the S product, V^T takes two lines). */
    const int keys_ok = kp->bc == 64 || kp->bc == 128 || (kp->bc == 192 && fa_desc_is_fp8(d));
    /* 16-bit head dims between whole 64-column blocks run the kernel built
     * for the next block (fa_tma_head_dim): the tensor maps, of the real
     * head_dim, fill the rest with zeros and store none of it. */
    const int padded = fa_desc_is_fp8(d) ? d->head_dim : fa_tma_head_dim(d);
    if (kp->br % 64 || cwg < 1 || cwg > 3 || kp->work_group_size != 128 * (cwg + 1) || !keys_ok ||
        d->head_dim % 8 != 0 || padded % 64 != 0 || padded > 256 || kp->stages < 2 || kp->stages > 4)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "forward plan: tile %d x %d, %d threads, %d stages at head_dim %d is not a shape of the "
                       "warp-specialised kernel (64, 128 or 192 query rows with 128 threads more than 2 a row; 64 "
                       "or 128 keys, 192 with fp8 inputs; 2 to 4 stages; head_dim a multiple of 8 up to 256, 64, "
                       "128, 192 or 256 with fp8 inputs)",
                       kp->br, kp->bc, kp->work_group_size, kp->stages, d->head_dim);
    fa_attention_desc pd = *d;
    pd.head_dim = padded;
    if (padded != d->head_dim) common_defines(&pd, s->defines, sizeof s->defines);
    const char *schedule = "";
    FA_CHECK(tma_schedule(&pd, &schedule));
    /* Turns are between two consumer warpgroups; the overlap holds two
     * tiles' scores, which three groups' 160 registers hold only at
     * head_dim 64 (planner.c tma_rows, fp8_rows: three groups at 128 run
     * neither). */
    if (cwg != 2 && strstr(schedule, "PINGPONG")) schedule = strstr(schedule, "OVERLAP") ? " -DOVERLAP" : "";
    if (cwg == 3 && padded >= 128) schedule = "";
    s->file = "kernels_cuda/fwd_tma.cu";
    s->short_name = "fwd_tma";
    s->tensor_cores = 1;
    s->arch_specific = 1;
    FA_CHECK(append_define(s, " -DFWD -DBR=%d -DBC=%d -DSTAGES=%d", kp->br, kp->bc, kp->stages, 0));
    FA_CHECK(append_text(s, schedule));
    s->nkernels = 1;
    s->kernels[0] = (cu_kernel_spec){"fa_fwd_tma", kp->work_group_size,
                                     fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_FORWARD, d, kp->br, kp->bc,
                                                       kp->stages)};
    if (fa_fp8_vt_global(d, kp->bc)) {
        /* fa_fp8_vt writes V^T before each forward (launch_tma). */
        FA_CHECK(append_text(s, " -DVT_GLOBAL"));
        s->kernels[s->nkernels++] = (cu_kernel_spec){"fa_fp8_vt", CU_FP8_VT_THREADS, 0};
    }
    return FA_SUCCESS;
}

static fa_status forward_spec(const fa_attention_desc *d, const fa_kernel_plan *kp, int cc_major, int cc_minor,
                              cu_program_spec *s) {
    memset(s, 0, sizeof *s);
    common_defines(d, s->defines, sizeof s->defines);
    if (fa_desc_is_fp8(d)) FA_CHECK(check_fp8(d, kp, cc_major, cc_minor));
    if (kp->variant == FA_VARIANT_WGMMA_TMA) return tma_spec(d, kp, cc_major, cc_minor, s);
    if (kp->variant == FA_VARIANT_WGMMA) {
        FA_CHECK(check_wgmma(d, kp, FA_PASS_FORWARD, cc_major, cc_minor));
        s->file = "kernels_cuda/fwd_mma.cu";
        s->short_name = "fwd_wgmma";
        s->tensor_cores = 1;
        s->arch_specific = 1;
        FA_CHECK(append_define(s, " -DFWD -DWGMMA -DBR=%d -DBC=%d -DWARPS=%d -DSTAGES=%d", kp->br, kp->bc,
                               kp->work_group_size / 32, kp->stages));
        const int blocks = fa_wgmma_blocks_per_sm(d, kp->bc);
        if (blocks > 1) FA_CHECK(append_define(s, " -DFWD_MIN_BLOCKS=%d", blocks, 0, 0, 0));
        s->nkernels = 1;
        s->kernels[0] = (cu_kernel_spec){"fa_fwd_mma", kp->work_group_size,
                                         fa_plan_local_mem(FA_VARIANT_WGMMA, FA_PASS_FORWARD, d, kp->br, kp->bc,
                                                           kp->stages)};
        return FA_SUCCESS;
    }
    if (kp->variant == FA_VARIANT_DECODE) return decode_spec(d, kp, cc_major, s);
    if (d->kv_cache) return kvcache_simt_spec(d, kp, s);
    if (cu_mma_ok(kp)) {
        FA_CHECK(check_mma(d, kp, FA_PASS_FORWARD, cc_major));
        const int warps = kp->work_group_size / 32, strips = kp->br / (16 * warps);
        s->file = "kernels_cuda/fwd_mma.cu";
        s->short_name = "fwd_mma";
        s->tensor_cores = 1;
        FA_CHECK(append_define(s, " -DFWD -DBR=%d -DBC=%d -DWARPS=%d -DSTAGES=%d", kp->br, kp->bc, warps, kp->stages));
        if (qreg_fits(d, strips, kp->bc)) FA_CHECK(append_define(s, " -DQREG", 0, 0, 0, 0));
        s->nkernels = 1;
        s->kernels[0] = (cu_kernel_spec){"fa_fwd_mma", kp->work_group_size,
                                         fa_plan_local_mem(FA_VARIANT_MMA, FA_PASS_FORWARD, d, kp->br, kp->bc,
                                                           kp->stages)};
        return FA_SUCCESS;
    }
    if (kp->variant != FA_VARIANT_SIMT && kp->variant != FA_VARIANT_SPLITK)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward variant %s has no CUDA kernel", fa_variant_name(kp->variant));
    FA_CHECK(check_simt(d, kp, FA_PASS_FORWARD));
    s->file = "kernels_cuda/simt.cu";
    s->short_name = "simt";
    FA_CHECK(append_define(s, " -DFWD -DBR=%d -DBC=%d -DTR=%d -DTC=%d", kp->br, kp->bc, kp->thread_rows,
                           kp->thread_cols));
    s->nkernels = 1;
    s->kernels[0] = (cu_kernel_spec){"fa_fwd_simt", kp->work_group_size,
                                     fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_FORWARD, d, kp->br, kp->bc, 1)};
    if (kp->variant == FA_VARIANT_SPLITK && kp->split_k > 1) {
        FA_CHECK(append_define(s, " -DSPLITK", 0, 0, 0, 0));
        s->kernels[s->nkernels++] = (cu_kernel_spec){"fa_splitk_merge", CU_ROWWISE_THREADS, 0};
    }
    return FA_SUCCESS;
}

/* Floats a row of the fp32 dQ accumulator: the padded head_dim where the
 * warp-specialised backward runs padded (its reductions write whole rows). */
static int dq_acc_dim(const fa_attention_desc *d, const fa_kernel_plan *kp) {
    return kp->variant == FA_VARIANT_WGMMA_TMA ? fa_tma_bwd_head_dim(d) : d->head_dim;
}

static fa_status backward_spec(const fa_attention_desc *d, const fa_kernel_plan *kp, int cc_major, int cc_minor,
                               cu_program_spec *s) {
    memset(s, 0, sizeof *s);
    /* The warp-specialised kernel at a head_dim between its own runs padded
     * (planner.c tma_backward_plan_padded): built for the padded one, with
     * IO_DIM the tensors' (fa_bwd_dot, the conversion of dQ and the dK, dV
     * stores read and write that many columns). */
    const fa_attention_desc pd = kp->variant == FA_VARIANT_WGMMA_TMA ? fa_tma_bwd_desc(d) : *d;
    common_defines(&pd, s->defines, sizeof s->defines);
    if (pd.head_dim != d->head_dim) FA_CHECK(append_define(s, " -DIO_DIM=%d", d->head_dim, 0, 0, 0));
    d = &pd;
    const int atomic = !d->deterministic;
    s->kernels[0] = (cu_kernel_spec){"fa_bwd_dot", CU_ROWWISE_THREADS, 0};
    if (cu_mma_ok(kp) || kp->variant == FA_VARIANT_WGMMA || kp->variant == FA_VARIANT_WGMMA_TMA) {
        const int wgmma = kp->variant != FA_VARIANT_MMA, tma = kp->variant == FA_VARIANT_WGMMA_TMA;
        /* The TMA build: the warpgroup kernel's consumers and a producer
         * warpgroup of 128 threads ahead of them. */
        fa_kernel_plan consumers = *kp;
        if (tma) {
            if (d->cu_seqlens_q)
                return fa_fail(FA_ERR_UNSUPPORTED, "backward plan: the warp-specialised kernel takes fixed-length "
                               "sequences (a tensor map's box would cross into the next sequence)");
            consumers.work_group_size -= 128;
        }
        if (wgmma)
            FA_CHECK(check_wgmma(d, &consumers, FA_PASS_BACKWARD, cc_major, cc_minor));
        else
            FA_CHECK(check_mma(d, kp, FA_PASS_BACKWARD, cc_major));
        s->file = "kernels_cuda/bwd_mma.cu";
        s->short_name = tma ? "bwd_tma" : wgmma ? "bwd_wgmma" : "bwd_mma";
        s->tensor_cores = 1;
        s->arch_specific = wgmma;
        FA_CHECK(append_define(s, " -DBWD -DBR=%d -DBC=%d -DWARPS=%d -DSTAGES=%d", kp->br, kp->bc,
                               consumers.work_group_size / 32, kp->stages));
        if (wgmma) FA_CHECK(append_define(s, tma ? " -DWGMMA -DTMA" : " -DWGMMA", 0, 0, 0, 0));
        const int split = wgmma ? (tma && d->head_dim > 128 ? 2 : 1) : fa_mma_bwd_dk_split(d);
        if (split > 1) {
            s->short_name = tma ? "bwd_tma_split" : "bwd_mma_split";
            FA_CHECK(append_define(s, " -DDK_SPLIT=%d", split, 0, 0, 0));
        }
        s->kernels[1] = (cu_kernel_spec){"fa_bwd_dkdv_mma", kp->work_group_size,
                                         fa_plan_local_mem(kp->variant, FA_PASS_BACKWARD, d, kp->br, kp->bc,
                                                           kp->stages)};
        if (tma && fa_tma_bwd_dq_lag(d, kp->bc)) FA_CHECK(append_define(s, " -DBWD_DQ_LAG", 0, 0, 0, 0));
        if (atomic) {
            FA_CHECK(append_define(s, " -DDQ_ATOMIC", 0, 0, 0, 0));
            s->kernels[2] = (cu_kernel_spec){"fa_bwd_dq_convert", CU_ROWWISE_THREADS, 0};
        } else {
            FA_CHECK(append_define(s, " -DDQ_BR=%d -DDQ_BC=%d -DDQ_WARPS=%d", CU_DQ_BR, dq_bc(d), CU_DQ_WARPS, 0));
            s->kernels[2] = (cu_kernel_spec){"fa_bwd_dq_mma", CU_DQ_WARPS * 32, dq_mma_smem(d)};
        }
        s->nkernels = 3;
        return FA_SUCCESS;
    }
    if (kp->variant != FA_VARIANT_SIMT)
        return fa_fail(FA_ERR_UNSUPPORTED, "backward variant %s has no CUDA kernel", fa_variant_name(kp->variant));
    FA_CHECK(check_simt(d, kp, FA_PASS_BACKWARD));
    s->file = "kernels_cuda/simt.cu";
    s->short_name = "simt";
    FA_CHECK(append_define(s, " -DBWD -DBR=%d -DBC=%d -DTR=%d -DTC=%d", kp->br, kp->bc, kp->thread_rows,
                           kp->thread_cols));
    const size_t smem = fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_BACKWARD, d, kp->br, kp->bc, 1);
    s->kernels[1] = (cu_kernel_spec){"fa_bwd_dkdv_simt", kp->work_group_size, smem};
    if (atomic) {
        FA_CHECK(append_define(s, " -DDQ_ATOMIC", 0, 0, 0, 0));
        s->kernels[2] = (cu_kernel_spec){"fa_bwd_dq_convert", CU_ROWWISE_THREADS, 0};
    } else {
        /* fa_bwd_dq_simt: Qt, dOt, Kt, Vt, dSt, Ls, Ds (within the budget). */
        const size_t dim = (size_t)d->head_dim, r = (size_t)kp->br, c = (size_t)kp->bc;
        s->kernels[2] = (cu_kernel_spec){"fa_bwd_dq_simt", kp->work_group_size, 4 * (2 * dim * r + 2 * dim * c + c * r + 2 * r)};
    }
    s->nkernels = 3;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Compiling (cuda_compile.c)                                                */

_Static_assert(CU_MAX_KERNELS <= FA_CUDA_MAX_KERNELS, "a pass has more kernels than a compile reports");

/* Macros that change what a CUDA attention build computes or the geometry
 * the host launches it with (kernels_cuda/common.cuh and each kernel's
 * file): the environment's options may not set them. Tuning ones
 * (FWD_MIN_BLOCKS, QREG) are refused only where the plan sets them. */
static const char *const cu_plan_macros[] = {
    "HEAD_DIM", "DTYPE_F32", "DTYPE_F16", "DTYPE_BF16", "CAUSAL", "WINDOW", "BLOCK_MASK", "DROPOUT", "VARLEN",
    "FWD",      "BWD",       "WGMMA",     "BR",         "BC",     "TR",     "TC",         "WARPS",   "STAGES",
    "SPLITK",   "SPLIT_MERGE_LAST", "DQ_ATOMIC", "DQ_BR", "DQ_BC", "DQ_WARPS", "DK_SPLIT", "KV_CACHE", "PAGED",
    "APPEND",   "ROTARY_DIM", "ROTARY_INTERLEAVED", "SOFTCAP", "ALIBI", "BIAS", "BIAS_F32", "FP8", "BWD_DQ_LAG", NULL};

static fa_status compile_program(const cu_program_spec *spec, int major, int minor, fa_cuda_binary *out) {
    const char *names[CU_MAX_KERNELS];
    for (int i = 0; i < spec->nkernels; i++) names[i] = spec->kernels[i].name;
    /* FLASHATTN_CUDA_OPTIONS: NVRTC options appended to every attention
     * program's (a define to try, say: bench/cuda_check.sh tiles). They are
     * part of the kernel cache's key like the others. */
    const char *env = getenv("FLASHATTN_CUDA_OPTIONS");
    FA_CHECK(fa_check_env_build_options("FLASHATTN_CUDA_OPTIONS", env, spec->defines, cu_plan_macros));
    char defines[CU_DEFINES_SIZE + 256];
    int n = snprintf(defines, sizeof defines, "%s%s%s", spec->defines, env && env[0] ? " " : "", env ? env : "");
    if (n < 0 || (size_t)n >= sizeof defines)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "FLASHATTN_CUDA_OPTIONS does not fit in %zu bytes of options",
                       sizeof defines - sizeof spec->defines);
    const fa_cuda_program prog = {spec->file, cu_header_paths, CU_HEADER_COUNT,     defines,
                                  names,      spec->nkernels,  spec->arch_specific};
    return fa_cuda_compile(&prog, major, minor, 1, out);
}

/* ------------------------------------------------------------------------ */
/* Plans                                                                     */

typedef struct cu_pass {
    cu_program_spec spec;
    CUmodule module;
    CUfunction fn[CU_MAX_KERNELS];
} cu_pass;

typedef struct fa_cuda_plan {
    fa_cuda_context *ctx;
    cu_pass fwd, bwd;
    int num_splits;
    CUdeviceptr cu_q, cu_k, block_mask, fwd_tiles, bwd_tiles, dq_tiles, part_o, part_l, dvec, dq_acc;
    CUdeviceptr alibi;       /* the ALiBi slopes (times log2 e; raw for a KV-cache plan) */
    int fwd_tile_cols, bwd_tile_cols, dq_tile_cols;
    fa_cuda_params base;
    int kv_cache;            /* a KV-cache plan: fa_cuda_forward_kvcache only */
    CUdeviceptr kv_status;   /* kvcache_simt.cu: a verdict per sequence */
    CUdeviceptr vt;          /* fwd_tma.cu VT_GLOBAL: V^T of fp8 inputs, vt_keys bytes a row */
    int64_t vt_keys;
    fa_kv_params kv_base;
    CUevent ev_start, ev_stop;
    int timed; /* a pass was recorded between the two events */
} fa_cuda_plan;

static const fa_cu_api *cu(void) { return fa_cuda_api(); }

static fa_status device_alloc(size_t bytes, const void *host, const char *what, CUdeviceptr *out, CUstream stream) {
    if (bytes == 0) bytes = 16;
    CUresult r = cu()->cuMemAlloc_v2(out, bytes);
    if (r != CUDA_SUCCESS) {
        *out = 0;
        char text[128];
        snprintf(text, sizeof text, "cuMemAlloc(%zu bytes of %s)", bytes, what);
        return fa_cuda_error(r, text);
    }
    if (host) {
        r = cu()->cuMemcpyHtoDAsync_v2(*out, host, bytes, stream);
        if (r == CUDA_SUCCESS) r = cu()->cuStreamSynchronize(stream);
        if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuMemcpyHtoD (plan data)");
    }
    return FA_SUCCESS;
}

/* The block mask per (br x bc) tile (core/plan_data.h), on the device
 * (kernels_cuda/common.cuh TILE_*). */
static fa_status build_tile_map(fa_cuda_plan *p, const fa_plan_s *plan, int br, int bc, CUdeviceptr *out,
                                int *cols_out) {
    uint8_t *map;
    size_t bytes;
    FA_CHECK(fa_tile_map_build(&plan->desc, plan->block_mask, br, bc, &map, &bytes, cols_out));
    fa_status st = device_alloc(bytes, map, "the block-sparse tile map", out, p->ctx->stream);
    free(map);
    return st;
}

static fa_status load_pass(fa_cuda_plan *p, cu_pass *pass) {
    fa_cuda_binary bin;
    FA_CHECK(compile_program(&pass->spec, p->ctx->cc_major, p->ctx->cc_minor, &bin));
    CUresult r = cu()->cuModuleLoadData(&pass->module, bin.data);
    fa_cuda_binary_free(&bin);
    if (r != CUDA_SUCCESS) {
        pass->module = NULL;
        char what[160];
        snprintf(what, sizeof what, "cuModuleLoadData(%s)", pass->spec.file);
        return fa_cuda_error(r, what);
    }
    for (int i = 0; i < pass->spec.nkernels; i++) {
        const cu_kernel_spec *k = &pass->spec.kernels[i];
        r = cu()->cuModuleGetFunction(&pass->fn[i], pass->module, k->name);
        if (r != CUDA_SUCCESS) {
            char what[160];
            snprintf(what, sizeof what, "cuModuleGetFunction(%s)", k->name);
            return fa_cuda_error(r, what);
        }
        if (k->smem > p->ctx->smem_optin)
            return fa_fail(FA_ERR_UNSUPPORTED, "%s needs %zu bytes of shared memory, the device offers %zu", k->name,
                           k->smem, p->ctx->smem_optin);
        /* Beyond 48 KiB a kernel must opt in to its dynamic shared memory. */
        if (k->smem > 48 * 1024) {
            r = cu()->cuFuncSetAttribute(pass->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)k->smem);
            if (r != CUDA_SUCCESS) {
                char what[160];
                snprintf(what, sizeof what, "cuFuncSetAttribute(%s, %zu bytes of shared memory)", k->name, k->smem);
                return fa_cuda_error(r, what);
            }
        }
        if (i == 0 && pass->spec.max_carveout) {
            r = cu()->cuFuncSetAttribute(pass->fn[i], CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                         (int)CU_SHAREDMEM_CARVEOUT_MAX_SHARED);
            if (r != CUDA_SUCCESS) {
                char what[160];
                snprintf(what, sizeof what, "cuFuncSetAttribute(%s, the largest shared-memory carveout)", k->name);
                return fa_cuda_error(r, what);
            }
        }
        int max_threads = 0;
        if (cu()->cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, pass->fn[i]) ==
                CUDA_SUCCESS &&
            max_threads < k->threads)
            return fa_fail(FA_ERR_UNSUPPORTED, "%s: a block of %d threads exceeds what the compiled kernel allows (%d)",
                           k->name, k->threads, max_threads);
    }
    return FA_SUCCESS;
}

void fa_cuda_plan_release(void *ctx_handle, void *plan_impl) {
    (void)ctx_handle;
    if (fa_cuda_standard_owns(plan_impl)) {
        fa_cuda_standard_release(plan_impl);
        return;
    }
    fa_cuda_plan *p = plan_impl;
    if (!p) return;
    if (fa_cuda_push(p->ctx) == FA_SUCCESS) {
        /* Passes still queued may use the plan's memory. */
        (void)cu()->cuStreamSynchronize(p->ctx->stream);
        if (p->fwd.module) (void)cu()->cuModuleUnload(p->fwd.module);
        if (p->bwd.module) (void)cu()->cuModuleUnload(p->bwd.module);
        CUdeviceptr mems[] = {p->cu_q,   p->cu_k,   p->block_mask, p->fwd_tiles, p->bwd_tiles,   p->dq_tiles,
                              p->part_o, p->part_l, p->dvec,       p->dq_acc,    p->alibi,       p->kv_status,
                              p->vt};
        for (size_t i = 0; i < FA_ARRAY_SIZE(mems); i++)
            if (mems[i]) (void)cu()->cuMemFree_v2(mems[i]);
        if (p->ev_start) (void)cu()->cuEventDestroy_v2(p->ev_start);
        if (p->ev_stop) (void)cu()->cuEventDestroy_v2(p->ev_stop);
        fa_cuda_pop();
    }
    free(p);
}

static void set_layout(int64_t *dst, const fa_attention_desc *d, fa_tensor_role role) {
    fa_layout l = fa_desc_layout(d, role);
    dst[0] = l.offset;
    dst[1] = l.stride_batch;
    dst[2] = l.stride_seq;
    dst[3] = l.stride_head;
}

/* The KV-cache step's plan-time parameters (core/kvcache_launch.c; the
 * caches' layouts are fa_desc_layout's, already in the first block), the
 * ALiBi slopes on the device, and the FP32-pipe step's verdicts. */
static fa_status prepare_kvcache(fa_cuda_plan *p, const fa_plan_s *plan) {
    const fa_attention_desc *d = &plan->desc;
    fa_kv_params *kv = &p->kv_base;
    fa_kvcache_params(d, kv);
    if (plan->alibi_slopes) {
        FA_CHECK(device_alloc((size_t)d->heads_q * sizeof(float), plan->alibi_slopes, "the ALiBi slopes", &p->alibi,
                              p->ctx->stream));
        kv->alibi = p->alibi;
    }
    if (plan->info.forward.variant != FA_VARIANT_DECODE) {
        fa_kv_workspace w;
        FA_CHECK(fa_kvcache_workspace(plan, 1, &w));
        FA_CHECK(device_alloc(w.status_bytes, NULL, "the sequences' verdicts", &p->kv_status, p->ctx->stream));
        kv->status = p->kv_status;
    }
    return FA_SUCCESS;
}

/* The score options' parameters (kernels_cuda/common.cuh fa_score): the
 * softcap's two factors, the ALiBi slopes times log2 e in a device buffer
 * of the plan's, and the bias layout in elements with broadcast dimensions
 * at stride 0 (the buffer comes with each pass). */
/* x in float, clamped to its largest finite value: a factor that
 * overflowed to inf would make 0 * inf = NaN of a product that is 0. */
static float finite_float(double x) { return x > FLT_MAX ? FLT_MAX : x < -FLT_MAX ? -FLT_MAX : (float)x; }

static fa_status set_score_options(fa_cuda_plan *p, const fa_plan_s *plan, fa_cuda_params *b) {
    const fa_attention_desc *d = &plan->desc;
    if (d->softcap > 0.0f) {
        b->softcap_in = finite_float((double)plan->scale / (double)d->softcap);
        b->softcap_out = finite_float((double)d->softcap * 1.4426950408889634);
    }
    if (plan->alibi_slopes) {
        size_t bytes;
        FA_CHECK(fa_workspace_bytes("the ALiBi slopes", (size_t[]){(size_t)d->heads_q, sizeof(float)}, 2, &bytes));
        float *slopes = malloc(bytes);
        if (!slopes) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for %d ALiBi slopes", d->heads_q);
        for (int h = 0; h < d->heads_q; h++)
            slopes[h] = finite_float((double)plan->alibi_slopes[h] * 1.4426950408889634);
        const fa_status st = device_alloc(bytes, slopes, "the ALiBi slopes", &p->alibi, p->ctx->stream);
        free(slopes);
        FA_CHECK(st);
        b->alibi = p->alibi;
    }
    if (d->bias_batch > 0) {
        fa_dim dims[4];
        fa_desc_bias_dims(d, dims);
        b->bias_off = d->bias.offset;
        b->bias_ss = dims[1].stride;
        b->bias_sh = d->bias_heads > 1 ? dims[2].stride : 0;
        b->bias_sb = d->bias_batch > 1 ? dims[3].stride : 0;
    }
    return FA_SUCCESS;
}

/* Splits a meeting's merge takes: decode.cu merge_share's MERGE_LPR lanes
 * of MERGE_PER_LANE each. */
#define CU_MEET_MAX_SPLITS 128
/* Rows of a tile whose splits may meet (decode.cu builds the meeting up
 * to 32). */
#define CU_MEET_MAX_ROWS 32
/* Splits from which they meet: the cooperative launch costs about 3 us
 * more than a plain one (H100: batch 8, four splits, 40.4 -> 43.6 us at
 * 4k keys), which a merge of four splits in the last block does not;
 * 32 splits' merge does (batch 1: 28.8 -> 26.0 us at 16k keys). */
#define CU_MEET_MIN_SPLITS 16

/* The decoding grid: (row tiles of the packed group rows, KV heads,
 * sequences x splits). */
static int64_t decode_blocks(const fa_attention_desc *d, const fa_kernel_plan *kp, int splits) {
    const int64_t rows = (int64_t)(d->heads_q / d->heads_kv) * d->seqlen_q;
    return (rows + kp->br - 1) / kp->br * d->heads_kv * d->batch * splits;
}

/* Whether a split decoding step's splits meet (decode.cu meet_splits):
 * unless FLASHATTN_DECODE_MERGE=last, where the device launches
 * cooperatively and every block of the grid fits on it at once (the
 * planner sizes the splits to one wave; a device shared with other work
 * may hold fewer, and the cooperative launch then waits for room rather
 * than leave a group's splits waiting on each other). */
static fa_status choose_splits_meet(fa_cuda_plan *p, const fa_plan_s *plan) {
    decode_merge mode = DECODE_MERGE_MEET;
    if (!p->kv_cache) FA_CHECK(decode_merge_mode(&mode));
    p->base.splits_meet = 0;
    if (mode != DECODE_MERGE_MEET || p->num_splits < CU_MEET_MIN_SPLITS || p->num_splits > CU_MEET_MAX_SPLITS ||
        plan->info.forward.br > CU_MEET_MAX_ROWS)
        return FA_SUCCESS;
    int coop = 0, per_sm = 0;
    CUresult r = cu()->cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, p->ctx->device);
    const cu_kernel_spec *k = &p->fwd.spec.kernels[0];
    if (r == CUDA_SUCCESS) r = cu()->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, p->fwd.fn[0], k->threads, k->smem);
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuDeviceGetAttribute / cuOccupancyMaxActiveBlocksPerMultiprocessor");
    const int64_t blocks = decode_blocks(&plan->desc, &plan->info.forward, p->num_splits);
    p->base.splits_meet = coop && blocks <= (int64_t)per_sm * p->ctx->sm_count;
    return FA_SUCCESS;
}

int fa_cuda_plan_splits_meet(const void *plan_impl) {
    return plan_impl ? ((const fa_cuda_plan *)plan_impl)->base.splits_meet : 0;
}

static fa_status prepare_inner(fa_cuda_plan *p, const fa_plan_s *plan) {
    const fa_attention_desc *d = &plan->desc;
    const fa_plan_info *info = &plan->info;
    CUstream stream = p->ctx->stream;
    p->kv_cache = d->kv_cache != 0;
    /* A KV-cache plan has no backward, nor has one of fp8 inputs. */
    const int fwd_only = p->kv_cache || fa_desc_is_fp8(d);
    FA_CHECK(forward_spec(d, &info->forward, p->ctx->cc_major, p->ctx->cc_minor, &p->fwd.spec));
    if (!fwd_only) FA_CHECK(backward_spec(d, &info->backward, p->ctx->cc_major, p->ctx->cc_minor, &p->bwd.spec));
    const fa_variant fv = info->forward.variant;
    /* Found at plan time, not at the first forward. */
    if (fv == FA_VARIANT_WGMMA_TMA && !cu()->cuTensorMapEncodeTiled)
        return fa_fail(FA_ERR_UNSUPPORTED, "forward plan: the warp-specialised kernel needs tensor maps "
                       "(cuTensorMapEncodeTiled, CUDA 12 drivers); FLASHATTN_PLAN_TMA=0 plans the warpgroup forward");
    p->num_splits =
        (fv == FA_VARIANT_SPLITK || fv == FA_VARIANT_DECODE) && info->forward.split_k > 1 ? info->forward.split_k : 1;
    /* The decoding grid's rows: a group's heads times the tokens, an int
     * in the kernel. */
    if (fv == FA_VARIANT_DECODE && (int64_t)(d->heads_q / d->heads_kv) * d->seqlen_q > INT32_MAX / 2)
        return fa_fail(FA_ERR_UNSUPPORTED, "decoding: heads_q / heads_kv (%d) * seqlen_q (%d) exceeds the kernel's rows",
                       d->heads_q / d->heads_kv, d->seqlen_q);
    if ((int64_t)d->batch * p->num_splits > 65535 || d->heads_q > 65535)
        return fa_fail(FA_ERR_UNSUPPORTED, "batch * splits (%lld) and heads_q (%d) must each be at most 65535",
                       (long long)d->batch * p->num_splits, d->heads_q);

    fa_cuda_params *b = &p->base;
    memset(b, 0, sizeof *b);
    int64_t lay[4];
    set_layout(lay, d, FA_TENSOR_Q);
    b->q_off = lay[0], b->q_sb = lay[1], b->q_ss = lay[2], b->q_sh = lay[3];
    set_layout(lay, d, FA_TENSOR_K);
    b->k_off = lay[0], b->k_sb = lay[1], b->k_ss = lay[2], b->k_sh = lay[3];
    set_layout(lay, d, FA_TENSOR_V);
    b->v_off = lay[0], b->v_sb = lay[1], b->v_ss = lay[2], b->v_sh = lay[3];
    set_layout(lay, d, FA_TENSOR_O);
    b->o_off = lay[0], b->o_sb = lay[1], b->o_ss = lay[2], b->o_sh = lay[3];
    b->total_q = plan->total_q;
    b->seqlen_q = d->seqlen_q;
    b->seqlen_k = d->seqlen_k;
    b->heads_q = d->heads_q;
    b->group = d->heads_q / d->heads_kv;
    b->batch = d->batch;
    b->window_left = d->window_left;
    b->window_right = d->window_right;
    b->block_q = d->block_mask ? d->block_q : 1;
    b->block_k = d->block_mask ? d->block_k : 1;
    b->block_cols = fa_block_cols(d);
    b->drop_threshold = plan->dropout_threshold;
    b->scale = plan->scale;
    b->scale_log2 = (float)((double)plan->scale * 1.4426950408889634);
    b->drop_scale = d->dropout_p > 0.0f ? (float)(1.0 / (1.0 - (double)d->dropout_p)) : 1.0f;
    b->num_splits = p->num_splits;
    if (p->kv_cache)
        FA_CHECK(prepare_kvcache(p, plan));
    else
        FA_CHECK(set_score_options(p, plan, b));

    /* Rows of L: heads_q x total_q. */
    const size_t heads = (size_t)d->heads_q, tokens = (size_t)plan->total_q, dim = (size_t)d->head_dim;
    const size_t dq_dim = (size_t)dq_acc_dim(d, &info->backward);
    size_t bytes;
    if (plan->cu_seqlens_q) {
        bytes = ((size_t)d->batch + 1) * sizeof(int32_t);
        FA_CHECK(device_alloc(bytes, plan->cu_seqlens_q, "cu_seqlens_q", &p->cu_q, stream));
        FA_CHECK(device_alloc(bytes, plan->cu_seqlens_k, "cu_seqlens_k", &p->cu_k, stream));
    }
    if (plan->block_mask) {
        FA_CHECK(device_alloc(d->block_mask_bytes, plan->block_mask, "the block mask", &p->block_mask, stream));
        FA_CHECK(build_tile_map(p, plan, info->forward.br, info->forward.bc, &p->fwd_tiles, &p->fwd_tile_cols));
        FA_CHECK(build_tile_map(p, plan, info->backward.br, info->backward.bc, &p->bwd_tiles, &p->bwd_tile_cols));
        if (cu_mma_ok(&info->backward) && d->deterministic)
            FA_CHECK(build_tile_map(p, plan, CU_DQ_BR, dq_bc(d), &p->dq_tiles, &p->dq_tile_cols));
    }
    int counted = 0; /* a decoding step that merges in its own launch */
    if (p->num_splits > 1) {
        const size_t splits = (size_t)p->num_splits;
        FA_CHECK(fa_workspace_bytes("split-K partial outputs",
                                    (size_t[]){splits, heads, tokens, dim, sizeof(float)}, 5, &bytes));
        FA_CHECK(device_alloc(bytes, NULL, "split-K partial outputs", &p->part_o, stream));
        FA_CHECK(fa_workspace_bytes("split-K partial log-sum-exps",
                                    (size_t[]){splits, heads, tokens, sizeof(float)}, 4, &bytes));
        /* decode.cu SPLIT_MERGE_LAST: an arrival count per (row tile, KV
         * head, sequence) after the L's, for a KV-cache step as many flag
         * words after those (arrive_last), then as many barrier
         * generations (meet_splits), zero once here; the kernel wraps the
         * counts and flags back to zero. */
        counted = p->fwd.spec.nkernels == 1 && fv == FA_VARIANT_DECODE;
        size_t counters = 0;
        if (counted) {
            const size_t row_tiles = (size_t)fa_tile_count((int64_t)(d->heads_q / d->heads_kv) * d->seqlen_q, info->forward.br);
            FA_CHECK(fa_workspace_bytes("split arrival counters",
                                        (size_t[]){p->kv_cache ? 3u : 2u, (size_t)d->batch, (size_t)d->heads_kv,
                                                   row_tiles, sizeof(uint32_t)},
                                        5, &counters));
            if (bytes > SIZE_MAX - counters)
                return fa_fail(FA_ERR_UNSUPPORTED, "split-K partial log-sum-exps and counters exceed SIZE_MAX bytes");
        }
        FA_CHECK(device_alloc(bytes + counters, NULL, "split-K partial log-sum-exps", &p->part_l, stream));
        if (counted) {
            CUresult r = cu()->cuMemsetD32Async(p->part_l + bytes, 0u, counters / sizeof(uint32_t), stream);
            if (r == CUDA_SUCCESS) r = cu()->cuStreamSynchronize(stream);
            if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuMemsetD32Async (split arrival counters)");
        }
    }
    if (fv == FA_VARIANT_WGMMA_TMA && fa_fp8_vt_global(d, info->forward.bc)) {
        FA_CHECK(fa_fp8_vt_size(d, &p->vt_keys, &bytes));
        FA_CHECK(device_alloc(bytes, NULL, "V^T of fp8 inputs", &p->vt, stream));
    }
    if (!fwd_only) {
        FA_CHECK(fa_workspace_bytes("the backward row sums", (size_t[]){heads, tokens, sizeof(float)}, 3, &bytes));
        FA_CHECK(device_alloc(bytes, NULL, "the backward row sums", &p->dvec, stream));
    }
    if (!d->deterministic && !fwd_only) {
        FA_CHECK(fa_workspace_bytes("the dQ accumulator", (size_t[]){heads, tokens, dq_dim, sizeof(float)}, 4, &bytes));
        FA_CHECK(device_alloc(bytes, NULL, "the dQ accumulator", &p->dq_acc, stream));
    }
    b->cu_q = p->cu_q;
    b->cu_k = p->cu_k;
    b->block_mask = p->block_mask;
    b->part_o = p->part_o;
    b->part_l = p->part_l;
    b->dvec = p->dvec;
    b->dq_acc = p->dq_acc;

    CUresult r = cu()->cuEventCreate(&p->ev_start, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = cu()->cuEventCreate(&p->ev_stop, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuEventCreate");

    FA_CHECK(load_pass(p, &p->fwd));
    if (counted) FA_CHECK(choose_splits_meet(p, plan));
    return fwd_only ? FA_SUCCESS : load_pass(p, &p->bwd);
}

fa_status fa_cuda_plan_prepare(void *ctx_handle, const fa_plan_s *plan, void **plan_impl) {
    if (!plan_impl) return fa_fail(FA_ERR_NULL_POINTER, "plan_impl is NULL");
    *plan_impl = NULL;
    fa_cuda_context *ctx = ctx_handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!plan) return fa_fail(FA_ERR_NULL_POINTER, "plan is NULL");
    const fa_attention_desc *d = &plan->desc;
    if (d->kv_cache && d->algorithm != FA_ALGO_FUSED)
        return fa_fail(FA_ERR_UNSUPPORTED, "KV-cache step: CUDA runs it fused only (algorithm FA_ALGO_FUSED)");
    if (d->algorithm == FA_ALGO_STANDARD) {
        /* Standard attention's element-wise kernels have no score options
         * (nor has the reference's standard attention). */
        FA_CHECK(fa_refuse_score_options(d, "CUDA (standard algorithm)"));
        return fa_cuda_standard_prepare(ctx, plan, plan_impl);
    }
    if (plan->info.algorithm != FA_ALGO_FUSED || d->algorithm != FA_ALGO_FUSED)
        return fa_fail(FA_ERR_UNSUPPORTED, "the CUDA attention kernels run only FA_ALGO_FUSED");
    if (d->head_dim % 8 || d->head_dim < 8 || d->head_dim > 256)
        return fa_fail(FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim %d is not a multiple of 8 in [8, 256]", d->head_dim);
    if (d->q.dtype != d->k.dtype || d->q.dtype != d->v.dtype || (d->q.dtype != d->o.dtype && !fa_desc_is_fp8(d)))
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "the CUDA kernels need q, k, v and o of one dtype (o fp16 or bf16 "
                       "beside fp8 inputs)");
    fa_cuda_plan *p = calloc(1, sizeof *p);
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a CUDA plan");
    p->ctx = ctx;
    fa_status st = fa_cuda_push(ctx);
    if (st != FA_SUCCESS) {
        free(p);
        return st;
    }
    st = prepare_inner(p, plan);
    fa_cuda_pop();
    if (st != FA_SUCCESS) {
        fa_cuda_plan_release(ctx, p);
        return st;
    }
    *plan_impl = p;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Passes                                                                    */

static fa_status check_aligned(void *buf, const char *name, CUdeviceptr *out) {
    const fa_cuda_buffer *b = buf;
    if (b->ptr % 16)
        return fa_fail(FA_ERR_MISALIGNED, "%s: device address 0x%llx is not 16-byte aligned", name,
                       (unsigned long long)b->ptr);
    *out = b->ptr;
    return FA_SUCCESS;
}

/* A launch's result, naming the kernel and its grid where it failed. */
static fa_status launch_status(CUresult r, const cu_kernel_spec *k, unsigned gx, unsigned gy, unsigned gz) {
    if (r == CUDA_SUCCESS) return FA_SUCCESS;
    char what[128];
    snprintf(what, sizeof what, "cuLaunchKernel(%s, grid %u x %u x %u, %d threads, %zu bytes)", k->name, gx, gy, gz,
             k->threads, k->smem);
    return fa_cuda_error(r, what);
}

/* kv: the KV-cache step's second parameter block, or NULL. */
static fa_status launch_kernel(fa_cuda_plan *p, const cu_pass *pass, int index, unsigned gx, unsigned gy, unsigned gz,
                               const fa_cuda_params *params, const fa_kv_params *kv) {
    if (gx == 0 || gy == 0 || gz == 0) return FA_SUCCESS;
    const cu_kernel_spec *k = &pass->spec.kernels[index];
    void *args[] = {(void *)params, (void *)kv};
    /* The decoding kernel whose splits meet: every block resident at once. */
    const int coop = pass == &p->fwd && index == 0 && params->splits_meet;
    CUresult r = coop ? cu()->cuLaunchCooperativeKernel(pass->fn[index], gx, gy, gz, (unsigned)k->threads, 1, 1,
                                                        (unsigned)k->smem, p->ctx->stream, args)
                      : cu()->cuLaunchKernel(pass->fn[index], gx, gy, gz, (unsigned)k->threads, 1, 1,
                                             (unsigned)k->smem, p->ctx->stream, args, NULL);
    if (coop && r == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) {
        /* Fewer SMs than the plan counted (MPS, a partitioned device): the
         * same kernel, its last block merging (splits_meet is read at run
         * time). */
        fa_cuda_params plain = *params;
        plain.splits_meet = 0;
        void *plain_args[] = {&plain, (void *)kv};
        r = cu()->cuLaunchKernel(pass->fn[index], gx, gy, gz, (unsigned)k->threads, 1, 1, (unsigned)k->smem,
                                 p->ctx->stream, plain_args, NULL);
    }
    return launch_status(r, k, gx, gy, gz);
}

static fa_status launch(fa_cuda_plan *p, const cu_pass *pass, int index, unsigned gx, unsigned gy, unsigned gz,
                        const fa_cuda_params *params) {
    return launch_kernel(p, pass, index, gx, gy, gz, params, NULL);
}

static unsigned tiles_of(int n, int t) { return (unsigned)fa_tile_count(n, t); }

/* fwd_tma.cu: the parameters, then the tensor maps of Q (boxes of the
 * tile's rows), K and V (of its keys) and O (64 rows, a consumer
 * warpgroup's), encoded for this call's buffers. */
static fa_status launch_tma(fa_cuda_plan *p, const fa_attention_desc *d, const fa_kernel_plan *kp,
                            const fa_cuda_params *prm) {
    CUtensorMap maps[4];
    FA_CHECK(fa_cuda_tensor_map(&maps[0], prm->q, d, FA_TENSOR_Q, kp->br));
    FA_CHECK(fa_cuda_tensor_map(&maps[1], prm->k, d, FA_TENSOR_K, kp->bc));
    if (p->vt) {
        /* VT_GLOBAL: V^T of this call's V first (a 128-key tile a block),
         * its map in place of V's. */
        FA_CHECK(fa_cuda_vt_map(&maps[2], p->vt, d, p->vt_keys));
        const cu_kernel_spec *t = &p->fwd.spec.kernels[1];
        void *vt_args[] = {(void *)prm, &p->vt, &p->vt_keys};
        const unsigned tx = (unsigned)(p->vt_keys / 128), ty = (unsigned)d->heads_kv, tz = (unsigned)d->batch;
        FA_CHECK(launch_status(cu()->cuLaunchKernel(p->fwd.fn[1], tx, ty, tz, (unsigned)t->threads, 1, 1, 0,
                                                    p->ctx->stream, vt_args, NULL),
                               t, tx, ty, tz));
    } else {
        FA_CHECK(fa_cuda_tensor_map(&maps[2], prm->v, d, FA_TENSOR_V, kp->bc));
    }
    FA_CHECK(fa_cuda_tensor_map(&maps[3], prm->o, d, FA_TENSOR_O, 64));
    const cu_kernel_spec *k = &p->fwd.spec.kernels[0];
    void *args[] = {(void *)prm, &maps[0], &maps[1], &maps[2], &maps[3]};
    const unsigned gx = tiles_of(d->seqlen_q, kp->br), gy = (unsigned)d->heads_q, gz = (unsigned)d->batch;
    const CUresult r = cu()->cuLaunchKernel(p->fwd.fn[0], gx, gy, gz, (unsigned)k->threads, 1, 1, (unsigned)k->smem,
                                            p->ctx->stream, args, NULL);
    return launch_status(r, k, gx, gy, gz);
}

/* The pass's bias (NULL exactly when the plan has none, core/backend.h):
 * no alignment is asked of its offset, but its elements must be aligned
 * to their size for the kernels' loads. */
static fa_status bias_arg(const fa_attention_desc *d, void *buf, CUdeviceptr *out) {
    *out = 0;
    if (d->bias_batch == 0) return FA_SUCCESS;
    if (!buf) return fa_fail(FA_ERR_NULL_POINTER, "bias is NULL but the plan has a bias");
    const fa_cuda_buffer *b = buf;
    const size_t es = fa_dtype_size(d->bias.dtype);
    if (b->ptr % es)
        return fa_fail(FA_ERR_MISALIGNED, "bias: device address 0x%llx is not aligned to its %zu-byte elements",
                       (unsigned long long)b->ptr, es);
    *out = b->ptr;
    return FA_SUCCESS;
}

/* The plan's fixed parameters with the dropout seed and origin of this
 * pass (both may change after the plan is prepared), and with fp8 inputs
 * the descale factors of this pass (fa_plan_set_descale): descale_q
 * descale_k in the logits' factors, descale_v in the factor O takes at
 * its normalisation, drop_scale (fp8 plans have no dropout; fwd_tma.cu). */
static fa_cuda_params pass_params(const fa_cuda_plan *p, const fa_plan_s *plan) {
    fa_cuda_params prm = p->base;
    prm.drop_key0 = plan->dropout_key.key0;
    prm.drop_key1 = plan->dropout_key.key1;
    prm.drop_offset_lo = plan->dropout_key.offset_lo;
    prm.drop_row0 = (uint32_t)plan->drop_row0;
    prm.drop_col0 = (uint32_t)plan->drop_col0;
    if (fa_desc_is_fp8(&plan->desc)) {
        const fa_attention_desc *d = &plan->desc;
        const double qk = fa_desc_descale(d->descale_q) * fa_desc_descale(d->descale_k) * (double)plan->scale;
        prm.scale = finite_float(qk);
        prm.scale_log2 = finite_float(qk * 1.4426950408889634);
        prm.drop_scale = finite_float(fa_desc_descale(d->descale_v));
    }
    return prm;
}

/* A pass's launches between the plan's two events (fa_cuda_last_time_ms
 * reads them); timed again only once the stop event is recorded. */
static fa_status timing_begin(fa_cuda_plan *p) {
    p->timed = 0;
    const CUresult r = cu()->cuEventRecord(p->ev_start, p->ctx->stream);
    return r == CUDA_SUCCESS ? FA_SUCCESS : fa_cuda_error(r, "cuEventRecord");
}
static fa_status timing_end(fa_cuda_plan *p) {
    const CUresult r = cu()->cuEventRecord(p->ev_stop, p->ctx->stream);
    if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuEventRecord");
    p->timed = 1;
    return FA_SUCCESS;
}

static fa_status forward_inner(fa_cuda_plan *p, const fa_plan_s *plan, const fa_fwd_args *args) {
    const fa_attention_desc *d = &plan->desc;
    fa_cuda_params prm = pass_params(p, plan);
    FA_CHECK(check_aligned(args->q, "q", &prm.q));
    FA_CHECK(check_aligned(args->k, "k", &prm.k));
    FA_CHECK(check_aligned(args->v, "v", &prm.v));
    FA_CHECK(check_aligned(args->o, "o", &prm.o));
    FA_CHECK(check_aligned(args->lse, "lse", &prm.lse));
    FA_CHECK(bias_arg(d, args->bias, &prm.bias));
    prm.tile_map = p->fwd_tiles;
    prm.tile_cols = p->fwd_tile_cols;
    FA_CHECK(timing_begin(p));
    const fa_kernel_plan *kp = &plan->info.forward;
    if (kp->variant == FA_VARIANT_WGMMA_TMA) {
        FA_CHECK(launch_tma(p, d, kp, &prm));
    } else if (kp->variant == FA_VARIANT_DECODE) {
        /* (row tile of the packed group rows, KV head, sequence x split) */
        const int64_t rows = (int64_t)(d->heads_q / d->heads_kv) * d->seqlen_q;
        FA_CHECK(launch(p, &p->fwd, 0, (unsigned)((rows + kp->br - 1) / kp->br), (unsigned)d->heads_kv,
                        (unsigned)(d->batch * p->num_splits), &prm));
    } else {
        FA_CHECK(launch(p, &p->fwd, 0, tiles_of(d->seqlen_q, kp->br), (unsigned)d->heads_q,
                        (unsigned)(d->batch * p->num_splits), &prm));
    }
    if (p->num_splits > 1 && p->fwd.spec.nkernels > 1)
        FA_CHECK(launch(p, &p->fwd, 1, tiles_of(d->seqlen_q, CU_ROWWISE_ROWS), (unsigned)d->heads_q, (unsigned)d->batch,
                        &prm));
    return timing_end(p);
}

fa_status fa_cuda_forward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args) {
    (void)ctx;
    if (plan && plan->desc.algorithm == FA_ALGO_STANDARD) return fa_cuda_standard_forward(plan_impl, plan, args);
    fa_cuda_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    if (p->kv_cache)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "the plan's descriptor has kv_cache = 1: use fa_forward_kvcache");
    FA_CHECK(fa_cuda_push(p->ctx));
    fa_status st = forward_inner(p, plan, args);
    fa_cuda_pop();
    return st;
}

/* bwd_mma.cu built with TMA: the key-side kernel takes the tensor maps of
 * K and V (boxes of the tile's keys), Q and dO (of its queries) after the
 * parameters. */
static fa_status launch_bwd_tma(fa_cuda_plan *p, const fa_attention_desc *d, const fa_kernel_plan *kp,
                                const fa_cuda_params *prm) {
    CUtensorMap maps[4];
    FA_CHECK(fa_cuda_tensor_map(&maps[0], prm->k, d, FA_TENSOR_K, kp->bc));
    FA_CHECK(fa_cuda_tensor_map(&maps[1], prm->v, d, FA_TENSOR_V, kp->bc));
    FA_CHECK(fa_cuda_tensor_map(&maps[2], prm->q, d, FA_TENSOR_Q, kp->br));
    FA_CHECK(fa_cuda_tensor_map(&maps[3], prm->dout, d, FA_TENSOR_O, kp->br));
    const cu_kernel_spec *k = &p->bwd.spec.kernels[1];
    void *args[] = {(void *)prm, &maps[0], &maps[1], &maps[2], &maps[3]};
    const unsigned gx = tiles_of(d->seqlen_k, kp->bc), gy = (unsigned)d->heads_kv, gz = (unsigned)d->batch;
    return launch_status(cu()->cuLaunchKernel(p->bwd.fn[1], gx, gy, gz, (unsigned)k->threads, 1, 1,
                                              (unsigned)k->smem, p->ctx->stream, args, NULL),
                         k, gx, gy, gz);
}

static fa_status backward_inner(fa_cuda_plan *p, const fa_plan_s *plan, const fa_bwd_args *args) {
    const fa_attention_desc *d = &plan->desc;
    fa_cuda_params prm = pass_params(p, plan);
    FA_CHECK(check_aligned(args->q, "q", &prm.q));
    FA_CHECK(check_aligned(args->k, "k", &prm.k));
    FA_CHECK(check_aligned(args->v, "v", &prm.v));
    FA_CHECK(check_aligned(args->o, "o", &prm.o));
    FA_CHECK(check_aligned(args->lse, "lse", &prm.lse));
    FA_CHECK(check_aligned(args->dout, "dout", &prm.dout));
    FA_CHECK(check_aligned(args->dq, "dq", &prm.dq));
    FA_CHECK(check_aligned(args->dk, "dk", &prm.dk));
    FA_CHECK(check_aligned(args->dv, "dv", &prm.dv));
    FA_CHECK(bias_arg(d, args->bias, &prm.bias));
    const fa_kernel_plan *kp = &plan->info.backward;
    const unsigned row_groups = tiles_of(d->seqlen_q, CU_ROWWISE_ROWS), hq = (unsigned)d->heads_q, nb = (unsigned)d->batch;
    FA_CHECK(timing_begin(p));
    if (p->dq_acc) {
        size_t words = (size_t)d->heads_q * (size_t)plan->total_q * (size_t)dq_acc_dim(d, kp);
        const CUresult r = cu()->cuMemsetD32Async(p->dq_acc, 0u, words, p->ctx->stream);
        if (r != CUDA_SUCCESS) return fa_cuda_error(r, "cuMemsetD32Async (dQ accumulator)");
    }
    FA_CHECK(launch(p, &p->bwd, 0, row_groups, hq, nb, &prm));
    prm.tile_map = p->bwd_tiles;
    prm.tile_cols = p->bwd_tile_cols;
    if (kp->variant == FA_VARIANT_WGMMA_TMA)
        FA_CHECK(launch_bwd_tma(p, d, kp, &prm));
    else
        FA_CHECK(launch(p, &p->bwd, 1, tiles_of(d->seqlen_k, kp->bc), (unsigned)d->heads_kv, nb, &prm));
    if (p->dq_acc) {
        FA_CHECK(launch(p, &p->bwd, 2, row_groups, hq, nb, &prm));
    } else if (cu_mma_ok(kp)) {
        prm.tile_map = p->dq_tiles;
        prm.tile_cols = p->dq_tile_cols;
        FA_CHECK(launch(p, &p->bwd, 2, tiles_of(d->seqlen_q, CU_DQ_BR), hq, nb, &prm));
    } else {
        FA_CHECK(launch(p, &p->bwd, 2, tiles_of(d->seqlen_q, kp->br), hq, nb, &prm));
    }
    return timing_end(p);
}

fa_status fa_cuda_backward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args) {
    (void)ctx;
    if (plan && plan->desc.algorithm == FA_ALGO_STANDARD) return fa_cuda_standard_backward(plan_impl, plan, args);
    fa_cuda_plan *p = plan_impl;
    if (!p || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    if (p->kv_cache) return fa_fail(FA_ERR_INVALID_ARGUMENT, "a KV-cache plan has no backward pass");
    FA_CHECK(fa_cuda_push(p->ctx));
    fa_status st = backward_inner(p, plan, args);
    fa_cuda_pop();
    return st;
}

/* One step: the decoding kernel built with KV_CACHE, in one launch (the
 * append is done by one block of each (sequence, KV head) while every
 * block takes the new rows from k_new and v_new: decode.cu append_new), or
 * the FP32-pipe step's launches (kvcache_simt.cu). */
static fa_status kvcache_inner(fa_cuda_plan *p, const fa_plan_s *plan, const fa_kvcache_call *a) {
    const fa_attention_desc *d = &plan->desc;
    fa_cuda_params prm = pass_params(p, plan);
    fa_kv_params kv = p->kv_base;
    fa_kv_tensors t;
    FA_CHECK(fa_kvcache_bind(d, a, fa_cuda_buffer_locate, &kv, &t));
    prm.q = t.q, prm.k = t.k_cache, prm.v = t.v_cache, prm.o = t.o, prm.lse = t.lse;
    const fa_kernel_plan *kp = &plan->info.forward;
    /* (row tile of the packed group rows, KV head, sequence x split) */
    unsigned grid[3];
    FA_CHECK(fa_kvcache_grid(d, kp, grid));
    const unsigned gx = grid[0], gy = grid[1], gz = grid[2];
    FA_CHECK(timing_begin(p));
    if (kp->variant == FA_VARIANT_DECODE) {
        FA_CHECK(launch_kernel(p, &p->fwd, 0, gx, gy, gz, &prm, &kv));
    } else {
        /* kvcache_simt.cu: the verdicts and the append, then the attention
         * (which reads both), then the merge; stream order between them. */
        FA_CHECK(launch_kernel(p, &p->fwd, 0, (unsigned)d->batch, 1, 1, &prm, &kv));
        FA_CHECK(launch_kernel(p, &p->fwd, 1, gx, gy, gz, &prm, &kv));
        if (p->fwd.spec.nkernels > 2)
            FA_CHECK(launch(p, &p->fwd, 2, tiles_of(d->seqlen_q, CU_ROWWISE_ROWS), (unsigned)d->heads_q,
                            (unsigned)d->batch, &prm));
    }
    return timing_end(p);
}

fa_status fa_cuda_forward_kvcache(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args) {
    (void)ctx;
    if (!plan_impl || !plan || !args)
        return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !plan_impl ? "plan_impl" : !plan ? "plan" : "args");
    /* (A standard-attention plan is another type: never a cache plan.) */
    fa_cuda_plan *p = fa_cuda_standard_owns(plan_impl) ? NULL : plan_impl;
    if (!p || !p->kv_cache)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "the plan's descriptor has kv_cache = 0: use fa_forward");
    FA_CHECK(fa_cuda_push(p->ctx));
    fa_status st = kvcache_inner(p, plan, args);
    fa_cuda_pop();
    return st;
}

fa_status fa_cuda_last_time_ms(void *ctx, void *plan_impl, double *ms) {
    (void)ctx;
    if (fa_cuda_standard_owns(plan_impl)) return fa_cuda_standard_last_time_ms(plan_impl, ms);
    fa_cuda_plan *p = plan_impl;
    if (!p || !ms) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "ms");
    *ms = 0.0;
    if (!p->timed) return fa_fail(FA_ERR_UNSUPPORTED, "no CUDA attention pass has run on this plan");
    return fa_cuda_events_ms(p->ctx, p->ev_start, p->ev_stop, ms);
}

fa_status fa_cuda_plan_shared_bytes(void *plan_impl, fa_pass pass, size_t *bytes) {
    fa_cuda_plan *p = plan_impl;
    if (!p || !bytes) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "bytes");
    const cu_pass *ps = pass == FA_PASS_FORWARD ? &p->fwd : &p->bwd;
    *bytes = 0;
    FA_CHECK(fa_cuda_push(p->ctx));
    fa_status st = FA_SUCCESS;
    for (int i = 0; i < ps->spec.nkernels; i++) {
        int stat = 0;
        CUresult r = cu()->cuFuncGetAttribute(&stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, ps->fn[i]);
        if (r != CUDA_SUCCESS) {
            st = fa_cuda_error(r, "cuFuncGetAttribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)");
            break;
        }
        size_t total = (size_t)stat + ps->spec.kernels[i].smem;
        if (total > *bytes) *bytes = total;
    }
    fa_cuda_pop();
    return st;
}

/* ------------------------------------------------------------------------ */
/* Compiling without a device (tests, tools)                                 */

static fa_status compile_passes(const fa_attention_desc *desc, const fa_plan_info *info, int passes, int cc_major,
                                int cc_minor, fa_cuda_kernel_report *reports, int max_reports, int *count) {
    if (!desc || !info || !count) return fa_fail(FA_ERR_NULL_POINTER, "desc, info or count is NULL");
    *count = 0;
    cu_program_spec specs[2];
    if (desc->kv_cache || fa_desc_is_fp8(desc)) passes = 1; /* a KV-cache plan has no backward, nor fp8 inputs */
    FA_CHECK(forward_spec(desc, &info->forward, cc_major, cc_minor, &specs[0]));
    if (passes > 1) FA_CHECK(backward_spec(desc, &info->backward, cc_major, cc_minor, &specs[1]));
    for (int s = 0; s < passes; s++) {
        fa_cuda_binary bin;
        FA_CHECK(compile_program(&specs[s], cc_major, cc_minor, &bin));
        for (int i = 0; i < specs[s].nkernels; i++) {
            if (*count < max_reports && reports) {
                fa_cuda_kernel_report *rep = &reports[*count];
                *rep = bin.reports[i];
                rep->pass = s == 0 ? FA_PASS_FORWARD : FA_PASS_BACKWARD;
                rep->threads = specs[s].kernels[i].threads;
                rep->shared_bytes = specs[s].kernels[i].smem;
                rep->tensor_cores = specs[s].tensor_cores;
            }
            (*count)++;
        }
        fa_cuda_binary_free(&bin);
    }
    return FA_SUCCESS;
}

fa_status fa_cuda_compile_plan(const fa_attention_desc *desc, const fa_plan_info *info, int cc_major, int cc_minor,
                               fa_cuda_kernel_report *reports, int max_reports, int *count) {
    return compile_passes(desc, info, 2, cc_major, cc_minor, reports, max_reports, count);
}

fa_status fa_cuda_compile_forward(const fa_attention_desc *desc, const fa_plan_info *info, int cc_major,
                                  int cc_minor, fa_cuda_kernel_report *reports, int max_reports, int *count) {
    return compile_passes(desc, info, 1, cc_major, cc_minor, reports, max_reports, count);
}
