/* The planner (GUIDE section 3): tile shape, work-group layout, key splits
 * and pipeline stages of each pass for a described device, with the IO
 * model's predicted cost. Plain C: no vendor headers, no randomness, no
 * timing, no global state, so the same problem on the same device always
 * gets the same plan.
 *
 * How a pass is planned
 * ---------------------
 * 1. The tile family: OpenCL C 1.2 has no matrix instructions, so OpenCL
 *    plans SIMT tiles; CUDA plans MMA tiles for fp16/bf16 (fp32 with
 *    allow_tf32) on a device with matrix units, SIMT otherwise; HIP and the
 *    CPU reference plan SIMT. A forward pass whose smallest tiles (8 rows)
 *    still leave compute units idle, over keys long enough to split
 *    (decoding), plans SIMT tiles with and without key splits (SPLITK).
 * 2. Candidates: br, bc in {128, 64, 32, 16, 8}, thread_rows and
 *    thread_cols in {1, 2, 4, 8}, stages 1 (SIMT: OpenCL has no asynchronous
 *    copy it can rely on) or 1 and 2 (MMA), filtered by the work-group limit,
 *    whole SIMD groups, the register budget and local memory.
 * 3. The choice: a candidate is adequate when its work-groups cover the
 *    compute units (or, where no candidate can, come as close as the best
 *    candidate in the family). Among adequate candidates the fewest predicted
 *    HBM bytes win; then the smallest predicted roofline time (the IO model's,
 *    whose compute time carries the tail effect of the last wave and, for
 *    SIMT, the local-memory reads each micro-tile needs per FMA); then the
 *    least compute time (the least work wasted on padded tile rows); then full
 *    SIMD groups; then larger br, larger bc, more stages, fewer thread_rows,
 *    fewer thread_cols.
 *
 * Why bytes before time: it makes the planner monotone in local memory. The
 * adequacy test does not depend on local memory, and within a family the
 * smallest tile (8 x 8 for SIMT, the matrix shape for MMA) needs the least
 * local memory and launches the most work-groups, so whenever any candidate
 * fits, an adequate one fits. More local memory therefore only adds
 * candidates to the adequate set, and the fewest bytes over a larger set are
 * never more: a device with more local memory is never predicted to move
 * more bytes. This holds for devices whose 8 x 8 tile has a valid layout
 * (max_work_group_size >= 32 with a power-of-two SIMD width). */
#include "planner.h"

#include "fa_internal.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
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

static const int tile_sizes[] = {128, 64, 32, 16, 8};
static const int thread_sizes[] = {1, 2, 4, 8};

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t fa_plan_local_mem(fa_variant variant, fa_pass pass, const fa_attention_desc *desc, int br, int bc,
                         int stages) {
    if (!desc || br <= 0 || bc <= 0 || desc->head_dim <= 0) return 0;
    const size_t d = (size_t)desc->head_dim, r = (size_t)br, c = (size_t)bc;
    const size_t st = stages > 1 ? (size_t)stages : 1;
    const size_t e = desc->q.dtype == FA_DTYPE_F32 ? 4 : 2;
    switch (variant) {
    case FA_VARIANT_STANDARD:
        return 0;
    case FA_VARIANT_MMA:
        /* kernels_cuda/fwd_mma.cu: Q, and K and V per stage. */
        if (pass == FA_PASS_FORWARD) return e * (r * d + st * 2 * c * d);
        /* kernels_cuda/bwd_mma.cu: K and V; Q, dO, L and D per stage; dS. */
        return e * (2 * c * d + st * 2 * r * d + r * c) + 4 * 2 * st * r;
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
#define FA_MMA_FWD_REGS 160
#define FA_MMA_FWD_REGS_TF32 136
#define FA_MMA_BWD_REGS_16 176
#define FA_MMA_BWD_REGS_TF32 192
#define FA_MMA_MIN_OTHER 32

/* Whether a strip count and the tile's other side (bc forward, br
 * backward) fit the register budgets. */
static int mma_regs_ok(const fa_attention_desc *desc, fa_pass pass, int strips, int other) {
    const int d = desc->head_dim;
    if (pass == FA_PASS_FORWARD)
        return strips * (d + other) / 2 <= (desc->q.dtype == FA_DTYPE_F32 ? FA_MMA_FWD_REGS_TF32 : FA_MMA_FWD_REGS);
    if (strips * d > FA_MMA_MAX_ACCUMULATORS) return 0;
    if (desc->q.dtype == FA_DTYPE_F32) return strips * (d + 4 * other) <= FA_MMA_BWD_REGS_TF32;
    return strips * (2 * d + 3 * other) <= 2 * FA_MMA_BWD_REGS_16;
}

static int mma_layout_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                         int wgs) {
    const int simd = dev->simd_width, d = desc->head_dim;
    if (wgs < simd || wgs % simd) return 0;
    const int warps = wgs / simd;
    if (warps != 4 && warps != 8) return 0;
    const int rows = pass == FA_PASS_FORWARD ? br : bc;
    if (rows % (dev->matrix_m * warps)) return 0;
    const int strips = rows / (dev->matrix_m * warps);
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
    if (other < FA_MMA_MIN_OTHER && mma_regs_ok(desc, pass, 1, FA_MMA_MIN_OTHER)) return 0;
    return mma_regs_ok(desc, pass, strips, other);
}

/* A work-group of (br / tr) x (bc / tc) work-items, each holding a tr x tc
 * micro-tile of the scores. */
static int layout_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_variant variant, fa_pass pass,
                     int br, int bc, int tr, int tc) {
    if (br % tr || bc % tc || tr * tc > FA_MAX_THREAD_TILE) return 0;
    const int ntr = br / tr, ntc = bc / tc, wgs = ntr * ntc, simd = dev->simd_width, d = desc->head_dim;
    if (wgs > dev->max_work_group_size) return 0;
    if (wgs >= simd && wgs % simd) return 0;
    if (variant == FA_VARIANT_MMA) return mma_layout_ok(dev, desc, pass, br, bc, wgs);
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

static int any_layout(const fa_device_desc *dev, const fa_attention_desc *desc, fa_variant variant, fa_pass pass,
                      int br, int bc) {
    for (size_t i = 0; i < FA_ARRAY_SIZE(thread_sizes); i++)
        for (size_t j = 0; j < FA_ARRAY_SIZE(thread_sizes); j++)
            if (layout_ok(dev, desc, variant, pass, br, bc, thread_sizes[i], thread_sizes[j])) return 1;
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
static int family_variants(family fam, fa_pass pass, fa_variant out[2]) {
    switch (fam) {
    case FAMILY_MMA: out[0] = FA_VARIANT_MMA; return 1;
    case FAMILY_DECODE:
        if (pass == FA_PASS_FORWARD) {
            out[0] = FA_VARIANT_SPLITK;
            out[1] = FA_VARIANT_SIMT;
            return 2;
        }
        out[0] = FA_VARIANT_SIMT;
        return 1;
    case FAMILY_SIMT:
    default: out[0] = FA_VARIANT_SIMT; return 1;
    }
}

/* Tile shape valid for a variant (local memory aside); *split receives the
 * key splits (1: none). */
static int tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_variant variant, fa_pass pass,
                   int br, int bc, int *split) {
    *split = 1;
    if (variant == FA_VARIANT_MMA && !mma_tile_ok(dev, desc, pass, br, bc)) return 0;
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
    return a->variant < b->variant;
}

static size_t workspace_bytes(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int split) {
    const size_t rows = (size_t)fa_attention_total_q(desc) * (size_t)desc->heads_q;
    const size_t d = (size_t)desc->head_dim;
    if (pass == FA_PASS_FORWARD) return split > 1 ? (size_t)split * rows * (d + 1) * 4 : 0;
    /* D per row; the fp32 dQ accumulator where dQ is summed over key tiles
     * (OpenCL computes dQ in a kernel of its own instead). */
    if (dev->backend == FA_BACKEND_OPENCL) return rows * 4;
    return rows * (d + 1) * 4;
}

/* Best candidate of a family; 0 when none fits. */
static int plan_family(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, family fam,
                       candidate *best) {
    fa_variant variants[2];
    const int nvar = family_variants(fam, pass, variants);

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

    int found = 0;
    for (int v = 0; v < nvar; v++) {
        const fa_variant variant = variants[v];
        const int max_stages = variant == FA_VARIANT_MMA ? 2 : 1;
        for (size_t i = 0; i < FA_ARRAY_SIZE(tile_sizes); i++)
            for (size_t j = 0; j < FA_ARRAY_SIZE(tile_sizes); j++) {
                const int br = tile_sizes[i], bc = tile_sizes[j];
                int split;
                if (!tile_ok(dev, desc, variant, pass, br, bc, &split)) continue;
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
                    c.local_mem = fa_plan_local_mem(variant, pass, desc, br, bc, stages);
                    if (c.local_mem > usable_local_mem(dev)) continue;
                    for (size_t a = 0; a < FA_ARRAY_SIZE(thread_sizes); a++)
                        for (size_t b = 0; b < FA_ARRAY_SIZE(thread_sizes); b++) {
                            c.tr = thread_sizes[a];
                            c.tc = thread_sizes[b];
                            if (!layout_ok(dev, desc, variant, pass, br, bc, c.tr, c.tc)) continue;
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
                            kp.split_k = split;
                            kp.num_work_groups = c.groups > INT_MAX ? INT_MAX : (int)c.groups;
                            c.cost = fa_io_fused(dev, desc, pass, &kp);
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

static fa_status plan_pass(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                           fa_kernel_plan *out) {
    family fam = base_family(dev, desc);
    if (pass == FA_PASS_FORWARD && decoding(dev, desc)) fam = FAMILY_DECODE;
    candidate best;
    memset(&best, 0, sizeof best);
    int found = plan_family(dev, desc, pass, fam, &best);
    if (!found && fam == FAMILY_MMA) found = plan_family(dev, desc, pass, FAMILY_SIMT, &best);
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
    out->workspace_bytes = workspace_bytes(dev, desc, pass, best.split);
    out->cost = best.cost;
    return FA_SUCCESS;
}

/* Standard attention: its products run in a GEMM library, so no tiles; the
 * workspace holds the N x N matrices in the storage dtype (S and P forward;
 * S, P, dP and dS plus D backward). */
static void plan_standard(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                          fa_kernel_plan *out) {
    double cells = 0.0;
    for (int b = 0; b < desc->batch; b++) {
        int64_t sq = desc->seqlen_q, sk = desc->seqlen_k;
        if (desc->cu_seqlens_q && desc->cu_seqlens_k) {
            sq = (int64_t)desc->cu_seqlens_q[b + 1] - desc->cu_seqlens_q[b];
            sk = (int64_t)desc->cu_seqlens_k[b + 1] - desc->cu_seqlens_k[b];
        }
        cells += (double)sq * (double)sk;
    }
    const double matrix = cells * (double)desc->heads_q * (double)fa_dtype_size(desc->q.dtype);
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
    fa_clear_error();
    return FA_SUCCESS;
}
