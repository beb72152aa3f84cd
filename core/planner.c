/* The planner (GUIDE section 3): tile shape, work-group layout, key splits
 * and pipeline stages of each pass for a described device, with the IO
 * model's predicted cost. Plain C: no vendor headers, no randomness, no
 * timing, no global state, so the same problem on the same device always
 * gets the same plan.
 *
 * How a pass is planned
 * ---------------------
 * 1. The tile family: OpenCL plans MMA tiles for fp16/bf16 on a device
 *    whose matrix units its fragment layer reaches (planner_cl_mma.c: the
 *    tiles' geometry is its own), SIMT tiles otherwise, for the SIMT
 *    kernels and for the streaming ones (FA_VARIANT_SIMT_STREAM, below),
 *    and where no MMA tile fits; CUDA plans MMA tiles for fp16/bf16 (fp32 with
 *    allow_tf32) on a device with matrix units, SIMT otherwise, and on sm_90
 *    plans fp16/bf16 for warpgroup MMA first (WGMMA, below), MMA where
 *    none of its tiles fits; HIP plans MMA tiles for fp16/bf16 where a
 *    layer of its matrix-core kernels runs the device's matrix units
 *    (planner_hip_mma.c: NVIDIA through the mapping, CDNA, RDNA3), SIMT
 *    otherwise; the CPU reference plans SIMT. A forward pass whose smallest tiles (8 rows)
 *    still leave compute units idle, over keys long enough to split
 *    (decoding), plans SIMT tiles with and without key splits (SPLITK).
 * 2. Candidates: br, bc in {128, 64, 32, 16, 8}, thread_rows and
 *    thread_cols in {1, 2, 4, 8} (MMA: the accumulator fragments' shape,
 *    mma_micro_tile_ok), stages 1 (SIMT: OpenCL has no asynchronous
 *    copy it can rely on) or 1 and 2 (MMA), filtered by the work-group limit,
 *    whole SIMD groups, the register budget and local memory; OpenCL's
 *    matrix-unit candidates also by their layout's preference
 *    (fa_cl_mma_preferred: NVIDIA's forward in four sub-groups at most,
 *    measured faster than the tiles the order below would take), and
 *    HIP's by their layer's (fa_hip_mma_preferred: NVIDIA's backward in
 *    four wavefronts at head_dim 64 and below).
 * 3. The choice: a candidate is adequate when its work-groups cover the
 *    compute units (or, where no candidate can, come as close as the best
 *    candidate in the family). Among adequate candidates the fewest predicted
 *    HBM bytes win; then the smallest predicted roofline time (the IO model's,
 *    whose compute time carries the tail effect of the last wave and, for
 *    SIMT, the local-memory reads each micro-tile needs per FMA); then the
 *    least compute time (the least work wasted on padded tile rows); then full
 *    SIMD groups; then larger br, larger bc, more stages, fewer thread_rows,
 *    fewer thread_cols, less local memory.
 *
 * Why bytes before time: it makes the planner monotone in local memory. The
 * adequacy test does not depend on local memory, and within a family the
 * smallest tile (8 x 8 for SIMT, the matrix shape for MMA) needs the least
 * local memory and launches the most work-groups, so whenever any candidate
 * fits, an adequate one fits. More local memory therefore only adds
 * candidates to the adequate set, and the fewest bytes over a larger set are
 * never more: a device with more local memory is never predicted to move
 * more bytes. This holds for devices whose 8 x 8 tile has a valid layout
 * (max_work_group_size >= 32 with a power-of-two SIMD width), within a
 * family: where no matrix-unit tile fits, a pass falls back to the SIMT
 * family, and on OpenCL its streaming tiles can move fewer bytes in that
 * little memory than the first matrix-unit tiles that fit in more. */
#include "planner.h"

#include "checked.h"
#include "desc.h"
#include "fa_internal.h"
#include "plan_data.h"
#include "planner_cl_mma.h"
#include "planner_decode.h"
#include "planner_hip_mma.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FA_MAX_SPLITS 128
/* Registers: scores per work-item, and fp32 accumulators per work-item. */
#define FA_MAX_THREAD_TILE 32
#define FA_SIMT_MAX_ACCUMULATORS 64
#define FA_MMA_MAX_ACCUMULATORS 128
/* Decoding splits keys when they span at least this many of the largest key
 * tiles, so every candidate gets two splits of two tiles or more. */
#define FA_SPLIT_MIN_KEY_TILES 4
/* Drivers keep a few bytes of a work-group's local memory for themselves
 * (NVIDIA's OpenCL: 4), so a kernel declaring the full reported size fails
 * to launch; plans leave this much unused. */
#define FA_LOCAL_MEM_RESERVE 256

static size_t usable_local_mem(const fa_device_desc *dev) {
    return dev->local_mem_bytes > FA_LOCAL_MEM_RESERVE ? dev->local_mem_bytes - FA_LOCAL_MEM_RESERVE : 0;
}

size_t fa_plan_usable_local_mem(const fa_device_desc *dev) { return dev ? usable_local_mem(dev) : 0; }

/* HIP's SIMT kernels declare their tiles statically. Through the mapping
 * on NVIDIA (an "sm_*" architecture) CUDA caps static shared memory at 48
 * KiB a block, below the opt-in size the device reports for the dynamic
 * tiles of the matrix-core kernels. */
#define FA_CUDA_STATIC_SHARED ((size_t)48 * 1024)

static size_t variant_local_mem(const fa_device_desc *dev, fa_variant variant) {
    const size_t usable = usable_local_mem(dev);
    if (dev->backend != FA_BACKEND_HIP || variant == FA_VARIANT_MMA || strncmp(dev->arch, "sm_", 3) != 0)
        return usable;
    const size_t cap = FA_CUDA_STATIC_SHARED - FA_LOCAL_MEM_RESERVE;
    return usable < cap ? usable : cap;
}

size_t fa_plan_variant_local_mem(const fa_device_desc *dev, fa_variant variant) {
    return dev ? variant_local_mem(dev, variant) : 0;
}

/* OpenCL's matrix-unit plans take their geometry from planner_cl_mma.c. */
static int cl_mma(const fa_device_desc *dev, fa_variant variant) {
    return variant == FA_VARIANT_MMA && dev->backend == FA_BACKEND_OPENCL;
}

static const int tile_sizes[] = {128, 64, 32, 16, 8};
static const int thread_sizes[] = {1, 2, 4, 8};
/* MMA micro-tiles (mma_micro_tile_ok) reach a quarter of a 128-wide tile. */
static const int mma_thread_sizes[] = {1, 2, 4, 8, 16, 32};
/* HIP's reach half of it (a lane of a 32x32 MFMA holds 16 of 32 keys). */
static const int hip_mma_thread_sizes[] = {1, 2, 4, 8, 16, 32, 64};
/* OpenCL's the whole of it (a lane of Intel's DPAS layer holds a row). */
static const int cl_mma_thread_sizes[] = {1, 2, 4, 8, 16, 32, 64, 128};

/* HIP's matrix-core plans take their geometry from planner_hip_mma.c. */
static int hip_mma(const fa_device_desc *dev, fa_variant variant) {
    return variant == FA_VARIANT_MMA && dev->backend == FA_BACKEND_HIP;
}

int fa_variant_on_matrix_units(fa_variant variant) {
    return variant == FA_VARIANT_MMA || variant == FA_VARIANT_WGMMA || variant == FA_VARIANT_WGMMA_TMA ||
           variant == FA_VARIANT_DECODE;
}

int fa_cl_dq_accumulates(fa_variant variant) {
    return variant == FA_VARIANT_SIMT_STREAM || variant == FA_VARIANT_MMA;
}

static const int *micro_tile_sizes(const fa_device_desc *dev, fa_variant variant, size_t *count) {
    if (hip_mma(dev, variant)) {
        *count = FA_ARRAY_SIZE(hip_mma_thread_sizes);
        return hip_mma_thread_sizes;
    }
    if (cl_mma(dev, variant)) {
        *count = FA_ARRAY_SIZE(cl_mma_thread_sizes);
        return cl_mma_thread_sizes;
    }
    if (fa_variant_on_matrix_units(variant)) {
        *count = FA_ARRAY_SIZE(mma_thread_sizes);
        return mma_thread_sizes;
    }
    *count = FA_ARRAY_SIZE(thread_sizes);
    return thread_sizes;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Streaming SIMT tiles
 * --------------------
 * The SIMT kernels hold whole-head_dim fp32 tiles of Q, K and V in local
 * memory, so at head_dim 128 in 48 KiB only tiny tiles fit. The streaming
 * kernels hold one br x bc tile of scores (probabilities, dS) and stream
 * the operands through local memory in chunks:
 *   A  the products over head_dim (S = Q K^T, and dP = dO V^T backward) in
 *      chunks of dc dimensions: dc x (br + bc) words per operand pair;
 *   R  the products over the tile (O += P V, dV += P^T dO, dK += dS^T Q,
 *      dQ += dS K) in chunks of whole rows of one head_dim-wide operand.
 * The work-group's own operand (Q forward, K and V backward) is read again
 * from global memory for every tile: the same few kilobytes each time,
 * served by the cache, which costs less than the registers holding it would
 * take from the accumulators. The loads of the next chunk are issued into
 * registers before the current chunk is computed, so their latency hides
 * behind it.
 * A, and the tile with R, are never live together and share their words;
 * the backward adds L and D of the query tile. The kernels derive the same
 * chunk sizes from the tile shape with the preprocessor (FA_ROWS_OF in
 * kernels_cl/common.h, DC in fwd.cl and bwd.cl). */
#define FA_STREAM_ROW_WORDS 2048   /* one chunk of R: rows x head_dim words */
#define FA_STREAM_A_FLOOR 8192     /* A may take this many words where the tile and R take fewer */

typedef struct stream_geometry {
    int dc;                        /* head dimensions per chunk of A */
    size_t a_words, tr_words, extra_words;
    int r_units;                   /* 8-word loads per chunk of R */
} stream_geometry;

/* Rows of a head_dim-wide operand per chunk of R: the whole side when it is
 * small (or not a power of two), else the largest power of two within
 * FA_STREAM_ROW_WORDS, which divides the side. */
static int stream_rows(int side, int d) {
    if ((int64_t)side * d <= FA_STREAM_ROW_WORDS || (side & (side - 1)) != 0) return side;
    int rows = 1;
    while (rows * 2 * d <= FA_STREAM_ROW_WORDS) rows *= 2;
    return rows;
}

static stream_geometry stream_geom(fa_pass pass, int d, int br, int bc) {
    stream_geometry g;
    const int ops = pass == FA_PASS_FORWARD ? 1 : 2;
    int rows = stream_rows(bc, d);
    if (pass == FA_PASS_BACKWARD && stream_rows(br, d) > rows) rows = stream_rows(br, d);
    /* The tile is padded to 8 words so that R starts aligned for vectors. */
    const size_t t = ((size_t)br * (size_t)bc + 7) / 8 * 8, r = (size_t)rows * (size_t)d;
    const size_t limit = t + r > FA_STREAM_A_FLOOR ? t + r : FA_STREAM_A_FLOOR;
    static const int chunks[] = {64, 32, 16};
    g.dc = 8;
    for (size_t i = 0; i < FA_ARRAY_SIZE(chunks); i++)
        if (d % chunks[i] == 0 && (size_t)ops * (size_t)chunks[i] * (size_t)(br + bc) <= limit) {
            g.dc = chunks[i];
            break;
        }
    g.a_words = (size_t)ops * (size_t)g.dc * (size_t)(br + bc);
    g.tr_words = t + r;
    g.extra_words = pass == FA_PASS_BACKWARD ? 2 * (size_t)br : 0;
    g.r_units = rows * (d / 8);
    return g;
}

size_t fa_mma_tile_bytes(size_t rows, size_t width_bytes) {
    /* Rows padded by one 16-byte chunk. */
    return rows * (width_bytes + 16);
}

int fa_tma_head_dim(const fa_attention_desc *desc) { return desc ? (desc->head_dim + 63) / 64 * 64 : 0; }

int fa_tma_bwd_head_dim(const fa_attention_desc *desc) {
    if (!desc) return 0;
    const int d = desc->head_dim;
    return d <= 64 ? 64 : d == 96 ? 96 : d <= 128 ? 128 : d <= 192 ? 192 : 256;
}

fa_attention_desc fa_tma_bwd_desc(const fa_attention_desc *desc) {
    fa_attention_desc built = *desc;
    built.head_dim = fa_tma_bwd_head_dim(desc);
    return built;
}

int fa_fp8_vt_global(const fa_attention_desc *desc, int bc) {
    if (!desc || !fa_desc_is_fp8(desc) || bc != 128) return 0;
    const char *env = getenv("FLASHATTN_FP8_VT");
    return !(env && strcmp(env, "transposers") == 0);
}

fa_status fa_fp8_vt_size(const fa_attention_desc *desc, int64_t *keys_pad, size_t *bytes) {
    *keys_pad = ((int64_t)desc->seqlen_k + 127) / 128 * 128;
    FA_CHECK(fa_workspace_bytes("V^T of fp8 inputs",
                                (size_t[]){(size_t)desc->batch, (size_t)desc->heads_kv, (size_t)desc->head_dim,
                                           (size_t)*keys_pad},
                                4, bytes));
    /* The tensor map steps over (KV head, sequence): its largest stride. */
    if ((double)desc->heads_kv * desc->head_dim * (double)*keys_pad >= (double)FA_TMA_MAX_STRIDE)
        return fa_fail(FA_ERR_UNSUPPORTED, "fp8 inputs: V^T of %d KV heads x %d x %lld keys exceeds a tensor map's "
                       "strides (2^40 bytes a sequence)",
                       desc->heads_kv, desc->head_dim, (long long)*keys_pad);
    return FA_SUCCESS;
}

/* Measured on an H200 (bench/results/h200.md, 2026-11-28 fourth and fifth
 * sessions): 1.037x cuDNN over fp16 and bf16, d128 non-causal, N 2k-16k,
 * where adding each step's own dQ ran 0.915x (the warpgroup in turn had
 * waited for the other's dS^T of the same step); causal 0.94 -> 1.06x at
 * N 4k and 16k. Not with a window (spills). */
int fa_tma_bwd_dq_lag(const fa_attention_desc *desc, int bc) {
    /* The kernel keeps the last step as (head in the group) * (query
     * tiles) + tile in an int. */
    const int64_t tiles = desc ? ((int64_t)desc->seqlen_q + 63) / 64 : 0;
    return desc && bc == 128 && desc->head_dim > 64 && !desc->deterministic && !fa_desc_has_window(desc) &&
           desc->heads_kv > 0 && (int64_t)(desc->heads_q / desc->heads_kv) * tiles <= INT_MAX;
}

size_t fa_plan_local_mem(fa_variant variant, fa_pass pass, const fa_attention_desc *desc, int br, int bc,
                         int stages) {
    if (!desc || br <= 0 || bc <= 0 || desc->head_dim <= 0) return 0;
    const size_t d = (size_t)desc->head_dim, r = (size_t)br, c = (size_t)bc;
    const size_t st = stages > 1 ? (size_t)stages : 1;
    const size_t e = desc->q.dtype == FA_DTYPE_F32 ? 4 : 2;
    if (variant == FA_VARIANT_SIMT_STREAM) {
        const stream_geometry g = stream_geom(pass, desc->head_dim, br, bc);
        return 4 * ((g.a_words > g.tr_words ? g.a_words : g.tr_words) + g.extra_words);
    }
    switch (variant) {
    case FA_VARIANT_STANDARD:
        return 0;
    case FA_VARIANT_DECODE:
        return pass == FA_PASS_FORWARD ? fa_decode_local_mem(desc, br, stages) : 0;
    case FA_VARIANT_MMA:
        /* kernels_cuda/fwd_mma.cu: Q, and K and V per stage. */
        if (pass == FA_PASS_FORWARD) return fa_mma_tile_bytes(r, e * d) + st * 2 * fa_mma_tile_bytes(c, e * d);
        /* kernels_cuda/bwd_mma.cu: K and V; Q, dO, L and D per stage; dS,
         * and P where warps share key strips. */
        return 2 * fa_mma_tile_bytes(c, e * d) + st * 2 * fa_mma_tile_bytes(r, e * d) +
               (fa_mma_bwd_dk_split(desc) > 1 ? 2 : 1) * fa_mma_tile_bytes(c, e * r) + 4 * 2 * st * r;
    case FA_VARIANT_WGMMA:
        /* fwd_mma.cu built with WGMMA: Q, and K and V per stage, unpadded
         * (kernels_cuda/wgmma.cuh). */
        if (pass == FA_PASS_FORWARD) return e * d * (r + st * 2 * c);
        /* bwd_mma.cu built with WGMMA: K and V; Q, dO, L and D per stage;
         * dS, all unpadded. */
        return e * (d * (2 * c + st * 2 * r) + c * r) + 4 * 2 * st * r;
    case FA_VARIANT_WGMMA_TMA:
        /* kernels_cuda/fwd_tma.cu: Q, K and V per stage as WGMMA's, then a
         * full and an empty transaction barrier per stage and tile, one for Q.
         * Built with FP8: rows of whole 128-byte lines (128 e4m3 head
         * dimensions), V^T per stage (a head dimension a row of whole lines
         * of keys), O in its own tile, a second full and empty barrier for
         * V^T. */
        if (pass == FA_PASS_FORWARD && fa_desc_is_fp8(desc)) {
            const size_t line = (d + 127) / 128 * 128, vt_line = (c + 127) / 128 * 128;
            const size_t o_tile = r * d * fa_dtype_size(desc->o.dtype);
            /* VT_GLOBAL: V^T stages in place of V's, no V^T barriers. */
            if (fa_fp8_vt_global(desc, bc)) return r * line + st * (c * line + d * vt_line) + o_tile + 8 * (1 + 4 * st);
            return r * line + st * (2 * c * line + d * vt_line) + o_tile + 8 * (1 + 6 * st);
        }
        if (pass == FA_PASS_FORWARD) {
            const size_t dp = (size_t)fa_tma_head_dim(desc);
            return e * dp * (r + st * 2 * c) + 8 * (1 + 4 * st);
        }
        /* bwd_mma.cu built with TMA, for the padded head_dim where it runs
         * padded (fa_tma_bwd_head_dim): WGMMA's tiles with two dS^T (three
         * where each step's dQ is added during the next), then a full and
         * an empty barrier per stage, one for K and V, four for dQ's rows;
         * with two consumer warpgroups above head_dim 64, the dQ tile the
         * bulk reductions read (rows padded by 8 floats, 16-byte aligned). */
        {
            const fa_attention_desc padded = fa_tma_bwd_desc(desc);
            /* 96: tiles of two 128-byte lines a row, like 128's */
            const size_t dp = (size_t)padded.head_dim, dl = (dp + 63) / 64 * 64;
            return e * (dl * (2 * c + st * 2 * r) + (fa_tma_bwd_dq_lag(&padded, bc) ? 3 : 2) * c * r) +
                   4 * 2 * st * r + 8 * (5 + 2 * st) + (c == 128 && dp > 64 ? 16 + 4 * r * (dp + 8) : 0) +
                   (dp > 128 ? 2 * e * c * r : 0); /* 192, 256: two P^T tiles (DK_SPLIT 2, as the host builds it) */
        }
    case FA_VARIANT_SIMT:
    case FA_VARIANT_SPLITK:
    default:
        /* fp32 tiles: SIMT kernels convert on load. */
        if (pass == FA_PASS_FORWARD) return 4 * (r * d + st * 2 * c * d + r * c);
        return 4 * (2 * c * d + 2 * r * d + 2 * r * c + 2 * r);
    }
}

/* ------------------------------------------------------------------------ */
/* Device description                                                       */

static fa_status check_device(const fa_device_desc *dev) {
    if ((int)dev->backend < 0 || dev->backend >= FA_BACKEND_COUNT)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "device->backend = %d is not a fa_backend", (int)dev->backend);
    if ((int)dev->type < FA_DEVICE_CPU || (int)dev->type > FA_DEVICE_ACCELERATOR)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "device->type = %d is not a fa_device_type", (int)dev->type);
    /* A negative size converted to size_t lands in the upper half. */
    if (dev->local_mem_bytes == 0 || dev->local_mem_bytes > SIZE_MAX / 2)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "device->local_mem_bytes = %zu, must be > 0 (and not negative)",
                       dev->local_mem_bytes);
    const struct {
        int value;
        const char *name;
    } ints[] = {{dev->max_work_group_size, "max_work_group_size"},
                {dev->simd_width, "simd_width"},
                {dev->compute_units, "compute_units"},
                {dev->clock_mhz, "clock_mhz"}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(ints); i++)
        if (ints[i].value <= 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "device->%s = %d, must be > 0", ints[i].name, ints[i].value);
    if (!isfinite(dev->bandwidth_gbs) || !(dev->bandwidth_gbs > 0.0))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "device->bandwidth_gbs = %g, must be finite and > 0",
                       dev->bandwidth_gbs);
    if (!isfinite(dev->fp32_flops_per_clock_cu) || !(dev->fp32_flops_per_clock_cu > 0.0))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "device->fp32_flops_per_clock_cu = %g, must be finite and > 0",
                       dev->fp32_flops_per_clock_cu);
    if (!isfinite(dev->matrix_flops_per_clock_cu) || dev->matrix_flops_per_clock_cu < 0.0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "device->matrix_flops_per_clock_cu = %g, must be finite and >= 0 (0: no matrix units)",
                       dev->matrix_flops_per_clock_cu);
    if (dev->matrix_m < 0 || dev->matrix_n < 0 || dev->matrix_k < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "device->matrix_m/n/k = %d/%d/%d, must be >= 0 (0: none)",
                       dev->matrix_m, dev->matrix_n, dev->matrix_k);
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Candidates                                                               */

typedef enum family {
    FAMILY_SIMT,
    FAMILY_MMA,
    FAMILY_WGMMA, /* sm_90; FAMILY_MMA where no tile fits */
    FAMILY_DECODE /* SIMT tiles, with and without key splits */
} family;

typedef struct candidate {
    fa_variant variant;
    int br, bc, tr, tc, stages, split, wgs;
    int64_t groups;
    size_t local_mem;
    int inadequate, partial_simd;
    fa_cost cost;
} candidate;

static int has_matrix_units(const fa_device_desc *dev) {
    return dev->matrix_flops_per_clock_cu > 0.0 && dev->matrix_m > 0 && dev->matrix_n > 0 && dev->matrix_k > 0;
}

static family base_family(const fa_device_desc *dev, const fa_attention_desc *desc) {
    if (fa_cl_mma_applies(dev, desc)) return FAMILY_MMA;
    if (fa_hip_mma_applies(dev, desc)) return FAMILY_MMA;
    if (dev->backend != FA_BACKEND_CUDA || !has_matrix_units(dev)) return FAMILY_SIMT;
    fa_dtype t = desc->q.dtype;
    if (t == FA_DTYPE_F16 || t == FA_DTYPE_BF16 || (t == FA_DTYPE_F32 && desc->allow_tf32)) return FAMILY_MMA;
    return FAMILY_SIMT;
}

static int decoding(const fa_device_desc *dev, const fa_attention_desc *desc) {
    int64_t most_groups = (int64_t)desc->batch * desc->heads_q * ceil_div(desc->seqlen_q, 8);
    return most_groups < dev->compute_units &&
           desc->seqlen_k >= FA_SPLIT_MIN_KEY_TILES * tile_sizes[0];
}

/* Divisibility the matrix instructions need (m x n x k):
 * forward S = Q K^T (br x bc over d), O = P V (br x d over bc);
 * backward adds dV = P^T dO and dK = dS^T Q (bc x d over br). */
static int mma_tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc) {
    const int m = dev->matrix_m, n = dev->matrix_n, k = dev->matrix_k, d = desc->head_dim;
    if (d % k || d % n || br % m || bc % n || bc % k) return 0;
    if (pass == FA_PASS_BACKWARD && (bc % m || br % k)) return 0;
    return 1;
}

/* The tensor-core kernels (kernels_cuda/fwd_mma.cu, bwd_mma.cu): 4 or 8
 * whole warps, each owning one or two strips of matrix_m rows of the tile
 * (query rows forward, key rows backward) and holding, per thread, fp32
 * accumulators for its strips: forward the output (d / 2 per strip) and the
 * scores (bc / 2); backward dK and dV (d per strip) and the transposed
 * scores and their gradient (br per strip), which also feed the next
 * products as operands (half as many registers again in fp16/bf16, three
 * times as many on TF32). The budgets keep all that within the 255 registers a
 * thread has, with room for addresses: the kernels compile without
 * spilling (tests/test_cuda_compile.c checks every shape planned here). */
#define FA_MMA_MAX_STRIPS 2
#define FA_MMA_FWD_REGS 192
#define FA_MMA_FWD_REGS_TWO_STAGES 160
#define FA_MMA_FWD_REGS_TF32 136
#define FA_MMA_BWD_REGS_16 176
/* On sm_90 the dQ update is one vector reduction per pair (bwd_mma.cu
 * red_add2), and 64 x 128 tiles at head_dim 128 (four warps of 2 x 16
 * keys at 64) compile without spilling: the budget there is this, for
 * problems without dropout, windows, block masks or varlen (their bounds
 * and Philox state take the registers the larger tile would use) whose
 * rows are whole 128-byte lines: at head_dim 96 (192-byte rows) the
 * 64 x 128 tile spilled 12 bytes, three thread indices kept across the
 * step loop. A calibration against NVRTC 13.0, like the budgets above. */
#define FA_MMA_BWD_REGS_16_SM90 224
/* Query tiles double-buffered in the backward only up to this many
 * elements per tile: each stage's copies take address registers. Under
 * the sm_90 budget above, 64 x 128 at head_dim 128 compiled without spills
 * in two stages (254 registers, 255 causal; NVRTC 13.0) and ran 239
 * TFLOP/s against one stage's 223 on an H200 (fp16, N = 8192,
 * bench/results/h200.md). */
#define FA_MMA_BWD_TWO_STAGE_ELEMS 4096
#define FA_MMA_BWD_TWO_STAGE_ELEMS_SM90 8192
#define FA_MMA_BWD_REGS_TF32 192
#define FA_MMA_MIN_OTHER 32

/* Whether a strip count and the tile's other side (bc forward, br
 * backward) fit the register budgets. */
/* 90 for "sm_90", 0 where the device names no CUDA architecture. */
static int sm_version(const fa_device_desc *dev) {
    int v = 0;
    if (strncmp(dev->arch, "sm_", 3) != 0) return 0;
    for (const char *c = dev->arch + 3; *c >= '0' && *c <= '9'; c++) v = 10 * v + (*c - '0');
    return v;
}

/* fp16/bf16 problems without the options that take registers (dropout's
 * Philox state, windows', block masks' and varlen's bounds, the additive
 * bias's loads: a value a score in flight) whose rows are whole 128-byte
 * lines: FA_MMA_BWD_REGS_16_SM90 and FA_WGMMA_TWO_BLOCK_ACC hold for these
 * only. Softcap and ALiBi (a few factors a head) leave them lean. */
static int lean_16bit(const fa_attention_desc *desc) {
    return desc->q.dtype != FA_DTYPE_F32 && desc->dropout_p == 0.0f && !fa_desc_has_window(desc) &&
           !desc->block_mask && !desc->cu_seqlens_q && desc->bias_batch == 0 && desc->head_dim * 2 % 128 == 0;
}

static int bwd_lean_sm90(const fa_device_desc *dev, const fa_attention_desc *desc) {
    return sm_version(dev) >= 90 && lean_16bit(desc);
}

/* Above this head dimension fp16/bf16 backward warps share key strips
 * (fa_mma_bwd_dk_split): one warp's dK and dV of a strip (d fp32 a
 * thread) would not fit beside the scores. */
#define FA_MMA_BWD_MAX_UNSPLIT_DIM 128

int fa_mma_bwd_dk_split(const fa_attention_desc *desc) {
    if (!desc || desc->q.dtype == FA_DTYPE_F32 || desc->head_dim <= FA_MMA_BWD_MAX_UNSPLIT_DIM) return 1;
    /* Each warp's share of the head dimensions is whole pairs of 8-column
     * n-tiles (the products' B operands come two at a time). */
    for (int split = 2; split <= 4; split *= 2)
        if (desc->head_dim <= split * FA_MMA_BWD_MAX_UNSPLIT_DIM && desc->head_dim % (16 * split) == 0) return split;
    return 1;
}

/* The forward's scores as a thread holds them, bc / 2 a strip, twice over
 * with score options: a bias's values are loaded a score at a time, a
 * tile's all in flight, and softcap and ALiBi keep a tanh and a distance a
 * score while it turns into its logit. NVRTC 13.0, sm_80: 128 x 64 in two
 * strips spilled 300 bytes at head_dim 128 with a bias, 12 with softcap and
 * ALiBi beside a window and a block mask, and 52 at head_dim 96 with those
 * and dropout; 128 x 128 at 64 spilled 8 with softcap and ALiBi; what this
 * leaves (128 x 32 and 64 x 64 at 128, 128 x 64 at 64 in one stage)
 * compiled clean with all three beside every mask and dropout. */
static int fwd_score_regs(const fa_attention_desc *desc, int bc) { return fa_desc_option_in_use(desc) ? 2 * bc : bc; }
/* Forward key tiles with score options are at most this wide (the 8 bytes
 * at 128 x 128 above). */
#define FA_MMA_FWD_BC_OPTIONS 64

static int mma_regs_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int strips,
                       int other) {
    const int d = desc->head_dim;
    if (pass == FA_PASS_FORWARD) {
        if (fa_desc_option_in_use(desc) && other > FA_MMA_FWD_BC_OPTIONS) return 0;
        return strips * (d + fwd_score_regs(desc, other)) / 2 <=
               (desc->q.dtype == FA_DTYPE_F32 ? FA_MMA_FWD_REGS_TF32 : FA_MMA_FWD_REGS);
    }
    const int split = fa_mma_bwd_dk_split(desc);
    if (split > 1) {
        /* A warp's share of a strip: d / split accumulators of dK and dV
         * and other / split of the scores and their gradient, a thread;
         * the operands come from shared memory one k16 step at a time. */
        if (strips * d / split > FA_MMA_MAX_ACCUMULATORS || other % (16 * split)) return 0;
        /* Weighted as below although the P and dS operands no longer stay
         * in registers, and without the sm_90 allowance: at head_dim 192
         * with dropout 128 x 64 tiles, which (d + br) / split alone admits,
         * spilled 24 bytes on sm_90, and so did 128 x 32 at 256 without
         * options, which the sm_90 budget admits (NVRTC 13.0). */
        return strips * (2 * d + 3 * other) <= 2 * split * FA_MMA_BWD_REGS_16;
    }
    if (strips * d > FA_MMA_MAX_ACCUMULATORS) return 0;
    if (desc->q.dtype == FA_DTYPE_F32) return strips * (d + 4 * other) <= FA_MMA_BWD_REGS_TF32;
    const int budget = bwd_lean_sm90(dev, desc) ? FA_MMA_BWD_REGS_16_SM90 : FA_MMA_BWD_REGS_16;
    return strips * (2 * d + 3 * other) <= 2 * budget;
}

static int mma_layout_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                         int wgs) {
    const int simd = dev->simd_width, d = desc->head_dim;
    if (wgs < simd || wgs % simd) return 0;
    const int warps = wgs / simd;
    if (warps != 4 && warps != 8) return 0;
    const int rows = pass == FA_PASS_FORWARD ? br : bc;
    const int key_warps = pass == FA_PASS_FORWARD ? warps : warps / fa_mma_bwd_dk_split(desc);
    if (key_warps < 1 || rows % (dev->matrix_m * key_warps)) return 0;
    const int strips = rows / (dev->matrix_m * key_warps);
    if (strips > FA_MMA_MAX_STRIPS) return 0;
    /* Forward: two strips a warp halve the shared-memory reads per matrix
     * product, and four warps of two strips ran faster on an H200 than
     * eight of one at head_dim 64 and 128; eight warps only where the
     * output accumulators leave no room for two strips. */
    if (pass == FA_PASS_FORWARD && warps == 8 && d <= 128) return 0;
    /* Backward at head_dim 64 and below: four warps of 64 keys ran faster
     * on an H200 than eight of 128 (161 against 150 TFLOP/s, bf16, 8k). */
    if (pass == FA_PASS_BACKWARD && warps == 8 && d <= 64) return 0;
    /* The tile's other side (keys forward, queries backward) is 32 or more
     * wherever the registers of one strip a warp allow it: narrower tiles
     * read fewer masked rows but pay the per-tile work (rescale, barriers,
     * loads) more often. */
    const int other = pass == FA_PASS_FORWARD ? bc : br;
    if (other < FA_MMA_MIN_OTHER && mma_regs_ok(dev, desc, pass, 1, FA_MMA_MIN_OTHER)) return 0;
    return mma_regs_ok(dev, desc, pass, strips, other);
}

/* Warpgroup MMA (wgmma, sm_90 only: later architectures replace it) runs
 * the forward's products from shared memory in 64-row instructions: each
 * warpgroup owns 64 query rows, one 16-row strip a warp, so the micro-tile
 * is the MMA one of a single strip (tr = 2, tc = bc / 4). Its operands are
 * laid out in 128-byte swizzled lines of 64 head dimensions (fp16/bf16,
 * head_dim a multiple of 64), and its key tiles are 16 to 128 wide. Per
 * thread it holds the output (d / 2) and the scores (bc / 2) in fp32: up to
 * FA_WGMMA_FWD_REGS of them compiled without spilling (NVRTC 13.0: 200
 * registers at head_dim 256 with 64-key tiles, 254 at 128 x 128 with every
 * option; tests/test_cuda_compile.c checks each shape planned here). */
#define FA_WGMMA_FWD_REGS 160
/* Two blocks on one SM (where their shared memory fits too) let one
 * block's softmax run beside the other's
 * products (its own warpgroups wait for each other at every key tile):
 * on an H200 (fp16, N = 8192, bench/results/h200.md) 128 x 64 at head_dim
 * 128 ran 469 TFLOP/s in two blocks against 337 in one, 128 x 128 at 64
 * 400 against 281. Two blocks of 256 threads leave 128 registers a thread:
 * lean problems (lean_16bit) compiled without spilling there up to this
 * many accumulators (NVRTC 13.0); with every option they spilled. Where a
 * tile fits, the planner takes only such tiles. */
#define FA_WGMMA_TWO_BLOCK_ACC 96
/* Softcap and ALiBi (a tanh, a distance a score) in two blocks: at 128 x 64
 * (head_dim 64 and 128) they compiled without spilling (96-128 registers,
 * NVRTC 13.0), at 128 x 128 and head_dim 64 they spilled 8-16 bytes: two
 * blocks take them with key tiles up to this wide. */
#define FA_WGMMA_TWO_BLOCK_BC_OPTIONS 64
#define FA_WGMMA_MAX_BC 128
/* Narrower key tiles read the instruction's A operand (Q, from shared
 * memory) once per 16 keys or 32: shared memory, not the matrix units,
 * would bind. */
#define FA_WGMMA_MIN_BC 64

/* The backward (bwd_mma.cu built with WGMMA) gives each warpgroup 64 keys
 * of the tile, one 16-key strip a warp as in the MMA backward, so the
 * micro-tile is that of one strip (tr = br / 4, tc = 2), against query
 * tiles of 64 (the products' m for dQ = dS K). Per thread it holds dK and
 * dV (d) and the transposed scores and their gradient (br) in fp32: at
 * head_dim 128, 192 of them compiled without spilling (NVRTC 13.0: 240
 * registers plain, up to 254 with causal masks, windows, block masks or
 * varlen); with dropout's Philox state drawn inline they spilled 36-48
 * bytes. Drawn as keep bits while the S^T and dP^T products run
 * (bwd_mma.cu keep_bits), dropout alone (deterministic or not) compiled
 * without spilling at 64 x 64 in two stages (one warpgroup; one stage
 * spilled 4-8 bytes, 64 x 128 4-20, and with a causal mask, windows,
 * block masks or varlen beside dropout 4-16; NVRTC 13.0): above
 * FA_WGMMA_BWD_ACC_DROPOUT accumulators dropout takes that shape only, and
 * the MMA backward runs the rest. */
#define FA_WGMMA_BWD_BR 64
#define FA_WGMMA_BWD_ACC 192
#define FA_WGMMA_BWD_ACC_DROPOUT 128
#define FA_WGMMA_BWD_DROPOUT_BC 64
#define FA_WGMMA_BWD_DROPOUT_STAGES 2
/* Score options in the warpgroup backward (NVRTC 13.0, head_dim 128): the
 * bias's loads beside softcap, a causal mask or a block mask spilled 4-72
 * bytes, and softcap with ALiBi beside windows, block masks or varlen 4-24
 * (alone, or under a causal mask, they fit: 252-255 registers). Above this
 * many accumulators a bias, or an option beside windows, block masks or
 * varlen, leaves the backward to the MMA kernels. */
#define FA_WGMMA_BWD_ACC_OPTIONS 128

/* Dropout beside no mask and no varlen (their bounds take registers). */
static int dropout_alone(const fa_attention_desc *desc) {
    return !desc->causal && !fa_desc_has_window(desc) && !desc->block_mask &&
           !desc->cu_seqlens_q;
}

/* Whether the warpgroup backward with dropout needs the one shape that
 * compiled without spilling (FA_WGMMA_BWD_DROPOUT_BC, _STAGES). */
static int wgmma_bwd_dropout_tight(const fa_attention_desc *desc, int br) {
    return desc->dropout_p > 0.0f && desc->head_dim + br > FA_WGMMA_BWD_ACC_DROPOUT;
}

static int wgmma_possible(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass) {
    const int max_dim = pass == FA_PASS_FORWARD ? 256 : 128;
    return dev->backend == FA_BACKEND_CUDA && sm_version(dev) == 90 && has_matrix_units(dev) &&
           (desc->q.dtype == FA_DTYPE_F16 || desc->q.dtype == FA_DTYPE_BF16) && desc->head_dim % 64 == 0 &&
           desc->head_dim <= max_dim;
}

int fa_wgmma_blocks_per_sm(const fa_attention_desc *desc, int bc) {
    if (!desc || !lean_16bit(desc) || (desc->head_dim + bc) / 2 > FA_WGMMA_TWO_BLOCK_ACC) return 1;
    return !fa_desc_option_in_use(desc) || bc <= FA_WGMMA_TWO_BLOCK_BC_OPTIONS ? 2 : 1;
}

/* Whether score options leave the warpgroup backward room at acc
 * accumulators (FA_WGMMA_BWD_ACC_OPTIONS). */
static int wgmma_bwd_options_fit(const fa_attention_desc *desc, int acc) {
    if (!fa_desc_option_in_use(desc) || acc <= FA_WGMMA_BWD_ACC_OPTIONS) return 1;
    const int bounds = fa_desc_has_window(desc) || desc->block_mask || desc->cu_seqlens_q;
    return desc->bias_batch == 0 && !bounds;
}

static int wgmma_tile_ok(const fa_attention_desc *desc, fa_pass pass, int br, int bc) {
    if (pass == FA_PASS_BACKWARD) {
        const int acc = desc->head_dim + br;
        if (br != FA_WGMMA_BWD_BR || bc % 64 || bc > FA_WGMMA_MAX_BC || acc > FA_WGMMA_BWD_ACC) return 0;
        if (!wgmma_bwd_options_fit(desc, acc)) return 0;
        return !wgmma_bwd_dropout_tight(desc, br) || (bc == FA_WGMMA_BWD_DROPOUT_BC && dropout_alone(desc));
    }
    if (br % 64 || bc % 16 || bc < FA_WGMMA_MIN_BC || bc > FA_WGMMA_MAX_BC) return 0;
    /* Two blocks an SM wherever the narrowest key tile allows them. */
    if (fa_wgmma_blocks_per_sm(desc, FA_WGMMA_MIN_BC) == 2) return fa_wgmma_blocks_per_sm(desc, bc) == 2;
    return (desc->head_dim + bc) / 2 <= FA_WGMMA_FWD_REGS;
}


static int wgmma_micro_tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br,
                               int bc, int tr, int tc) {
    const int fwd = pass == FA_PASS_FORWARD, wgs = fwd ? 2 * br : 2 * bc;
    const int layout = fwd ? tr == 2 && tc * 4 == bc : tr * 4 == br && tc == 2;
    return wgmma_tile_ok(desc, pass, br, bc) && layout && wgs <= dev->max_work_group_size && dev->simd_width == 32;
}

/* The forward's second K/V stage costs a few registers of addresses: with
 * accumulators near the budget (128 x 64 at head_dim 128) it spilled, so
 * there it runs one stage, the loads of K and V overlapping each other's
 * products (fwd_mma.cu). */
static int mma_stages_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                         int tr, int stages) {
    if (stages == 1 || desc->q.dtype == FA_DTYPE_F32) return 1;
    if (pass == FA_PASS_BACKWARD)
        return br * desc->head_dim <=
               (bwd_lean_sm90(dev, desc) ? FA_MMA_BWD_TWO_STAGE_ELEMS_SM90 : FA_MMA_BWD_TWO_STAGE_ELEMS);
    const int strips = tr / 2;
    return strips * (desc->head_dim + fwd_score_regs(desc, bc)) / 2 <= FA_MMA_FWD_REGS_TWO_STAGES;
}

/* An MMA plan's micro-tile is the scores one thread holds in the matrix
 * instructions' accumulator fragments: per strip of matrix_m rows a warp
 * owns, two rows of it and a quarter of the tile's other side (m16n8
 * fragments: lanes in groups of four share a row). Forward the strips are
 * query rows (tr = 2 * strips, tc = bc / 4); backward they are key rows
 * (tr = br / 4, tc = 2 * strips). So (br / tr) * (bc / tc) is the thread
 * count, as for SIMT plans, while the fragments, not a product cap, bound
 * the registers (mma_regs_ok). Where split warps share a key strip
 * (fa_mma_bwd_dk_split), each holds 1 / split of the queries' scores:
 * tr = br / (4 * split). */
static int mma_micro_tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                             int tr, int tc) {
    if (br % tr || bc % tc) return 0;
    const int wgs = (br / tr) * (bc / tc), simd = dev->simd_width;
    if (wgs > dev->max_work_group_size || wgs < simd || wgs % simd || dev->matrix_m <= 0) return 0;
    const int split = pass == FA_PASS_FORWARD ? 1 : fa_mma_bwd_dk_split(desc);
    const int rows = pass == FA_PASS_FORWARD ? br : bc, warps = wgs / simd;
    if (warps % split || rows % (dev->matrix_m * (warps / split))) return 0;
    const int strips = rows / (dev->matrix_m * (warps / split)), other = pass == FA_PASS_FORWARD ? bc : br;
    const int want_tr = pass == FA_PASS_FORWARD ? 2 * strips : other / (4 * split);
    const int want_tc = pass == FA_PASS_FORWARD ? other / 4 : 2 * strips;
    if (tr != want_tr || tc != want_tc) return 0;
    return mma_layout_ok(dev, desc, pass, br, bc, wgs);
}

/* Registers of a streaming work-item, in fp32 words: its micro-tile of the
 * scores (and of dP backward), its accumulators (O forward; dK and dV
 * backward, beside its share of dQ, which the dK/dV kernel sums in the
 * registers the scores no longer need) and the staged loads of one chunk.
 * Calibrated on NVIDIA's OpenCL compiler (H200, fp32, head_dim 64 and 128,
 * bench/opencl_tiles.sh): layouts up to 192 such words compiled without
 * spills in at most 255 registers (e.g. backward 64 x 64, 8 x 4 at d64:
 * 192 words, 254 registers; 128 x 64, 8 x 4 at d128: 160 words, 255
 * registers), while 512-item work-groups, capped at 128 registers, spilled
 * from 96 words. The rule: the words plus FA_STREAM_OVERHEAD registers (for
 * addresses, indices and masks) per work-item must fit one register file
 * (64 K on NVIDIA and AMD compute units), and no work-item holds more than
 * FA_STREAM_MAX_LIVE words. */
#define FA_STREAM_MAX_LIVE 192
#define FA_STREAM_OVERHEAD 64
#define FA_STREAM_REGISTER_FILE 65536

static int stream_layout_ok(const fa_attention_desc *desc, fa_pass pass, int br, int bc, int tr, int tc) {
    const int ntr = br / tr, ntc = bc / tc, wgs = ntr * ntc, d = desc->head_dim;
    const stream_geometry g = stream_geom(pass, d, br, bc);
    /* Each operand's units of a chunk of A are spread over the work-group
     * on their own (kernels_cl/common.h). */
    const int ops = pass == FA_PASS_FORWARD ? 1 : 2, dc8 = g.dc / 8;
    const int a_items = ops * (int)(ceil_div(br * dc8, wgs) + ceil_div(bc * dc8, wgs));
    const int r_items = (int)ceil_div(g.r_units, wgs);
    const int stage = 8 * (a_items > r_items ? a_items : r_items);
    /* O forward, dQ backward: tr rows x ceil(d / ntc) dimensions. */
    const int rows_acc = tr * ((d + ntc - 1) / ntc);
    if (rows_acc > FA_SIMT_MAX_ACCUMULATORS) return 0;
    int live = tr * tc + rows_acc + stage;
    if (pass == FA_PASS_BACKWARD) {
        /* dK and dV: tc keys x ceil(d / ntr) dimensions each. */
        const int keys_acc = 2 * tc * ((d + ntr - 1) / ntr);
        if (keys_acc > FA_SIMT_MAX_ACCUMULATORS) return 0;
        live = keys_acc + (2 * tr * tc > rows_acc ? 2 * tr * tc : rows_acc) + stage;
    }
    return live <= FA_STREAM_MAX_LIVE && (int64_t)(live + FA_STREAM_OVERHEAD) * wgs <= FA_STREAM_REGISTER_FILE;
}

/* A work-group of (br / tr) x (bc / tc) work-items, each holding a tr x tc
 * micro-tile of the scores. */
static int layout_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_variant variant, fa_pass pass,
                     int br, int bc, int tr, int tc) {
    if (cl_mma(dev, variant)) return fa_cl_mma_geometry_of(dev, desc, pass, br, bc, tr, tc, 1, NULL);
    if (hip_mma(dev, variant)) return fa_hip_mma_geometry_of(dev, desc, pass, br, bc, tr, tc, NULL);
    if (variant == FA_VARIANT_MMA) return mma_micro_tile_ok(dev, desc, pass, br, bc, tr, tc);
    if (variant == FA_VARIANT_WGMMA) return wgmma_micro_tile_ok(dev, desc, pass, br, bc, tr, tc);
    if (br % tr || bc % tc || tr * tc > FA_MAX_THREAD_TILE) return 0;
    const int ntr = br / tr, ntc = bc / tc, wgs = ntr * ntc, simd = dev->simd_width, d = desc->head_dim;
    if (wgs > dev->max_work_group_size) return 0;
    if (wgs >= simd && wgs % simd) return 0;
    if (variant == FA_VARIANT_SIMT_STREAM) return stream_layout_ok(desc, pass, br, bc, tr, tc);
    /* O (forward) or the dQ-side rows (backward): tr rows x ceil(d / ntc)
     * head dimensions per work-item. */
    const int dpt = (d + ntc - 1) / ntc;
    if (tr * dpt > FA_SIMT_MAX_ACCUMULATORS) return 0;
    if (pass == FA_PASS_BACKWARD) {
        /* dK and dV: ceil(bc / ntr) keys x ceil(d / ntc) dimensions each. */
        const int kpt = (bc + ntr - 1) / ntr;
        if (2 * kpt * dpt > FA_SIMT_MAX_ACCUMULATORS) return 0;
    }
    return 1;
}

int fa_plan_simt_layout_ok(const fa_device_desc *dev, const fa_attention_desc *desc, int br, int bc, int tr,
                           int tc) {
    return dev && desc && br > 0 && bc > 0 && tr > 0 && tc > 0 &&
           layout_ok(dev, desc, FA_VARIANT_SIMT, FA_PASS_FORWARD, br, bc, tr, tc);
}

static int any_layout(const fa_device_desc *dev, const fa_attention_desc *desc, fa_variant variant, fa_pass pass,
                      int br, int bc) {
    size_t n;
    const int *sizes = micro_tile_sizes(dev, variant, &n);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (layout_ok(dev, desc, variant, pass, br, bc, sizes[i], sizes[j])) return 1;
    return 0;
}

/* Key splits of a decoding candidate: enough to cover the compute units,
 * each split keeping at least two key tiles; 1 when that leaves fewer than
 * two splits. */
static int split_count(const fa_device_desc *dev, const fa_attention_desc *desc, int br, int bc) {
    int64_t groups = (int64_t)desc->batch * desc->heads_q * ceil_div(desc->seqlen_q, br);
    int64_t want = ceil_div(dev->compute_units, groups);
    int64_t room = ceil_div(desc->seqlen_k, bc) / 2;
    int64_t s = want < room ? want : room;
    if (s > FA_MAX_SPLITS) s = FA_MAX_SPLITS;
    return s >= 2 ? (int)s : 1;
}

static int64_t group_count(const fa_attention_desc *desc, fa_pass pass, int br, int bc, int split) {
    if (pass == FA_PASS_FORWARD)
        return (int64_t)desc->batch * desc->heads_q * ceil_div(desc->seqlen_q, br) * split;
    return (int64_t)desc->batch * desc->heads_kv * ceil_div(desc->seqlen_k, bc);
}

/* The variants a family tries, in a fixed order. */
/* OpenCL runs the SIMT tiles in either of two kernels (the SIMT ones and
 * the streaming ones); the model picks. */
/* The streaming kernels only where the SIMT ones' whole-head_dim tiles get
 * small. On an H200 through NVIDIA's OpenCL (fp32, 16k tokens, N = 4096,
 * bench/opencl_tiles.sh) the streaming forward ran 26.5 TFLOP/s at
 * head_dim 128 against the SIMT one's 18.5, but 24.3 at head_dim 64 against
 * 26.9; the streaming backward beat the SIMT one at both (25.0 against 8.9
 * at 128, 25.2 against 17.3 at 64). The model ranks tiles by bytes, which
 * favours the streaming kernels' larger tiles at 64 forward too; there the
 * local-memory feed, not HBM, is what binds. */
#define FA_STREAM_MIN_HEAD_DIM_FWD 96
#define FA_STREAM_MIN_HEAD_DIM_BWD 64

static int family_variants(const fa_device_desc *dev, const fa_attention_desc *desc, family fam, fa_pass pass,
                           fa_variant out[2]) {
    switch (fam) {
    case FAMILY_MMA: out[0] = FA_VARIANT_MMA; return 1;
    case FAMILY_WGMMA: out[0] = FA_VARIANT_WGMMA; return 1;
    case FAMILY_DECODE:
        if (pass == FA_PASS_FORWARD) {
            out[0] = FA_VARIANT_SPLITK;
            out[1] = FA_VARIANT_SIMT;
            return 2;
        }
        out[0] = FA_VARIANT_SIMT;
        return 1;
    case FAMILY_SIMT:
    default:
        out[0] = FA_VARIANT_SIMT;
        if (dev->backend != FA_BACKEND_OPENCL ||
            desc->head_dim < (pass == FA_PASS_FORWARD ? FA_STREAM_MIN_HEAD_DIM_FWD : FA_STREAM_MIN_HEAD_DIM_BWD))
            return 1;
        out[1] = FA_VARIANT_SIMT_STREAM;
        return 2;
    }
}

/* Tile shape valid for a variant (local memory aside); *split receives the
 * key splits (1: none). */
static int tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_variant variant, fa_pass pass,
                   int br, int bc, int *split) {
    *split = 1;
    if (cl_mma(dev, variant)) return fa_cl_mma_tile_ok(dev, desc, pass, br, bc);
    if (hip_mma(dev, variant) && !fa_hip_mma_tile_ok(dev, desc, pass, br, bc)) return 0;
    if (variant == FA_VARIANT_MMA && !hip_mma(dev, variant) && !mma_tile_ok(dev, desc, pass, br, bc)) return 0;
    if (variant == FA_VARIANT_WGMMA && !wgmma_tile_ok(desc, pass, br, bc)) return 0;
    if (variant == FA_VARIANT_SPLITK) {
        *split = split_count(dev, desc, br, bc);
        if (*split < 2) return 0;
    }
    return any_layout(dev, desc, variant, pass, br, bc);
}

static int nearly_equal(double a, double b) {
    double scale = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return fabs(a - b) <= 1e-9 * scale;
}

/* Whether a beats b (the order documented at the top of this file). */
static int better(const candidate *a, const candidate *b) {
    if (a->inadequate != b->inadequate) return a->inadequate < b->inadequate;
    double ab = a->cost.hbm_read_bytes + a->cost.hbm_write_bytes;
    double bb = b->cost.hbm_read_bytes + b->cost.hbm_write_bytes;
    if (ab != bb) return ab < bb;
    if (!nearly_equal(a->cost.roofline_ms, b->cost.roofline_ms)) return a->cost.roofline_ms < b->cost.roofline_ms;
    if (!nearly_equal(a->cost.compute_ms, b->cost.compute_ms)) return a->cost.compute_ms < b->cost.compute_ms;
    if (a->partial_simd != b->partial_simd) return a->partial_simd < b->partial_simd;
    if (a->br != b->br) return a->br > b->br;
    if (a->bc != b->bc) return a->bc > b->bc;
    if (a->stages != b->stages) return a->stages > b->stages;
    if (a->tr != b->tr) return a->tr < b->tr;
    if (a->tc != b->tc) return a->tc < b->tc;
    /* The same tiles in two kernels: the one with less local memory leaves
     * room for more work-groups per compute unit. */
    if (a->local_mem != b->local_mem) return a->local_mem < b->local_mem;
    return a->variant < b->variant;
}

static size_t workspace_bytes(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                              fa_variant variant, int split) {
    const size_t d = (size_t)desc->head_dim;
    /* Words a row: the split partials (O and L), or D and the fp32 dQ
     * accumulator where dQ is summed over key tiles (OpenCL's SIMT kernels,
     * and its streaming and matrix-unit ones in deterministic mode, compute
     * dQ in a kernel of their own instead and need D alone). */
    size_t words;
    if (pass == FA_PASS_FORWARD) {
        if (split <= 1) return 0;
        words = (size_t)split * (d + 1);
    } else if (dev->backend == FA_BACKEND_OPENCL && (!fa_cl_dq_accumulates(variant) || desc->deterministic)) {
        words = 1;
    } else {
        words = d + 1;
    }
    /* A size no memory holds saturates: the backend's allocation fails. */
    size_t bytes;
    if (fa_ckd_mul_size(&bytes, (size_t)fa_attention_total_q(desc), (size_t)desc->heads_q) ||
        fa_ckd_mul_size(&bytes, bytes, words) || fa_ckd_mul_size(&bytes, bytes, 4))
        return SIZE_MAX;
    return bytes;
}

/* An OpenCL matrix-unit backward's workspace: workspace_bytes's, and K
 * packed in fragment order where the tile's geometry reads K from there
 * (planner_cl_mma.c). */
static size_t cl_mma_backward_workspace(const fa_device_desc *dev, const fa_attention_desc *desc,
                                        const fa_kernel_plan *kp) {
    size_t bytes = workspace_bytes(dev, desc, FA_PASS_BACKWARD, kp->variant, kp->split_k), packed = 0;
    fa_cl_mma_geometry g;
    if (!fa_cl_mma_geometry_of(dev, desc, FA_PASS_BACKWARD, kp->br, kp->bc, kp->thread_rows, kp->thread_cols,
                               kp->stages, &g))
        return bytes;
    if (fa_cl_mma_packed_k_bytes(&g, desc, kp->bc, fa_attention_total_k(desc), &packed) != FA_SUCCESS) {
        fa_clear_error();
        return SIZE_MAX;
    }
    return fa_ckd_add_size(&bytes, bytes, packed) ? SIZE_MAX : bytes;
}

/* Best candidate of a family; 0 when none fits. */
static int plan_family(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, family fam,
                       candidate *best) {
    fa_variant variants[2];
    const int nvar = family_variants(dev, desc, fam, pass, variants);

    /* The adequacy bar, from every candidate of the family whatever its
     * local memory. */
    int64_t most = 0;
    for (int v = 0; v < nvar; v++)
        for (size_t i = 0; i < FA_ARRAY_SIZE(tile_sizes); i++)
            for (size_t j = 0; j < FA_ARRAY_SIZE(tile_sizes); j++) {
                int split, br = tile_sizes[i], bc = tile_sizes[j];
                if (!tile_ok(dev, desc, variants[v], pass, br, bc, &split)) continue;
                int64_t g = group_count(desc, pass, br, bc, split);
                if (g > most) most = g;
            }
    const int64_t bar = most < dev->compute_units ? most : dev->compute_units;

    /* Tile visits depend on the tile shape alone: counted once a shape. */
    fa_tile_visits visits[FA_ARRAY_SIZE(tile_sizes)][FA_ARRAY_SIZE(tile_sizes)];
    int counted[FA_ARRAY_SIZE(tile_sizes)][FA_ARRAY_SIZE(tile_sizes)];
    memset(counted, 0, sizeof counted);
    int found = 0;
    for (int v = 0; v < nvar; v++) {
        const fa_variant variant = variants[v];
        /* OpenCL's matrix-core kernels and HIP's forward copy one tile
         * while computing on another (K against V), in one stage; HIP's
         * backward may keep a second query tile in flight. OpenCL's
         * backward also runs two (planner_cl_mma.c), not planned until
         * they are measured against one on hardware. */
        const int max_stages = fa_variant_on_matrix_units(variant) && !cl_mma(dev, variant) &&
                                       (!hip_mma(dev, variant) || pass == FA_PASS_BACKWARD)
                                   ? 2
                                   : 1;
        for (size_t i = 0; i < FA_ARRAY_SIZE(tile_sizes); i++)
            for (size_t j = 0; j < FA_ARRAY_SIZE(tile_sizes); j++) {
                const int br = tile_sizes[i], bc = tile_sizes[j];
                int split;
                if (!tile_ok(dev, desc, variant, pass, br, bc, &split)) continue;
                if (!counted[i][j]) {
                    visits[i][j] = fa_io_tile_visits(desc, br, bc);
                    counted[i][j] = 1;
                }
                candidate c;
                memset(&c, 0, sizeof c);
                c.variant = variant;
                c.br = br;
                c.bc = bc;
                c.split = split;
                c.groups = group_count(desc, pass, br, bc, split);
                c.inadequate = c.groups < bar;
                for (int stages = max_stages; stages >= 1; stages--) {
                    c.stages = stages;
                    /* HIP's matrix-core kernels: local memory by micro-tile,
                     * below. */
                    c.local_mem = cl_mma(dev, variant)    ? fa_cl_mma_local_mem(dev, desc, pass, br, bc, stages)
                                  : hip_mma(dev, variant) ? 0
                                                          : fa_plan_local_mem(variant, pass, desc, br, bc, stages);
                    if (c.local_mem > variant_local_mem(dev, variant)) continue;
                    size_t n_sizes;
                    const int *sizes = micro_tile_sizes(dev, variant, &n_sizes);
                    for (size_t a = 0; a < n_sizes; a++)
                        for (size_t b = 0; b < n_sizes; b++) {
                            c.tr = sizes[a];
                            c.tc = sizes[b];
                            if (!layout_ok(dev, desc, variant, pass, br, bc, c.tr, c.tc)) continue;
                            /* OpenCL's matrix-unit micro-tiles name their
                             * layout, whose tiles may differ in size. */
                            if (cl_mma(dev, variant)) {
                                c.local_mem = fa_cl_mma_tile_local_mem(dev, desc, pass, br, bc, c.tr, c.tc, stages);
                                if (c.local_mem > usable_local_mem(dev)) continue;
                                /* A layout's measured preference, which
                                 * the order below cannot express (NVIDIA's
                                 * forward: several work-groups a compute
                                 * unit). */
                                if (!fa_cl_mma_preferred(dev, desc, pass, br, bc, c.tr, c.tc)) continue;
                            }
                            if (variant == FA_VARIANT_MMA && !cl_mma(dev, variant) && !hip_mma(dev, variant) &&
                                !mma_stages_ok(dev, desc, pass, br, bc, c.tr, stages))
                                continue;
                            if (variant == FA_VARIANT_WGMMA && pass == FA_PASS_BACKWARD &&
                                wgmma_bwd_dropout_tight(desc, br) && stages != FA_WGMMA_BWD_DROPOUT_STAGES)
                                continue;
                            /* Bytes depend on the tile only; compute time
                             * also on the micro-tile (local-memory reads per
                             * FMA in SIMT kernels). */
                            fa_kernel_plan kp;
                            memset(&kp, 0, sizeof kp);
                            kp.variant = variant;
                            kp.br = br;
                            kp.bc = bc;
                            kp.thread_rows = c.tr;
                            kp.thread_cols = c.tc;
                            kp.stages = stages;
                            if (hip_mma(dev, variant)) {
                                c.local_mem = fa_hip_mma_local_mem(dev, desc, pass, &kp);
                                if (c.local_mem == 0 || c.local_mem > usable_local_mem(dev)) continue;
                                /* A layer's preference (NVIDIA's
                                 * backward: four wavefronts at small
                                 * head dimensions). */
                                if (!fa_hip_mma_preferred(dev, desc, pass, br, bc, c.tr, c.tc)) continue;
                            }
                            kp.split_k = split;
                            kp.num_work_groups = c.groups > INT_MAX ? INT_MAX : (int)c.groups;
                            c.cost = fa_io_fused_visits(dev, desc, pass, &kp, &visits[i][j]);
                            c.wgs = (br / c.tr) * (bc / c.tc);
                            c.partial_simd = c.wgs < dev->simd_width;
                            if (!found || better(&c, best)) {
                                *best = c;
                                found = 1;
                            }
                        }
                }
            }
    }
    return found;
}

/* Whether any tile of the family (or of SIMT, the fallback) has a valid
 * work-group layout, whatever its local memory: when none has, the
 * device's work-group limits are what rules the problem out. */
static int any_tile_layout(const fa_device_desc *dev, const fa_attention_desc *desc, family fam, fa_pass pass) {
    const family fams[2] = {fam, FAMILY_SIMT};
    for (int f = 0; f < 2; f++) {
        fa_variant variants[2];
        const int nvar = family_variants(dev, desc, fams[f], pass, variants);
        for (int v = 0; v < nvar; v++)
            for (size_t i = 0; i < FA_ARRAY_SIZE(tile_sizes); i++)
                for (size_t j = 0; j < FA_ARRAY_SIZE(tile_sizes); j++) {
                    int split;
                    if (tile_ok(dev, desc, variants[v], pass, tile_sizes[i], tile_sizes[j], &split)) return 1;
                }
    }
    return 0;
}

/* The warp-specialised forward (kernels_cuda/fwd_tma.cu, FA_VARIANT_WGMMA_TMA)
 * takes a warpgroup plan's problems where its tensor maps can describe
 * them: fixed-length sequences (a box must not cross into the next
 * sequence's tokens), head_dims of whole 64-column blocks up to 256.
 * Consumer warpgroups of 64 query rows each against 128-key tiles (64
 * above head_dim 128: O holds 96 or 128 registers a thread there), in as
 * many stages as the local memory holds up to FA_TMA_MAX_STAGES (the
 * producer runs that far ahead of the products). Two consumer warpgroups
 * (240 registers a thread after the producer's hand-over: O, the scores of
 * one tile and the probabilities of the one before, which the overlapped
 * products need at once), three at head_dim 64 without dropout (160).
 * Measured on an H100 (fp16, 16k tokens, N 2k-16k, bench/fa-tma-tiles.c,
 * bench/results/h100.md): at head_dim 64, 192 x 128 ran 341-515 TFLOP/s
 * against 336-485 for 128 x 128; a third stage gained nothing at 64 or
 * 128, 64-key tiles lost 5-25% there. FLASHATTN_PLAN_TMA=0 keeps the
 * warpgroup plan (fwd_mma.cu), so that one run can time both. */
#define FA_TMA_MAX_STAGES 2

/* Above head_dim 128 O takes half a consumer's registers or more: 64-key
 * tiles (two stages of them fit the local memory at 256). */
static int tma_keys(const fa_attention_desc *desc) { return desc->head_dim <= 128 ? 128 : 64; }

/* At head_dim 256 the score options, or dropout beside windows or a block
 * mask, spilled 4-32 bytes (NVRTC 13.0): those keep the warpgroup
 * forward. */
static int tma_registers_fit(const fa_attention_desc *desc) {
    if (desc->head_dim < 256) return 1;
    const int bounds = fa_desc_has_window(desc) || desc->block_mask;
    return !fa_desc_option_in_use(desc) && !(desc->dropout_p > 0.0f && bounds);
}

/* Three consumer warpgroups (192 rows) where their 160 registers a thread
 * hold the kernel: at head_dim 64 without dropout (its Philox rounds
 * spilled 96 bytes with windows and a block mask beside it, NVRTC 13.0),
 * and at 128 (16-bit) without dropout, a block mask, score options or a
 * window, with neither product schedule (the overlap's two tiles of scores
 * spilled 324 bytes; the block mask 16, softcap with ALiBi 28). On an H200
 * (bf16, 16k tokens, 2026-11-28 eighth session) 192 x 128 ran 701 / 726 /
 * 733 TFLOP/s at N 4k / 8k / 16k against 652 / 684 / 700 for 128 x 128
 * with the overlap, causal 566 / 653 / 702 against 562 / 627 / 695: one
 * group's softmax under the two others' products beats the overlap within
 * a group. The windowed problems were not timed and keep 128 rows. */
static int tma_rows(const fa_attention_desc *desc) {
    if (desc->head_dim <= 64) return desc->dropout_p == 0.0f ? 192 : 128;
    const int wide = desc->head_dim == 128 && !fa_desc_is_fp8(desc) && desc->dropout_p == 0.0f && !desc->block_mask &&
                     !fa_desc_option_in_use(desc) && !fa_desc_has_window(desc);
    return wide ? 192 : 128;
}
static int tma_threads(int br) { return 128 * (br / 64 + 1); }

/* A tensor map's strides: multiples of 16 bytes below 2^40, where the
 * dimension has more than one index (backends/cuda/cuda_tma.c puts a
 * valid one where it has one). */
static int tma_stride_ok(int64_t stride, int64_t count, size_t elem) {
    return count <= 1 || (stride > 0 && stride < FA_TMA_MAX_STRIDE / (int64_t)elem && stride * (int64_t)elem % 16 == 0);
}

static int tma_layouts_ok(const fa_attention_desc *desc) {
    static const fa_tensor_role roles[] = {FA_TENSOR_Q, FA_TENSOR_K, FA_TENSOR_V, FA_TENSOR_O};
    for (size_t i = 0; i < FA_ARRAY_SIZE(roles); i++) {
        const fa_layout l = fa_desc_layout(desc, roles[i]);
        const size_t e = fa_dtype_size(l.dtype);
        if (l.offset * (int64_t)e % 16 != 0 || !tma_stride_ok(l.stride_seq, l.seqlen, e) ||
            !tma_stride_ok(l.stride_head, l.heads, e) || !tma_stride_ok(l.stride_batch, desc->batch, e))
            return 0;
    }
    return 1;
}

static int tma_forward_applies(const fa_device_desc *dev, const fa_attention_desc *desc) {
    const char *env = getenv("FLASHATTN_PLAN_TMA");
    if (env && strcmp(env, "0") == 0) return 0;
    return wgmma_possible(dev, desc, FA_PASS_FORWARD) && !desc->cu_seqlens_q && !desc->kv_cache &&
           desc->head_dim % 64 == 0 && desc->head_dim <= 256 && tma_registers_fit(desc) &&
           dev->max_work_group_size >= tma_threads(tma_rows(desc)) && tma_layouts_ok(desc);
}

/* The warp-specialised forward's plan of the tile br x bc into *kp, in as
 * many stages as the local memory holds up to FA_TMA_MAX_STAGES; 0 (kp
 * left as it was) where two do not fit. The IO model's figures are those
 * of its tile. */
static int tma_tile_plan(const fa_device_desc *dev, const fa_attention_desc *desc, int br, int bc,
                         fa_kernel_plan *kp) {
    int stages = FA_TMA_MAX_STAGES;
    while (stages >= 2 &&
           fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_FORWARD, desc, br, bc, stages) > usable_local_mem(dev))
        stages--;
    if (stages < 2 || dev->max_work_group_size < tma_threads(br)) return 0;
    kp->variant = FA_VARIANT_WGMMA_TMA;
    kp->br = br;
    kp->bc = bc;
    kp->thread_rows = 2;
    kp->thread_cols = bc / 4;
    kp->work_group_size = tma_threads(br);
    kp->stages = stages;
    kp->split_k = 1;
    const int64_t groups = group_count(desc, FA_PASS_FORWARD, br, bc, 1);
    kp->num_work_groups = groups > INT_MAX ? INT_MAX : (int)groups;
    kp->local_mem_bytes = fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_FORWARD, desc, br, bc, stages);
    const fa_tile_visits visits = fa_io_tile_visits(desc, br, bc);
    kp->cost = fa_io_fused_visits(dev, desc, FA_PASS_FORWARD, kp, &visits);
    return 1;
}

/* Head dims between whole 64-column blocks the warp-specialised forward
 * runs padded (fa_tma_head_dim): 96, 160 and 224, a quarter or less of
 * the padded products wasted. On an H100 (bf16, N 4k and 16k, causal and
 * not) it ran 1.05x cuDNN at the three as a geometric mean (0.96-1.12)
 * where mma.sync ran 0.47x. FLASHATTN_PLAN_TMA_PAD=0 keeps mma.sync, for
 * comparison. */
static int tma_pad_applies(const fa_attention_desc *desc) {
    const char *env = getenv("FLASHATTN_PLAN_TMA_PAD");
    return !(env && strcmp(env, "0") == 0) && desc->head_dim % 64 != 0 && desc->head_dim % 32 == 0 &&
           desc->head_dim > 64 && desc->head_dim < 256 && !fa_desc_is_fp8(desc);
}

/* Turns a forward warpgroup plan (or, at a padded head dim, a tensor-core
 * one) into the warp-specialised one where that applies and fits. A padded
 * plan's tiles, local memory and compute time are those of the padded
 * problem, its bytes those of the problem (the copies fetch no padding). */
static void tma_forward_plan(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out) {
    fa_kernel_plan kp = *out;
    if (out->variant == FA_VARIANT_WGMMA && tma_forward_applies(dev, desc)) {
        if (tma_tile_plan(dev, desc, tma_rows(desc), tma_keys(desc), &kp)) *out = kp;
        return;
    }
    if (out->variant != FA_VARIANT_MMA || !tma_pad_applies(desc)) return;
    fa_attention_desc padded = *desc;
    padded.head_dim = fa_tma_head_dim(desc);
    if (!tma_forward_applies(dev, &padded) || !tma_tile_plan(dev, &padded, tma_rows(&padded), tma_keys(&padded), &kp))
        return;
    const fa_tile_visits visits = fa_io_tile_visits(desc, kp.br, kp.bc);
    fa_cost cost = fa_io_fused_visits(dev, desc, FA_PASS_FORWARD, &kp, &visits);
    cost.compute_ms = kp.cost.compute_ms;
    cost.roofline_ms = cost.compute_ms > cost.memory_ms ? cost.compute_ms : cost.memory_ms;
    kp.cost = cost;
    *out = kp;
}

/* FP8 (e4m3) inputs: fwd_tma.cu built with FP8, the one kernel that takes
 * them (CUDA, sm_90), where its tensor maps describe the problem and it
 * has the options (no dropout, block mask or score options: the CUDA
 * backend refuses other fp8 plans, naming what it lacks). The 16-bit
 * forward's tiles (but 192 rows at 128 without a mask: fp8_rows): 192 x
 * 128 at head_dim 64, 128 x 128 at 128, 128 x 64 above (at 256, 128-key
 * stages of K, V and V^T beside the fp16/bf16 O tile pass 227 KiB). With
 * the in-kernel transposers, on an H100 (16k tokens, N 4k-16k) 128 x 128 ran
 * 1.18-1.22x the bf16 forward at head_dim 128, the tensor cores busy 40%
 * of the time, the consumers waiting on each tile's chain of products,
 * softmax and rescale (ncu); on an H200 (2026-11-28, with the transposers'
 * loads in bursts) 1.21-1.25x. Timed beside it there (bench/fp8_gpu.sh,
 * fa-tma-tiles): 128 x 192 level at N 16384 and 3-4% behind at 4096, a
 * third stage within 2%, 192 x 64 on three warpgroups 2-8% behind.
 * FLASHATTN_PLAN_TMA does not apply: there is no other fp8 kernel. */
/* FP8 at head_dim 128 without a causal mask or window: three consumer
 * warpgroups (192 rows, the products in no overlap: with it the scores of
 * two tiles spill 160 registers), the XU pipe's exponentials of one group
 * under the others' products. On an H200 (2026-11-28, eighth session, V^T
 * by the pre-pass, 16k tokens) 869 / 958 / 1002 TFLOP/s at N 4k / 8k /
 * 16k against 818 / 898 / 941 for 128 x 128 with both schedules; causal
 * 642 / 792 / 893 against 660 / 787 / 909, so causal keeps 128 rows. The
 * CUDA backend plans the schedule to match (cuda_attention.c
 * tma_schedule). */
static int fp8_rows(const fa_attention_desc *desc) {
    return desc->head_dim == 128 && !desc->causal && !fa_desc_has_window(desc) ? 192 : tma_rows(desc);
}

static int fp8_forward_plan(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out) {
    if (!fa_desc_is_fp8(desc) || dev->backend != FA_BACKEND_CUDA || sm_version(dev) != 90 || !has_matrix_units(dev) ||
        desc->cu_seqlens_q || desc->kv_cache || desc->head_dim % 64 || desc->head_dim > 256 ||
        desc->dropout_p > 0.0f || desc->block_mask || fa_desc_option_in_use(desc) || !tma_layouts_ok(desc))
        return 0;
    fa_kernel_plan kp;
    memset(&kp, 0, sizeof kp);
    kp.simd_width = dev->simd_width;
    if (!tma_tile_plan(dev, desc, fp8_rows(desc), tma_keys(desc), &kp)) return 0;
    if (fa_fp8_vt_global(desc, kp.bc)) {
        /* A size no tensor map takes saturates: the backend refuses it. */
        int64_t keys_pad;
        size_t bytes;
        kp.workspace_bytes = fa_fp8_vt_size(desc, &keys_pad, &bytes) == FA_SUCCESS ? bytes : SIZE_MAX;
    }
    *out = kp;
    return 1;
}

/* At head_dim 64 the warp-specialised backward takes 128 queries a step
 * (S^T and dP^T twice as wide a consumer): on an H100 (bf16, N 4k and 16k)
 * 5-8% above 64, causal or not. Not with the options whose masks, dropout
 * or score work spill that tile, nor deterministic (dQ's own reduction
 * spilled 20 bytes there; cuda_compile.h100_sm90_tma_backward_wide_rows
 * compiles the ones it takes). */
static int tma_backward_wide_rows(const fa_attention_desc *desc, const fa_kernel_plan *kp) {
    return desc->head_dim == 64 && kp->br == 64 && kp->bc == 128 && desc->dropout_p <= 0.0f && !desc->block_mask &&
           !fa_desc_has_window(desc) && !desc->deterministic && !fa_desc_option_in_use(desc);
}

/* The warp-specialised backward (bwd_mma.cu built with TMA): the
 * warpgroup plan's tiles with a producer warpgroup ahead of them, where the
 * tensor maps describe the problem and the second dS^T tile fits. On an
 * H100 (fp16 and bf16, d64 and d128, causal and not, N 2k-16k, PyTorch
 * SDPA timed in the same run) it ran 0.94x cuDNN as a geometric mean where
 * the warpgroup backward ran 0.74x. Above head_dim 64 not with score
 * options: softcap with ALiBi spilled there (12 bytes, NVRTC 13.0), where
 * the warpgroup backward does not. FLASHATTN_PLAN_TMA_BWD=0 keeps the
 * warpgroup backward, for comparison. */
/* Head_dim 256 and 192: the warp-specialised backward with its two
 * consumer warpgroups sharing 64 keys (bwd_mma.cu, WGMMA with DK_SPLIT 2:
 * each computes the scores of half the queries and holds, at 256, dK and
 * dV for half the head dimensions, at 192 one of dK and dV whole) in place
 * of the tensor-core one; fp16/bf16, fixed lengths, no dropout or score options.
 * On an H200 (2026-11-28 fifth session) 280-318 TFLOP/s at 256 where
 * mma.sync ran 165-179 and FlashAttention-2 195-253 (1.24-1.45x); 192 ran
 * padded to 256 before (ninth session, 215-237). FLASHATTN_PLAN_TMA_BWD=0
 * keeps mma.sync, as it keeps the warpgroup backward elsewhere. */
static void tma_backward_plan_split(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out) {
    const char *env = getenv("FLASHATTN_PLAN_TMA_BWD");
    if ((env && strcmp(env, "0") == 0) || out->variant != FA_VARIANT_MMA ||
        (desc->head_dim != 256 && desc->head_dim != 192) ||
        !tma_forward_applies(dev, desc) || desc->dropout_p > 0.0f || fa_desc_option_in_use(desc) ||
        dev->max_work_group_size < 384)
        return;
    const size_t lm = fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, desc, 64, 64, 2);
    if (lm > usable_local_mem(dev)) return;
    fa_kernel_plan kp = *out;
    kp.variant = FA_VARIANT_WGMMA_TMA;
    kp.br = 64;
    kp.bc = 64;
    kp.work_group_size = 384;
    kp.thread_rows = 16;
    kp.thread_cols = 2;
    kp.stages = 2;
    kp.split_k = 1;
    const int64_t groups = group_count(desc, FA_PASS_BACKWARD, 64, 64, 1);
    kp.num_work_groups = groups > INT_MAX ? INT_MAX : (int)groups;
    kp.local_mem_bytes = lm;
    kp.cost = fa_io_fused(dev, desc, FA_PASS_BACKWARD, &kp);
    *out = kp;
}

static fa_status plan_pass(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                           fa_kernel_plan *out);

/* Head dims between the warp-specialised backward's (160 below 192, 224
 * below 256) run it padded (fa_tma_bwd_head_dim) where it is what the
 * padded problem plans, in place of mma.sync: the padded problem's tiles,
 * local memory, compute time and dQ accumulator, the problem's bytes.
 * Head_dim 96 runs it built for 96 (its products leave out the zero half
 * of each tile's second line) where 128 plans it: 128's tiles, its own
 * local memory, compute time and dQ accumulator. Not in deterministic mode
 * (a padded build's dQ kernel would read the padding; 96 alike, untried
 * there), nor for fp8 (no backward). Measured on an H200
 * (bench/results/h200.md, 2026-11-28 ninth session): mma.sync ran
 * 0.64-0.85x FlashAttention-2 at 96 and 192 (then padded).
 * FLASHATTN_PLAN_TMA_PAD=0 keeps mma.sync, as it does for the forward. */
static void tma_backward_plan_padded(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out) {
    const char *env = getenv("FLASHATTN_PLAN_TMA_PAD");
    const int pd = fa_tma_bwd_head_dim(desc), plan_dim = (pd + 63) / 64 * 64;
    if ((env && strcmp(env, "0") == 0) || out->variant != FA_VARIANT_MMA || desc->head_dim % 32 != 0 ||
        desc->head_dim <= 64 || plan_dim == desc->head_dim || desc->deterministic || fa_desc_is_fp8(desc) ||
        !tma_layouts_ok(desc))
        return;
    /* The tensor maps describe the problem's own layout (checked above),
     * not the padded one's. */
    fa_attention_desc padded = *desc;
    padded.head_dim = plan_dim;
    fa_kernel_plan kp;
    memset(&kp, 0, sizeof kp);
    if (plan_pass(dev, &padded, FA_PASS_BACKWARD, &kp) != FA_SUCCESS || kp.variant != FA_VARIANT_WGMMA_TMA) {
        fa_clear_error();
        return;
    }
    kp.local_mem_bytes = fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, desc, kp.br, kp.bc, kp.stages);
    const fa_attention_desc built = fa_tma_bwd_desc(desc); /* the dQ accumulator's rows: the built head_dim's */
    kp.workspace_bytes = workspace_bytes(dev, &built, FA_PASS_BACKWARD, kp.variant, kp.split_k);
    fa_cost cost = fa_io_fused(dev, desc, FA_PASS_BACKWARD, &kp);
    if (pd != desc->head_dim) {
        cost.compute_ms = kp.cost.compute_ms;
        cost.roofline_ms = cost.compute_ms > cost.memory_ms ? cost.compute_ms : cost.memory_ms;
    }
    kp.cost = cost;
    *out = kp;
}

static void tma_backward_plan(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out) {
    tma_backward_plan_split(dev, desc, out);
    const char *env = getenv("FLASHATTN_PLAN_TMA_BWD");
    if ((env && strcmp(env, "0") == 0) || out->variant != FA_VARIANT_WGMMA || desc->cu_seqlens_q ||
        desc->kv_cache || !tma_layouts_ok(desc) || out->work_group_size + 128 > dev->max_work_group_size ||
        (desc->head_dim > 64 && fa_desc_option_in_use(desc)))
        return;
    size_t lm = fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, desc, out->br, out->bc, out->stages);
    if (lm > usable_local_mem(dev)) return;
    if (tma_backward_wide_rows(desc, out)) {
        const size_t wide = fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, desc, 128, out->bc, out->stages);
        if (wide <= usable_local_mem(dev)) {
            out->br = 128;
            out->thread_rows = 32;
            lm = wide;
        }
    }
    out->variant = FA_VARIANT_WGMMA_TMA;
    out->work_group_size += 128;
    out->local_mem_bytes = lm;
    /* The same bytes; the consumer warpgroups' exponentials overlap. */
    out->cost = fa_io_fused(dev, desc, FA_PASS_BACKWARD, out);
}

static fa_status plan_pass(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                           fa_kernel_plan *out) {
    if (pass == FA_PASS_FORWARD && fp8_forward_plan(dev, desc, out)) return FA_SUCCESS;
    /* Decoding on CUDA's tensor cores is a problem of its own
     * (planner_decode.c; where none of its tiles fits the local memory, the
     * families below plan it); elsewhere it is planned as SIMT tiles with
     * key splits. Not with score options: the decoding kernel has none
     * (the general kernels compute them). */
    if (pass == FA_PASS_FORWARD && !fa_desc_option_in_use(desc) && fa_decode_applies(dev, desc, sm_version(dev)) &&
        fa_decode_plan(dev, desc, out) == FA_SUCCESS) {
        out->workspace_bytes = workspace_bytes(dev, desc, pass, out->variant, out->split_k);
        return FA_SUCCESS;
    }
    family fam = base_family(dev, desc);
    if (pass == FA_PASS_FORWARD && decoding(dev, desc)) fam = FAMILY_DECODE;
    candidate best;
    memset(&best, 0, sizeof best);
    int found = 0;
    if (fam == FAMILY_MMA && wgmma_possible(dev, desc, pass)) found = plan_family(dev, desc, pass, FAMILY_WGMMA, &best);
    if (!found) found = plan_family(dev, desc, pass, fam, &best);
    if (!found && fam == FAMILY_MMA) found = plan_family(dev, desc, pass, FAMILY_SIMT, &best);
    if (!found && !any_tile_layout(dev, desc, fam, pass))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "no %s tile has a work-group layout this device runs: device->max_work_group_size = %d "
                       "(simd_width %d) is too small for the smallest tile (8 x 8 scores, at most %d a work-item)",
                       pass == FA_PASS_FORWARD ? "forward" : "backward", dev->max_work_group_size, dev->simd_width,
                       FA_MAX_THREAD_TILE);
    if (!found)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "no %s tile fits: device->local_mem_bytes = %zu (%d kept for the driver), the smallest tile (8 x 8) needs %zu "
                       "at head_dim %d",
                       pass == FA_PASS_FORWARD ? "forward" : "backward", dev->local_mem_bytes, FA_LOCAL_MEM_RESERVE,
                       fa_plan_local_mem(FA_VARIANT_SIMT, pass, desc, 8, 8, 1), desc->head_dim);
    out->variant = best.variant;
    out->br = best.br;
    out->bc = best.bc;
    out->work_group_size = best.wgs;
    out->simd_width = dev->simd_width;
    out->thread_rows = best.tr;
    out->thread_cols = best.tc;
    out->split_k = best.split;
    out->stages = best.stages;
    out->num_work_groups = best.groups > INT_MAX ? INT_MAX : (int)best.groups;
    out->local_mem_bytes = best.local_mem;
    out->workspace_bytes = workspace_bytes(dev, desc, pass, best.variant, best.split);
    if (pass == FA_PASS_BACKWARD && best.variant == FA_VARIANT_MMA && dev->backend == FA_BACKEND_OPENCL)
        out->workspace_bytes = cl_mma_backward_workspace(dev, desc, out);
    out->cost = best.cost;
    if (pass == FA_PASS_FORWARD) tma_forward_plan(dev, desc, out);
    if (pass == FA_PASS_BACKWARD) {
        tma_backward_plan(dev, desc, out);
        tma_backward_plan_padded(dev, desc, out);
    }
    return FA_SUCCESS;
}

/* Standard attention: its products run in a GEMM library, so no tiles; the
 * workspace holds the N x N matrices in the storage dtype (S and P forward;
 * S, P, dP and dS plus D backward). */
static void plan_standard(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                          fa_kernel_plan *out) {
    const double matrix = fa_score_cells(desc) * (double)desc->heads_q * (double)fa_dtype_size(desc->q.dtype);
    double bytes = pass == FA_PASS_FORWARD
                       ? 2.0 * matrix
                       : 4.0 * matrix + 4.0 * (double)fa_attention_total_q(desc) * (double)desc->heads_q;
    out->variant = FA_VARIANT_STANDARD;
    out->simd_width = dev->simd_width;
    out->split_k = 1;
    out->workspace_bytes = bytes >= (double)SIZE_MAX ? SIZE_MAX : (size_t)bytes;
    out->cost = fa_io_standard(dev, desc, pass);
}

fa_status fa_plan_for_device(const fa_device_desc *device, const fa_attention_desc *desc, fa_plan_info *info) {
    if (!device) return fa_fail(FA_ERR_NULL_POINTER, "device is NULL");
    if (!desc) return fa_fail(FA_ERR_NULL_POINTER, "desc is NULL");
    if (!info) return fa_fail(FA_ERR_NULL_POINTER, "info is NULL");
    /* Zeroed first so padding never carries stale bytes: equal plans compare
     * equal with memcmp. */
    memset(info, 0, sizeof *info);
    FA_CHECK(check_device(device));
    FA_CHECK(fa_attention_desc_check(desc));
    if (desc->algorithm != FA_ALGO_FUSED && desc->algorithm != FA_ALGO_STANDARD)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "desc->algorithm = %d is not a fa_algorithm", (int)desc->algorithm);
    /* Planned as fa_plan_create runs it: with windows normalised. */
    fa_attention_desc normalized = *desc;
    fa_desc_normalize_windows(&normalized);
    desc = &normalized;

    /* A KV-cache step: one forward, decoding over the cache's capacity
     * (planner_decode.c); no backward, no standard attention. */
    if (desc->kv_cache) {
        FA_CHECK(fa_kvcache_plan(device, desc, sm_version(device), &info->forward));
        /* The split partials and a validity flag per sequence. */
        size_t work = workspace_bytes(device, desc, FA_PASS_FORWARD, info->forward.variant, info->forward.split_k);
        const size_t flags = (size_t)desc->batch * sizeof(int32_t);
        info->forward.workspace_bytes = fa_ckd_add_size(&work, work, flags) ? SIZE_MAX : work;
        info->fused_forward = info->forward.cost;
        info->algorithm = FA_ALGO_FUSED;
        info->kv_cache = 1;
        fa_clear_error();
        return FA_SUCCESS;
    }

    fa_kernel_plan fwd, bwd;
    memset(&fwd, 0, sizeof fwd);
    memset(&bwd, 0, sizeof bwd);
    fa_status st = plan_pass(device, desc, FA_PASS_FORWARD, &fwd);
    if (st == FA_SUCCESS) st = plan_pass(device, desc, FA_PASS_BACKWARD, &bwd);
    if (st != FA_SUCCESS && desc->algorithm == FA_ALGO_FUSED) {
        memset(info, 0, sizeof *info);
        return st;
    }
    /* Standard attention needs no tiles; the fused costs beside it are zero
     * where no fused tile fits. */
    if (st == FA_SUCCESS) {
        info->fused_forward = fwd.cost;
        info->fused_backward = bwd.cost;
    }
    info->algorithm = desc->algorithm;
    info->standard_forward = fa_io_standard(device, desc, FA_PASS_FORWARD);
    info->standard_backward = fa_io_standard(device, desc, FA_PASS_BACKWARD);
    if (desc->algorithm == FA_ALGO_STANDARD) {
        plan_standard(device, desc, FA_PASS_FORWARD, &info->forward);
        plan_standard(device, desc, FA_PASS_BACKWARD, &info->backward);
    } else {
        info->forward = fwd;
        info->backward = bwd;
    }
    info->fp8 = fa_desc_is_fp8(desc);
    fa_clear_error();
    return FA_SUCCESS;
}
