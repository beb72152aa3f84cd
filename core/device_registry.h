/* The devices of a GPU runtime: discovered once, on first use from any
 * thread, and read-only afterwards. A backend's discovery function fills a
 * registry and marks it ready; until it does, the registry is unavailable
 * and its reason says why. */
#ifndef FA_DEVICE_REGISTRY_H
#define FA_DEVICE_REGISTRY_H

#include "flashattn.h"

#include <pthread.h>
#include <stddef.h>

#define FA_REGISTRY_MAX_DEVICES 64
#define FA_REGISTRY_REASON_SIZE 2048

typedef struct fa_device_registry {
    pthread_once_t once;
    void (*discover)(void); /* run once; writes reason, or devices then fa_registry_ready */
    const char *runtime;    /* "CUDA", "HIP": names the backend in messages */
    fa_status status;
    char reason[FA_REGISTRY_REASON_SIZE];
    int total;
    fa_device_info devices[FA_REGISTRY_MAX_DEVICES];
} fa_device_registry;

#define FA_DEVICE_REGISTRY_INIT(runtime_name, discover_fn)                                         \
    {                                                                                              \
        .once = PTHREAD_ONCE_INIT, .discover = (discover_fn), .runtime = (runtime_name),           \
        .status = FA_ERR_BACKEND_UNAVAILABLE                                                        \
    }

/* Runs discovery unless it has run. */
void fa_registry_discover(fa_device_registry *r);
/* For discovery: count devices are described in devices[]. */
void fa_registry_ready(fa_device_registry *r, int count);
/* The backend's init: its status, and the reason ("" when usable). */
fa_status fa_registry_init(fa_device_registry *r, char *reason, size_t reason_size);
int fa_registry_count(fa_device_registry *r);
fa_status fa_registry_unavailable(const fa_device_registry *r);
/* FA_SUCCESS when the registry is usable and index names one of its devices. */
fa_status fa_registry_check(fa_device_registry *r, int index);
fa_status fa_registry_info(fa_device_registry *r, int index, fa_device_info *info);

#endif
