/* The on-disk kernel-binary cache: hits return exactly what was stored, and
 * anything else (other key, corrupt, truncated, colliding entry) is a miss
 * that removes the bad file. Each case works in its own fresh directory. */
#include "fa_internal.h"
#include "harness.h"
#include "kcache.h"
#include "test_util.h"

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PATH_CAP 1024

/* snprintf that treats truncation as a test failure. */
static void sfmt(char *buf, size_t cap, const char *fmt, ...) FA_PRINTF(3, 4);
static void sfmt(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    CHECK_MSG(n >= 0 && (size_t)n < cap, "text truncated: %s", buf);
}

/* ------------------------------------------------------------------------ */
/* Scratch directories                                                      */

static char scratch[PATH_CAP];
static char cache_dir[PATH_CAP];

static void rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        /* Make it writable again first: a case may have locked it. */
        chmod(path, 0700);
        DIR *d = opendir(path);
        if (d) {
            struct dirent *ent;
            while ((ent = readdir(d)) != NULL) {
                if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) continue;
                char child[PATH_CAP];
                sfmt(child, sizeof child, "%s/%s", path, ent->d_name);
                rm_rf(child);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* A fresh scratch directory; the cache lives in scratch/sub (not yet
 * created, so the first store must create it). */
static int begin_case(const char *sub) {
    sfmt(scratch, sizeof scratch, "/tmp/fa-kcache-XXXXXX");
    if (!mkdtemp(scratch)) {
        CHECK_MSG(0, "mkdtemp failed: %s", strerror(errno));
        return 0;
    }
    sfmt(cache_dir, sizeof cache_dir, "%s/%s", scratch, sub);
    CHECK(setenv("FLASHATTN_CACHE_DIR", cache_dir, 1) == 0);
    return 1;
}

static void end_case(void) { rm_rf(scratch); }

/* Number of directory entries (other than . and ..) in dir; the name of the
 * last one seen goes to last (if given). */
static int count_files(const char *dir, char *last, size_t last_cap) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) continue;
        n++;
        if (last) sfmt(last, last_cap, "%s", ent->d_name);
    }
    closedir(d);
    return n;
}

/* Path of the single entry in the cache directory ("" when not exactly one). */
static void only_entry(char *path, size_t cap) {
    char name[256];
    int n = count_files(cache_dir, name, sizeof name);
    CHECK_MSG(n == 1, "expected one file in the cache, found %d", n);
    if (n == 1)
        sfmt(path, cap, "%s/%s", cache_dir, name);
    else
        path[0] = '\0';
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int flip_byte(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int rc = -1;
    if (fseek(f, offset, SEEK_SET) == 0) {
        int c = fgetc(f);
        if (c != EOF && fseek(f, offset, SEEK_SET) == 0 && fputc(c ^ 0x20, f) != EOF) rc = 0;
    }
    if (fclose(f) != 0) rc = -1;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Keys and payloads                                                        */

typedef struct test_key {
    char source[256];
    char options[64];
    char device[64];
    char driver[64];
    char backend[16];
    fa_kcache_key key;
} test_key;

static void make_key(test_key *k, fa_rng *rng) {
    /* A random source, so that no two runs share cache keys by accident. */
    int n = snprintf(k->source, sizeof k->source, "__kernel void fwd(__global float *o) { o[0] = %llu; }\n",
                     (unsigned long long)fa_rng_next(rng));
    sfmt(k->options, sizeof k->options, "-cl-std=CL1.2 -DBR=64 -DBC=32");
    sfmt(k->device, sizeof k->device, "Test GPU gfx%04d", (int)(fa_rng_next(rng) % 10000));
    sfmt(k->driver, sizeof k->driver, "driver 580.%d", (int)(fa_rng_next(rng) % 100));
    sfmt(k->backend, sizeof k->backend, "opencl");
    k->key.backend = k->backend;
    k->key.source = k->source;
    k->key.source_size = (size_t)n;
    k->key.options = k->options;
    k->key.device = k->device;
    k->key.driver = k->driver;
}

/* Points k's key at its own (possibly edited) buffers again after a copy. */
static void rebind(test_key *k) {
    k->key.backend = k->backend;
    k->key.source = k->source;
    k->key.options = k->options;
    k->key.device = k->device;
    k->key.driver = k->driver;
}

static unsigned char *random_bytes(fa_rng *rng, size_t size) {
    unsigned char *p = malloc(size ? size : 1);
    for (size_t i = 0; i < size; i += 8) {
        uint64_t r = fa_rng_next(rng);
        for (size_t j = 0; j < 8 && i + j < size; j++) p[i + j] = (unsigned char)(r >> (8 * j));
    }
    return p;
}

static fa_rng case_rng(uint64_t salt) {
    fa_rng rng;
    fa_rng_seed(&rng, (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20) ^ salt);
    return rng;
}

/* Loads key and compares the hit with expect; reports on failure. */
static int loads_as(const fa_kcache_key *key, const void *expect, size_t expect_size) {
    void *data = NULL;
    size_t size = 0;
    fa_status st = fa_kcache_load(key, &data, &size);
    int ok = st == FA_SUCCESS && data && size == expect_size && memcmp(data, expect, size) == 0;
    free(data);
    return ok;
}

/* A miss: FA_ERR_IO, outputs cleared, and no error message recorded. */
static int misses(const fa_kcache_key *key) {
    void *data = (void *)&data;
    size_t size = 12345;
    fa_fail(FA_ERR_INTERNAL, "sentinel message");
    fa_status st = fa_kcache_load(key, &data, &size);
    int ok = st == FA_ERR_IO && data == NULL && size == 0 && strcmp(fa_last_error(), "sentinel message") == 0;
    if (st == FA_SUCCESS) free(data);
    fa_clear_error();
    return ok;
}

/* ------------------------------------------------------------------------ */
/* Cases                                                                    */

FA_TEST(round_trip) {
    if (!begin_case("nested/dirs/cache")) return;
    fa_rng rng = case_rng(1);
    test_key k;
    make_key(&k, &rng);
    size_t size = 4096 + (size_t)(fa_rng_next(&rng) % 4096);
    unsigned char *payload = random_bytes(&rng, size);

    const char *dir = fa_kcache_dir();
    CHECK(dir != NULL && strcmp(dir, cache_dir) == 0);
    CHECK(!file_exists(cache_dir));
    CHECK(misses(&k.key));

    CHECK_OK(fa_kcache_store(&k.key, payload, size));
    CHECK(file_exists(cache_dir));
    CHECK(loads_as(&k.key, payload, size));
    /* A hit stays a hit. */
    CHECK(loads_as(&k.key, payload, size));

    /* One entry, named <backend>-<16 hex digits>.bin, and no temporary left. */
    char name[256];
    CHECK(count_files(cache_dir, name, sizeof name) == 1);
    CHECK_MSG(strlen(name) == strlen("opencl-") + 16 + strlen(".bin") && strncmp(name, "opencl-", 7) == 0 &&
                  strspn(name + 7, "0123456789abcdef") == 16 && strcmp(name + 23, ".bin") == 0,
              "entry name %s", name);
    struct stat st;
    CHECK(stat(cache_dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0700) == 0700);

    /* Storing again under the same key replaces the entry. */
    unsigned char *other = random_bytes(&rng, size / 2);
    CHECK_OK(fa_kcache_store(&k.key, other, size / 2));
    CHECK(loads_as(&k.key, other, size / 2));
    CHECK(count_files(cache_dir, NULL, 0) == 1);

    /* An empty payload is a valid entry too. */
    CHECK_OK(fa_kcache_store(&k.key, payload, 0));
    void *data = NULL;
    size_t got = 99;
    CHECK_OK(fa_kcache_load(&k.key, &data, &got));
    CHECK(data != NULL && got == 0);
    free(data);

    free(other);
    free(payload);
    end_case();
}

FA_TEST(any_key_field_change_misses) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(2);
    test_key k;
    make_key(&k, &rng);
    size_t size = 1000 + (size_t)(fa_rng_next(&rng) % 1000);
    unsigned char *payload = random_bytes(&rng, size);
    CHECK_OK(fa_kcache_store(&k.key, payload, size));

    test_key v;
    /* Same source size, one byte different. */
    v = k;
    rebind(&v);
    v.source[10] ^= 1;
    CHECK_MSG(misses(&v.key), "changed source byte hit");
    /* Same bytes, one fewer of them. */
    v = k;
    rebind(&v);
    v.key.source_size--;
    CHECK_MSG(misses(&v.key), "shorter source hit");
    v = k;
    rebind(&v);
    sfmt(v.options, sizeof v.options, "%s -DEXTRA", k.options);
    CHECK_MSG(misses(&v.key), "other options hit");
    v = k;
    rebind(&v);
    v.key.options = "";
    CHECK_MSG(misses(&v.key), "empty options hit");
    v = k;
    rebind(&v);
    v.device[strlen(v.device) - 1] ^= 1;
    CHECK_MSG(misses(&v.key), "other device hit");
    v = k;
    rebind(&v);
    sfmt(v.driver, sizeof v.driver, "%s.1", k.driver);
    CHECK_MSG(misses(&v.key), "other driver hit");
    v = k;
    rebind(&v);
    sfmt(v.backend, sizeof v.backend, "cuda");
    CHECK_MSG(misses(&v.key), "other backend hit");
    /* Moving text from one field to the next must not give the same key. */
    v = k;
    rebind(&v);
    sfmt(v.device, sizeof v.device, "%s", k.device + 1);
    sfmt(v.options, sizeof v.options, "%s%c", k.options, k.device[0]);
    CHECK_MSG(misses(&v.key), "shifted field boundary hit");

    /* None of those misses disturbed the real entry. */
    CHECK(loads_as(&k.key, payload, size));
    CHECK(count_files(cache_dir, NULL, 0) == 1);
    free(payload);
    end_case();
}

/* Flips one byte at each interesting place of an entry: magic, version, key
 * length, key text, payload size, checksum, payload (middle and last). */
FA_TEST(corrupt_byte_is_detected_and_removed) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(3);
    test_key k;
    make_key(&k, &rng);
    size_t size = 2048 + (size_t)(fa_rng_next(&rng) % 2048);
    unsigned char *payload = random_bytes(&rng, size);
    CHECK_OK(fa_kcache_store(&k.key, payload, size));
    char path[PATH_CAP];
    only_entry(path, sizeof path);
    long total = file_size(path);
    long header = total - (long)size; /* everything before the payload */
    CHECK(header > 16);
    long offsets[] = {0, 5, 9, 16 + 3, header - 12, header - 3, header + (long)size / 2, total - 1};
    for (size_t i = 0; i < FA_ARRAY_SIZE(offsets); i++) {
        CHECK_OK(fa_kcache_store(&k.key, payload, size));
        CHECK(loads_as(&k.key, payload, size));
        CHECK(flip_byte(path, offsets[i]) == 0);
        CHECK(file_size(path) == total);
        CHECK_MSG(misses(&k.key), "byte %ld of %ld flipped, still a hit", offsets[i], total);
        CHECK_MSG(!file_exists(path), "corrupt entry (byte %ld) not removed", offsets[i]);
    }
    free(payload);
    end_case();
}

FA_TEST(truncated_or_extended_file_misses) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(4);
    test_key k;
    make_key(&k, &rng);
    size_t size = 3000 + (size_t)(fa_rng_next(&rng) % 1000);
    unsigned char *payload = random_bytes(&rng, size);
    CHECK_OK(fa_kcache_store(&k.key, payload, size));
    char path[PATH_CAP];
    only_entry(path, sizeof path);
    long total = file_size(path);
    long lengths[] = {0, 3, 16, total - (long)size - 1, total - (long)size, total - 1};
    for (size_t i = 0; i < FA_ARRAY_SIZE(lengths); i++) {
        CHECK_OK(fa_kcache_store(&k.key, payload, size));
        CHECK(truncate(path, lengths[i]) == 0);
        CHECK_MSG(misses(&k.key), "file cut to %ld of %ld bytes, still a hit", lengths[i], total);
        CHECK_MSG(!file_exists(path), "file cut to %ld bytes not removed", lengths[i]);
    }
    /* Trailing bytes are as suspicious as missing ones. */
    CHECK_OK(fa_kcache_store(&k.key, payload, size));
    FILE *f = fopen(path, "ab");
    CHECK(f != NULL);
    if (f) {
        fputc(0x5a, f);
        fclose(f);
    }
    CHECK(misses(&k.key));
    CHECK(!file_exists(path));
    free(payload);
    end_case();
}

/* An entry that is valid for key A, found under key B's file name (what a
 * collision of the 64-bit name hash would produce), is not B's binary. */
FA_TEST(other_key_under_same_name_misses) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(5);
    test_key a, b;
    make_key(&a, &rng);
    b = a;
    rebind(&b);
    /* Same length as A's key text, so only the text itself tells them apart. */
    b.options[strlen(b.options) - 1] ^= 1;
    size_t size = 512;
    unsigned char *pa = random_bytes(&rng, size);
    unsigned char *pb = random_bytes(&rng, size);

    CHECK_OK(fa_kcache_store(&a.key, pa, size));
    char path_a[PATH_CAP], path_b[PATH_CAP];
    only_entry(path_a, sizeof path_a);
    CHECK_OK(fa_kcache_store(&b.key, pb, size));
    CHECK(count_files(cache_dir, NULL, 0) == 2);
    CHECK(loads_as(&b.key, pb, size));
    /* Find B's file: the one that is not A's. */
    path_b[0] = '\0';
    DIR *d = opendir(cache_dir);
    struct dirent *ent;
    while (d && (ent = readdir(d)) != NULL) {
        char p[PATH_CAP];
        sfmt(p, sizeof p, "%s/%s", cache_dir, ent->d_name);
        if (ent->d_name[0] != '.' && strcmp(p, path_a) != 0) sfmt(path_b, sizeof path_b, "%s", p);
    }
    if (d) closedir(d);
    CHECK(path_b[0] != '\0');

    CHECK(rename(path_a, path_b) == 0);
    CHECK_MSG(misses(&b.key), "A's entry returned for key B");
    CHECK(!file_exists(path_b));
    CHECK(misses(&a.key));
    CHECK(count_files(cache_dir, NULL, 0) == 0);
    free(pa);
    free(pb);
    end_case();
}

FA_TEST(off_disables) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(6);
    test_key k;
    make_key(&k, &rng);
    unsigned char *payload = random_bytes(&rng, 100);
    const char *values[] = {"off", "OFF", "Off"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(values); i++) {
        CHECK(setenv("FLASHATTN_CACHE_DIR", values[i], 1) == 0);
        CHECK(fa_kcache_dir() == NULL);
        CHECK_OK(fa_kcache_store(&k.key, payload, 100));
        CHECK(misses(&k.key));
    }
    /* Nothing was written: neither the would-be directory nor "off" itself. */
    CHECK(!file_exists("off") && !file_exists("OFF") && !file_exists("Off"));
    CHECK(count_files(scratch, NULL, 0) == 0);

    /* Turning it back on needs no restart. */
    CHECK(setenv("FLASHATTN_CACHE_DIR", cache_dir, 1) == 0);
    CHECK_OK(fa_kcache_store(&k.key, payload, 100));
    CHECK(loads_as(&k.key, payload, 100));
    free(payload);
    end_case();
}

static void restore_env(const char *name, const char *saved) {
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
}

FA_TEST(directory_resolution) {
    char *saved_fa = getenv("FLASHATTN_CACHE_DIR") ? strdup(getenv("FLASHATTN_CACHE_DIR")) : NULL;
    char *saved_xdg = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    char *saved_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    const char *dir;

    setenv("FLASHATTN_CACHE_DIR", "/srv/fa-cache", 1);
    setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
    setenv("HOME", "/home/someone", 1);
    dir = fa_kcache_dir();
    CHECK(dir && strcmp(dir, "/srv/fa-cache") == 0);
    setenv("FLASHATTN_CACHE_DIR", "/srv/fa-cache/", 1);
    dir = fa_kcache_dir();
    CHECK(dir && strcmp(dir, "/srv/fa-cache") == 0);

    unsetenv("FLASHATTN_CACHE_DIR");
    dir = fa_kcache_dir();
    CHECK(dir && strcmp(dir, "/xdg/cache/flashattn") == 0);
    /* Empty counts as unset. */
    setenv("FLASHATTN_CACHE_DIR", "", 1);
    dir = fa_kcache_dir();
    CHECK(dir && strcmp(dir, "/xdg/cache/flashattn") == 0);

    unsetenv("XDG_CACHE_HOME");
    dir = fa_kcache_dir();
    CHECK(dir && strcmp(dir, "/home/someone/.cache/flashattn") == 0);
    /* A relative XDG_CACHE_HOME is ignored, as the XDG specification asks. */
    setenv("XDG_CACHE_HOME", "relative/cache", 1);
    dir = fa_kcache_dir();
    CHECK(dir && strcmp(dir, "/home/someone/.cache/flashattn") == 0);

    /* Nowhere to put it: no directory, a load misses, a store fails cleanly. */
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    CHECK(fa_kcache_dir() == NULL);
    fa_rng rng = case_rng(7);
    test_key k;
    make_key(&k, &rng);
    CHECK(misses(&k.key));
    CHECK_STATUS(fa_kcache_store(&k.key, "abc", 3), FA_ERR_IO);
    CHECK(strlen(fa_last_error()) > 0);

    restore_env("FLASHATTN_CACHE_DIR", saved_fa);
    restore_env("XDG_CACHE_HOME", saved_xdg);
    restore_env("HOME", saved_home);
    free(saved_fa);
    free(saved_xdg);
    free(saved_home);
}

FA_TEST(unwritable_directory_fails_cleanly) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(8);
    test_key k;
    make_key(&k, &rng);
    unsigned char *payload = random_bytes(&rng, 256);

    /* A directory below a regular file cannot be created, even by root. */
    char file[PATH_CAP], below[PATH_CAP];
    sfmt(file, sizeof file, "%s/plain-file", scratch);
    FILE *f = fopen(file, "wb");
    CHECK(f != NULL);
    if (f) fclose(f);
    sfmt(below, sizeof below, "%s/sub/cache", file);
    CHECK(setenv("FLASHATTN_CACHE_DIR", below, 1) == 0);
    fa_clear_error();
    CHECK_STATUS(fa_kcache_store(&k.key, payload, 256), FA_ERR_IO);
    CHECK_MSG(strstr(fa_last_error(), "kernel cache") != NULL, "message: %s", fa_last_error());
    CHECK(misses(&k.key));

    /* The cache path is itself a regular file. */
    CHECK(setenv("FLASHATTN_CACHE_DIR", file, 1) == 0);
    CHECK_STATUS(fa_kcache_store(&k.key, payload, 256), FA_ERR_IO);
    CHECK(misses(&k.key));

    /* A read-only directory (root writes anyway, so only checked for others). */
    if (geteuid() != 0) {
        char ro[PATH_CAP];
        sfmt(ro, sizeof ro, "%s/read-only", scratch);
        CHECK(mkdir(ro, 0555) == 0);
        CHECK(setenv("FLASHATTN_CACHE_DIR", ro, 1) == 0);
        CHECK_STATUS(fa_kcache_store(&k.key, payload, 256), FA_ERR_IO);
        CHECK(count_files(ro, NULL, 0) == 0);
        CHECK(misses(&k.key));
    }
    free(payload);
    end_case();
}

#define WRITERS 4
#define ROUNDS 25

typedef struct writer_arg {
    const fa_kcache_key *key;
    const unsigned char *payloads[WRITERS];
    size_t sizes[WRITERS];
    int self;
    int store_failures;
    int bad_hits;
    int hits;
} writer_arg;

/* Stores its own payload over and over, loading in between: every hit must
 * be one writer's payload in full, never a mix or a partial file. */
static void *writer(void *p) {
    writer_arg *w = p;
    for (int r = 0; r < ROUNDS; r++) {
        if (fa_kcache_store(w->key, w->payloads[w->self], w->sizes[w->self]) != FA_SUCCESS)
            w->store_failures++;
        void *data = NULL;
        size_t size = 0;
        if (fa_kcache_load(w->key, &data, &size) == FA_SUCCESS) {
            w->hits++;
            int known = 0;
            for (int i = 0; i < WRITERS; i++)
                if (size == w->sizes[i] && memcmp(data, w->payloads[i], size) == 0) known = 1;
            if (!known) w->bad_hits++;
            free(data);
        }
    }
    return NULL;
}

FA_TEST(concurrent_stores_of_one_key) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(9);
    test_key k;
    make_key(&k, &rng);
    writer_arg args[WRITERS];
    unsigned char *payloads[WRITERS];
    size_t sizes[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        sizes[i] = 20000 + 1000 * (size_t)i + (size_t)(fa_rng_next(&rng) % 1000);
        payloads[i] = random_bytes(&rng, sizes[i]);
    }
    pthread_t threads[WRITERS];
    int started[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        memset(&args[i], 0, sizeof args[i]);
        args[i].key = &k.key;
        for (int j = 0; j < WRITERS; j++) {
            args[i].payloads[j] = payloads[j];
            args[i].sizes[j] = sizes[j];
        }
        args[i].self = i;
        started[i] = pthread_create(&threads[i], NULL, writer, &args[i]) == 0;
        CHECK(started[i]);
    }
    int hits = 0;
    for (int i = 0; i < WRITERS; i++) {
        if (started[i]) pthread_join(threads[i], NULL);
        CHECK_MSG(args[i].store_failures == 0, "writer %d: %d stores failed", i, args[i].store_failures);
        CHECK_MSG(args[i].bad_hits == 0, "writer %d: %d loads returned a wrong payload", i, args[i].bad_hits);
        hits += args[i].hits;
    }
    /* Each thread loads right after its own store, so most loads hit. */
    CHECK_MSG(hits > 0, "no load hit during the concurrent stores");

    /* Afterwards: one loadable entry, holding one writer's payload, and no
     * temporary file left behind. */
    CHECK(count_files(cache_dir, NULL, 0) == 1);
    int matched = 0;
    for (int i = 0; i < WRITERS; i++)
        if (loads_as(&k.key, payloads[i], sizes[i])) matched++;
    CHECK(matched == 1);
    for (int i = 0; i < WRITERS; i++) free(payloads[i]);
    end_case();
}

FA_TEST(large_payload) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(10);
    test_key k;
    make_key(&k, &rng);
    size_t size = (size_t)8 << 20;
    unsigned char *payload = random_bytes(&rng, size);
    CHECK_OK(fa_kcache_store(&k.key, payload, size));
    CHECK(loads_as(&k.key, payload, size));
    char path[PATH_CAP];
    only_entry(path, sizeof path);
    CHECK(file_size(path) > (long)size);
    /* Corruption deep inside a large payload is still caught. */
    CHECK(flip_byte(path, file_size(path) - (long)size + (long)(size / 3)) == 0);
    CHECK(misses(&k.key));
    CHECK(!file_exists(path));
    free(payload);
    end_case();
}

FA_TEST(bad_arguments) {
    if (!begin_case("cache")) return;
    fa_rng rng = case_rng(11);
    test_key k;
    make_key(&k, &rng);
    void *data = NULL;
    size_t size = 0;
    CHECK_STATUS(fa_kcache_load(NULL, &data, &size), FA_ERR_NULL_POINTER);
    CHECK(strstr(fa_last_error(), "key") != NULL);
    CHECK_STATUS(fa_kcache_load(&k.key, NULL, &size), FA_ERR_NULL_POINTER);
    CHECK(strstr(fa_last_error(), "data") != NULL);
    CHECK_STATUS(fa_kcache_load(&k.key, &data, NULL), FA_ERR_NULL_POINTER);
    CHECK(strstr(fa_last_error(), "size") != NULL);
    CHECK_STATUS(fa_kcache_store(NULL, "x", 1), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_kcache_store(&k.key, NULL, 1), FA_ERR_NULL_POINTER);
    CHECK(strstr(fa_last_error(), "data") != NULL);

    test_key v = k;
    rebind(&v);
    v.key.device = NULL;
    CHECK_STATUS(fa_kcache_store(&v.key, "x", 1), FA_ERR_NULL_POINTER);
    CHECK(strstr(fa_last_error(), "device") != NULL);
    v = k;
    rebind(&v);
    v.key.driver = NULL;
    CHECK_STATUS(fa_kcache_load(&v.key, &data, &size), FA_ERR_NULL_POINTER);
    CHECK(strstr(fa_last_error(), "driver") != NULL);
    /* The backend name becomes part of a file name: no path tricks. */
    const char *bad_backends[] = {"", "../escape", "open/cl", "OpenCL"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(bad_backends); i++) {
        v = k;
        rebind(&v);
        v.key.backend = bad_backends[i];
        CHECK_STATUS(fa_kcache_store(&v.key, "x", 1), FA_ERR_INVALID_ARGUMENT);
        CHECK(strstr(fa_last_error(), "backend") != NULL);
    }
    /* NULL options means none, and is the same key as "". */
    v = k;
    rebind(&v);
    v.key.options = NULL;
    CHECK_OK(fa_kcache_store(&v.key, "payload", 7));
    v.key.options = "";
    CHECK(loads_as(&v.key, "payload", 7));
    CHECK(file_exists(cache_dir) && count_files(cache_dir, NULL, 0) == 1);
    end_case();
}

FA_TEST(hash64_properties) {
    fa_rng rng = case_rng(12);
    unsigned char *buf = random_bytes(&rng, 1000);
    uint64_t seed = fa_rng_next(&rng);
    uint64_t h = fa_hash64(buf, 1000, seed);
    CHECK(fa_hash64(buf, 1000, seed) == h);
    CHECK(fa_hash64(buf, 1000, seed ^ 1) != h);
    CHECK(fa_hash64(buf, 999, seed) != h);
    /* Every single-bit flip of the data changes the hash. */
    int same = 0;
    for (int bit = 0; bit < 8 * 1000; bit += 7) {
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        if (fa_hash64(buf, 1000, seed) == h) same++;
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    CHECK(same == 0);
    /* The empty input still depends on the seed. */
    CHECK(fa_hash64(NULL, 0, 1) != fa_hash64(NULL, 0, 2));
    /* FNV-1a with the seed's eight bytes (low byte first) hashed ahead of
     * the data: recompute it independently with a zero seed. */
    uint64_t expect = UINT64_C(0xcbf29ce484222325);
    for (int i = 0; i < 8; i++) expect *= UINT64_C(0x100000001b3);
    for (int i = 0; i < 3; i++) {
        expect ^= (unsigned char)"abc"[i];
        expect *= UINT64_C(0x100000001b3);
    }
    CHECK(fa_hash64("abc", 3, 0) == expect);
    free(buf);
}

FA_TEST_MAIN(FA_CASE(round_trip), FA_CASE(any_key_field_change_misses),
             FA_CASE(corrupt_byte_is_detected_and_removed), FA_CASE(truncated_or_extended_file_misses),
             FA_CASE(other_key_under_same_name_misses), FA_CASE(off_disables), FA_CASE(directory_resolution),
             FA_CASE(unwritable_directory_fails_cleanly), FA_CASE(concurrent_stores_of_one_key),
             FA_CASE(large_payload), FA_CASE(bad_arguments), FA_CASE(hash64_properties))
