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
 * (fa_decode_split_count); stages as many as let two
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

int fa_decode_applies(const fa_device_desc *dev, const fa_attention_desc *desc, int sm) {
    if (!dev || !desc || dev->backend != FA_BACKEND_CUDA || sm < 80) return 0;
    if (!(dev->matrix_flops_per_clock_cu > 0.0) || dev->matrix_m != 16 || dev->matrix_k != 16) return 0;
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

int fa_decode_split_count(const fa_device_desc *dev, const fa_attention_desc *desc, int br) {
    if (!dev || !desc || br <= 0) return 1;
    const int64_t groups = (int64_t)desc->batch * desc->heads_kv * row_tiles(desc, br);
    /* Two blocks an SM whether or not their local memory lets them share
     * one (pick_stages): the split then does not depend on the local
     * memory, and more of it never predicts more bytes. */
    const int64_t slots = (int64_t)FA_DECODE_BLOCKS_PER_SM * dev->compute_units;
    int64_t cap = key_tiles(desc) / 2;
    if (cap > FA_DECODE_MAX_SPLITS) cap = FA_DECODE_MAX_SPLITS;
    /* As many splits as one wave holds: one more would start a second wave
     * of a few blocks that takes as long as the first (288 blocks in 264
     * slots run two waves for 1.09 waves of work). */
    int64_t s = slots / groups;
    if (s > cap) s = cap;
    return s >= 2 ? (int)s : 1;
}

static int pick_stages(const fa_device_desc *dev, const fa_attention_desc *desc, int br, size_t *mem) {
    const size_t usable = fa_plan_usable_local_mem(dev);
    for (int pass = 0; pass < 2; pass++)
        for (int st = FA_DECODE_MAX_STAGES; st >= FA_DECODE_MIN_STAGES; st--) {
            const size_t m = fa_decode_local_mem(desc, br, st);
            if (m > usable) continue;
            /* First pass: two blocks an SM. */
            if (pass == 0 && FA_DECODE_BLOCKS_PER_SM * (m + FA_DECODE_SM_RESERVE) >
                                 dev->local_mem_bytes + FA_DECODE_SM_RESERVE)
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
        const int stages = pick_stages(dev, desc, br, &mem);
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
