#include <flashattn.h>
#include <stdio.h>
#include <stdlib.h>

/* Every call returns an fa_status; fa_last_error() says which argument or
 * which runtime call failed, and why. */
#define CHECK(call)                                                              \
    do {                                                                         \
        fa_status st_ = (call);                                                  \
        if (st_ != FA_SUCCESS) {                                                 \
            fprintf(stderr, "%s: %s: %s\n", #call, fa_status_string(st_),        \
                    fa_last_error());                                            \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

int main(void) {
    fa_context ctx;
    CHECK(fa_context_create(FA_BACKEND_ANY, -1, &ctx));  /* the best device */
    fa_device_info dev;
    CHECK(fa_context_get_info(ctx, &dev));
    printf("%s: %s\n", fa_backend_name(dev.backend), dev.desc.name);

    fa_attention_desc d;
    fa_attention_desc_init(&d);              /* fp32, packed [batch, seq, heads, dim] */
    d.batch = 2; d.seqlen_q = d.seqlen_k = 1024;
    d.heads_q = 8; d.heads_kv = 2;           /* grouped-query attention */
    d.head_dim = 64;
    d.causal = 1;
    fa_plan plan;
    CHECK(fa_plan_create(ctx, &d, &plan));   /* checks, plans, compiles (cached) */

    size_t nq = (size_t)2 * 1024 * 8 * 64, nkv = (size_t)2 * 1024 * 2 * 64;
    float *host = malloc((nq + 2 * nkv) * sizeof(float));  /* Q, K, V */
    if (!host) return 1;
    for (size_t i = 0; i < nq + 2 * nkv; i++) host[i] = (float)rand() / (float)RAND_MAX - 0.5f;

    fa_buffer q, k, v, o, lse;
    CHECK(fa_buffer_alloc(ctx, nq * sizeof(float), &q));
    CHECK(fa_buffer_alloc(ctx, nkv * sizeof(float), &k));
    CHECK(fa_buffer_alloc(ctx, nkv * sizeof(float), &v));
    CHECK(fa_buffer_alloc(ctx, nq * sizeof(float), &o));
    CHECK(fa_buffer_alloc(ctx, (size_t)2 * 8 * 1024 * sizeof(float), &lse));  /* fp32 [2, 8, 1024] */
    CHECK(fa_buffer_upload(q, 0, host, nq * sizeof(float)));
    CHECK(fa_buffer_upload(k, 0, host + nq, nkv * sizeof(float)));
    CHECK(fa_buffer_upload(v, 0, host + nq + nkv, nkv * sizeof(float)));

    CHECK(fa_forward(plan, q, k, v, o, lse));
    /* training: fa_backward(plan, q, k, v, o, lse, dout, dq, dk, dv) */

    float first[4];
    CHECK(fa_buffer_download(o, 0, first, sizeof first));
    /* Causal: the first query sees the first key alone, so O[0] = V[0]. */
    printf("O[0,0,0,:4] = %.4f %.4f %.4f %.4f (V[0,0,0,:4] = %.4f %.4f %.4f %.4f)\n",
           first[0], first[1], first[2], first[3],
           host[nq + nkv], host[nq + nkv + 1], host[nq + nkv + 2], host[nq + nkv + 3]);

    fa_buffer buffers[] = {q, k, v, o, lse};
    for (int i = 0; i < 5; i++) CHECK(fa_buffer_free(buffers[i]));
    CHECK(fa_plan_destroy(plan));
    CHECK(fa_context_destroy(ctx));
    free(host);
    return 0;
}
