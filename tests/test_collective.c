/* NCCL and RCCL as the library loads them (core/collective.c), on a
 * machine that needs no GPU: a library that cannot be opened, or that
 * lacks an entry point, is FA_ERR_BACKEND_UNAVAILABLE naming it; NCCL,
 * where it is installed, loads with every entry point the transport calls;
 * and contexts whose backend has no NCCL transport are refused, naming the
 * backend. tests/test_ring_device.c runs the transport itself on GPUs. */
#include "harness.h"

#include "collective.h"
#include "fa_internal.h"

#include <stdlib.h>
#include <string.h>

FA_TEST(missing_library_is_named) {
    const char *path = "/nonexistent/libnccl-for-flashattn.so.2";
    CHECK(setenv(FA_NCCL_ENV, path, 1) == 0);
    static const fa_collective_vendor vendors[] = {FA_COLLECTIVE_NCCL, FA_COLLECTIVE_RCCL};
    static const char *const names[] = {"NCCL", "RCCL"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(vendors); i++) {
        const fa_nccl_api *api = (const fa_nccl_api *)&api;
        CHECK_FAILS(fa_nccl_load(vendors[i], &api), FA_ERR_BACKEND_UNAVAILABLE, path);
        CHECK_MSG(strstr(fa_last_error(), names[i]) && strstr(fa_last_error(), FA_NCCL_ENV), "message: %s",
                  fa_last_error());
        CHECK(api == NULL);
    }
    /* A failure is not kept: the next call tries again. */
    const fa_nccl_api *api = NULL;
    CHECK_STATUS(fa_nccl_load(FA_COLLECTIVE_NCCL, &api), FA_ERR_BACKEND_UNAVAILABLE);
    CHECK_STATUS(fa_nccl_load((fa_collective_vendor)5, &api), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_nccl_load(FA_COLLECTIVE_NCCL, NULL), FA_ERR_NULL_POINTER);
}

/* A library that opens but is no NCCL: the first entry point it lacks. */
FA_TEST(missing_entry_point_is_named) {
    CHECK(setenv(FA_NCCL_ENV, "libm.so.6", 1) == 0);
    const fa_nccl_api *api = NULL;
    CHECK_FAILS(fa_nccl_load(FA_COLLECTIVE_RCCL, &api), FA_ERR_BACKEND_UNAVAILABLE, "ncclGetErrorString");
    CHECK_MSG(strstr(fa_last_error(), "RCCL") != NULL, "message: %s", fa_last_error());
    CHECK(api == NULL);
}

/* NCCL where it is installed (the CUDA toolkit's, here): every entry point
 * resolves, ncclCommInitAll too, and the table is kept. */
FA_TEST(nccl_loads_where_installed) {
    unsetenv(FA_NCCL_ENV);
    const fa_nccl_api *api = NULL;
    static char reason[1024];
    if (fa_nccl_load(FA_COLLECTIVE_NCCL, &api) != FA_SUCCESS) {
        snprintf(reason, sizeof reason, "no NCCL here: %s", fa_last_error());
        FA_SKIP(reason);
    }
    CHECK(api && api->ncclSend && api->ncclRecv && api->ncclAllReduce && api->ncclGroupStart && api->ncclGroupEnd &&
          api->ncclCommCount && api->ncclCommUserRank && api->ncclGetErrorString);
    CHECK(api && api->ncclCommInitAll && api->ncclCommDestroy && api->ncclCommCuDevice);
    if (!api) return;
    CHECK(strcmp(api->name, "NCCL") == 0);
    const char *text = api->ncclGetErrorString(FA_NCCL_INVALID_ARGUMENT);
    CHECK_MSG(text && text[0], "ncclGetErrorString(ncclInvalidArgument) is empty");
    CHECK_FAILS(fa_nccl_error(api, FA_NCCL_INVALID_ARGUMENT, "ncclSend"), FA_ERR_INVALID_ARGUMENT, "ncclSend");
    CHECK_FAILS(fa_nccl_error(api, FA_NCCL_IN_PROGRESS, "ncclGroupEnd"), FA_ERR_UNSUPPORTED, "blocking");
    CHECK_FAILS(fa_nccl_error(api, 2, "ncclRecv"), FA_ERR_LAUNCH, "NCCL error 2");
    CHECK_OK(fa_nccl_error(api, FA_NCCL_SUCCESS, "ncclRecv"));
    /* Kept: another name in the variable no longer matters. */
    CHECK(setenv(FA_NCCL_ENV, "/nonexistent/libnccl.so.2", 1) == 0);
    const fa_nccl_api *again = NULL;
    CHECK_OK(fa_nccl_load(FA_COLLECTIVE_NCCL, &again));
    CHECK(again == api);
}

FA_TEST(other_backends_refuse) {
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(FA_BACKEND_REFERENCE, 0, &ctx));
    if (!ctx) return;
    fa_transport t;
    int comm = 0;
    CHECK_FAILS(fa_nccl_transport(ctx, &comm, &t), FA_ERR_UNSUPPORTED, "reference");
    CHECK_FAILS(fa_nccl_transport(ctx, NULL, &t), FA_ERR_NULL_POINTER, "nccl_comm");
    CHECK_FAILS(fa_nccl_transport(ctx, &comm, NULL), FA_ERR_NULL_POINTER, "transport");
    CHECK_FAILS(fa_nccl_transport(NULL, &comm, &t), FA_ERR_NULL_POINTER, "ctx");
    fa_context_destroy(ctx);
    /* OpenCL, where a device is found. */
    if (fa_context_create(FA_BACKEND_OPENCL, 0, &ctx) == FA_SUCCESS) {
        CHECK_FAILS(fa_nccl_transport(ctx, &comm, &t), FA_ERR_UNSUPPORTED, "opencl");
        fa_context_destroy(ctx);
    } else {
        printf("no OpenCL context here: %s\n", fa_last_error());
    }
}

FA_TEST_MAIN(FA_CASE(missing_library_is_named), FA_CASE(missing_entry_point_is_named),
             FA_CASE(nccl_loads_where_installed), FA_CASE(other_backends_refuse))
