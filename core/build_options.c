/* The environment's build options may tune, not redefine (build_options.h). */
#include "build_options.h"

#include "fa_internal.h"

#include <ctype.h>
#include <stddef.h>
#include <string.h>

typedef struct option_cursor {
    const char *at;
} option_cursor;

/* The next whitespace-separated token: *len characters from the return
 * value; NULL at the end. */
static const char *next_token(option_cursor *c, size_t *len) {
    while (*c->at && isspace((unsigned char)*c->at)) c->at++;
    if (!*c->at) return NULL;
    const char *start = c->at;
    while (*c->at && !isspace((unsigned char)*c->at)) c->at++;
    *len = (size_t)(c->at - start);
    return start;
}

/* The forms that define or undefine a macro, and whether the name follows
 * in the same token (joined) or in the next one. */
static const char *macro_name(option_cursor *c, const char *tok, size_t len, size_t *name_len) {
    static const struct { const char *flag; char joiner; } forms[] = {
        {"--define-macro", '='}, {"--undefine-macro", '='}, {"-D", 0}, {"-U", 0}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(forms); i++) {
        const size_t flen = strlen(forms[i].flag);
        if (len < flen || strncmp(tok, forms[i].flag, flen) != 0) continue;
        const char *name = tok + flen;
        size_t rest = len - flen;
        if (rest > 0 && forms[i].joiner) {
            if (*name != forms[i].joiner) continue; /* another flag sharing the prefix */
            name++;
            rest--;
        }
        if (rest == 0) name = next_token(c, &rest);
        if (!name) return NULL;
        size_t n = 0;
        while (n < rest && name[n] != '=') n++;
        *name_len = n;
        return name;
    }
    return NULL;
}

static int defines(const char *options, const char *name, size_t len) {
    option_cursor c = {options ? options : ""};
    size_t tlen, nlen;
    for (const char *tok = next_token(&c, &tlen); tok; tok = next_token(&c, &tlen)) {
        const char *n = macro_name(&c, tok, tlen, &nlen);
        if (n && nlen == len && strncmp(n, name, len) == 0) return 1;
    }
    return 0;
}

static int listed(const char *const *reserved, const char *name, size_t len) {
    for (; reserved && *reserved; reserved++)
        if (strlen(*reserved) == len && strncmp(*reserved, name, len) == 0) return 1;
    return 0;
}

fa_status fa_check_env_build_options(const char *env_name, const char *env, const char *plan_options,
                                     const char *const *reserved) {
    option_cursor c = {env ? env : ""};
    size_t tlen, nlen;
    for (const char *tok = next_token(&c, &tlen); tok; tok = next_token(&c, &tlen)) {
        const char *name = macro_name(&c, tok, tlen, &nlen);
        if (!name) continue;
        if (defines(plan_options, name, nlen) || listed(reserved, name, nlen))
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "%s: (un)defining %.*s is refused: plans set that macro themselves (these options may "
                           "tune a build, not change what it computes)",
                           env_name, (int)nlen, name);
    }
    return FA_SUCCESS;
}
