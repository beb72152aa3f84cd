/* The kernel sources embedded at build time match the files in the source
 * tree, both ways: every kernel file is embedded byte for byte, and every
 * embedded entry is a kernel file that exists. */
#include "fa_internal.h"
#include "harness.h"
#include "kernel_sources.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>

#ifndef FA_SOURCE_DIR
#error "FA_SOURCE_DIR must name the repository root"
#endif

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

/* The folders and file kinds that CMakeLists.txt embeds (not recursive). */
typedef struct kernel_dir {
    const char *dir;
    const char *exts[3];
} kernel_dir;

static const kernel_dir kernel_dirs[] = {
    {"kernels_cl", {".cl", ".h", NULL}},
    {"kernels_hip", {".hip", ".h", NULL}},
    {"kernels_cuda", {".cu", ".cuh", NULL}},
};

static int has_ext(const char *name, const char *const *exts) {
    size_t len = strlen(name);
    for (int i = 0; exts[i]; i++) {
        size_t el = strlen(exts[i]);
        if (len > el && strcmp(name + len - el, exts[i]) == 0) return 1;
    }
    return 0;
}

/* Reads a whole file; NULL if it cannot be read. */
static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, used = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (used == cap) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
        size_t n = fread(buf + used, 1, cap - used, f);
        used += n;
        if (n == 0) break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return NULL;
    }
    *size = used;
    return buf;
}

static int is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Compares one embedded entry with the file of the same path on disk. */
static void check_matches_disk(const fa_kernel_source *src) {
    char full[PATH_CAP];
    sfmt(full, sizeof full, "%s/%s", FA_SOURCE_DIR, src->path);
    size_t size = 0;
    char *bytes = read_file(full, &size);
    CHECK_MSG(bytes != NULL, "embedded %s has no file %s", src->path, full);
    if (!bytes) return;
    CHECK_MSG(src->size == size, "%s: embedded %zu bytes, file has %zu", src->path, src->size, size);
    CHECK_MSG(src->text != NULL && src->size == size && memcmp(src->text, bytes, size) == 0,
              "%s: embedded text differs from the file", src->path);
    CHECK_MSG(src->text != NULL && src->text[src->size] == '\0', "%s: embedded text not NUL-terminated",
              src->path);
    /* Kernel compilers take C strings: an embedded NUL would cut the source. */
    CHECK_MSG(src->text != NULL && strlen(src->text) == src->size, "%s: NUL byte inside the source",
              src->path);
    free(bytes);
}

FA_TEST(every_kernel_file_is_embedded) {
    int on_disk = 0;
    for (size_t d = 0; d < sizeof kernel_dirs / sizeof kernel_dirs[0]; d++) {
        char dir_path[PATH_CAP];
        sfmt(dir_path, sizeof dir_path, "%s/%s", FA_SOURCE_DIR, kernel_dirs[d].dir);
        DIR *dir = opendir(dir_path);
        CHECK_MSG(dir != NULL, "cannot open %s", dir_path);
        if (!dir) continue;
        struct dirent *ent;
        while ((ent = readdir(dir)) != NULL) {
            if (!has_ext(ent->d_name, kernel_dirs[d].exts)) continue;
            char full[PATH_CAP], rel[PATH_CAP];
            sfmt(full, sizeof full, "%s/%s", dir_path, ent->d_name);
            if (!is_regular(full)) continue;
            sfmt(rel, sizeof rel, "%s/%s", kernel_dirs[d].dir, ent->d_name);
            on_disk++;
            const fa_kernel_source *src = fa_kernel_source_find(rel);
            CHECK_MSG(src != NULL, "%s is not embedded (rebuild after adding kernel files?)", rel);
            if (!src) continue;
            CHECK(strcmp(src->path, rel) == 0);
            check_matches_disk(src);
        }
        closedir(dir);
    }
    CHECK_MSG(fa_kernel_source_count() == on_disk, "%d sources embedded, %d kernel files on disk",
              fa_kernel_source_count(), on_disk);
}

FA_TEST(every_embedded_source_is_a_kernel_file) {
    int count = fa_kernel_source_count();
    CHECK(count >= 0);
    for (int i = 0; i < count; i++) {
        const fa_kernel_source *src = fa_kernel_source_get(i);
        CHECK_MSG(src != NULL && src->path != NULL, "entry %d missing", i);
        if (!src || !src->path) continue;
        /* In a kernel folder, of a kind that folder holds, not in a subfolder. */
        int kind_ok = 0;
        for (size_t d = 0; d < sizeof kernel_dirs / sizeof kernel_dirs[0]; d++) {
            size_t dl = strlen(kernel_dirs[d].dir);
            if (strncmp(src->path, kernel_dirs[d].dir, dl) == 0 && src->path[dl] == '/' &&
                strchr(src->path + dl + 1, '/') == NULL && has_ext(src->path + dl + 1, kernel_dirs[d].exts))
                kind_ok = 1;
        }
        CHECK_MSG(kind_ok, "embedded path %s is not a kernel file path", src->path);
        check_matches_disk(src);
        /* Lookup by path returns this very entry (paths are unique). */
        CHECK_MSG(fa_kernel_source_find(src->path) == src, "%s: find returns another entry", src->path);
        for (int j = 0; j < i; j++) {
            const fa_kernel_source *other = fa_kernel_source_get(j);
            CHECK_MSG(!other || strcmp(other->path, src->path) != 0, "%s embedded twice", src->path);
        }
    }
}

FA_TEST(unknown_paths_are_not_found) {
    CHECK(fa_kernel_source_find("kernels_cl/no_such_kernel_file.cl") == NULL);
    CHECK(fa_kernel_source_find("kernels_cuda/no_such_kernel_file.cu") == NULL);
    CHECK(fa_kernel_source_find("") == NULL);
    CHECK(fa_kernel_source_find(NULL) == NULL);
    CHECK(fa_kernel_source_get(-1) == NULL);
    CHECK(fa_kernel_source_get(fa_kernel_source_count()) == NULL);
    /* Paths are exact: no leading "./", no absolute form, no prefix match. */
    for (int i = 0; i < fa_kernel_source_count(); i++) {
        const fa_kernel_source *src = fa_kernel_source_get(i);
        char variant[PATH_CAP];
        sfmt(variant, sizeof variant, "./%s", src->path);
        CHECK(fa_kernel_source_find(variant) == NULL);
        sfmt(variant, sizeof variant, "%s/%s", FA_SOURCE_DIR, src->path);
        CHECK(fa_kernel_source_find(variant) == NULL);
        /* A shorter path may name another real file ("x.cuh" -> "x.cu"),
         * but then it must be that file's entry. */
        sfmt(variant, sizeof variant, "%.*s", (int)strlen(src->path) - 1, src->path);
        const fa_kernel_source *shorter = fa_kernel_source_find(variant);
        CHECK(shorter == NULL || strcmp(shorter->path, variant) == 0);
    }
}

FA_TEST_MAIN(FA_CASE(every_kernel_file_is_embedded), FA_CASE(every_embedded_source_is_a_kernel_file),
             FA_CASE(unknown_paths_are_not_found))
