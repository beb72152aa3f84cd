/* Inputs a hostile caller would try (issue 21): offsets and strides near
 * the int64 limits, windows at the ends of the int range, every order of
 * destroy calls, outputs aliasing inputs, flags out of range. Each must fail
 * cleanly or compute what the reference computes; these run under ASan and
 * UBSan in CI. */
#include "attention_suite.h"
#include "harness.h"
#include "test_util.h"

#include "build_options.h"
#include "checked.h"
#include "desc.h"
#include "fa_internal.h"
#include "flashattn.h"
#include "overlap.h"
#include "plan_data.h"
#include "plan.h"
#include "reference.h"

#include <limits.h>
#include <stdint.h>
#include <time.h>

static fa_attention_desc tiny_desc(void) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = 8;
    d.heads_q = d.heads_kv = 1;
    d.head_dim = 8;
    return d;
}

FA_TEST(checked_arithmetic) {
    int64_t r = 0;
    CHECK(!fa_ckd_add_i64(&r, INT64_MAX - 1, 1) && r == INT64_MAX);
    CHECK(fa_ckd_add_i64(&r, INT64_MAX, 1));
    CHECK(fa_ckd_add_i64(&r, INT64_MIN, -1));
    CHECK(!fa_ckd_add_i64(&r, INT64_MIN, INT64_MAX) && r == -1);
    CHECK(!fa_ckd_mul_i64(&r, INT64_C(1) << 31, INT64_C(1) << 31) && r == INT64_C(1) << 62);
    CHECK(fa_ckd_mul_i64(&r, INT64_C(1) << 32, INT64_C(1) << 31));
    CHECK(fa_ckd_mul_i64(&r, -(INT64_C(1) << 32), INT64_C(1) << 31) == 0 && r == INT64_MIN);
    CHECK(fa_ckd_mul_i64(&r, INT64_MIN, -1));
    CHECK(!fa_ckd_mul_i64(&r, 0, INT64_MIN) && r == 0);
    size_t z = 0;
    CHECK(!fa_ckd_add_size(&z, SIZE_MAX - 3, 3) && z == SIZE_MAX);
    CHECK(fa_ckd_add_size(&z, SIZE_MAX, 1));
    CHECK(fa_ckd_mul_size(&z, SIZE_MAX / 2 + 1, 2));
    CHECK(!fa_ckd_mul_size(&z, SIZE_MAX / 3, 3) && z == SIZE_MAX / 3 * 3);
    CHECK(fa_ckd_size_of_i64(&z, -1));
    CHECK(!fa_ckd_size_of_i64(&z, 12345) && z == 12345);
}

/* Problem 1 of the issue: an offset near 2^62 elements passed the check,
 * its byte count wrapped around to fit a 256-byte buffer, and the kernel
 * wrote before the buffer. */
FA_TEST(offsets_near_2_62_refused) {
    fa_attention_desc d = tiny_desc();
    d.o.offset = (INT64_C(1) << 62) - 4;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "o.offset");
    d = tiny_desc();
    d.q.offset = INT64_C(1) << 62;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "q.offset");
    d = tiny_desc();
    d.k.offset = INT64_MAX - 3; /* a multiple of 4 elements: aligned */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "k.offset");

    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    fa_plan plan = NULL;
    d = tiny_desc();
    d.o.offset = (INT64_C(1) << 62) - 4;
    CHECK_FAILS(fa_plan_create(ctx, &d, &plan), FA_ERR_BAD_STRIDE, "o.offset");
    CHECK(plan == NULL);
    fa_context_destroy(ctx);
}

/* Strides whose span reaches exactly INT64_MAX: the overlap message must
 * not compute one past it (found by the fuzzer). */
FA_TEST(overlapping_strides_at_int64_max) {
    fa_attention_desc d = tiny_desc();
    d.seqlen_q = 1;
    d.seqlen_k = 16;
    d.heads_q = d.heads_kv = 2;
    d.head_dim = 16;
    d.k.stride_batch = d.k.stride_seq = d.k.stride_head = INT64_MAX - 15;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "k strides overlap");
}

/* The bound is 2^62 bytes to the tensor's last byte: at it a layout is
 * accepted, one element past it refused. */
FA_TEST(tensor_end_bounded_at_2_62_bytes) {
    const int64_t limit = INT64_C(1) << 62;
    fa_attention_desc d = tiny_desc(); /* 8 x 8 fp32 per tensor: 256 bytes */
    d.q.offset = (limit - 256) / 4;
    CHECK_OK(fa_attention_desc_check(&d));
    CHECK(fa_desc_tensor_bytes(&d, FA_TENSOR_Q) == limit);
    d.q.offset += 4;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "q.offset");

    /* Strides whose product with the extent overflows: the alignment test
     * multiplied the stride by the element size (UBSan: signed overflow). */
    d = tiny_desc();
    d.v.stride_seq = INT64_C(1) << 62;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "v strides");
    d.v.stride_seq = INT64_MAX - 3;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "v strides");
    d = tiny_desc();
    d.k.stride_batch = INT64_MAX - 7;
    d.batch = 2;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "k strides");

    /* Sizes alone too large: packed strides of INT_MAX heads at d256 over
     * 2^31 - 1 tokens (the packed batch stride would overflow int64). */
    d = tiny_desc();
    d.heads_q = d.heads_kv = INT_MAX;
    d.head_dim = 256;
    d.seqlen_q = d.seqlen_k = INT_MAX;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_SIZE, "q sizes");
    /* Fewer heads: 2^31 - 1 tokens x 2^20 heads x 256 fp32 is 2^61 bytes
     * give or take: within the bound, accepted without any overflow. */
    d.heads_q = d.heads_kv = 1 << 20;
    CHECK_OK(fa_attention_desc_check(&d));
    CHECK(fa_desc_lse_bytes(&d) == (int64_t)INT_MAX * (1 << 20) * 4);
}

/* Byte counts the API compares with buffer sizes, at the bound and past
 * int64 (the latter only for a descriptor the check refuses). */
FA_TEST(byte_counts_checked) {
    fa_attention_desc d = tiny_desc();
    d.o.offset = (INT64_C(1) << 62) - 4;
    CHECK(fa_desc_tensor_extent(&d, FA_TENSOR_O) == (INT64_C(1) << 62) + 60);
    CHECK(fa_desc_tensor_bytes(&d, FA_TENSOR_O) == -1); /* past int64: no wrapped count */
    d.o.offset = INT64_MAX - 3;
    CHECK(fa_desc_tensor_extent(&d, FA_TENSOR_O) == -1);
    d = tiny_desc();
    d.heads_q = INT_MAX;
    d.seqlen_q = INT_MAX;
    CHECK(fa_desc_lse_bytes(&d) == -1);
    d.heads_q = 1 << 20;
    CHECK(fa_desc_lse_bytes(&d) == (int64_t)INT_MAX * (1 << 20) * 4);
}

static const suite_backend reference_backend = {FA_BACKEND_REFERENCE, "reference", 1, NULL, NULL, NULL, SUITE_ALL_SCORE_OPTIONS};

/* Problem 3: destroying the context before its buffers and plans, then
 * freeing them, was a use after free (ASan: heap-use-after-free). */
FA_TEST(destroy_in_any_order) {
    suite_use_backend(&reference_backend);
    suite_destroy_in_any_order();
}

/* Problem 2: windows at the ends of the int range. The plan's copy of the
 * descriptor holds them normalised (unlimited where they cannot bind), and
 * the reference device through a plan computes what the reference computes
 * from the caller's descriptor. */
FA_TEST(windows_normalised_in_the_plan) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    if (!ctx) return;
    const struct { int left, right, want_left, want_right; } w[] = {
        {-1, INT_MAX, -1, -1},     {INT_MAX, INT_MIN, -1, -1}, {INT_MIN, INT_MIN, -1, -1},
        {-7, 5, -1, 5},            {89, 69, -1, -1},           {88, 68, 88, 68},
        {87, 67, 87, 67},          {0, 0, 0, 0},               {INT_MAX - 1, 70, -1, -1}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(w); i++) {
        fa_attention_desc d = tiny_desc();
        d.seqlen_q = 70;
        d.seqlen_k = 90;
        d.causal = 1;
        d.window_left = w[i].left;
        d.window_right = w[i].right;
        fa_plan plan = NULL;
        CHECK_OK(fa_plan_create(ctx, &d, &plan));
        if (!plan) continue;
        CHECK_MSG(plan->desc.window_left == w[i].want_left && plan->desc.window_right == w[i].want_right,
                  "window (%d, %d) became (%d, %d), expected (%d, %d)", w[i].left, w[i].right,
                  plan->desc.window_left, plan->desc.window_right, w[i].want_left, w[i].want_right);
        /* The caller's descriptor is left as it was. */
        CHECK(d.window_left == w[i].left && d.window_right == w[i].right);
        fa_plan_destroy(plan);
    }
    fa_context_destroy(ctx);
    suite_use_backend(&reference_backend);
    suite_extreme_windows();
}

/* Problem 6: flags outside {0, 1} and device indices below -1 were taken. */
FA_TEST(flags_and_indices_range_checked) {
    fa_attention_desc d = tiny_desc();
    d.deterministic = 7;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "deterministic");
    d = tiny_desc();
    d.allow_tf32 = -9;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "allow_tf32");
    d = tiny_desc();
    d.causal = INT_MIN;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "causal");
    d = tiny_desc();
    d.deterministic = d.allow_tf32 = d.causal = 1;
    CHECK_OK(fa_attention_desc_check(&d));

    const int bad[] = {INT_MIN, -2, -100};
    for (size_t i = 0; i < FA_ARRAY_SIZE(bad); i++) {
        fa_context ctx = (fa_context)&d; /* must be cleared */
        CHECK_FAILS(fa_context_create(FA_BACKEND_REFERENCE, bad[i], &ctx), FA_ERR_INVALID_ARGUMENT, "index");
        CHECK(ctx == NULL);
        CHECK_FAILS(fa_context_create(FA_BACKEND_ANY, bad[i], &ctx), FA_ERR_INVALID_ARGUMENT, "index");
    }
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, -1, &ctx));
    if (ctx) fa_context_destroy(ctx);
}

/* Every byte a footprint covers, marked in map (map_bytes long). */
static void mark_footprint(const fa_footprint *f, unsigned char *map, size_t map_bytes, unsigned char bit) {
    if (f->run == 0) return;
    uint64_t idx[3] = {0, 0, 0};
    for (;;) {
        uint64_t at = f->base;
        for (int k = 0; k < f->ndims; k++) at += idx[k] * f->stride[k];
        for (uint64_t c = 0; c < f->run; c++)
            if (at + c < map_bytes) map[at + c] |= bit;
        int k = 0;
        while (k < f->ndims && ++idx[k] == f->extent[k]) idx[k++] = 0;
        if (k == f->ndims) return;
    }
}

/* The overlap test never calls overlapping tensors disjoint (checked byte
 * by byte on random small layouts), and tells apart the packed layouts. */
FA_TEST(overlap_test_is_sound) {
    fa_rng r;
    fa_rng_seed(&r, 0x0fe1a9u);
    static unsigned char map[1 << 16];
    int disjoint_found = 0, overlaps = 0;
    for (int it = 0; it < 3000; it++) {
        fa_footprint f[2];
        for (int t = 0; t < 2; t++) {
            f[t] = fa_range_footprint(fa_rng_next(&r) % 64 * 4, 4 * (1 + fa_rng_next(&r) % 8));
            f[t].ndims = (int)(fa_rng_next(&r) % 4);
            for (int k = 0; k < f[t].ndims; k++) {
                f[t].extent[k] = 1 + fa_rng_next(&r) % 4;
                f[t].stride[k] = 4 * (1 + fa_rng_next(&r) % 40);
            }
        }
        memset(map, 0, sizeof map);
        mark_footprint(&f[0], map, sizeof map, 1);
        mark_footprint(&f[1], map, sizeof map, 2);
        int truth = 0;
        for (size_t i = 0; i < sizeof map && !truth; i++) truth = map[i] == 3;
        const int got = fa_footprints_overlap(&f[0], &f[1]);
        CHECK_MSG(got || !truth, "case %d: overlapping footprints called disjoint", it);
        CHECK(got == fa_footprints_overlap(&f[1], &f[0]));
        disjoint_found += !got;
        overlaps += truth;
    }
    CHECK(disjoint_found > 300 && overlaps > 300);

    /* Q, K and V (and dQ, dK, dV) packed per token: [b, s, 3, h, d]. */
    fa_attention_desc d = tiny_desc();
    d.batch = 2;
    d.heads_q = d.heads_kv = 4;
    d.head_dim = 16;
    const int64_t row = 3 * 4 * 16;
    fa_tensor_desc *t[3] = {&d.q, &d.k, &d.v};
    for (int i = 0; i < 3; i++) {
        t[i]->offset = i * 4 * 16;
        t[i]->stride_seq = row;
        t[i]->stride_batch = row * d.seqlen_q;
    }
    CHECK_OK(fa_attention_desc_check(&d));
    fa_footprint fq = fa_tensor_footprint(&d, FA_TENSOR_Q), fk = fa_tensor_footprint(&d, FA_TENSOR_K),
                 fv = fa_tensor_footprint(&d, FA_TENSOR_V);
    CHECK(!fa_footprints_overlap(&fq, &fk) && !fa_footprints_overlap(&fk, &fv) && !fa_footprints_overlap(&fq, &fv));
    /* Packed per head in BHSD order: [b, 3, h, s, d]. */
    d = tiny_desc();
    d.heads_q = d.heads_kv = 2;
    for (int i = 0; i < 3; i++) {
        t[i]->offset = (int64_t)i * 2 * 8 * 8;
        t[i]->stride_seq = 8;
        t[i]->stride_head = 8 * 8;
        t[i]->stride_batch = 3 * 2 * 8 * 8;
    }
    CHECK_OK(fa_attention_desc_check(&d));
    fq = fa_tensor_footprint(&d, FA_TENSOR_Q);
    fk = fa_tensor_footprint(&d, FA_TENSOR_K);
    CHECK(!fa_footprints_overlap(&fq, &fk));
    d.k.offset = 8; /* K's rows now land on Q's */
    fk = fa_tensor_footprint(&d, FA_TENSOR_K);
    CHECK(fa_footprints_overlap(&fq, &fk));
}

/* Problem 6: outputs aliasing an input or another output were accepted.
 * Inputs may share bytes; an output may not share any with another
 * argument of the call. */
FA_TEST(outputs_aliasing_refused) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    if (!ctx) return;
    fa_attention_desc d = tiny_desc(); /* 256 bytes a tensor, 32 of lse */
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    fa_buffer q, k, v, o, lse, g, dq, dk, dv, big;
    fa_buffer *all[] = {&q, &k, &v, &o, &lse, &g, &dq, &dk, &dv};
    for (size_t i = 0; i < FA_ARRAY_SIZE(all); i++) CHECK_OK(fa_buffer_alloc(ctx, 256, all[i]));
    CHECK_OK(fa_buffer_alloc(ctx, 4096, &big));
    float host[1024];
    for (int i = 0; i < 1024; i++) host[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    for (size_t i = 0; i < FA_ARRAY_SIZE(all); i++) CHECK_OK(fa_buffer_upload(*all[i], 0, host, 256));
    CHECK_OK(fa_buffer_upload(big, 0, host, 4096));

    CHECK_FAILS(fa_forward(plan, q, k, v, q, lse), FA_ERR_INVALID_ARGUMENT, "q and o");
    CHECK_FAILS(fa_forward(plan, q, k, v, o, o), FA_ERR_INVALID_ARGUMENT, "o and lse");
    CHECK_FAILS(fa_forward(plan, q, k, lse, o, lse), FA_ERR_INVALID_ARGUMENT, "v and lse");
    CHECK_FAILS(fa_backward(plan, q, k, v, o, lse, g, dq, dq, dv), FA_ERR_INVALID_ARGUMENT, "dq and dk");
    CHECK_FAILS(fa_backward(plan, q, k, v, o, lse, g, dq, dk, g), FA_ERR_INVALID_ARGUMENT, "dout and dv");
    CHECK_FAILS(fa_backward(plan, q, k, v, o, lse, g, lse, dk, dv), FA_ERR_INVALID_ARGUMENT, "lse and dq");
    /* Inputs alias freely: the same buffer for q, k, v and for o and dout. */
    CHECK_OK(fa_forward(plan, q, q, q, o, lse));
    CHECK_OK(fa_backward(plan, q, q, q, o, lse, o, dq, dk, dv));
    fa_plan_destroy(plan);

    /* One buffer, tensors at disjoint offsets: q k v o at 0, 256, 512, 768
     * elements... in bytes 0, 256, 512, 768; lse at 0 needs its own. */
    fa_attention_desc p = tiny_desc();
    p.k.offset = 64;
    p.v.offset = 128;
    p.o.offset = 192;
    CHECK_OK(fa_plan_create(ctx, &p, &plan));
    CHECK_OK(fa_forward(plan, big, big, big, big, lse));
    CHECK_FAILS(fa_forward(plan, big, big, big, big, big), FA_ERR_INVALID_ARGUMENT, "lse"); /* lse at byte 0 is q's */
    fa_plan_destroy(plan);
    /* o one row into q's bytes. */
    p.o.offset = 8;
    CHECK_OK(fa_plan_create(ctx, &p, &plan));
    CHECK_FAILS(fa_forward(plan, big, big, big, big, lse), FA_ERR_INVALID_ARGUMENT, "q and o");
    fa_plan_destroy(plan);

    /* dQ, dK, dV packed per token in one buffer, beside O and dO. */
    fa_attention_desc pk = tiny_desc();
    pk.heads_q = pk.heads_kv = 2;
    fa_tensor_desc *t[3] = {&pk.q, &pk.k, &pk.v};
    for (int i = 0; i < 3; i++) {
        t[i]->offset = i * 2 * 8;
        t[i]->stride_seq = 3 * 2 * 8;
    }
    CHECK_OK(fa_plan_create(ctx, &pk, &plan));
    fa_buffer o2, g2, l2;
    CHECK_OK(fa_buffer_alloc(ctx, 512, &o2));
    CHECK_OK(fa_buffer_alloc(ctx, 512, &g2));
    CHECK_OK(fa_buffer_alloc(ctx, 64, &l2));
    CHECK_OK(fa_forward(plan, big, big, big, o2, l2));
    fa_buffer dqkv;
    CHECK_OK(fa_buffer_alloc(ctx, 4096, &dqkv));
    CHECK_OK(fa_buffer_upload(g2, 0, host, 512));
    CHECK_OK(fa_backward(plan, big, big, big, o2, l2, g2, dqkv, dqkv, dqkv));
    fa_plan_destroy(plan);
    fa_buffer more[] = {o2, g2, l2, dqkv};
    for (size_t i = 0; i < FA_ARRAY_SIZE(more); i++) fa_buffer_free(more[i]);

    for (size_t i = 0; i < FA_ARRAY_SIZE(all); i++) fa_buffer_free(*all[i]);
    fa_buffer_free(big);
    fa_context_destroy(ctx);
}

/* Problem 6: block sizes of INT_MAX overflowed the block-mask geometry
 * (ceil(seqlen / block) in int); on the reference device through a plan.
 * The OpenCL, CUDA and HIP tests run the same case. */
FA_TEST(huge_mask_blocks) {
    suite_use_backend(&reference_backend);
    suite_huge_mask_blocks();
    fa_attention_desc d = tiny_desc();
    uint8_t one = 1;
    d.block_mask = &one;
    d.block_mask_bytes = 1;
    d.block_q = d.block_k = INT_MAX;
    CHECK_OK(fa_attention_desc_check(&d));
    CHECK(fa_block_cols(&d) == 1 && fa_tile_count(INT_MAX, INT_MAX) == 1 && fa_tile_count(INT_MAX, 128) == 16777216);
    uint8_t *map = NULL;
    size_t bytes = 0;
    int cols = 0;
    CHECK_OK(fa_tile_map_build(&d, &one, 128, 64, &map, &bytes, &cols));
    CHECK(bytes == 1 && cols == 1 && map && map[0] == 2);
    free(map);
    size_t ws = 0;
    CHECK_FAILS(fa_workspace_bytes("the test", (size_t[]){SIZE_MAX / 2, 3}, 2, &ws), FA_ERR_OUT_OF_MEMORY, "the test");
    CHECK_OK(fa_workspace_bytes("the test", (size_t[]){1 << 20, 1 << 20, 4}, 3, &ws));
    CHECK(ws == (size_t)1 << 42);
}

/* Build options from the environment: -D / -U (and NVRTC's long forms) of
 * a macro the plan sets or of a reserved one are refused; the rest pass. */
FA_TEST(env_build_options_parsed) {
    static const char *const reserved[] = {"CAUSAL", "HEAD_DIM", NULL};
    const char *plan = "-DBR=64 -DBC=32 -DHEAD_DIM=64 -DDTYPE_F32";
    const char *const refused[] = {"-DHEAD_DIM=8",   "-D HEAD_DIM=8",        "-UBR",
                                   "-U  BC",         "-cl-mad-enable -DCAUSAL", "--define-macro=DTYPE_F32",
                                   "--define-macro HEAD_DIM", "--undefine-macro=BR", "-DBR"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(refused); i++)
        CHECK_FAILS(fa_check_env_build_options("FLASHATTN_TEST_OPTIONS", refused[i], plan, reserved),
                    FA_ERR_INVALID_ARGUMENT, "FLASHATTN_TEST_OPTIONS");
    CHECK_FAILS(fa_check_env_build_options("X", "-DFOO -DCAUSAL=1", plan, reserved), FA_ERR_INVALID_ARGUMENT,
                "CAUSAL");
    const char *const allowed[] = {NULL, "", "   ", "-DFA_STEP_UNROLL=4", "-cl-nv-maxrregcount=128",
                                   "-DBRX=1 -DHEAD_DIMS", "--device-debug -lineinfo", "-DFWD_MIN_BLOCKS=2"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(allowed); i++)
        CHECK_OK(fa_check_env_build_options("FLASHATTN_TEST_OPTIONS", allowed[i], plan, reserved));
}

static double seconds_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Problem 4: a varlen batch of one 2^31-token sequence spun for minutes in
 * fa_plan_create. On the reference device (whose plan allocates nothing)
 * the whole call, check and planner included, takes well under a second. */
FA_TEST(largest_shapes_plan_create_at_once) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    if (!ctx) return;
    const int32_t cu[2] = {0, INT32_MAX};
    for (int varlen = 0; varlen <= 1; varlen++) {
        fa_attention_desc d = tiny_desc();
        d.seqlen_q = d.seqlen_k = INT32_MAX;
        d.head_dim = 64;
        d.causal = 1;
        if (varlen) d.cu_seqlens_q = d.cu_seqlens_k = cu;
        fa_plan plan = NULL;
        const double t0 = seconds_now();
        CHECK_OK(fa_plan_create(ctx, &d, &plan));
        const double dt = seconds_now() - t0;
        CHECK_MSG(dt < 1.0, "fa_plan_create of 2^31 - 1 tokens%s took %.3f s", varlen ? " (varlen)" : "", dt);
        if (plan) fa_plan_destroy(plan);
    }
    fa_context_destroy(ctx);
}

FA_TEST_MAIN(FA_CASE(checked_arithmetic), FA_CASE(offsets_near_2_62_refused),
             FA_CASE(tensor_end_bounded_at_2_62_bytes), FA_CASE(byte_counts_checked),
             FA_CASE(destroy_in_any_order), FA_CASE(windows_normalised_in_the_plan),
             FA_CASE(flags_and_indices_range_checked), FA_CASE(overlap_test_is_sound),
             FA_CASE(outputs_aliasing_refused), FA_CASE(huge_mask_blocks), FA_CASE(env_build_options_parsed),
             FA_CASE(largest_shapes_plan_create_at_once), FA_CASE(overlapping_strides_at_int64_max))
