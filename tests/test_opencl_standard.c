/* Standard (unfused) attention on the OpenCL backend (FA_ALGO_STANDARD:
 * S and P in global memory, products through CLBlast), through the public
 * API, against the CPU references (tests/standard_suite.c runs and checks
 * each problem). Cases skip where no OpenCL device exists, and where
 * CLBlast cannot be loaded (except the case that checks that refusal).
 *
 * fa-test-labels: device */
#include "harness.h"
#include "standard_suite.h"

#include "flashattn.h"
#include "plan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_runtime_internal.h"
#include "backends/opencl/cl_standard.h"
#define OPENCL_COMPILED 1
#else
#define OPENCL_COMPILED 0
#endif

/* Same-rounding tolerances in fp16 and bf16: only a value lying next to a
 * rounding boundary (a score or a probability; a tie happens) may round
 * the other way, and then it moves one row of O, so at most 5% of O's
 * elements, and L fp32-accurate. */
static const standard_backend opencl_standard = {FA_BACKEND_OPENCL, "OpenCL", OPENCL_COMPILED, NULL, 0.05, 2e-6};

static void use_opencl(void) { standard_use_backend(&opencl_standard); }

#define REQUIRE_BLAS()                                                                     \
    do {                                                                                   \
        use_opencl();                                                                      \
        STANDARD_REQUIRE_BLAS();                                                           \
    } while (0)

#define CLBLAST_ENV "FLASHATTN_CLBLAST_LIBRARY"
#define MISSING_CLBLAST "/nonexistent/flashattn-test/libclblast.so.1"

FA_TEST(dtypes) {
    REQUIRE_BLAS();
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = standard_desc(standard_all_dtypes[i], 2, 100, 120, 2, 2, 64);
        standard_run("dtypes b2 h2 100x120 d64", &d);
    }
}

FA_TEST(head_dims) {
    REQUIRE_BLAS();
    const int dims[] = {32, 64, 128};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = standard_desc(FA_DTYPE_F32, 1, 70, 90, 2, 2, dims[i]);
        char name[64];
        snprintf(name, sizeof name, "head_dim %d", dims[i]);
        standard_run(name, &d);
    }
    fa_attention_desc d = standard_desc(FA_DTYPE_F16, 1, 60, 80, 2, 1, 128);
    standard_run("head_dim 128 fp16 mqa", &d);
    d = standard_desc(FA_DTYPE_BF16, 1, 50, 40, 1, 1, 32);
    d.softmax_scale = 0.3f;
    standard_run("head_dim 32 bf16 scale 0.3", &d);
}

FA_TEST(causal) {
    REQUIRE_BLAS();
    const fa_dtype f32 = FA_DTYPE_F32;
    standard_causal_shapes(&f32, 1);
    fa_attention_desc d = standard_desc(FA_DTYPE_F16, 1, 120, 97, 2, 2, 64);
    d.causal = 1;
    standard_run("causal 120x97 fp16", &d);
}

FA_TEST(sliding_window) {
    REQUIRE_BLAS();
    const fa_dtype dts[3] = {FA_DTYPE_F32, FA_DTYPE_BF16, FA_DTYPE_F32};
    standard_sliding_windows(dts, 32);
}

/* About half the blocks on, and one whole block row off: its rows see no
 * key (L = -inf, O = 0, dQ = 0). */
FA_TEST(block_sparse) {
    REQUIRE_BLAS();
    standard_block_sparse(32, "block-sparse 40x8 causal fp16");
}

FA_TEST(dropout) {
    REQUIRE_BLAS();
    standard_dropout(32, "dropout 0.5 causal mqa fp16");
}

FA_TEST(dropout_mask_bits) {
    REQUIRE_BLAS();
    standard_dropout_mask_bits();
}

/* dK and dV sum over the query heads of a group (one product per member,
 * accumulated): the same bits on every run. */
FA_TEST(gqa_mqa) {
    REQUIRE_BLAS();
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 2, 90, 110, 6, 2, 32);
    const standard_run_opts twice = {1, 1};
    standard_run_case("gqa 6/2 twice", &d, twice);
    d = standard_desc(FA_DTYPE_BF16, 1, 100, 80, 4, 1, 64);
    d.causal = 1;
    standard_run("mqa 4/1 causal bf16", &d);
}

FA_TEST(varlen) {
    REQUIRE_BLAS();
    standard_varlen(FA_DTYPE_F32, 2, 2, 32, 0, "varlen");
    standard_varlen(FA_DTYPE_F16, 4, 2, 64, 1, "varlen causal dropout gqa fp16");
}

FA_TEST(strides_offsets) {
    REQUIRE_BLAS();
    /* fp32 tensors are used in place. */
    standard_bhsd(FA_DTYPE_F32, 32, "bhsd fp32");
    standard_padded_strides(FA_DTYPE_F32, "padded strides and offsets fp32");
    standard_padded_strides(FA_DTYPE_F16, "padded strides and offsets fp16");
    standard_varlen_strides(32, "varlen strides bf16", "varlen strides fp32");
}

/* One query per sequence (decoding): a token stride CLBlast could not take
 * as a leading dimension. */
FA_TEST(single_query) {
    REQUIRE_BLAS();
    standard_single_query(FA_DTYPE_F32);
}

#ifdef FA_WITH_OPENCL
/* The device's CL_DEVICE_MAX_MEM_ALLOC_SIZE, from the backend's records. */
static uint64_t max_alloc_bytes(fa_context ctx) {
    fa_device_info info;
    if (fa_context_get_info(ctx, &info) != FA_SUCCESS) return 0;
    const fa_cl_device *dev = fa_cl_device_get(info.index);
    return dev ? (uint64_t)dev->max_alloc_bytes : 0;
}
#endif

/* A score matrix the device cannot hold is FA_ERR_OUT_OF_MEMORY at plan
 * creation, with a message that says so, and leaves the context usable. */
FA_TEST(out_of_memory) {
    REQUIRE_BLAS();
#ifdef FA_WITH_OPENCL
    fa_context ctx = standard_blas_context();
    fa_device_info info;
    CHECK_OK(fa_context_get_info(ctx, &info));
    const uint64_t max_alloc = max_alloc_bytes(ctx), global = info.desc.global_mem_bytes;
    CHECK_MSG(max_alloc > 0 && global > 0, "device reports max alloc %llu, global memory %llu",
              (unsigned long long)max_alloc, (unsigned long long)global);
    if (!(max_alloc > 0 && global > 0)) return;

    /* One head's S larger than one buffer may be, though the device has the
     * memory for it. */
    const int n1 = (int)sqrt((double)max_alloc / 4.0) + 64;
    if ((double)n1 * n1 * 4.0 < (double)global) {
        fa_attention_desc d = standard_desc(FA_DTYPE_F32, 1, n1, n1, 1, 1, 8);
        fa_plan plan = NULL;
        fa_status st = fa_plan_create(ctx, &d, &plan);
        CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL, "S of %d x %d (max alloc %llu): %s (%s)", n1, n1,
                  (unsigned long long)max_alloc, fa_status_string(st), fa_last_error());
        CHECK_MSG(strstr(fa_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE") != NULL, "message: %s", fa_last_error());
        if (plan) fa_plan_destroy(plan);
    } else {
        fprintf(stderr, "  one buffer may hold all the device memory: no per-buffer case\n");
    }
    /* Larger than the whole device: seqlen 65536, twice the global memory. */
    {
        const int n = 65536;
        const double per_head = (double)n * n * 4.0;
        int heads = (int)(2.0 * (double)global / per_head) + 1;
        fa_attention_desc d = standard_desc(FA_DTYPE_F16, 1, n, n, heads, 1, 8);
        d.causal = 1;
        fa_plan plan = NULL;
        fa_status st = fa_plan_create(ctx, &d, &plan);
        CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL, "S of %.0f bytes (global %llu): %s (%s)",
                  per_head * heads, (unsigned long long)global, fa_status_string(st), fa_last_error());
        CHECK_MSG(strstr(fa_last_error(), "global memory") != NULL, "message: %s", fa_last_error());
        if (plan) fa_plan_destroy(plan);
    }
    /* Nothing was left behind: an ordinary problem still runs. */
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 1, 33, 47, 2, 2, 16);
    standard_run("after out of memory", &d);
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

/* Score matrices split over several buffers (as they are when one buffer
 * cannot hold them, or CLBlast could not index them): a cap of a few blocks
 * per buffer puts chunk boundaries inside sequences and inside the query
 * heads of one kv head, whose dK and dV sums cross them. */
FA_TEST(chunked_scores) {
    REQUIRE_BLAS();
#ifdef FA_WITH_OPENCL
    fa_context ctx = standard_blas_context();
    /* 6 query heads over 2 kv heads, 90 x 110 blocks: 2.5 blocks a buffer. */
    fa_cl_standard_set_chunk_limit((size_t)90 * 110 * 4 * 5 / 2);
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 2, 90, 110, 6, 2, 32);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        int chunks = fa_cl_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 6, "12 blocks, two to a buffer: %d buffers", chunks);
        fa_plan_destroy(plan);
    }
    d.causal = 1;
    d.dropout_p = 0.2f;
    d.dropout_seed = 77;
    standard_run("chunked gqa causal dropout", &d);
    /* Buffers of 24750 elements: sequence 0's four 40 x 70 blocks and two
     * of sequence 2's 90 x 65 ones in the first, sequence 2's other two in
     * the second (sequence 1 has no queries). */
    static const int32_t cu_q[] = {0, 40, 40, 130};
    static const int32_t cu_k[] = {0, 70, 95, 160};
    d = standard_desc(FA_DTYPE_F16, 3, 90, 70, 4, 1, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        int chunks = fa_cl_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 2, "blocks of 2800 and 5850 elements, 24750 to a buffer: %d buffers", chunks);
        fa_plan_destroy(plan);
    }
    standard_run("chunked varlen mqa fp16", &d);
    fa_cl_standard_set_chunk_limit(0);
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

/* The plan holds the score matrix in device memory (the quantity the
 * benchmark plots against the sequence length), the backward pass's second
 * matrix only once it has run. */
FA_TEST(device_memory) {
    REQUIRE_BLAS();
#ifdef FA_WITH_OPENCL
    fa_context ctx = standard_blas_context();
    const int batch = 2, sq = 64, sk = 96, hq = 3, dim = 32;
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, batch, sq, sk, hq, 1, dim);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (!plan) return;
    /* fp32 tensors are used in place: besides S only a few small vectors
     * (offsets, placeholders), then dS and D. */
    const size_t scores = (size_t)batch * hq * sq * sk * sizeof(float), rows = (size_t)batch * hq * sq * sizeof(float);
    const size_t small = 1024;
    size_t bytes = 0;
    CHECK_OK(fa_cl_standard_device_bytes(plan->impl, &bytes));
    CHECK_MSG(bytes >= scores && bytes <= scores + small, "forward plan holds %zu bytes, S alone is %zu", bytes,
              scores);
    const size_t nq = (size_t)batch * sq * hq * dim, nk = (size_t)batch * sk * dim;
    const size_t sizes[9] = {nq, nk, nk, nq, rows / sizeof(float), nq, nq, nk, nk};
    fa_buffer bufs[9];
    if (standard_io_buffers(ctx, FA_DTYPE_F32, sizes, bufs)) {
        CHECK_OK(fa_forward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]));
        CHECK_OK(fa_cl_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes <= scores + small, "the forward pass allocated: %zu bytes", bytes);
        CHECK_OK(fa_backward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7], bufs[8]));
        CHECK_OK(fa_cl_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes >= 2 * scores + rows && bytes <= 2 * scores + rows + small,
                  "after backward the plan holds %zu bytes; S, dS and D are %zu", bytes, 2 * scores + rows);
    }
    standard_free_buffers(bufs, 9);
    fa_plan_destroy(plan);
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

/* With CLBlast unloadable, a standard plan fails with FA_ERR_UNSUPPORTED
 * and a message naming CLBlast and the file tried, and the fused path is
 * unaffected. */
FA_TEST(clblast_missing) {
    use_opencl();
    if (!standard_context()) FA_SKIP(standard_skip_reason());
#ifdef FA_WITH_OPENCL
    standard_blas_missing(CLBLAST_ENV, MISSING_CLBLAST, "CLBlast", 16, fa_cl_standard_blas_loaded(),
                          "test_opencl_standard", "clblast_missing");
#else
    FA_SKIP("the OpenCL backend is not built into this library");
#endif
}

FA_TEST_MAIN(FA_CASE(clblast_missing), FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal),
             FA_CASE(sliding_window), FA_CASE(block_sparse), FA_CASE(dropout), FA_CASE(dropout_mask_bits),
             FA_CASE(gqa_mqa), FA_CASE(varlen), FA_CASE(strides_offsets), FA_CASE(single_query),
             FA_CASE(out_of_memory), FA_CASE(chunked_scores), FA_CASE(device_memory))
