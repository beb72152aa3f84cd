/* fa-cl-mma-sweep: the OpenCL backend's matrix-unit kernels in tiles and
 * build options the planner does not pick, timed beside its own pick on
 * the same device in one run, so that a single GPU session says which
 * configuration the planner should choose. fp16, the FlashAttention-2
 * paper's setting (16k tokens, hidden 2048), head_dim 64 and 128, causal
 * and not, the sequence lengths of --seqlens.
 *
 * Each configuration forces one pass's tile (sub-groups, strips, the other
 * side, backward stages) and FLASHATTN_OPENCL_OPTIONS (tuning macros:
 * FA_RED_V2, FA_DQ_UNIT, a register cap) on a plan whose other pass stays
 * the planner's. Per point: the median device time of the repeats after
 * warm-up, TFLOP/s, the largest relative difference of its
 * outputs from the planner's (O forward; dQ, dK, dV backward: the same
 * inputs, so a broken configuration shows as a large difference), and,
 * where the build log folder is set (FLASHATTN_OPENCL_LOG_DIR with
 * -cl-nv-verbose in the options), the registers and spills NVIDIA's
 * compiler reports for the configuration's programs, and the IO model's
 * roofline time for the configuration's tile on this device (planner.h,
 * fa_io_fused). A table on stdout, JSON lines with --json. */
#include "dtype.h"
#include "fa_internal.h"
#include "cli.h"
#include "flashattn.h"
#include "plan.h"
#include "planner.h"
#include "planner_cl_mma.h"
#include "test_util.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_SEQLENS 8

/* One configuration of one pass; warps 0: the planner's own plan. */
typedef struct config {
    fa_pass pass;
    int dim;       /* 0: both head dims */
    int warps;     /* sub-groups */
    int strips;    /* m-row strips a sub-group owns */
    int other;     /* bc forward, br backward */
    int stages;    /* backward */
    const char *options;
    int slack;     /* fa_cl_mma_bwd_slack while the row runs */
} config;

/* Forward: the planner's pick on NVIDIA (64 x 64 in four sub-groups since
 * 2026-11-27) beside the eight-sub-group tiles it took before (128 x 128
 * at head_dim 64, 128 x 64 at 128). Backward: the planner's (32 x 64 in
 * four sub-groups, with V's tile at head_dim 64, with V in registers and
 * chunks of 16 at 128) beside the tile it took before at head_dim 64
 * (16 x 128 in eight) and the ones next to its own: 64 x 64 and two stages
 * at head_dim 64, the 32-query step at head_dim 128 unchunked
 * (FA_BWD_QC=32) and 16 x 128 in eight sub-groups with V in registers
 * (half the L2 bytes a product, one work-group a multiprocessor). Then
 * the tiles whose K and V only fit packed in the workspace (planner_cl_mma.c,
 * bwd_k_packed; not planned: no faster on an H200, 2026-11-29): 64 queries a step at head_dim
 * 128 in chunks of 16 and of 32, 32 queries in two stages against 64 keys
 * and against 128 in eight sub-groups (half the dQ reductions a flop, the
 * bytes the IO model says bound the planner's tile), and 64 x 128 in
 * eight sub-groups at head_dim 64. The runs of 2026-11-27 (bench/results/h200.md,
 * h100.md) timed the rest: rotated walks, 128-key tiles at head_dim 128,
 * register caps (`-cl-nv-maxrregcount N` fails to build on NVIDIA's
 * OpenCL; the `=` form had no effect), four-float dQ reductions, fragment
 * loads a k-step ahead, dQ units of eight n-tiles (spilled). */
static const config configs[] = {
    {FA_PASS_FORWARD, 0, 0, 0, 0, 1, "", 0},
    {FA_PASS_FORWARD, 64, 8, 1, 128, 1, "", 0},
    {FA_PASS_FORWARD, 128, 8, 1, 64, 1, "", 0},
    {FA_PASS_BACKWARD, 0, 0, 0, 0, 1, "", 0},
    {FA_PASS_BACKWARD, 64, 8, 1, 16, 1, "", 0},
    {FA_PASS_BACKWARD, 64, 4, 1, 64, 1, "", 0},
    {FA_PASS_BACKWARD, 64, 4, 1, 32, 2, "", 0},
    {FA_PASS_BACKWARD, 128, 4, 1, 32, 1, "-DFA_BWD_QC=32", 0},
    {FA_PASS_BACKWARD, 128, 8, 1, 16, 1, "", 0},
    {FA_PASS_BACKWARD, 128, 4, 1, 64, 1, "", 0},
    {FA_PASS_BACKWARD, 128, 4, 1, 64, 1, "-DFA_BWD_QC=32", 0},
    {FA_PASS_BACKWARD, 128, 4, 1, 32, 2, "", 0},
    {FA_PASS_BACKWARD, 128, 8, 1, 32, 2, "", 0},
    {FA_PASS_BACKWARD, 64, 8, 1, 64, 1, "", 0},
    /* The d128 step in chunks of 16 with dQ units of four, as planned
     * before 2026-11-29's whole step. */
    {FA_PASS_BACKWARD, 128, 0, 0, 0, 1, "-DFA_BWD_QC=16 -DFA_DQ_UNIT=4", 0},
    /* 128 keys in four sub-groups of two strips at head_dim 64: half the
     * dQ reductions a flop (a third of the backward's time on an H200,
     * 2026-11-29). In 48 KiB V goes to registers, and the register model
     * counts 208 words at chunks of 16 against NVIDIA's 184 (clang's
     * NVPTX build: 251 registers, no spill), hence its slack. */
    {FA_PASS_BACKWARD, 64, 4, 2, 32, 1, "", 24},
    /* The step on mma.sync where the planner's build takes the warpgroup
     * products (sm_90), at either head_dim. */
    {FA_PASS_BACKWARD, 64, 0, 0, 0, 1, "-DFA_BWD_NO_WGMMA", 0},
    {FA_PASS_BACKWARD, 128, 0, 0, 0, 1, "-DFA_BWD_NO_WGMMA", 0},
    /* The forward on mma.sync where the planner's build takes the
     * warpgroup products (sm_90). */
    {FA_PASS_FORWARD, 0, 0, 0, 0, 1, "-DFA_FWD_NO_WGMMA", 0},
};
#define N_CONFIGS ((int)(sizeof configs / sizeof configs[0]))

typedef struct opts {
    int seqlens[MAX_SEQLENS], n_seqlens, repeats, warmup, tokens, hidden;
    int passes; /* bit 0: forward, bit 1: backward */
    int dims;   /* bit 0: head_dim 64, bit 1: 128 */
    int planner_tiles; /* only the rows on the planner's tiles */
    int rows[N_CONFIGS], n_rows; /* only these rows (and the planner's plain ones); 0: every row */
    const char *json;
} opts;

/* Whether --rows leaves configuration ci in: the planner's plain rows are
 * the others' reference. */
static int row_chosen(const opts *o, int ci) {
    if (o->n_rows == 0 || (!configs[ci].warps && !configs[ci].options[0])) return 1;
    for (int i = 0; i < o->n_rows; i++)
        if (o->rows[i] == ci) return 1;
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: fa-cl-mma-sweep [--seqlens N,N,...] [--repeats N] [--warmup N] [--json FILE]\n"
                    "                       [--tokens T] [--hidden H] [--pass fwd|bwd] [--dim 64|128]\n"
                    "                       [--tiles planner|all] [--rows I,J,...]\n"
                    "  batch T / N, heads H / head_dim; defaults: --seqlens 4096,16384 --repeats 5 --warmup 1\n"
                    "  --tokens 16384 --hidden 2048; --rows: the configurations' indices (the planner's plain\n"
                    "  rows, every other row's reference, always run)\n");
    return 2;
}

static int parse(opts *o, int argc, char **argv) {
    o->seqlens[0] = 4096;
    o->seqlens[1] = 16384;
    o->n_seqlens = 2;
    o->repeats = 5;
    o->warmup = 1;
    o->json = NULL;
    o->tokens = 16384;
    o->hidden = 2048;
    o->passes = 3;
    o->dims = 3;
    o->planner_tiles = 0;
    o->n_rows = 0;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (strcmp(a, "--seqlens") == 0) {
            o->n_seqlens = fa_cli_int_list(v, 1, 65536, o->seqlens, MAX_SEQLENS);
            if (o->n_seqlens < 0) return usage();
        } else if (strcmp(a, "--repeats") == 0) {
            o->repeats = atoi(v);
        } else if (strcmp(a, "--warmup") == 0) {
            o->warmup = atoi(v);
        } else if (strcmp(a, "--tokens") == 0) {
            o->tokens = atoi(v);
        } else if (strcmp(a, "--hidden") == 0) {
            o->hidden = atoi(v);
        } else if (strcmp(a, "--pass") == 0) {
            o->passes = strcmp(v, "fwd") == 0 ? 1 : strcmp(v, "bwd") == 0 ? 2 : 0;
        } else if (strcmp(a, "--dim") == 0) {
            o->dims = strcmp(v, "64") == 0 ? 1 : strcmp(v, "128") == 0 ? 2 : 0;
        } else if (strcmp(a, "--tiles") == 0) {
            if (strcmp(v, "planner") != 0 && strcmp(v, "all") != 0) return usage();
            o->planner_tiles = strcmp(v, "planner") == 0;
        } else if (strcmp(a, "--rows") == 0) {
            o->n_rows = fa_cli_int_list(v, 0, N_CONFIGS - 1, o->rows, N_CONFIGS);
            if (o->n_rows <= 0) return usage();
        } else if (strcmp(a, "--json") == 0) {
            o->json = v;
        } else {
            return usage();
        }
    }
    for (int i = 0; i < o->n_seqlens; i++)
        if (o->tokens < o->seqlens[i] || o->tokens % o->seqlens[i]) return usage();
    return o->repeats > 0 && o->repeats <= 100 && o->warmup >= 0 && o->n_seqlens > 0 && o->passes && o->dims && o->hidden >= 128 &&
                   o->hidden % 128 == 0
               ? 0
               : usage();
}

/* q k v o dout dq dk dv lse; the planner's O, dQ, dK, dV on the host. */
typedef struct tensors {
    fa_buffer t[9];
    size_t bytes[9];
    uint16_t *ref[4];
} tensors;

static void free_tensors(tensors *s) {
    for (int i = 0; i < 9; i++)
        if (s->t[i]) fa_buffer_free(s->t[i]);
    for (int i = 0; i < 4; i++) free(s->ref[i]);
    memset(s, 0, sizeof *s);
}

static fa_status alloc_tensors(fa_context ctx, const fa_attention_desc *d, fa_rng *rng, tensors *s) {
    const size_t qn = (size_t)d->batch * (size_t)d->seqlen_q * (size_t)d->heads_q * (size_t)d->head_dim;
    const size_t kn = (size_t)d->batch * (size_t)d->seqlen_k * (size_t)d->heads_kv * (size_t)d->head_dim;
    const size_t bytes[9] = {2 * qn, 2 * kn, 2 * kn, 2 * qn, 2 * qn, 2 * qn, 2 * kn, 2 * kn,
                             (size_t)d->batch * (size_t)d->heads_q * (size_t)d->seqlen_q * 4};
    for (int i = 0; i < 9; i++) {
        s->bytes[i] = bytes[i];
        FA_CHECK(fa_buffer_alloc(ctx, bytes[i], &s->t[i]));
        if (i < 3 || i == 4) {
            void *host = fa_test_random_tensor(rng, FA_DTYPE_F16, (int64_t)(bytes[i] / 2));
            if (!host) return FA_ERR_OUT_OF_MEMORY;
            fa_status st = fa_buffer_upload(s->t[i], 0, host, bytes[i]);
            free(host);
            FA_CHECK(st);
        }
    }
    return FA_SUCCESS;
}

static fa_status run(fa_plan plan, const tensors *s, fa_pass pass) {
    const fa_buffer *t = s->t;
    if (pass == FA_PASS_FORWARD) return fa_forward(plan, t[0], t[1], t[2], t[3], t[8]);
    return fa_backward(plan, t[0], t[1], t[2], t[3], t[8], t[4], t[5], t[6], t[7]);
}

/* Output i of the pass (0: O; 1..3: dQ, dK, dV) and its tensor index. */
static int out_index(fa_pass pass, int i) { return pass == FA_PASS_FORWARD ? 3 : 4 + i; }

/* Largest relative (rms) difference of the pass's outputs from the
 * planner's; keep: store them as the planner's instead. */
static double compare_outputs(tensors *s, fa_pass pass, int keep) {
    double worst = 0.0;
    for (int i = pass == FA_PASS_FORWARD ? 0 : 1; i < (pass == FA_PASS_FORWARD ? 1 : 4); i++) {
        const int at = out_index(pass, i);
        uint16_t *h = malloc(s->bytes[at]);
        if (!h || fa_buffer_download(s->t[at], 0, h, s->bytes[at]) != FA_SUCCESS) {
            free(h);
            return NAN;
        }
        if (keep) {
            free(s->ref[i]);
            s->ref[i] = h;
            continue;
        }
        double num = 0.0, den = 0.0;
        for (size_t j = 0; s->ref[i] && j < s->bytes[at] / 2; j++) {
            const double a = fa_f16_to_f32(h[j]), b = fa_f16_to_f32(s->ref[i][j]);
            num += (a - b) * (a - b);
            den += b * b;
        }
        free(h);
        if (!s->ref[i] || isnan(num)) return NAN;
        const double e = sqrt(num / (den > 0.0 ? den : 1.0));
        if (e > worst) worst = e;
    }
    return worst;
}

/* The configuration's tile on the plan's pass (as tests/opencl_suite.c
 * forces tiles), its kernels rebuilt. */
static fa_status force(fa_plan plan, const config *c) {
    fa_kernel_plan *kp = c->pass == FA_PASS_FORWARD ? &plan->info.forward : &plan->info.backward;
    const fa_device_desc *dev = &plan->ctx->info.desc;
    const fa_mma_layout_info *l = fa_mma_layout_get(fa_mma_layout_of(dev));
    if (!l || kp->variant != FA_VARIANT_MMA) return fa_fail(FA_ERR_UNSUPPORTED, "the planner plans no matrix units here");
    if (c->warps) {
        const int cols = l->c_elems / l->c_rows, rows = c->warps * c->strips * l->m;
        const int fwd = c->pass == FA_PASS_FORWARD;
        kp->br = fwd ? rows : c->other;
        kp->bc = fwd ? c->other : rows;
        kp->thread_rows = fwd ? c->strips * l->c_rows : kp->br * cols / l->n;
        kp->thread_cols = fwd ? kp->bc * cols / l->n : c->strips * l->c_rows;
        kp->stages = c->stages;
        fa_cl_mma_geometry g;
        if (!fa_cl_mma_geometry_of(dev, &plan->desc, c->pass, kp->br, kp->bc, kp->thread_rows, kp->thread_cols,
                                   kp->stages, &g))
            return fa_fail(FA_ERR_UNSUPPORTED, "not a tile of this device (registers or layout)");
        /* The tile's own layout and figure: a device of two layouts
         * (CDNA) plans each tile in one of them. */
        kp->work_group_size = g.warps * fa_mma_layout_get(g.layout)->sub_group;
        kp->local_mem_bytes = g.local_mem;
        if (kp->local_mem_bytes > dev->local_mem_bytes)
            return fa_fail(FA_ERR_UNSUPPORTED, "%zu bytes of local memory", kp->local_mem_bytes);
        const int side = fwd ? plan->desc.seqlen_q : plan->desc.seqlen_k, tile = fwd ? kp->br : kp->bc;
        kp->num_work_groups = plan->desc.batch * (fwd ? plan->desc.heads_q : plan->desc.heads_kv) *
                              ((side + tile - 1) / tile);
    }
    plan->ctx->ops->plan_release(plan->ctx->impl, plan->impl);
    plan->impl = NULL;
    return plan->ctx->ops->plan_prepare(plan->ctx->impl, plan, &plan->impl);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static fa_status time_pass(const opts *o, fa_plan plan, const tensors *s, fa_pass pass, double *ms) {
    double times[100];
    if (pass == FA_PASS_BACKWARD) FA_CHECK(run(plan, s, FA_PASS_FORWARD));
    for (int i = 0; i < o->warmup + o->repeats; i++) {
        FA_CHECK(run(plan, s, pass));
        FA_CHECK(fa_context_synchronize(plan->ctx));
        double t = NAN;
        FA_CHECK(fa_plan_last_time_ms(plan, &t));
        if (i >= o->warmup) times[i - o->warmup] = t;
    }
    qsort(times, (size_t)o->repeats, sizeof times[0], cmp_double);
    *ms = times[o->repeats / 2];
    return FA_SUCCESS;
}

/* Registers and spills of the pass's kernels (fa_forward; fa_bwd_dkdv and
 * fa_bwd_dq) in the build logs in dir: the largest count and the spill
 * bytes over them, or "" without logs. */
static void registers(const char *dir, fa_pass pass, char *out, size_t size) {
    out[0] = '\0';
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return;
    const char *prefix = pass == FA_PASS_FORWARD ? "fa_forward" : "fa_bwd_d";
    int most = 0, spill = 0, kernels = 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        char path[1200], line[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = e->d_name[0] == '.' ? NULL : fopen(path, "r");
        if (!f) continue;
        int mine = 0;
        while (fgets(line, sizeof line, f)) {
            const char *q;
            int n = 0, m = 0;
            /* ptxas names the entry, then reports its stack, spills and
             * registers. */
            if ((q = strstr(line, "entry function '"))) mine = strncmp(q + 16, prefix, strlen(prefix)) == 0;
            if (mine && (q = strstr(line, "Used ")) && sscanf(q, "Used %d registers", &n) == 1) {
                kernels++;
                if (n > most) most = n;
            }
            if (mine && (q = strstr(line, "bytes stack frame,")) &&
                sscanf(q, "bytes stack frame, %d bytes spill stores", &m) == 1)
                spill += m;
        }
        fclose(f);
    }
    closedir(d);
    if (kernels) snprintf(out, size, spill ? "%d regs, spill %d B" : "%d regs", most, spill);
}

/* The tile, work-group, stages, and for the backward whether V's
 * fragments are in registers or K and V packed in the workspace, and the
 * queries computed in chunks. */
static void describe(fa_plan plan, const fa_kernel_plan *kp, const config *c, char *out, size_t size) {
    fa_cl_mma_geometry g;
    const int mma = kp->variant == FA_VARIANT_MMA &&
                    fa_cl_mma_geometry_of(&plan->ctx->info.desc, &plan->desc, c->pass, kp->br, kp->bc,
                                          kp->thread_rows, kp->thread_cols, kp->stages, &g);
    char chunk[16] = "";
    if (mma && c->pass == FA_PASS_BACKWARD && g.q_chunk < kp->br)
        snprintf(chunk, sizeof chunk, " qc%d", g.q_chunk);
    else if (mma && c->pass == FA_PASS_BACKWARD && g.dq_unit > 0)
        snprintf(chunk, sizeof chunk, " dqu%d", g.dq_unit);
    char slack[24] = "";
    if (c->slack) snprintf(slack, sizeof slack, " slack%d", c->slack);
    snprintf(out, size, "%s%dx%d/%d%s%s%s%s%s%s%s", c->warps ? "" : "planner ", kp->br, kp->bc, kp->work_group_size,
             kp->stages > 1 ? " 2-stage" : "", mma && g.v_regs ? " vreg" : "", mma && g.k_packed ? " kvpack" : "",
             chunk, slack, c->options[0] ? " " : "", c->options);
}

int main(int argc, char **argv) {
    opts o;
    if (parse(&o, argc, argv)) return 2;
    fa_context ctx;
    if (fa_context_create(FA_BACKEND_OPENCL, -1, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "no OpenCL device: %s\n", fa_last_error());
        return 1;
    }
    FILE *json = o.json ? fopen(o.json, "a") : NULL;
    /* Per configuration its own build log folder, under the one given. */
    const char *log_root = getenv("FLASHATTN_OPENCL_LOG_DIR");
    char base_options[512];
    snprintf(base_options, sizeof base_options, "%s", getenv("FLASHATTN_OPENCL_OPTIONS") ? getenv("FLASHATTN_OPENCL_OPTIONS") : "");
    fa_rng rng;
    fa_rng_seed(&rng, 20261125);
    int failed = 0;
    printf("%-4s %4s %6s %6s  %-44s %9s %8s %9s %9s  %s\n", "pass", "d", "causal", "N", "configuration", "ms",
           "TFLOP/s", "diff", "model ms", "registers / why not");
    /* Non-causal first: a run cut short by its time limit keeps them. */
    for (int causal = 0; causal < 2; causal++)
        for (int dim = 64; dim <= 128; dim *= 2)
            for (int si = 0; si < o.n_seqlens; si++) {
                const int n = o.seqlens[si];
                fa_attention_desc d;
                fa_attention_desc_init(&d);
                d.batch = o.tokens / n;
                d.seqlen_q = d.seqlen_k = n;
                d.heads_q = d.heads_kv = o.hidden / dim;
                d.head_dim = dim;
                d.causal = causal;
                d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
                tensors s;
                memset(&s, 0, sizeof s);
                if (alloc_tensors(ctx, &d, &rng, &s) != FA_SUCCESS) {
                    fprintf(stderr, "tensors for d %d N %d: %s\n", dim, n, fa_last_error());
                    free_tensors(&s);
                    failed = 1;
                    continue;
                }
                for (int ci = 0; ci < N_CONFIGS; ci++) {
                    const config *c = &configs[ci];
                    if ((c->dim && c->dim != dim) || !(o.passes >> c->pass & 1) || !(o.dims >> (dim / 128) & 1) ||
                        (o.planner_tiles && c->warps) || !row_chosen(&o, ci))
                        continue;
                    char options[1024], logs[1100] = "", what[128], regs[64] = "";
                    snprintf(options, sizeof options, "%s%s%s", base_options, base_options[0] && c->options[0] ? " " : "",
                             c->options);
                    setenv("FLASHATTN_OPENCL_OPTIONS", options, 1);
                    if (log_root && log_root[0]) {
                        snprintf(logs, sizeof logs, "%s/d%d-c%d-%02d", log_root, dim, causal, ci);
                        mkdir(logs, 0755);
                        setenv("FLASHATTN_OPENCL_LOG_DIR", logs, 1);
                    }
                    fa_plan plan = NULL;
                    double ms = NAN, diff = NAN;
                    fa_status st = fa_plan_create(ctx, &d, &plan);
                    /* The row's slack from its forced tile on (the plan
                     * itself is the planner's), until it is described. */
                    fa_cl_mma_bwd_slack = c->slack;
                    if (st == FA_SUCCESS) st = force(plan, c);
                    if (st == FA_SUCCESS) st = time_pass(&o, plan, &s, c->pass, &ms);
                    /* The planner's plain run is the reference of the rest. */
                    if (st == FA_SUCCESS) diff = compare_outputs(&s, c->pass, !c->warps && !c->options[0]);
                    const fa_kernel_plan *kp =
                        plan ? (c->pass == FA_PASS_FORWARD ? &plan->info.forward : &plan->info.backward) : NULL;
                    if (kp)
                        describe(plan, kp, c, what, sizeof what);
                    else
                        snprintf(what, sizeof what, "(no plan)");
                    fa_cl_mma_bwd_slack = 0;
                    if (st == FA_SUCCESS)
                        registers(logs[0] ? logs : NULL, c->pass, regs, sizeof regs);
                    const double tflops = fa_attention_flops(&d, c->pass) / ms * 1e-9;
                    const double model = kp ? fa_io_fused(&ctx->info.desc, &d, c->pass, kp).roofline_ms : NAN;
                    const char *why = st == FA_SUCCESS ? regs : fa_last_error();
                    printf("%-4s %4d %6s %6d  %-44s %9.3f %8.1f %9.2e %9.3f  %.150s\n",
                           c->pass == FA_PASS_FORWARD ? "fwd" : "bwd", dim, causal ? "yes" : "no", n, what, ms, tflops,
                           diff, model, why);
                    fflush(stdout);
                    if (json && st == FA_SUCCESS)
                        fprintf(json,
                                "{\"pass\": \"%s\", \"dim\": %d, \"causal\": %d, \"seqlen\": %d, \"config\": \"%s\", "
                                "\"br\": %d, \"bc\": %d, \"wg\": %d, \"stages\": %d, \"options\": \"%s\", \"ms\": %.6g, "
                                "\"tflops\": %.6g, \"diff\": %.3g, \"model_ms\": %.6g, \"registers\": \"%s\"}\n",
                                c->pass == FA_PASS_FORWARD ? "fwd" : "bwd", dim, causal, n, what, kp->br, kp->bc,
                                kp->work_group_size, kp->stages, c->options, ms, tflops, isnan(diff) ? -1.0 : diff,
                                isnan(model) ? -1.0 : model, regs);
                    if (json) fflush(json);
                    if (plan) fa_plan_destroy(plan);
                }
                free_tensors(&s);
            }
    setenv("FLASHATTN_OPENCL_OPTIONS", base_options, 1);
    if (json) fclose(json);
    fa_context_destroy(ctx);
    return failed;
}
