/* The on-disk cache of compiled kernel binaries.
 *
 * An entry is keyed by everything that changes the binary: the backend, the
 * hash of the kernel source, the build options, the device name and the
 * driver version. Each entry stores its full key and a checksum of the
 * payload; an entry whose key or checksum does not match (corrupt, truncated,
 * stale) is removed and reported as a miss, never returned. Writes go to a
 * temporary file renamed into place, so concurrent processes never see half
 * an entry.
 *
 * Location: $FLASHATTN_CACHE_DIR if set (the value "off" disables the cache),
 * else $XDG_CACHE_HOME/flashattn, else $HOME/.cache/flashattn. */
#ifndef FA_KCACHE_H
#define FA_KCACHE_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

typedef struct fa_kcache_key {
    const char *backend;        /* "opencl", "cuda", "hip" */
    const char *source;         /* full kernel source text */
    size_t source_size;
    const char *options;        /* build options, "" if none */
    const char *device;         /* device name and architecture */
    const char *driver;         /* driver / runtime version */
} fa_kcache_key;

/* 64-bit FNV-1a, also used for source hashes in plan descriptions. */
uint64_t fa_hash64(const void *data, size_t size, uint64_t seed);

/* Directory in use (NULL when the cache is off). */
const char *fa_kcache_dir(void);

/* On a hit, *data is malloc'ed (caller frees) and FA_SUCCESS is returned;
 * a miss returns FA_ERR_IO without recording an error message. */
fa_status fa_kcache_load(const fa_kcache_key *key, void **data, size_t *size);
fa_status fa_kcache_store(const fa_kcache_key *key, const void *data, size_t size);

#endif
