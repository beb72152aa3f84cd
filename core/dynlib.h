/* Run-time loading of vendor libraries, so that one build runs on machines
 * with any subset of the vendor runtimes. */
#ifndef FA_DYNLIB_H
#define FA_DYNLIB_H

#include <stddef.h>

/* Open the first library of a NULL-terminated list of names; on failure
 * return NULL and write every dlerror() seen into reason. */
void *fa_dynlib_open(const char *const *names, char *reason, size_t reason_size);
/* A symbol, or NULL (and the reason) when missing. */
void *fa_dynlib_symbol(void *lib, const char *name, char *reason, size_t reason_size);
void fa_dynlib_close(void *lib);

#endif
