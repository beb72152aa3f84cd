/* The OpenCL matrix-unit kernels compiled for Intel and AMD GPUs that are
 * not here (GUIDE section 8): every program the planner emits for the
 * described Arc A770 (Xe-HPG: DPAS through
 * cl_intel_subgroup_matrix_multiply_accumulate), MI250X (gfx90a) and MI300X
 * (CDNA3, compiled for gfx940: clang-16 does not know gfx942), both taken
 * as OpenCL devices, and RX 7900 XTX (gfx1100, WMMA), over fp16 and bf16,
 * head dims 64, 72, 128 and 256, causal or not, training and decoding
 * shapes (split keys), atomic and deterministic backward; at head dims 64
 * and 128 also with every score option (softcap, ALiBi, additive bias).
 * - Intel: `ocloc compile -device dg2` (the build option
 *   -Dcl_intel_subgroup_matrix_multiply_accumulate=1 declares the
 *   built-ins), then `ocloc disasm`: every program must show `dpas`; the
 *   table gives the highest GRF a kernel names.
 * - AMD: clang (-target amdgcn-amd-amdhsa -S) with ROCm's device library
 *   bitcode linked (without it every OpenCL built-in is a call, and the
 *   call stack shows up as scratch); every program must show its v_mfma or
 *   v_wmma; the table gives VGPRs, AGPRs, SGPRs and scratch bytes per
 *   kernel from the code object's metadata.
 * A compile error, a spill or scratch memory fails the case (AMD's SGPR
 * spills, into VGPR lanes rather than memory, are shown, not failed).
 *
 * Environment: FA_OCLOC (default ocloc on PATH), FA_CLANG_AMDGCN (default
 * clang-16), FA_AMDGCN_BITCODE (default
 * /usr/lib/x86_64-linux-gnu/amdgcn/bitcode, Debian's rocm-device-libs).
 * Without a compiler the target's case skips.
 *
 * fa-test-labels: compile */
#include "harness.h"
#include "test_util.h"

#include "fa_internal.h"
#include "flashattn.h"
#include "kernel_sources.h"
#include "planner.h"
#include "planner_cl_mma.h"

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_mma.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef FA_WITH_OPENCL

extern char **environ;

#define MAX_PROGRAMS 256
#define OUT_BYTES (1u << 20)

typedef struct program {
    fa_mma_layout layout;
    int backward; /* the dK/dV kernel's file (bwd_mma.cl) rather than fwd_mma.cl */
    int split;    /* with splitk.cl */
    char options[512];
} program;

typedef struct program_set {
    program p[MAX_PROGRAMS];
    int count;
} program_set;

static void add_program(program_set *set, fa_mma_layout layout, int backward, int split, const char *options) {
    for (int i = 0; i < set->count; i++)
        if (set->p[i].layout == layout && strcmp(set->p[i].options, options) == 0) return;
    CHECK_MSG(set->count < MAX_PROGRAMS, "more than %d programs", MAX_PROGRAMS);
    if (set->count >= MAX_PROGRAMS) return;
    program *p = &set->p[set->count++];
    p->layout = layout;
    p->backward = backward;
    p->split = split;
    snprintf(p->options, sizeof p->options, "%s", options);
}

/* The build options the OpenCL backend gives a pass's program
 * (backends/opencl/cl_attention.c) on a GPU, the layout's own appended. */
static void pass_options(const fa_attention_desc *d, fa_mma_layout layout, int br, int bc, int tr, int tc, int warps,
                         const char *extra, char *out, size_t size) {
    const int bias = d->bias_batch > 0;
    snprintf(out, size, "-DHEAD_DIM=%d %s%s%s%s%s%s -DFA_GPU -DBR=%d -DBC=%d -DTR=%d -DTC=%d%s", d->head_dim,
             d->q.dtype == FA_DTYPE_F16 ? "-DDTYPE_F16" : "-DDTYPE_BF16", d->causal ? " -DCAUSAL" : "",
             d->softcap > 0.0f ? " -DSOFTCAP" : "", d->alibi_slopes ? " -DALIBI" : "", bias ? " -DBIAS" : "",
             bias && d->bias.dtype == FA_DTYPE_F32 ? " -DBIAS_F32" : "", br, bc, tr, tc, extra);
    CHECK_OK(fa_cl_mma_options(layout, 0, warps, out, size));
}

/* The programs of one plan: forward (split or not), the backward's dK/dV
 * kernel and, deterministic, its dQ kernel. */
static void add_plan(program_set *set, const fa_device_desc *dev, const fa_attention_desc *d,
                     const fa_plan_info *info) {
    char opts[512];
    const fa_kernel_plan *f = &info->forward, *b = &info->backward;
    fa_cl_mma_geometry g;
    int ok = f->variant == FA_VARIANT_MMA &&
             fa_cl_mma_geometry_of(dev, d, FA_PASS_FORWARD, f->br, f->bc, f->thread_rows, f->thread_cols, f->stages, &g);
    CHECK(ok || f->variant != FA_VARIANT_MMA);
    if (ok) {
        const int split = f->split_k > 1;
        char extra[32];
        snprintf(extra, sizeof extra, "%s%s", split ? " -DSPLITK" : "", g.q_regs ? " -DQREG" : "");
        pass_options(d, g.layout, f->br, f->bc, f->thread_rows, f->thread_cols, g.warps, extra, opts, sizeof opts);
        add_program(set, g.layout, 0, split, opts);
    }
    ok = b->variant == FA_VARIANT_MMA &&
         fa_cl_mma_geometry_of(dev, d, FA_PASS_BACKWARD, b->br, b->bc, b->thread_rows, b->thread_cols, b->stages, &g);
    CHECK(ok || b->variant != FA_VARIANT_MMA);
    if (ok) {
        char extra[80], chunk[32] = "";
        if (g.q_chunk < b->br)
            snprintf(chunk, sizeof chunk, " -DQC=%d", g.q_chunk);
        else if (g.dq_unit > 0 && !d->deterministic)
            snprintf(chunk, sizeof chunk, " -DDQ_UNIT=%d", g.dq_unit);
        snprintf(extra, sizeof extra, "%s%s%s%s%s", d->deterministic ? "" : " -DDQ_ATOMIC",
                 g.stages > 1 ? " -DSTAGES=2" : "", g.v_regs ? " -DVREG" : "", g.k_packed ? " -DKPACK" : "", chunk);
        pass_options(d, g.layout, b->br, b->bc, b->thread_rows, b->thread_cols, g.warps, extra, opts, sizeof opts);
        add_program(set, g.layout, 1, 0, opts);
        if (d->deterministic) {
            const fa_mma_layout_info *l = fa_mma_layout_get(g.layout);
            pass_options(d, g.layout, b->br, b->bc, l->c_rows, b->bc * (l->c_elems / l->c_rows) / l->n, g.dq_warps,
                         " -DFA_BWD_DQ", opts, sizeof opts);
            add_program(set, g.layout, 1, 0, opts);
        }
    }
}

/* Every program the planner emits for the device over the problems above;
 * the count of plans on matrix units. Features: 0 none; 1 causal and
 * deterministic; at head dims 64 and 128 also 2, causal with every score
 * option (softcap, ALiBi, a bias: fp32 beside fp16 inputs, bf16 beside
 * bf16), and 3, deterministic with every score option. */
static int enumerate(const fa_device_desc *dev, program_set *set) {
    static const int dims[] = {64, 72, 128, 256};
    static const int shapes[][4] = {{2, 2048, 2048, 16}, {1, 1, 8192, 16}};
    static const float slopes[16] = {0.5f};
    int mma = 0;
    set->count = 0;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++)
            for (size_t s = 0; s < FA_ARRAY_SIZE(shapes); s++)
                for (int features = 0; features < 4; features++) {
                    if (features >= 2 && dims[i] != 64 && dims[i] != 128) continue;
                    fa_attention_desc d;
                    fa_attention_desc_init(&d);
                    d.batch = shapes[s][0];
                    d.seqlen_q = shapes[s][1];
                    d.seqlen_k = shapes[s][2];
                    d.heads_q = d.heads_kv = shapes[s][3];
                    d.head_dim = dims[i];
                    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t ? FA_DTYPE_BF16 : FA_DTYPE_F16;
                    d.causal = features == 1 || features == 2;
                    d.deterministic = features == 1 || features == 3;
                    if (features >= 2) {
                        d.softcap = 30.0f;
                        d.alibi_slopes = slopes;
                        d.bias_batch = 1;
                        d.bias_heads = d.heads_q;
                        d.bias.dtype = t ? FA_DTYPE_BF16 : FA_DTYPE_F32;
                    }
                    fa_plan_info info;
                    const fa_status st = fa_plan_for_device(dev, &d, &info);
                    CHECK_MSG(st == FA_SUCCESS, "planning for %s: %s", dev->name, fa_last_error());
                    if (st != FA_SUCCESS) continue;
                    mma += info.forward.variant == FA_VARIANT_MMA || info.backward.variant == FA_VARIANT_MMA;
                    add_plan(set, dev, &d, &info);
                }
    return mma;
}

/* The backward with K and V packed (KPACK), which no plan takes until it
 * is measured: two stages of each layout's tile of four sub-groups and two
 * k-steps of queries (as test_opencl_mma's packed_keys_backward runs),
 * head_dim 64 and 128, fp16 and bf16, with the least local memory (up to
 * the device's) at which the tile packs. Returns the programs added. */
static int add_packed_backward(program_set *set, const fa_device_desc *base) {
    fa_mma_layout ids[FA_MMA_MAX_LAYOUTS];
    const int nl = fa_mma_layouts_of(base, ids);
    int added = 0;
    for (int li = 0; li < nl; li++) {
        const fa_mma_layout_info *l = fa_mma_layout_get(ids[li]);
        const int side = l->k > l->n ? l->k : l->n, cols = l->c_elems / l->c_rows;
        const int br = 2 * (side > 16 ? side : 16), bc = 4 * l->m, tr = br * cols / l->n, tc = l->c_rows;
        for (int t = 0; t < 2; t++)
            for (int dim = 64; dim <= 128; dim += 64) {
                fa_attention_desc d;
                fa_attention_desc_init(&d);
                d.batch = 2;
                d.seqlen_q = d.seqlen_k = 2048;
                d.heads_q = d.heads_kv = 16;
                d.head_dim = dim;
                d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t ? FA_DTYPE_BF16 : FA_DTYPE_F16;
                d.causal = t;
                fa_device_desc dev = *base;
                fa_cl_mma_geometry g;
                int found = 0;
                for (int kib = 16; (size_t)kib * 1024 <= base->local_mem_bytes && !found; kib += 4) {
                    dev.local_mem_bytes = (size_t)kib * 1024;
                    found = fa_cl_mma_geometry_of(&dev, &d, FA_PASS_BACKWARD, br, bc, tr, tc, 2, &g) &&
                            g.layout == ids[li] && g.k_packed && g.local_mem <= fa_plan_usable_local_mem(&dev);
                }
                if (!found) continue;
                fa_plan_info info;
                memset(&info, 0, sizeof info);
                info.forward.variant = FA_VARIANT_SIMT;
                info.backward = (fa_kernel_plan){.variant = FA_VARIANT_MMA, .br = br, .bc = bc, .thread_rows = tr,
                                                 .thread_cols = tc, .stages = 2};
                const int before = set->count;
                add_plan(set, &dev, &d, &info);
                added += set->count - before;
            }
    }
    return added;
}

/* A program's source, as the backend builds it (fa_cl_mma_sources), into
 * path. */
static int write_source(const program *p, const char *path) {
    static const char *const fwd[] = {"kernels_cl/fwd_mma.cl"};
    static const char *const fwd_split[] = {"kernels_cl/fwd_mma.cl", "kernels_cl/splitk.cl"};
    static const char *const bwd[] = {"kernels_cl/bwd_common.cl", "kernels_cl/bwd_mma.cl"};
    const char *paths[8];
    const int n = p->backward ? fa_cl_mma_sources(p->layout, bwd, 2, paths, 8)
                  : p->split  ? fa_cl_mma_sources(p->layout, fwd_split, 2, paths, 8)
                              : fa_cl_mma_sources(p->layout, fwd, 1, paths, 8);
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    int ok = n > 0;
    for (int i = 0; i < n && ok; i++) {
        const fa_kernel_source *s = fa_kernel_source_find(paths[i]);
        ok = s && fprintf(f, "#line 1 \"%s\"\n", paths[i]) > 0 && fwrite(s->text, 1, s->size, f) == s->size &&
             fputc('\n', f) != EOF;
    }
    return fclose(f) == 0 && ok;
}

/* Splits options at spaces into args[] (no quoting in ours); -1 where
 * they do not fit in cap. */
static int split_args(char *text, const char **args, int at, int cap) {
    for (char *tok = strtok(text, " "); tok; tok = strtok(NULL, " ")) {
        if (at >= cap) return -1;
        args[at++] = tok;
    }
    return at;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        const long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) != NULL) {
            const size_t got = fread(text, 1, (size_t)n, f);
            text[got] = '\0';
        }
    }
    fclose(f);
    return text;
}

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && v[0] ? v : fallback;
}

/* Whether a compiler runs at all (its version query exits 0). */
static int have_program(const char *tool, const char *arg) {
    static char out[4096];
    const char *args[] = {arg, NULL};
    return fa_test_run_program(tool, args, out, sizeof out, 60.0) == 0;
}

static void temp_dir(char *dir, size_t size) {
    snprintf(dir, size, "%s/fa-cl-compile-XXXXXX", env_or("TMPDIR", "/tmp"));
    if (!mkdtemp(dir)) dir[0] = '\0';
}

/* ---------------------------------------------------------------- AMD */

/* One kernel's figures from the code object metadata (.amdhsa.kernels). */
typedef struct amd_usage {
    char name[48];
    long vgpr, agpr, sgpr, scratch, vgpr_spill, sgpr_spill;
} amd_usage;

static long meta_value(const char *line, const char *key) {
    const char *at = strstr(line, key);
    return at ? strtol(at + strlen(key), NULL, 10) : -1;
}

/* The kernels of an -S output (at most cap); their count. The metadata
 * lists the kernels as "- ." items, their keys two columns in; the items
 * further in are the arguments'. */
static int amd_kernels(const char *text, amd_usage *out, int cap) {
    const char *meta = strstr(text, "amdhsa.kernels:");
    int n = -1, indent = -1;
    for (const char *line = meta; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *p = line;
        while (*p == ' ') p++;
        const int at = (int)(p - line);
        if (p[0] == '-' && p[1] == ' ' && p[2] == '.' && (indent < 0 || at == indent)) {
            if (n + 1 >= cap) break;
            indent = at;
            memset(&out[++n], 0, sizeof out[0]);
            p += 2;
        } else if (n < 0 || at != indent + 2) {
            continue;
        }
        amd_usage *u = &out[n];
        if (strncmp(p, ".name:", 6) == 0) sscanf(p + 6, " %47s", u->name);
        if (strncmp(p, ".vgpr_count:", 12) == 0) u->vgpr = meta_value(p, ":");
        if (strncmp(p, ".agpr_count:", 12) == 0) u->agpr = meta_value(p, ":");
        if (strncmp(p, ".sgpr_count:", 12) == 0) u->sgpr = meta_value(p, ":");
        if (strncmp(p, ".private_segment_fixed_size:", 28) == 0) u->scratch = meta_value(p, ":");
        if (strncmp(p, ".vgpr_spill_count:", 18) == 0) u->vgpr_spill = meta_value(p, ":");
        if (strncmp(p, ".sgpr_spill_count:", 18) == 0) u->sgpr_spill = meta_value(p, ":");
    }
    return n + 1;
}

static void label(const program *p, char *out, size_t size) {
    /* The options that tell programs apart, without the common prefix. */
    snprintf(out, size, "%s %s", fa_mma_layout_get(p->layout)->name, p->options);
}

/* One clang run of an AMD sweep: its command line (args point into the
 * buffers), its output file and log, and how it ended. */
typedef struct amd_job {
    const program *p;
    int target;
    char src[300], asm_path[300], log[300], mcpu[32], isa[512], opts[512];
    const char *args[96];
    pid_t pid;
    double started;
    int rc; /* clang's exit status; -1 could not run, was killed or timed out */
} amd_job;

#define AMD_COMPILE_TIMEOUT_S 600.0

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static pid_t start_clang(const char *clang, amd_job *j) {
    const char *argv[98];
    argv[0] = clang;
    int n = 1;
    for (const char *const *a = j->args; *a; a++) argv[n++] = *a;
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) return -1;
    posix_spawn_file_actions_addopen(&fa, 1, j->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, clang, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

/* Runs every job, as many clangs at a time as there are cores (the sweep
 * is a chain of single-threaded compiles that otherwise leaves CI's
 * second core idle), each killed after AMD_COMPILE_TIMEOUT_S. */
static void run_amd_jobs(const char *clang, amd_job *jobs, int count) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int parallel = cores < 1 ? 1 : cores > 8 ? 8 : (int)cores;
    int next = 0, running = 0;
    while (next < count || running > 0) {
        while (running < parallel && next < count) {
            amd_job *j = &jobs[next++];
            j->pid = start_clang(clang, j);
            j->started = now_s();
            if (j->pid > 0) running++;
        }
        if (running == 0) break;
        int status = 0;
        const pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno != EINTR) break;
        if (pid <= 0) {
            const double t = now_s();
            for (int i = 0; i < next; i++)
                if (jobs[i].pid > 0 && t - jobs[i].started > AMD_COMPILE_TIMEOUT_S) kill(jobs[i].pid, SIGKILL);
            struct timespec nap = {0, 20 * 1000 * 1000};
            nanosleep(&nap, NULL);
            continue;
        }
        for (int i = 0; i < next; i++)
            if (jobs[i].pid == pid) {
                const int timed_out = now_s() - jobs[i].started > AMD_COMPILE_TIMEOUT_S;
                jobs[i].rc = !timed_out && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                jobs[i].pid = 0;
                running--;
            }
    }
}

/* Compiles the described device's programs for each gfx target. */
static void amd_sweep(const char *key, const char *const *targets, int ntargets, int wave64) {
    const char *clang = env_or("FA_CLANG_AMDGCN", "clang-16");
    const char *bitcode = env_or("FA_AMDGCN_BITCODE", "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode");
    if (!have_program(clang, "--version")) FA_SKIP("no clang for amdgcn (FA_CLANG_AMDGCN, default clang-16)");
    char probe[512];
    snprintf(probe, sizeof probe, "%s/opencl.bc", bitcode);
    if (access(probe, R_OK) != 0) FA_SKIP("no ROCm device library bitcode (FA_AMDGCN_BITCODE; rocm-device-libs)");

    fa_device_desc dev = fa_described_device_find(key)->desc;
    dev.backend = FA_BACKEND_OPENCL; /* the HIP descriptions' chips, through AMD's OpenCL */
    static program_set set;
    const int plans = enumerate(&dev, &set);
    CHECK_MSG(plans > 0 && set.count > 0, "%s: no plan on matrix units", key);
    const int packed = add_packed_backward(&set, &dev);
    /* RDNA3's layout has no backward on its matrix units (budget 0). */
    CHECK_MSG(packed > 0 || !wave64, "%s: no backward with K and V packed", key);
    char dir[256];
    temp_dir(dir, sizeof dir);
    CHECK_MSG(dir[0], "no temporary folder");
    if (!dir[0]) return;
    static char out[OUT_BYTES];
    printf("%s (%s): %d programs of %d plans on matrix units (%d of them K and V packed, forced)\n", key, dev.name,
           set.count, plans, packed);
    printf("  target  kernel            vgpr agpr sgpr s-spill scratch  program\n");
    /* The device library: OpenCL's built-ins, the math library and the
     * wavefront size's control bitcode. */
    static const char *const libs[] = {"opencl", "ocml", "ockl", "oclc_finite_only_off",
                                       "oclc_unsafe_math_off", "oclc_daz_opt_off",
                                       "oclc_correctly_rounded_sqrt_on", "oclc_abi_version_400"};
    char lib_paths[FA_ARRAY_SIZE(libs) + 1][512];
    for (size_t l = 0; l <= FA_ARRAY_SIZE(libs); l++) {
        if (l < FA_ARRAY_SIZE(libs))
            snprintf(lib_paths[l], sizeof lib_paths[l], "%s/%s.bc", bitcode, libs[l]);
        else
            snprintf(lib_paths[l], sizeof lib_paths[l], "%s/oclc_wavefrontsize64_%s.bc", bitcode,
                     wave64 ? "on" : "off");
    }
    amd_job *jobs = calloc((size_t)(ntargets * set.count), sizeof *jobs);
    CHECK(jobs != NULL);
    if (!jobs) return;
    int count = 0;
    for (int i = 0; i < set.count; i++) {
        char src[300];
        snprintf(src, sizeof src, "%s/p%d.cl", dir, i);
        const int written = write_source(&set.p[i], src);
        CHECK(written);
        if (!written) continue;
        for (int t = 0; t < ntargets; t++) {
            amd_job *j = &jobs[count];
            j->p = &set.p[i];
            j->target = t;
            j->rc = -1;
            snprintf(j->src, sizeof j->src, "%s", src);
            snprintf(j->asm_path, sizeof j->asm_path, "%s/p%d_%s.s", dir, i, targets[t]);
            snprintf(j->log, sizeof j->log, "%s/p%d_%s.log", dir, i, targets[t]);
            snprintf(j->mcpu, sizeof j->mcpu, "-mcpu=%s", targets[t]);
            const char **args = j->args;
            int n = 0;
            args[n++] = "-x";
            args[n++] = "cl";
            args[n++] = "-cl-std=CL1.2";
            args[n++] = "-Xclang";
            args[n++] = "-finclude-default-header";
            args[n++] = "-target";
            args[n++] = "amdgcn-amd-amdhsa";
            args[n++] = j->mcpu;
            args[n++] = "-nogpulib";
            args[n++] = "-O3";
            args[n++] = "-S";
            args[n++] = "-o";
            args[n++] = j->asm_path;
            for (size_t l = 0; l <= FA_ARRAY_SIZE(libs); l++) {
                args[n++] = "-Xclang";
                args[n++] = "-mlink-builtin-bitcode";
                args[n++] = "-Xclang";
                args[n++] = lib_paths[l];
            }
            snprintf(j->isa, sizeof j->isa, "%s/oclc_isa_version_%s.bc", bitcode, targets[t] + 3);
            if (access(j->isa, R_OK) == 0) {
                args[n++] = "-Xclang";
                args[n++] = "-mlink-builtin-bitcode";
                args[n++] = "-Xclang";
                args[n++] = j->isa;
            }
            snprintf(j->opts, sizeof j->opts, "%s", j->p->options);
            n = split_args(j->opts, args, n, (int)FA_ARRAY_SIZE(j->args) - 2);
            CHECK_MSG(n > 0, "%s: the options do not fit the command line", j->p->options);
            if (n <= 0) continue;
            args[n++] = j->src;
            args[n] = NULL;
            count++;
        }
    }
    run_amd_jobs(clang, jobs, count);

    int failed = 0;
    for (int c = 0; c < count; c++) {
        const amd_job *j = &jobs[c];
        const char *target = targets[j->target];
        char name[640];
        label(j->p, name, sizeof name);
        if (j->rc != 0) {
            failed++;
            char *log = read_file(j->log);
            snprintf(out, sizeof out, "%s", log ? log : "");
            free(log);
            CHECK_MSG(0, "%s %s: clang failed (%d):\n%.2000s", target, name, j->rc, out);
            remove(j->log);
            continue;
        }
        remove(j->log);
        char *text = read_file(j->asm_path);
        CHECK_MSG(text, "%s: no output", j->asm_path);
        if (!text) continue;
        const char *instr = strcmp(target, "gfx1100") == 0 ? "v_wmma_f32_16x16x16" : "v_mfma_f32_";
        CHECK_MSG(strstr(text, instr) != NULL, "%s %s: no %s in the code", target, name, instr);
        amd_usage k[8];
        const int nk = amd_kernels(text, k, 8);
        CHECK_MSG(nk > 0, "%s %s: no kernel metadata", target, name);
        for (int i = 0; i < nk; i++) {
            printf("  %-7s %-17s %4ld %4ld %4ld %7ld %7ld  %s\n", target, k[i].name, k[i].vgpr, k[i].agpr,
                   k[i].sgpr, k[i].sgpr_spill, k[i].scratch, name);
            /* SGPRs spill into VGPR lanes, not memory: shown, not failed. */
            const int clean = k[i].scratch == 0 && k[i].vgpr_spill == 0;
            CHECK_MSG(clean, "%s %s %s: %ld bytes of scratch, %ld VGPRs spilled", target, k[i].name, name,
                      k[i].scratch, k[i].vgpr_spill);
            failed += !clean;
        }
        free(text);
        remove(j->asm_path);
    }
    for (int i = 0; i < set.count; i++) {
        char src[300];
        snprintf(src, sizeof src, "%s/p%d.cl", dir, i);
        remove(src);
    }
    free(jobs);
    rmdir(dir);
    printf("%s: %d programs x %d targets, %d failed\n", key, set.count, ntargets, failed);
}

/* -------------------------------------------------------------- Intel */

/* The highest GRF number an IGA listing names (r0 .. r255); -1 none. */
static int highest_grf(const char *text) {
    int most = -1;
    for (const char *p = text; (p = strchr(p, 'r')) != NULL; p++) {
        if (p > text && ((p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= '0' && p[-1] <= '9') || p[-1] == '_'))
            continue;
        if (p[1] < '0' || p[1] > '9') continue;
        const int r = atoi(p + 1);
        if (r > most && r < 256) most = r;
    }
    return most;
}

/* The concatenated IGA listings a disassembly wrote into dir; NULL none. */
static char *listings(const char *dir, const char *const *kernels, int count) {
    size_t total = 0;
    char *all = NULL;
    for (int i = 0; i < count; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%s_KernelHeap.asm", dir, kernels[i]);
        char *text = read_file(path);
        if (!text) continue;
        const size_t n = strlen(text);
        char *grown = realloc(all, total + n + 1);
        if (grown) {
            memcpy(grown + total, text, n + 1);
            total += n;
            all = grown;
        }
        free(text);
        remove(path);
    }
    return all;
}

static void sweep_intel_dg2(void) {
    const char *ocloc = env_or("FA_OCLOC", "ocloc");
    if (!have_program(ocloc, "-version") && !have_program(ocloc, "--help"))
        FA_SKIP("no ocloc (FA_OCLOC; Debian's intel-opencl-icd)");
    const fa_device_desc *dev = &fa_described_device_find("arc-a770")->desc;
    static program_set set;
    const int plans = enumerate(dev, &set);
    CHECK_MSG(plans > 0 && set.count > 0, "arc-a770: no plan on matrix units");
    char dir[256];
    temp_dir(dir, sizeof dir);
    CHECK_MSG(dir[0], "no temporary folder");
    if (!dir[0]) return;
    static char out[OUT_BYTES];
    printf("arc-a770 (%s): %d programs of %d plans on matrix units, for dg2\n", dev->name, set.count, plans);
    printf("  dpas  top-grf  scratch  program\n");
    for (int i = 0; i < set.count; i++) {
        const program *p = &set.p[i];
        char src[300], bin[300], dump[300], opts[640], name[640];
        snprintf(src, sizeof src, "%s/p%d.cl", dir, i);
        snprintf(bin, sizeof bin, "p%d", i);
        snprintf(dump, sizeof dump, "%s/d%d", dir, i);
        const int written = write_source(p, src);
        CHECK(written);
        if (!written) continue;
        /* Debian's ocloc does not define the extension's macro for dg2:
         * the built-ins are declared where the program defines it. */
        snprintf(opts, sizeof opts, "-cl-std=CL1.2 -Dcl_intel_subgroup_matrix_multiply_accumulate=1 %s",
                 p->options);
        label(p, name, sizeof name);
        const char *cargs[] = {"compile", "-file", src, "-device", "dg2", "-output_no_suffix", "-output",
                               bin, "-out_dir", dir, "-options", opts, NULL};
        int rc = fa_test_run_program(ocloc, cargs, out, sizeof out, 600.0);
        CHECK_MSG(rc == 0, "dg2 %s: ocloc failed (%d):\n%.2000s", name, rc, out);
        if (rc != 0) continue;
        CHECK_MSG(strstr(out, "spill") == NULL, "dg2 %s: the compiler spills:\n%.2000s", name, out);
        char bin_path[600];
        snprintf(bin_path, sizeof bin_path, "%s/%s", dir, bin);
        const char *dargs[] = {"disasm", "-file", bin_path, "-device", "dg2", "-dump", dump, NULL};
        rc = fa_test_run_program(ocloc, dargs, out, sizeof out, 600.0);
        CHECK_MSG(rc == 0, "dg2 %s: ocloc disasm failed (%d):\n%.2000s", name, rc, out);
        if (rc != 0) continue;
        static const char *const fwd_kernels[] = {"fa_forward", "fa_splitk_merge"};
        static const char *const bwd_kernels[] = {"fa_bwd_dkdv", "fa_bwd_dq", "fa_bwd_dot", "fa_bwd_dq_convert"};
        char *text = p->backward ? listings(dump, bwd_kernels, 4) : listings(dump, fwd_kernels, 2);
        CHECK_MSG(text, "dg2 %s: no kernel listing in %s", name, dump);
        if (!text) continue;
        int dpas = 0;
        for (const char *at = text; (at = strstr(at, "dpas")) != NULL; at += 4) dpas++;
        const int scratch = strstr(text, "scratch") != NULL;
        printf("  %4d  %7d  %7s  %s\n", dpas, highest_grf(text), scratch ? "yes" : "no", name);
        CHECK_MSG(dpas > 0, "dg2 %s: no dpas in the code", name);
        CHECK_MSG(!scratch, "dg2 %s: the code uses scratch memory", name);
        free(text);
    }
    printf("arc-a770: %d programs for dg2\n", set.count);
}

static void sweep_amd_cdna(void) {
    /* MI250X for gfx90a (CDNA2); MI300X for gfx940, the CDNA3 ISA clang-16
     * knows (gfx942 needs LLVM 17). */
    static const char *const cdna2[] = {"gfx90a"}, *const cdna3[] = {"gfx940"};
    amd_sweep("mi250x", cdna2, 1, 1);
    amd_sweep("mi300x", cdna3, 1, 1);
}

static void sweep_amd_rdna3(void) {
    static const char *const rdna3[] = {"gfx1100"};
    amd_sweep("rx-7900xtx", rdna3, 1, 0);
}

#endif

#ifdef FA_WITH_OPENCL
#define RUN(fn) fn()
#else
#define RUN(fn) FA_SKIP("the OpenCL backend is not built into this library")
#endif

FA_TEST(intel_dg2) { RUN(sweep_intel_dg2); }
FA_TEST(amd_cdna) { RUN(sweep_amd_cdna); }
FA_TEST(amd_rdna3) { RUN(sweep_amd_rdna3); }

FA_TEST_MAIN(FA_CASE(intel_dg2), FA_CASE(amd_cdna), FA_CASE(amd_rdna3))
