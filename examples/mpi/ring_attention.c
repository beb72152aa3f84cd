#include <flashattn.h>
#include <flashattn_mpi.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        fa_status st_ = (call);                                                  \
        if (st_ != FA_SUCCESS) {                                                 \
            fprintf(stderr, "%s: %s: %s %s\n", #call, fa_status_string(st_),     \
                    fa_last_error(), fa_mpi_last_error());                       \
            MPI_Abort(MPI_COMM_WORLD, 1);                                        \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    fa_context ctx;
    CHECK(fa_context_create(FA_BACKEND_ANY, -1, &ctx));  /* GPUs: device index = local rank */
    fa_comm comm;
    CHECK(fa_comm_create_mpi(ctx, MPI_COMM_WORLD, &comm));

    /* The WHOLE problem: 256 tokens a rank, causal; the zigzag layout
     * gives every rank the same share of the causal work. */
    const int tokens = 256 * world, local = tokens / world;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1; d.seqlen_q = d.seqlen_k = tokens;
    d.heads_q = d.heads_kv = 2; d.head_dim = 32;
    d.causal = 1;
    fa_dist_plan plan;
    CHECK(fa_dist_plan_create(ctx, comm, &d, FA_CP_ZIGZAG, &plan));  /* collective */

    /* This rank's tokens, [1, local, 2, 32] each, in fa_cp_part's order
     * (fa_cp_scatter cuts them out of whole tensors). */
    const size_t n = (size_t)local * 2 * 32;
    float *host = malloc(n * sizeof(float));
    if (!host) MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < n; i++) host[i] = (float)((i * 7 + (size_t)rank) % 13) / 13.0f - 0.5f;
    fa_buffer q, k, v, o, lse;
    CHECK(fa_buffer_alloc(ctx, n * sizeof(float), &q));
    CHECK(fa_buffer_alloc(ctx, n * sizeof(float), &k));
    CHECK(fa_buffer_alloc(ctx, n * sizeof(float), &v));
    CHECK(fa_buffer_alloc(ctx, n * sizeof(float), &o));
    CHECK(fa_buffer_alloc(ctx, (size_t)2 * local * sizeof(float), &lse));  /* fp32 [1, 2, local] */
    CHECK(fa_buffer_upload(q, 0, host, n * sizeof(float)));
    CHECK(fa_buffer_upload(k, 0, host, n * sizeof(float)));
    CHECK(fa_buffer_upload(v, 0, host, n * sizeof(float)));

    CHECK(fa_dist_forward(plan, q, k, v, o, lse));  /* K and V travel around the ring */
    /* training: fa_dist_backward(plan, q, k, v, o, lse, dout, dq, dk, dv) */

    CHECK(fa_buffer_download(o, 0, host, n * sizeof(float)));
    printf("rank %d of %d: O[0,0,0,:2] = %.4f %.4f\n", rank, world, host[0], host[1]);

    fa_buffer buffers[] = {q, k, v, o, lse};
    for (int i = 0; i < 5; i++) CHECK(fa_buffer_free(buffers[i]));
    CHECK(fa_dist_plan_destroy(plan));
    CHECK(fa_comm_destroy(comm));  /* before MPI_Finalize: it frees an MPI communicator */
    CHECK(fa_context_destroy(ctx));
    free(host);
    MPI_Finalize();
    return 0;
}
