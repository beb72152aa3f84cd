/* The planner on described devices: valid tiles everywhere, determinism,
 * different tiles for different local memories, monotone bytes in local
 * memory, key splits for decoding, rejected device descriptions and the
 * printed plan. */
#include "desc.h"
#include "harness.h"
#include "planner.h"
#include "planner_cl_mma.h"
#include "planner_hip_mma.h"
#include "test_util.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

#include <limits.h>
#include <stdint.h>
#include <time.h>

static const fa_device_desc *device(const char *key) {
    const fa_described_device *d = fa_described_device_find(key);
    if (!d) {
        fprintf(stderr, "described device %s missing\n", key);
        exit(1);
    }
    return &d->desc;
}

static fa_attention_desc shape(int batch, int sq, int sk, int hq, int hkv, int dim, fa_dtype t) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = batch;
    d.seqlen_q = sq;
    d.seqlen_k = sk;
    d.heads_q = hq;
    d.heads_kv = hkv;
    d.head_dim = dim;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t;
    return d;
}

static double total_bytes(const fa_cost *c) { return c->hbm_read_bytes + c->hbm_write_bytes; }

static int in_set(int v, const int *set, int n) {
    for (int i = 0; i < n; i++)
        if (set[i] == v) return 1;
    return 0;
}

/* Every rule a kernel plan must keep; returns the number of failed checks. */
static int check_kernel_plan(const char *what, const fa_device_desc *dev, const fa_attention_desc *d,
                             fa_pass pass, const fa_kernel_plan *k) {
    static const int tiles[] = {128, 64, 32, 16, 8}, threads[] = {1, 2, 4, 8};
    int before = fa_test_failures;
    const int dim = d->head_dim;
    const fa_dtype t = d->q.dtype;
    CHECK_MSG((in_set(k->br, tiles, 5) || (k->variant == FA_VARIANT_WGMMA_TMA && k->br == 192)) &&
                  in_set(k->bc, tiles, 5),
              "%s: tile %d x %d", what, k->br, k->bc);
    /* SIMT micro-tiles come from {1, 2, 4, 8}; an MMA plan's is its fragments'
     * shape (two rows per 16-row strip, a quarter of the other side); a
     * WGMMA plan's is one strip's, in whole warpgroups of 64 rows (query
     * rows forward; keys backward, against 64 queries), with head dims of
     * whole 64-column blocks (up to 128 backward). */
    if (k->variant == FA_VARIANT_WGMMA) {
        const int fwd = pass == FA_PASS_FORWARD;
        const int layout = fwd ? k->thread_rows == 2 && k->thread_cols * 4 == k->bc && k->br % 64 == 0 &&
                                     k->work_group_size == 2 * k->br
                               : k->thread_rows * 4 == k->br && k->thread_cols == 2 && k->br == 64 &&
                                     k->bc % 64 == 0 && k->work_group_size == 2 * k->bc && dim <= 128;
        CHECK_MSG(layout && dim % 64 == 0 && (t == FA_DTYPE_F16 || t == FA_DTYPE_BF16) &&
                      strcmp(dev->arch, "sm_90") == 0,
                  "%s: wgmma %d x %d/%d, micro-tile %d x %d", what, k->br, k->bc, k->work_group_size, k->thread_rows,
                  k->thread_cols);
    } else if (k->variant == FA_VARIANT_WGMMA_TMA && pass == FA_PASS_BACKWARD) {
        /* The warp-specialised backward: the
         * warpgroup backward's tile with a producer warpgroup beside it,
         * 128 queries a step at head_dim 64 without masks beyond causal,
         * dropout or score options; at head_dim 192 and 256 two consumer
         * warpgroups sharing 64 keys, without dropout. */
        /* 96 runs built for itself in 128's tiles, 160 and 224 padded to
         * 192 and 256 (not deterministic: the dQ kernel would read the
         * padding). */
        const int pdim = fa_tma_bwd_head_dim(d);
        const int wide = dim == 64 && k->bc == 128 && d->dropout_p <= 0.0f && !d->block_mask && d->window_left < 0 &&
                         d->window_right < 0 && !d->deterministic && !fa_desc_option_in_use(d);
        const int d256 = pdim > 128 && k->br == 64 && k->bc == 64 && k->work_group_size == 384 &&
                         d->dropout_p <= 0.0f;
        CHECK_MSG((d256 || (k->br == (wide ? 128 : 64) && (k->bc == 64 || k->bc == 128) &&
                            k->work_group_size == 2 * k->bc + 128 && pdim <= 128)) &&
                      k->thread_rows == 16 * (k->br / 64) && k->thread_cols == 2 && k->stages == 2 &&
                      (dim % 64 == 0 || (dim % 32 == 0 && !d->deterministic)) &&
                      !(dim > 64 && fa_desc_option_in_use(d)) &&
                      (t == FA_DTYPE_F16 || t == FA_DTYPE_BF16) && !d->cu_seqlens_q && strcmp(dev->arch, "sm_90") == 0,
                  "%s: wgmma_tma backward %d x %d/%d, micro-tile %d x %d, %d stages", what, k->br, k->bc,
                  k->work_group_size, k->thread_rows, k->thread_cols, k->stages);
        if (fa_test_failures != before) return fa_test_failures - before;
        fa_attention_desc padded = *d;
        padded.head_dim = pdim;
        CHECK(k->local_mem_bytes == fa_plan_local_mem(k->variant, pass, &padded, k->br, k->bc, k->stages) &&
              k->local_mem_bytes <= dev->local_mem_bytes);
        return fa_test_failures - before;
    } else if (k->variant == FA_VARIANT_WGMMA_TMA) {
        /* The warp-specialised forward: a producer warpgroup and one
         * consumer warpgroup of 64 query rows (one strip a warp, two rows a
         * strip and thread) per 64 rows, three at head_dim 64 (two with
         * dropout) and at 128 without dropout, block mask, window or score
         * options, two otherwise, 128-key tiles (64 above head_dim 128),
         * fixed-length sequences. */
        /* Head dims between whole blocks run padded (unless
         * FLASHATTN_PLAN_TMA_PAD=0). */
        const int pdim = fa_tma_head_dim(d);
        /* Three consumer warpgroups at 64 without dropout, and at 128
         * (padded too) without dropout, a block mask, a window or score
         * options. */
        const int three = d->dropout_p == 0.0f &&
                          (pdim == 64 || (pdim == 128 && !d->block_mask && !fa_desc_has_window(d) &&
                                          !fa_desc_option_in_use(d)));
        const int rows = three ? 192 : 128, keys = pdim <= 128 ? 128 : 64;
        CHECK_MSG(pass == FA_PASS_FORWARD && k->br == rows && k->bc == keys && k->thread_rows == 2 &&
                      k->thread_cols == keys / 4 && k->work_group_size == 128 * (rows / 64 + 1) && k->stages >= 2 &&
                      dim % 32 == 0 && pdim <= 256 &&
                      (t == FA_DTYPE_F16 || t == FA_DTYPE_BF16) && !d->cu_seqlens_q && strcmp(dev->arch, "sm_90") == 0,
                  "%s: wgmma_tma %d x %d/%d, micro-tile %d x %d, %d stages", what, k->br, k->bc, k->work_group_size,
                  k->thread_rows, k->thread_cols, k->stages);
        if (fa_test_failures != before) return fa_test_failures - before;
        CHECK(k->local_mem_bytes == fa_plan_local_mem(k->variant, pass, d, k->br, k->bc, k->stages) &&
              k->local_mem_bytes <= dev->local_mem_bytes);
        return fa_test_failures - before;
    } else if (k->variant == FA_VARIANT_DECODE) {
        /* The packed decoding kernel: four warps of 16 keys, 16 to 64 rows
         * in strips of 16 (two rows a strip and thread). */
        CHECK_MSG(pass == FA_PASS_FORWARD && k->br % 16 == 0 && k->br <= 64 && k->bc == 64 &&
                      k->work_group_size == 128 && k->thread_rows == k->br / 8 && k->thread_cols == 4 &&
                      k->stages >= 2 && k->stages <= 6 && dim % 16 == 0 && (t == FA_DTYPE_F16 || t == FA_DTYPE_BF16),
                  "%s: decode %d x %d/%d, micro-tile %d x %d, %d stages", what, k->br, k->bc, k->work_group_size,
                  k->thread_rows, k->thread_cols, k->stages);
    } else if (k->variant == FA_VARIANT_MMA && dev->backend == FA_BACKEND_OPENCL) {
        /* OpenCL's: the fragments of the device's layout (planner_cl_mma.c). */
        fa_cl_mma_geometry g;
        const int ok =
            fa_cl_mma_geometry_of(dev, d, pass, k->br, k->bc, k->thread_rows, k->thread_cols, k->stages, &g);
        CHECK_MSG(ok && g.warps * fa_mma_layout_get(g.layout)->sub_group == k->work_group_size,
                  "%s: OpenCL mma %d x %d, micro-tile %d x %d, work-group %d", what, k->br, k->bc, k->thread_rows,
                  k->thread_cols, k->work_group_size);
    } else if (k->variant == FA_VARIANT_MMA && dev->backend == FA_BACKEND_HIP) {
        /* HIP's: whole wavefronts of the layer its architecture runs, each
         * owning one or two strips (planner_hip_mma.c). */
        fa_hip_mma_geometry g;
        const int ok = fa_hip_mma_geometry_of(dev, d, pass, k->br, k->bc, k->thread_rows, k->thread_cols, &g);
        const fa_hip_mma_layer_info *L = ok ? fa_hip_mma_layer_get(g.layer) : NULL;
        CHECK_MSG(L && (g.strips == 1 || g.strips == 2) && k->work_group_size == g.warps * L->lanes &&
                      L->lanes == dev->simd_width &&
                      (k->stages == 1 || (pass == FA_PASS_BACKWARD && k->stages == 2)),
                  "%s: hip mma %d x %d, micro-tile %d x %d, work-group %d", what, k->br, k->bc, k->thread_rows,
                  k->thread_cols, k->work_group_size);
    } else if (k->variant == FA_VARIANT_MMA) {
        /* Backward warps may share key strips (fa_mma_bwd_dk_split), each
         * with 1 / split of the queries. */
        const int split = pass == FA_PASS_FORWARD ? 1 : fa_mma_bwd_dk_split(d);
        const int warps = k->work_group_size / dev->simd_width / split;
        const int strips = (pass == FA_PASS_FORWARD ? k->br : k->bc) / (16 * (warps > 0 ? warps : 1));
        const int tr = pass == FA_PASS_FORWARD ? 2 * strips : k->br / (4 * split);
        const int tc = pass == FA_PASS_FORWARD ? k->bc / 4 : 2 * strips;
        CHECK_MSG(strips >= 1 && strips <= 2 && k->thread_rows == tr && k->thread_cols == tc,
                  "%s: mma micro-tile %d x %d, fragments %d x %d", what, k->thread_rows, k->thread_cols, tr, tc);
    } else {
        CHECK_MSG(in_set(k->thread_rows, threads, 4) && in_set(k->thread_cols, threads, 4),
                  "%s: micro-tile %d x %d", what, k->thread_rows, k->thread_cols);
    }
    if (fa_test_failures != before) return fa_test_failures - before;
    const int ntr = k->br / k->thread_rows, ntc = k->bc / k->thread_cols;
    CHECK_MSG(k->br % k->thread_rows == 0 && k->bc % k->thread_cols == 0, "%s", what);
    CHECK_MSG(k->work_group_size == ntr * ntc, "%s: work-group %d", what, k->work_group_size);
    CHECK_MSG(k->work_group_size <= dev->max_work_group_size, "%s: work-group %d > %d", what, k->work_group_size,
              dev->max_work_group_size);
    CHECK_MSG(k->work_group_size < dev->simd_width || k->work_group_size % dev->simd_width == 0,
              "%s: work-group %d vs simd %d", what, k->work_group_size, dev->simd_width);
    CHECK_MSG(k->variant == FA_VARIANT_MMA || k->variant == FA_VARIANT_WGMMA || k->thread_rows * k->thread_cols <= 32,
              "%s: micro-tile %d x %d", what,
              k->thread_rows, k->thread_cols);
    CHECK(k->simd_width == dev->simd_width);
    const int cl_mma = k->variant == FA_VARIANT_MMA && dev->backend == FA_BACKEND_OPENCL;
    const int hip_mma = k->variant == FA_VARIANT_MMA && dev->backend == FA_BACKEND_HIP;
    size_t lm = cl_mma    ? fa_cl_mma_tile_local_mem(dev, d, pass, k->br, k->bc, k->thread_rows, k->thread_cols,
                                                     k->stages)
                : hip_mma ? fa_hip_mma_local_mem(dev, d, pass, k)
                          : fa_plan_local_mem(k->variant, pass, d, k->br, k->bc, k->stages);
    CHECK_MSG(k->local_mem_bytes == lm && lm <= dev->local_mem_bytes, "%s: local memory %zu (formula %zu) of %zu",
              what, k->local_mem_bytes, lm, dev->local_mem_bytes);

    /* Which variants each backend may run. */
    int half = t == FA_DTYPE_F16 || t == FA_DTYPE_BF16;
    int matrix = dev->matrix_flops_per_clock_cu > 0 && dev->matrix_m > 0;
    if (k->variant == FA_VARIANT_WGMMA) {
        CHECK_MSG(dev->backend == FA_BACKEND_CUDA && matrix && half, "%s: wgmma", what);
        CHECK(k->stages == 1 || k->stages == 2);
    } else if (k->variant == FA_VARIANT_DECODE) {
        CHECK_MSG(dev->backend == FA_BACKEND_CUDA && matrix && half && d->dropout_p == 0.0f && !d->block_mask,
                  "%s: decode", what);
    } else if (cl_mma) {
        /* Head dims that are not whole fragments are padded. */
        CHECK_MSG(matrix && half && fa_cl_mma_applies(dev, d), "%s: OpenCL mma", what);
        CHECK(k->stages == 1);
        CHECK(k->work_group_size % dev->simd_width == 0);
        /* Whole fragments of the plan's layout (one of the device's). */
        fa_cl_mma_geometry g;
        const fa_mma_layout_info *L =
            fa_cl_mma_geometry_of(dev, d, pass, k->br, k->bc, k->thread_rows, k->thread_cols, k->stages, &g)
                ? fa_mma_layout_get(g.layout)
                : NULL;
        CHECK(L && fa_mma_layout_get(L->family) == fa_mma_layout_get(fa_mma_layout_of(dev)));
        const int side = pass == FA_PASS_FORWARD ? k->br : k->bc;
        CHECK(L && side % L->m == 0 && (pass == FA_PASS_FORWARD ? k->bc : k->br) % L->k == 0);
    } else if (hip_mma) {
        CHECK_MSG(matrix && half && fa_hip_mma_applies(dev, d), "%s: hip mma", what);
    } else if (k->variant == FA_VARIANT_MMA) {
        CHECK_MSG(dev->backend == FA_BACKEND_CUDA && matrix && (half || d->allow_tf32), "%s: mma", what);
        CHECK(k->stages == 1 || k->stages == 2);
        CHECK(k->work_group_size % dev->simd_width == 0);
        CHECK(k->br % dev->matrix_m == 0 && k->bc % dev->matrix_k == 0 && dim % dev->matrix_k == 0);
    } else {
        /* The streaming kernels are OpenCL's, without key splits. */
        CHECK_MSG(k->variant == FA_VARIANT_SIMT || (k->variant == FA_VARIANT_SPLITK && pass == FA_PASS_FORWARD) ||
                      (k->variant == FA_VARIANT_SIMT_STREAM && dev->backend == FA_BACKEND_OPENCL),
                  "%s: variant %s (%d)", what, fa_variant_name(k->variant), (int)k->variant);
        /* Their dK/dV micro-tile: thread_cols keys x ceil(d / (br /
         * thread_rows)) dimensions, twice. */
        if (k->variant == FA_VARIANT_SIMT_STREAM && pass == FA_PASS_BACKWARD)
            CHECK_MSG(2 * k->thread_cols * ((dim + ntr - 1) / ntr) <= 64, "%s: dK/dV micro-tile", what);
        CHECK_MSG(k->stages == 1, "%s: stages %d", what, k->stages);
        /* The output micro-tile, tr rows x ceil(d / (bc / tc)) accumulators. */
        CHECK_MSG(k->thread_rows * ((dim + ntc - 1) / ntc) <= 64, "%s: O micro-tile", what);
    }
    CHECK_MSG(k->split_k == 1 || ((k->variant == FA_VARIANT_SPLITK || k->variant == FA_VARIANT_DECODE) && k->split_k > 1),
              "%s: split_k %d", what, k->split_k);

    /* Grid and workspace: decoding's rows are a GQA group's heads times
     * the tokens, one grid row per KV head. */
    const long long group_rows = (long long)(d->heads_q / d->heads_kv) * d->seqlen_q;
    long long groups = k->variant == FA_VARIANT_DECODE
                           ? (long long)d->batch * d->heads_kv * ((group_rows + k->br - 1) / k->br) * k->split_k
                       : pass == FA_PASS_FORWARD
                           ? (long long)d->batch * d->heads_q * ((d->seqlen_q + k->br - 1) / k->br) * k->split_k
                           : (long long)d->batch * d->heads_kv * ((d->seqlen_k + k->bc - 1) / k->bc);
    CHECK_MSG(k->num_work_groups == groups, "%s: %d work-groups, expected %lld", what, k->num_work_groups, groups);
    size_t rows = (size_t)fa_attention_total_q(d) * (size_t)d->heads_q;
    /* Backward: D, and the fp32 dQ accumulator except where dQ has a
     * kernel of its own (OpenCL's SIMT kernels; its streaming and
     * matrix-unit ones in deterministic mode). */
    int dq_kernel = dev->backend == FA_BACKEND_OPENCL &&
                    (!(k->variant == FA_VARIANT_SIMT_STREAM || k->variant == FA_VARIANT_MMA) || d->deterministic);
    size_t ws = pass == FA_PASS_FORWARD ? (k->split_k > 1 ? (size_t)k->split_k * rows * (size_t)(dim + 1) * 4 : 0)
                : dq_kernel             ? rows * 4
                                        : rows * (size_t)(dim + 1) * 4;
    CHECK_MSG(k->workspace_bytes == ws, "%s: workspace %zu, expected %zu", what, k->workspace_bytes, ws);

    /* The cost is the IO model's for this plan. */
    fa_cost c = fa_io_fused(dev, d, pass, k);
    CHECK(memcmp(&c, &k->cost, sizeof c) == 0);
    CHECK(k->cost.hbm_read_bytes > 0 && k->cost.hbm_write_bytes > 0 && k->cost.flops > 0);
    CHECK(k->cost.roofline_ms == fmax(k->cost.compute_ms, k->cost.memory_ms));
    return fa_test_failures - before;
}

FA_TEST(tiles_valid_on_every_device) {
    static const int dims[] = {32, 64, 96, 128, 256}, lengths[] = {128, 512, 2048, 16384};
    int plans = 0;
    for (int i = 0; i < fa_described_device_count(); i++) {
        const fa_described_device *dd = fa_described_device_get(i);
        for (int t = 0; t < 3; t++)
            for (size_t a = 0; a < COUNT(dims); a++)
                for (size_t n = 0; n < COUNT(lengths); n++)
                    for (int causal = 0; causal <= 1; causal++) {
                        fa_attention_desc d = shape(2, lengths[n], lengths[n], 8, 2, dims[a], (fa_dtype)t);
                        d.causal = causal;
                        fa_plan_info p;
                        fa_status st = fa_plan_for_device(&dd->desc, &d, &p);
                        CHECK_MSG(st == FA_SUCCESS, "%s %s d %d N %d: %s", dd->key, fa_dtype_name((fa_dtype)t),
                                  dims[a], lengths[n], fa_last_error());
                        if (st != FA_SUCCESS) continue;
                        char what[128];
                        snprintf(what, sizeof what, "%s %s d %d N %d causal %d", dd->key,
                                 fa_dtype_name((fa_dtype)t), dims[a], lengths[n], causal);
                        if (check_kernel_plan(what, &dd->desc, &d, FA_PASS_FORWARD, &p.forward) ||
                            check_kernel_plan(what, &dd->desc, &d, FA_PASS_BACKWARD, &p.backward)) {
                            char text[4096];
                            fa_plan_info_format(&p, text, sizeof text);
                            fprintf(stderr, "%s\n%s", what, text);
                        }
                        CHECK(p.algorithm == FA_ALGO_FUSED);
                        CHECK(memcmp(&p.fused_forward, &p.forward.cost, sizeof(fa_cost)) == 0);
                        CHECK(memcmp(&p.fused_backward, &p.backward.cost, sizeof(fa_cost)) == 0);
                        fa_cost sf = fa_io_standard(&dd->desc, &d, FA_PASS_FORWARD);
                        fa_cost sb = fa_io_standard(&dd->desc, &d, FA_PASS_BACKWARD);
                        CHECK(memcmp(&sf, &p.standard_forward, sizeof sf) == 0);
                        CHECK(memcmp(&sb, &p.standard_backward, sizeof sb) == 0);
                        plans++;
                    }
    }
    CHECK(plans == fa_described_device_count() * 3 * 5 * 4 * 2);
}

FA_TEST(same_input_same_plan) {
    int32_t cu_q[] = {0, 300, 301, 1100}, cu_k[] = {0, 500, 1500, 1600};
    uint8_t mask[4 * 4];
    fa_rng r;
    fa_rng_seed(&r, 42);
    for (size_t i = 0; i < sizeof mask; i++) mask[i] = (uint8_t)(fa_rng_next(&r) & 1);
    for (int i = 0; i < fa_described_device_count(); i++) {
        const fa_device_desc *dev = &fa_described_device_get(i)->desc;
        for (int variant = 0; variant < 4; variant++) {
            fa_attention_desc d = shape(3, 1000, 1600, 12, 4, 64, FA_DTYPE_BF16);
            if (variant == 1) {
                d.cu_seqlens_q = cu_q;
                d.cu_seqlens_k = cu_k;
                d.causal = 1;
            } else if (variant == 2) {
                d.block_mask = mask;
                d.block_mask_bytes = sizeof mask;
                d.block_q = 256;
                d.block_k = 400;
                d.window_left = 100;
            } else if (variant == 3) {
                d.algorithm = FA_ALGO_STANDARD;
            }
            /* Different garbage in the two outputs: the planner must write
             * every byte, padding included. */
            fa_plan_info a, b;
            memset(&a, 0x00, sizeof a);
            memset(&b, 0xA5, sizeof b);
            CHECK_OK(fa_plan_for_device(dev, &d, &a));
            CHECK_OK(fa_plan_for_device(dev, &d, &b));
            CHECK(memcmp(&a, &b, sizeof a) == 0);
            /* And a copy of the device description plans the same. */
            fa_device_desc copy = *dev;
            memset(&b, 0x5A, sizeof b);
            CHECK_OK(fa_plan_for_device(&copy, &d, &b));
            CHECK(memcmp(&a, &b, sizeof a) == 0);
        }
    }
}

FA_TEST(local_memory_gives_different_tiles) {
    /* Kernels that hold tiles over the whole head_dim in local memory:
     * NVIDIA's OpenCL description on a backend without the streaming
     * kernels stands for 48 KiB. */
    const char *keys[] = {"h100", "nvidia-opencl as SIMT", "mi250x as SIMT"};
    fa_device_desc simt48 = *device("nvidia-opencl");
    simt48.backend = FA_BACKEND_HIP;
    simt48.matrix_flops_per_clock_cu = 0.0; /* else HIP's NVIDIA layer plans MMA */
    simt48.matrix_m = simt48.matrix_n = simt48.matrix_k = 0;
    fa_device_desc simt64 = *device("mi250x");
    simt64.matrix_flops_per_clock_cu = 0.0;
    const fa_device_desc *devs[] = {device("h100"), &simt48, &simt64};
    for (int t = 0; t < 2; t++) {
        fa_attention_desc d = shape(4, 4096, 4096, 16, 16, 128, t ? FA_DTYPE_F32 : FA_DTYPE_F16);
        fa_plan_info p[3];
        for (int i = 0; i < 3; i++) CHECK_OK(fa_plan_for_device(devs[i], &d, &p[i]));
        for (int i = 0; i < 3; i++)
            for (int j = i + 1; j < 3; j++) {
                CHECK_MSG(p[i].forward.br != p[j].forward.br || p[i].forward.bc != p[j].forward.bc,
                          "%s and %s: forward tiles %d x %d", keys[i], keys[j], p[i].forward.br, p[i].forward.bc);
                CHECK(p[i].forward.local_mem_bytes != p[j].forward.local_mem_bytes);
            }
        /* The largest local memory takes the tallest tiles and the fewest bytes. */
        CHECK(p[0].forward.br >= p[1].forward.br && p[0].forward.br >= p[2].forward.br);
        CHECK(total_bytes(&p[0].forward.cost) <= total_bytes(&p[2].forward.cost));
        CHECK(total_bytes(&p[2].forward.cost) <= total_bytes(&p[1].forward.cost));

        /* The streaming kernels hold no tile over the whole head_dim, so the
         * same 48 KiB takes 128-row tiles at head_dim 128: half the K/V
         * re-reads of the SIMT tiles, and fewer predicted bytes and less
         * predicted time in both passes (NVIDIA's OpenCL without its matrix
         * units, which take fp16 and bf16). */
        fa_device_desc fma48 = *device("nvidia-opencl");
        fma48.matrix_flops_per_clock_cu = 0;
        fma48.matrix_m = fma48.matrix_n = fma48.matrix_k = 0;
        fa_plan_info s;
        CHECK_OK(fa_plan_for_device(&fma48, &d, &s));
        CHECK_MSG(s.forward.variant == FA_VARIANT_SIMT_STREAM && s.backward.variant == FA_VARIANT_SIMT_STREAM,
                  "nvidia-opencl %s: %d / %d", fa_dtype_name(d.q.dtype), (int)s.forward.variant,
                  (int)s.backward.variant);
        CHECK(s.forward.br == 128 && p[1].forward.br <= 64);
        CHECK(s.forward.local_mem_bytes <= 48 * 1024 && s.backward.local_mem_bytes <= 48 * 1024);
        CHECK(total_bytes(&s.forward.cost) < total_bytes(&p[1].forward.cost));
        CHECK(total_bytes(&s.backward.cost) < total_bytes(&p[1].backward.cost));
        CHECK(s.forward.cost.roofline_ms < p[1].forward.cost.roofline_ms);
        CHECK(s.backward.cost.roofline_ms < p[1].backward.cost.roofline_ms);

        /* With its matrix units, fp16 runs on them in the same 48 KiB. */
        fa_plan_info m;
        CHECK_OK(fa_plan_for_device(device("nvidia-opencl"), &d, &m));
        const fa_variant want = t ? FA_VARIANT_SIMT_STREAM : FA_VARIANT_MMA;
        CHECK_MSG(m.forward.variant == want && m.backward.variant == want, "nvidia-opencl %s: %s / %s",
                  fa_dtype_name(d.q.dtype), fa_variant_name(m.forward.variant), fa_variant_name(m.backward.variant));
        CHECK(m.forward.local_mem_bytes <= 48 * 1024 && m.backward.local_mem_bytes <= 48 * 1024);
    }
}

FA_TEST(more_local_memory_never_more_bytes) {
    static const int dims[] = {64, 128, 256};
    int compared = 0;
    for (int i = 0; i < fa_described_device_count(); i++) {
        fa_device_desc dev = fa_described_device_get(i)->desc;
        for (int t = 0; t < 4; t++)
            for (size_t a = 0; a < COUNT(dims); a++)
                for (int causal = 0; causal <= 1; causal++)
                    for (int decode = 0; decode <= 1; decode++) {
                        fa_attention_desc d = decode ? shape(1, 4, 32768, 8, 8, dims[a], FA_DTYPE_F16)
                                                     : shape(2, 2048, 2048, 8, 4, dims[a], FA_DTYPE_F16);
                        d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t == 3 ? FA_DTYPE_F32 : (fa_dtype)t;
                        d.allow_tf32 = t == 3;
                        d.causal = causal;
                        double prev[2] = {-1, -1};
                        int prev_mma[2] = {-1, -1}, prev_decode[2] = {-1, -1};
                        size_t prev_mem = 0;
                        for (size_t mem = 16 * 1024; mem <= 256 * 1024; mem += 2 * 1024) {
                            dev.local_mem_bytes = mem;
                            fa_plan_info p;
                            fa_status st = fa_plan_for_device(&dev, &d, &p);
                            if (st != FA_SUCCESS) {
                                /* Only too little local memory may fail, and
                                 * never after a smaller one succeeded. */
                                CHECK_STATUS(st, FA_ERR_UNSUPPORTED);
                                CHECK_MSG(prev[0] < 0, "%s: plans at %zu but not at %zu bytes",
                                          fa_described_device_get(i)->key, prev_mem, mem);
                                continue;
                            }
                            double now[2] = {total_bytes(&p.forward.cost), total_bytes(&p.backward.cost)};
                            const fa_variant var[2] = {p.forward.variant, p.backward.variant};
                            for (int pass = 0; pass < 2; pass++) {
                                /* More local memory never leaves the matrix
                                 * units. OpenCL plans its streaming FMA tiles
                                 * where no matrix-unit tile fits (large
                                 * head_dim in little memory): they hold large
                                 * tiles in little memory, so the first
                                 * matrix-unit tiles that fit may move more
                                 * bytes. Bytes are compared within a family. */
                                const int mma = fa_variant_on_matrix_units(var[pass]);
                                CHECK_MSG(prev_mma[pass] != 1 || mma, "%s dtype %d d %d pass %d: matrix units at %zu bytes, not at %zu",
                                          fa_described_device_get(i)->key, t, dims[a], pass, prev_mem, mem);
                                if (dev.backend == FA_BACKEND_OPENCL && prev_mma[pass] == 0 && mma) prev[pass] = -1;
                                /* So does CUDA's decoding family, from the
                                 * memory its tiles fit in: its key splits
                                 * fill the device, whose partials can
                                 * outweigh the general plan's bytes where a
                                 * group is one head. */
                                if (var[pass] == FA_VARIANT_DECODE && prev_decode[pass] == 0) prev[pass] = -1;
                                prev_decode[pass] = var[pass] == FA_VARIANT_DECODE;
                                prev_mma[pass] = mma;
                                CHECK_MSG(prev[pass] < 0 || now[pass] <= prev[pass],
                                          "%s dtype %d d %d causal %d decode %d pass %d: %zu bytes of local "
                                          "memory predict %.0f bytes, %zu predicted %.0f",
                                          fa_described_device_get(i)->key, t, dims[a], causal, decode, pass, mem,
                                          now[pass], prev_mem, prev[pass]);
                                prev[pass] = now[pass];
                            }
                            prev_mem = mem;
                            compared++;
                        }
                        /* Every device plans these shapes at 256 KiB. */
                        CHECK(prev[0] >= 0);
                    }
    }
    CHECK(compared > 5000);
}

FA_TEST(decoding_splits_keys) {
    const char *gpus[] = {"h100", "mi250x", "arc-a770", "rx-7900xtx", "nvidia-opencl"};
    for (size_t g = 0; g < COUNT(gpus); g++) {
        const fa_device_desc *dev = device(gpus[g]);
        for (int t = 0; t < 3; t++)
            for (int sq = 1; sq <= 16; sq++) {
                fa_attention_desc d = shape(1, sq, 32768, 8, 8, 128, (fa_dtype)t);
                fa_plan_info p;
                CHECK_OK(fa_plan_for_device(dev, &d, &p));
                const fa_kernel_plan *k = &p.forward;
                /* On CUDA's tensor cores decoding has a kernel of its own
                 * (decoding_packs_gqa_groups). */
                if (k->variant == FA_VARIANT_DECODE) {
                    CHECK_MSG(g == 0 && t != FA_DTYPE_F32, "%s %s: decode", gpus[g], fa_dtype_name((fa_dtype)t));
                    continue;
                }
                CHECK_MSG(k->variant == FA_VARIANT_SPLITK && k->split_k > 1, "%s sq %d: %s, split_k %d", gpus[g], sq,
                          fa_variant_name(k->variant), k->split_k);
                if (k->split_k <= 1) continue;
                int tiles = (sq + k->br - 1) / k->br;
                int key_tiles = (32768 + k->bc - 1) / k->bc;
                /* The splits cover the compute units, the split before last
                 * would not, and each split keeps at least two key tiles. */
                CHECK(k->num_work_groups == 8 * tiles * k->split_k);
                CHECK(k->num_work_groups >= dev->compute_units);
                CHECK(8 * tiles * (k->split_k - 1) < dev->compute_units);
                CHECK(2 * k->split_k <= key_tiles);
                CHECK(k->workspace_bytes == (size_t)k->split_k * (size_t)sq * 8 * (128 + 1) * 4);
                /* The merge's bytes are in the cost. */
                fa_kernel_plan whole = *k;
                whole.variant = FA_VARIANT_SIMT;
                whole.split_k = 1;
                whole.num_work_groups = 8 * tiles;
                fa_cost c = fa_io_fused(dev, &d, FA_PASS_FORWARD, &whole);
                double partials = (double)k->split_k * 8 * sq * (128 + 1) * 4;
                CHECK_NEAR(k->cost.hbm_write_bytes - c.hbm_write_bytes, partials, 0.0);
                CHECK(k->cost.roofline_ms < c.roofline_ms);
                /* The backward never splits. */
                CHECK(p.backward.split_k == 1 && p.backward.variant != FA_VARIANT_SPLITK);
            }
    }
    /* A 2-core CPU is covered without splitting; long query sequences and
     * short key sequences do not split either. */
    fa_attention_desc d = shape(1, 1, 32768, 8, 8, 128, FA_DTYPE_F16);
    fa_plan_info p;
    CHECK_OK(fa_plan_for_device(device("pocl-cpu"), &d, &p));
    CHECK(p.forward.split_k == 1 && p.forward.variant == FA_VARIANT_SIMT);
    d = shape(1, 4096, 4096, 8, 8, 128, FA_DTYPE_F16);
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.split_k == 1 && p.forward.variant == FA_VARIANT_WGMMA_TMA);
    d = shape(1, 1, 256, 8, 8, 128, FA_DTYPE_F16);
    CHECK_OK(fa_plan_for_device(device("nvidia-opencl"), &d, &p));
    CHECK(p.forward.split_k == 1);
}

/* The warp-specialised backward, planned unless turned off
 * (FLASHATTN_PLAN_TMA_BWD=0): the warpgroup backward's tile and options
 * with a producer warpgroup more, its shared memory by fa_plan_local_mem;
 * varlen keeps the warpgroup kernel. */
FA_TEST(tma_backward_opt_in) {
    fa_attention_desc d = shape(2, 2048, 2048, 16, 16, 128, FA_DTYPE_BF16);
    fa_plan_info off, on;
    setenv("FLASHATTN_PLAN_TMA_BWD", "0", 1);
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &off));
    unsetenv("FLASHATTN_PLAN_TMA_BWD");
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &on));
    CHECK(off.backward.variant == FA_VARIANT_WGMMA && on.backward.variant == FA_VARIANT_WGMMA_TMA);
    CHECK(on.backward.br == off.backward.br && on.backward.bc == off.backward.bc &&
          on.backward.work_group_size == off.backward.work_group_size + 128);
    CHECK(on.backward.local_mem_bytes ==
          fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, &d, on.backward.br, on.backward.bc, 2));
    /* 128 keys at head_dim 128, causal or not: three dS^T tiles (each
     * step's dQ is added during the next), the dQ tile of 64 rows padded to
     * 136 floats, the barriers; two dS^T tiles with a window or
     * deterministic (each step's dQ in its own step). */
    for (int causal = 0; causal < 2; causal++) {
        fa_attention_desc c = d;
        c.causal = causal;
        CHECK_OK(fa_plan_for_device(device("h100"), &c, &on));
        CHECK(fa_tma_bwd_dq_lag(&c, on.backward.bc));
        CHECK(on.backward.bc == 128 &&
              on.backward.local_mem_bytes == 2 * (128 * (2 * 128 + 2 * 2 * 64) + 3 * 128 * 64) + 4 * 2 * 2 * 64 +
                                                 8 * 9 + 16 + 4 * 64 * 136);
    }
    for (int k = 0; k < 3; k++) {
        fa_attention_desc n = d;
        n.causal = k == 0;
        n.window_right = k != 2 ? 200 : -1;
        n.deterministic = k == 2;
        CHECK_OK(fa_plan_for_device(device("h100"), &n, &on));
        CHECK_MSG(!fa_tma_bwd_dq_lag(&n, on.backward.bc) && on.backward.bc == 128 &&
                      on.backward.local_mem_bytes == 2 * (128 * (2 * 128 + 2 * 2 * 64) + 2 * 128 * 64) +
                                                         4 * 2 * 2 * 64 + 8 * 9 + 16 + 4 * 64 * 136,
                  "case %d: %zu bytes", k, on.backward.local_mem_bytes);
    }
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &on));
    static const int32_t cu[3] = {0, 2048, 4096};
    fa_attention_desc v = d;
    v.cu_seqlens_q = v.cu_seqlens_k = cu;
    CHECK_OK(fa_plan_for_device(device("h100"), &v, &on));
    CHECK(on.backward.variant == FA_VARIANT_WGMMA);
    /* Score options above head_dim 64 keep the warpgroup backward (they
     * spilled in the warp-specialised one). */
    fa_attention_desc c = d;
    c.softcap = 30.0f;
    CHECK_OK(fa_plan_for_device(device("h100"), &c, &on));
    CHECK(on.backward.variant == FA_VARIANT_WGMMA);
    /* head_dim 64: 128 queries a step, causal or not; 64 with a window,
     * dropout, softcap or deterministic (that tile spills with them). */
    for (int k = 0; k < 6; k++) {
        fa_attention_desc s = shape(2, 4096, 4096, 16, 16, 64, FA_DTYPE_F16);
        s.causal = k == 1;
        if (k == 2) s.window_left = 100;
        if (k == 3) s.dropout_p = 0.1f;
        if (k == 4) s.softcap = 30.0f;
        s.deterministic = k == 5;
        CHECK_OK(fa_plan_for_device(device("h100"), &s, &on));
        const int br = k < 2 ? 128 : 64;
        CHECK_MSG(on.backward.variant == FA_VARIANT_WGMMA_TMA && on.backward.br == br && on.backward.bc == 128 &&
                      on.backward.thread_rows == br / 4 && on.backward.work_group_size == 384 &&
                      on.backward.local_mem_bytes ==
                          fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, &s, br, 128, on.backward.stages),
                  "d64 case %d: %s %d x %d", k, fa_variant_name(on.backward.variant), on.backward.br, on.backward.bc);
    }
    unsetenv("FLASHATTN_PLAN_TMA_BWD");
}

/* Head dims between whole 64-column blocks on the warp-specialised forward
 * built for the next block: its tiles, its local memory and compute time
 * those of the padded problem, its bytes those of the problem; with
 * FLASHATTN_PLAN_TMA_PAD=0, mma.sync as before. */
FA_TEST(tma_padded_head_dims) {
    static const int dims[][3] = {{96, 128, 128}, {160, 192, 64}, {224, 256, 64}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        fa_attention_desc d = shape(2, 4096, 4096, 16, 16, dims[i][0], FA_DTYPE_BF16);
        fa_attention_desc padded = d;
        padded.head_dim = dims[i][1];
        CHECK(fa_tma_head_dim(&d) == dims[i][1] && fa_tma_head_dim(&padded) == dims[i][1]);
        fa_plan_info off, on, ref;
        setenv("FLASHATTN_PLAN_TMA_PAD", "0", 1);
        CHECK_OK(fa_plan_for_device(device("h100"), &d, &off));
        unsetenv("FLASHATTN_PLAN_TMA_PAD");
        CHECK_OK(fa_plan_for_device(device("h100"), &padded, &ref));
        CHECK_OK(fa_plan_for_device(device("h100"), &d, &on));
        CHECK(off.forward.variant == FA_VARIANT_MMA && on.forward.variant == FA_VARIANT_WGMMA_TMA);
        CHECK(on.forward.br == ref.forward.br && on.forward.bc == dims[i][2] && on.forward.bc == ref.forward.bc &&
              on.forward.stages == ref.forward.stages && on.forward.local_mem_bytes == ref.forward.local_mem_bytes);
        CHECK(on.forward.local_mem_bytes == fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_FORWARD, &d,
                                                              on.forward.br, on.forward.bc, on.forward.stages));
        const fa_cost mine = fa_io_fused(device("h100"), &d, FA_PASS_FORWARD, &on.forward);
        CHECK(on.forward.cost.hbm_read_bytes == mine.hbm_read_bytes &&
              on.forward.cost.hbm_write_bytes == mine.hbm_write_bytes);
        CHECK_NEAR(on.forward.cost.compute_ms, ref.forward.cost.compute_ms, 0.0);
        /* The backward runs padded too, to 192 or 256 (fa_tma_bwd_head_dim):
         * the padded problem's plan, the problem's bytes; 96 runs built for
         * itself in 128's tiles, its own local memory, bytes and compute;
         * mma.sync with the padding switched off. */
        fa_attention_desc bpad = d;
        bpad.head_dim = fa_tma_bwd_head_dim(&d);
        CHECK(bpad.head_dim == (dims[i][0] < 128 ? 96 : dims[i][0] < 192 ? 192 : 256));
        bpad.head_dim = (bpad.head_dim + 63) / 64 * 64;
        fa_plan_info bref;
        CHECK_OK(fa_plan_for_device(device("h100"), &bpad, &bref));
        CHECK(off.backward.variant == FA_VARIANT_MMA && on.backward.variant == FA_VARIANT_WGMMA_TMA &&
              bref.backward.variant == FA_VARIANT_WGMMA_TMA);
        CHECK(on.backward.br == bref.backward.br && on.backward.bc == bref.backward.bc &&
              on.backward.local_mem_bytes == fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, &d,
                                                               on.backward.br, on.backward.bc, on.backward.stages));
        /* The dQ accumulator: rows of the built head_dim and D. */
        CHECK(on.backward.workspace_bytes == (size_t)2 * 4096 * 16 * (size_t)(fa_tma_bwd_head_dim(&d) + 1) * 4);
        CHECK((dims[i][0] == 96) == (on.backward.local_mem_bytes < bref.backward.local_mem_bytes));
        const fa_cost bmine = fa_io_fused(device("h100"), &d, FA_PASS_BACKWARD, &on.backward);
        CHECK(on.backward.cost.hbm_read_bytes == bmine.hbm_read_bytes &&
              on.backward.cost.hbm_write_bytes == bmine.hbm_write_bytes);
        CHECK_NEAR(on.backward.cost.compute_ms,
                   dims[i][0] == 96 ? bmine.compute_ms : bref.backward.cost.compute_ms, 0.0);
        /* Deterministic mode keeps mma.sync (its dQ kernel reads rows). */
        d.deterministic = 1;
        fa_plan_info det;
        CHECK_OK(fa_plan_for_device(device("h100"), &d, &det));
        CHECK(det.backward.variant == FA_VARIANT_MMA);
    }
    /* Not 64 itself, nor fp32, nor head dims off the 32-column grid. */
    fa_attention_desc d = shape(2, 4096, 4096, 16, 16, 80, FA_DTYPE_BF16);
    fa_plan_info p;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_MMA);
    d.head_dim = 96;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant != FA_VARIANT_WGMMA_TMA);
    unsetenv("FLASHATTN_PLAN_TMA_PAD");
}

FA_TEST(variants_by_backend) {
    fa_attention_desc d = shape(2, 2048, 2048, 16, 16, 128, FA_DTYPE_F16);
    fa_plan_info p;
    /* The warpgroup backward's plans (the warp-specialised one converts
     * them: tma_backward_opt_in). */
    setenv("FLASHATTN_PLAN_TMA_BWD", "0", 1);
    /* CUDA with tensor cores: MMA for fp16, bf16 and fp32 with TF32; on
     * sm_90 the fp16/bf16 forward runs warpgroup MMA, double-buffered: in
     * two blocks an SM where the registers of 128 x 64 allow them, in one
     * of 128 x 128 where dropout's take them. */
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_WGMMA_TMA && p.backward.variant == FA_VARIANT_WGMMA);
    CHECK(p.forward.br == 192 && p.forward.bc == 128 && p.forward.stages == 2 && p.forward.work_group_size == 512);
    /* Where the tensor maps cannot describe the problem (varlen), or when
     * asked (FLASHATTN_PLAN_TMA=0), the warpgroup forward without them. */
    setenv("FLASHATTN_PLAN_TMA", "0", 1);
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    unsetenv("FLASHATTN_PLAN_TMA");
    CHECK(p.forward.variant == FA_VARIANT_WGMMA);
    CHECK(p.forward.br == 128 && p.forward.bc == 64 && p.forward.stages == 2 && p.forward.work_group_size == 256);
    CHECK(fa_wgmma_blocks_per_sm(&d, p.forward.bc) == 2);
    {
        static const int32_t cu[3] = {0, 2048, 4096};
        fa_attention_desc v = d;
        v.cu_seqlens_q = cu;
        v.cu_seqlens_k = cu;
        CHECK_OK(fa_plan_for_device(device("h100"), &v, &p));
        CHECK(p.forward.variant == FA_VARIANT_WGMMA);
        /* A stride the maps cannot take (2^40 bytes between sequences). */
        v = d;
        v.q.stride_seq = 16 * 128;
        v.q.stride_head = 128;
        v.q.stride_batch = (int64_t)1 << 39;
        CHECK_OK(fa_plan_for_device(device("h100"), &v, &p));
        CHECK(p.forward.variant == FA_VARIANT_WGMMA);
    }
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    /* The backward: 128 keys in two warpgroups against 64 queries. */
    CHECK(p.backward.br == 64 && p.backward.bc == 128 && p.backward.stages == 2 &&
          p.backward.work_group_size == 256);
    /* Dropout's registers: one block of 128 x 128 forward, and the
     * backward in one warpgroup of 64 keys, two stages, at head_dim 128;
     * with a window or a causal mask beside it, on mma.sync. */
    d.dropout_p = 0.1f;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_WGMMA_TMA && p.forward.br == 128 && p.forward.bc == 128);
    CHECK(p.backward.variant == FA_VARIANT_WGMMA && p.backward.br == 64 && p.backward.bc == 64 &&
          p.backward.stages == 2 && p.backward.work_group_size == 128);
    d.window_left = 256;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.backward.variant == FA_VARIANT_MMA);
    d.window_left = -1;
    d.causal = 1;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.backward.variant == FA_VARIANT_MMA);
    d.causal = 0;
    /* Windows, block masks and varlen leave the warpgroup backward room. */
    d.dropout_p = 0.0f;
    d.window_left = 256;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.backward.variant == FA_VARIANT_WGMMA && p.backward.br == 64);
    d.window_left = -1;
    d.dropout_p = 0.0f;
    d.head_dim = 256; /* 128 x 128 would need more registers than a thread has */
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_WGMMA_TMA && p.forward.br == 128 && p.forward.bc == 64);
    /* Score options spilled in the warp-specialised kernel at 256. */
    d.softcap = 10.0f;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_WGMMA && p.forward.br == 128 && p.forward.bc == 64);
    d.softcap = 0.0f;
    d.head_dim = 96; /* not whole 64-column blocks: padded to 128 */
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_WGMMA_TMA && p.forward.br == 192 && p.forward.bc == 128);
    setenv("FLASHATTN_PLAN_TMA_PAD", "0", 1); /* or mma.sync */
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    unsetenv("FLASHATTN_PLAN_TMA_PAD");
    CHECK(p.forward.variant == FA_VARIANT_MMA);
    /* sm_80 has no warpgroup MMA. 227 KiB would hold double-buffered K and
     * V, but the 128 x 64 tile's accumulators leave no registers for the
     * second stage's addresses. */
    d.head_dim = 128;
    fa_device_desc sm80 = *device("h100");
    snprintf(sm80.arch, sizeof sm80.arch, "sm_80");
    CHECK_OK(fa_plan_for_device(&sm80, &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_MMA);
    CHECK(p.forward.br == 128 && p.forward.bc == 64 && p.forward.stages == 1);
    d.head_dim = 64; /* 128 x 32 would have room, 128 x 128 has not */
    CHECK_OK(fa_plan_for_device(&sm80, &d, &p));
    CHECK(p.forward.br == 128 && p.forward.bc == 128 && p.forward.stages == 1);
    d.head_dim = 128;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_BF16;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_WGMMA_TMA);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_SIMT && p.backward.variant == FA_VARIANT_SIMT);
    d.allow_tf32 = 1;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_MMA);
    d.allow_tf32 = 0;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
    /* A head_dim the m16n8k16 shape does not divide runs SIMT. */
    d.head_dim = 40;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_SIMT);
    d.head_dim = 128;
    /* HIP on CDNA's matrix cores: MMA tiles in one stage. */
    const fa_device_desc *amd[] = {device("mi250x"), device("mi300x")};
    for (size_t i = 0; i < COUNT(amd); i++) {
        CHECK_OK(fa_plan_for_device(amd[i], &d, &p));
        CHECK_MSG(p.forward.variant == FA_VARIANT_MMA && p.backward.variant == FA_VARIANT_MMA, "%s: %s / %s",
                  amd[i]->name, fa_variant_name(p.forward.variant), fa_variant_name(p.backward.variant));
        CHECK(p.forward.stages == 1 && p.backward.stages == 1);
    }
    /* CUDA without matrix units, HIP without (RDNA2) or in fp32, OpenCL
     * (even with XMX), the reference: SIMT tiles, which OpenCL also runs
     * in its streaming kernels (at head_dim 128 in 48 or 64 KiB they take
     * the larger tiles). */
    fa_device_desc plain = *device("h100");
    plain.matrix_flops_per_clock_cu = 0;
    plain.matrix_m = plain.matrix_n = plain.matrix_k = 0;
    fa_device_desc plain_cl = *device("nvidia-opencl");
    plain_cl.matrix_flops_per_clock_cu = 0;
    plain_cl.matrix_m = plain_cl.matrix_n = plain_cl.matrix_k = 0;
    fa_device_desc ref = *device("pocl-cpu");
    ref.backend = FA_BACKEND_REFERENCE;
    fa_device_desc rdna2 = *device("mi250x");
    snprintf(rdna2.arch, sizeof rdna2.arch, "gfx1030");
    rdna2.simd_width = 32;
    rdna2.matrix_flops_per_clock_cu = 0;
    const fa_device_desc *simt[] = {&plain, &rdna2, &plain_cl, &ref};
    for (size_t i = 0; i < COUNT(simt); i++) {
        CHECK_OK(fa_plan_for_device(simt[i], &d, &p));
        const fa_variant want = simt[i]->backend == FA_BACKEND_OPENCL ? FA_VARIANT_SIMT_STREAM : FA_VARIANT_SIMT;
        CHECK_MSG(p.forward.variant == want && p.backward.variant == want, "%s: %s / %s", simt[i]->name,
                  fa_variant_name(p.forward.variant), fa_variant_name(p.backward.variant));
        CHECK(p.forward.stages == 1 && p.backward.stages == 1);
    }
    /* OpenCL on matrix units: fp16 and bf16, head dims the fragments do not
     * divide padded (40 here), one stage; fp32 stays on the FMA kernels. */
    const int dims[] = {128, 40};
    for (size_t i = 0; i < COUNT(dims); i++)
        for (int t = 0; t < 3; t++) {
            fa_attention_desc c = shape(2, 2048, 2048, 16, 16, dims[i], (fa_dtype)t);
            CHECK_OK(fa_plan_for_device(device("nvidia-opencl"), &c, &p));
            const fa_variant want = t == FA_DTYPE_F32 ? FA_VARIANT_SIMT_STREAM : FA_VARIANT_MMA;
            const fa_variant want_bwd = t == FA_DTYPE_F32 && dims[i] < 64 ? FA_VARIANT_SIMT : want;
            CHECK_MSG(p.forward.variant == (t == FA_DTYPE_F32 && dims[i] < 96 ? FA_VARIANT_SIMT : want) &&
                          p.backward.variant == want_bwd,
                      "nvidia-opencl %s d %d: %s / %s", fa_dtype_name((fa_dtype)t), dims[i],
                      fa_variant_name(p.forward.variant), fa_variant_name(p.backward.variant));
            CHECK(p.forward.stages == 1 && p.backward.stages == 1);
        }
    /* Standard attention: no tiles, the standard cost, the fused one beside it. */
    d.algorithm = FA_ALGO_STANDARD;
    CHECK_OK(fa_plan_for_device(device("mi250x"), &d, &p));
    CHECK(p.algorithm == FA_ALGO_STANDARD);
    CHECK(p.forward.variant == FA_VARIANT_STANDARD && p.backward.variant == FA_VARIANT_STANDARD);
    CHECK(p.forward.local_mem_bytes == 0 && p.forward.br == 0);
    CHECK(memcmp(&p.forward.cost, &p.standard_forward, sizeof(fa_cost)) == 0);
    CHECK(memcmp(&p.backward.cost, &p.standard_backward, sizeof(fa_cost)) == 0);
    CHECK(p.fused_forward.hbm_read_bytes > 0 && total_bytes(&p.fused_forward) < total_bytes(&p.standard_forward));
    /* S and P, each 2 x 16 x 2048^2 fp16. */
    CHECK(p.forward.workspace_bytes == 2ull * 2 * 16 * 2048 * 2048 * 2);
    unsetenv("FLASHATTN_PLAN_TMA_BWD");
}

FA_TEST(invalid_devices_rejected) {
    fa_attention_desc d = shape(1, 128, 128, 4, 4, 64, FA_DTYPE_F16);
    fa_plan_info p;
    const fa_device_desc *good = device("h100");
    CHECK_STATUS(fa_plan_for_device(NULL, &d, &p), FA_ERR_NULL_POINTER);
    CHECK(strstr(fa_last_error(), "device") != NULL);
    CHECK_STATUS(fa_plan_for_device(good, NULL, &p), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_plan_for_device(good, &d, NULL), FA_ERR_NULL_POINTER);

    int n = 0;
#define SPOIL(name, stmt)                                                                                    \
    do {                                                                                                     \
        fa_device_desc bad = *good;                                                                          \
        fa_device_desc *x = &bad;                                                                            \
        stmt;                                                                                                \
        memset(&p, 0xA5, sizeof p);                                                                          \
        CHECK_STATUS(fa_plan_for_device(x, &d, &p), FA_ERR_INVALID_ARGUMENT);                                \
        CHECK_MSG(strstr(fa_last_error(), name) != NULL, "message \"%s\" does not name %s", fa_last_error(), \
                  name);                                                                                     \
        fa_plan_info zero;                                                                                   \
        memset(&zero, 0, sizeof zero);                                                                       \
        CHECK(memcmp(&p, &zero, sizeof p) == 0);                                                             \
        n++;                                                                                                 \
    } while (0)
    SPOIL("local_mem_bytes", x->local_mem_bytes = 0);
    SPOIL("local_mem_bytes", x->local_mem_bytes = (size_t)-4096);
    SPOIL("max_work_group_size", x->max_work_group_size = 0);
    SPOIL("max_work_group_size", x->max_work_group_size = -1);
    SPOIL("simd_width", x->simd_width = 0);
    SPOIL("compute_units", x->compute_units = -3);
    SPOIL("clock_mhz", x->clock_mhz = 0);
    SPOIL("bandwidth_gbs", x->bandwidth_gbs = 0.0);
    SPOIL("bandwidth_gbs", x->bandwidth_gbs = -1.0);
    SPOIL("bandwidth_gbs", x->bandwidth_gbs = NAN);
    SPOIL("bandwidth_gbs", x->bandwidth_gbs = INFINITY);
    SPOIL("fp32_flops_per_clock_cu", x->fp32_flops_per_clock_cu = 0.0);
    SPOIL("matrix_flops_per_clock_cu", x->matrix_flops_per_clock_cu = -1.0);
    SPOIL("backend", x->backend = (fa_backend)7);
    SPOIL("backend", x->backend = FA_BACKEND_ANY);
#undef SPOIL
    CHECK(n == 15);

    /* The descriptor is checked too (its own message). */
    d.batch = 0;
    CHECK_STATUS(fa_plan_for_device(good, &d, &p), FA_ERR_INVALID_SIZE);
    CHECK(strstr(fa_last_error(), "batch") != NULL);
    d.batch = 1;
    d.head_dim = 12;
    CHECK_STATUS(fa_plan_for_device(good, &d, &p), FA_ERR_UNSUPPORTED_HEAD_DIM);
    d.head_dim = 64;

    /* Too little local memory for any tile: unsupported, naming the field;
     * standard attention needs none. */
    fa_device_desc tiny = *good;
    tiny.local_mem_bytes = 1024;
    CHECK_STATUS(fa_plan_for_device(&tiny, &d, &p), FA_ERR_UNSUPPORTED);
    CHECK(strstr(fa_last_error(), "local_mem_bytes") != NULL);
    d.algorithm = FA_ALGO_STANDARD;
    CHECK_OK(fa_plan_for_device(&tiny, &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_STANDARD && p.fused_forward.hbm_read_bytes == 0);
    /* A success leaves no stale message. */
    CHECK(strcmp(fa_last_error(), "") == 0);
}

static double seconds_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Problem 4 of issue 21: planning took time proportional to the sequence
 * length (minutes for 2 x 10^9 tokens). The largest accepted shapes plan
 * on every described device in well under a second each, and their
 * predicted numbers stay finite and consistent. */
FA_TEST(largest_shapes_plan_at_once) {
    static uint8_t mask[128 * 128];
    for (size_t i = 0; i < sizeof mask; i++) mask[i] = (uint8_t)(i % 3 != 0);
    const int32_t cu_one[2] = {0, INT32_MAX};
    const int32_t cu_two[3] = {0, 1000000000, 2000000000};
    double slowest = 0.0;
    int planned = 0;
    for (int shape_i = 0; shape_i < 7; shape_i++) {
        fa_attention_desc d = shape(1, INT32_MAX, INT32_MAX, 1, 1, 64, FA_DTYPE_F16);
        const char *what = "2^31 - 1 tokens";
        switch (shape_i) {
        case 1: d.causal = 1; what = "2^31 - 1 tokens, causal"; break;
        case 2:
            d.window_left = 4096;
            d.window_right = 0;
            what = "2^31 - 1 tokens, window 4096";
            break;
        case 3:
            d.block_q = d.block_k = 1 << 24; /* 128 x 128 blocks */
            d.block_mask = mask;
            d.block_mask_bytes = sizeof mask;
            d.causal = 1;
            what = "2^31 - 1 tokens, block-sparse";
            break;
        case 4:
            d.cu_seqlens_q = d.cu_seqlens_k = cu_one;
            what = "varlen, one 2^31 - 1 token sequence";
            break;
        case 5:
            d = shape(2, 1000000000, 1000000000, 1, 1, 64, FA_DTYPE_F16);
            what = "2 x 10^9 tokens";
            break;
        default:
            d = shape(2, 1000000000, 1000000000, 1, 1, 64, FA_DTYPE_BF16);
            d.cu_seqlens_q = d.cu_seqlens_k = cu_two;
            d.causal = 1;
            what = "varlen 2 x 10^9 tokens, causal";
        }
        for (int i = 0; i < fa_described_device_count(); i++) {
            const fa_described_device *dd = fa_described_device_get(i);
            fa_plan_info p;
            const double t0 = seconds_now();
            fa_status st = fa_plan_for_device(&dd->desc, &d, &p);
            const double dt = seconds_now() - t0;
            if (dt > slowest) slowest = dt;
            CHECK_MSG(st == FA_SUCCESS, "%s on %s: %s", what, dd->key, fa_last_error());
            CHECK_MSG(dt < 1.0, "%s on %s: planning took %.3f s", what, dd->key, dt);
            if (st != FA_SUCCESS) continue;
            planned++;
            const fa_cost *c[2] = {&p.forward.cost, &p.backward.cost};
            for (int k = 0; k < 2; k++)
                CHECK_MSG(isfinite(c[k]->roofline_ms) && c[k]->roofline_ms > 0 && c[k]->hbm_read_bytes > 0 &&
                              c[k]->flops > 0,
                          "%s on %s: cost %g ms, %g bytes", what, dd->key, c[k]->roofline_ms, c[k]->hbm_read_bytes);
        }
    }
    CHECK(planned == 7 * fa_described_device_count());
    fprintf(stderr, "  slowest plan of the largest shapes: %.4f s\n", slowest);
}

/* A device whose work-groups cannot hold the smallest tile's work-items is
 * told so: the message blames the work-group size, not local memory. */
FA_TEST(work_group_size_named) {
    fa_attention_desc d = shape(1, 128, 128, 4, 4, 64, FA_DTYPE_F32);
    fa_device_desc one = *device("pocl-cpu");
    one.max_work_group_size = 1;
    fa_plan_info p;
    CHECK_STATUS(fa_plan_for_device(&one, &d, &p), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "max_work_group_size = 1") != NULL, "message: %s", fa_last_error());
    CHECK_MSG(strstr(fa_last_error(), "local_mem") == NULL, "message blames local memory: %s", fa_last_error());
}

FA_TEST(format_shows_plan) {
    fa_attention_desc d = shape(4, 4096, 4096, 16, 16, 128, FA_DTYPE_F16);
    fa_plan_info p;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    char full[8192];
    size_t need = fa_plan_info_format(&p, full, sizeof full);
    CHECK(need > 200 && need < sizeof full && strlen(full) == need);
    char want[64];
    snprintf(want, sizeof want, "tile %d x %d", p.forward.br, p.forward.bc);
    CHECK_MSG(strstr(full, want) != NULL, "no \"%s\" in:\n%s", want, full);
    snprintf(want, sizeof want, "tile %d x %d", p.backward.br, p.backward.bc);
    CHECK(strstr(full, want) != NULL);
    snprintf(want, sizeof want, "work-group %d", p.forward.work_group_size);
    CHECK(strstr(full, want) != NULL);
    CHECK(strstr(full, "mma") != NULL && strstr(full, "forward") && strstr(full, "backward"));
    CHECK(strstr(full, "standard attention") != NULL && strstr(full, "roofline") != NULL);
    /* The H100's forward is the warp-specialised one, and says so. */
    CHECK_MSG(p.forward.variant == FA_VARIANT_WGMMA_TMA &&
                  strstr(full, "forward: wgmma_tma") != NULL &&
                  strstr(full, "pipeline: a producer warpgroup's tensor-map copies into 2 stages, 2 consumer "
                               "warpgroups of 64 rows") != NULL,
              "no warp-specialised pipeline in:\n%s", full);

    /* Truncation: the same length needed, a NUL-terminated prefix written. */
    for (size_t size = 0; size < 64; size += 7) {
        char small[64];
        memset(small, 'x', sizeof small);
        size_t got = fa_plan_info_format(&p, size ? small : NULL, size);
        CHECK(got == need);
        if (size) {
            CHECK(strlen(small) == size - 1);
            CHECK(strncmp(small, full, size - 1) == 0);
            CHECK(small[size] == 'x');
        }
    }
    CHECK(fa_plan_info_format(NULL, NULL, 0) > 0);

    CHECK(strcmp(fa_variant_name(FA_VARIANT_SIMT), "simt") == 0);
    CHECK(strcmp(fa_variant_name(FA_VARIANT_MMA), "mma") == 0);
    CHECK(strcmp(fa_variant_name(FA_VARIANT_SPLITK), "splitk") == 0);
    CHECK(strcmp(fa_variant_name(FA_VARIANT_STANDARD), "standard") == 0);
    CHECK(strcmp(fa_variant_name(FA_VARIANT_WGMMA_TMA), "wgmma_tma") == 0);
    CHECK(strcmp(fa_variant_name((fa_variant)99), "unknown") == 0);
}

/* Above head_dim 128 the fp16/bf16 backward stays on tensor cores with
 * warps sharing key strips (bwd_mma.cu DK_SPLIT; at 192 and 256 on sm_90
 * without dropout, warpgroups on the warp-specialised one, which 160 and
 * 224 run padded to 192 and 256 but in deterministic mode): 8 warps of 64
 * keys, the
 * micro-tile a thread's share of the queries, the P^T tile beside dS^T in
 * the local-memory figure, and the plan's text saying so. TF32 and the
 * head dimensions up to 128 keep one warp a strip. */
FA_TEST(wide_heads_share_key_strips) {
    fa_device_desc sm80 = *device("h100");
    snprintf(sm80.arch, sizeof sm80.arch, "sm_80");
    sm80.local_mem_bytes = 166912;
    const fa_device_desc *devs[] = {device("h100"), &sm80};
    static const int dims[] = {160, 192, 224, 256};
    for (size_t v = 0; v < COUNT(devs); v++)
        for (size_t i = 0; i < COUNT(dims); i++)
            for (int opt = 0; opt < 3; opt++) {
                fa_attention_desc d = shape(2, 4096, 4096, 16, 4, dims[i], opt == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16);
                d.causal = opt == 2;
                d.dropout_p = opt == 2 ? 0.1f : 0.0f;
                d.deterministic = opt == 1;
                CHECK(fa_mma_bwd_dk_split(&d) == 2);
                fa_plan_info p;
                CHECK_OK(fa_plan_for_device(devs[v], &d, &p));
                const fa_kernel_plan *b = &p.backward;
                /* sm_90 at 192 and 256 without dropout: the
                 * warp-specialised backward, two consumer warpgroups
                 * sharing 64 keys. */
                /* 160 and 224 padded to 192 and 256, not deterministic (opt 1). */
                if (v == 0 && opt == 0 && (dims[i] == 160 || dims[i] == 224)) {
                    fa_attention_desc padded = d;
                    padded.head_dim = dims[i] == 160 ? 192 : 256;
                    CHECK_MSG(b->variant == FA_VARIANT_WGMMA_TMA && b->work_group_size == 384 && b->br == 64 &&
                                  b->bc == 64 &&
                                  b->local_mem_bytes ==
                                      fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, &padded, 64, 64, 2),
                              "d%d padded: backward %s %d x %d / %d", dims[i], fa_variant_name(b->variant), b->br,
                              b->bc, b->work_group_size);
                    continue;
                }
                if (v == 0 && (dims[i] == 192 || dims[i] == 256) && opt < 2) {
                    CHECK_MSG(b->variant == FA_VARIANT_WGMMA_TMA && b->work_group_size == 384 && b->br == 64 &&
                                  b->bc == 64 &&
                                  b->local_mem_bytes == fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_BACKWARD, &d,
                                                                          64, 64, 2),
                              "d%d opt %d: backward %s %d x %d / %d", dims[i], opt, fa_variant_name(b->variant), b->br,
                              b->bc, b->work_group_size);
                    char text[4096];
                    fa_plan_info_format(&p, text, sizeof text);
                    CHECK_MSG(strstr(text, "key strips shared by 2 warpgroups") != NULL, "%s", text);
                    continue;
                }
                CHECK_MSG(b->variant == FA_VARIANT_MMA && b->work_group_size == 256 && b->bc == 64 &&
                              b->thread_rows * 8 == b->br && b->thread_cols == 2,
                          "%s d%d opt %d: backward %s %d x %d / %d, micro-tile %d x %d", devs[v]->arch, dims[i], opt,
                          fa_variant_name(b->variant), b->br, b->bc, b->work_group_size, b->thread_rows,
                          b->thread_cols);
                const size_t e = 2, dim = (size_t)dims[i], r = (size_t)b->br, c = (size_t)b->bc,
                             st = (size_t)b->stages;
                CHECK(b->local_mem_bytes == 2 * fa_mma_tile_bytes(c, e * dim) + st * 2 * fa_mma_tile_bytes(r, e * dim) +
                                                2 * fa_mma_tile_bytes(c, e * r) + 8 * st * r);
                char text[4096];
                fa_plan_info_format(&p, text, sizeof text);
                CHECK_MSG(strstr(text, "key strips shared by 2 warps") != NULL, "%s", text);
            }
    fa_attention_desc d = shape(2, 4096, 4096, 16, 16, 128, FA_DTYPE_BF16);
    CHECK(fa_mma_bwd_dk_split(&d) == 1);
    d.head_dim = 176; /* 11 n-tiles of 8 do not halve into pairs */
    CHECK(fa_mma_bwd_dk_split(&d) == 1);
    d.head_dim = 256;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    d.allow_tf32 = 1;
    CHECK(fa_mma_bwd_dk_split(&d) == 1);
    fa_plan_info p;
    CHECK_OK(fa_plan_for_device(device("h100"), &d, &p));
    char text[4096];
    fa_plan_info_format(&p, text, sizeof text);
    CHECK(strstr(text, "key strips shared") == NULL);
}

FA_TEST(described_devices_table) {
    static const char *keys[] = {"h100", "mi250x", "mi300x", "arc-a770", "rx-7900xtx", "nvidia-opencl", "pocl-cpu"};
    CHECK(fa_described_device_count() == 7);
    for (int i = 0; i < 7; i++) {
        const fa_described_device *dd = fa_described_device_get(i);
        CHECK(dd && strcmp(dd->key, keys[i]) == 0 && fa_described_device_find(keys[i]) == dd);
        CHECK(dd->desc.name[0] && dd->desc.vendor[0] && dd->desc.global_mem_bytes > 0);
    }
    CHECK(fa_described_device_get(7) == NULL && fa_described_device_get(-1) == NULL);
    const fa_device_desc *mi = device("mi300x");
    CHECK(mi->backend == FA_BACKEND_HIP && strcmp(mi->arch, "gfx942") == 0 && mi->compute_units == 304 &&
          mi->simd_width == 64 && mi->local_mem_bytes == 65536 && mi->matrix_flops_per_clock_cu == 2048.0);
    CHECK(fa_described_device_find("h200") == NULL && fa_described_device_find(NULL) == NULL);
    const fa_device_desc *h = device("h100");
    CHECK(h->backend == FA_BACKEND_CUDA && h->local_mem_bytes == 232448 && h->compute_units == 132);
    CHECK(h->matrix_m == 16 && h->matrix_n == 8 && h->matrix_k == 16 && strcmp(h->arch, "sm_90") == 0);
    const fa_device_desc *nv = device("nvidia-opencl");
    CHECK(nv->local_mem_bytes == 49152 && nv->matrix_m == 16 && nv->matrix_n == 8 && nv->matrix_k == 16);
    CHECK(device("mi250x")->simd_width == 64 && device("mi250x")->backend == FA_BACKEND_HIP);
    CHECK(device("arc-a770")->simd_width == 16 && device("arc-a770")->backend == FA_BACKEND_OPENCL);
    CHECK(device("pocl-cpu")->type == FA_DEVICE_CPU && device("pocl-cpu")->compute_units == 2);
    /* RDNA3 through OpenCL: WMMA's 16x16x16, wave32. */
    const fa_device_desc *rx = device("rx-7900xtx");
    CHECK(rx->backend == FA_BACKEND_OPENCL && strcmp(rx->arch, "gfx1100") == 0 && rx->simd_width == 32);
    CHECK(fa_mma_layout_of(rx) == FA_MMA_LAYOUT_AMD_WMMA);
}

/* Decoding on CUDA's tensor cores: a GQA group's rows share one tile, so
 * K and V are counted once per KV head; the keys split until one block an
 * SM (six stages deep) or, where that leaves no split, two are in flight,
 * each split keeping two key tiles or more. */
FA_TEST(decoding_packs_gqa_groups) {
    const fa_device_desc *h100 = device("h100");
    const int batches[] = {1, 8, 64};
    for (int bi = 0; bi < 3; bi++)
        for (int sk = 1024; sk <= 131072; sk *= 2)
            for (int sq = 1; sq <= 4; sq++) {
                fa_attention_desc d = shape(batches[bi], sq, sk, 32, 4, 128, FA_DTYPE_BF16);
                fa_plan_info p;
                CHECK_OK(fa_plan_for_device(h100, &d, &p));
                const fa_kernel_plan *k = &p.forward;
                CHECK_MSG(k->variant == FA_VARIANT_DECODE, "b%d sk %d sq %d: %s", batches[bi], sk, sq,
                          fa_variant_name(k->variant));
                if (k->variant != FA_VARIANT_DECODE) continue;
                CHECK(check_kernel_plan("decode", h100, &d, FA_PASS_FORWARD, k) == 0);
                /* The smallest tile that holds the group's 8 x sq rows. */
                const int rows = 8 * sq;
                CHECK_MSG(k->br == (rows <= 16 ? 16 : 32), "rows %d: br %d", rows, k->br);
                const int key_tiles = (sk + 63) / 64, blocks = batches[bi] * 4 * ((rows + k->br - 1) / k->br);
                const int cap = key_tiles / 2 < 128 ? key_tiles / 2 : 128;
                /* As many splits as one wave of one block an SM holds where
                 * that is two or more, else of two blocks an SM. */
                int alone = h100->compute_units / blocks, want = 2 * h100->compute_units / blocks;
                if (alone > cap) alone = cap;
                if (want > cap) want = cap;
                const int per_sm = alone >= 2 ? 1 : 2;
                if (per_sm == 1) want = alone;
                CHECK_MSG(k->split_k == (want >= 2 ? want : 1), "b%d sk %d sq %d: %d splits, expected %d", batches[bi],
                          sk, sq, k->split_k, want);
                CHECK(blocks * k->split_k <= per_sm * h100->compute_units || k->split_k == 1);
                CHECK(k->num_work_groups == blocks * k->split_k);
                /* That many blocks an SM fit (1 KiB kept a block), with the
                 * most stages that do (one alone: up to six), and the
                 * kernel's bytes are the formula's. */
                CHECK(k->local_mem_bytes == fa_plan_local_mem(FA_VARIANT_DECODE, FA_PASS_FORWARD, &d, k->br, 64, k->stages));
                CHECK(per_sm * (k->local_mem_bytes + 1024) <= h100->local_mem_bytes + 1024);
                CHECK_MSG(k->stages == (per_sm == 1 ? 6 : 3), "b%d sk %d sq %d: %d stages", batches[bi], sk, sq, k->stages);
                CHECK(k->local_mem_bytes == 16 * (256 + 16) * (size_t)(k->br / 16) +
                                                (size_t)k->stages * 2 * 64 * (256 + 16));
                /* K and V once per KV head: what is read beyond Q (once per
                 * split) and the partials is the cache, exactly. */
                const double cache = 2.0 * batches[bi] * 4 * (double)sk * 128 * 2;
                const double q = (double)batches[bi] * 32 * sq * 128 * 2 * k->split_k;
                const double parts = k->split_k > 1 ? (double)k->split_k * batches[bi] * 32 * sq * 129 * 4 : 0.0;
                CHECK_NEAR(k->cost.hbm_read_bytes, cache + q + parts, 1e-6 * cache);
                CHECK(k->workspace_bytes == (k->split_k > 1 ? (size_t)k->split_k * batches[bi] * 32 * sq * 129 * 4 : 0));
            }
    /* Where the previous plan read K and V per query head. */
    fa_attention_desc d = shape(8, 1, 65536, 32, 4, 128, FA_DTYPE_BF16);
    fa_plan_info p;
    CHECK_OK(fa_plan_for_device(h100, &d, &p));
    CHECK(p.forward.cost.hbm_read_bytes < 1.1 * 2.0 * 8 * 4 * 65536 * 128 * 2);
    /* Not decoding: more rows than a tile, dropout, block masks, fp32, short
     * keys, a device without tensor cores or before sm_80. */
    fa_attention_desc nd[6];
    for (int i = 0; i < 6; i++) nd[i] = shape(1, 1, 32768, 32, 4, 128, FA_DTYPE_BF16);
    nd[0].seqlen_q = 9;
    nd[1].dropout_p = 0.1f;
    nd[2].q.dtype = nd[2].k.dtype = nd[2].v.dtype = nd[2].o.dtype = FA_DTYPE_F32;
    nd[3].seqlen_k = 128;
    nd[4].head_dim = 40;
    uint8_t mask[1] = {1};
    nd[5].block_mask = mask;
    nd[5].block_q = 64;
    nd[5].block_k = 32768;
    nd[5].block_mask_bytes = 1;
    for (int i = 0; i < 6; i++) {
        CHECK_OK(fa_plan_for_device(h100, &nd[i], &p));
        CHECK_MSG(p.forward.variant != FA_VARIANT_DECODE, "case %d: decode", i);
    }
    fa_device_desc old = *h100;
    snprintf(old.arch, sizeof old.arch, "sm_75");
    CHECK_OK(fa_plan_for_device(&old, &d, &p));
    CHECK(p.forward.variant != FA_VARIANT_DECODE);
    /* Local memory too small for the decoding tiles: the other families
     * plan it. */
    old = *h100;
    old.local_mem_bytes = 48 * 1024;
    CHECK_OK(fa_plan_for_device(&old, &d, &p));
    CHECK(p.forward.variant != FA_VARIANT_DECODE);
    CHECK_OK(fa_plan_for_device(device("nvidia-opencl"), &d, &p));
    CHECK(p.forward.variant != FA_VARIANT_DECODE);
    /* Causal, windows and varlen stay in it; a window bounds the splits by
     * its own key tiles. */
    d = shape(1, 4, 65536, 32, 4, 128, FA_DTYPE_F16);
    d.causal = 1;
    d.window_left = 1000;
    d.window_right = 0;
    CHECK_OK(fa_plan_for_device(h100, &d, &p));
    CHECK(p.forward.variant == FA_VARIANT_DECODE && p.forward.split_k == (1000 + 4 + 63) / 64 / 2);
    /* Batch 8 on 4 KV heads: one block an SM, 4 splits make 128 blocks
     * in the 132 SMs; 5 would start a second wave. */
    d = shape(8, 1, 65536, 32, 4, 128, FA_DTYPE_BF16);
    CHECK_OK(fa_plan_for_device(h100, &d, &p));
    CHECK(p.forward.split_k == 4 && p.forward.num_work_groups == 128 && p.forward.stages == 6);
    /* Batch 64: 256 blocks without splits, two an SM. */
    d = shape(64, 1, 65536, 32, 4, 128, FA_DTYPE_BF16);
    CHECK_OK(fa_plan_for_device(h100, &d, &p));
    CHECK(p.forward.split_k == 1 && p.forward.num_work_groups == 256 && p.forward.stages == 3);
    d = shape(8, 1, 65536, 32, 4, 128, FA_DTYPE_BF16);
    CHECK_OK(fa_plan_for_device(h100, &d, &p));
    CHECK(check_kernel_plan("decode window", h100, &d, FA_PASS_FORWARD, &p.forward) == 0);
    /* The plan text names the kernel. */
    char text[2048];
    CHECK(fa_plan_info_format(&p, text, sizeof text) > 0);
    CHECK_MSG(strstr(text, "decode") != NULL, "%s", text);
}

/* NVIDIA's OpenCL forward in work-groups of four sub-groups, one 16-row
 * strip each, against 64 keys (planner_cl_mma.c, fa_cl_mma_preferred): on
 * an H100 the 2026-11-25 sweep (bench/results/h100.md) ran 64 x 64 in 128
 * work-items at 0.76-0.82x FlashAttention-2, the best geometric mean at
 * head_dim 64 and 128, where the eight-sub-group tiles the IO model takes
 * alone ran 0.60-0.67x: two or more work-groups a multiprocessor hide each
 * other's barriers, and 128 work-items leave room for a second at any
 * register count (2 x 128 x 256 = 65536). The model cannot say so: it
 * ranks bytes first, and the eight-sub-group tile moves fewer (its K and V
 * re-reads, which the L2 serves: the DRAM bytes are the same). Other
 * layouts, and the backward, keep the model's choice. */
FA_TEST(nvidia_opencl_forward_four_sub_groups) {
    const fa_device_desc *nv = device("nvidia-opencl");
    /* The sweep's shapes: 16k tokens, hidden 2048; and bf16 beside fp16. */
    static const int dims[] = {64, 128}, seqlens[] = {4096, 16384};
    static const fa_dtype dtypes[] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    for (size_t t = 0; t < COUNT(dtypes); t++)
        for (size_t i = 0; i < COUNT(dims); i++)
            for (size_t n = 0; n < COUNT(seqlens); n++)
                for (int causal = 0; causal <= 1; causal++) {
                    const int dim = dims[i], sq = seqlens[n];
                    fa_attention_desc d = shape(16384 / sq, sq, sq, 2048 / dim, 2048 / dim, dim, dtypes[t]);
                    d.causal = causal;
                    fa_plan_info p;
                    CHECK_OK(fa_plan_for_device(nv, &d, &p));
                    const fa_kernel_plan *f = &p.forward;
                    CHECK(check_kernel_plan("nvidia-opencl forward", nv, &d, FA_PASS_FORWARD, f) == 0);
                    CHECK_MSG(f->variant == FA_VARIANT_MMA && f->br == 64 && f->bc == 64 &&
                                  f->work_group_size == 128 && f->thread_rows == 2 && f->thread_cols == 16,
                              "%s d%d N %d causal %d: %s %d x %d / %d, micro-tile %d x %d",
                              fa_dtype_name(d.q.dtype), dim, sq, causal, fa_variant_name(f->variant), f->br, f->bc,
                              f->work_group_size, f->thread_rows, f->thread_cols);
                    fa_cl_mma_geometry g;
                    CHECK(fa_cl_mma_geometry_of(nv, &d, FA_PASS_FORWARD, f->br, f->bc, f->thread_rows,
                                                f->thread_cols, 1, &g));
                    /* Q's fragments in registers at 128, where Q, K and V
                     * leave no room for each other in 48 KiB. */
                    CHECK(g.layout == FA_MMA_LAYOUT_NVIDIA && g.warps == 4 && g.strips == 1 &&
                          g.q_regs == (dim == 128) && f->local_mem_bytes == g.local_mem);

                    /* What the model alone takes: eight sub-groups of 128
                     * rows (128 x 128 at 64, 128 x 64 at 128), valid and in
                     * local memory, fewer bytes through the L2 and the same
                     * from DRAM; the preference sets it aside. */
                    fa_kernel_plan eight = *f;
                    eight.br = 128;
                    eight.bc = dim == 64 ? 128 : 64;
                    eight.thread_cols = eight.bc / 4;
                    eight.num_work_groups = d.batch * d.heads_q * (sq / 128);
                    fa_cl_mma_geometry e;
                    CHECK(fa_cl_mma_geometry_of(nv, &d, FA_PASS_FORWARD, 128, eight.bc, 2, eight.thread_cols, 1, &e));
                    CHECK(e.warps == 8 && e.strips == 1 && e.local_mem <= fa_plan_usable_local_mem(nv));
                    CHECK(!fa_cl_mma_preferred(nv, &d, FA_PASS_FORWARD, 128, eight.bc, 2, eight.thread_cols));
                    const fa_cost c8 = fa_io_fused(nv, &d, FA_PASS_FORWARD, &eight);
                    CHECK(total_bytes(&c8) < total_bytes(&f->cost));
                    CHECK_NEAR(c8.dram_read_bytes, f->cost.dram_read_bytes, 0.0);
                    CHECK_NEAR(c8.dram_write_bytes, f->cost.dram_write_bytes, 0.0);

                    /* The backward's tiles: nvidia_opencl_backward_v_in_registers. */
                    const fa_kernel_plan *b = &p.backward;
                    CHECK(b->variant == FA_VARIANT_MMA &&
                          fa_cl_mma_preferred(nv, &d, FA_PASS_BACKWARD, b->br, b->bc, b->thread_rows, b->thread_cols));
                }

    /* Every head_dim: 64 query rows in four sub-groups where they fit (64 x
     * 64 up to 176 in 48 KiB, then 64 x 32 and 64 x 16, the planner's tiles
     * there before), fewer sub-groups of one strip where the fragments of
     * 64 rows leave the register budget (248 and 256: 32 x 16); never
     * eight, two strips or more than 64 keys. */
    for (int dim = 8; dim <= 256; dim += 8)
        for (int causal = 0; causal <= 1; causal++) {
            fa_attention_desc d = shape(4, 4096, 4096, 16, 16, dim, FA_DTYPE_F16);
            d.causal = causal;
            fa_plan_info p;
            CHECK_OK(fa_plan_for_device(nv, &d, &p));
            const fa_kernel_plan *f = &p.forward;
            fa_cl_mma_geometry g;
            CHECK_MSG(f->variant == FA_VARIANT_MMA && fa_cl_mma_geometry_of(nv, &d, FA_PASS_FORWARD, f->br, f->bc,
                                                                            f->thread_rows, f->thread_cols, 1, &g),
                      "d%d: %s", dim, fa_variant_name(f->variant));
            if (f->variant != FA_VARIANT_MMA) continue;
            const int want_br = dim <= 240 ? 64 : 32, want_bc = dim <= 176 ? 64 : dim <= 224 ? 32 : 16;
            CHECK_MSG(f->br == want_br && f->bc == want_bc && g.strips == 1 && g.warps == want_br / 16 &&
                          f->work_group_size == 2 * want_br,
                      "d%d causal %d: %d x %d / %d, %d strips", dim, causal, f->br, f->bc, f->work_group_size,
                      g.strips);
        }

    /* Other layouts: the preference accepts every valid tile, both passes
     * (their plans are the model's). */
    fa_device_desc amd[2] = {*device("mi250x"), *device("mi300x")};
    for (int i = 0; i < 2; i++) amd[i].backend = FA_BACKEND_OPENCL; /* through AMD's OpenCL */
    const fa_device_desc *others[] = {device("arc-a770"), device("rx-7900xtx"), &amd[0], &amd[1]};
    static const int sizes[] = {1, 2, 4, 8, 16, 32, 64, 128}, tiles[] = {128, 64, 32, 16, 8};
    int valid = 0;
    for (size_t o = 0; o < COUNT(others); o++) {
        CHECK(fa_mma_layout_of(others[o]) != FA_MMA_LAYOUT_NONE);
        for (int pass = 0; pass < 2; pass++) {
            for (int dim = 64; dim <= 128; dim += 64) {
                const fa_attention_desc d = shape(2, 2048, 2048, 16, 16, dim, FA_DTYPE_BF16);
                for (size_t a = 0; a < COUNT(tiles); a++)
                    for (size_t b = 0; b < COUNT(tiles); b++)
                        for (size_t r = 0; r < COUNT(sizes); r++)
                            for (size_t c = 0; c < COUNT(sizes); c++) {
                                if (!fa_cl_mma_geometry_of(others[o], &d, (fa_pass)pass, tiles[a], tiles[b],
                                                           sizes[r], sizes[c], 1, NULL))
                                    continue;
                                valid++;
                                CHECK_MSG(fa_cl_mma_preferred(others[o], &d, (fa_pass)pass, tiles[a], tiles[b],
                                                              sizes[r], sizes[c]),
                                          "%s pass %d d%d: %d x %d, %d x %d set aside", others[o]->name, pass, dim,
                                          tiles[a], tiles[b], sizes[r], sizes[c]);
                            }
            }
        }
    }
    CHECK(valid > 100);
}

/* HIP's matrix-core backward on NVIDIA through the mapping (the H100 as
 * the mapping reports it: HIP, 227 KiB): problems without stateful options
 * take the second register budget, 64 x 128 tiles in eight wavefronts at
 * head_dim 128 and, by the layer's preference, 32 x 128 in four of two
 * strips at 64 (the tiles of CUDA's mma.sync backward there, measured
 * 0.92x of it on an H200, bench/results/h200.md); dropout keeps the first
 * budget's tiles; the AMD layers have neither the second budget nor the
 * preference. */
FA_TEST(hip_nvidia_backward_tiles) {
    fa_device_desc nv = *device("h100");
    nv.backend = FA_BACKEND_HIP;
    nv.local_mem_bytes = 227 * 1024;
    static const int dims[] = {64, 128}, seqlens[] = {4096, 16384};
    static const fa_dtype dtypes[] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    for (size_t t = 0; t < COUNT(dtypes); t++)
        for (size_t i = 0; i < COUNT(dims); i++)
            for (size_t n = 0; n < COUNT(seqlens); n++)
                for (int causal = 0; causal <= 1; causal++) {
                    const int dim = dims[i], sq = seqlens[n];
                    fa_attention_desc d = shape(16384 / sq, sq, sq, 2048 / dim, 2048 / dim, dim, dtypes[t]);
                    d.causal = causal;
                    CHECK(fa_hip_mma_lean(&d));
                    fa_plan_info p;
                    CHECK_OK(fa_plan_for_device(&nv, &d, &p));
                    const fa_kernel_plan *b = &p.backward;
                    CHECK(check_kernel_plan("hip nvidia backward", &nv, &d, FA_PASS_BACKWARD, b) == 0);
                    fa_hip_mma_geometry g;
                    CHECK(b->variant == FA_VARIANT_MMA &&
                          fa_hip_mma_geometry_of(&nv, &d, FA_PASS_BACKWARD, b->br, b->bc, b->thread_rows,
                                                 b->thread_cols, &g));
                    const int want_br = dim == 64 ? 32 : 64, want_warps = dim == 64 ? 4 : 8, want_strips = dim == 64 ? 2 : 1;
                    CHECK_MSG(b->br == want_br && b->bc == 128 && b->stages == 2 && g.layer == FA_HIP_MMA_NVIDIA &&
                                  g.warps == want_warps && g.strips == want_strips,
                              "%s d%d N %d causal %d: %d x %d, %d stages, %d wavefronts of %d strips",
                              fa_dtype_name(d.q.dtype), dim, sq, causal, b->br, b->bc, b->stages, g.warps, g.strips);
                    /* At 64 the eight wavefronts of 64 x 128 run (forced
                     * tiles, the sweep) but are not taken. */
                    if (dim == 64) {
                        CHECK(fa_hip_mma_geometry_of(&nv, &d, FA_PASS_BACKWARD, 64, 128, 16, 2, &g) && g.warps == 8);
                        CHECK(!fa_hip_mma_preferred(&nv, &d, FA_PASS_BACKWARD, 64, 128, 16, 2));
                    }
                    /* Dropout keeps its state in registers: the first
                     * budget, which refuses those tiles. */
                    fa_attention_desc dd = d;
                    dd.dropout_p = 0.1f;
                    CHECK(!fa_hip_mma_lean(&dd));
                    CHECK(!fa_hip_mma_geometry_of(&nv, &dd, FA_PASS_BACKWARD, want_br, 128, want_br / 4,
                                                  2 * want_strips, NULL));
                    CHECK_OK(fa_plan_for_device(&nv, &dd, &p));
                    CHECK(p.backward.variant == FA_VARIANT_MMA &&
                          !(p.backward.br == want_br && p.backward.bc == 128));
                }
    static const fa_hip_mma_layer amd[] = {FA_HIP_MMA_MFMA32, FA_HIP_MMA_MFMA16, FA_HIP_MMA_WMMA};
    for (size_t i = 0; i < COUNT(amd); i++) {
        const fa_hip_mma_layer_info *L = fa_hip_mma_layer_get(amd[i]);
        CHECK(L && L->bwd_budget_lean == 0 && L->bwd_small_dim_warps == 0);
    }
}

/* NVIDIA's OpenCL backward (planner_cl_mma.c, fa_cl_mma_preferred): at
 * head_dim 128, 32 queries against 64 keys in four sub-groups, V's
 * fragments in registers and the queries in chunks of 16, the tile that
 * ran fastest on an H200 (bench/results/h200.md, 2026-11-27); the model
 * alone would take 16 x 128 in eight sub-groups with V in registers (half
 * the bytes through the L2), which the preference sets aside. At head_dim
 * 64, 32 x 64 in four sub-groups of one strip (H100, 2026-11-27), not 16 x
 * 128 in eight nor 32 x 128, with V's fragments in registers too, where
 * its tile would fit, but with dropout (bwd_v_regs: H200, 2026-11-29). No
 * other layout holds V in registers in one stage. */
FA_TEST(nvidia_opencl_backward_v_in_registers) {
    const fa_device_desc *nv = device("nvidia-opencl");
    static const int seqlens[] = {2048, 16384};
    static const fa_dtype dtypes[] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    for (size_t t = 0; t < COUNT(dtypes); t++)
        for (int dim = 64; dim <= 128; dim += 64)
            for (size_t n = 0; n < COUNT(seqlens); n++)
                for (int option = 0; option < 3; option++) {
                    const int sq = seqlens[n];
                    fa_attention_desc d = shape(16384 / sq, sq, sq, 2048 / dim, 2048 / dim, dim, dtypes[t]);
                    d.causal = option == 1;
                    if (option == 2) {
                        d.dropout_p = 0.1f;
                        d.heads_kv = d.heads_q / 4;
                    }
                    fa_plan_info p;
                    CHECK_OK(fa_plan_for_device(nv, &d, &p));
                    const fa_kernel_plan *b = &p.backward;
                    CHECK(check_kernel_plan("nvidia-opencl backward", nv, &d, FA_PASS_BACKWARD, b) == 0);
                    fa_cl_mma_geometry g;
                    CHECK(b->variant == FA_VARIANT_MMA && fa_cl_mma_geometry_of(nv, &d, FA_PASS_BACKWARD, b->br, b->bc,
                                                                                b->thread_rows, b->thread_cols,
                                                                                b->stages, &g));
                    /* At head_dim 128 the whole step of 32 queries with dQ
                     * units of two n-tiles (bwd_whole_step), in chunks of
                     * 16 with dropout. */
                    const int want_br = 32, want_bc = 64, want_chunk = dim == 128 && option == 2 ? 16 : 32;
                    const int want_unit = dim == 128 && option != 2 ? 2 : 0;
                    CHECK_MSG(b->br == want_br && b->bc == want_bc && b->stages == 1 && g.warps == want_bc / 16 &&
                                  g.strips == 1 && g.v_regs == (dim == 128 || option != 2) && g.q_chunk == want_chunk &&
                                  g.dq_unit == want_unit && b->local_mem_bytes == g.local_mem,
                              "%s d%d N %d option %d: %d x %d / %d, stages %d, V in registers %d, chunk %d",
                              fa_dtype_name(d.q.dtype), dim, sq, option, b->br, b->bc, b->work_group_size, b->stages,
                              g.v_regs, g.q_chunk);

                    /* The eight-sub-group tile with V in registers: valid,
                     * in 48 KiB, fewer bytes at 128; set aside. */
                    const int br8 = dim == 128 ? 16 : 32;
                    fa_cl_mma_geometry e;
                    CHECK(fa_cl_mma_geometry_of(nv, &d, FA_PASS_BACKWARD, br8, 128, br8 / 4, 2, 1, &e));
                    CHECK(e.warps == 8 && e.v_regs && e.local_mem <= fa_plan_usable_local_mem(nv));
                    CHECK(!fa_cl_mma_preferred(nv, &d, FA_PASS_BACKWARD, br8, 128, br8 / 4, 2));
                    if (dim == 128) {
                        fa_kernel_plan eight = *b;
                        eight.br = br8;
                        eight.bc = 128;
                        eight.thread_rows = br8 / 4;
                        eight.work_group_size = 256;
                        eight.num_work_groups = d.batch * d.heads_kv * (sq / 128);
                        const fa_cost c8 = fa_io_fused(nv, &d, FA_PASS_BACKWARD, &eight);
                        CHECK(total_bytes(&c8) < total_bytes(&b->cost));
                    }
                }

    /* Intel's and AMD's layouts keep V's tile in one stage. */
    fa_device_desc amd[2] = {*device("mi250x"), *device("mi300x")};
    for (int i = 0; i < 2; i++) amd[i].backend = FA_BACKEND_OPENCL;
    const fa_device_desc *others[] = {device("arc-a770"), device("rx-7900xtx"), &amd[0], &amd[1]};
    static const int sizes[] = {1, 2, 4, 8, 16, 32}, tiles[] = {128, 64, 32, 16};
    for (size_t o = 0; o < COUNT(others); o++)
        for (int dim = 64; dim <= 256; dim += 64) {
            const fa_attention_desc d = shape(2, 2048, 2048, 16, 16, dim, FA_DTYPE_F16);
            for (size_t a = 0; a < COUNT(tiles); a++)
                for (size_t b = 0; b < COUNT(tiles); b++)
                    for (size_t r = 0; r < COUNT(sizes); r++)
                        for (size_t c = 0; c < COUNT(sizes); c++) {
                            fa_cl_mma_geometry g;
                            if (fa_cl_mma_geometry_of(others[o], &d, FA_PASS_BACKWARD, tiles[a], tiles[b], sizes[r],
                                                      sizes[c], 1, &g))
                                CHECK_MSG(!g.v_regs && g.q_chunk == tiles[a], "%s d%d: %d x %d, V in registers",
                                          others[o]->name, dim, tiles[a], tiles[b]);
                        }
        }
}

/* The tiles whose K and V fit only packed in the workspace
 * (planner_cl_mma.c, bwd_k_packed) on NVIDIA's 48 KiB: 64 x 64 at head_dim
 * 128 in four sub-groups packs, V neither in a tile nor in registers,
 * within the local memory; the preference sets it aside (not measured),
 * so the plan stays 32 x 64. Its workspace figure adds one slot of packed
 * fragments a key tile and kv head, three times a tile's K bytes, over
 * total_k / 64 + batch + 1 slots; deterministic mode never packs. */
FA_TEST(nvidia_opencl_backward_packed_keys) {
    const fa_device_desc *nv = device("nvidia-opencl");
    fa_attention_desc d = shape(2, 4096, 4096, 16, 8, 128, FA_DTYPE_F16);
    fa_cl_mma_geometry g;
    CHECK(fa_cl_mma_geometry_of(nv, &d, FA_PASS_BACKWARD, 64, 64, 16, 2, 1, &g));
    CHECK_MSG(g.k_packed && !g.v_regs && g.warps == 4 && g.q_chunk == 16 &&
                  g.local_mem <= fa_plan_usable_local_mem(nv),
              "64 x 64: K packed %d, V in registers %d, %d sub-groups, chunk %d, %zu bytes", g.k_packed, g.v_regs,
              g.warps, g.q_chunk, g.local_mem);
    CHECK(!fa_cl_mma_preferred(nv, &d, FA_PASS_BACKWARD, 64, 64, 16, 2));
    size_t bytes = 0;
    CHECK_OK(fa_cl_mma_packed_k_bytes(&g, &d, 64, fa_attention_total_k(&d), &bytes));
    const size_t slots = (size_t)(2 * 4096 / 64) + 2 + 1, slot = 3 * 64 * 128 * 2;
    CHECK_MSG(bytes == 8 * slots * slot, "packed K and V: %zu bytes, want %zu", bytes, 8 * slots * slot);

    fa_plan_info p;
    CHECK_OK(fa_plan_for_device(nv, &d, &p));
    fa_cl_mma_geometry planned;
    CHECK(fa_cl_mma_geometry_of(nv, &d, FA_PASS_BACKWARD, p.backward.br, p.backward.bc, p.backward.thread_rows,
                                p.backward.thread_cols, p.backward.stages, &planned));
    CHECK(!planned.k_packed && p.backward.br == 32 && p.backward.bc == 64);

    /* The IO model counts the pre-pass (it reads K and V once, as the
     * kernel did) and its packed tiles, written, then read in K's and V's
     * place: against the same tile on a device whose local memory holds
     * K's tile, twice their bytes more. */
    fa_device_desc roomy = *nv;
    roomy.local_mem_bytes = 160 * 1024;
    fa_cl_mma_geometry r;
    CHECK(fa_cl_mma_geometry_of(&roomy, &d, FA_PASS_BACKWARD, 64, 64, 16, 2, 1, &r) && !r.k_packed);
    fa_kernel_plan kp = p.backward;
    kp.br = 64;
    kp.thread_rows = 16;
    kp.num_work_groups = d.batch * d.heads_kv * (4096 / 64);
    const fa_cost packed_cost = fa_io_fused(nv, &d, FA_PASS_BACKWARD, &kp);
    const fa_cost tile_cost = fa_io_fused(&roomy, &d, FA_PASS_BACKWARD, &kp);
    const double packed_bytes = 8.0 * (2 * 4096 / 64) * slot;
    CHECK_MSG(fabs(total_bytes(&packed_cost) - total_bytes(&tile_cost) - 2.0 * packed_bytes) < 1.0,
              "IO model: %.0f bytes packed, %.0f with K's tile, want %.0f more", total_bytes(&packed_cost),
              total_bytes(&tile_cost), 2.0 * packed_bytes);

    /* A slot count no memory holds: refused, not wrapped. */
    fa_cl_mma_geometry huge = g;
    d.heads_kv = d.heads_q = 1 << 30;
    CHECK(fa_cl_mma_packed_k_bytes(&huge, &d, 64, INT64_C(1) << 40, &bytes) == FA_ERR_OUT_OF_MEMORY);
    d.heads_q = 16;
    d.heads_kv = 8;
    d.deterministic = 1;
    CHECK(!fa_cl_mma_geometry_of(nv, &d, FA_PASS_BACKWARD, 64, 64, 16, 2, 1, &g) || !g.k_packed);
}

FA_TEST_MAIN(FA_CASE(tiles_valid_on_every_device), FA_CASE(same_input_same_plan),
             FA_CASE(local_memory_gives_different_tiles), FA_CASE(more_local_memory_never_more_bytes),
             FA_CASE(decoding_splits_keys), FA_CASE(decoding_packs_gqa_groups), FA_CASE(variants_by_backend), FA_CASE(tma_backward_opt_in), FA_CASE(tma_padded_head_dims), FA_CASE(invalid_devices_rejected),
             FA_CASE(nvidia_opencl_backward_packed_keys),
             FA_CASE(largest_shapes_plan_at_once), FA_CASE(work_group_size_named), FA_CASE(format_shows_plan),
             FA_CASE(described_devices_table), FA_CASE(wide_heads_share_key_strips),
             FA_CASE(nvidia_opencl_forward_four_sub_groups), FA_CASE(nvidia_opencl_backward_v_in_registers),
             FA_CASE(hip_nvidia_backward_tiles))
