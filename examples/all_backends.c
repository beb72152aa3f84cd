/* One problem on every device of every backend present, each compared with
 * the CPU reference (fp64): the quickest way to see what a machine offers
 * and that each backend computes the same attention. Exits non-zero when a
 * device that ran disagrees with the reference. */
#include <flashattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 2, SEQ = 384, HEADS_Q = 4, HEADS_KV = 2, DIM = 64 };
#define Q_COUNT ((size_t)BATCH * SEQ * HEADS_Q * DIM)
#define KV_COUNT ((size_t)BATCH * SEQ * HEADS_KV * DIM)

static void describe(fa_attention_desc *d) {
    fa_attention_desc_init(d);
    d->batch = BATCH;
    d->seqlen_q = d->seqlen_k = SEQ;
    d->heads_q = HEADS_Q;
    d->heads_kv = HEADS_KV;
    d->head_dim = DIM;
    d->causal = 1;
}

/* Forward on one device: O into out. On failure prints why and returns the
 * status (a backend may lack what this problem needs: that is not an error
 * of the example). */
static fa_status run_on(fa_backend backend, int index, const float *q, const float *k,
                        const float *v, float *out) {
    fa_context ctx = NULL;
    fa_plan plan = NULL;
    fa_buffer b[5] = {NULL, NULL, NULL, NULL, NULL};
    const size_t bytes[5] = {Q_COUNT * sizeof(float), KV_COUNT * sizeof(float), KV_COUNT * sizeof(float),
                             Q_COUNT * sizeof(float), (size_t)BATCH * HEADS_Q * SEQ * sizeof(float)};
    fa_attention_desc d;
    describe(&d);
    fa_status st = fa_context_create(backend, index, &ctx);
    if (st == FA_SUCCESS) st = fa_plan_create(ctx, &d, &plan);
    for (int i = 0; i < 5 && st == FA_SUCCESS; i++) st = fa_buffer_alloc(ctx, bytes[i], &b[i]);
    if (st == FA_SUCCESS) st = fa_buffer_upload(b[0], 0, q, bytes[0]);
    if (st == FA_SUCCESS) st = fa_buffer_upload(b[1], 0, k, bytes[1]);
    if (st == FA_SUCCESS) st = fa_buffer_upload(b[2], 0, v, bytes[2]);
    if (st == FA_SUCCESS) st = fa_forward(plan, b[0], b[1], b[2], b[3], b[4]);
    if (st == FA_SUCCESS) st = fa_buffer_download(b[3], 0, out, bytes[3]);
    if (st != FA_SUCCESS) printf("    %s: %s\n", fa_status_string(st), fa_last_error());
    for (int i = 0; i < 5; i++)
        if (b[i]) fa_buffer_free(b[i]);
    if (plan) fa_plan_destroy(plan);
    if (ctx) fa_context_destroy(ctx);
    return st;
}

int main(void) {
    float *q = malloc(Q_COUNT * sizeof(float)), *k = malloc(KV_COUNT * sizeof(float));
    float *v = malloc(KV_COUNT * sizeof(float));
    float *ref = malloc(Q_COUNT * sizeof(float)), *out = malloc(Q_COUNT * sizeof(float));
    if (!q || !k || !v || !ref || !out) return 1;
    srand(7);
    for (size_t i = 0; i < Q_COUNT; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < KV_COUNT; i++) k[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < KV_COUNT; i++) v[i] = (float)rand() / (float)RAND_MAX - 0.5f;

    printf("problem: fp32, batch %d, seqlen %d, heads %d/%d, head_dim %d, causal\n", BATCH, SEQ,
           HEADS_Q, HEADS_KV, DIM);
    if (run_on(FA_BACKEND_REFERENCE, 0, q, k, v, ref) != FA_SUCCESS) return 1;

    for (int b = FA_BACKEND_REFERENCE; b < FA_BACKEND_COUNT; b++) {
        char reason[256];
        if (fa_backend_get_status((fa_backend)b, reason, sizeof reason) != FA_SUCCESS)
            printf("%-9s not available: %s\n", fa_backend_name((fa_backend)b), reason);
    }

    int count = 0, mismatches = 0;
    if (fa_device_count(&count) != FA_SUCCESS) {
        fprintf(stderr, "fa_device_count: %s\n", fa_last_error());
        return 1;
    }
    for (int i = 0; i < count; i++) {
        fa_device_info info;
        if (fa_device_get_info(i, &info) != FA_SUCCESS) {
            fprintf(stderr, "device %d: %s\n", i, fa_last_error());
            return 1;
        }
        printf("%-9s %d  %s\n", fa_backend_name(info.backend), info.index, info.desc.name);
        if (run_on(info.backend, info.index, q, k, v, out) != FA_SUCCESS) continue;
        double diff2 = 0.0, ref2 = 0.0, worst = 0.0;
        for (size_t e = 0; e < Q_COUNT; e++) {
            double diff = fabs((double)out[e] - ref[e]);
            if (isnan(diff)) diff = INFINITY; /* a NaN must count as a mismatch */
            diff2 += diff * diff;
            ref2 += (double)ref[e] * ref[e];
            if (diff > worst) worst = diff;
        }
        double rel = sqrt(diff2 / ref2);
        int ok = rel < 1e-5;
        mismatches += !ok;
        printf("    max |O - O_ref| %.3g, ||O - O_ref|| / ||O_ref|| %.3g: %s\n", worst, rel,
               ok ? "ok" : "MISMATCH");
    }
    free(q); free(k); free(v); free(ref); free(out);
    return mismatches ? 1 : 0;
}
