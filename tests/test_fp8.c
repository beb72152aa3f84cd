/* FP8 (e4m3) storage of the forward's inputs: the conversions, the
 * descriptor's rules, the reference against the formula written out, the
 * public API on the reference backend, and the device backends' refusal. */
#include "dtype.h"
#include "harness.h"
#include "reference.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The value of an e4m3 code from the OCP definition, independently of the
 * library's decoder; NaN for S.1111.111. */
static double e4m3_value(unsigned c) {
    const int sign = (int)(c >> 7), exp = (int)((c >> 3) & 0xf), mant = (int)(c & 7);
    double mag;
    if (exp == 15 && mant == 7) mag = NAN;
    else if (exp == 0) mag = mant / 8.0 * ldexp(1.0, -6);
    else mag = (1.0 + mant / 8.0) * ldexp(1.0, exp - 7);
    return sign ? -mag : mag;
}

FA_TEST(decode_all_codes) {
    int nans = 0;
    for (unsigned c = 0; c < 256; c++) {
        const double want = e4m3_value(c), got = fa_e4m3_to_f64((uint8_t)c);
        if (isnan(want)) {
            nans++;
            CHECK_MSG(isnan(got), "code 0x%02x decodes to %g, expected NaN", c, got);
            continue;
        }
        CHECK_MSG(got == want && signbit(got) == signbit(want), "code 0x%02x decodes to %.17g, expected %.17g", c,
                  got, want);
        /* Every finite code is its own value's encoding (-0 included). */
        CHECK_MSG(fa_f64_to_e4m3(want) == c, "%.17g encodes to 0x%02x, expected 0x%02x", want,
                  fa_f64_to_e4m3(want), c);
    }
    CHECK(nans == 2);
    CHECK(e4m3_value(0x7e) == 448.0 && e4m3_value(0x01) == ldexp(1.0, -9) && e4m3_value(0x08) == ldexp(1.0, -6));
}

/* Between two neighbouring codes (c, c + 1 of one sign), the midpoint goes
 * to the one with an even code (an even mantissa), and anything nearer to
 * one side goes there. */
FA_TEST(rounding_between_all_neighbours) {
    for (unsigned sign = 0; sign < 2; sign++)
        for (unsigned c = 0; c < 0x7e; c++) {
            const unsigned lo = c | sign << 7, hi = (c + 1) | sign << 7;
            const double a = e4m3_value(lo), b = e4m3_value(hi), mid = 0.5 * (a + b), gap = fabs(b - a);
            const unsigned even = (c & 1) ? hi : lo;
            CHECK_MSG(fa_f64_to_e4m3(mid) == even, "midpoint %.17g -> 0x%02x, expected 0x%02x", mid,
                      fa_f64_to_e4m3(mid), even);
            const double below = sign ? mid + gap / 64 : mid - gap / 64, above = sign ? mid - gap / 64 : mid + gap / 64;
            CHECK_MSG(fa_f64_to_e4m3(below) == lo, "%.17g -> 0x%02x, expected 0x%02x", below, fa_f64_to_e4m3(below),
                      lo);
            CHECK_MSG(fa_f64_to_e4m3(above) == hi, "%.17g -> 0x%02x, expected 0x%02x", above, fa_f64_to_e4m3(above),
                      hi);
        }
}

FA_TEST(rounding_boundaries) {
    /* Saturation (satfinite): 448 and everything past it, infinities too. */
    CHECK(fa_f64_to_e4m3(448.0) == 0x7e);
    CHECK(fa_f64_to_e4m3(463.99) == 0x7e);
    CHECK(fa_f64_to_e4m3(464.0) == 0x7e);
    CHECK(fa_f64_to_e4m3(1.0e6) == 0x7e);
    CHECK(fa_f64_to_e4m3(INFINITY) == 0x7e);
    CHECK(fa_f64_to_e4m3(-464.0) == 0xfe);
    CHECK(fa_f64_to_e4m3(-INFINITY) == 0xfe);
    /* NaN keeps its sign, never becomes a number. */
    CHECK(fa_f64_to_e4m3(NAN) == 0x7f);
    CHECK(fa_f64_to_e4m3(-NAN) == 0xff);
    /* Ties: 1 + 1/16 between 1 (even) and 1.125; 1.1875 between 1.125 and 1.25 (even). */
    CHECK(fa_f64_to_e4m3(1.0625) == 0x38);
    CHECK(fa_f64_to_e4m3(1.1875) == 0x3a);
    /* Subnormals: half the smallest is a tie with zero, just above it rounds up. */
    CHECK(fa_f64_to_e4m3(ldexp(1.0, -10)) == 0x00);
    CHECK(fa_f64_to_e4m3(-ldexp(1.0, -10)) == 0x80);
    CHECK(fa_f64_to_e4m3(ldexp(1.0, -10) * 1.001) == 0x01);
    CHECK(fa_f64_to_e4m3(ldexp(1.0, -12)) == 0x00);
    CHECK(fa_f64_to_e4m3(3.0 * ldexp(1.0, -10)) == 0x02); /* 1.5 quanta: tie to 2 */
    /* 7.5 quanta: a tie between the largest subnormal (odd) and the smallest normal. */
    CHECK(fa_f64_to_e4m3(7.5 * ldexp(1.0, -9)) == 0x08);
    CHECK(fa_f64_to_e4m3(1e-300) == 0x00);
    /* The dtype table and the element accessors. */
    CHECK(fa_dtype_size(FA_DTYPE_FP8_E4M3) == 1);
    CHECK(strcmp(fa_dtype_name(FA_DTYPE_FP8_E4M3), "fp8_e4m3") == 0);
    uint8_t buf[3] = {0, 0, 0};
    fa_store_elem(buf, FA_DTYPE_FP8_E4M3, 1, -0.3);
    CHECK(buf[0] == 0 && buf[2] == 0);
    CHECK(buf[1] == fa_f64_to_e4m3(-0.3));
    CHECK(fa_load_elem(buf, FA_DTYPE_FP8_E4M3, 1) == e4m3_value(buf[1]));
    CHECK(fabs(fa_load_elem(buf, FA_DTYPE_FP8_E4M3, 1) + 0.3) <= 0.3 / 16);
}

/* A valid fp8 descriptor: e4m3 q, k, v, bf16 O. */
static fa_attention_desc fp8_desc(int batch, int sq, int sk, int hq, int hk, int d) {
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.batch = batch;
    desc.seqlen_q = sq;
    desc.seqlen_k = sk;
    desc.heads_q = hq;
    desc.heads_kv = hk;
    desc.head_dim = d;
    desc.q.dtype = desc.k.dtype = desc.v.dtype = FA_DTYPE_FP8_E4M3;
    desc.o.dtype = FA_DTYPE_BF16;
    return desc;
}

FA_TEST(descriptor_checks) {
    fa_attention_desc d = fp8_desc(2, 16, 32, 4, 2, 64);
    CHECK_OK(fa_attention_desc_check(&d));
    d.o.dtype = FA_DTYPE_F16;
    CHECK_OK(fa_attention_desc_check(&d));
    d.o.dtype = FA_DTYPE_FP8_E4M3;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "o.dtype");
    d.o.dtype = FA_DTYPE_F32;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "o.dtype");
    d = fp8_desc(2, 16, 32, 4, 2, 64);
    d.k.dtype = FA_DTYPE_F16;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "k.dtype");
    d = fp8_desc(2, 16, 32, 4, 2, 64);
    d.v.dtype = FA_DTYPE_BF16;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "v.dtype");
    /* fp16 inputs keep O in their dtype, and fp8 keys with them are a mismatch. */
    d = fp8_desc(2, 16, 32, 4, 2, 64);
    d.q.dtype = d.o.dtype = FA_DTYPE_F16;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "k.dtype");
    d.k.dtype = d.v.dtype = FA_DTYPE_F16;
    CHECK_OK(fa_attention_desc_check(&d));
    d.o.dtype = FA_DTYPE_BF16;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "o.dtype");
    d.q.dtype = (fa_dtype)4;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_INVALID_ARGUMENT, "q.dtype");

    /* head_dim: multiples of 16 for fp8. */
    d = fp8_desc(1, 8, 8, 1, 1, 24);
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_UNSUPPORTED_HEAD_DIM, "head_dim");
    d.head_dim = 16;
    CHECK_OK(fa_attention_desc_check(&d));

    /* Descale factors. */
    d = fp8_desc(1, 8, 8, 1, 1, 32);
    d.descale_q = 0.5f;
    d.descale_k = 3.0f;
    d.descale_v = 1e-3f;
    CHECK_OK(fa_attention_desc_check(&d));
    d.descale_q = -1.0f;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SCALE, "descale_q");
    d.descale_q = 0.0f;
    d.descale_k = INFINITY;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SCALE, "descale_k");
    d.descale_k = 0.0f;
    d.descale_v = NAN;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_BAD_SCALE, "descale_v");
    fa_attention_desc h = fp8_desc(1, 8, 8, 1, 1, 32);
    h.q.dtype = h.k.dtype = h.v.dtype = h.o.dtype = FA_DTYPE_BF16;
    h.descale_k = 2.0f;
    CHECK_FAILS(fa_attention_desc_check(&h), FA_ERR_INVALID_ARGUMENT, "descale_k");

    /* 1-byte elements: offsets and strides in multiples of 16 elements. */
    d = fp8_desc(2, 8, 8, 2, 2, 32);
    d.q.offset = 8;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_MISALIGNED, "q.offset");
    d.q.offset = 16;
    CHECK_OK(fa_attention_desc_check(&d));
    d.k.stride_batch = 8 * 80;
    d.k.stride_seq = 72; /* 72 bytes: past the 64 of a token, not a multiple of 16 */
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_MISALIGNED, "k.stride_seq");
    d.k.stride_seq = 80;
    CHECK_OK(fa_attention_desc_check(&d));
    /* O keeps its own dtype's rule: 8 bf16 elements are 16 bytes. */
    d.o.offset = 8;
    CHECK_OK(fa_attention_desc_check(&d));

    /* A bias is fp32 or o's dtype. */
    d = fp8_desc(1, 8, 8, 1, 1, 32);
    d.bias_batch = d.bias_heads = 1;
    d.bias.dtype = FA_DTYPE_FP8_E4M3;
    CHECK_FAILS(fa_attention_desc_check(&d), FA_ERR_DTYPE_MISMATCH, "bias.dtype");
    d.bias.dtype = FA_DTYPE_BF16;
    CHECK_OK(fa_attention_desc_check(&d));
    d.bias.dtype = FA_DTYPE_F32;
    CHECK_OK(fa_attention_desc_check(&d));
}

/* Random e4m3 tensors (N(0, 1) scaled by mag, rounded). */
static uint8_t *random_fp8(fa_rng *rng, int64_t n, double mag) {
    uint8_t *t = malloc((size_t)n);
    if (t)
        for (int64_t i = 0; i < n; i++) t[i] = fa_f64_to_e4m3(mag * fa_rng_normal(rng));
    return t;
}

static double bf16_at(const uint16_t *o, int64_t i) { return (double)fa_bf16_to_f32(o[i]); }

/* The reference against the header's formula written out on packed
 * tensors: logits (dq * dk) * scale * q.k, causal mask, O = dv * P V. */
FA_TEST(reference_matches_formula) {
    const int B = 1, SQ = 3, SK = 5, HQ = 2, HK = 1, D = 16;
    fa_attention_desc d = fp8_desc(B, SQ, SK, HQ, HK, D);
    d.softmax_scale = 0.3f;
    d.descale_q = 0.5f;
    d.descale_k = 2.5f;
    d.descale_v = 0.25f;
    d.causal = 1;
    fa_rng rng;
    fa_rng_seed(&rng, 8);
    uint8_t *q = random_fp8(&rng, (int64_t)SQ * HQ * D, 2.0), *k = random_fp8(&rng, (int64_t)SK * HK * D, 2.0),
            *v = random_fp8(&rng, (int64_t)SK * HK * D, 8.0);
    uint16_t *o = malloc(sizeof(uint16_t) * SQ * HQ * D);
    float *lse = malloc(sizeof(float) * SQ * HQ);
    CHECK(q && k && v && o && lse);
    if (!q || !k || !v || !o || !lse) goto done;
    CHECK_OK(fa_ref_forward(&d, q, k, v, o, lse));
    for (int h = 0; h < HQ; h++)
        for (int i = 0; i < SQ; i++) {
            double s[5], m = -INFINITY;
            const int last = i + SK - SQ; /* bottom-right causal */
            for (int j = 0; j <= last; j++) {
                double dot = 0.0;
                for (int x = 0; x < D; x++)
                    dot += e4m3_value(q[(i * HQ + h) * D + x]) * e4m3_value(k[j * HK * D + x]);
                s[j] = (0.5 * 2.5) * (double)0.3f * dot;
                m = fmax(m, s[j]);
            }
            double sum = 0.0;
            for (int j = 0; j <= last; j++) sum += exp(s[j] - m);
            const double l = m + log(sum);
            CHECK_NEAR(lse[h * SQ + i], l, 1e-6 * fmax(1.0, fabs(l)));
            for (int x = 0; x < D; x++) {
                double acc = 0.0;
                for (int j = 0; j <= last; j++) acc += exp(s[j] - l) * e4m3_value(v[j * HK * D + x]);
                acc *= 0.25;
                /* O rounded once to bf16: within half an ulp (2^-9 relative). */
                const double got = bf16_at(o, (int64_t)(i * HQ + h) * D + x);
                CHECK_NEAR(got, acc, ldexp(fabs(acc), -8) + 1e-30);
            }
        }
    /* The standard algorithm has no fp8 path. */
    CHECK_FAILS(fa_ref_standard_forward(&d, q, k, v, o, lse), FA_ERR_UNSUPPORTED, "fp8_e4m3");
done:
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
}

typedef struct fp8_run {
    fa_buffer q, k, v, o, lse;
    uint8_t *hq, *hk, *hv;
    size_t nq, nk, no, nl;
} fp8_run;

static int run_setup(fa_context ctx, const fa_attention_desc *d, fp8_run *r) {
    memset(r, 0, sizeof *r);
    fa_rng rng;
    fa_rng_seed(&rng, 81);
    r->nq = (size_t)d->batch * d->seqlen_q * d->heads_q * d->head_dim;
    r->nk = (size_t)d->batch * d->seqlen_k * d->heads_kv * d->head_dim;
    r->no = r->nq * fa_dtype_size(d->o.dtype);
    r->nl = (size_t)d->batch * d->heads_q * d->seqlen_q * sizeof(float);
    r->hq = random_fp8(&rng, (int64_t)r->nq, 3.0);
    r->hk = random_fp8(&rng, (int64_t)r->nk, 3.0);
    r->hv = random_fp8(&rng, (int64_t)r->nk, 3.0);
    if (!r->hq || !r->hk || !r->hv) return 0;
    if (fa_buffer_alloc(ctx, r->nq, &r->q) || fa_buffer_alloc(ctx, r->nk, &r->k) ||
        fa_buffer_alloc(ctx, r->nk, &r->v) || fa_buffer_alloc(ctx, r->no, &r->o) ||
        fa_buffer_alloc(ctx, r->nl, &r->lse))
        return 0;
    return !fa_buffer_upload(r->q, 0, r->hq, r->nq) && !fa_buffer_upload(r->k, 0, r->hk, r->nk) &&
           !fa_buffer_upload(r->v, 0, r->hv, r->nk);
}

static void run_free(fp8_run *r) {
    fa_buffer bufs[] = {r->q, r->k, r->v, r->o, r->lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) fa_buffer_free(bufs[i]);
    free(r->hq);
    free(r->hk);
    free(r->hv);
}

/* The plan's forward on the reference equals fa_ref_forward bit for bit,
 * with the descriptor's descales and after fa_plan_set_descale. */
static void check_pass(fa_plan plan, const fa_attention_desc *d, fp8_run *r) {
    unsigned char *got = malloc(r->no), *want = malloc(r->no);
    float *gl = malloc(r->nl), *wl = malloc(r->nl);
    CHECK(got && want && gl && wl);
    if (got && want && gl && wl) {
        CHECK_OK(fa_forward(plan, r->q, r->k, r->v, r->o, r->lse));
        CHECK_OK(fa_buffer_download(r->o, 0, got, r->no));
        CHECK_OK(fa_buffer_download(r->lse, 0, gl, r->nl));
        CHECK_OK(fa_ref_forward(d, r->hq, r->hk, r->hv, want, wl));
        CHECK(memcmp(got, want, r->no) == 0);
        CHECK(memcmp(gl, wl, r->nl) == 0);
    }
    free(got);
    free(want);
    free(gl);
    free(wl);
}

FA_TEST(reference_backend_runs_fp8) {
    fa_context ctx;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    fa_attention_desc d = fp8_desc(2, 7, 9, 4, 2, 32);
    d.o.dtype = FA_DTYPE_F16;
    d.descale_q = 0.75f;
    d.descale_v = 2.0f;
    fp8_run r;
    fa_plan plan = NULL;
    CHECK(run_setup(ctx, &d, &r));
    CHECK_OK(fa_plan_create(ctx, &d, &plan));
    if (plan) {
        check_pass(plan, &d, &r);
        /* New factors without a new plan: the same as a plan created with them. */
        CHECK_OK(fa_plan_set_descale(plan, 0.125f, 4.0f, 0.0f));
        d.descale_q = 0.125f;
        d.descale_k = 4.0f;
        d.descale_v = 0.0f;
        check_pass(plan, &d, &r);
        CHECK_FAILS(fa_plan_set_descale(plan, 1.0f, -2.0f, 1.0f), FA_ERR_BAD_SCALE, "descale_k");
        CHECK_FAILS(fa_plan_set_descale(plan, 1.0f, 1.0f, INFINITY), FA_ERR_BAD_SCALE, "descale_v");
        /* A refused call leaves the factors as they were. */
        check_pass(plan, &d, &r);
        /* Forward only: the backward refuses, whatever the buffers. */
        CHECK_FAILS(fa_backward(plan, r.q, r.k, r.v, r.o, r.lse, r.o, r.q, r.k, r.v), FA_ERR_UNSUPPORTED,
                    "fp8_e4m3");
        fa_pass_args a;
        memset(&a, 0, sizeof a);
        CHECK_FAILS(fa_backward_ex(plan, &a), FA_ERR_UNSUPPORTED, "forward only");
        CHECK_OK(fa_plan_destroy(plan));
    }
    CHECK_FAILS(fa_plan_set_descale(NULL, 1.0f, 1.0f, 1.0f), FA_ERR_NULL_POINTER, "plan");

    /* Descale factors belong to fp8 plans only. */
    fa_attention_desc h = fp8_desc(1, 4, 4, 1, 1, 16);
    h.q.dtype = h.k.dtype = h.v.dtype = h.o.dtype = FA_DTYPE_F16;
    fa_plan hp = NULL;
    CHECK_OK(fa_plan_create(ctx, &h, &hp));
    if (hp) {
        CHECK_FAILS(fa_plan_set_descale(hp, 1.0f, 1.0f, 1.0f), FA_ERR_INVALID_ARGUMENT, "descale");
        fa_plan_destroy(hp);
    }

    /* No fp8 path in standard attention. */
    d.algorithm = FA_ALGO_STANDARD;
    fa_plan sp = NULL;
    CHECK_FAILS(fa_plan_create(ctx, &d, &sp), FA_ERR_UNSUPPORTED, "algorithm");
    CHECK(sp == NULL);
    run_free(&r);
    fa_context_destroy(ctx);
}

/* Every device backend present refuses an fp8 plan, naming the dtype and
 * itself, but CUDA on sm_90 (its warp-specialised forward; the device
 * tests check it there): CUDA elsewhere refuses it naming the dtype and
 * the architecture it needs. A KV-cache step or standard attention with
 * fp8 inputs is refused on every backend. */
FA_TEST(device_backends_refuse) {
    static const fa_backend devices[] = {FA_BACKEND_OPENCL, FA_BACKEND_CUDA, FA_BACKEND_HIP};
    int present = 0;
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        fa_context ctx;
        if (fa_context_create(devices[i], 0, &ctx) != FA_SUCCESS) continue;
        present++;
        fa_device_info info;
        CHECK_OK(fa_context_get_info(ctx, &info));
        const int runs = devices[i] == FA_BACKEND_CUDA && strcmp(info.desc.arch, "sm_90") == 0;
        fa_attention_desc d = fp8_desc(1, 16, 16, 2, 2, 64);
        fa_plan plan = NULL;
        if (runs) {
            CHECK_OK(fa_plan_create(ctx, &d, &plan));
            CHECK(plan != NULL);
            if (plan) fa_plan_destroy(plan);
        } else {
            CHECK_FAILS(fa_plan_create(ctx, &d, &plan), FA_ERR_UNSUPPORTED, "fp8_e4m3");
            const char *needle = devices[i] == FA_BACKEND_CUDA ? "sm_90" : fa_backend_name(devices[i]);
            CHECK_MSG(strstr(fa_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"", fa_last_error(),
                      needle);
            CHECK(plan == NULL);
        }
        d.algorithm = FA_ALGO_STANDARD;
        plan = NULL;
        CHECK_FAILS(fa_plan_create(ctx, &d, &plan), FA_ERR_UNSUPPORTED, "algorithm");
        CHECK(plan == NULL);
        fa_context_destroy(ctx);
    }
    if (!present) FA_SKIP("no device backend available");
}

FA_TEST_MAIN(FA_CASE(decode_all_codes), FA_CASE(rounding_between_all_neighbours), FA_CASE(rounding_boundaries),
             FA_CASE(descriptor_checks), FA_CASE(reference_matches_formula), FA_CASE(reference_backend_runs_fp8),
             FA_CASE(device_backends_refuse))
