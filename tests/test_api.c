/* The public API's argument checks (every bad input gets its own status and a
 * message naming the argument) and its objects, on the reference device,
 * which every build has. */
#include "harness.h"
#include "plan.h"
#include "reference.h"
#include "test_util.h"

#include "flashattn.h"

#include <pthread.h>

static fa_attention_desc small_desc(void) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 2;
    d.seqlen_q = 16;
    d.seqlen_k = 24;
    d.heads_q = 4;
    d.heads_kv = 2;
    d.head_dim = 32;
    return d;
}

FA_TEST(status_strings_are_distinct) {
    for (int a = 0; a < FA_STATUS_COUNT; a++) {
        CHECK(fa_status_string((fa_status)a) != NULL);
        CHECK(strcmp(fa_status_string((fa_status)a), "unknown status") != 0);
        for (int b = a + 1; b < FA_STATUS_COUNT; b++)
            CHECK(strcmp(fa_status_string((fa_status)a), fa_status_string((fa_status)b)) != 0);
    }
    CHECK(strcmp(fa_status_string((fa_status)-3), "unknown status") == 0);
    CHECK(strcmp(fa_status_string(FA_STATUS_COUNT), "unknown status") == 0);
    int major = -1, minor = -1, patch = -1;
    const char *v = fa_version(&major, &minor, &patch);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", major, minor, patch);
    CHECK(strcmp(v, expect) == 0);
    CHECK(major == FA_VERSION_MAJOR && minor == FA_VERSION_MINOR && patch == FA_VERSION_PATCH);
}

FA_TEST(descriptor_checks_name_the_argument) {
    fa_attention_desc d = small_desc();
    CHECK_OK(fa_attention_desc_check(&d));
    CHECK_FAILS(fa_attention_desc_check(NULL), FA_ERR_NULL_POINTER, "desc");

    const struct { int *field; const char *name; } sizes[] = {
        {&d.batch, "batch"}, {&d.seqlen_q, "seqlen_q"}, {&d.seqlen_k, "seqlen_k"},
        {&d.heads_q, "heads_q"}, {&d.heads_kv, "heads_kv"}, {&d.head_dim, "head_dim"}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int saved = *sizes[i].field;
        *sizes[i].field = 0;
        CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_SIZE, sizes[i].name);
        *sizes[i].field = -5;
        CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_SIZE, sizes[i].name);
        *sizes[i].field = saved;
    }
    const int bad_dims[] = {12, 260, 264, 7, 1};
    for (size_t i = 0; i < sizeof bad_dims / sizeof bad_dims[0]; i++) {
        d = small_desc();
        d.head_dim = bad_dims[i];
        CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim");
    }
    for (int hd = 8; hd <= 256; hd += 8) {
        d = small_desc();
        d.head_dim = hd;
        CHECK_OK(fa_attention_desc_check(&d));
    }
    d = small_desc();
    d.heads_q = 6;
    d.heads_kv = 4;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_HEADS_MISMATCH, "heads_kv");

    d = small_desc();
    d.v.dtype = FA_DTYPE_F16;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "v.dtype");
    d = small_desc();
    d.o.dtype = (fa_dtype)9;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "o.dtype");

    const float bad_p[] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_p / sizeof bad_p[0]; i++) {
        d = small_desc();
        d.dropout_p = bad_p[i];
        CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_DROPOUT, "dropout_p");
    }
    d = small_desc();
    d.dropout_p = 0.999f;
    CHECK_OK(fa_attention_desc_check(&d));

    const float bad_scale[] = {-1.0f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_scale / sizeof bad_scale[0]; i++) {
        d = small_desc();
        d.softmax_scale = bad_scale[i];
        CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SCALE, "softmax_scale");
    }
}

FA_TEST(mask_and_seqlens_checks) {
    fa_attention_desc d = small_desc();
    uint8_t mask[64];
    memset(mask, 1, sizeof mask);
    d.block_mask = mask;
    d.block_q = 8;
    d.block_k = 8;
    d.block_mask_bytes = 2 * 3; /* ceil(16/8) x ceil(24/8) */
    CHECK_OK(fa_attention_desc_check(&d));
    d.block_mask_bytes = 5;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_MASK, "block_mask_bytes");
    d.block_mask_bytes = 6;
    d.block_k = 0;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_MASK, "block_k");
    d = small_desc();
    d.block_mask_bytes = 6;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_MASK, "block_mask");

    d = small_desc();
    int32_t cu_q[3] = {0, 10, 16}, cu_k[3] = {0, 24, 30};
    d.cu_seqlens_q = cu_q;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SEQLENS, "cu_seqlens_k");
    d.cu_seqlens_k = cu_k;
    CHECK_OK(fa_attention_desc_check(&d));
    CHECK(fa_attention_total_q(&d) == 16 && fa_attention_total_k(&d) == 30);
    cu_k[1] = 25; /* a sequence longer than seqlen_k */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SEQLENS, "seqlen_k");
    cu_k[1] = 24;
    cu_q[1] = 14;
    cu_q[2] = 12; /* decreasing */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SEQLENS, "cu_seqlens_q");
    cu_q[0] = 1;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SEQLENS, "cu_seqlens_q[0]");
}

FA_TEST(stride_checks) {
    fa_attention_desc d = small_desc();
    /* BHSD layout for q: [batch, heads, seq, dim] expressed through strides. */
    d.q.stride_head = (int64_t)d.seqlen_q * d.head_dim;
    d.q.stride_seq = d.head_dim;
    d.q.stride_batch = (int64_t)d.heads_q * d.seqlen_q * d.head_dim;
    CHECK_OK(fa_attention_desc_check(&d));
    /* Rows overlap when the sequence stride is smaller than head_dim. */
    d.q.stride_seq = d.head_dim / 2;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "q strides overlap");
    d = small_desc();
    d.k.stride_head = 8; /* head_dim 32: heads overlap */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "k strides overlap");
    d = small_desc();
    d.v.stride_seq = -64;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "v");
    d = small_desc();
    d.o.offset = 2; /* 8 bytes of fp32: not 16-byte aligned */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_MISALIGNED, "o.offset");
    d = small_desc();
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
    d.k.stride_seq = 2 * 32 + 4; /* 136 bytes */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_MISALIGNED, "k.stride_seq");
    d.k.stride_seq = 2 * 32 + 8; /* padded rows, 144 bytes */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_STRIDE, "k strides overlap"); /* packed batch stride */
    d.k.stride_batch = (int64_t)d.seqlen_k * d.k.stride_seq;
    CHECK_OK(fa_attention_desc_check(&d));
}

/* Buffers and plans on the reference device: run-past-the-end, foreign
 * buffers, null arguments. */
FA_TEST(buffer_and_plan_checks) {
    fa_context ctx = NULL, other = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &other));
    fa_context scratch = ctx;
    CHECK_FAILS(fa_context_create(FA_BACKEND_REFERENCE, 7, &scratch), FA_ERR_DEVICE_NOT_FOUND, "device 7");
    CHECK(scratch == NULL); /* cleared on failure */
    CHECK_FAILS(fa_context_create(FA_BACKEND_REFERENCE, 0, NULL), FA_ERR_NULL_POINTER, "ctx");
    CHECK_FAILS(fa_context_create((fa_backend)42, 0, &scratch), FA_ERR_INVALID_ARGUMENT, "backend");
    fa_buffer b = NULL;
    CHECK_FAILS(fa_buffer_alloc(ctx, 0, &b), FA_ERR_INVALID_SIZE, "bytes");
    CHECK_FAILS(fa_buffer_alloc(NULL, 16, &b), FA_ERR_NULL_POINTER, "ctx");
    CHECK_FAILS(fa_buffer_alloc(ctx, 16, NULL), FA_ERR_NULL_POINTER, "buf");
    CHECK_OK(fa_buffer_alloc(ctx, 64, &b));
    char host[128] = {0};
    CHECK_FAILS(fa_buffer_upload(b, 60, host, 8), FA_ERR_OUT_OF_BOUNDS, "64 bytes");
    CHECK_FAILS(fa_buffer_download(b, 65, host, 0), FA_ERR_OUT_OF_BOUNDS, "past the buffer");
    CHECK_FAILS(fa_buffer_upload(b, 0, NULL, 8), FA_ERR_NULL_POINTER, "src");
    CHECK_FAILS(fa_buffer_download(b, 0, NULL, 8), FA_ERR_NULL_POINTER, "dst");
    CHECK_OK(fa_buffer_upload(b, 56, host, 8));
    CHECK_FAILS(fa_buffer_free(NULL), FA_ERR_NULL_POINTER, "buf");
    CHECK_OK(fa_buffer_free(b));

    fa_attention_desc d = small_desc();
    fa_plan plan = NULL;
    CHECK_FAILS(fa_plan_create(ctx, NULL, &plan), FA_ERR_NULL_POINTER, "desc");
    CHECK_FAILS(fa_plan_create(NULL, &d, &plan), FA_ERR_NULL_POINTER, "ctx");
    d.heads_kv = 3;
    CHECK_FAILS(fa_plan_create(ctx, &d, &plan), FA_ERR_HEADS_MISMATCH, "heads_kv");
    CHECK(plan == NULL);
    d = small_desc();
    CHECK_OK(fa_plan_create(ctx, &d, &plan));

    size_t nq = (size_t)d.batch * d.seqlen_q * d.heads_q * d.head_dim * 4;
    size_t nk = (size_t)d.batch * d.seqlen_k * d.heads_kv * d.head_dim * 4;
    size_t nl = (size_t)d.batch * d.heads_q * d.seqlen_q * 4;
    fa_buffer q, k, v, o, lse, small, foreign;
    CHECK_OK(fa_buffer_alloc(ctx, nq, &q));
    CHECK_OK(fa_buffer_alloc(ctx, nk, &k));
    CHECK_OK(fa_buffer_alloc(ctx, nk, &v));
    CHECK_OK(fa_buffer_alloc(ctx, nq, &o));
    CHECK_OK(fa_buffer_alloc(ctx, nl, &lse));
    CHECK_OK(fa_buffer_alloc(ctx, nk - 4, &small));
    CHECK_OK(fa_buffer_alloc(other, nk, &foreign));
    CHECK_FAILS(fa_forward(plan, q, small, v, o, lse), FA_ERR_OUT_OF_BOUNDS, "k:");
    CHECK_FAILS(fa_forward(plan, q, k, foreign, o, lse), FA_ERR_FOREIGN_BUFFER, "v belongs");
    CHECK_FAILS(fa_forward(plan, q, k, v, NULL, lse), FA_ERR_NULL_POINTER, "o is NULL");
    CHECK_FAILS(fa_forward(NULL, q, k, v, o, lse), FA_ERR_NULL_POINTER, "plan");
    CHECK_FAILS(fa_backward(plan, q, k, v, o, lse, foreign, q, k, v), FA_ERR_FOREIGN_BUFFER, "dout");
    CHECK_FAILS(fa_backward(plan, q, k, v, o, lse, o, q, small, v), FA_ERR_OUT_OF_BOUNDS, "dk");
    double ms;
    CHECK_FAILS(fa_plan_last_time_ms(plan, NULL), FA_ERR_NULL_POINTER, "ms");
    CHECK_STATUS(fa_plan_last_time_ms(plan, &ms), FA_ERR_UNSUPPORTED);

    fa_buffer all[] = {q, k, v, o, lse, small, foreign};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK_OK(fa_buffer_free(all[i]));
    CHECK_OK(fa_plan_destroy(plan));
    CHECK_OK(fa_context_destroy(ctx));
    CHECK_OK(fa_context_destroy(other));
}

/* The reference device through the public API computes what the reference
 * computes, and the plan keeps its own copy of host arrays. */
FA_TEST(reference_device_end_to_end) {
    fa_attention_desc d = small_desc();
    d.causal = 1;
    int32_t cu_q[3] = {0, 5, 16}, cu_k[3] = {0, 20, 30};
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    fa_context ctx;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, -1, &ctx));
    fa_plan plan;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    int32_t saved_q1 = cu_q[1];
    cu_q[1] = 9999; /* must not affect the plan */
    fa_rng rng;
    fa_rng_seed(&rng, 11);
    int64_t nq = 16 * 4 * 32, nk = 30 * 2 * 32, nl = 16 * 4;
    float *hq = fa_test_random_tensor(&rng, FA_DTYPE_F32, nq), *hk = fa_test_random_tensor(&rng, FA_DTYPE_F32, nk),
          *hv = fa_test_random_tensor(&rng, FA_DTYPE_F32, nk);
    float *ho = malloc((size_t)nq * 4), *hl = malloc((size_t)nl * 4), *ro = malloc((size_t)nq * 4),
          *rl = malloc((size_t)nl * 4);
    fa_test_poison(ho, FA_DTYPE_F32, nq);
    fa_test_poison(hl, FA_DTYPE_F32, nl);
    fa_buffer q, k, v, o, lse;
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)nq * 4, &q));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)nk * 4, &k));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)nk * 4, &v));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)nq * 4, &o));
    CHECK_OK(fa_buffer_alloc(ctx, (size_t)nl * 4, &lse));
    CHECK_OK(fa_buffer_upload(q, 0, hq, (size_t)nq * 4));
    CHECK_OK(fa_buffer_upload(k, 0, hk, (size_t)nk * 4));
    CHECK_OK(fa_buffer_upload(v, 0, hv, (size_t)nk * 4));
    CHECK_OK(fa_buffer_upload(o, 0, ho, (size_t)nq * 4));
    CHECK_OK(fa_forward(plan, q, k, v, o, lse));
    CHECK_OK(fa_buffer_download(o, 0, ho, (size_t)nq * 4));
    CHECK_OK(fa_buffer_download(lse, 0, hl, (size_t)nl * 4));
    cu_q[1] = saved_q1;
    CHECK_OK(fa_ref_forward(&d, hq, hk, hv, ro, rl));
    CHECK(memcmp(ho, ro, (size_t)nq * 4) == 0);
    CHECK(memcmp(hl, rl, (size_t)nl * 4) == 0);
    double ms = -1;
    CHECK_OK(fa_plan_last_time_ms(plan, &ms));
    CHECK(ms >= 0);
    fa_buffer all[] = {q, k, v, o, lse};
    for (size_t i = 0; i < 5; i++) fa_buffer_free(all[i]);
    fa_plan_destroy(plan);
    fa_context_destroy(ctx);
    free(hq), free(hk), free(hv), free(ho), free(hl), free(ro), free(rl);
}

FA_TEST(devices_and_best_choice) {
    int count = -1;
    CHECK_OK(fa_device_count(&count));
    CHECK(count >= 1); /* the reference is always there */
    CHECK_FAILS(fa_device_count(NULL), FA_ERR_NULL_POINTER, "count");
    int reference_seen = 0;
    for (int i = 0; i < count; i++) {
        fa_device_info info;
        CHECK_OK(fa_device_get_info(i, &info));
        CHECK(info.desc.name[0] != '\0');
        CHECK(info.desc.local_mem_bytes > 0 && info.desc.compute_units > 0);
        reference_seen += info.backend == FA_BACKEND_REFERENCE;
    }
    CHECK(reference_seen == 1);
    fa_device_info info;
    CHECK_FAILS(fa_device_get_info(count, &info), FA_ERR_DEVICE_NOT_FOUND, "device index");
    /* The best device is the reference only when nothing else is present. */
    fa_context ctx;
    CHECK_OK(fa_context_create(FA_BACKEND_ANY, -1, &ctx));
    CHECK_OK(fa_context_get_info(ctx, &info));
    CHECK((info.backend == FA_BACKEND_REFERENCE) == (count == 1));
    fa_context_destroy(ctx);
    char reason[256];
    CHECK_OK(fa_backend_get_status(FA_BACKEND_REFERENCE, reason, sizeof reason));
    CHECK_STATUS(fa_backend_get_status((fa_backend)17, reason, sizeof reason), FA_ERR_INVALID_ARGUMENT);
}

/* The reference runs on the calling thread: it has no queue to replace, and
 * NULL (its own, none) is the one queue it accepts. */
FA_TEST(reference_native_queue) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    CHECK_FAILS(fa_context_set_native_queue(NULL, NULL), FA_ERR_NULL_POINTER, "ctx");
    CHECK_OK(fa_context_set_native_queue(ctx, NULL));
    int not_a_queue = 0;
    CHECK_FAILS(fa_context_set_native_queue(ctx, &not_a_queue), FA_ERR_UNSUPPORTED, "reference backend");
    void *native_context = &not_a_queue, *native_queue = &not_a_queue;
    CHECK_OK(fa_context_get_native(ctx, &native_context, &native_queue));
    CHECK(native_context == NULL && native_queue == NULL);
    CHECK_OK(fa_context_get_native(ctx, NULL, NULL));
    CHECK_OK(fa_context_synchronize(ctx));
    CHECK_OK(fa_context_destroy(ctx));
}

/* fa_plan_set_dropout_seed's arguments (what a new seed computes, on every
 * backend: tests/test_dropout_seed.c). */
FA_TEST(dropout_seed_checks) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    CHECK_FAILS(fa_plan_set_dropout_seed(NULL, 1, 2), FA_ERR_NULL_POINTER, "plan");
    fa_attention_desc d = small_desc();
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    CHECK_FAILS(fa_plan_set_dropout_seed(plan, 1, 2), FA_ERR_INVALID_ARGUMENT, "dropout_p = 0");
    CHECK_OK(fa_plan_destroy(plan));
    d.dropout_p = 0.5f;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    CHECK_OK(fa_plan_set_dropout_seed(plan, UINT64_MAX, UINT64_MAX));
    CHECK_OK(fa_plan_set_dropout_seed(plan, 0, 0));
    CHECK_OK(fa_plan_destroy(plan));
    CHECK_OK(fa_context_destroy(ctx));
}

/* The internal dropout origin's arguments (what it draws, on every
 * backend: tests/test_dropout_seed.c). */
FA_TEST(dropout_origin_checks) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    CHECK_FAILS(fa_plan_set_dropout_origin(NULL, 0, 0), FA_ERR_NULL_POINTER, "plan");
    fa_attention_desc d = small_desc();
    d.dropout_p = 0.5f;
    fa_plan plan = NULL;
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    CHECK(plan->drop_row0 == 0 && plan->drop_col0 == 0);
    CHECK_FAILS(fa_plan_set_dropout_origin(plan, 3, 6), FA_ERR_INVALID_ARGUMENT, "multiple of 4");
    CHECK_FAILS(fa_plan_set_dropout_origin(plan, -1, 0), FA_ERR_INVALID_ARGUMENT, "[0, 2^31)");
    CHECK_FAILS(fa_plan_set_dropout_origin(plan, 0, -4), FA_ERR_INVALID_ARGUMENT, "[0, 2^31)");
    CHECK_FAILS(fa_plan_set_dropout_origin(plan, INT64_C(1) << 31, 0), FA_ERR_INVALID_ARGUMENT, "[0, 2^31)");
    CHECK_FAILS(fa_plan_set_dropout_origin(plan, 0, INT64_C(1) << 31), FA_ERR_INVALID_ARGUMENT, "[0, 2^31)");
    CHECK(plan->drop_row0 == 0 && plan->drop_col0 == 0);
    CHECK_OK(fa_plan_set_dropout_origin(plan, 3, 8));
    CHECK(plan->drop_row0 == 3 && plan->drop_col0 == 8);
    CHECK_OK(fa_plan_set_dropout_origin(plan, (INT64_C(1) << 31) - 1, (INT64_C(1) << 31) - 4));
    CHECK_OK(fa_plan_destroy(plan));
    CHECK_OK(fa_context_destroy(ctx));
}

static void *fail_in_thread(void *arg) {
    (void)arg;
    fa_buffer_alloc(NULL, 1, NULL);
    return NULL;
}

FA_TEST(last_error_is_per_thread) {
    fa_attention_desc d = small_desc();
    d.heads_kv = 3;
    CHECK_STATUS(fa_attention_desc_check(&d), FA_ERR_HEADS_MISMATCH);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fail_in_thread, NULL) == 0);
    pthread_join(t, NULL);
    CHECK(strstr(fa_last_error(), "heads_kv") != NULL);
}

FA_TEST_MAIN(FA_CASE(status_strings_are_distinct), FA_CASE(descriptor_checks_name_the_argument),
             FA_CASE(mask_and_seqlens_checks), FA_CASE(stride_checks), FA_CASE(buffer_and_plan_checks),
             FA_CASE(reference_device_end_to_end), FA_CASE(devices_and_best_choice),
             FA_CASE(last_error_is_per_thread), FA_CASE(reference_native_queue), FA_CASE(dropout_seed_checks),
             FA_CASE(dropout_origin_checks))
