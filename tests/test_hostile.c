/* Inputs a hostile caller would try (issue 21): offsets and strides near
 * the int64 limits, windows at the ends of the int range, every order of
 * destroy calls, outputs aliasing inputs, flags out of range. Each must fail
 * cleanly or compute what the reference computes; these run under ASan and
 * UBSan in CI. */
#include "attention_suite.h"
#include "harness.h"
#include "test_util.h"

#include "checked.h"
#include "desc.h"
#include "fa_internal.h"
#include "flashattn.h"
#include "plan.h"
#include "reference.h"

#include <limits.h>
#include <stdint.h>

/* The status must match and the message must name the field. */
#define CHECK_FAILS(expr, status, needle)                                                   \
    do {                                                                                    \
        CHECK_STATUS(expr, status);                                                         \
        CHECK_MSG(strstr(fa_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"",   \
                  fa_last_error(), needle);                                                 \
    } while (0)

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

static const suite_backend reference_backend = {FA_BACKEND_REFERENCE, "reference", 1, NULL, NULL};

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

FA_TEST_MAIN(FA_CASE(checked_arithmetic), FA_CASE(offsets_near_2_62_refused),
             FA_CASE(tensor_end_bounded_at_2_62_bytes), FA_CASE(byte_counts_checked),
             FA_CASE(destroy_in_any_order), FA_CASE(windows_normalised_in_the_plan))
