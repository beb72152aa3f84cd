/* The kernel-binary cache (see kcache.h for the contract).
 *
 * Entry file "<backend>-<hash of key text>.bin", integers little-endian:
 *
 *   "FAKC"  format version (u32)  key length (u64)  key text
 *   payload size (u64)  payload checksum (u64)  payload
 *
 * The file name is only a hint: the full key text stored inside is compared
 * with the expected one, so a collision of the 64-bit name hash (or a file
 * copied from another machine) is a miss, never a wrong binary. The exact
 * file size is implied by the header, which catches truncation before the
 * checksum is even computed. */
#include "kcache.h"

#include "fa_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KC_MAGIC "FAKC"
#define KC_VERSION 1u
/* magic + version + key length, and payload size + checksum. */
#define KC_HEAD_SIZE 16u
#define KC_MID_SIZE 16u
#define KC_PATH_MAX 4096

/* Different seeds keep the name hash and the payload checksum independent. */
#define KC_SEED_NAME UINT64_C(0x6b63616368656e6d)
#define KC_SEED_PAYLOAD UINT64_C(0x6b63616368657061)

#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x00000100000001b3)

uint64_t fa_hash64(const void *data, size_t size, uint64_t seed) {
    uint64_t h = FNV_OFFSET;
    /* The seed goes in byte by byte, low byte first, so the hash is the same
     * on every host whatever its endianness. */
    for (int i = 0; i < 8; i++) {
        h ^= (seed >> (8 * i)) & 0xffu;
        h *= FNV_PRIME;
    }
    const unsigned char *p = data;
    for (size_t i = 0; i < size; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* ------------------------------------------------------------------------ */
/* Directory                                                                */

typedef enum kc_dir_state { KC_DIR_ON, KC_DIR_OFF, KC_DIR_NONE } kc_dir_state;

static int is_off(const char *v) {
    static const char off[] = "off";
    for (size_t i = 0; i < sizeof off; i++) {
        char c = v[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != off[i]) return 0;
    }
    return 1;
}

/* The environment is read again on every call: it is a handful of getenv
 * calls, cheap next to any compile, and lets a process (or a test) move or
 * disable the cache at any time. */
static kc_dir_state resolve_dir(char *buf, size_t cap) {
    const char *base = getenv("FLASHATTN_CACHE_DIR");
    const char *suffix = "";
    if (base && *base) {
        if (is_off(base)) return KC_DIR_OFF;
    } else {
        base = getenv("XDG_CACHE_HOME");
        /* The XDG specification says relative values are to be ignored. */
        if (base && base[0] == '/') {
            suffix = "/flashattn";
        } else {
            base = getenv("HOME");
            if (!base || !*base) return KC_DIR_NONE;
            suffix = "/.cache/flashattn";
        }
    }
    size_t len = strlen(base);
    while (len > 1 && base[len - 1] == '/') len--;
    int n = snprintf(buf, cap, "%.*s%s", (int)len, base, suffix);
    if (n < 0 || (size_t)n >= cap) return KC_DIR_NONE;
    return KC_DIR_ON;
}

const char *fa_kcache_dir(void) {
    static _Thread_local char dir[KC_PATH_MAX];
    return resolve_dir(dir, sizeof dir) == KC_DIR_ON ? dir : NULL;
}

/* mkdir -p: every missing component is created; one that another process
 * creates at the same moment is fine. */
static int make_dirs(char *path) {
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        int rc = mkdir(path, 0755);
        int err = errno;
        *p = saved;
        if (rc != 0 && err != EEXIST) {
            errno = err;
            return -1;
        }
        if (saved == '\0') break;
    }
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Keys                                                                     */

typedef struct kc_entry {
    char *key_text;
    size_t key_size;
    char path[KC_PATH_MAX];
} kc_entry;

static fa_status check_key(const fa_kcache_key *key) {
    if (!key) return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: key is NULL");
    if (!key->backend) return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: key->backend is NULL");
    if (!key->source && key->source_size > 0)
        return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: key->source is NULL");
    if (!key->device) return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: key->device is NULL");
    if (!key->driver) return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: key->driver is NULL");
    /* The backend name becomes part of a file name. */
    const char *b = key->backend;
    if (!*b || strlen(b) > 32)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "kernel cache: key->backend \"%s\" is not 1 to 32 characters", b);
    for (; *b; b++) {
        char c = *b;
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "kernel cache: key->backend \"%s\" may hold only a-z, 0-9 and _", key->backend);
    }
    return FA_SUCCESS;
}

/* Each field as "<length>:<bytes>\n": length prefixes make the joined text
 * unambiguous whatever the fields contain. The source enters by hash and
 * size, which keeps entries small and the key readable in a hex dump. */
static size_t append_field(char *out, const char *text, size_t len) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "%zu:", len);
    if (out) {
        memcpy(out, prefix, (size_t)n);
        if (len) memcpy(out + n, text, len);
        out[(size_t)n + len] = '\n';
    }
    return (size_t)n + len + 1;
}

static fa_status build_entry(const fa_kcache_key *key, const char *dir, kc_entry *e) {
    char source[64];
    uint64_t source_hash = fa_hash64(key->source, key->source_size, 0);
    snprintf(source, sizeof source, "fnv64=%016llx size=%zu", (unsigned long long)source_hash,
             key->source_size);
    const char *options = key->options ? key->options : "";
    const char *fields[5] = {key->backend, source, options, key->device, key->driver};
    size_t lens[5];
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        lens[i] = strlen(fields[i]);
        total += append_field(NULL, fields[i], lens[i]);
    }
    e->key_text = malloc(total);
    if (!e->key_text)
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "kernel cache: no memory for a %zu-byte key", total);
    size_t at = 0;
    for (int i = 0; i < 5; i++) at += append_field(e->key_text + at, fields[i], lens[i]);
    e->key_size = total;
    uint64_t name_hash = fa_hash64(e->key_text, e->key_size, KC_SEED_NAME);
    int n = snprintf(e->path, sizeof e->path, "%s/%s-%016llx.bin", dir, key->backend,
                     (unsigned long long)name_hash);
    if (n < 0 || (size_t)n >= sizeof e->path) {
        /* No message here: for a load this is a plain miss. */
        free(e->key_text);
        e->key_text = NULL;
        return FA_ERR_IO;
    }
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Byte order and plain IO                                                  */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int read_all(int fd, void *buf, size_t size) {
    unsigned char *p = buf;
    while (size > 0) {
        ssize_t n = read(fd, p, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t size) {
    const unsigned char *p = buf;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;
            return -1;
        }
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Load                                                                     */

/* Removes a bad entry, but only if the path still names the file that was
 * read: another process may have renamed a good entry into place since, and
 * that one must survive. */
static void discard(const char *path, const struct stat *read_st) {
    struct stat now;
    if (stat(path, &now) == 0 && now.st_dev == read_st->st_dev && now.st_ino == read_st->st_ino)
        unlink(path);
}

/* Verifies an open entry; on success *data holds the malloc'ed payload.
 * Returns 1 for a good entry, 0 for a bad one, -1 when memory ran out. */
static int read_entry(int fd, const struct stat *st, const kc_entry *e, void **data, size_t *size) {
    unsigned char head[KC_HEAD_SIZE], mid[KC_MID_SIZE];
    uint64_t file_size = (uint64_t)st->st_size;
    if (!S_ISREG(st->st_mode) || file_size < KC_HEAD_SIZE + KC_MID_SIZE) return 0;
    if (read_all(fd, head, sizeof head) != 0) return 0;
    if (memcmp(head, KC_MAGIC, 4) != 0 || get_u32(head + 4) != KC_VERSION) return 0;
    uint64_t key_size = get_u64(head + 8);
    if (key_size != e->key_size) return 0;
    if (file_size - KC_HEAD_SIZE - KC_MID_SIZE < key_size) return 0;

    char *stored_key = malloc(e->key_size);
    if (!stored_key) return -1;
    int key_ok = read_all(fd, stored_key, e->key_size) == 0 &&
                 memcmp(stored_key, e->key_text, e->key_size) == 0;
    free(stored_key);
    if (!key_ok) return 0;

    if (read_all(fd, mid, sizeof mid) != 0) return 0;
    uint64_t payload_size = get_u64(mid);
    uint64_t checksum = get_u64(mid + 8);
    if (payload_size != file_size - KC_HEAD_SIZE - KC_MID_SIZE - key_size) return 0;
    if (payload_size > SIZE_MAX - 1) return 0;

    /* One extra byte so a zero-length payload still gets a unique pointer. */
    unsigned char *payload = malloc((size_t)payload_size + 1);
    if (!payload) return -1;
    if (read_all(fd, payload, (size_t)payload_size) != 0 ||
        fa_hash64(payload, (size_t)payload_size, KC_SEED_PAYLOAD) != checksum) {
        free(payload);
        return 0;
    }
    /* A file that grew after fstat is being rewritten under us: not trusted. */
    unsigned char extra;
    if (read(fd, &extra, 1) != 0) {
        free(payload);
        return 0;
    }
    *data = payload;
    *size = (size_t)payload_size;
    return 1;
}

fa_status fa_kcache_load(const fa_kcache_key *key, void **data, size_t *size) {
    if (!data) return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: data is NULL");
    if (!size) return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: size is NULL");
    *data = NULL;
    *size = 0;
    FA_CHECK(check_key(key));

    char dir[KC_PATH_MAX];
    if (resolve_dir(dir, sizeof dir) != KC_DIR_ON) return FA_ERR_IO;
    kc_entry e;
    /* A directory path too long to use (FA_ERR_IO) is a miss like any other. */
    FA_CHECK(build_entry(key, dir, &e));

    fa_status result = FA_ERR_IO;
    int fd = open(e.path, O_RDONLY);
    if (fd >= 0) {
        struct stat fst;
        if (fstat(fd, &fst) == 0) {
            int r = read_entry(fd, &fst, &e, data, size);
            if (r > 0)
                result = FA_SUCCESS;
            else if (r < 0)
                result = fa_fail(FA_ERR_OUT_OF_MEMORY, "kernel cache: no memory to read %s", e.path);
            else
                discard(e.path, &fst);
        }
        close(fd);
    }
    free(e.key_text);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Store                                                                    */

static atomic_uint_fast64_t kc_tmp_counter;

/* strerror may share one buffer between threads; strerror_r does not. */
static const char *error_text(int err, char *buf, size_t cap) {
    if (strerror_r(err, buf, cap) != 0) snprintf(buf, cap, "error %d", err);
    return buf;
}

/* Opens a fresh temporary file beside the entry. The name mixes the pid, a
 * per-process counter and a hash of the clock, so threads and processes
 * never share one; O_EXCL makes sure of it. */
static int open_temp(const char *entry_path, char *tmp, size_t cap) {
    for (int attempt = 0; attempt < 16; attempt++) {
        uint64_t count = atomic_fetch_add(&kc_tmp_counter, 1);
        struct timespec ts;
        timespec_get(&ts, TIME_UTC);
        uint64_t mix[4] = {(uint64_t)getpid(), count, (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec};
        uint64_t noise = fa_hash64(mix, sizeof mix, (uint64_t)(uintptr_t)&mix);
        int n = snprintf(tmp, cap, "%s.tmp.%ld.%llu.%08lx", entry_path, (long)getpid(),
                         (unsigned long long)count, (unsigned long)(noise & 0xffffffffu));
        if (n < 0 || (size_t)n >= cap) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

fa_status fa_kcache_store(const fa_kcache_key *key, const void *data, size_t size) {
    if (!data && size > 0) return fa_fail(FA_ERR_NULL_POINTER, "kernel cache: data is NULL");
    FA_CHECK(check_key(key));

    char dir[KC_PATH_MAX], why[128];
    kc_dir_state ds = resolve_dir(dir, sizeof dir);
    if (ds == KC_DIR_OFF) return FA_SUCCESS;
    if (ds == KC_DIR_NONE)
        return fa_fail(FA_ERR_IO, "kernel cache: no usable directory (set FLASHATTN_CACHE_DIR, "
                                  "XDG_CACHE_HOME or HOME, or FLASHATTN_CACHE_DIR=off)");
    kc_entry e;
    fa_status built = build_entry(key, dir, &e);
    if (built == FA_ERR_IO) return fa_fail(FA_ERR_IO, "kernel cache: directory path %s is too long", dir);
    FA_CHECK(built);

    char tmp[KC_PATH_MAX + 64];
    int fd = open_temp(e.path, tmp, sizeof tmp);
    if (fd < 0 && errno == ENOENT) {
        /* First store into this directory. */
        if (make_dirs(dir) != 0) {
            int err = errno;
            free(e.key_text);
            return fa_fail(FA_ERR_IO, "kernel cache: cannot create directory %s: %s", dir,
                           error_text(err, why, sizeof why));
        }
        fd = open_temp(e.path, tmp, sizeof tmp);
    }
    if (fd < 0) {
        int err = errno;
        free(e.key_text);
        return fa_fail(FA_ERR_IO, "kernel cache: cannot create a file in %s: %s", dir,
                       error_text(err, why, sizeof why));
    }

    unsigned char head[KC_HEAD_SIZE], mid[KC_MID_SIZE];
    memcpy(head, KC_MAGIC, 4);
    put_u32(head + 4, KC_VERSION);
    put_u64(head + 8, (uint64_t)e.key_size);
    put_u64(mid, (uint64_t)size);
    put_u64(mid + 8, fa_hash64(data, size, KC_SEED_PAYLOAD));

    int ok = write_all(fd, head, sizeof head) == 0 && write_all(fd, e.key_text, e.key_size) == 0 &&
             write_all(fd, mid, sizeof mid) == 0 && write_all(fd, data, size) == 0;
    int err = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    /* rename() replaces any existing entry atomically: readers see the old
     * file or the new one, never a mix. */
    if (ok && rename(tmp, e.path) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        fa_status failed = fa_fail(FA_ERR_IO, "kernel cache: cannot write %s: %s", e.path,
                                   error_text(err, why, sizeof why));
        free(e.key_text);
        return failed;
    }
    free(e.key_text);
    return FA_SUCCESS;
}
