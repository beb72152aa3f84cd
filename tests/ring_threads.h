/* An in-process transport: the ranks of a ring are threads of one process,
 * exchanging host memory through a shared hub. It lets the ring run, and be
 * checked against one device, without MPI or several GPUs. */
#ifndef FA_RING_THREADS_H
#define FA_RING_THREADS_H

#include "flashattn.h"

typedef struct ring_hub ring_hub;

ring_hub *ring_hub_create(int world);
void ring_hub_destroy(ring_hub *hub);
/* Rank `rank`'s transport over the hub (host memory); released by
 * fa_comm_destroy. */
fa_transport ring_hub_transport(ring_hub *hub, int rank);

/* Runs fn(rank, arg_of_rank) on world threads and waits for them. */
void ring_threads_run(int world, void (*fn)(int rank, void *arg), void *const *args);

/* NCCL communicators for devices 0 .. world-1 of this process
 * (ncclCommInitAll), NCCL loaded from FLASHATTN_NCCL_LIBRARY or
 * libnccl.so.2. FA_SUCCESS, or a status with the reason in why. */
fa_status ring_nccl_comms(int world, void **comms, char *why, size_t why_size);
void ring_nccl_destroy(void *comm);

#endif
