/* KV-cache steps (fa_forward_kvcache) on every device present
 * (fa-test-labels: device): the reference, OpenCL (PoCL in CI), CUDA and
 * HIP where their runtimes load, each case against the CPU reference
 * (tests/kvcache_case.c: O, L, and both caches after the append). A
 * backend without KV-cache kernels must refuse the plan with
 * FA_ERR_UNSUPPORTED naming kv_cache; the test then prints "refused by
 * <backend>" and runs nothing more there. FA_TEST_KV_BACKEND=<name> keeps
 * the devices of one backend (and the reference). */
#include "harness.h"
#include "kvcache_case.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs cases on every device; a device whose backend refuses kv_cache is
 * reported once and skipped. */
static void on_every_device(const kv_case *cases, int n) {
    int count = 0;
    CHECK_OK(fa_device_count(&count));
    const char *only = getenv("FA_TEST_KV_BACKEND");
    for (int dev = 0; dev < count; dev++) {
        fa_device_info info;
        if (fa_device_get_info(dev, &info) != FA_SUCCESS) continue;
        const char *backend = fa_backend_name(info.backend);
        if (only && only[0] && info.backend != FA_BACKEND_REFERENCE && strcmp(only, backend) != 0) continue;
        fa_context ctx = NULL;
        if (fa_context_create(FA_BACKEND_ANY, dev, &ctx) != FA_SUCCESS) {
            CHECK_MSG(0, "device %d (%s): fa_context_create: %s", dev, backend, fa_last_error());
            continue;
        }
        int passed = 0, failed = 0, refused = 0;
        for (int i = 0; i < n && !refused; i++) {
            const kv_outcome r = kv_case_run(ctx, &cases[i]);
            passed += r == KV_PASSED;
            failed += r == KV_FAILED;
            refused += r == KV_REFUSED;
        }
        if (refused)
            printf("%-9s %s: refused by %s (%s)\n", backend, info.desc.name, backend, fa_last_error());
        else
            printf("%-9s %s: %d of %d cases passed\n", backend, info.desc.name, passed, n);
        fa_context_destroy(ctx);
    }
}

#define RUN(cases) on_every_device(cases, (int)(sizeof(cases) / sizeof((cases)[0])))

FA_TEST(contiguous) {
    kv_case c[4];
    c[0] = kv_case_default("contiguous, one query, one appended token, GQA 4:1, fp16");
    c[0].batch = 3;
    c[0].heads_q = 8;
    c[0].heads_kv = 2;
    c[0].seqlen_k = 160;
    c[0].lens[0] = 0;
    c[0].lens[1] = 37;
    c[0].lens[2] = 159;
    c[1] = kv_case_default("contiguous, no append, fp32, d 128");
    c[1].dtype = FA_DTYPE_F32;
    c[1].seqlen_new = 0;
    c[1].head_dim = 128;
    c[1].batch = 2;
    c[1].lens[0] = 96;
    c[1].lens[1] = 1;
    c[2] = kv_case_default("contiguous, several appended tokens, causal, bf16, MQA 4:1");
    c[2].dtype = FA_DTYPE_BF16;
    c[2].seqlen_q = c[2].seqlen_new = 5;
    c[2].causal = 1;
    c[2].heads_q = 4;
    c[2].batch = 2;
    c[2].seed = 3;
    c[3] = kv_case_default("contiguous, empty caches, several tokens, fp16 d 32");
    c[3].head_dim = 32;
    c[3].seqlen_q = c[3].seqlen_new = 3;
    c[3].batch = 2;
    c[3].lens[0] = c[3].lens[1] = 0;
    RUN(c);
}

FA_TEST(paged) {
    static const int pages[] = {16, 64, 256};
    kv_case c[6];
    for (int i = 0; i < 3; i++) {
        c[2 * i] = kv_case_default(i == 0 ? "paged 16, one token, GQA 3:1, fp16"
                                   : i == 1 ? "paged 64, one token, GQA 3:1, fp16"
                                            : "paged 256, one token, GQA 3:1, fp16");
        c[2 * i].page_size = pages[i];
        c[2 * i].seqlen_k = 300;
        c[2 * i].batch = 4;
        c[2 * i].heads_q = 6;
        c[2 * i].heads_kv = 2;
        c[2 * i].lens[0] = 0;
        c[2 * i].lens[1] = 17;
        c[2 * i].lens[2] = 256;
        c[2 * i].lens[3] = 299;
        c[2 * i].seed = 10 + (unsigned)i;
        c[2 * i + 1] = kv_case_default(i == 0 ? "paged 16, four tokens, causal, bf16"
                                       : i == 1 ? "paged 64, no append, two queries, fp32"
                                                : "paged 256, four tokens, causal, fp16 d 96");
        c[2 * i + 1].page_size = pages[i];
        c[2 * i + 1].seqlen_k = 520;
        c[2 * i + 1].batch = 3;
        c[2 * i + 1].seqlen_q = i == 1 ? 2 : 4;
        c[2 * i + 1].seqlen_new = i == 1 ? 0 : 4;
        c[2 * i + 1].causal = i != 1;
        c[2 * i + 1].dtype = i == 0 ? FA_DTYPE_BF16 : i == 1 ? FA_DTYPE_F32 : FA_DTYPE_F16;
        c[2 * i + 1].head_dim = i == 2 ? 96 : 64;
        c[2 * i + 1].heads_q = 4;
        c[2 * i + 1].heads_kv = 2;
        c[2 * i + 1].seed = 20 + (unsigned)i;
    }
    RUN(c);
}

FA_TEST(rotary) {
    kv_case c[4];
    c[0] = kv_case_default("rotary interleaved 32 of 64, paged 16, causal, four tokens, fp16");
    c[0].page_size = 16;
    c[0].seqlen_k = 200;
    c[0].rotary_dim = 32;
    c[0].rotary_interleaved = 1;
    c[0].seqlen_q = c[0].seqlen_new = 4;
    c[0].causal = 1;
    c[0].batch = 3;
    c[0].heads_q = 4;
    c[0].heads_kv = 2;
    c[1] = kv_case_default("rotary half-split 64 of 64, contiguous, one token, bf16");
    c[1].dtype = FA_DTYPE_BF16;
    c[1].rotary_dim = 64;
    c[1].batch = 2;
    c[1].seed = 5;
    c[2] = kv_case_default("rotary half-split 24 of 128, no causal mask (every query at the cache length), "
                           "two queries, one token, fp32");
    c[2].dtype = FA_DTYPE_F32;
    c[2].head_dim = 128;
    c[2].rotary_dim = 24;
    c[2].seqlen_q = 2;
    c[2].page_size = 64;
    c[2].seqlen_k = 150;
    c[2].batch = 2;
    c[2].seed = 6;
    c[3] = kv_case_default("rotary interleaved 16, window (7, 0), no append, three queries, fp16");
    c[3].rotary_dim = 16;
    c[3].rotary_interleaved = 1;
    c[3].seqlen_new = 0;
    c[3].seqlen_q = 3;
    c[3].window_left = 7;
    c[3].window_right = 0;
    c[3].batch = 2;
    c[3].seed = 7;
    RUN(c);
}

FA_TEST(masks_and_options) {
    kv_case c[5];
    c[0] = kv_case_default("window (20, -1), paged 32, three tokens, fp16");
    c[0].page_size = 32;
    c[0].seqlen_k = 180;
    c[0].window_left = 20;
    c[0].seqlen_q = c[0].seqlen_new = 3;
    c[0].batch = 2;
    c[1] = kv_case_default("window (10, 1), causal, four queries, one token (queries past the new keys)");
    c[1].window_left = 10;
    c[1].window_right = 1;
    c[1].causal = 1;
    c[1].seqlen_q = 4;
    c[1].batch = 2;
    c[1].lens[0] = 0;
    c[1].lens[1] = 50;
    c[2] = kv_case_default("softcap 5, causal, paged 48, two tokens, bf16");
    c[2].dtype = FA_DTYPE_BF16;
    c[2].softcap = 5.0f;
    c[2].causal = 1;
    c[2].page_size = 48;
    c[2].seqlen_k = 200;
    c[2].seqlen_q = c[2].seqlen_new = 2;
    c[2].batch = 2;
    c[3] = kv_case_default("ALiBi, GQA 4:2, one token, fp16");
    c[3].alibi = 1;
    c[3].heads_q = 4;
    c[3].heads_kv = 2;
    c[3].batch = 3;
    c[4] = kv_case_default("softcap 20 and ALiBi, causal, rotary 32, paged 16, three tokens, fp32");
    c[4].dtype = FA_DTYPE_F32;
    c[4].softcap = 20.0f;
    c[4].alibi = 1;
    c[4].causal = 1;
    c[4].rotary_dim = 32;
    c[4].page_size = 16;
    c[4].seqlen_k = 128;
    c[4].seqlen_q = c[4].seqlen_new = 3;
    c[4].heads_q = 4;
    c[4].heads_kv = 1;
    c[4].batch = 2;
    RUN(c);
}

/* Tiles the planner picks for other devices' shapes: several row tiles
 * whose packed rows straddle tokens and heads, narrow key tiles, split
 * keys, micro-tiles of several rows and keys. */
FA_TEST(forced_tiles) {
    kv_case c[4];
    c[0] = kv_case_default("GQA 8:1, three queries (24 rows) in 8-row tiles, 16-key tiles, causal, fp16");
    c[0].heads_q = 8;
    c[0].seqlen_q = c[0].seqlen_new = 3;
    c[0].causal = 1;
    c[0].batch = 2;
    c[0].seqlen_k = 150;
    c[0].force_tile.br = 8;
    c[0].force_tile.bc = 16;
    c[0].force_tile.tr = 2;
    c[0].force_tile.tc = 2;
    c[1] = kv_case_default("GQA 3:1, five queries (15 rows) in 8-row tiles, window (12, 0), paged 16, split 3, bf16");
    c[1].dtype = FA_DTYPE_BF16;
    c[1].heads_q = 6;
    c[1].heads_kv = 2;
    c[1].seqlen_q = 5;
    c[1].seqlen_new = 2;
    c[1].window_left = 12;
    c[1].window_right = 0;
    c[1].page_size = 16;
    c[1].seqlen_k = 200;
    c[1].batch = 2;
    c[1].force_split = 3;
    c[1].force_tile.br = 8;
    c[1].force_tile.bc = 32;
    c[1].force_tile.tr = 4;
    c[1].force_tile.tc = 4;
    c[2] = kv_case_default("one query, 32-row tile (rows past the group), 64-key tiles, micro-tile 8 x 8, ALiBi, fp32");
    c[2].dtype = FA_DTYPE_F32;
    c[2].heads_q = 4;
    c[2].alibi = 1;
    c[2].seqlen_k = 300;
    c[2].batch = 2;
    c[2].force_tile.br = 32;
    c[2].force_tile.bc = 64;
    c[2].force_tile.tr = 8;
    c[2].force_tile.tc = 8;
    c[3] = kv_case_default("d 40 (rows of 5 vectors), rotary 40 half-split, 16-row tiles of 24 rows, split 4, fp16");
    c[3].head_dim = 40;
    c[3].rotary_dim = 40;
    c[3].heads_q = 8;
    c[3].seqlen_q = c[3].seqlen_new = 3;
    c[3].causal = 1;
    c[3].seqlen_k = 260;
    c[3].force_split = 4;
    c[3].force_tile.br = 16;
    c[3].force_tile.bc = 16;
    c[3].force_tile.tr = 1;
    c[3].force_tile.tc = 1;
    RUN(c);
}

FA_TEST(long_cache) {
    kv_case c[3];
    c[0] = kv_case_default("long cache 5000 of 5120, paged 64, GQA 4:1, d 128, fp16");
    c[0].seqlen_k = 5120;
    c[0].page_size = 64;
    c[0].head_dim = 128;
    c[0].heads_q = 4;
    c[0].heads_kv = 1;
    c[0].lens[0] = 5000;
    c[1] = c[0];
    c[1].name = "long cache 5000 of 5120, paged 64, d 128, fp16, forced to 7 key splits";
    c[1].force_split = 7;
    c[2] = kv_case_default("long caches 4000 and 3, contiguous, causal, two tokens, bf16, forced to 5 key splits");
    c[2].dtype = FA_DTYPE_BF16;
    c[2].seqlen_k = 4096;
    c[2].batch = 2;
    c[2].lens[0] = 4000;
    c[2].lens[1] = 3;
    c[2].seqlen_q = c[2].seqlen_new = 2;
    c[2].causal = 1;
    c[2].force_split = 5;
    RUN(c);
}

FA_TEST(invalid_sequences) {
    kv_case c[3];
    c[0] = kv_case_default("paged 16: negative length, length past the capacity, page outside the pool, rotary "
                           "query past the tables; the others valid");
    c[0].page_size = 16;
    c[0].seqlen_k = 100;
    c[0].batch = 6;
    c[0].rotary_dim = 16;
    c[0].seqlen_q = c[0].seqlen_new = 2;
    c[0].causal = 1;
    c[0].lens[0] = 4;
    c[0].lens[1] = 30;
    c[0].lens[2] = 40;
    c[0].lens[3] = 50;
    c[0].lens[4] = 0;
    c[0].lens[5] = 98;
    c[0].invalid = 0xfu;
    c[1] = kv_case_default("contiguous: a negative length and one past the capacity, split keys");
    c[1].batch = 3;
    c[1].seqlen_k = 300;
    c[1].lens[0] = 10;
    c[1].lens[1] = 20;
    c[1].lens[2] = 299;
    c[1].invalid = 0x3u;
    c[1].force_split = 3;
    c[2] = kv_case_default("paged 32: a page outside the pool in the last sequence, fp32, split keys");
    c[2].dtype = FA_DTYPE_F32;
    c[2].page_size = 32;
    c[2].seqlen_k = 256;
    c[2].batch = 3;
    c[2].lens[0] = 100;
    c[2].lens[1] = 0;
    c[2].lens[2] = 200;
    c[2].invalid = 0x4u;
    c[2].force_split = 2;
    RUN(c);
}

FA_TEST(layouts_and_lse) {
    kv_case c[3];
    c[0] = kv_case_default("strided q and caches, head-major k_new / v_new, contiguous, three tokens, causal, fp16");
    c[0].strided = 1;
    c[0].seqlen_q = c[0].seqlen_new = 3;
    c[0].causal = 1;
    c[0].batch = 2;
    c[0].heads_q = 4;
    c[0].heads_kv = 2;
    c[1] = kv_case_default("strided, paged 16, rotary 32, bf16");
    c[1].strided = 1;
    c[1].dtype = FA_DTYPE_BF16;
    c[1].page_size = 16;
    c[1].seqlen_k = 90;
    c[1].rotary_dim = 32;
    c[1].batch = 2;
    c[2] = kv_case_default("no lse, paged 16, split keys, d 256, fp16");
    c[2].no_lse = 1;
    c[2].page_size = 16;
    c[2].seqlen_k = 300;
    c[2].head_dim = 256;
    c[2].force_split = 3;
    c[2].lens[0] = 280;
    RUN(c);
}

/* The checks core makes for every backend, through each device's buffers,
 * and the refusals a cache plan meets outside fa_forward_kvcache. */
FA_TEST(arguments) {
    int count = 0;
    CHECK_OK(fa_device_count(&count));
    for (int dev = 0; dev < count; dev++) {
        fa_device_info info;
        fa_context ctx = NULL;
        if (fa_device_get_info(dev, &info) != FA_SUCCESS || fa_context_create(FA_BACKEND_ANY, dev, &ctx) != FA_SUCCESS)
            continue;
        const char *backend = fa_backend_name(info.backend);
        kv_case c = kv_case_default("arguments");
        c.page_size = 16;
        const fa_attention_desc d = kv_case_desc(&c);
        fa_attention_desc pd = d;
        pd.num_pages = 6;
        fa_plan plan = NULL;
        const fa_status st = fa_plan_create(ctx, &pd, &plan);
        if (st == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "kv_cache")) {
            printf("%-9s %s: refused by %s (%s)\n", backend, info.desc.name, backend, fa_last_error());
            fa_context_destroy(ctx);
            continue;
        }
        CHECK_MSG(st == FA_SUCCESS, "%s: fa_plan_create: %s", backend, fa_last_error());
        fa_buffer q = NULL, k = NULL, v = NULL, o = NULL, lens = NULL, bt = NULL, kn = NULL, vn = NULL;
        CHECK_OK(fa_buffer_alloc(ctx, 4096, &q));
        CHECK_OK(fa_buffer_alloc(ctx, 1 << 16, &k));
        CHECK_OK(fa_buffer_alloc(ctx, 1 << 16, &v));
        CHECK_OK(fa_buffer_alloc(ctx, 4096, &o));
        CHECK_OK(fa_buffer_alloc(ctx, 64, &lens));
        CHECK_OK(fa_buffer_alloc(ctx, 64, &bt));
        CHECK_OK(fa_buffer_alloc(ctx, 4096, &kn));
        CHECK_OK(fa_buffer_alloc(ctx, 4096, &vn));
        if (plan) {
            fa_kvcache_args a = {q, k, v, o, NULL, lens, bt, kn, vn, NULL, NULL};
            a.k_new = NULL;
            CHECK_FAILS(fa_forward_kvcache(plan, &a), FA_ERR_NULL_POINTER, "k_new");
            a.k_new = kn;
            a.o = q;
            CHECK_FAILS(fa_forward_kvcache(plan, &a), FA_ERR_INVALID_ARGUMENT, "overlap");
            a.o = o;
            a.block_table = NULL;
            CHECK_FAILS(fa_forward_kvcache(plan, &a), FA_ERR_NULL_POINTER, "block_table");
            CHECK_FAILS(fa_forward(plan, q, k, v, o, lens), FA_ERR_INVALID_ARGUMENT, "fa_forward_kvcache");
            fa_plan_destroy(plan);
        }
        fa_buffer bufs[] = {q, k, v, o, lens, bt, kn, vn};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) fa_buffer_free(bufs[i]);
        fa_context_destroy(ctx);
    }
}

FA_TEST_MAIN(FA_CASE(contiguous), FA_CASE(paged), FA_CASE(rotary), FA_CASE(masks_and_options), FA_CASE(forced_tiles), FA_CASE(long_cache),
             FA_CASE(invalid_sequences), FA_CASE(layouts_and_lse), FA_CASE(arguments))
