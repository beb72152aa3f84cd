/* One distributed attention checked against the same backend on one
 * process (tests/mpi/test_dist_mpi.c). */
#ifndef FA_MPI_CHECK_H
#define FA_MPI_CHECK_H

#include "flashattn.h"

#include <mpi.h>

#define MPI_CASE_MAX_SEQS 64

/* Sizes are tokens a rank: the whole sequence grows with the world, so
 * that every world size runs pieces of the same shapes (PoCL compiles
 * each kernel variant once, into the shared kernel cache). */
typedef struct mpi_case {
    const char *name;
    fa_dtype dtype;
    int batch, q_per_rank, k_per_rank, heads_q, heads_kv, head_dim;
    int causal, window_left, window_right;
    fa_cp_layout layout;
    int block_q, block_k; /* 0: no block mask */
    /* 1: a variable-length batch, queries and keys alike, of lengths
     * cycling through a fixed list, the last cut to q_per_rank * world
     * tokens, so that sequences cross the ranks' borders. */
    int varlen;
    /* Also run on the device backends (OpenCL on PoCL compiles every
     * kernel variant on first use: a subset keeps CI's time). */
    int on_devices;
    float dropout_p; /* > 0: dropout, the same seed on one process and the ring */
} mpi_case;

typedef struct mpi_env {
    fa_context ctx;
    fa_comm comm;
    MPI_Comm mpi;
    int rank, world;
    int scale; /* the cases' lengths times this */
} mpi_env;

/* The whole problem of c over world ranks, its lengths times scale, drawn
 * identically on every rank from seed. */
typedef struct mpi_problem {
    fa_attention_desc desc;
    int32_t cu_seqlens[MPI_CASE_MAX_SEQS + 1];
    uint8_t *block_mask;
} mpi_problem;

void mpi_problem_init(mpi_problem *p, const mpi_case *c, int world, int scale, uint64_t seed);
void mpi_problem_free(mpi_problem *p);

/* Collective over env->mpi: forward and backward of c on every rank
 * through fa_dist_*, gathered on rank 0 and compared there with
 * fa_forward and fa_backward of the whole sequence on env->ctx. */
void mpi_check_case(const mpi_env *env, const mpi_case *c, uint64_t seed);

/* Tolerance of the ring against one process, as a relative Frobenius
 * error: the partial results merge through the log-sum-exp in fp32, in
 * another order than one process sums them, so results agree to rounding
 * rather than bitwise. */
double mpi_tolerance(fa_dtype dtype);

#endif
