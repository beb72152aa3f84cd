/* Decoding on CUDA's tensor cores (kernels_cuda/decode.cu): a forward pass
 * whose query rows of one GQA group (heads x tokens) fit one block's tile
 * and whose keys are long is bound by the bytes of K and V, not by the
 * products. The plan packs the group's rows into one tile so that each KV
 * head's keys and values are read once, and splits the keys so that the
 * blocks fill the device at batch 1.
 *
 * Choices, in order: the fewest predicted bytes (the smallest tile that
 * holds the whole group, within the registers); then the least compute
 * time (less padding); the split count is a function of the tile
 * (fa_decode_split_count); where the keys are split, one block an SM with
 * as many stages as fit (blocks_per_sm), else stages as many as let two
 * blocks share an SM (one block's copies run while the other computes or
 * merges), else as many as fit. */
#include "planner_decode.h"

#include "fa_internal.h"
#include "planner.h"

#include <stdint.h>
#include <string.h>

#define FA_DECODE_MAX_SPLITS 128
#define FA_DECODE_BLOCKS_PER_SM 2
/* Rows of a tile: 16 to 64 (one to four 16-row strips a warp). */
#define FA_DECODE_MAX_ROWS 64
/* Per thread, fp32 accumulators of O (head_dim / 2 a strip) and scores
 * (8 a strip): within this, the kernel compiled without spilling (NVRTC
 * 13.0, sm_80 and sm_90; tests/test_cuda_compile.c checks every shape). */
#define FA_DECODE_REGS 160
#define FA_DECODE_MIN_STAGES 2
#define FA_DECODE_MAX_STAGES 4
/* One block an SM (blocks_per_sm): what the kernel takes, 2 * 6 - 2 page
 * ring slots within 16 rows. */
#define FA_DECODE_MAX_STAGES_ALONE 6
/* Keys below this are too few to be worth a kernel of their own: the
 * general forward covers them in a handful of tiles. */
#define FA_DECODE_MIN_KEYS (4 * FA_DECODE_BC)
/* Shared memory an SM has beyond one block's largest (sm_80 and sm_90:
 * 1 KiB a block is kept by the system). */
#define FA_DECODE_SM_RESERVE 1024

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int group_of(const fa_attention_desc *d) { return d->heads_q / d->heads_kv; }

static int64_t packed_rows(const fa_attention_desc *d) { return (int64_t)group_of(d) * d->seqlen_q; }

static int regs_ok(const fa_attention_desc *d, int br) { return br / 16 * (d->head_dim + 16) / 2 <= FA_DECODE_REGS; }

/* A CUDA device of sm_80 or later whose matrix units take 16 x 16 inputs,
 * and whose blocks may hold the kernel's FA_DECODE_WARPS warps (a
 * described device may allow fewer threads). */
static int device_runs_decode(const fa_device_desc *dev, int sm) {
    if (dev->backend != FA_BACKEND_CUDA || sm < 80) return 0;
    if (!(dev->matrix_flops_per_clock_cu > 0.0) || dev->matrix_m != 16 || dev->matrix_k != 16) return 0;
    return dev->max_work_group_size >= FA_DECODE_WARPS * 32;
}

int fa_decode_applies(const fa_device_desc *dev, const fa_attention_desc *desc, int sm) {
    if (!dev || !desc || !device_runs_decode(dev, sm)) return 0;
    if (desc->q.dtype != FA_DTYPE_F16 && desc->q.dtype != FA_DTYPE_BF16) return 0;
    if (desc->head_dim % 16 || desc->head_dim > 256 || desc->heads_kv <= 0) return 0;
    /* Dropout's Philox state and the block mask's tile map stay in the
     * general kernels. */
    if (desc->dropout_p > 0.0f || desc->block_mask) return 0;
    return packed_rows(desc) <= FA_DECODE_MAX_ROWS && regs_ok(desc, 16) && desc->seqlen_k >= FA_DECODE_MIN_KEYS;
}

size_t fa_decode_local_mem(const fa_attention_desc *desc, int br, int stages) {
    if (!desc || br <= 0 || stages <= 0 || desc->head_dim <= 0) return 0;
    const size_t d = (size_t)desc->head_dim, r = (size_t)br, e = 2;
    const size_t q = fa_mma_tile_bytes(r, e * d);
    const size_t kv = (size_t)stages * 2 * fa_mma_tile_bytes(FA_DECODE_BC, e * d);
    /* decode.cu: O [warps][br][d + 4] and (m, l) [warps][br][2], fp32. */
    const size_t merge = 4 * FA_DECODE_WARPS * r * (d + 4) + 4 * FA_DECODE_WARPS * r * 2;
    return q + (kv > merge ? kv : merge);
}

int fa_decode_token_rows(const fa_attention_desc *desc, int br) {
    const int g = desc ? group_of(desc) : 1;
    return g > 0 && br >= g ? br / g : 1;
}

int fa_decode_tiles_per_token(const fa_attention_desc *desc, int br) {
    const int g = desc ? group_of(desc) : 1;
    return br > 0 && br < g ? (int)ceil_div(g, br) : 1;
}

/* Key tiles a row tile may visit: all of them, or the window's. */
static int64_t key_tiles(const fa_attention_desc *d) {
    int64_t span = d->seqlen_k;
    if (d->window_left >= 0) {
        int64_t w = (int64_t)d->window_left + d->seqlen_q + (d->window_right > 0 ? d->window_right : 0);
        if (w < span) span = w;
    }
    return ceil_div(span, FA_DECODE_BC);
}

static int64_t row_tiles(const fa_attention_desc *d, int br) { return ceil_div(packed_rows(d), br); }

/* Splits of one wave of blocks_per_sm blocks a compute unit, each split
 * keeping at least two key tiles, at most FA_DECODE_MAX_SPLITS; 1 where
 * that leaves fewer than two. */
static int splits_in_wave(const fa_device_desc *dev, const fa_attention_desc *desc, int br, int blocks_per_sm) {
    const int64_t groups = (int64_t)desc->batch * desc->heads_kv * row_tiles(desc, br);
    const int64_t slots = (int64_t)blocks_per_sm * dev->compute_units;
    int64_t cap = key_tiles(desc) / 2;
    if (cap > FA_DECODE_MAX_SPLITS) cap = FA_DECODE_MAX_SPLITS;
    /* As many splits as one wave holds: one more would start a second wave
     * of a few blocks that takes as long as the first (288 blocks in 264
     * slots run two waves for 1.09 waves of work). */
    int64_t s = slots / groups;
    if (s > cap) s = cap;
    return s >= 2 ? (int)s : 1;
}

/* Blocks an SM: one where the keys are split even so, else two. A split
 * block has few tiles (a batch-1 step at 16k keys: four in each of 66
 * splits with two blocks an SM), so what bounds it is how many of them are
 * in flight at once and the merge after: one block with up to
 * FA_DECODE_MAX_STAGES_ALONE stages keeps as many bytes in flight as two
 * of three, each asks for more of its own tiles at once, and half the
 * splits halve the merge (H200, batch 1: 0.0290 against 0.0323 ms at 16k
 * keys, 0.0854 against 0.0884 at 128k; batch 8 the same within 1%). Where
 * the blocks fill the device without splits, two an SM keep their loads
 * going while the other computes (batch 64: 3.77 against 3.82 ms). */
static int blocks_per_sm(const fa_device_desc *dev, const fa_attention_desc *desc, int br) {
    return splits_in_wave(dev, desc, br, 1) >= 2 ? 1 : FA_DECODE_BLOCKS_PER_SM;
}

int fa_decode_split_count(const fa_device_desc *dev, const fa_attention_desc *desc, int br) {
    if (!dev || !desc || br <= 0) return 1;
    /* The split does not depend on the local memory (two blocks an SM
     * whether or not theirs lets them share one): more of it never
     * predicts more bytes. */
    return splits_in_wave(dev, desc, br, blocks_per_sm(dev, desc, br));
}

static int pick_stages(const fa_device_desc *dev, const fa_attention_desc *desc, int br, int blocks, size_t *mem) {
    const size_t usable = fa_plan_usable_local_mem(dev);
    const int most = blocks == 1 ? FA_DECODE_MAX_STAGES_ALONE : FA_DECODE_MAX_STAGES;
    for (int pass = 0; pass < 2; pass++)
        for (int st = most; st >= FA_DECODE_MIN_STAGES; st--) {
            const size_t m = fa_decode_local_mem(desc, br, st);
            if (m > usable) continue;
            /* First pass: that many blocks an SM. */
            if (pass == 0 && (size_t)blocks * (m + FA_DECODE_SM_RESERVE) > dev->local_mem_bytes + FA_DECODE_SM_RESERVE)
                continue;
            *mem = m;
            return st;
        }
    return 0;
}

fa_status fa_decode_plan(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out) {
    if (!dev || !desc || !out) return fa_fail(FA_ERR_NULL_POINTER, "dev, desc or out is NULL");
    int found = 0;
    fa_kernel_plan best;
    memset(&best, 0, sizeof best);
    for (int br = 16; br <= FA_DECODE_MAX_ROWS; br *= 2) {
        if (!regs_ok(desc, br)) break;
        size_t mem = 0;
        const int stages = pick_stages(dev, desc, br, blocks_per_sm(dev, desc, br), &mem);
        if (!stages) continue;
        fa_kernel_plan kp;
        memset(&kp, 0, sizeof kp);
        kp.variant = FA_VARIANT_DECODE;
        kp.br = br;
        kp.bc = FA_DECODE_BC;
        kp.work_group_size = FA_DECODE_WARPS * 32;
        kp.simd_width = dev->simd_width;
        /* The fragments: two rows a strip, four of a warp's 16 keys. */
        kp.thread_rows = br / 8;
        kp.thread_cols = 4;
        kp.split_k = fa_decode_split_count(dev, desc, br);
        kp.stages = stages;
        const int64_t groups = (int64_t)desc->batch * desc->heads_kv * row_tiles(desc, br) * kp.split_k;
        kp.num_work_groups = groups > INT32_MAX ? INT32_MAX : (int)groups;
        kp.local_mem_bytes = mem;
        kp.cost = fa_io_fused(dev, desc, FA_PASS_FORWARD, &kp);
        const double bytes = kp.cost.hbm_read_bytes + kp.cost.hbm_write_bytes;
        const double best_bytes = best.cost.hbm_read_bytes + best.cost.hbm_write_bytes;
        if (!found || bytes < best_bytes || (bytes == best_bytes && kp.cost.compute_ms < best.cost.compute_ms)) {
            best = kp;
            found = 1;
        }
    }
    if (!found)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "no decoding tile fits: device->local_mem_bytes = %zu, 16 rows at head_dim %d in %d stages "
                       "need %zu",
                       dev->local_mem_bytes, desc->head_dim, FA_DECODE_MIN_STAGES,
                       fa_decode_local_mem(desc, 16, FA_DECODE_MIN_STAGES));
    *out = best;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* KV-cache steps                                                           */

int fa_decode_applies_kvcache(const fa_device_desc *dev, const fa_attention_desc *desc, int sm) {
    if (!dev || !desc || !desc->kv_cache || !device_runs_decode(dev, sm)) return 0;
    if (desc->q.dtype != FA_DTYPE_F16 && desc->q.dtype != FA_DTYPE_BF16) return 0;
    return desc->head_dim % 16 == 0 && desc->head_dim <= 256 && regs_ok(desc, 16);
}

int64_t fa_kvcache_row_tiles(const fa_attention_desc *desc, int br) {
    return desc && br > 0 ? row_tiles(desc, br) : 0;
}

/* Key splits of a packed SIMT plan: enough work-groups to cover the
 * compute units (at batch 1 the KV heads alone rarely do), each split
 * keeping at least two key tiles of the capacity, at most
 * FA_DECODE_MAX_SPLITS; 1 where that leaves fewer than two. */
static int kvcache_split_count(const fa_device_desc *dev, const fa_attention_desc *desc, int br, int bc) {
    const int64_t groups = (int64_t)desc->batch * desc->heads_kv * row_tiles(desc, br);
    const int64_t want = ceil_div(dev->compute_units, groups);
    const int64_t room = ceil_div(desc->seqlen_k, bc) / 2;
    int64_t s = want < room ? want : room;
    if (s > FA_DECODE_MAX_SPLITS) s = FA_DECODE_MAX_SPLITS;
    return s >= 2 ? (int)s : 1;
}

static const int kv_rows[] = {64, 32, 16, 8};
static const int kv_cols[] = {64, 32, 16};
static const int kv_micro[] = {1, 2, 4, 8};

/* Work-items a work-group of a step should have: its keys stream through
 * the work-group's loads, and a few SIMD groups keep enough of them in
 * flight (the model's memory time does not see that, so it is a rule). */
#define FA_KV_WIDE_SIMD_GROUPS 4

static int kv_narrow(const fa_device_desc *dev, const fa_kernel_plan *p) {
    /* In int64: a described device may claim any positive SIMD width. */
    int64_t want = (int64_t)FA_KV_WIDE_SIMD_GROUPS * dev->simd_width;
    if (want > dev->max_work_group_size) want = dev->max_work_group_size;
    return p->work_group_size < want;
}

/* Whether a beats b: the fewest predicted bytes, then work-groups of
 * enough SIMD groups, then the shortest roofline and compute times, then
 * fewer rows (less padding), more keys a tile, smaller micro-tiles. */
static int kv_better(const fa_device_desc *dev, const fa_kernel_plan *a, const fa_kernel_plan *b) {
    const double ab = a->cost.hbm_read_bytes + a->cost.hbm_write_bytes;
    const double bb = b->cost.hbm_read_bytes + b->cost.hbm_write_bytes;
    if (ab != bb) return ab < bb;
    const int na = kv_narrow(dev, a), nb = kv_narrow(dev, b);
    if (na != nb) return na < nb;
    if (a->cost.roofline_ms != b->cost.roofline_ms) return a->cost.roofline_ms < b->cost.roofline_ms;
    if (a->cost.compute_ms != b->cost.compute_ms) return a->cost.compute_ms < b->cost.compute_ms;
    if (a->br != b->br) return a->br < b->br;
    if (a->bc != b->bc) return a->bc > b->bc;
    if (a->thread_rows != b->thread_rows) return a->thread_rows < b->thread_rows;
    return a->thread_cols < b->thread_cols;
}

static fa_status kvcache_simt_plan(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out) {
    const size_t usable = fa_plan_usable_local_mem(dev);
    int found = 0;
    fa_kernel_plan best;
    memset(&best, 0, sizeof best);
    for (size_t i = 0; i < sizeof kv_rows / sizeof kv_rows[0]; i++)
        for (size_t j = 0; j < sizeof kv_cols / sizeof kv_cols[0]; j++) {
            const int br = kv_rows[i], bc = kv_cols[j];
            const size_t mem = fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_FORWARD, desc, br, bc, 1);
            if (mem > usable) continue;
            const int split = kvcache_split_count(dev, desc, br, bc);
            for (size_t a = 0; a < sizeof kv_micro / sizeof kv_micro[0]; a++)
                for (size_t c = 0; c < sizeof kv_micro / sizeof kv_micro[0]; c++) {
                    const int tr = kv_micro[a], tc = kv_micro[c];
                    if (!fa_plan_simt_layout_ok(dev, desc, br, bc, tr, tc)) continue;
                    fa_kernel_plan kp;
                    memset(&kp, 0, sizeof kp);
                    kp.variant = split > 1 ? FA_VARIANT_SPLITK : FA_VARIANT_SIMT;
                    kp.br = br;
                    kp.bc = bc;
                    kp.thread_rows = tr;
                    kp.thread_cols = tc;
                    kp.work_group_size = (br / tr) * (bc / tc);
                    kp.simd_width = dev->simd_width;
                    kp.split_k = split;
                    kp.stages = 1;
                    const int64_t groups = (int64_t)desc->batch * desc->heads_kv * row_tiles(desc, br) * split;
                    kp.num_work_groups = groups > INT32_MAX ? INT32_MAX : (int)groups;
                    kp.local_mem_bytes = mem;
                    kp.cost = fa_io_fused(dev, desc, FA_PASS_FORWARD, &kp);
                    if (!found || kv_better(dev, &kp, &best)) {
                        best = kp;
                        found = 1;
                    }
                }
        }
    if (!found)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "no KV-cache tile fits: device->local_mem_bytes = %zu and max_work_group_size = %d; 8 packed "
                       "rows x 16 keys at head_dim %d need %zu bytes",
                       dev->local_mem_bytes, dev->max_work_group_size, desc->head_dim,
                       fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_FORWARD, desc, 8, 16, 1));
    *out = best;
    return FA_SUCCESS;
}

fa_status fa_kvcache_plan(const fa_device_desc *dev, const fa_attention_desc *desc, int sm, fa_kernel_plan *out) {
    if (!dev || !desc || !out) return fa_fail(FA_ERR_NULL_POINTER, "dev, desc or out is NULL");
    memset(out, 0, sizeof *out);
    if (fa_decode_applies_kvcache(dev, desc, sm) && fa_decode_plan(dev, desc, out) == FA_SUCCESS) return FA_SUCCESS;
    return kvcache_simt_plan(dev, desc, out);
}
