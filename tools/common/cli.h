/* Command-line options shared by the tools: device selection and the
 * attention problem. */
#ifndef FA_CLI_H
#define FA_CLI_H

#include "flashattn.h"

#include <stdint.h>

typedef struct fa_cli {
    fa_backend backend;     /* FA_BACKEND_ANY unless --backend */
    int device;             /* -1: best */
    const char *describe;   /* --describe KEY: a described device */
    fa_attention_desc desc;
    uint8_t *block_mask;    /* owned; from --block-sparse */
    float *alibi_slopes;    /* owned; from --alibi (heads_q of them) */
    int repeats;
    int check;              /* compare with the CPU reference */
} fa_cli;

/* The most timed repeats a tool takes. */
#define FA_CLI_MAX_REPEATS 10000

/* Parses argv (options documented by fa_cli_usage) strictly: whole-string
 * numbers within each option's range, exactly two fields where two are
 * asked for, known names, a device index that exists, and a problem the
 * library accepts (fa_attention_desc_check). Anything else prints a
 * message and returns -1 (the tools exit 2); --help returns 1. */
int fa_cli_parse(fa_cli *cli, int argc, char **argv);
void fa_cli_usage(const char *prog, const char *extra);
/* A comma-separated list of at most max whole numbers in [lo, hi] into
 * out; the count, or -1 for anything else (an empty list included). */
int fa_cli_int_list(const char *text, int lo, int hi, int *out, int max);
/* One whole-string number in [lo, hi] (the rules of the shared options,
 * for a tool's own); 0, or -1 for anything else. */
int fa_cli_int(const char *text, int lo, int hi, int *out);
int fa_cli_double(const char *text, double lo, double hi, double *out);
void fa_cli_free(fa_cli *cli);
/* ALiBi's slopes for heads attention heads, as --alibi sets them: the
 * geometric sequence 2^(-8 (h + 1) / heads) of the ALiBi paper. */
void fa_cli_alibi_slopes(int heads, float *slopes);
/* A tool's own options beside the shared ones: each of names takes the
 * next word as its value, handed to take(ctx, name, value) (nonzero:
 * refused, take has said why); every other word goes to rest (after
 * argv[0]) for fa_cli_parse. -1 when an option lacks its value or take
 * refuses one. rest holds argc words at most. */
int fa_cli_split_own(int argc, char **argv, const char *tool, const char *const *names, int n_names,
                     int (*take)(void *ctx, const char *name, const char *value), void *ctx, int *rest_argc,
                     char **rest);
/* One line: "b=1 sq=512 sk=512 hq=4 hkv=4 d=64 fp32 causal ..." */
void fa_cli_describe_problem(const fa_attention_desc *desc, char *out, size_t size);
void fa_cli_print_device(const fa_device_info *info);

#endif
