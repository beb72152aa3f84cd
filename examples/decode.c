/* Decoding: each sequence of a batch has one new query token, attending to
 * its whole KV cache. The caches differ in length, so the batch is given as
 * variable-length (cumulative offsets, as flash_attn_varlen_func takes them);
 * the planner splits the long key range over work-groups and merges the
 * parts through the log-sum-exp. The result is checked on the host. */
#include <flashattn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        fa_status st_ = (call);                                                  \
        if (st_ != FA_SUCCESS) {                                                 \
            fprintf(stderr, "%s: %s: %s\n", #call, fa_status_string(st_),        \
                    fa_last_error());                                            \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

enum { BATCH = 3, HEADS_Q = 16, HEADS_KV = 4, DIM = 128 };

/* One head of one sequence in fp64: softmax(q K^T * scale) V. */
static void attend(const float *q, const float *k, const float *v, int keys, double scale,
                   double *out) {
    double *p = malloc((size_t)keys * sizeof(double));
    if (!p) exit(1);
    double max = -INFINITY, sum = 0.0;
    for (int j = 0; j < keys; j++) {
        double s = 0.0;
        for (int c = 0; c < DIM; c++) s += (double)q[c] * k[(size_t)j * HEADS_KV * DIM + c];
        p[j] = s * scale;
        if (p[j] > max) max = p[j];
    }
    for (int j = 0; j < keys; j++) sum += (p[j] = exp(p[j] - max));
    for (int c = 0; c < DIM; c++) {
        double acc = 0.0;
        for (int j = 0; j < keys; j++) acc += p[j] * v[(size_t)j * HEADS_KV * DIM + c];
        out[c] = acc / sum;
    }
    free(p);
}

int main(void) {
    const int32_t cache_len[BATCH] = {8191, 1000, 4096};
    int32_t cu_q[BATCH + 1] = {0}, cu_k[BATCH + 1] = {0};
    int longest = 0;
    for (int b = 0; b < BATCH; b++) {
        cu_q[b + 1] = cu_q[b] + 1;
        cu_k[b + 1] = cu_k[b] + cache_len[b];
        if (cache_len[b] > longest) longest = cache_len[b];
    }

    fa_context ctx;
    CHECK(fa_context_create(FA_BACKEND_ANY, -1, &ctx));
    fa_device_info dev;
    CHECK(fa_context_get_info(ctx, &dev));

    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = BATCH;
    d.seqlen_q = 1;            /* longest query sequence */
    d.seqlen_k = longest;      /* longest cache */
    d.heads_q = HEADS_Q;
    d.heads_kv = HEADS_KV;
    d.head_dim = DIM;
    d.causal = 1;              /* bottom-right aligned: the new token sees its whole cache */
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    fa_plan plan;
    CHECK(fa_plan_create(ctx, &d, &plan));
    fa_plan_info info;
    CHECK(fa_plan_get_info(plan, &info));
    printf("%s: %s; forward kernel %s, split_k %d\n", fa_backend_name(dev.backend),
           dev.desc.name, fa_variant_name(info.forward.variant), info.forward.split_k);

    /* Packed tokens: Q [total_q, heads_q, dim], K and V [total_k, heads_kv, dim]. */
    size_t nq = (size_t)cu_q[BATCH] * HEADS_Q * DIM, nkv = (size_t)cu_k[BATCH] * HEADS_KV * DIM;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nkv * sizeof(float));
    float *v = malloc(nkv * sizeof(float)), *o = malloc(nq * sizeof(float));
    double *expected = malloc(DIM * sizeof(double));
    if (!q || !k || !v || !o || !expected) return 1;
    srand(1);
    for (size_t i = 0; i < nq; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < nkv; i++) k[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < nkv; i++) v[i] = (float)rand() / (float)RAND_MAX - 0.5f;

    fa_buffer bq, bk, bv, bo, blse;
    CHECK(fa_buffer_alloc(ctx, nq * sizeof(float), &bq));
    CHECK(fa_buffer_alloc(ctx, nkv * sizeof(float), &bk));
    CHECK(fa_buffer_alloc(ctx, nkv * sizeof(float), &bv));
    CHECK(fa_buffer_alloc(ctx, nq * sizeof(float), &bo));
    CHECK(fa_buffer_alloc(ctx, (size_t)HEADS_Q * cu_q[BATCH] * sizeof(float), &blse));
    CHECK(fa_buffer_upload(bq, 0, q, nq * sizeof(float)));
    CHECK(fa_buffer_upload(bk, 0, k, nkv * sizeof(float)));
    CHECK(fa_buffer_upload(bv, 0, v, nkv * sizeof(float)));
    CHECK(fa_forward(plan, bq, bk, bv, bo, blse));
    CHECK(fa_buffer_download(bo, 0, o, nq * sizeof(float)));

    double worst = 0.0, scale = 1.0 / sqrt((double)DIM);
    for (int b = 0; b < BATCH; b++) {
        for (int h = 0; h < HEADS_Q; h++) {
            int hk = h / (HEADS_Q / HEADS_KV);
            size_t qi = ((size_t)cu_q[b] * HEADS_Q + (size_t)h) * DIM;
            size_t ki = ((size_t)cu_k[b] * HEADS_KV + (size_t)hk) * DIM;
            attend(q + qi, k + ki, v + ki, cache_len[b], scale, expected);
            for (int c = 0; c < DIM; c++) {
                double diff = fabs(o[qi + (size_t)c] - expected[c]);
                if (isnan(diff)) diff = INFINITY; /* a NaN must fail the check */
                if (diff > worst) worst = diff;
            }
        }
        printf("sequence %d: 1 query token, %d cached keys\n", b, cache_len[b]);
    }
    printf("largest difference from the host computation: %.3g\n", worst);

    fa_buffer buffers[] = {bq, bk, bv, bo, blse};
    for (int i = 0; i < 5; i++) CHECK(fa_buffer_free(buffers[i]));
    CHECK(fa_plan_destroy(plan));
    CHECK(fa_context_destroy(ctx));
    free(q); free(k); free(v); free(o); free(expected);
    return worst < 1e-4 ? 0 : 1;
}
