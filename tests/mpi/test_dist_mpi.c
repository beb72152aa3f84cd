/* Context parallelism over MPI: the layouts, the MPI transport, and ring
 * attention on every backend present against the same backend on one
 * process. An MPI program: every rank runs the case named on the command
 * line (tests/mpi/CMakeLists.txt runs each under mpirun with 2 and 4
 * ranks); rank 0 prints the harness's lines, every rank its failures.
 *
 * The ring merges partial results through the log-sum-exp in fp32, in
 * another order than one process accumulates them, so results are
 * compared with a tolerance (relative Frobenius error: fp32 1e-5, fp16
 * 2e-3, bf16 1.5e-2, L 1e-5), not bitwise. */
#include "mpi_check.h"
#include "flashattn_mpi.h"
#include "harness.h"
#include "mpi_error.h"
#include "mpi_transport.h"
#include "test_util.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int rank, world;

/* The harness's case status must agree on every rank: a rank that skips
 * while another runs would leave the other waiting in a collective. */
static int everyone(int flag) {
    int all = 0;
    MPI_Allreduce(&flag, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return all;
}

/* One reference context a process, for the threads that need one. */
static fa_context open_context_local(void) {
    static fa_context ctx;
    if (!ctx) fa_context_create(FA_BACKEND_REFERENCE, -1, &ctx);
    return ctx;
}

static fa_context open_context(fa_backend backend) {
    fa_context ctx = NULL;
    const fa_status st = fa_context_create(backend, -1, &ctx);
    if (!everyone(st == FA_SUCCESS)) {
        if (ctx) fa_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}

/* ------------------------------------------------------------------------ */
/* Layouts                                                                  */
/* ------------------------------------------------------------------------ */

/* Every token of the whole sequence lies in exactly one part of one rank,
 * at consecutive local positions, in the chunk order the header gives. */
static void check_parts(fa_cp_layout layout, int64_t n, int w) {
    uint8_t *seen = calloc((size_t)n, 1);
    const int parts = layout == FA_CP_ZIGZAG ? 2 : 1;
    for (int r = 0; r < w; r++) {
        int64_t next_local = 0;
        for (int part = 0; part < parts; part++) {
            int64_t start = -1, len = -1, local = -1;
            CHECK_OK(fa_cp_part(layout, n, w, r, part, &start, &len, &local));
            const int64_t chunk = layout == FA_CP_ZIGZAG ? 2 * (int64_t)w - 1 - r : r;
            const int64_t expect_start = layout == FA_CP_ZIGZAG ? (part ? chunk : r) * (n / (2 * w)) : r * (n / w);
            CHECK_MSG(start == expect_start && len == n / (w * parts) && local == next_local,
                      "layout %d n %lld world %d rank %d part %d: start %lld len %lld local %lld", (int)layout,
                      (long long)n, w, r, part, (long long)start, (long long)len, (long long)local);
            for (int64_t i = start; len > 0 && i < start + len && i >= 0 && i < n; i++) seen[i]++;
            next_local += len;
        }
        CHECK(next_local == n / w);
    }
    int64_t once = 0;
    for (int64_t i = 0; i < n; i++) once += seen[i] == 1;
    CHECK_MSG(once == n, "%lld of %lld tokens in exactly one part", (long long)once, (long long)n);
    free(seen);
}

static void check_round_trip(fa_cp_layout layout, int64_t outer, int64_t n, size_t token_bytes, int w) {
    const size_t bytes = (size_t)outer * (size_t)n * token_bytes;
    uint8_t *whole = malloc(bytes), *back = malloc(bytes), *local = malloc(bytes / (size_t)w);
    for (size_t i = 0; i < bytes; i++) whole[i] = (uint8_t)(i * 131u + 7u);
    memset(back, 0, bytes);
    for (int r = 0; r < w; r++) {
        CHECK_OK(fa_cp_scatter(layout, w, r, outer, n, token_bytes, whole, local));
        /* The first token of a rank's first part lands first. */
        int64_t start = 0, len = 0, at = 0;
        CHECK_OK(fa_cp_part(layout, n, w, r, 0, &start, &len, &at));
        CHECK(memcmp(local, whole + (size_t)start * token_bytes, token_bytes) == 0);
        CHECK_OK(fa_cp_gather(layout, w, r, outer, n, token_bytes, local, back));
    }
    CHECK_MSG(memcmp(whole, back, bytes) == 0, "scatter then gather, layout %d world %d: not the same tensor",
              (int)layout, w);
    free(whole);
    free(back);
    free(local);
}

FA_TEST(layouts) {
    for (int w = 1; w <= 8; w *= 2) {
        check_parts(FA_CP_CONTIGUOUS, 48, w);
        check_parts(FA_CP_ZIGZAG, 64, w);
        check_round_trip(FA_CP_CONTIGUOUS, 3, 16 * w, 24, w);
        check_round_trip(FA_CP_ZIGZAG, 2, 8 * w, 40, w);
    }
    int64_t s, l, at;
    uint8_t whole[64], local[64];
    CHECK_STATUS(fa_cp_part(FA_CP_CONTIGUOUS, 10, 4, 0, 0, &s, &l, &at), FA_ERR_INVALID_SIZE);
    CHECK_STATUS(fa_cp_part(FA_CP_ZIGZAG, 12, 4, 0, 0, &s, &l, &at), FA_ERR_INVALID_SIZE);
    CHECK_STATUS(fa_cp_part(FA_CP_CONTIGUOUS, 16, 0, 0, 0, &s, &l, &at), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_part(FA_CP_CONTIGUOUS, 16, -2, 0, 0, &s, &l, &at), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_part(FA_CP_CONTIGUOUS, 16, 4, 4, 0, &s, &l, &at), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_part(FA_CP_CONTIGUOUS, 16, 4, -1, 0, &s, &l, &at), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_part(FA_CP_CONTIGUOUS, 16, 4, 0, 1, &s, &l, &at), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_part(FA_CP_ZIGZAG, 16, 4, 0, 2, &s, &l, &at), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_part((fa_cp_layout)7, 16, 4, 0, 0, &s, &l, &at), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_scatter(FA_CP_CONTIGUOUS, 0, 0, 1, 16, 4, whole, local), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_scatter(FA_CP_CONTIGUOUS, 4, 4, 1, 16, 4, whole, local), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_gather(FA_CP_ZIGZAG, 4, -1, 1, 16, 4, local, whole), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cp_gather(FA_CP_ZIGZAG, 4, 0, 1, 12, 4, local, whole), FA_ERR_INVALID_SIZE);
    CHECK_STATUS(fa_cp_scatter(FA_CP_CONTIGUOUS, 2, 0, 1, 16, 4, NULL, local), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_cp_gather(FA_CP_CONTIGUOUS, 2, 0, 1, 16, 4, NULL, whole), FA_ERR_NULL_POINTER);
}

/* ------------------------------------------------------------------------ */
/* The MPI transport on its own                                             */
/* ------------------------------------------------------------------------ */

static uint8_t pattern(int from_rank, size_t i, int salt) { return (uint8_t)(from_rank * 37 + (int)(i % 251) + salt); }

/* One ring step: each rank sends send_bytes to the next rank and receives
 * recv_bytes from the previous one. Returns wait's status (start's where
 * that failed). */
static fa_status ring_step(const fa_transport *t, size_t send_bytes, size_t recv_bytes, int salt, int *content_ok) {
    const int next = (t->rank + 1) % t->world, prev = (t->rank + t->world - 1) % t->world;
    uint8_t *send = malloc(send_bytes + 1), *recv = malloc(recv_bytes + 1);
    for (size_t i = 0; i < send_bytes; i++) send[i] = pattern(t->rank, i, salt);
    memset(recv, 0, recv_bytes + 1);
    void *pending = NULL;
    fa_status st = t->start(t->impl, NULL, send, send_bytes, next, recv, recv_bytes, prev, &pending);
    if (st == FA_SUCCESS) st = t->wait(t->impl, NULL, pending);
    int ok = 1;
    for (size_t i = 0; st == FA_SUCCESS && i < recv_bytes; i++) ok &= recv[i] == pattern(prev, i, salt);
    if (content_ok) *content_ok = ok;
    free(send);
    free(recv);
    return st;
}

/* Two transfers in flight at once, as the ring has K and V; waited for in
 * the other order than started. */
static void check_two_in_flight(const fa_transport *t, size_t bytes_a, size_t bytes_b) {
    const int next = (t->rank + 1) % t->world, prev = (t->rank + t->world - 1) % t->world;
    uint8_t *send[2] = {malloc(bytes_a + 1), malloc(bytes_b + 1)}, *recv[2] = {malloc(bytes_a + 1), malloc(bytes_b + 1)};
    const size_t bytes[2] = {bytes_a, bytes_b};
    void *pending[2] = {NULL, NULL};
    for (int x = 0; x < 2; x++) {
        for (size_t i = 0; i < bytes[x]; i++) send[x][i] = pattern(t->rank, i, 11 * x);
        CHECK_OK(t->start(t->impl, NULL, send[x], bytes[x], next, recv[x], bytes[x], prev, &pending[x]));
    }
    for (int x = 1; x >= 0; x--) {
        if (pending[x]) CHECK_OK(t->wait(t->impl, NULL, pending[x]));
        int ok = 1;
        for (size_t i = 0; i < bytes[x]; i++) ok &= recv[x][i] == pattern(prev, i, 11 * x);
        CHECK_MSG(ok, "transfer %d of %zu bytes arrived altered", x, bytes[x]);
    }
    for (int x = 0; x < 2; x++) {
        free(send[x]);
        free(recv[x]);
    }
}

FA_TEST(transport) {
    fa_context ctx = open_context(FA_BACKEND_REFERENCE);
    CHECK(ctx != NULL);
    if (!ctx) return;
    fa_transport t;
    CHECK_OK(fa_mpi_transport_create(ctx, MPI_COMM_WORLD, 0, &t));
    CHECK(t.rank == rank && t.world == world);
    CHECK(t.device_memory == 0);
    int ok = 0;
    CHECK_OK(ring_step(&t, 4096, 4096, 1, &ok));
    CHECK(ok);
    CHECK_OK(ring_step(&t, 0, 0, 2, &ok));
    check_two_in_flight(&t, 1000, 24);

    int64_t values[3] = {rank, -rank, 7};
    CHECK_OK(t.agree(t.impl, values, 3));
    CHECK(values[0] == world - 1 && values[1] == 0 && values[2] == 7);
    CHECK_OK(t.agree(t.impl, NULL, 0));
    CHECK_STATUS(t.agree(t.impl, values, -1), FA_ERR_INVALID_ARGUMENT);

    /* The ranks disagree on a transfer's size: the receiver is told, in
     * either direction, and the transport stays usable. */
    CHECK_STATUS(ring_step(&t, 100, 120, 3, NULL), FA_ERR_INVALID_SIZE);
    CHECK_MSG(strstr(fa_mpi_last_error(), "received 100 bytes") != NULL, "message: %s", fa_mpi_last_error());
    CHECK_STATUS(ring_step(&t, 120, 100, 4, NULL), FA_ERR_INVALID_SIZE);
    CHECK_MSG(strstr(fa_mpi_last_error(), "MPI_Waitall") != NULL, "message: %s", fa_mpi_last_error());
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_OK(ring_step(&t, 64, 64, 5, &ok));
    CHECK(ok);

    /* MPI's own error, with MPI's words in the message. */
    uint8_t byte = 0;
    void *pending = NULL;
    CHECK_STATUS(t.start(t.impl, NULL, &byte, 1, world, &byte, 1, 0, &pending), FA_ERR_INVALID_ARGUMENT);
    char expect[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    MPI_Error_string(MPI_ERR_RANK, expect, &len);
    CHECK_MSG(strstr(fa_mpi_last_error(), "MPI_Isend") && strstr(fa_mpi_last_error(), expect), "message \"%s\" lacks \"%s\"",
              fa_mpi_last_error(), expect);
    CHECK(pending == NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_OK(ring_step(&t, 64, 64, 6, &ok));

    /* A transfer started and never waited for (a pass that gave up):
     * release drops it without waiting. */
    uint8_t out_bytes[64] = {0}, in_bytes[64];
    pending = NULL;
    CHECK_OK(t.start(t.impl, NULL, out_bytes, sizeof out_bytes, (rank + 1) % world, in_bytes, sizeof in_bytes,
                     (rank + world - 1) % world, &pending));
    MPI_Barrier(MPI_COMM_WORLD);
    t.release(t.impl);
    MPI_Barrier(MPI_COMM_WORLD);
    fa_context_destroy(ctx);
}

/* Transfers above the message limit travel as one message of a derived
 * type; 1 GiB blocks in production, here 48 bytes. */
FA_TEST(transport_derived_types) {
    fa_context ctx = open_context(FA_BACKEND_REFERENCE);
    CHECK(ctx != NULL);
    if (!ctx) return;
    fa_transport t;
    CHECK_OK(fa_mpi_transport_create(ctx, MPI_COMM_WORLD, 48, &t));
    const size_t sizes[] = {48, 49, 96, 1000, 4803};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int ok = 0;
        CHECK_OK(ring_step(&t, sizes[i], sizes[i], (int)i, &ok));
        CHECK_MSG(ok, "%zu bytes in blocks of 48 arrived altered", sizes[i]);
    }
    check_two_in_flight(&t, 1000, 4803);
    /* A shorter message than expected is still told apart. */
    CHECK_STATUS(ring_step(&t, 960, 1000, 9, NULL), FA_ERR_INVALID_SIZE);
    CHECK_MSG(strstr(fa_mpi_last_error(), "received 960 bytes") != NULL, "message: %s", fa_mpi_last_error());
    t.release(t.impl);
    fa_context_destroy(ctx);
}

/* Only where FA_TEST_MPI_LARGE is set: a transfer over INT_MAX bytes (about
 * 4.5 GB of host memory a rank). */
FA_TEST(transport_large) {
    if (!getenv("FA_TEST_MPI_LARGE")) FA_SKIP("set FA_TEST_MPI_LARGE=1 to move 2.2 GB a rank");
    fa_context ctx = open_context(FA_BACKEND_REFERENCE);
    CHECK(ctx != NULL);
    if (!ctx) return;
    fa_transport t;
    CHECK_OK(fa_mpi_transport_create(ctx, MPI_COMM_WORLD, 0, &t));
    int ok = 0;
    CHECK_OK(ring_step(&t, (size_t)2200 * 1000 * 1000 + 3, (size_t)2200 * 1000 * 1000 + 3, 1, &ok));
    CHECK(ok);
    t.release(t.impl);
    fa_context_destroy(ctx);
}

/* A rank that cannot set its transport up fails every rank's call, so
 * that none waits for it. */
FA_TEST(transport_setup_errors) {
    fa_context ctx = open_context(FA_BACKEND_REFERENCE);
    CHECK(ctx != NULL);
    if (!ctx) return;
    fa_transport t;
    fa_comm comm = NULL;
    CHECK_STATUS(fa_mpi_transport_create(ctx, MPI_COMM_NULL, 0, &t), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_mpi_transport_create(NULL, MPI_COMM_WORLD, 0, &t), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_comm_create_mpi(ctx, MPI_COMM_WORLD, NULL), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_comm_create_mpi(ctx, MPI_COMM_NULL, &comm), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(fa_mpi_last_error(), "MPI_COMM_NULL") != NULL, "message: %s", fa_mpi_last_error());
    CHECK(comm == NULL);

    if (rank == world - 1) setenv("FLASHATTN_MPI_GPU_AWARE", "yes", 1);
    const fa_status st = fa_mpi_transport_create(ctx, MPI_COMM_WORLD, 0, &t);
    CHECK_STATUS(st, FA_ERR_INVALID_ARGUMENT);
    const char *needle = rank == world - 1 ? "FLASHATTN_MPI_GPU_AWARE" : "could not create";
    CHECK_MSG(strstr(fa_mpi_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"", fa_mpi_last_error(), needle);
    if (st == FA_SUCCESS) t.release(t.impl);

    /* Forcing GPU-awareness hands MPI device memory on CUDA and HIP only. */
    setenv("FLASHATTN_MPI_GPU_AWARE", "1", 1);
    CHECK_OK(fa_mpi_transport_create(ctx, MPI_COMM_WORLD, 0, &t));
    CHECK(t.device_memory == 0);
    t.release(t.impl);
    unsetenv("FLASHATTN_MPI_GPU_AWARE");
    fa_context_destroy(ctx);
}

/* Below MPI_THREAD_SERIALIZED, a thread other than MPI's main one is
 * refused before any MPI call (mpirun starts this test with MPI_Init). */
static void *create_off_main(void *arg) {
    fa_comm comm = NULL;
    *(fa_status *)arg = fa_comm_create_mpi(open_context_local(), MPI_COMM_WORLD, &comm);
    if (comm) fa_comm_destroy(comm);
    return NULL;
}

FA_TEST(thread_level) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided >= MPI_THREAD_SERIALIZED) FA_SKIP("MPI gave MPI_THREAD_SERIALIZED or more: every thread may call it");
    fa_status st = FA_SUCCESS;
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, create_off_main, &st) == 0);
    pthread_join(thread, NULL);
    CHECK_STATUS(st, FA_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------------ */
/* Communicators                                                            */
/* ------------------------------------------------------------------------ */

FA_TEST(communicators) {
    fa_context ctx = open_context(FA_BACKEND_REFERENCE);
    CHECK(ctx != NULL);
    if (!ctx) return;
    fa_comm comm = NULL;
    int r = -1, w = -1;
    CHECK_OK(fa_comm_create_mpi(ctx, MPI_COMM_WORLD, &comm));
    if (comm) {
        CHECK_OK(fa_comm_get_rank(comm, &r, &w));
        CHECK(r == rank && w == world);
        CHECK_OK(fa_comm_destroy(comm));
    }
    /* Over a part of the ranks: ranks and world are the part's. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
    int half_rank, half_world;
    MPI_Comm_rank(half, &half_rank);
    MPI_Comm_size(half, &half_world);
    comm = NULL;
    CHECK_OK(fa_comm_create_mpi(ctx, half, &comm));
    if (comm) {
        CHECK_OK(fa_comm_get_rank(comm, &r, &w));
        CHECK(r == half_rank && w == half_world);
        CHECK_OK(fa_comm_destroy(comm));
    }
    MPI_Comm_free(&half);
    fa_context_destroy(ctx);
}

/* ------------------------------------------------------------------------ */
/* Ring attention against one process                                       */
/* ------------------------------------------------------------------------ */

#define F32 FA_DTYPE_F32
#define F16 FA_DTYPE_F16
#define BF16 FA_DTYPE_BF16
#define CONTIG FA_CP_CONTIGUOUS
#define ZIGZAG FA_CP_ZIGZAG

/* Tokens a rank: 32 queries and keys unless said (the zigzag layout's
 * chunks are 16), times 8 on the device backends. There every piece of
 * the ring (a zigzag chunk of 128 tokens at least) and the whole sequence
 * get the planner's largest tiles, so that PoCL compiles a kernel a pass,
 * dtype, head_dim and mask, the same whatever the world size. The
 * reference runs every case; the device backends the marked ones (dev),
 * chosen to share those kernels (PoCL compiles each for about 8 s): every
 * dtype, both head_dims, both layouts, causal and block masks, GQA and
 * fully masked rows; windows and variable-length batches, whose pieces
 * take tiles of their own, on the reference alone. */
static const mpi_case mpi_cases[] = {
    /* name                      dtype  b  q   k hq hkv d  causal wl  wr  layout  bq  bk varlen dev */
    {"full_contiguous",          F32,   2, 32, 32, 2, 2, 32, 0,   -1, -1, CONTIG,  0,  0, 0, 1, 0},
    {"causal_zigzag",            F32,   2, 32, 32, 2, 2, 32, 1,   -1, -1, ZIGZAG,  0,  0, 0, 1, 0},
    {"causal_contiguous",        F32,   1, 32, 32, 2, 2, 32, 1,   -1, -1, CONTIG,  0,  0, 0, 1, 0},
    {"full_zigzag_f16_d64",      F16,   1, 32, 32, 2, 2, 64, 0,   -1, -1, ZIGZAG,  0,  0, 0, 0, 0},
    {"causal_zigzag_bf16",       BF16,  2, 32, 32, 2, 2, 32, 1,   -1, -1, ZIGZAG,  0,  0, 0, 0, 0},
    {"window_left_contiguous",   F16,   1, 32, 32, 2, 2, 32, 0,    9, -1, CONTIG,  0,  0, 0, 0, 0},
    {"window_left_causal_zigzag",F32,   1, 32, 32, 2, 2, 32, 1,    9, -1, ZIGZAG,  0,  0, 0, 0, 0},
    {"window_both_contiguous",   F16,   1, 32, 32, 2, 2, 32, 0,    7,  3, CONTIG,  0,  0, 0, 0, 0},
    {"window_both_zigzag",       BF16,  1, 32, 32, 2, 2, 64, 0,    7,  3, ZIGZAG,  0,  0, 0, 0, 0},
    {"block_mask_dividing",      F32,   1, 32, 32, 2, 2, 32, 0,   -1, -1, CONTIG,  8,  8, 0, 0, 0},
    {"block_mask_uneven_causal", F16,   1, 32, 32, 2, 2, 32, 1,   -1, -1, ZIGZAG, 12, 20, 0, 1, 0},
    {"block_mask_uneven",        F32,   1, 32, 32, 2, 2, 32, 0,   -1, -1, CONTIG, 24, 12, 0, 0, 0},
    {"gqa_4_on_2_causal",        BF16,  1, 32, 32, 4, 2, 64, 1,   -1, -1, ZIGZAG,  0,  0, 0, 1, 0},
    {"mqa_4_on_1",               F16,   1, 32, 32, 4, 1, 64, 0,   -1, -1, CONTIG,  0,  0, 0, 0, 0},
    {"seqlen_q_16_k_32",         F32,   2, 16, 32, 2, 2, 32, 0,   -1, -1, CONTIG,  0,  0, 0, 0, 0},
    {"seqlen_q_16_k_32_causal",  F32,   1, 16, 32, 2, 2, 32, 1,   -1, -1, ZIGZAG,  0,  0, 0, 0, 0},
    {"varlen_full",              F32,   0, 32, 32, 2, 2, 32, 0,   -1, -1, CONTIG,  0,  0, 1, 0, 0},
    {"varlen_causal_zigzag",     F16,   0, 32, 32, 4, 2, 32, 1,   -1, -1, ZIGZAG,  0,  0, 1, 0, 0},
    {"varlen_causal_contiguous", F32,   0, 32, 32, 2, 1, 64, 1,   -1, -1, CONTIG,  0,  0, 1, 0, 0},
    /* Twice the queries of the keys: the window ends before the first key
     * for the first half of the queries (less one), the causal mask hides
     * every key from the first half: fully masked rows. */
    {"masked_rows_window",       F32,   1, 32, 16, 2, 2, 32, 0,    4,  1, CONTIG,  0,  0, 0, 0, 0},
    {"masked_rows_causal_zigzag",F16,   1, 32, 16, 2, 2, 32, 1,   -1, -1, ZIGZAG,  0,  0, 0, 0, 0},
    {"masked_rows_gqa_causal",   BF16,  1, 64, 32, 4, 2, 64, 1,   -1, -1, ZIGZAG,  0,  0, 0, 1, 0},
    /* The ring draws one device's dropout mask from global positions. */
    {"dropout_causal_zigzag",    F32,   2, 32, 32, 2, 2, 32, 1,   -1, -1, ZIGZAG,  0,  0, 0, 0, 0.2f},
    {"dropout_window_gqa",       BF16,  1, 32, 32, 4, 2, 64, 0,    9,  3, CONTIG,  0,  0, 0, 0, 0.1f},
};

static void run_backend(fa_backend backend) {
    fa_context ctx = open_context(backend);
    if (!ctx) FA_SKIP("no device of this backend on every rank");
    mpi_env env = {ctx, NULL, MPI_COMM_WORLD, rank, world, backend == FA_BACKEND_REFERENCE ? 1 : 8};
    CHECK_OK(fa_comm_create_mpi(ctx, MPI_COMM_WORLD, &env.comm));
    if (!everyone(env.comm != NULL)) {
        if (env.comm) fa_comm_destroy(env.comm);
        fa_context_destroy(ctx);
        return;
    }
    const char *only = getenv("FA_TEST_DIST_CASE");
    for (size_t i = 0; i < sizeof mpi_cases / sizeof mpi_cases[0]; i++) {
        if (only ? strcmp(only, mpi_cases[i].name) != 0 : backend != FA_BACKEND_REFERENCE && !mpi_cases[i].on_devices)
            continue;
        mpi_check_case(&env, &mpi_cases[i], 0x5eed0000u + i);
    }
    CHECK_OK(fa_comm_destroy(env.comm));
    fa_context_destroy(ctx);
}

FA_TEST(reference) { run_backend(FA_BACKEND_REFERENCE); }
FA_TEST(opencl) { run_backend(FA_BACKEND_OPENCL); }
FA_TEST(cuda) { run_backend(FA_BACKEND_CUDA); }
FA_TEST(hip) { run_backend(FA_BACKEND_HIP); }

/* ------------------------------------------------------------------------ */
/* What the ring refuses, and ranks that disagree                           */
/* ------------------------------------------------------------------------ */

/* fa_dist_plan_create's status on this rank, which must be every rank's. */
static fa_status plan_status(const mpi_env *env, const fa_attention_desc *d, fa_cp_layout layout) {
    fa_dist_plan plan = NULL;
    const fa_status st = fa_dist_plan_create(env->ctx, env->comm, d, layout, &plan);
    if (plan) fa_dist_plan_destroy(plan);
    int mine = (int)st, lowest = 0, highest = 0;
    MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &highest, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK_MSG(lowest == highest, "ranks got different statuses (%s to %s)", fa_status_string((fa_status)lowest),
              fa_status_string((fa_status)highest));
    return st;
}

static int open_env(mpi_env *env) {
    memset(env, 0, sizeof *env);
    env->ctx = open_context(FA_BACKEND_REFERENCE);
    env->mpi = MPI_COMM_WORLD;
    env->rank = rank;
    env->world = world;
    CHECK(env->ctx != NULL);
    if (!env->ctx) return 0;
    CHECK_OK(fa_comm_create_mpi(env->ctx, MPI_COMM_WORLD, &env->comm));
    return everyone(env->comm != NULL);
}

static void close_env(mpi_env *env) {
    if (env->comm) fa_comm_destroy(env->comm);
    if (env->ctx) fa_context_destroy(env->ctx);
}

FA_TEST(refusals) {
    mpi_env env;
    if (!open_env(&env)) {
        close_env(&env);
        return;
    }
    mpi_problem p;
    /* Dropout runs in the ring, but not with variable-length batches. */
    const mpi_case varlen_dropout = {"varlen_dropout", F32, 0, 32, 32, 2, 2, 32, 0, -1, -1, CONTIG, 0, 0, 1, 0, 0};
    mpi_problem_init(&p, &varlen_dropout, world, 1, 1);
    p.desc.dropout_p = 0.1f;
    CHECK_STATUS(plan_status(&env, &p.desc, CONTIG), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "dropout") != NULL, "message: %s", fa_last_error());
    mpi_problem_free(&p);

    const mpi_case varlen = {"varlen", F32, 0, 32, 32, 2, 2, 32, 0, -1, -1, CONTIG, 0, 0, 1, 0, 0};
    mpi_problem_init(&p, &varlen, world, 1, 2);
    p.desc.window_left = 8;
    CHECK_STATUS(plan_status(&env, &p.desc, CONTIG), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "window") != NULL, "message: %s", fa_last_error());
    mpi_problem_free(&p);

    const mpi_case varlen_blocks = {"varlen_blocks", F32, 0, 32, 32, 2, 2, 32, 0, -1, -1, CONTIG, 8, 8, 1, 0, 0};
    mpi_problem_init(&p, &varlen_blocks, world, 1, 3);
    CHECK_STATUS(plan_status(&env, &p.desc, CONTIG), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "block") != NULL, "message: %s", fa_last_error());
    mpi_problem_free(&p);

    /* Causal masks on a batch whose query and key offsets differ. */
    const mpi_case varlen_causal = {"varlen_causal", F32, 0, 32, 32, 2, 2, 32, 1, -1, -1, CONTIG, 0, 0, 1, 0, 0};
    mpi_problem_init(&p, &varlen_causal, world, 1, 4);
    /* The same total of keys, the first two sequences' split moved. */
    int32_t cu_k[MPI_CASE_MAX_SEQS + 1];
    memcpy(cu_k, p.cu_seqlens, sizeof cu_k);
    cu_k[1] += 1;
    p.desc.cu_seqlens_k = cu_k;
    CHECK_STATUS(plan_status(&env, &p.desc, CONTIG), FA_ERR_UNSUPPORTED);
    mpi_problem_free(&p);
    close_env(&env);
}

/* One rank's descriptor differs: every rank fails, none hangs, and the
 * message says what differs. */
FA_TEST(mismatched_ranks) {
    mpi_env env;
    if (!open_env(&env)) {
        close_env(&env);
        return;
    }
    const mpi_case base = {"base", F32, 1, 32, 32, 2, 2, 32, 1, -1, -1, ZIGZAG, 0, 0, 0, 0, 0};
    mpi_problem p;
    mpi_problem_init(&p, &base, world, 1, 1);
    CHECK_OK(plan_status(&env, &p.desc, ZIGZAG));

    fa_attention_desc d = p.desc;
    if (rank == 1) d.head_dim = 24;
    fa_status st = plan_status(&env, &d, ZIGZAG);
    CHECK(st != FA_SUCCESS);
    CHECK_MSG(strstr(fa_last_error(), "differ") != NULL || strstr(fa_last_error(), "mismatch") != NULL,
              "head_dim 24 on rank 1: message \"%s\"", fa_last_error());

    d = p.desc;
    if (rank == world - 1) d.seqlen_q = d.seqlen_k = 2 * d.seqlen_q;
    st = plan_status(&env, &d, ZIGZAG);
    CHECK(st != FA_SUCCESS);
    CHECK_MSG(strstr(fa_last_error(), "differ") != NULL || strstr(fa_last_error(), "mismatch") != NULL,
              "seqlen doubled on the last rank: message \"%s\"", fa_last_error());

    /* The layout is part of the problem too. */
    st = plan_status(&env, &p.desc, rank == 0 ? CONTIG : ZIGZAG);
    CHECK(st != FA_SUCCESS);

    /* And the ranks still agree afterwards. */
    CHECK_OK(plan_status(&env, &p.desc, ZIGZAG));
    mpi_problem_free(&p);
    close_env(&env);
}

/* ------------------------------------------------------------------------ */

int fa_test_failures = 0;
int fa_test_checks = 0;
const char *fa_test_skip_reason = NULL;

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    /* One rank reports; every rank's failures still reach stderr. */
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    static const fa_test_case cases[] = {
        FA_CASE(layouts),   FA_CASE(transport), FA_CASE(transport_derived_types), FA_CASE(transport_large),
        FA_CASE(transport_setup_errors), FA_CASE(thread_level), FA_CASE(communicators), FA_CASE(reference), FA_CASE(opencl),
        FA_CASE(cuda),      FA_CASE(hip),       FA_CASE(refusals),  FA_CASE(mismatched_ranks),
    };
    const int rc = fa_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
    /* mpirun reports one exit status: a failure on any rank, else a skip
     * only where every rank skipped. */
    int failed = rc != 0 && rc != 77, skipped = rc == 77, any_failed = 0, all_skipped = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    MPI_Allreduce(&skipped, &all_skipped, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    MPI_Finalize();
    return any_failed ? 1 : all_skipped ? 77 : 0;
}
