#include "cli.h"

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
           "  --dtype T           fp32, fp16, bf16 (default fp32)\n"
           "  --scale S           softmax scale (default 1/sqrt(dim))\n"
           "  --causal            bottom-right aligned causal mask\n"
           "  --window L,R        sliding window (-1: unlimited side)\n"
           "  --block-sparse B,F  blocks of B x B, keep each with probability F (seeded)\n"
           "  --dropout P         dropout probability; --seed S\n"
           "  --standard          unfused standard attention instead of the fused kernel\n"
           "  --deterministic     bit-identical backward\n"
           "%s",
           prog, extra ? extra : "");
}

static int parse_int(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < -2147483647L || v > 2147483647L) return -1;
    *out = (int)v;
    return 0;
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
    static const fa_dtype all[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (size_t i = 0; i < 3; i++)
        if (strcmp(s, fa_dtype_name(all[i])) == 0) {
            *out = all[i];
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
    uint8_t *mask = malloc(rows * cols);
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
    int heads_kv = 0, block = 0;
    double density = 0.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes_value = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 1;
        else if (strcmp(a, "--causal") == 0) { d->causal = 1; takes_value = 0; }
        else if (strcmp(a, "--standard") == 0) { d->algorithm = FA_ALGO_STANDARD; takes_value = 0; }
        else if (strcmp(a, "--deterministic") == 0) { d->deterministic = 1; takes_value = 0; }
        else if (strcmp(a, "--no-check") == 0) { cli->check = 0; takes_value = 0; }
        else if (!v) bad = 1;
        else if (strcmp(a, "--backend") == 0) bad = parse_backend(v, &cli->backend);
        else if (strcmp(a, "--device") == 0) bad = parse_int(v, &cli->device);
        else if (strcmp(a, "--describe") == 0) cli->describe = v;
        else if (strcmp(a, "--batch") == 0) bad = parse_int(v, &d->batch);
        else if (strcmp(a, "--seqlen") == 0) { bad = parse_int(v, &d->seqlen_q); d->seqlen_k = d->seqlen_q; }
        else if (strcmp(a, "--seqlen-q") == 0) bad = parse_int(v, &d->seqlen_q);
        else if (strcmp(a, "--seqlen-k") == 0) bad = parse_int(v, &d->seqlen_k);
        else if (strcmp(a, "--heads") == 0) bad = parse_int(v, &d->heads_q);
        else if (strcmp(a, "--heads-kv") == 0) bad = parse_int(v, &heads_kv);
        else if (strcmp(a, "--dim") == 0) bad = parse_int(v, &d->head_dim);
        else if (strcmp(a, "--repeats") == 0) bad = parse_int(v, &cli->repeats);
        else if (strcmp(a, "--dtype") == 0) {
            fa_dtype t = FA_DTYPE_F32;
            bad = parse_dtype(v, &t);
            d->q.dtype = d->k.dtype = d->v.dtype = d->o.dtype = t;
        } else if (strcmp(a, "--scale") == 0) d->softmax_scale = strtof(v, NULL);
        else if (strcmp(a, "--dropout") == 0) d->dropout_p = strtof(v, NULL);
        else if (strcmp(a, "--seed") == 0) d->dropout_seed = strtoull(v, NULL, 0);
        else if (strcmp(a, "--window") == 0) bad = sscanf(v, "%d,%d", &d->window_left, &d->window_right) != 2;
        else if (strcmp(a, "--block-sparse") == 0) bad = sscanf(v, "%d,%lf", &block, &density) != 2 || block <= 0;
        else {
            fprintf(stderr, "unknown option %s (try --help)\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "bad or missing value for %s\n", a);
            return -1;
        }
        if (takes_value) i++;
    }
    d->heads_kv = heads_kv > 0 ? heads_kv : d->heads_q;
    if (block > 0 && d->seqlen_q > 0 && d->seqlen_k > 0) {
        cli->block_mask = make_block_mask(d, block, density, &d->block_mask_bytes);
        if (!cli->block_mask) {
            fprintf(stderr, "out of memory for the block mask\n");
            return -1;
        }
        d->block_mask = cli->block_mask;
        d->block_q = d->block_k = block;
    }
    return 0;
}

void fa_cli_free(fa_cli *cli) {
    free(cli->block_mask);
    cli->block_mask = NULL;
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
        snprintf(out + n, size - (size_t)n, " dropout=%g", (double)d->dropout_p);
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
