/* The attention suite (tests/attention_suite.c) on the OpenCL backend's
 * best device: PoCL in CI, NVIDIA's OpenCL on the GPU machine; once more
 * per emulated matrix-unit layout, its fp32 cases in fp16 and bf16
 * (CMakeLists.txt): every case for NVIDIA's layout; for the Intel DPAS,
 * AMD MFMA and AMD WMMA layouts a subset (masks, dropout's bits, the
 * deterministic backward, the score options), tests/test_opencl_mma.c
 * covering their head dims and lengths.
 *
 * fa-test-labels: device
 * fa-test-mma-layouts: nvidia
 * fa-test-mma-subset-layouts: intel amd-mfma amd-wmma
 * fa-test-mma-subset-cases: causal dropout_mask_bits deterministic_backward score_options */
#include "attention_suite.h"
#include "harness.h"
#include "opencl_suite.h"

#include "planner.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The runs per emulated matrix-unit layout (fa-test-mma-layouts above)
 * skip the cases of the streaming FMA kernels, which do not depend on it. */
#define SKIP_WHEN_EMULATING()                                                              \
    do {                                                                                   \
        if (opencl_suite_emulating()) FA_SKIP("the streaming FMA kernels do not depend on the matrix-unit layer"); \
    } while (0)

static const suite_backend *const opencl = &opencl_suite;

#define OPENCL_CASE(name)                                                                  \
    do {                                                                                   \
        suite_use_backend(opencl);                                                        \
        suite_##name();                                                                    \
    } while (0)

/* A case whose forced tiles run in the streaming kernels. */
#define STREAM_CASE(name)                                                                  \
    do {                                                                                   \
        SKIP_WHEN_EMULATING();                                                             \
        suite_use_backend(opencl);                                                        \
        opencl_suite_stream(1);                                                            \
        suite_##name();                                                                    \
        opencl_suite_stream(0);                                                            \
    } while (0)

#ifdef FA_WITH_OPENCL
/* The streaming kernels on every option, whatever the planner would pick
 * for these problems (it keeps the SIMT kernels below head_dim 96): forced
 * tiles (NVIDIA's OpenCL plans at head_dim 64 and 128, and small and odd
 * ones), packed tensors of fresh random inputs, outputs poisoned with NaN,
 * every output compared with the fp64 reference. */
static double dtype_tol(fa_dtype t) { return t == FA_DTYPE_F16 ? 3e-3 : t == FA_DTYPE_BF16 ? 2e-2 : 1e-5; }

static void *device_copy(fa_context ctx, const void *host, size_t bytes, fa_buffer *buf) {
    *buf = NULL;
    CHECK_OK(fa_buffer_alloc(ctx, bytes, buf));
    if (*buf) CHECK_OK(fa_buffer_upload(*buf, 0, host, bytes));
    return *buf;
}

static void stream_case(const char *name, const fa_attention_desc *d, const suite_tiles *f, const suite_tiles *b) {
    fa_context ctx = suite_context();
    if (!ctx) return;
    const int failures_before = fa_test_failures;
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, d, &plan));
    if (!plan) return;
    opencl_suite_stream(1);
    fa_status st = opencl_suite.force_tiles(plan, f, b);
    opencl_suite_stream(0);
    CHECK_MSG(st == FA_SUCCESS, "%s: forcing the streaming kernels: %s", name, fa_last_error());
    if (st != FA_SUCCESS) {
        fa_plan_destroy(plan);
        return;
    }
    opencl_suite.check_plan(name, plan);
    const fa_dtype dt = d->q.dtype;
    const size_t es = fa_dtype_size(dt);
    const int64_t nq = fa_ref_tensor_span(d, FA_TENSOR_Q), nk = fa_ref_tensor_span(d, FA_TENSOR_K);
    const int64_t no = fa_ref_tensor_span(d, FA_TENSOR_O), nl = fa_attention_total_q(d) * d->heads_q;
    fa_rng rng;
    fa_rng_seed(&rng, suite_case_seed(name, 0));
    void *q = fa_test_random_tensor(&rng, dt, nq), *k = fa_test_random_tensor(&rng, dt, nk);
    void *v = fa_test_random_tensor(&rng, dt, nk), *g = fa_test_random_tensor(&rng, dt, no);
    void *o = malloc((size_t)no * es), *o_ref = malloc((size_t)no * es), *dq = malloc((size_t)nq * es);
    void *dq_ref = malloc((size_t)nq * es), *dk = malloc((size_t)nk * es), *dk_ref = malloc((size_t)nk * es);
    void *dv = malloc((size_t)nk * es), *dv_ref = malloc((size_t)nk * es), *again = malloc((size_t)nq * es);
    float *lse = malloc((size_t)nl * 4), *lse_ref = malloc((size_t)nl * 4);
    fa_buffer bq = NULL, bk = NULL, bv = NULL, bg = NULL, bo = NULL, bl = NULL, bdq = NULL, bdk = NULL, bdv = NULL;
    int ok = q && k && v && g && o && o_ref && dq && dq_ref && dk && dk_ref && dv && dv_ref && again && lse && lse_ref;
    CHECK(ok);
    if (!ok) goto out;
    fa_test_poison(o, dt, no);
    fa_test_poison(dq, dt, nq);
    fa_test_poison(dk, dt, nk);
    fa_test_poison(dv, dt, nk);
    fa_test_poison(lse, FA_DTYPE_F32, nl);
    if (!device_copy(ctx, q, (size_t)nq * es, &bq) || !device_copy(ctx, k, (size_t)nk * es, &bk) ||
        !device_copy(ctx, v, (size_t)nk * es, &bv) || !device_copy(ctx, g, (size_t)no * es, &bg) ||
        !device_copy(ctx, o, (size_t)no * es, &bo) || !device_copy(ctx, lse, (size_t)nl * 4, &bl) ||
        !device_copy(ctx, dq, (size_t)nq * es, &bdq) || !device_copy(ctx, dk, (size_t)nk * es, &bdk) ||
        !device_copy(ctx, dv, (size_t)nk * es, &bdv))
        goto out;
    CHECK_OK(fa_forward(plan, bq, bk, bv, bo, bl));
    CHECK_OK(fa_buffer_download(bo, 0, o, (size_t)no * es));
    CHECK_OK(fa_buffer_download(bl, 0, lse, (size_t)nl * 4));
    CHECK_OK(fa_ref_forward(d, q, k, v, o_ref, lse_ref));
    const double tol = dtype_tol(dt), err_o = fa_test_rel_error(o, o_ref, dt, no);
    const double err_l = fa_test_rel_error(lse, lse_ref, FA_DTYPE_F32, nl);
    int64_t inf_rows = 0;
    for (int64_t i = 0; i < nl; i++) inf_rows += isinf(lse_ref[i]) != isinf(lse[i]);
    CHECK_MSG(err_o < tol && err_l < 1e-5 && inf_rows == 0, "%s: O error %.3g, L error %.3g, %lld rows differ in -inf",
              name, err_o, err_l, (long long)inf_rows);

    CHECK_OK(fa_backward(plan, bq, bk, bv, bo, bl, bg, bdq, bdk, bdv));
    CHECK_OK(fa_buffer_download(bdq, 0, dq, (size_t)nq * es));
    CHECK_OK(fa_buffer_download(bdk, 0, dk, (size_t)nk * es));
    CHECK_OK(fa_buffer_download(bdv, 0, dv, (size_t)nk * es));
    /* From the device's O and L, as the kernels. */
    CHECK_OK(fa_ref_backward(d, q, k, v, o, lse, g, dq_ref, dk_ref, dv_ref));
    const double e_q = fa_test_rel_error(dq, dq_ref, dt, nq), e_k = fa_test_rel_error(dk, dk_ref, dt, nk);
    const double e_v = fa_test_rel_error(dv, dv_ref, dt, nk);
    CHECK_MSG(e_q < tol && e_k < tol && e_v < tol, "%s: dQ error %.3g, dK %.3g, dV %.3g (limit %.1g)", name, e_q, e_k,
              e_v, tol);
    if (d->deterministic) {
        CHECK_OK(fa_backward(plan, bq, bk, bv, bo, bl, bg, bdq, bdk, bdv));
        CHECK_OK(fa_buffer_download(bdq, 0, again, (size_t)nq * es));
        CHECK_MSG(memcmp(again, dq, (size_t)nq * es) == 0, "%s: dQ differs between two runs", name);
    }
    fprintf(stderr, "  %-40s O %.2e  dQ %.2e dK %.2e dV %.2e\n", name, err_o, e_q, e_k, e_v);
out:
    if (fa_test_failures != failures_before)
        fprintf(stderr, "  %s: inputs from seed 0x%016llx\n", name, (unsigned long long)suite_case_seed(name, 0));
    fa_buffer bufs[] = {bq, bk, bv, bg, bo, bl, bdq, bdk, bdv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    void *mem[] = {q, k, v, g, o, o_ref, dq, dq_ref, dk, dk_ref, dv, dv_ref, again, lse, lse_ref};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) free(mem[i]);
    fa_plan_destroy(plan);
}
#define STREAM_REQUIRE()                                                                   \
    do {                                                                                   \
        SKIP_WHEN_EMULATING();                                                             \
        suite_use_backend(opencl);                                                        \
        if (!suite_context()) FA_SKIP("no OpenCL device");                                 \
    } while (0)
#else
static void stream_case(const char *name, const fa_attention_desc *d, const suite_tiles *f, const suite_tiles *b) {
    (void)name;
    (void)d;
    (void)f;
    (void)b;
}
#define STREAM_REQUIRE() FA_SKIP("the OpenCL backend is not built into this library")
#endif

FA_TEST(dtypes) { OPENCL_CASE(dtypes); }
FA_TEST(head_dims) { OPENCL_CASE(head_dims); }
FA_TEST(causal) { OPENCL_CASE(causal); }
FA_TEST(sliding_window) { OPENCL_CASE(sliding_window); }
FA_TEST(block_sparse) { OPENCL_CASE(block_sparse); }
FA_TEST(block_sparse_skips_tiles) { OPENCL_CASE(block_sparse_skips_tiles); }
FA_TEST(dropout) { OPENCL_CASE(dropout); }
FA_TEST(dropout_mask_bits) { OPENCL_CASE(dropout_mask_bits); }
FA_TEST(gqa_mqa) { OPENCL_CASE(gqa_mqa); }
FA_TEST(varlen) { OPENCL_CASE(varlen); }
FA_TEST(decoding_splitk) { OPENCL_CASE(decoding_splitk); }
FA_TEST(score_options) { OPENCL_CASE(score_options); }
FA_TEST(lengths) { OPENCL_CASE(lengths); }
FA_TEST(strides_offsets) { OPENCL_CASE(strides_offsets); }
FA_TEST(deterministic_backward) { OPENCL_CASE(deterministic_backward); }
FA_TEST(described_devices) { OPENCL_CASE(described_devices); }
FA_TEST(rejects_bad_tiles) { OPENCL_CASE(rejects_bad_tiles); }
FA_TEST(long_sequences) { OPENCL_CASE(long_sequences); }
FA_TEST(extreme_windows) { OPENCL_CASE(extreme_windows); }
FA_TEST(destroy_in_any_order) { OPENCL_CASE(destroy_in_any_order); }
FA_TEST(huge_mask_blocks) { OPENCL_CASE(huge_mask_blocks); }
FA_TEST(env_build_options) { OPENCL_CASE(env_build_options); }

/* The streaming kernels skip masked tiles too. */
FA_TEST(block_sparse_skips_tiles_stream) { STREAM_CASE(block_sparse_skips_tiles); }

/* NVIDIA's OpenCL plans (fp32, 16k tokens): head_dim 128 forward 128 x 64
 * (8 x 4), backward 64 x 64 (4 x 4); head_dim 64 forward 128 x 64 (4 x 8),
 * backward 32 x 128 (4 x 4). */
static const suite_tiles nv128_f = {128, 64, 8, 4, 1, 0}, nv128_b = {64, 64, 4, 4, 1, 0};
static const suite_tiles nv64_f = {128, 64, 4, 8, 1, 0}, nv64_b = {32, 128, 4, 4, 1, 0};

/* Several options a case, each case its own programs: fp32 with GQA and
 * dropout (the atomic dQ), bf16 causal with a block mask, fp16 windowed
 * varlen in deterministic mode (the dQ kernel). */
FA_TEST(stream_d128_options) {
    STREAM_REQUIRE();
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 2, 150, 170, 4, 2, 128);
    d.dropout_p = 0.17f;
    d.dropout_seed = 0x123456789abcdefull;
    d.dropout_offset = 0x500000007ull;
    stream_case("stream d128 fp32 gqa dropout", &d, &nv128_f, &nv128_b);
    d = suite_desc(FA_DTYPE_BF16, 1, 150, 200, 2, 2, 128);
    d.causal = 1;
    uint8_t *m = suite_random_block_mask(&d, 16, 24, suite_case_seed("stream block mask", 0));
    stream_case("stream d128 bf16 causal block-sparse", &d, &nv128_f, &nv128_b);
    free(m);
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    d = suite_desc(FA_DTYPE_F16, 4, 77, 100, 4, 2, 128);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.window_left = 40;
    d.window_right = 9;
    d.deterministic = 1;
    stream_case("stream d128 fp16 varlen window deterministic", &d, &nv128_f, &nv128_b);
}

FA_TEST(stream_d64_options) {
    STREAM_REQUIRE();
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 4, 77, 100, 3, 1, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.causal = 1;
    d.dropout_p = 0.1f;
    d.dropout_seed = 5;
    stream_case("stream d64 varlen causal dropout mqa", &d, &nv64_f, &nv64_b);
}

/* Head dims the work-items' vectors do not tile (40), the largest (256),
 * tiles whose sides are not powers of two. */
FA_TEST(stream_shapes) {
    STREAM_REQUIRE();
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 70, 90, 2, 2, 40);
    stream_case("stream d40 16x16/2x2", &d, &(suite_tiles){16, 16, 2, 2, 1, 0}, &(suite_tiles){16, 16, 2, 2, 1, 0});
    d = suite_desc(FA_DTYPE_F32, 1, 45, 60, 2, 1, 256);
    stream_case("stream d256 64x16/2x2, 32x16/1x2", &d, &(suite_tiles){64, 16, 2, 2, 1, 0},
                &(suite_tiles){32, 16, 1, 2, 1, 0});
    d = suite_desc(FA_DTYPE_F32, 1, 37, 41, 2, 2, 16);
    d.dropout_p = 0.3f;
    d.dropout_seed = 7;
    stream_case("stream d16 dropout 6x6/2x3", &d, &(suite_tiles){6, 6, 2, 3, 1, 0}, &(suite_tiles){6, 6, 2, 3, 1, 0});
}

/* The score options (softcap, ALiBi, additive bias) in every FMA kernel,
 * whatever the planner would pick for these problems: the SIMT kernels
 * (their dQ kernel always separate), the streaming ones with dQ added
 * atomically and in deterministic mode (their own dQ kernel), and the
 * forward with keys split; against the fp64 reference through the suite's
 * checks (the bias in fp32 and in the inputs' dtype, broadcast and not). */
FA_TEST(score_options_kernels) {
    STREAM_REQUIRE();
    static const float slopes[4] = {0.5f, 0.125f, 0.75f, 0.03125f};
    /* Unfused attention has none of them (nor has the reference's). */
    fa_attention_desc d = suite_desc(FA_DTYPE_F32, 1, 16, 16, 4, 4, 64);
    d.algorithm = FA_ALGO_STANDARD;
    d.alibi_slopes = slopes;
    fa_plan refused = NULL;
    const fa_status st = fa_plan_create(suite_context(), &d, &refused);
    CHECK_MSG(st == FA_ERR_UNSUPPORTED && !refused && strstr(fa_last_error(), "alibi_slopes"),
              "standard attention with ALiBi: %s (%s)", fa_status_string(st), fa_last_error());
    if (refused) fa_plan_destroy(refused);
    d = suite_desc(FA_DTYPE_F32, 2, 70, 90, 4, 2, 64);
    d.causal = 1;
    d.softcap = 2.0f;
    d.softmax_scale = 0.4f;
    d.alibi_slopes = slopes;
    d.bias_batch = 2;
    d.bias_heads = 1;
    d.bias.dtype = FA_DTYPE_F32;
    d.dropout_p = 0.2f;
    d.dropout_seed = 11;
    const suite_tiles simt = {16, 32, 2, 2, 1, 0};
    suite_run_tiles("simt all three, dropout gqa", &d, &simt, &simt, 1);
    opencl_suite_stream(1);
    suite_run_tiles("stream all three, dropout gqa", &d, &nv64_f, &nv64_b, 1);
    d = suite_desc(FA_DTYPE_BF16, 2, 50, 75, 2, 2, 128);
    d.window_left = 30;
    d.window_right = 4;
    d.softcap = 1.5f;
    d.bias_batch = 1;
    d.bias_heads = 2;
    d.bias.dtype = FA_DTYPE_BF16;
    d.bias.offset = 3;
    d.bias.stride_seq = 80; /* rows padded past seqlen_k */
    d.bias.stride_head = 50 * 80;
    d.deterministic = 1;
    suite_run_tiles("stream softcap bias, deterministic", &d, &nv128_f, &nv128_b, 1);
    opencl_suite_stream(0);
    d = suite_desc(FA_DTYPE_F16, 2, 3, 900, 4, 1, 64);
    d.causal = 1;
    d.softcap = 4.0f;
    d.alibi_slopes = slopes;
    d.bias_batch = 2;
    d.bias_heads = 4;
    d.bias.dtype = FA_DTYPE_F16;
    suite_run_tiles("split 5 all three, causal", &d, &(suite_tiles){8, 64, 1, 4, 5, 0}, NULL, 0);
}

FA_TEST_MAIN(FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window), FA_CASE(block_sparse),
             FA_CASE(block_sparse_skips_tiles), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa),
             FA_CASE(varlen), FA_CASE(decoding_splitk), FA_CASE(score_options), FA_CASE(lengths), FA_CASE(strides_offsets),
             FA_CASE(deterministic_backward), FA_CASE(described_devices), FA_CASE(rejects_bad_tiles),
             FA_CASE(long_sequences), FA_CASE(extreme_windows), FA_CASE(destroy_in_any_order),
             FA_CASE(huge_mask_blocks), FA_CASE(env_build_options), FA_CASE(block_sparse_skips_tiles_stream),
             FA_CASE(stream_d128_options), FA_CASE(stream_d64_options), FA_CASE(stream_shapes),
             FA_CASE(score_options_kernels))
