/* NCCL and RCCL loaded at run time (collective.h), and the entry point of
 * fa_comm_create_nccl. */
#include "collective.h"

#include "backend.h"
#include "dynlib.h"
#include "fa_internal.h"
#include "plan.h"

#include <pthread.h>
#include <string.h>

static const char *const nccl_names[] = {"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2", NULL};
static const char *const rccl_names[] = {"librccl.so.1", "librccl.so", "/opt/rocm/lib/librccl.so.1", NULL};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static fa_nccl_api loaded[2];
static int is_loaded[2];

/* The entry points from lib; 0 and the reason when a required one is
 * missing. */
static int resolve(void *lib, fa_nccl_api *api, char *why, size_t why_size) {
#define FA_NCCL_LOAD(name, ret, args) \
    if (!fa_dynlib_load(lib, #name, NULL, &api->name, why, why_size)) return 0;
    FA_NCCL_REQUIRED(FA_NCCL_LOAD)
#undef FA_NCCL_LOAD
    char unused[256];
#define FA_NCCL_LOAD_OPTIONAL(name, ret, args) (void)fa_dynlib_load(lib, #name, NULL, &api->name, unused, sizeof unused);
    FA_NCCL_OPTIONAL(FA_NCCL_LOAD_OPTIONAL)
#undef FA_NCCL_LOAD_OPTIONAL
    return 1;
}

fa_status fa_nccl_load(fa_collective_vendor vendor, const fa_nccl_api **api) {
    if (!api) return fa_fail(FA_ERR_NULL_POINTER, "api is NULL");
    *api = NULL;
    if (vendor != FA_COLLECTIVE_NCCL && vendor != FA_COLLECTIVE_RCCL)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "vendor = %d is not a fa_collective_vendor", (int)vendor);
    const char *name = vendor == FA_COLLECTIVE_NCCL ? "NCCL" : "RCCL";
    fa_status st = FA_SUCCESS;
    pthread_mutex_lock(&load_lock);
    if (!is_loaded[vendor]) {
        const char *override_list[2];
        const char *const *names =
            fa_dynlib_names(FA_NCCL_ENV, vendor == FA_COLLECTIVE_NCCL ? nccl_names : rccl_names, override_list);
        char why[2048];
        fa_nccl_api table;
        memset(&table, 0, sizeof table);
        void *lib = fa_dynlib_open(names, why, sizeof why);
        if (lib && resolve(lib, &table, why, sizeof why)) {
            table.name = name;
            loaded[vendor] = table;
            is_loaded[vendor] = 1;
        } else {
            /* A library without the entry points is named by the loader's
             * message; one that did not open, by each name tried. */
            if (lib) fa_dynlib_close(lib);
            st = fa_fail(FA_ERR_BACKEND_UNAVAILABLE, "%s could not be loaded: %s (install it or set " FA_NCCL_ENV
                         " to its path)",
                         name, why);
        }
    }
    if (is_loaded[vendor]) *api = &loaded[vendor];
    pthread_mutex_unlock(&load_lock);
    return st;
}

fa_status fa_nccl_error(const fa_nccl_api *api, int result, const char *what) {
    if (result == FA_NCCL_SUCCESS) return FA_SUCCESS;
    const char *text = api->ncclGetErrorString(result);
    if (result == FA_NCCL_IN_PROGRESS)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "%s: %s answered ncclInProgress: the transport takes blocking communicators only (%s)", what,
                       api->name, text ? text : "no text");
    const fa_status status =
        result == FA_NCCL_INVALID_ARGUMENT || result == FA_NCCL_INVALID_USAGE ? FA_ERR_INVALID_ARGUMENT : FA_ERR_LAUNCH;
    return fa_fail(status, "%s: %s error %d: %s", what, api->name, result, text ? text : "no text");
}

fa_status fa_nccl_transport(fa_context ctx, void *nccl_comm, fa_transport *transport) {
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!nccl_comm) return fa_fail(FA_ERR_NULL_POINTER, "nccl_comm is NULL");
    if (!transport) return fa_fail(FA_ERR_NULL_POINTER, "transport is NULL");
    memset(transport, 0, sizeof *transport);
    if (!ctx->ops->transport_nccl)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the %s backend has no NCCL or RCCL transport: fa_comm_create_nccl needs a CUDA or HIP "
                       "context (fa_comm_create takes a transport of the caller's own)",
                       ctx->ops->name);
    return ctx->ops->transport_nccl(ctx->impl, nccl_comm, transport);
}
