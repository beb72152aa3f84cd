/* The attention suite (tests/attention_suite.c) on the HIP backend's best
 * device: an AMD GPU, or an NVIDIA GPU through the HIP-on-CUDA mapping
 * (FA_HIP_NVIDIA, backends/hip_nvidia/). The same cases as the OpenCL
 * kernels' test, against the fp64 reference; skipped where no HIP device
 * exists. Where the planner gives fp16 and bf16 problems the matrix-core
 * kernels (kernels_hip/fwd_mma.hip, bwd_mma.hip: NVIDIA through the
 * mapping, CDNA, RDNA3), the suite's cases on those dtypes run them, and
 * the cases below run them on every tile geometry the device takes and
 * with every option.
 *
 * fa-test-labels: device */
#include "attention_suite.h"
#include "harness.h"

#include "planner.h"
#include "planner_hip_mma.h"

#include <stdio.h>
#include <string.h>

#ifdef FA_WITH_HIP
#include "backends/hip/hip_runtime_internal.h"

static size_t pass_local_mem(const fa_device_desc *dev, const fa_kernel_plan *kp, fa_pass pass,
                             const fa_attention_desc *desc) {
    return kp->variant == FA_VARIANT_MMA ? fa_hip_mma_local_mem(dev, desc, pass, kp)
                                         : fa_plan_local_mem(FA_VARIANT_SIMT, pass, desc, kp->br, kp->bc, 1);
}

/* Forced matrix-core backward tiles alternate between one and two query
 * tiles in flight (two where they fit), so both builds of the dK/dV kernel
 * run. */
static int forced_bwd_stages;

static void apply_tiles(const fa_device_desc *dev, fa_kernel_plan *kp, const suite_tiles *t, fa_pass pass,
                        const fa_attention_desc *desc) {
    kp->br = t->br;
    kp->bc = t->bc;
    kp->thread_rows = t->tr;
    kp->thread_cols = t->tc;
    kp->work_group_size = (t->br / t->tr) * (t->bc / t->tc);
    kp->split_k = t->split > 1 ? t->split : 1;
    kp->variant = t->mma ? FA_VARIANT_MMA : t->split > 1 ? FA_VARIANT_SPLITK : FA_VARIANT_SIMT;
    kp->stages = 1;
    if (t->mma && pass == FA_PASS_BACKWARD && forced_bwd_stages++ % 2) {
        kp->stages = 2;
        const size_t two = fa_hip_mma_local_mem(dev, desc, pass, kp);
        if (two == 0 || two > dev->local_mem_bytes) kp->stages = 1;
    }
    kp->local_mem_bytes = pass_local_mem(dev, kp, pass, desc);
}

static fa_status hip_force_tiles(fa_plan plan, const suite_tiles *fwd, const suite_tiles *bwd) {
    fa_hip_plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    const fa_device_desc *dev = &plan->ctx->info.desc;
    if (fwd) apply_tiles(dev, &plan->info.forward, fwd, FA_PASS_FORWARD, &plan->desc);
    if (bwd) apply_tiles(dev, &plan->info.backward, bwd, FA_PASS_BACKWARD, &plan->desc);
    return fa_hip_plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

/* The kernels declare exactly the local memory the planner budgets
 * (fa_plan_local_mem): the largest kernel of each pass (forward, dK/dV)
 * equals it as the runtime reports it for the loaded code, give or take
 * the padding a compiler may put between tiles of odd sizes. Registers and
 * private (spilled) bytes per work-item are printed where a kernel spills:
 * the planner's largest work-groups leave few registers to each. */
#define TILE_PADDING 64
static void hip_check_plan(const char *name, fa_plan plan) {
    static int described;
    if (!described) {
        fa_device_info info;
        if (fa_context_get_info(plan->ctx, &info) == FA_SUCCESS)
            fprintf(stderr, "  HIP device: %s (%s, arch \"%s\"), wavefront %d, %zu bytes of local memory\n",
                    info.desc.name, info.desc.vendor, info.desc.arch, info.desc.simd_width,
                    info.desc.local_mem_bytes);
        described = 1;
    }
    const fa_kernel_plan *kp[2] = {&plan->info.forward, &plan->info.backward};
    for (int pass = 0; pass < 2; pass++) {
        fa_hip_kernel_usage u;
        fa_status st = fa_hip_plan_kernel_usage(plan->impl, (fa_pass)pass, &u);
        size_t want = pass_local_mem(&plan->ctx->info.desc, kp[pass], (fa_pass)pass, &plan->desc);
        CHECK_MSG(st == FA_SUCCESS && u.local_bytes >= want && u.local_bytes <= want + TILE_PADDING,
                  "%s: %s kernels use %zu bytes of local memory, the planner budgets %zu", name,
                  pass ? "backward" : "forward", u.local_bytes, want);
        if (st == FA_SUCCESS && u.private_bytes > 0)
            fprintf(stderr, "  %s: %s kernels: %d registers, %zu private bytes per work-item\n", name,
                    pass ? "backward" : "forward", u.registers, u.private_bytes);
    }
}

static const suite_backend hip = {FA_BACKEND_HIP, "HIP", 1, hip_force_tiles, hip_check_plan, NULL,
                                  SUITE_ALL_SCORE_OPTIONS};
#else
static const suite_backend hip = {FA_BACKEND_HIP, "HIP", 0, NULL, NULL, NULL, SUITE_ALL_SCORE_OPTIONS};
#endif

#define HIP_CASE(name)                                                                     \
    do {                                                                                   \
        suite_use_backend(&hip);                                                           \
        suite_##name();                                                                    \
    } while (0)

FA_TEST(dtypes) { HIP_CASE(dtypes); }
FA_TEST(head_dims) { HIP_CASE(head_dims); }
FA_TEST(causal) { HIP_CASE(causal); }
FA_TEST(sliding_window) { HIP_CASE(sliding_window); }
FA_TEST(block_sparse) { HIP_CASE(block_sparse); }
FA_TEST(block_sparse_skips_tiles) { HIP_CASE(block_sparse_skips_tiles); }
FA_TEST(dropout) { HIP_CASE(dropout); }
FA_TEST(dropout_mask_bits) { HIP_CASE(dropout_mask_bits); }
FA_TEST(gqa_mqa) { HIP_CASE(gqa_mqa); }
FA_TEST(varlen) { HIP_CASE(varlen); }
FA_TEST(decoding_splitk) { HIP_CASE(decoding_splitk); }
FA_TEST(score_options) { HIP_CASE(score_options); }
FA_TEST(lengths) { HIP_CASE(lengths); }
FA_TEST(strides_offsets) { HIP_CASE(strides_offsets); }
FA_TEST(deterministic_backward) { HIP_CASE(deterministic_backward); }
FA_TEST(described_devices) { HIP_CASE(described_devices); }
FA_TEST(rejects_bad_tiles) { HIP_CASE(rejects_bad_tiles); }
FA_TEST(long_sequences) { HIP_CASE(long_sequences); }
FA_TEST(extreme_windows) { HIP_CASE(extreme_windows); }
FA_TEST(destroy_in_any_order) { HIP_CASE(destroy_in_any_order); }
FA_TEST(huge_mask_blocks) { HIP_CASE(huge_mask_blocks); }
FA_TEST(env_build_options) { HIP_CASE(env_build_options); }

/* ------------------------------------------------------------------------ */
/* The matrix-core kernels                                                   */

#ifdef FA_WITH_HIP
/* The suite's device's description, when its matrix cores run dtype
 * through a layer of the kernels; NULL otherwise. */
static const fa_device_desc *mma_device(fa_dtype dtype, fa_device_desc *out) {
    fa_context ctx = suite_context();
    fa_device_info info;
    if (!ctx || fa_context_get_info(ctx, &info) != FA_SUCCESS) return NULL;
    *out = info.desc;
    fa_hip_mma_layer layers[2];
    return fa_hip_mma_layers(out, dtype, layers) > 0 ? out : NULL;
}

#define MAX_GEOMETRIES 64

/* Every tile the kernels run on the device for a pass (local memory
 * included), as suite tiles: for each layer, one or two strips a
 * wavefront, 1 to 8 wavefronts, the other side 16 to 128. */
static int geometries_of(const fa_device_desc *dev, const fa_attention_desc *d, fa_pass pass, suite_tiles *out) {
    static const int strips[] = {1, 2}, warps[] = {1, 2, 4, 8}, sides[] = {16, 32, 64, 128};
    fa_hip_mma_layer layers[2];
    const int nl = fa_hip_mma_layers(dev, d->q.dtype, layers);
    int n = 0;
    for (int i = 0; i < nl; i++) {
        const fa_hip_mma_layer_info *L = fa_hip_mma_layer_get(layers[i]);
        const int own = L->own_n ? L->n : L->m, other = L->own_n ? L->m : L->n, per = L->c_elems / L->own_slots;
        for (int s = 0; s < 2; s++)
            for (int w = 0; w < 4; w++)
                for (int o = 0; o < 4; o++) {
                    const int rows = warps[w] * strips[s] * own, side = sides[o];
                    suite_tiles t = {0, 0, 0, 0, 1, 1};
                    if (pass == FA_PASS_FORWARD) {
                        t.br = rows;
                        t.bc = side;
                        t.tr = L->own_slots * strips[s];
                        t.tc = side / other * per;
                    } else {
                        t.br = side;
                        t.bc = rows;
                        t.tr = side / other * per;
                        t.tc = L->own_slots * strips[s];
                    }
                    if (t.tr <= 0 || t.tc <= 0 || n >= MAX_GEOMETRIES) continue;
                    if (!fa_hip_mma_geometry_of(dev, d, pass, t.br, t.bc, t.tr, t.tc, NULL)) continue;
                    fa_kernel_plan kp;
                    memset(&kp, 0, sizeof kp);
                    kp.br = t.br;
                    kp.bc = t.bc;
                    kp.thread_rows = t.tr;
                    kp.thread_cols = t.tc;
                    kp.stages = 1;
                    if (fa_hip_mma_local_mem(dev, d, pass, &kp) > dev->local_mem_bytes) continue;
                    out[n++] = t;
                }
    }
    return n;
}
#endif

/* Every tile geometry the device's layers take (wavefronts, strips, other
 * side), forward with backward, at head dimensions 32 to 128, fp16 and
 * bf16, causal or not, with grouped queries and lengths no tile divides. */
FA_TEST(mma_geometries) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    suite_use_backend(&hip);
    if (!suite_context()) FA_SKIP("no HIP device (the suite's cases say why)");
    static const int dims[] = {32, 64, 96, 128};
    int runs = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        const fa_dtype dt = i % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
        fa_device_desc dev;
        if (!mma_device(dt, &dev)) FA_SKIP("the HIP device has no matrix cores the kernels run");
        fa_attention_desc d = suite_desc(dt, 1, 150, 170, 2, 1, dims[i]);
        d.causal = (int)(i / 2) % 2;
        suite_tiles f[MAX_GEOMETRIES], b[MAX_GEOMETRIES];
        const int nf = geometries_of(&dev, &d, FA_PASS_FORWARD, f), nb = geometries_of(&dev, &d, FA_PASS_BACKWARD, b);
        CHECK_MSG(nf > 0 && nb > 0, "d%d: %d forward and %d backward geometries", dims[i], nf, nb);
        const int n = nf > nb ? nf : nb;
        for (int j = 0; j < n && nf > 0 && nb > 0; j++) {
            const suite_tiles *tf = &f[j % nf], *tb = &b[j % nb];
            char name[96];
            snprintf(name, sizeof name, "mma d%d %dx%d/%dx%d, %dx%d/%dx%d%s", dims[i], tf->br, tf->bc, tf->tr, tf->tc,
                     tb->br, tb->bc, tb->tr, tb->tc, d.causal ? " causal" : "");
            suite_run_tiles(name, &d, tf, tb, 1);
            runs++;
        }
    }
    fprintf(stderr, "  %d matrix-core geometry runs\n", runs);
#endif
}

/* The planner's own matrix-core plans with every option, alone and
 * together, in fp16 and bf16 at head dimensions 64 and 128. */
FA_TEST(mma_options) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    suite_use_backend(&hip);
    fa_context ctx = suite_context();
    if (!ctx) FA_SKIP("no HIP device (the suite's cases say why)");
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    static const char *const options[] = {"causal", "window", "block mask", "dropout causal", "varlen gqa dropout",
                                          "all"};
    for (int t = 0; t < 2; t++)
        for (int dim = 64; dim <= 128; dim += 64) {
            const fa_dtype dt = t ? FA_DTYPE_BF16 : FA_DTYPE_F16;
            fa_device_desc dev;
            if (!mma_device(dt, &dev)) FA_SKIP("the HIP device has no matrix cores the kernels run");
            for (int o = 0; o < 6; o++) {
                fa_attention_desc d = suite_desc(dt, 2, 170, 190, 4, 2, dim);
                uint8_t *mask = NULL;
                if (o == 0 || o == 3 || o == 5) d.causal = 1;
                if (o == 1 || o == 5) {
                    d.window_left = 40;
                    d.window_right = o == 5 ? 0 : 10;
                }
                if (o == 2 || o == 5) mask = suite_random_block_mask(&d, 32, 48, suite_case_seed(options[o], (uint64_t)dim));
                if (o >= 3) {
                    d.dropout_p = 0.2f;
                    d.dropout_seed = 99 + (uint64_t)dim;
                }
                if (o == 4) {
                    d.batch = 4;
                    d.seqlen_q = 77;
                    d.seqlen_k = 100;
                    d.cu_seqlens_q = cu_q;
                    d.cu_seqlens_k = cu_k;
                }
                fa_plan plan = NULL;
                if (fa_plan_create(ctx, &d, &plan) == FA_SUCCESS) {
                    CHECK_MSG(plan->info.forward.variant == FA_VARIANT_MMA && plan->info.backward.variant == FA_VARIANT_MMA,
                              "%s d%d %s: the planner chose %s / %s", fa_dtype_name(dt), dim, options[o],
                              fa_variant_name(plan->info.forward.variant), fa_variant_name(plan->info.backward.variant));
                    fa_plan_destroy(plan);
                }
                char name[96];
                snprintf(name, sizeof name, "mma %s d%d %s", fa_dtype_name(dt), dim, options[o]);
                suite_run_tiles(name, &d, NULL, NULL, 1);
                d.deterministic = 1;
                snprintf(name, sizeof name, "mma %s d%d %s deterministic", fa_dtype_name(dt), dim, options[o]);
                suite_run_tiles(name, &d, NULL, NULL, 1);
                free(mask);
            }
        }
#endif
}

/* ------------------------------------------------------------------------ */
/* Score options in every kernel family                                      */

#ifdef FA_WITH_HIP
/* Softcap, ALiBi and the bias, each alone and all three together (with
 * causal masking and dropout), and softcap with ALiBi on a variable-length
 * batch (a bias excludes one), as the descriptor's score options. */
typedef struct score_opts {
    const char *name;
    float softcap;
    int alibi;
    int bias;                 /* 0 none, 1 fp32 broadcast over the batch, 2 q's dtype per batch and head, strided */
    int causal_dropout;
    int varlen;
} score_opts;

static const score_opts score_option_sets[] = {
    {"softcap", 4.0f, 0, 0, 0, 0},
    {"alibi", 0.0f, 1, 0, 0, 0},
    {"bias f32 broadcast", 0.0f, 0, 1, 0, 0},
    {"bias strided", 0.0f, 0, 2, 0, 0},
    {"all three causal dropout", 3.0f, 1, 2, 1, 0},
    {"softcap alibi varlen causal", 2.0f, 1, 0, 0, 1},
};

static const int32_t score_cu_q[] = {0, 5, 5, 82, 150}, score_cu_q_decode[] = {0, 1, 3, 3, 6};
static const int32_t score_cu_k[] = {0, 33, 45, 145, 145};

static const float score_slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.75f, 0.03125f, 1.0f, 0.2f};

/* o's options on d (heads_q at most 8); large logits (scale 0.5) where a
 * cap is set, so that it bends them. */
static void set_score_opts(fa_attention_desc *d, const score_opts *o) {
    if (o->softcap > 0.0f) {
        d->softcap = o->softcap;
        d->softmax_scale = 0.5f;
    }
    if (o->alibi) d->alibi_slopes = score_slopes;
    if (o->bias == 1) {
        d->bias_batch = 1;
        d->bias_heads = d->heads_q;
        d->bias.dtype = FA_DTYPE_F32;
    } else if (o->bias == 2) {
        d->bias_batch = d->batch;
        d->bias_heads = d->heads_q;
        d->bias.dtype = d->q.dtype;
        d->bias.offset = 3;
        d->bias.stride_seq = d->seqlen_k + 5;
        d->bias.stride_head = (int64_t)d->seqlen_q * (d->seqlen_k + 5) + 1;
        d->bias.stride_batch = d->heads_q * d->bias.stride_head + 7;
    }
    if (o->causal_dropout) {
        d->causal = 1;
        d->dropout_p = 0.15f;
        d->dropout_seed = 1234;
    }
    /* Four sequences of 33, 12, 100 and 0 keys, with 5, 0, 77 and 68
     * queries (a decoding shape's: 1, 2, 0 and 3). */
    if (o->varlen) {
        const int decode = d->seqlen_q < 8;
        d->causal = 1;
        d->batch = 4;
        d->seqlen_q = decode ? 3 : 77;
        d->seqlen_k = 100;
        d->cu_seqlens_q = decode ? score_cu_q_decode : score_cu_q;
        d->cu_seqlens_k = score_cu_k;
    }
}
#endif

/* Every score option set on the SIMT kernels, forward and backward (fp32
 * and bf16 in turn, on tiles whose rows and keys the lengths do not
 * divide), and on the split-K forward (decoding, fp16), against the fp64
 * reference. */
FA_TEST(score_option_tiles_simt) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    suite_use_backend(&hip);
    if (!suite_context()) FA_SKIP("no HIP device (the suite's cases say why)");
    for (size_t i = 0; i < sizeof score_option_sets / sizeof score_option_sets[0]; i++) {
        const score_opts *o = &score_option_sets[i];
        char name[128];
        fa_attention_desc d = suite_desc(i % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F32, 2, 70, 90, 4, 2, 64);
        set_score_opts(&d, o);
        snprintf(name, sizeof name, "simt %s", o->name);
        suite_run_tiles(name, &d, &(suite_tiles){32, 32, 2, 2, 1, 0}, &(suite_tiles){16, 32, 2, 2, 1, 0}, 1);
        d = suite_desc(FA_DTYPE_F16, 2, 3, 700, 8, 2, 128);
        set_score_opts(&d, o);
        snprintf(name, sizeof name, "split-K %s", o->name);
        suite_run_tiles(name, &d, &(suite_tiles){16, 32, 1, 2, 4, 0}, NULL, 0);
    }
#endif
}

/* Every score option set on the matrix-core kernels, where the device's
 * matrix cores run them: forward, backward with dQ by atomics and the
 * deterministic backward (its dQ kernel), fp16 at head_dim 64 and bf16 at
 * 128, on the device's smallest and largest tile geometries in turn. */
FA_TEST(score_option_tiles_mma) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    suite_use_backend(&hip);
    if (!suite_context()) FA_SKIP("no HIP device (the suite's cases say why)");
    int runs = 0;
    for (size_t i = 0; i < sizeof score_option_sets / sizeof score_option_sets[0]; i++) {
        const score_opts *o = &score_option_sets[i];
        for (int t = 0; t < 2; t++) {
            const fa_dtype dt = t ? FA_DTYPE_BF16 : FA_DTYPE_F16;
            fa_device_desc dev;
            if (!mma_device(dt, &dev)) FA_SKIP("the HIP device has no matrix cores the kernels run");
            fa_attention_desc d = suite_desc(dt, 2, 150, 170, 4, 2, t ? 128 : 64);
            set_score_opts(&d, o);
            /* The deterministic backward admits other tiles: geometries
             * per mode. */
            for (int det = 0; det < 2; det++) {
                d.deterministic = det;
                suite_tiles f[MAX_GEOMETRIES], b[MAX_GEOMETRIES];
                const int nf = geometries_of(&dev, &d, FA_PASS_FORWARD, f),
                          nb = geometries_of(&dev, &d, FA_PASS_BACKWARD, b);
                CHECK_MSG(nf > 0 && nb > 0, "%s %s%s: %d forward and %d backward geometries", o->name,
                          fa_dtype_name(dt), det ? " det" : "", nf, nb);
                if (nf == 0 || nb == 0) continue;
                const int last = (int)(i + (size_t)t) % 2;
                const suite_tiles *tf = &f[last ? nf - 1 : 0], *tb = &b[last ? nb - 1 : 0];
                char name[128];
                snprintf(name, sizeof name, "mma %s %s %dx%d/%dx%d%s", fa_dtype_name(dt), o->name, tf->br, tf->bc,
                         tb->br, tb->bc, det ? " det" : "");
                suite_run_tiles(name, &d, tf, tb, 1);
                runs++;
            }
        }
    }
    fprintf(stderr, "  %d matrix-core score-option runs\n", runs);
#endif
}

FA_TEST_MAIN(FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window), FA_CASE(block_sparse),
             FA_CASE(block_sparse_skips_tiles), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa),
             FA_CASE(varlen), FA_CASE(decoding_splitk), FA_CASE(score_options), FA_CASE(lengths), FA_CASE(strides_offsets),
             FA_CASE(deterministic_backward), FA_CASE(described_devices), FA_CASE(rejects_bad_tiles),
             FA_CASE(long_sequences), FA_CASE(extreme_windows), FA_CASE(destroy_in_any_order),
             FA_CASE(huge_mask_blocks), FA_CASE(env_build_options), FA_CASE(mma_geometries),
             FA_CASE(mma_options), FA_CASE(score_option_tiles_simt),
             FA_CASE(score_option_tiles_mma))
