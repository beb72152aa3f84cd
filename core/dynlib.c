/* Vendor runtimes are opened by name at run time. A library is tried under
 * several names (the unversioned development link is often missing on user
 * machines, the versioned one on others), and when none opens the caller gets
 * every loader message: "libcuda.so.1: cannot open shared object file" for
 * each name says more than the last one alone.
 *
 * dlsym returns void *, and ISO C has no conversion from an object pointer to
 * a function pointer; callers copy the returned pointer into a function
 * pointer with memcpy (or through a union), which stays clean under
 * -Wpedantic. */
#include "dynlib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tables filled by fa_dynlib_load hold function pointers; POSIX gives
 * them the representation of void *, which the memcpy below relies on. */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "function and object pointers differ in size");

/* Appends text to reason, truncating (never overflowing) when it is full. */
static void reason_append(char *reason, size_t reason_size, const char *text) {
    if (!reason || reason_size == 0) return;
    size_t used = strnlen(reason, reason_size);
    if (used >= reason_size - 1) return;
    snprintf(reason + used, reason_size - used, "%s", text);
}

static void reason_reset(char *reason, size_t reason_size) {
    if (reason && reason_size > 0) reason[0] = '\0';
}

void *fa_dynlib_open(const char *const *names, char *reason, size_t reason_size) {
    reason_reset(reason, reason_size);
    if (!names || !names[0]) {
        reason_append(reason, reason_size, "no library names given");
        return NULL;
    }
    for (size_t i = 0; names[i]; i++) {
        /* RTLD_LOCAL keeps one vendor's symbols from resolving another's
         * (OpenCL ICDs and CUDA both export generic-sounding names). */
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            reason_reset(reason, reason_size);
            return lib;
        }
        const char *err = dlerror();
        if (i > 0) reason_append(reason, reason_size, "; ");
        reason_append(reason, reason_size, names[i]);
        reason_append(reason, reason_size, ": ");
        reason_append(reason, reason_size, err ? err : "cannot be opened");
    }
    return NULL;
}

void *fa_dynlib_symbol(void *lib, const char *name, char *reason, size_t reason_size) {
    reason_reset(reason, reason_size);
    if (!lib || !name) {
        reason_append(reason, reason_size, !lib ? "library handle is NULL" : "symbol name is NULL");
        return NULL;
    }
    /* Clear any stale message so the one read below belongs to this call. */
    (void)dlerror();
    void *sym = dlsym(lib, name);
    if (sym) return sym;
    /* A symbol whose value is NULL is as useless to callers as a missing one. */
    const char *err = dlerror();
    reason_append(reason, reason_size, "symbol ");
    reason_append(reason, reason_size, name);
    reason_append(reason, reason_size, ": ");
    reason_append(reason, reason_size, err ? err : "resolves to NULL");
    return NULL;
}

void fa_dynlib_close(void *lib) {
    if (lib) dlclose(lib);
}

const char *const *fa_dynlib_names(const char *env_name, const char *const *defaults,
                                   const char **override_list) {
    const char *env = getenv(env_name);
    if (env && env[0]) {
        override_list[0] = env;
        override_list[1] = NULL;
        return override_list;
    }
    return defaults;
}

int fa_dynlib_load(void *lib, const char *name, const char *alternative, void *slot, char *reason,
                   size_t reason_size) {
    void *sym = fa_dynlib_symbol(lib, name, reason, reason_size);
    if (!sym && alternative) sym = fa_dynlib_symbol(lib, alternative, reason, reason_size);
    if (!sym) return 0;
    memcpy(slot, &sym, sizeof sym);
    return 1;
}

int fa_lazy_library_load(fa_lazy_library *l, const char *env_name, const char *const *defaults,
                         int (*resolve)(void *lib, char *reason, size_t reason_size), char *reason,
                         size_t reason_size) {
    pthread_mutex_lock(&l->lock);
    if (!l->handle) {
        const char *override_list[2];
        void *lib = fa_dynlib_open(fa_dynlib_names(env_name, defaults, override_list), reason, reason_size);
        if (lib && resolve(lib, reason, reason_size))
            l->handle = lib;
        else
            fa_dynlib_close(lib);
    }
    const int loaded = l->handle != NULL;
    pthread_mutex_unlock(&l->lock);
    return loaded;
}

int fa_lazy_library_loaded(fa_lazy_library *l) {
    pthread_mutex_lock(&l->lock);
    const int loaded = l->handle != NULL;
    pthread_mutex_unlock(&l->lock);
    return loaded;
}
