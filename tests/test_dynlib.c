/* Run-time library loading: the path every vendor runtime is opened by. */
#include "dynlib.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>

/* libm is on every glibc system and exports cos, whose value is known. */
static const char *const libm_names[] = {"libfa_surely_missing_first.so", "libm.so.6", NULL};

FA_TEST(open_existing_library) {
    char reason[512];
    memset(reason, 'x', sizeof reason);
    void *lib = fa_dynlib_open(libm_names, reason, sizeof reason);
    CHECK_MSG(lib != NULL, "libm.so.6 did not open: %s", reason);
    if (!lib) return;
    /* The failed first name must not leave a stale reason behind. */
    CHECK_MSG(reason[0] == '\0', "reason after success: %s", reason);

    void *sym = fa_dynlib_symbol(lib, "cos", reason, sizeof reason);
    CHECK_MSG(sym != NULL, "cos not found: %s", reason);
    if (sym) {
        /* The way callers turn a dlsym pointer into a function pointer. */
        double (*cos_fn)(double);
        memcpy(&cos_fn, &sym, sizeof cos_fn);
        CHECK(cos_fn(0.0) == 1.0);
        CHECK_NEAR(cos_fn(3.14159265358979323846), -1.0, 1e-15);
    }
    fa_dynlib_close(lib);
}

FA_TEST(missing_library_names_every_name) {
    static const char *const names[] = {"libfa_missing_alpha.so", "libfa_missing_beta.so.3",
                                        "/nonexistent/dir/libfa_missing_gamma.so", NULL};
    char reason[1024];
    void *lib = fa_dynlib_open(names, reason, sizeof reason);
    CHECK(lib == NULL);
    if (lib) fa_dynlib_close(lib);
    for (int i = 0; names[i]; i++) {
        const char *at = strstr(reason, names[i]);
        CHECK_MSG(at != NULL, "reason does not name %s: %s", names[i], reason);
        /* Each name is followed by the loader's own message. */
        if (at) {
            size_t len = strlen(names[i]);
            CHECK_MSG(at[len] == ':' && at[len + 1] == ' ' && at[len + 2] != '\0' && at[len + 2] != ';',
                      "no loader message after %s: %s", names[i], reason);
        }
    }
    /* glibc says why the file could not be opened. */
    CHECK_MSG(strstr(reason, "No such file") != NULL || strstr(reason, "cannot open") != NULL,
              "reason lacks the dlerror text: %s", reason);
}

FA_TEST(empty_name_list) {
    static const char *const none[] = {NULL};
    char reason[128];
    CHECK(fa_dynlib_open(none, reason, sizeof reason) == NULL);
    CHECK(strlen(reason) > 0);
    reason[0] = '\0';
    CHECK(fa_dynlib_open(NULL, reason, sizeof reason) == NULL);
    CHECK(strlen(reason) > 0);
}

FA_TEST(missing_symbol) {
    char reason[512];
    void *lib = fa_dynlib_open(libm_names, reason, sizeof reason);
    CHECK_MSG(lib != NULL, "%s", reason);
    if (!lib) return;
    void *sym = fa_dynlib_symbol(lib, "fa_no_such_symbol_in_libm", reason, sizeof reason);
    CHECK(sym == NULL);
    CHECK_MSG(strstr(reason, "fa_no_such_symbol_in_libm") != NULL, "reason: %s", reason);
    /* A symbol lookup after a failed one works again. */
    CHECK(fa_dynlib_symbol(lib, "sin", reason, sizeof reason) != NULL);
    CHECK(reason[0] == '\0');
    fa_dynlib_close(lib);

    CHECK(fa_dynlib_symbol(NULL, "cos", reason, sizeof reason) == NULL);
    CHECK(strlen(reason) > 0);
}

FA_TEST(small_or_absent_reason_buffer) {
    static const char *const names[] = {"libfa_missing_with_a_rather_long_name.so", NULL};
    char reason[8];
    memset(reason, 'x', sizeof reason);
    CHECK(fa_dynlib_open(names, reason, sizeof reason) == NULL);
    CHECK(memchr(reason, '\0', sizeof reason) != NULL);
    CHECK(strncmp(reason, "libfa_m", 7) == 0);
    /* No buffer at all is allowed: callers that do not care pass NULL, 0. */
    CHECK(fa_dynlib_open(names, NULL, 0) == NULL);
    void *lib = fa_dynlib_open(libm_names, NULL, 0);
    CHECK(lib != NULL);
    CHECK(fa_dynlib_symbol(lib, "fa_no_such_symbol_in_libm", NULL, 0) == NULL);
    fa_dynlib_close(lib);
    fa_dynlib_close(NULL);
}

/* The override every backend documents: FLASHATTN_<RUNTIME>_LIBRARY names the
 * one library to try; unset or empty leaves the defaults. */
FA_TEST(environment_overrides_names) {
    static const char *const defaults[] = {"libfa_default_a.so", "libfa_default_b.so", NULL};
    const char *override_list[2] = {"stale", "stale"};
    const char *var = "FA_TEST_DYNLIB_LIBRARY";

    CHECK(unsetenv(var) == 0);
    CHECK(fa_dynlib_names(var, defaults, override_list) == defaults);
    CHECK(setenv(var, "", 1) == 0);
    CHECK(fa_dynlib_names(var, defaults, override_list) == defaults);

    CHECK(setenv(var, "/opt/vendor/libfa_custom.so", 1) == 0);
    const char *const *names = fa_dynlib_names(var, defaults, override_list);
    CHECK(names == override_list);
    CHECK(names[0] && strcmp(names[0], "/opt/vendor/libfa_custom.so") == 0);
    CHECK(names[1] == NULL);
    CHECK(unsetenv(var) == 0);
}

FA_TEST(load_into_function_slot) {
    char reason[512];
    void *lib = fa_dynlib_open(libm_names, reason, sizeof reason);
    CHECK_MSG(lib != NULL, "%s", reason);
    if (!lib) return;
    double (*fn)(double) = NULL;
    CHECK(fa_dynlib_load(lib, "cos", NULL, &fn, reason, sizeof reason) == 1);
    CHECK(fn != NULL && fn(0.0) == 1.0);

    /* The alternative stands in for a missing first name (renamed entry points). */
    fn = NULL;
    CHECK(fa_dynlib_load(lib, "fa_no_such_cos_v2", "cos", &fn, reason, sizeof reason) == 1);
    CHECK(fn != NULL && fn(0.0) == 1.0);

    /* Neither resolves: the slot is left alone and the reason names the last try. */
    double (*untouched)(double) = fn;
    CHECK(fa_dynlib_load(lib, "fa_no_such_a", "fa_no_such_b", &fn, reason, sizeof reason) == 0);
    CHECK(fn == untouched);
    CHECK_MSG(strstr(reason, "fa_no_such_b") != NULL, "reason: %s", reason);
    CHECK(fa_dynlib_load(lib, "fa_no_such_a", NULL, &fn, reason, sizeof reason) == 0);
    CHECK_MSG(strstr(reason, "fa_no_such_a") != NULL, "reason: %s", reason);
    fa_dynlib_close(lib);
}

/* fa_lazy_library: a failure (missing library, missing symbol) leaves it
 * unloaded and says why; once loaded it keeps the library and does not
 * resolve again. */
static int lazy_resolves;
static double (*lazy_cos)(double);
static int lazy_resolve_cos(void *lib, char *reason, size_t reason_size) {
    lazy_resolves++;
    return fa_dynlib_load(lib, "cos", NULL, &lazy_cos, reason, reason_size);
}
static int lazy_resolve_missing(void *lib, char *reason, size_t reason_size) {
    lazy_resolves++;
    void (*fn)(void) = NULL;
    return fa_dynlib_load(lib, "fa_no_such_symbol", NULL, &fn, reason, reason_size);
}

FA_TEST(lazy_library_loads_once) {
    static const char *const missing[] = {"libfa_no_such_library.so.7", NULL};
    const char *var = "FA_TEST_DYNLIB_LAZY";
    char reason[512];
    fa_lazy_library l = FA_LAZY_LIBRARY_INIT;
    CHECK(unsetenv(var) == 0);
    CHECK(fa_lazy_library_load(&l, var, missing, lazy_resolve_cos, reason, sizeof reason) == 0);
    CHECK_MSG(strstr(reason, "libfa_no_such_library.so.7") != NULL, "reason: %s", reason);
    CHECK(lazy_resolves == 0);
    CHECK(fa_lazy_library_loaded(&l) == 0);

    CHECK(fa_lazy_library_load(&l, var, libm_names, lazy_resolve_missing, reason, sizeof reason) == 0);
    CHECK_MSG(strstr(reason, "fa_no_such_symbol") != NULL, "reason: %s", reason);
    CHECK(lazy_resolves == 1 && fa_lazy_library_loaded(&l) == 0);

    /* The environment names the library: the defaults are not tried. */
    CHECK(setenv(var, libm_names[1], 1) == 0);
    CHECK(fa_lazy_library_load(&l, var, missing, lazy_resolve_cos, reason, sizeof reason) == 1);
    CHECK(lazy_resolves == 2 && fa_lazy_library_loaded(&l) == 1);
    CHECK(lazy_cos != NULL && lazy_cos(0.0) == 1.0);
    CHECK(unsetenv(var) == 0);
    CHECK(fa_lazy_library_load(&l, var, missing, lazy_resolve_missing, reason, sizeof reason) == 1);
    CHECK(lazy_resolves == 2);
    fa_dynlib_close(l.handle);
}

FA_TEST_MAIN(FA_CASE(open_existing_library), FA_CASE(missing_library_names_every_name),
             FA_CASE(empty_name_list), FA_CASE(missing_symbol), FA_CASE(small_or_absent_reason_buffer),
             FA_CASE(environment_overrides_names), FA_CASE(load_into_function_slot),
             FA_CASE(lazy_library_loads_once))
