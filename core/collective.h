/* NCCL and RCCL, loaded at run time: the few entry points the ring's
 * transport needs, declared here by hand, so that the library builds
 * without nccl.h and runs where neither is installed. fa_nccl_transport is
 * what fa_comm_create_nccl calls (include/flashattn.h).
 *
 * Loading: NCCL as libnccl.so.2, libnccl.so, then from /usr/local/cuda/lib64;
 * RCCL as librccl.so.1, librccl.so, then from /opt/rocm/lib. When the
 * environment variable FLASHATTN_NCCL_LIBRARY is set and not empty, its
 * value (a file name or path) replaces either list. A failure is tried
 * again on the next call (the library may appear, or the variable change);
 * a success is kept for the process. */
#ifndef FA_COLLECTIVE_H
#define FA_COLLECTIVE_H

#include "flashattn.h"

#include <stddef.h>

#define FA_NCCL_ENV "FLASHATTN_NCCL_LIBRARY"

typedef enum fa_collective_vendor {
    FA_COLLECTIVE_NCCL = 0, /* NVIDIA GPUs: CUDA contexts, HIP through the mapping onto CUDA */
    FA_COLLECTIVE_RCCL = 1  /* AMD GPUs: HIP contexts */
} fa_collective_vendor;

/* NCCL's ABI, which RCCL shares: ncclComm_t and the stream
 * (cudaStream_t, hipStream_t) are opaque pointers, the enums are passed as
 * int. The values are nccl.h's (2.x), fixed by that ABI. */
enum { FA_NCCL_SUCCESS = 0, FA_NCCL_INVALID_ARGUMENT = 4, FA_NCCL_INVALID_USAGE = 5, FA_NCCL_IN_PROGRESS = 7 };
enum { FA_NCCL_UINT8 = 1, FA_NCCL_INT64 = 4 }; /* ncclDataType_t */
enum { FA_NCCL_MAX = 2 };                      /* ncclRedOp_t */

/* Entry points the transport needs; each must resolve. */
#define FA_NCCL_REQUIRED(X)                                                          \
    X(ncclGetErrorString, const char *, (int))                                       \
    X(ncclCommCount, int, (void *, int *))                                           \
    X(ncclCommUserRank, int, (void *, int *))                                        \
    X(ncclGroupStart, int, (void))                                                   \
    X(ncclGroupEnd, int, (void))                                                     \
    X(ncclSend, int, (const void *, size_t, int, int, void *, void *))               \
    X(ncclRecv, int, (void *, size_t, int, int, void *, void *))                     \
    X(ncclAllReduce, int, (const void *, void *, size_t, int, int, void *, void *))

/* NULL where missing: the communicator's device, checked against the
 * context's where the library can tell it; communicators of one process
 * for the device tests. */
#define FA_NCCL_OPTIONAL(X)                                                          \
    X(ncclCommCuDevice, int, (void *, int *))                                        \
    X(ncclCommInitAll, int, (void **, int, const int *))                             \
    X(ncclCommDestroy, int, (void *))

typedef struct fa_nccl_api {
#define FA_NCCL_MEMBER(name, ret, args) ret (*name) args;
    FA_NCCL_REQUIRED(FA_NCCL_MEMBER)
    FA_NCCL_OPTIONAL(FA_NCCL_MEMBER)
#undef FA_NCCL_MEMBER
    const char *name; /* "NCCL" or "RCCL", for messages */
} fa_nccl_api;

/* The vendor's library, loading it on first use; FA_ERR_BACKEND_UNAVAILABLE,
 * naming every library tried and why, when it cannot be loaded. */
fa_status fa_nccl_load(fa_collective_vendor vendor, const fa_nccl_api **api);

/* A status for an NCCL result, with a message naming the call and the
 * library's own text (FA_SUCCESS for ncclSuccess). */
fa_status fa_nccl_error(const fa_nccl_api *api, int result, const char *what);

/* The transport over nccl_comm (a ncclComm_t, or RCCL's) for a CUDA or HIP
 * context: its backend's transport_nccl; FA_ERR_UNSUPPORTED, naming the
 * backend, for contexts whose backend has none. */
fa_status fa_nccl_transport(fa_context ctx, void *nccl_comm, fa_transport *transport);

#endif
