/* Plans as text: what fa-info and the benchmark print beside measurements. */
#include "fa_internal.h"
#include "planner.h"

#include <stdarg.h>
#include <stdio.h>

const char *fa_variant_name(fa_variant variant) {
    switch (variant) {
    case FA_VARIANT_SIMT: return "simt";
    case FA_VARIANT_MMA: return "mma";
    case FA_VARIANT_WGMMA: return "wgmma";
    case FA_VARIANT_WGMMA_TMA: return "wgmma_tma";
    case FA_VARIANT_DECODE: return "decode";
    case FA_VARIANT_SPLITK: return "splitk";
    case FA_VARIANT_SIMT_STREAM: return "simt-stream";
    case FA_VARIANT_STANDARD: return "standard";
    default: return "unknown";
    }
}

/* snprintf into a fixed buffer that keeps counting past its end. */
typedef struct text {
    char *out;
    size_t size;
    size_t need;
} text;

static void put(text *t, const char *fmt, ...) FA_PRINTF(2, 3);

static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n;
    if (t->out && t->need < t->size)
        n = vsnprintf(t->out + t->need, t->size - t->need, fmt, ap);
    else
        n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0) t->need += (size_t)n;
}

static void put_cost(text *t, const char *indent, const fa_cost *c) {
    put(t, "%sHBM read %.2f MB, write %.2f MB, %.3f GFLOP\n", indent, c->hbm_read_bytes / 1e6,
        c->hbm_write_bytes / 1e6, c->flops / 1e9);
    if (c->dram_read_bytes != c->hbm_read_bytes || c->dram_write_bytes != c->hbm_write_bytes)
        put(t, "%sDRAM after the last-level cache: read %.2f MB, write %.2f MB\n", indent,
            c->dram_read_bytes / 1e6, c->dram_write_bytes / 1e6);
    put(t, "%scompute %.4f ms, memory %.4f ms, roofline %.4f ms (%s-bound)\n", indent, c->compute_ms, c->memory_ms,
        c->roofline_ms, c->compute_ms > c->memory_ms ? "compute" : "memory");
}

/* Warps sharing each key strip of a CUDA tensor-core backward plan
 * (planner.c mma_micro_tile_ok: tr = br / (4 * split)); 1 for every other
 * plan, whose matrix-unit micro-tiles hold at least a quarter of the
 * queries. */
static int strip_warps(const fa_kernel_plan *k, int backward) {
    if (!backward || k->variant != FA_VARIANT_MMA || k->simd_width != 32 || k->thread_rows <= 0 || k->thread_cols % 2 ||
        k->br % (4 * k->thread_rows))
        return 1;
    const int split = k->br / (4 * k->thread_rows);
    return split == 2 || split == 4 ? split : 1;
}

static void put_pass(text *t, const char *name, const fa_kernel_plan *k, int backward, int fp8) {
    if (k->variant == FA_VARIANT_STANDARD) {
        put(t, "%s: standard (S and P in global memory), workspace %.2f MiB\n", name,
            (double)k->workspace_bytes / (1024.0 * 1024.0));
    } else {
        put(t, "%s: %s, tile %d x %d (br x bc), work-group %d (simd %d), micro-tile %d x %d, split_k %d, "
               "stages %d, %d work-groups\n",
            name, fa_variant_name(k->variant), k->br, k->bc, k->work_group_size, k->simd_width, k->thread_rows,
            k->thread_cols, k->split_k, k->stages, k->num_work_groups);
        put(t, "  local memory %.1f KiB, workspace %.2f MiB\n", (double)k->local_mem_bytes / 1024.0,
            (double)k->workspace_bytes / (1024.0 * 1024.0));
        if (k->variant == FA_VARIANT_WGMMA_TMA && k->work_group_size > 128)
            put(t, "  pipeline: a producer warpgroup's tensor-map copies into %d stages, %d consumer warpgroups of 64 "
                   "rows\n",
                k->stages, k->work_group_size / 128 - 1);
        /* An fp8 forward's workspace is V^T (fa_fp8_vt_global), where it has one. */
        if (k->variant == FA_VARIANT_WGMMA_TMA && fp8)
            put(t, "  fp8: e4m3 Q, K, V and products, P in e4m3 from registers; %s\n",
                k->workspace_bytes ? "V^T written to the workspace by a pre-pass, copied in stages as K"
                                   : "the producer warpgroup's other warps transpose each V stage into a V^T stage");
        const int split = strip_warps(k, backward);
        if (split > 1)
            put(t, "  key strips shared by %d warps, each holding dK and dV for 1/%d of the head dimensions\n", split,
                split);
        /* The warp-specialised backward at head_dim 192 and 256: its
         * consumer warpgroups (64 keys each otherwise) share the tile's
         * keys, each holding half of dK and dV (256) or one of them (192). */
        const int consumers = k->work_group_size / 128 - 1;
        if (backward && k->variant == FA_VARIANT_WGMMA_TMA && k->bc > 0 && consumers * 64 > k->bc)
            put(t, "  key strips shared by %d warpgroups, each holding a share of dK and dV\n", consumers * 64 / k->bc);
    }
    put_cost(t, "  ", &k->cost);
}

size_t fa_plan_info_format(const fa_plan_info *info, char *out, size_t out_size) {
    text t = {out, out ? out_size : 0, 0};
    if (t.size > 0) out[0] = '\0';
    if (!info) {
        put(&t, "(no plan)\n");
        return t.need;
    }
    if (info->kv_cache) {
        /* One forward over the cache; nothing to compare against. */
        put(&t, "KV-cache step (fa_forward_kvcache): query rows packed per KV head, keys over the capacity\n");
        put_pass(&t, "forward", &info->forward, 0, 0);
        return t.need;
    }
    put(&t, "algorithm: %s\n", info->algorithm == FA_ALGO_STANDARD ? "standard" : "fused");
    put_pass(&t, "forward", &info->forward, 0, info->fp8);
    if (info->fp8)
        put(&t, "backward: none (fp8 inputs run the forward only)\n");
    else
        put_pass(&t, "backward", &info->backward, 1, 0);
    /* The other algorithm's prediction on the same shape. */
    const int fused = info->algorithm != FA_ALGO_STANDARD;
    put(&t, "%s attention, for comparison:\n", fused ? "standard" : "fused");
    put(&t, "  forward:\n");
    put_cost(&t, "    ", fused ? &info->standard_forward : &info->fused_forward);
    put(&t, "  backward:\n");
    put_cost(&t, "    ", fused ? &info->standard_backward : &info->fused_backward);
    return t.need;
}
