/* Standard (unfused) attention on the CUDA backend (FA_ALGO_STANDARD: S, P,
 * dP and dS in device memory, products through cuBLAS), through the public
 * API, against the CPU references (tests/standard_suite.c runs and checks
 * each problem). Cases skip where no CUDA device (or NVRTC) exists, and
 * where cuBLAS cannot be loaded (except the case that checks that refusal).
 *
 * fa-test-labels: device */
#include "attention_suite.h"
#include "harness.h"
#include "standard_suite.h"

#include "flashattn.h"
#include "plan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#include "backends/cuda/cuda_standard.h"

/* Kernels are compiled at run time: a device without NVRTC cannot run. */
static int nvrtc_usable(char *why, size_t len) {
    char reason[200];
    if (fa_cuda_nvrtc_available(reason, sizeof reason)) return 1;
    snprintf(why, len, "no NVRTC to compile kernels: %s", reason);
    return 0;
}
#define CUDA_COMPILED 1
#define CUDA_USABLE nvrtc_usable
#else
#define CUDA_COMPILED 0
#define CUDA_USABLE NULL
#endif

/* Same-rounding tolerances in fp16 and bf16: a tenth of O's elements, and
 * L to 1e-5 (cuBLAS may sum a score in another order and round it the
 * other way). */
static const standard_backend cuda_standard = {FA_BACKEND_CUDA, "CUDA", CUDA_COMPILED, CUDA_USABLE, 0.10, 1e-5};

static void use_cuda(void) { standard_use_backend(&cuda_standard); }

#define REQUIRE_BLAS()                                                                     \
    do {                                                                                   \
        use_cuda();                                                                        \
        STANDARD_REQUIRE_BLAS();                                                           \
    } while (0)

#define CUBLAS_ENV "FLASHATTN_CUBLAS_LIBRARY"
#define MISSING_CUBLAS "/nonexistent/flashattn-test/libcublas.so.13"

FA_TEST(dtypes) {
    REQUIRE_BLAS();
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = standard_desc(standard_all_dtypes[i], 2, 100, 120, 2, 2, 64);
        standard_run("dtypes b2 h2 100x120 d64", &d);
    }
    /* fp32 on TF32 tensor cores, where the caller allows it. */
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 2, 100, 120, 2, 2, 64);
    d.allow_tf32 = 1;
    standard_run("tf32 b2 h2 100x120 d64", &d);
}

FA_TEST(head_dims) {
    REQUIRE_BLAS();
    const int dims[] = {64, 128};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            fa_attention_desc d = standard_desc(standard_all_dtypes[i], 1, 70, 90, 2, 2, dims[j]);
            char name[64];
            snprintf(name, sizeof name, "head_dim %d", dims[j]);
            standard_run(name, &d);
        }
    fa_attention_desc d = standard_desc(FA_DTYPE_BF16, 1, 50, 40, 1, 1, 32);
    d.softmax_scale = 0.3f;
    standard_run("head_dim 32 scale 0.3", &d);
}

FA_TEST(causal) {
    REQUIRE_BLAS();
    standard_causal_shapes(standard_all_dtypes, 3);
}

FA_TEST(sliding_window) {
    REQUIRE_BLAS();
    standard_sliding_windows(standard_all_dtypes, 64);
}

/* About half the blocks on, and one whole block row off: its rows see no
 * key (L = -inf, O = 0, dQ = 0). */
FA_TEST(block_sparse) {
    REQUIRE_BLAS();
    standard_block_sparse(128, "block-sparse 40x8 causal d128");
    fa_attention_desc d = standard_desc(FA_DTYPE_BF16, 2, 64, 96, 4, 2, 64);
    uint8_t *m = suite_random_block_mask(&d, 32, 32, 13);
    CHECK(m != NULL);
    if (m) standard_run("block-sparse 32x32 gqa", &d);
    free(m);
}

FA_TEST(dropout) {
    REQUIRE_BLAS();
    standard_dropout(64, "dropout 0.5 causal mqa");
    fa_attention_desc d = standard_desc(FA_DTYPE_BF16, 2, 70, 130, 2, 2, 128);
    d.dropout_p = 0.1f;
    d.dropout_seed = 9;
    d.dropout_offset = 12345;
    standard_run("dropout 0.1 d128", &d);
}

FA_TEST(dropout_mask_bits) {
    REQUIRE_BLAS();
    standard_dropout_mask_bits();
}

/* dK and dV sum over the query heads of a group (one product per member,
 * accumulated; through fp32 for fp16 and bf16): the same bits on every
 * run. */
FA_TEST(gqa_mqa) {
    REQUIRE_BLAS();
    const standard_run_opts twice = {1, 1};
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = standard_desc(standard_all_dtypes[i], 2, 90, 110, 6, 2, 64);
        standard_run_case("gqa 6/2 twice", &d, twice);
    }
    fa_attention_desc d = standard_desc(FA_DTYPE_BF16, 1, 100, 80, 4, 1, 64);
    d.causal = 1;
    standard_run("mqa 4/1 causal", &d);
    d = standard_desc(FA_DTYPE_F32, 2, 33, 47, 8, 1, 128);
    standard_run("mqa 8/1 d128", &d);
    /* More kv heads than group members: the products run kv head by kv head. */
    d = standard_desc(FA_DTYPE_F16, 1, 60, 70, 8, 4, 64);
    standard_run("gqa 8/4", &d);
}

FA_TEST(varlen) {
    REQUIRE_BLAS();
    for (int i = 0; i < 3; i++) standard_varlen(standard_all_dtypes[i], 2, 2, 64, 0, "varlen");
    standard_varlen(FA_DTYPE_F16, 4, 2, 64, 1, "varlen causal dropout gqa");
    /* Equal lengths: sequences may share a strided call. */
    static const int32_t cu_e[] = {0, 40, 80, 120};
    fa_attention_desc d = standard_desc(FA_DTYPE_BF16, 3, 40, 40, 2, 1, 128);
    d.cu_seqlens_q = cu_e;
    d.cu_seqlens_k = cu_e;
    standard_run("varlen equal lengths mqa d128", &d);
}

FA_TEST(strides_offsets) {
    REQUIRE_BLAS();
    for (int i = 0; i < 3; i++) standard_bhsd(standard_all_dtypes[i], 64, "bhsd");
    for (int i = 0; i < 3; i++) standard_padded_strides(standard_all_dtypes[i], "padded strides and offsets causal");
    standard_varlen_strides(64, "varlen strides", "varlen strides");
}

FA_TEST(lengths) {
    REQUIRE_BLAS();
    const int lens[] = {1, 7, 127, 1000};
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < 3; t++) {
            fa_attention_desc d = standard_desc(standard_all_dtypes[t], 1, lens[i], lens[i], 2, 1, 64);
            char name[64];
            snprintf(name, sizeof name, "length %d", lens[i]);
            standard_run(name, &d);
        }
    fa_attention_desc d = standard_desc(FA_DTYPE_F16, 2, 1, 1000, 2, 2, 128);
    standard_run("decode 1x1000 d128", &d);
    d = standard_desc(FA_DTYPE_F32, 1, 127, 7, 2, 2, 64);
    d.causal = 1;
    standard_run("127x7 causal (rows without keys)", &d);
}

/* One query per sequence (decoding): a tensor whose token stride is
 * narrower than a row (16 elements for 64-wide rows) is valid when each
 * sequence holds one token; cuBLAS wants a leading dimension of a row. */
FA_TEST(single_query) {
    REQUIRE_BLAS();
    for (int i = 0; i < 3; i++) standard_single_query(standard_all_dtypes[i]);
}

/* The path of layouts cuBLAS cannot address (a token stride beyond 32
 * bits): every tensor copied to its packed form and the results back,
 * forced here on small problems. */
FA_TEST(packed_copies) {
    REQUIRE_BLAS();
#ifdef FA_WITH_CUDA
    fa_cuda_standard_set_force_pack(1);
    for (int i = 0; i < 3; i++) {
        fa_attention_desc d = standard_desc(standard_all_dtypes[i], 2, 50, 60, 4, 2, 64);
        d.q.offset = 16;
        d.q.stride_seq = 4 * 64 + 16;
        d.q.stride_batch = 50 * d.q.stride_seq;
        d.v.stride_head = 72;
        d.v.stride_seq = 2 * 72;
        d.v.stride_batch = 60 * 2 * 72;
        d.o.offset = 8;
        d.o.stride_seq = 4 * 64 + 8;
        d.o.stride_batch = 50 * d.o.stride_seq + 64;
        d.causal = i == 1;
        standard_run("packed copies gqa", &d);
    }
    static const int32_t cu_q[] = {0, 5, 5, 82, 150};
    static const int32_t cu_k[] = {0, 33, 45, 145, 145};
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 4, 77, 100, 2, 2, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    d.k.stride_seq = 2 * 64 + 32;
    standard_run("packed copies varlen", &d);
    fa_cuda_standard_set_force_pack(0);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* Score matrices split over several allocations (a cap of a few blocks
 * each): chunk boundaries inside sequences and inside the query heads of
 * one kv head, whose dK and dV sums cross them. */
FA_TEST(chunked_scores) {
    REQUIRE_BLAS();
#ifdef FA_WITH_CUDA
    fa_context ctx = standard_blas_context();
    /* 6 query heads over 2 kv heads, 90 x 112 (padded 110) fp32 blocks:
     * 2.5 blocks to an allocation, so two each. */
    fa_cuda_standard_set_chunk_limit((size_t)90 * 112 * 4 * 5 / 2);
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 2, 90, 110, 6, 2, 64);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        const int chunks = fa_cuda_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 6, "12 blocks, two to an allocation: %d allocations", chunks);
        fa_plan_destroy(plan);
    }
    d.causal = 1;
    d.dropout_p = 0.2f;
    d.dropout_seed = 77;
    standard_run("chunked gqa causal dropout", &d);
    /* Allocations of 24750 fp16 elements: sequence 0's four 40 x 72 blocks
     * and two of sequence 2's 90 x 72 ones in the first, sequence 2's other
     * two in the second (sequence 1 has no queries). */
    fa_cuda_standard_set_chunk_limit((size_t)24750 * 2);
    static const int32_t cu_q[] = {0, 40, 40, 130};
    static const int32_t cu_k[] = {0, 70, 95, 160};
    d = standard_desc(FA_DTYPE_F16, 3, 90, 70, 4, 1, 64);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        const int chunks = fa_cuda_standard_chunk_count(plan->impl);
        CHECK_MSG(chunks == 2, "blocks of 2880 and 6480 elements, 24750 to an allocation: %d allocations", chunks);
        fa_plan_destroy(plan);
    }
    standard_run("chunked varlen mqa", &d);
    fa_cuda_standard_set_chunk_limit(0);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* The plan holds the planner's workspace (S and P; then dP, dS and D once
 * the backward pass has run), the quantity the benchmark plots against the
 * sequence length. */
FA_TEST(device_memory) {
    REQUIRE_BLAS();
#ifdef FA_WITH_CUDA
    fa_context ctx = standard_blas_context();
    const int batch = 2, sq = 64, sk = 96, hq = 3, dim = 64;
    fa_attention_desc d = standard_desc(FA_DTYPE_F16, batch, sq, sk, hq, 1, dim);
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (!plan) return;
    fa_plan_info info;
    CHECK_OK(fa_plan_get_info(plan, &info));
    const size_t matrix = (size_t)batch * hq * sq * sk * 2, rows = (size_t)batch * hq * sq * sizeof(float);
    CHECK_MSG(info.forward.workspace_bytes == 2 * matrix && info.backward.workspace_bytes == 4 * matrix + rows,
              "planned workspace %zu / %zu, expected %zu / %zu", info.forward.workspace_bytes,
              info.backward.workspace_bytes, 2 * matrix, 4 * matrix + rows);
    /* Besides the workspace only small arrays (offsets; with GQA in fp16
     * the fp32 sums of dK and dV). */
    const size_t sums = 2 * (size_t)batch * sk * dim * sizeof(float), small = 4096;
    size_t bytes = 0;
    CHECK_OK(fa_cuda_standard_device_bytes(plan->impl, &bytes));
    CHECK_MSG(bytes >= info.forward.workspace_bytes && bytes <= info.forward.workspace_bytes + small,
              "forward plan holds %zu bytes, its workspace is %zu", bytes, info.forward.workspace_bytes);
    const size_t nq = (size_t)batch * sq * hq * dim, nk = (size_t)batch * sk * dim;
    const size_t sizes[9] = {nq, nk, nk, nq, rows / 2, nq, nq, nk, nk}; /* elements of 2 bytes */
    fa_buffer bufs[9];
    if (standard_io_buffers(ctx, FA_DTYPE_F16, sizes, bufs)) {
        CHECK_OK(fa_forward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]));
        CHECK_OK(fa_cuda_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes <= info.forward.workspace_bytes + small, "the forward pass allocated: %zu bytes", bytes);
        CHECK_OK(fa_backward(plan, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5], bufs[6], bufs[7], bufs[8]));
        CHECK_OK(fa_cuda_standard_device_bytes(plan->impl, &bytes));
        CHECK_MSG(bytes >= info.backward.workspace_bytes + sums && bytes <= info.backward.workspace_bytes + sums + small,
                  "after backward the plan holds %zu bytes; its workspace is %zu, the fp32 sums %zu", bytes,
                  info.backward.workspace_bytes, sums);
        CHECK_OK(fa_context_synchronize(ctx));
    }
    standard_free_buffers(bufs, 9);
    fa_plan_destroy(plan);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* Score matrices the device cannot hold are FA_ERR_OUT_OF_MEMORY with a
 * message that says so (the benchmark reports that point), never a crash,
 * and leave the context usable. */
FA_TEST(out_of_memory) {
    REQUIRE_BLAS();
    fa_context ctx = standard_blas_context();
    fa_device_info info;
    CHECK_OK(fa_context_get_info(ctx, &info));
    const double global = (double)info.desc.global_mem_bytes;
    CHECK_MSG(global > 0, "the device reports %zu bytes of global memory", info.desc.global_mem_bytes);
    if (!(global > 0)) return;
    /* Beyond the whole device: seqlen 65536 in fp16, S and P twice the
     * global memory; refused before any allocation. */
    {
        const int n = 65536;
        const double per_head = (double)n * n * 2.0 * 2.0;
        const int heads = (int)(2.0 * global / per_head) + 1;
        fa_attention_desc d = standard_desc(FA_DTYPE_F16, 1, n, n, heads, 1, 64);
        d.causal = 1;
        fa_plan plan = NULL;
        fa_status st = fa_plan_create(ctx, &d, &plan);
        CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL, "S and P of %.0f bytes (global %.0f): %s (%s)",
                  per_head * heads, global, fa_status_string(st), fa_last_error());
        CHECK_MSG(strstr(fa_last_error(), "global memory") != NULL, "message: %s", fa_last_error());
        if (plan) fa_plan_destroy(plan);
    }
    /* Within the device's size but not its free memory: a buffer takes most
     * of it first, so the allocation of the score matrices fails. */
    {
        const size_t taken = (size_t)(global * 0.6);
        fa_buffer hog = NULL;
        fa_status st = fa_buffer_alloc(ctx, taken, &hog);
        if (st == FA_SUCCESS) {
            const int n = 16384;
            const double per_head = (double)n * n * 2.0 * 2.0;
            const int heads = (int)(0.8 * global / per_head) + 1;
            fa_attention_desc d = standard_desc(FA_DTYPE_F16, 1, n, n, heads, heads, 64);
            fa_plan plan = NULL;
            st = fa_plan_create(ctx, &d, &plan);
            CHECK_MSG(st == FA_ERR_OUT_OF_MEMORY && plan == NULL,
                      "S and P of %.0f bytes beside %zu bytes taken (global %.0f): %s (%s)", per_head * heads, taken,
                      global, fa_status_string(st), fa_last_error());
            CHECK_MSG(strstr(fa_last_error(), "score matrix") != NULL, "message: %s", fa_last_error());
            if (plan) fa_plan_destroy(plan);
            fa_buffer_free(hog);
        } else {
            fprintf(stderr, "  could not take %zu bytes first (%s): no allocation-failure case\n", taken,
                    fa_last_error());
        }
    }
    /* Nothing was left behind: an ordinary problem still runs. */
    fa_attention_desc d = standard_desc(FA_DTYPE_F32, 1, 33, 47, 2, 2, 64);
    standard_run("after out of memory", &d);
}

/* With cuBLAS unloadable, a standard plan fails with FA_ERR_UNSUPPORTED
 * and a message naming cuBLAS and the file tried, and the fused path is
 * unaffected. */
FA_TEST(cublas_missing) {
    use_cuda();
    if (!standard_context()) FA_SKIP(standard_skip_reason());
#ifdef FA_WITH_CUDA
    standard_blas_missing(CUBLAS_ENV, MISSING_CUBLAS, "cuBLAS", 64, fa_cuda_standard_blas_loaded(),
                          "test_cuda_standard", "cublas_missing");
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

FA_TEST_MAIN(FA_CASE(cublas_missing), FA_CASE(dtypes), FA_CASE(head_dims), FA_CASE(causal), FA_CASE(sliding_window),
             FA_CASE(block_sparse), FA_CASE(dropout), FA_CASE(dropout_mask_bits), FA_CASE(gqa_mqa), FA_CASE(varlen),
             FA_CASE(strides_offsets), FA_CASE(lengths), FA_CASE(single_query), FA_CASE(packed_copies),
             FA_CASE(chunked_scores), FA_CASE(device_memory), FA_CASE(out_of_memory))
