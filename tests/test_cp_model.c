/* The ring's cost model (core/cp_model.c): bytes each step sends, how
 * compute and transfers grow with the local length, the length from which
 * transfers hide, the zigzag's balance and the contiguous layout's
 * imbalance under a causal mask, one rank as the single-device plan, and
 * the refusals. */
#include "cp_model.h"
#include "harness.h"
#include "planner.h"

#include <math.h>
#include <stdint.h>

static const fa_device_desc *h100(void) {
    const fa_described_device *d = fa_described_device_find("h100");
    if (!d) {
        fprintf(stderr, "described device h100 missing\n");
        exit(1);
    }
    return &d->desc;
}

static fa_attention_desc problem(int batch, int n, int hq, int hkv, int dim, fa_dtype t, int causal) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = batch;
    d.seqlen_q = d.seqlen_k = n;
    d.heads_q = hq;
    d.heads_kv = hkv;
    d.head_dim = dim;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t;
    d.causal = causal;
    return d;
}

/* The brief's example model: 32 query heads on 8 KV heads, d 128, bf16. */
static fa_attention_desc gqa(int n, int causal) { return problem(1, n, 32, 8, 128, FA_DTYPE_BF16, causal); }

static const fa_cp_link fast = {"fast", 450.0, 2.0};

static int pass_hides(const fa_cp_pass *p) {
    for (int k = 0; k < FA_CP_STEP_KINDS; k++)
        if (p->steps[k].count > 0 && p->steps[k].compute_ms < p->steps[k].transfer_ms) return 0;
    return 1;
}

FA_TEST(bytes_per_step_exact) {
    /* 2 sequences, 2 KV heads of 64, 4096 tokens over 4 ranks: 1024 keys a
     * rank, 2 * 1024 * 2 * 64 = 262144 elements in each of K and V. */
    const double elements = 2.0 * 1024 * 2 * 64;
    const fa_dtype dtypes[] = {FA_DTYPE_BF16, FA_DTYPE_F16, FA_DTYPE_F32};
    const fa_cp_link link = {"test", 100.0, 4.0};
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
        const fa_attention_desc d = problem(2, 4096, 8, 2, 64, dtypes[t], 1);
        fa_cp_prediction p;
        CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_ZIGZAG, 4, &link, &p));
        const double kv = 2 * elements * (double)fa_dtype_size(dtypes[t]), grads = 2 * elements * 4;
        CHECK(p.local_q == 1024 && p.local_k == 1024);
        CHECK(p.forward.steps[FA_CP_STEP_FIRST].count == 1 && p.forward.steps[FA_CP_STEP_MIDDLE].count == 2 &&
              p.forward.steps[FA_CP_STEP_LAST].count == 1);
        CHECK(p.forward.steps[FA_CP_STEP_FIRST].send_bytes == kv);
        CHECK(p.forward.steps[FA_CP_STEP_MIDDLE].send_bytes == kv);
        CHECK(p.forward.steps[FA_CP_STEP_LAST].send_bytes == 0 && p.forward.steps[FA_CP_STEP_LAST].transfer_ms == 0);
        CHECK(p.forward.tail_bytes == 0 && p.forward.tail_ms == 0);
        /* Backward: K, V ahead and dK, dV (fp32) one step behind. */
        CHECK(p.backward.steps[FA_CP_STEP_FIRST].send_bytes == kv);
        CHECK(p.backward.steps[FA_CP_STEP_MIDDLE].send_bytes == kv + grads);
        CHECK(p.backward.steps[FA_CP_STEP_LAST].send_bytes == grads);
        CHECK(p.backward.tail_bytes == grads);
        CHECK_NEAR(p.forward.steps[FA_CP_STEP_FIRST].transfer_ms, 4e-3 + kv / 100e9 * 1e3, 1e-15);
        CHECK_NEAR(p.backward.steps[FA_CP_STEP_MIDDLE].transfer_ms, 4e-3 + (kv + grads) / 100e9 * 1e3, 1e-15);
        CHECK_NEAR(p.backward.tail_ms, 4e-3 + grads / 100e9 * 1e3, 1e-15);
    }
    /* Two ranks: no middle step; the contiguous layout sends the same bytes. */
    const fa_attention_desc d = problem(2, 2048, 8, 2, 64, FA_DTYPE_BF16, 0);
    fa_cp_prediction p;
    CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_CONTIGUOUS, 2, &link, &p));
    CHECK(p.forward.steps[FA_CP_STEP_MIDDLE].count == 0 && p.backward.steps[FA_CP_STEP_LAST].count == 1);
    CHECK(p.forward.steps[FA_CP_STEP_FIRST].send_bytes == 2 * elements * 2);
    CHECK(p.backward.steps[FA_CP_STEP_LAST].send_bytes == 2 * elements * 4);
}

FA_TEST(compute_quadratic_transfer_linear) {
    fa_cp_prediction small, large;
    fa_attention_desc d = gqa(2 * 8192, 0);
    CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_CONTIGUOUS, 2, &fast, &small));
    d = gqa(2 * 16384, 0);
    CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_CONTIGUOUS, 2, &fast, &large));
    for (int pass = 0; pass < 2; pass++) {
        const fa_cp_step *s = pass ? &small.backward.steps[FA_CP_STEP_FIRST] : &small.forward.steps[FA_CP_STEP_FIRST];
        const fa_cp_step *l = pass ? &large.backward.steps[FA_CP_STEP_FIRST] : &large.forward.steps[FA_CP_STEP_FIRST];
        const double compute = l->compute_ms / s->compute_ms;
        const double transfer = (l->transfer_ms - 2e-3) / (s->transfer_ms - 2e-3);
        CHECK_MSG(compute > 3.5 && compute < 4.5, "pass %d: doubling the length multiplies compute by %.3f", pass,
                  compute);
        CHECK_NEAR(transfer, 2.0, 1e-9);
    }
}

FA_TEST(hiding_length_monotone_in_bandwidth) {
    const double rates[] = {1, 2, 5, 10, 25, 50, 100, 450, 2000};
    const int worlds[] = {2, 4, 8};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        int64_t previous = INT64_MAX, slowest = 0, fastest = 0;
        for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
            const fa_cp_link link = {"test", rates[r], 3.0};
            const fa_attention_desc d = gqa(2 * worlds[w] * 512, 1);
            fa_cp_prediction p;
            CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_ZIGZAG, worlds[w], &link, &p));
            const int64_t len = p.hiding_len;
            CHECK_MSG(len > 0 && len % FA_CP_LENGTH_QUANTUM == 0, "world %d, %g GB/s: hiding length %lld",
                      worlds[w], rates[r], (long long)len);
            CHECK_MSG(len <= previous, "world %d: %g GB/s hides from %lld tokens, a slower link from %lld",
                      worlds[w], rates[r], (long long)len, (long long)previous);
            CHECK(len == (p.forward.hiding_len > p.backward.hiding_len ? p.forward.hiding_len
                                                                        : p.backward.hiding_len));
            previous = len;
            if (r == 0) slowest = len;
            fastest = len;

            /* At the length found every step hides, both passes; a quantum
             * shorter, the pass that set it has a step that does not. */
            fa_cp_prediction at, below;
            const fa_attention_desc at_len = gqa((int)(worlds[w] * len), 1);
            CHECK_OK(fa_cp_predict(h100(), &at_len, FA_CP_ZIGZAG, worlds[w], &link, &at));
            CHECK(pass_hides(&at.forward) && pass_hides(&at.backward));
            if (len > FA_CP_LENGTH_QUANTUM) {
                const fa_attention_desc shorter = gqa((int)(worlds[w] * (len - FA_CP_LENGTH_QUANTUM)), 1);
                CHECK_OK(fa_cp_predict(h100(), &shorter, FA_CP_ZIGZAG, worlds[w], &link, &below));
                const fa_cp_pass *setter = p.forward.hiding_len == len ? &below.forward : &below.backward;
                CHECK_MSG(!pass_hides(setter), "world %d, %g GB/s: %lld tokens hide too", worlds[w], rates[r],
                          (long long)(len - FA_CP_LENGTH_QUANTUM));
            }
        }
        CHECK_MSG(slowest > 4 * fastest, "world %d: 1 GB/s hides from %lld tokens, 2000 GB/s from %lld", worlds[w],
                  (long long)slowest, (long long)fastest);
    }
}

FA_TEST(zigzag_causal_balanced) {
    const int worlds[] = {2, 4, 8};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        const fa_attention_desc d = gqa(worlds[w] * 4096, 1);
        fa_cp_prediction p;
        CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_ZIGZAG, worlds[w], &fast, &p));
        fa_plan_info whole;
        CHECK_OK(fa_plan_for_device(h100(), &d, &whole));
        const fa_cp_pass *passes[2] = {&p.forward, &p.backward};
        const double whole_flops[2] = {whole.forward.cost.flops, whole.backward.cost.flops};
        for (int pass = 0; pass < 2; pass++) {
            double rank_flops = 0;
            for (int k = 0; k < FA_CP_STEP_KINDS; k++) {
                const fa_cp_step *s = &passes[pass]->steps[k];
                CHECK_MSG(s->flops_min == s->flops_max, "world %d pass %d step kind %d: %g to %g FLOPs a rank",
                          worlds[w], pass, k, s->flops_min, s->flops_max);
                rank_flops += s->count * s->flops_max;
            }
            /* Every rank does exactly 1/W of the useful work. */
            CHECK_NEAR(rank_flops / (whole_flops[pass] / worlds[w]), 1.0, 1e-12);
            CHECK_NEAR(passes[pass]->imbalance, 1.0, 1e-12);
        }
    }
}

FA_TEST(contiguous_causal_imbalanced) {
    /* 8192 tokens a rank: the planner's tiles for the zigzag's two half
     * pairs are alike there, so the efficiencies compare the layouts. */
    const fa_attention_desc causal = gqa(4 * 8192, 1);
    fa_cp_prediction contiguous, zigzag;
    CHECK_OK(fa_cp_predict(h100(), &causal, FA_CP_CONTIGUOUS, 4, &fast, &contiguous));
    CHECK_OK(fa_cp_predict(h100(), &causal, FA_CP_ZIGZAG, 4, &fast, &zigzag));
    const fa_cp_step *later = &contiguous.forward.steps[FA_CP_STEP_MIDDLE];
    /* The first rank skips every later chunk, the last computes all. */
    CHECK(later->flops_min == 0 && later->flops_max > 0);
    /* Busiest rank: diagonal + 3 full pairs = 3.5 pairs; the mean 2 pairs. */
    CHECK_MSG(contiguous.forward.imbalance > 1.6 && contiguous.forward.imbalance < 1.9, "imbalance %.3f",
              contiguous.forward.imbalance);
    CHECK(contiguous.backward.imbalance > 1.6);
    for (int pass = 0; pass < 2; pass++) {
        const double slow = pass ? contiguous.backward.efficiency : contiguous.forward.efficiency;
        const double even = pass ? zigzag.backward.efficiency : zigzag.forward.efficiency;
        CHECK_MSG(slow < 0.75 * even, "pass %d: efficiency %.3f contiguous, %.3f zigzag", pass, slow, even);
    }
    /* Without a mask the contiguous layout is balanced. */
    const fa_attention_desc full = gqa(4 * 4096, 0);
    fa_cp_prediction p;
    CHECK_OK(fa_cp_predict(h100(), &full, FA_CP_CONTIGUOUS, 4, &fast, &p));
    for (int k = 0; k < FA_CP_STEP_KINDS; k++)
        CHECK(p.forward.steps[k].flops_min == p.forward.steps[k].flops_max);
    CHECK(p.forward.imbalance == 1.0 && p.backward.imbalance == 1.0);
}

FA_TEST(world_one_is_single_device) {
    const int causal[] = {0, 1};
    const fa_cp_layout layouts[] = {FA_CP_CONTIGUOUS, FA_CP_ZIGZAG};
    for (int c = 0; c < 2; c++)
        for (int l = 0; l < 2; l++) {
            const fa_attention_desc d = gqa(8192, causal[c]);
            fa_plan_info single;
            CHECK_OK(fa_plan_for_device(h100(), &d, &single));
            fa_cp_prediction p;
            CHECK_OK(fa_cp_predict(h100(), &d, layouts[l], 1, &fast, &p));
            CHECK(p.local_q == 8192 && p.local_k == 8192);
            CHECK(p.forward.total_ms == single.forward.cost.roofline_ms);
            CHECK(p.backward.total_ms == single.backward.cost.roofline_ms);
            CHECK(p.forward.efficiency == 1.0 && p.backward.efficiency == 1.0);
            CHECK(p.forward.steps[FA_CP_STEP_FIRST].count == 1 && p.forward.steps[FA_CP_STEP_FIRST].send_bytes == 0);
            CHECK(p.backward.steps[FA_CP_STEP_MIDDLE].count == 0 && p.backward.steps[FA_CP_STEP_LAST].count == 0);
            CHECK(p.backward.tail_ms == 0 && p.hiding_len == 0);
            CHECK(p.forward.imbalance == 1.0);
        }
}

FA_TEST(bad_inputs_refused) {
    const fa_device_desc *dev = h100();
    fa_attention_desc d = gqa(4096, 1);
    fa_cp_prediction p;
    CHECK_FAILS(fa_cp_predict(dev, &d, FA_CP_ZIGZAG, 0, &fast, &p), FA_ERR_INVALID_ARGUMENT, "world = 0");
    CHECK_FAILS(fa_cp_predict(dev, &d, FA_CP_ZIGZAG, -3, &fast, &p), FA_ERR_INVALID_ARGUMENT, "world = -3");
    CHECK_FAILS(fa_cp_predict(dev, &d, (fa_cp_layout)7, 2, &fast, &p), FA_ERR_INVALID_ARGUMENT, "layout = 7");
    const double bad_rates[] = {0.0, -1.0, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_rates / sizeof bad_rates[0]; i++) {
        const fa_cp_link link = {"bad", bad_rates[i], 2.0};
        CHECK_FAILS(fa_cp_predict(dev, &d, FA_CP_ZIGZAG, 2, &link, &p), FA_ERR_INVALID_ARGUMENT, "bandwidth");
    }
    const fa_cp_link slow_start = {"bad", 50.0, -1.0};
    CHECK_FAILS(fa_cp_predict(dev, &d, FA_CP_ZIGZAG, 2, &slow_start, &p), FA_ERR_INVALID_ARGUMENT, "latency");
    CHECK_FAILS(fa_cp_predict(NULL, &d, FA_CP_ZIGZAG, 2, &fast, &p), FA_ERR_NULL_POINTER, "device");
    CHECK_FAILS(fa_cp_predict(dev, NULL, FA_CP_ZIGZAG, 2, &fast, &p), FA_ERR_NULL_POINTER, "desc");
    CHECK_FAILS(fa_cp_predict(dev, &d, FA_CP_ZIGZAG, 2, NULL, &p), FA_ERR_NULL_POINTER, "link");
    CHECK_FAILS(fa_cp_predict(dev, &d, FA_CP_ZIGZAG, 2, &fast, NULL), FA_ERR_NULL_POINTER, "out");

    /* 4100 tokens: 4 ranks take 1025 each, but not 8 zigzag chunks. */
    d = gqa(4100, 1);
    CHECK_FAILS(fa_cp_predict(dev, &d, FA_CP_ZIGZAG, 4, &fast, &p), FA_ERR_INVALID_SIZE, "not a multiple of 8");
    CHECK_OK(fa_cp_predict(dev, &d, FA_CP_CONTIGUOUS, 4, &fast, &p));
    CHECK_FAILS(fa_cp_check(&d, FA_CP_CONTIGUOUS, 3), FA_ERR_INVALID_SIZE, "seqlen_q = 4100");
    d = gqa(4096, 0);
    d.seqlen_k = 4098;
    CHECK_FAILS(fa_cp_check(&d, FA_CP_CONTIGUOUS, 4), FA_ERR_INVALID_SIZE, "seqlen_k = 4098");

    /* What the ring does not run, and the masks the model does not follow. */
    d = gqa(4096, 1);
    d.seqlen_k = 2048;
    CHECK_FAILS(fa_cp_check(&d, FA_CP_ZIGZAG, 2), FA_ERR_UNSUPPORTED, "seqlen_k = 2048");
    d = gqa(4096, 1);
    d.window_left = 128;
    CHECK_FAILS(fa_cp_check(&d, FA_CP_ZIGZAG, 2), FA_ERR_UNSUPPORTED, "window");
    d.window_left = 4095; /* cannot bind: no window */
    CHECK_OK(fa_cp_check(&d, FA_CP_ZIGZAG, 2));
    d = gqa(4096, 1);
    d.dropout_p = 0.1f;
    CHECK_FAILS(fa_cp_check(&d, FA_CP_ZIGZAG, 2), FA_ERR_UNSUPPORTED, "dropout_p");
    d = gqa(4096, 1);
    d.softcap = 30.0f;
    CHECK_FAILS(fa_cp_check(&d, FA_CP_ZIGZAG, 2), FA_ERR_UNSUPPORTED, "softcap");
    d = gqa(4096, 0);
    const int32_t cu[] = {0, 4096};
    d.cu_seqlens_q = d.cu_seqlens_k = cu;
    CHECK_FAILS(fa_cp_check(&d, FA_CP_CONTIGUOUS, 2), FA_ERR_UNSUPPORTED, "cu_seqlens");
    d = gqa(4096, 0);
    d.head_dim = 12;
    CHECK_FAILS(fa_cp_check(&d, FA_CP_CONTIGUOUS, 2), FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim");
}

FA_TEST(named_links_and_latency) {
    CHECK(fa_cp_named_link_count() == 3);
    CHECK(fa_cp_named_link(-1) == NULL && fa_cp_named_link(3) == NULL);
    const fa_cp_link *nvlink = fa_cp_named_link(0);
    CHECK(nvlink && strcmp(nvlink->name, "NVLink 4") == 0 && nvlink->gbs == 450.0 && nvlink->latency_us == 2.0);
    for (int i = 0; i < fa_cp_named_link_count(); i++)
        CHECK(fa_cp_default_latency_us(fa_cp_named_link(i)->gbs) == fa_cp_named_link(i)->latency_us);
    CHECK(fa_cp_default_latency_us(900.0) == 2.0);  /* NVLink class */
    CHECK(fa_cp_default_latency_us(100.0) == 5.0);  /* nearer PCIe's 63 than NVLink's 450 */
    CHECK(fa_cp_default_latency_us(25.0) == 3.0);   /* a network */
}

FA_TEST(table_format) {
    const fa_attention_desc d = gqa(4 * 2048, 1);
    fa_cp_prediction p;
    CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_ZIGZAG, 4, fa_cp_named_link(1), &p));
    char text[4096];
    const size_t need = fa_cp_prediction_format(&p, text, sizeof text);
    CHECK(need == strlen(text) && need < sizeof text);
    const char *expected[] = {"ring over 4 ranks (zigzag layout), PCIe 5 x16: 63 GB/s a direction, 5 us",
                              "2048 queries and 2048 keys a rank",
                              "forward   0 diagonal",
                              "1..2",
                              "3 last",
                              "dK, dV home",
                              "efficiency",
                              "transfers hide on every step from"};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        CHECK_MSG(strstr(text, expected[i]) != NULL, "table lacks \"%s\":\n%s", expected[i], text);
    char small[40];
    CHECK(fa_cp_prediction_format(&p, small, sizeof small) == need);
    CHECK(strlen(small) == sizeof small - 1 && strncmp(small, text, sizeof small - 1) == 0);
    fa_cp_prediction one;
    CHECK_OK(fa_cp_predict(h100(), &d, FA_CP_ZIGZAG, 1, fa_cp_named_link(0), &one));
    fa_cp_prediction_format(&one, text, sizeof text);
    CHECK_MSG(strstr(text, "nothing travels") && !strstr(text, "dK, dV home"), "%s", text);
}

FA_TEST_MAIN(FA_CASE(bytes_per_step_exact), FA_CASE(compute_quadratic_transfer_linear),
             FA_CASE(hiding_length_monotone_in_bandwidth), FA_CASE(zigzag_causal_balanced),
             FA_CASE(contiguous_causal_imbalanced), FA_CASE(world_one_is_single_device), FA_CASE(bad_inputs_refused),
             FA_CASE(named_links_and_latency), FA_CASE(table_format))
