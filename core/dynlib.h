/* Run-time loading of vendor libraries, so that one build runs on machines
 * with any subset of the vendor runtimes. */
#ifndef FA_DYNLIB_H
#define FA_DYNLIB_H

#include <pthread.h>
#include <stddef.h>

/* Open the first library of a NULL-terminated list of names; on failure
 * return NULL and write every dlerror() seen into reason. */
void *fa_dynlib_open(const char *const *names, char *reason, size_t reason_size);
/* A symbol, or NULL (and the reason) when missing. */
void *fa_dynlib_symbol(void *lib, const char *name, char *reason, size_t reason_size);
void fa_dynlib_close(void *lib);

/* The names to try: the library named by environment variable env_name when
 * set and non-empty (stored in override_list, which must hold two entries),
 * else defaults. */
const char *const *fa_dynlib_names(const char *env_name, const char *const *defaults,
                                   const char **override_list);
/* Fills the function-pointer slot (of pointer size) with symbol name, or with
 * alternative (may be NULL) when name is missing. Returns 0 and the loader's
 * reason for the last name tried when neither resolves. */
int fa_dynlib_load(void *lib, const char *name, const char *alternative, void *slot, char *reason,
                   size_t reason_size);

/* A library opened on first use and kept for the process once every
 * symbol it must give resolves; a failure is not remembered (the library
 * may appear, or the environment change). */
typedef struct fa_lazy_library {
    pthread_mutex_t lock;
    void *handle;
} fa_lazy_library;
#define FA_LAZY_LIBRARY_INIT {PTHREAD_MUTEX_INITIALIZER, NULL}

/* Under l's lock, unless loaded already: opens the library named by
 * env_name or else defaults (fa_dynlib_names) and hands it to resolve,
 * which fills the caller's table and returns 0 (with the reason) when a
 * symbol is missing. Returns 1 once loaded; 0 with the reason, the library
 * closed, otherwise. */
int fa_lazy_library_load(fa_lazy_library *l, const char *env_name, const char *const *defaults,
                         int (*resolve)(void *lib, char *reason, size_t reason_size), char *reason,
                         size_t reason_size);
/* Whether l has loaded. */
int fa_lazy_library_loaded(fa_lazy_library *l);

#endif
