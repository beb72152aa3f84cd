#include "cli.h"
#include "planner.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fa_cli_usage(const char *prog, const char *extra) {
    printf("usage: %s [options]\n"
           "device:\n"
           "  --backend NAME      any, reference, opencl, cuda, hip (default: any)\n"
           "  --device N          device index (within --backend, else global); default: best\n"
           "problem:\n"
           "  --batch B           sequences (default 1)\n"
           "  --seqlen N          query and key length (default 512)\n"
           "  --seqlen-q N, --seqlen-k N\n"
           "  --heads H           query heads (default 4); --heads-kv H (default: heads)\n"
           "  --dim D             head_dim, a multiple of 8 up to 256 (default 64)\n"
           "  --dtype T           fp32, fp16, bf16, fp8_e4m3 or fp8 (forward only, O in bf16) (default fp32)\n"
           "  --o-dtype T         O's dtype beside fp8 inputs: bf16 (default) or fp16\n"
           "  --descale Q,K,V     fp8 descale factors, each > 0 (0: 1) (default 0,0,0)\n"
           "  --scale S           softmax scale (default 1/sqrt(dim))\n"
           "  --causal            bottom-right aligned causal mask\n"
           "  --window L,R        sliding window, two integers >= -1 (-1: unlimited side)\n"
           "  --block-sparse B,F  blocks of B x B, keep each with probability F in [0, 1] (seeded)\n"
           "  --dropout P         dropout probability in [0, 1); --seed S (64-bit, decimal or 0x hex)\n"
           "  --standard          unfused standard attention instead of the fused kernel\n"
           "  --deterministic     bit-identical backward\n"
           "score options:\n"
           "  --softcap C         logits capped to C * tanh(s / C), C > 0\n"
           "  --alibi             ALiBi with slopes 2^(-8 (h + 1) / heads)\n"
           "  --bias T            additive bias [batch, heads, seqlen_q, seqlen_k] of random values,\n"
           "                      dtype T (fp32, or the problem's dtype)\n"
           "%s",
           prog, extra ? extra : "");
}

/* Whole-string numbers: no leading space or sign games, nothing after the
 * digits, within [lo, hi]. */
static int parse_long_range(const char *s, long long lo, long long hi, long long *out) {
    if (!*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_int_range(const char *s, int lo, int hi, int *out) {
    long long v;
    if (parse_long_range(s, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

int fa_cli_int_list(const char *text, int lo, int hi, int *out, int max) {
    int n = 0;
    char item[32];
    for (const char *p = text;; p++) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n >= max || len == 0 || len >= sizeof item) return -1;
        memcpy(item, p, len);
        item[len] = '\0';
        if (parse_int_range(item, lo, hi, &out[n++])) return -1;
        if (!comma) return n;
        p = comma;
    }
}

static int parse_double_range(const char *s, double lo, double hi, int hi_open, double *out) {
    if (!*s || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || !isfinite(v) || v < lo || v > hi || (hi_open && v == hi)) return -1;
    *out = v;
    return 0;
}

int fa_cli_int(const char *text, int lo, int hi, int *out) { return parse_int_range(text, lo, hi, out); }

int fa_cli_double(const char *text, double lo, double hi, double *out) {
    return parse_double_range(text, lo, hi, 0, out);
}

/* Decimal or 0x-prefixed hexadecimal, all 64 bits; no sign. */
static int parse_u64(const char *s, uint64_t *out) {
    if (!isdigit((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end != '\0') return -1;
    *out = (uint64_t)v;
    return 0;
}

/* "A,B": exactly two fields, each parsed by its own rule. */
static int split_pair(const char *s, char *first, char *second, size_t size) {
    const char *comma = strchr(s, ',');
    if (!comma || strchr(comma + 1, ',')) return -1;
    size_t n = (size_t)(comma - s);
    if (n == 0 || n >= size || strlen(comma + 1) >= size) return -1;
    memcpy(first, s, n);
    first[n] = '\0';
    strcpy(second, comma + 1);
    return 0;
}

static int parse_window(const char *s, int *left, int *right) {
    char a[32], b[32];
    if (split_pair(s, a, b, sizeof a)) return -1;
    return parse_int_range(a, -1, INT_MAX, left) || parse_int_range(b, -1, INT_MAX, right) ? -1 : 0;
}

/* "Q,K,V": three factors, each 0 (meaning 1) or finite and > 0. */
static int parse_descale(const char *s, float out[3]) {
    char a[32], rest[64], b[32], c[32];
    const char *comma = strchr(s, ',');
    if (!comma || (size_t)(comma - s) >= sizeof a || strlen(comma + 1) >= sizeof rest) return -1;
    memcpy(a, s, (size_t)(comma - s));
    a[comma - s] = '\0';
    strcpy(rest, comma + 1);
    if (split_pair(rest, b, c, sizeof b)) return -1;
    const char *parts[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        double v;
        if (parse_double_range(parts[i], 0.0, FLT_MAX, 0, &v)) return -1;
        out[i] = (float)v;
    }
    return 0;
}

static int parse_block_sparse(const char *s, int *block, double *density) {
    char a[32], b[64];
    if (split_pair(s, a, b, sizeof a)) return -1;
    return parse_int_range(a, 1, INT_MAX, block) || parse_double_range(b, 0.0, 1.0, 0, density) ? -1 : 0;
}

static int parse_backend(const char *s, fa_backend *out) {
    static const fa_backend all[] = {FA_BACKEND_ANY, FA_BACKEND_REFERENCE, FA_BACKEND_OPENCL, FA_BACKEND_CUDA,
                                     FA_BACKEND_HIP};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, fa_backend_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    return -1;
}

static int parse_dtype(const char *s, fa_dtype *out) {
    static const fa_dtype all[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16, FA_DTYPE_FP8_E4M3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, fa_dtype_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    if (strcmp(s, "fp8") == 0) {
        *out = FA_DTYPE_FP8_E4M3;
        return 0;
    }
    return -1;
}

/* A deterministic block mask keeping each block with probability density;
 * the diagonal blocks are always kept so that no row is left empty unless
 * the user asks for it with density 0. */
static uint8_t *make_block_mask(const fa_attention_desc *d, int block, double density, size_t *bytes) {
    size_t rows = ((size_t)d->seqlen_q + (size_t)block - 1) / (size_t)block;
    size_t cols = ((size_t)d->seqlen_k + (size_t)block - 1) / (size_t)block;
    if (cols && rows > SIZE_MAX / cols) return NULL;
    const size_t n = rows * cols;
    uint8_t *mask = malloc(n ? n : 1);
    if (!mask) return NULL;
    uint64_t state = 0x2545F4914F6CDD1Dull;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            double u = (double)(state >> 11) / 9007199254740992.0;
            mask[r * cols + c] = (uint8_t)(u < density || (density > 0 && r == c));
        }
    *bytes = rows * cols;
    return mask;
}

/* Devices of a backend (all of them for FA_BACKEND_ANY) present here. */
static int devices_of(fa_backend backend) {
    int count = 0, n = 0;
    if (fa_device_count(&count) != FA_SUCCESS) return 0;
    if (backend == FA_BACKEND_ANY) return count;
    for (int i = 0; i < count; i++) {
        fa_device_info info;
        if (fa_device_get_info(i, &info) == FA_SUCCESS && info.backend == backend) n++;
    }
    return n;
}

/* What the options must satisfy together, once all are read. */
static int check_together(fa_cli *cli) {
    if (cli->describe && strcmp(cli->describe, "all") != 0 && !fa_described_device_find(cli->describe)) {
        fprintf(stderr, "--describe %s: not a described device (", cli->describe);
        for (int i = 0; i < fa_described_device_count(); i++)
            fprintf(stderr, "%s%s", i ? ", " : "", fa_described_device_get(i)->key);
        fprintf(stderr, ", or all)\n");
        return -1;
    }
    if (cli->device >= 0 && !cli->describe) {
        const int n = devices_of(cli->backend);
        if (cli->device >= n) {
            fprintf(stderr, "--device %d: %s has %d device%s (0 to %d)\n", cli->device,
                    cli->backend == FA_BACKEND_ANY ? "this machine" : fa_backend_name(cli->backend), n,
                    n == 1 ? "" : "s", n - 1);
            return -1;
        }
    }
    if (fa_attention_desc_check(&cli->desc) != FA_SUCCESS) {
        fprintf(stderr, "bad problem: %s\n", fa_last_error());
        return -1;
    }
    return 0;
}

int fa_cli_parse(fa_cli *cli, int argc, char **argv) {
    memset(cli, 0, sizeof *cli);
    cli->backend = FA_BACKEND_ANY;
    cli->device = -1;
    cli->repeats = 10;
    cli->check = 1;
    fa_attention_desc *d = &cli->desc;
    fa_attention_desc_init(d);
    d->batch = 1;
    d->seqlen_q = d->seqlen_k = 512;
    d->heads_q = 4;
    d->head_dim = 64;
    int heads_kv = 0, block = 0, alibi = 0, has_bias = 0, o_dtype_set = 0;
    fa_dtype o_dtype = FA_DTYPE_BF16;
    double density = 0.0, value = 0.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes_value = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 1;
        else if (strcmp(a, "--causal") == 0) { d->causal = 1; takes_value = 0; }
        else if (strcmp(a, "--standard") == 0) { d->algorithm = FA_ALGO_STANDARD; takes_value = 0; }
        else if (strcmp(a, "--deterministic") == 0) { d->deterministic = 1; takes_value = 0; }
        else if (strcmp(a, "--no-check") == 0) { cli->check = 0; takes_value = 0; }
        else if (strcmp(a, "--alibi") == 0) { alibi = 1; takes_value = 0; }
        else if (!v) bad = 1;
        else if (strcmp(a, "--backend") == 0) bad = parse_backend(v, &cli->backend);
        else if (strcmp(a, "--device") == 0) bad = parse_int_range(v, -1, INT_MAX, &cli->device);
        else if (strcmp(a, "--describe") == 0) cli->describe = v;
        else if (strcmp(a, "--batch") == 0) bad = parse_int_range(v, 1, INT_MAX, &d->batch);
        else if (strcmp(a, "--seqlen") == 0) {
            bad = parse_int_range(v, 1, INT_MAX, &d->seqlen_q);
            d->seqlen_k = d->seqlen_q;
        }
        else if (strcmp(a, "--seqlen-q") == 0) bad = parse_int_range(v, 1, INT_MAX, &d->seqlen_q);
        else if (strcmp(a, "--seqlen-k") == 0) bad = parse_int_range(v, 1, INT_MAX, &d->seqlen_k);
        else if (strcmp(a, "--heads") == 0) bad = parse_int_range(v, 1, INT_MAX, &d->heads_q);
        else if (strcmp(a, "--heads-kv") == 0) bad = parse_int_range(v, 1, INT_MAX, &heads_kv);
        else if (strcmp(a, "--dim") == 0) bad = parse_int_range(v, 8, 256, &d->head_dim);
        else if (strcmp(a, "--repeats") == 0) bad = parse_int_range(v, 1, FA_CLI_MAX_REPEATS, &cli->repeats);
        else if (strcmp(a, "--dtype") == 0) {
            fa_dtype t = FA_DTYPE_F32;
            bad = parse_dtype(v, &t);
            d->q.dtype = d->k.dtype = d->v.dtype = d->o.dtype = t;
        } else if (strcmp(a, "--o-dtype") == 0) {
            bad = parse_dtype(v, &o_dtype) || (o_dtype != FA_DTYPE_F16 && o_dtype != FA_DTYPE_BF16);
            o_dtype_set = 1;
        } else if (strcmp(a, "--descale") == 0) {
            float f[3] = {0.0f, 0.0f, 0.0f};
            bad = parse_descale(v, f);
            d->descale_q = f[0];
            d->descale_k = f[1];
            d->descale_v = f[2];
        } else if (strcmp(a, "--scale") == 0) {
            bad = parse_double_range(v, 0.0, FLT_MAX, 0, &value);
            d->softmax_scale = (float)value;
        } else if (strcmp(a, "--dropout") == 0) {
            bad = parse_double_range(v, 0.0, 1.0, 1, &value) || (float)value >= 1.0f;
            d->dropout_p = (float)value;
        } else if (strcmp(a, "--seed") == 0) bad = parse_u64(v, &d->dropout_seed);
        else if (strcmp(a, "--window") == 0) bad = parse_window(v, &d->window_left, &d->window_right);
        else if (strcmp(a, "--block-sparse") == 0) bad = parse_block_sparse(v, &block, &density);
        else if (strcmp(a, "--softcap") == 0) {
            bad = parse_double_range(v, 0.0, FLT_MAX, 0, &value) || !((float)value > 0.0f);
            d->softcap = (float)value;
        } else if (strcmp(a, "--bias") == 0) {
            bad = parse_dtype(v, &d->bias.dtype);
            has_bias = 1;
        }
        else {
            fprintf(stderr, "unknown option %s (try --help)\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "bad or missing value for %s%s%s\n", a, v ? ": " : "", v ? v : "");
            return -1;
        }
        if (takes_value) i++;
    }
    d->heads_kv = heads_kv > 0 ? heads_kv : d->heads_q;
    /* fp8 inputs write O in a 16-bit dtype (bf16 unless --o-dtype, as
     * FlashAttention-3's); --o-dtype means nothing beside other inputs. */
    if (d->q.dtype == FA_DTYPE_FP8_E4M3) d->o.dtype = o_dtype;
    else if (o_dtype_set) {
        fprintf(stderr, "--o-dtype: only beside --dtype fp8 (O has q's dtype otherwise)\n");
        return -1;
    }
    if (has_bias) {
        d->bias_batch = d->batch;
        d->bias_heads = d->heads_q;
    }
    if (alibi) {
        cli->alibi_slopes = malloc((size_t)d->heads_q * sizeof(float));
        if (!cli->alibi_slopes) {
            fprintf(stderr, "--alibi: no memory for %d slopes\n", d->heads_q);
            return -1;
        }
        fa_cli_alibi_slopes(d->heads_q, cli->alibi_slopes);
        d->alibi_slopes = cli->alibi_slopes;
    }
    if (block > 0) {
        cli->block_mask = make_block_mask(d, block, density, &d->block_mask_bytes);
        if (!cli->block_mask) {
            fprintf(stderr, "--block-sparse %d: no memory for the block mask\n", block);
            return -1;
        }
        d->block_mask = cli->block_mask;
        d->block_q = d->block_k = block;
    }
    return check_together(cli);
}

void fa_cli_free(fa_cli *cli) {
    free(cli->block_mask);
    cli->block_mask = NULL;
    free(cli->alibi_slopes);
    cli->alibi_slopes = NULL;
}

void fa_cli_alibi_slopes(int heads, float *slopes) {
    for (int h = 0; h < heads; h++) slopes[h] = (float)exp2(-8.0 * (h + 1) / heads);
}

void fa_cli_describe_problem(const fa_attention_desc *d, char *out, size_t size) {
    int n = snprintf(out, size, "batch=%d seqlen_q=%d seqlen_k=%d heads_q=%d heads_kv=%d head_dim=%d %s%s", d->batch,
                     d->seqlen_q, d->seqlen_k, d->heads_q, d->heads_kv, d->head_dim, fa_dtype_name(d->q.dtype),
                     d->algorithm == FA_ALGO_STANDARD ? " standard" : " fused");
    if (n < 0 || (size_t)n >= size) return;
    if (d->causal) n += snprintf(out + n, size - (size_t)n, " causal");
    if ((size_t)n < size && (d->window_left >= 0 || d->window_right >= 0))
        n += snprintf(out + n, size - (size_t)n, " window=(%d,%d)", d->window_left, d->window_right);
    if ((size_t)n < size && d->block_mask)
        n += snprintf(out + n, size - (size_t)n, " block-sparse=%dx%d", d->block_q, d->block_k);
    if ((size_t)n < size && d->dropout_p > 0)
        n += snprintf(out + n, size - (size_t)n, " dropout=%g", (double)d->dropout_p);
    if ((size_t)n < size && d->softcap > 0)
        n += snprintf(out + n, size - (size_t)n, " softcap=%g", (double)d->softcap);
    if ((size_t)n < size && d->alibi_slopes) n += snprintf(out + n, size - (size_t)n, " alibi");
    if ((size_t)n < size && d->bias_batch > 0)
        snprintf(out + n, size - (size_t)n, " bias=%s", fa_dtype_name(d->bias.dtype));
}

void fa_cli_print_device(const fa_device_info *info) {
    const fa_device_desc *d = &info->desc;
    static const char *const types[] = {"CPU", "GPU", "accelerator"};
    printf("  %-9s #%d  %s (%s, %s%s%s)\n", fa_backend_name(info->backend), info->index, d->name, d->vendor,
           types[d->type], d->arch[0] ? ", " : "", d->arch);
    printf("      driver %s; %d compute units at %d MHz; local memory %zu KiB per work-group;\n",
           info->driver_version, d->compute_units, d->clock_mhz, d->local_mem_bytes / 1024);
    printf("      work-group <= %d; SIMD width %d; global memory %.1f GiB; bandwidth %.0f GB/s (%s)\n",
           d->max_work_group_size, d->simd_width, (double)d->global_mem_bytes / (1u << 30), d->bandwidth_gbs,
           d->bandwidth_measured ? "measured" : "estimated");
    printf("      fp32 %.0f flop/clock/CU", d->fp32_flops_per_clock_cu);
    if (d->matrix_flops_per_clock_cu > 0)
        printf("; matrix units %dx%dx%d, %.0f flop/clock/CU", d->matrix_m, d->matrix_n, d->matrix_k,
               d->matrix_flops_per_clock_cu);
    printf("\n");
}

int fa_cli_split_own(int argc, char **argv, const char *tool, const char *const *names, int n_names,
                     int (*take)(void *ctx, const char *name, const char *value), void *ctx, int *rest_argc,
                     char **rest) {
    *rest_argc = 0;
    rest[(*rest_argc)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        int own = 0;
        for (int k = 0; k < n_names && !own; k++) own = strcmp(argv[i], names[k]) == 0;
        if (!own) {
            rest[(*rest_argc)++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", tool, argv[i]);
            return -1;
        }
        if (take(ctx, argv[i], argv[i + 1]) != 0) return -1;
        i++;
    }
    return 0;
}
