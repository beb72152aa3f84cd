/* The kernels of standard (unfused) attention on CUDA (kernels_cuda/
 * standard.cu) compiled by NVRTC without a GPU, through the backend's one
 * compile path (backends/cuda/cuda_compile.c), as plan creation compiles
 * them: for sm_80 and sm_90, every dtype, without options and with all of
 * them (causal, window, block mask, dropout, varlen). Every entry point must
 * be in the binary with a register count and no stack frame or spills, as
 * the compile module reports them: registers and stack read from the CUBIN,
 * so the figures hold where NVRTC's log has no ptxas report at all. Also
 * the kernel cache's rules and the compile errors. Runs wherever NVRTC
 * loads; skips otherwise.
 *
 * fa-test-labels: compile */
#include "harness.h"

#include "flashattn.h"

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_compile.h"
#include "backends/cuda/cuda_runtime_internal.h"
#include "backends/cuda/cuda_standard.h"
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_WITH_CUDA

#define NKERNELS 5
static const char *const kernels[NKERNELS] = {"std_softmax", "std_probs", "std_dscores", "std_rowdot", "std_rows"};
static const char *const std_header[] = {"kernels_cuda/dtype.cuh", "kernels_cuda/common.cuh"};

static char g_skip[512];

static int nvrtc_here(void) {
    char why[400];
    if (fa_cuda_nvrtc_available(why, sizeof why)) return 1;
    snprintf(g_skip, sizeof g_skip, "NVRTC cannot be loaded here: %s", why);
    return 0;
}

#define REQUIRE_NVRTC()                                                                    \
    do {                                                                                   \
        if (!nvrtc_here()) FA_SKIP(g_skip);                                                \
    } while (0)

/* FLASHATTN_CACHE_DIR for the span of a case, restored afterwards. */
typedef struct cache_env {
    char dir[64];
    char *saved;
    int had, made;
} cache_env;

/* value NULL: a fresh directory of its own, removed on leaving. */
static int cache_enter(cache_env *e, const char *value) {
    memset(e, 0, sizeof *e);
    const char *old = getenv("FLASHATTN_CACHE_DIR");
    e->had = old != NULL;
    e->saved = old ? strdup(old) : NULL;
    if (!value) {
        snprintf(e->dir, sizeof e->dir, "/tmp/fa-cuda-std-cache-XXXXXX");
        if (!mkdtemp(e->dir)) return 0;
        e->made = 1;
        value = e->dir;
    }
    return setenv("FLASHATTN_CACHE_DIR", value, 1) == 0;
}

static void cache_leave(cache_env *e) {
    if (e->had)
        setenv("FLASHATTN_CACHE_DIR", e->saved, 1);
    else
        unsetenv("FLASHATTN_CACHE_DIR");
    free(e->saved);
    if (e->made) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
        CHECK(system(cmd) == 0);
    }
}

static const int32_t cu_q[] = {0, 7, 7, 40};
static const int32_t cu_k[] = {0, 9, 30, 30};
static uint8_t mask[4];

static fa_attention_desc problem(fa_dtype dtype, int options) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dtype;
    d.batch = 3;
    d.seqlen_q = d.seqlen_k = 40;
    d.heads_q = 4;
    d.heads_kv = 2;
    d.head_dim = 64;
    d.algorithm = FA_ALGO_STANDARD;
    if (options) {
        d.causal = 1;
        d.window_left = 16;
        d.window_right = 4;
        d.block_mask = mask;
        d.block_mask_bytes = sizeof mask;
        d.block_q = d.block_k = 32;
        d.dropout_p = 0.1f;
        d.dropout_seed = 7;
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
    }
    return d;
}

/* A real-code kernel as the module reports it: in the binary, with its
 * registers, without a stack frame, so without spills (0, or unknown where
 * the log has no ptxas report: a frame of 0 bytes is what rules spills
 * out). */
static void check_real_code(const char *what, const fa_cuda_kernel_report *r, const char *kernel) {
    CHECK_MSG(strcmp(r->kernel, kernel) == 0, "%s: report of %s where %s was expected", what, r->kernel, kernel);
    CHECK_MSG(strcmp(r->program, "standard") == 0, "%s %s: program %s", what, kernel, r->program);
    CHECK_MSG(r->real_code, "%s %s: NVRTC produced PTX, not real code", what, kernel);
    CHECK_MSG(r->binary_bytes > 0, "%s %s: an empty binary", what, kernel);
    CHECK_MSG(r->registers > 0 && r->registers <= 255, "%s %s: %d registers", what, kernel, r->registers);
    CHECK_MSG(r->stack_bytes == 0, "%s %s: a stack frame of %d bytes", what, kernel, r->stack_bytes);
    CHECK_MSG((r->spill_stores == 0 || r->spill_stores == -1) && (r->spill_loads == 0 || r->spill_loads == -1),
              "%s %s spills: %d bytes stored, %d loaded", what, kernel, r->spill_stores, r->spill_loads);
    CHECK_MSG(r->threads == 256, "%s %s: %d threads", what, kernel, r->threads);
}

static void compile_all(void) {
    cache_env env;
    CHECK(cache_enter(&env, "off"));
    const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    const int archs[][2] = {{8, 0}, {9, 0}};
    fprintf(stderr, "  %-6s %-5s %-8s %8s  registers (softmax probs dscores rowdot rows)\n", "arch", "dtype", "options",
            "bytes");
    for (int a = 0; a < 2; a++)
        for (int t = 0; t < 3; t++)
            for (int options = 0; options < 2; options++) {
                fa_attention_desc d = problem(dtypes[t], options);
                char what[64];
                snprintf(what, sizeof what, "sm_%d%d %s %s", archs[a][0], archs[a][1], fa_dtype_name(dtypes[t]),
                         options ? "all-options" : "plain");
                fa_cuda_kernel_report reports[NKERNELS + 1];
                memset(reports, 0, sizeof reports);
                int count = -1;
                fa_status st = fa_cuda_standard_compile_kernels(&d, archs[a][0], archs[a][1], reports, NKERNELS + 1,
                                                                &count);
                CHECK_MSG(st == FA_SUCCESS, "%s: %s (%s)", what, fa_status_string(st), fa_last_error());
                if (st != FA_SUCCESS) continue;
                CHECK_MSG(count == NKERNELS, "%s: %d kernels", what, count);
                if (count != NKERNELS) continue;
                fprintf(stderr, "  sm_%d%d  %-5s %-8s %8zu ", archs[a][0], archs[a][1], fa_dtype_name(dtypes[t]),
                        options ? "all" : "none", reports[0].binary_bytes);
                for (int k = 0; k < NKERNELS; k++) {
                    fprintf(stderr, " %3d", reports[k].registers);
                    check_real_code(what, &reports[k], kernels[k]);
                    CHECK_MSG(!reports[k].from_cache, "%s %s: from the cache, which is off", what, kernels[k]);
                    CHECK_MSG(reports[k].binary_bytes == reports[0].binary_bytes, "%s: one binary, two sizes", what);
                    char arch[16];
                    snprintf(arch, sizeof arch, "sm_%d%d", archs[a][0], archs[a][1]);
                    CHECK_MSG(strcmp(reports[k].arch, arch) == 0, "%s: arch %s", what, reports[k].arch);
                }
                fputc('\n', stderr);
            }
    cache_leave(&env);
}

#endif

FA_TEST(standard_sm80_sm90) {
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    compile_all();
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* What the module reports for a CUBIN does not depend on the log: with the
 * log emptied (as NVRTC leaves it on some installations) the registers and
 * stack stay, and the spills read 0. Where this NVRTC does write ptxas'
 * report, the log alone (the binary taken as PTX) gives the same registers
 * and stack as the CUBIN. */
FA_TEST(reports_without_ptxas_log) {
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    cache_env env;
    CHECK(cache_enter(&env, "off"));
    const fa_cuda_program prog = {"kernels_cuda/standard.cu", std_header, 2, "-DDTYPE_F16 -DCAUSAL -DDROPOUT",
                                  kernels, NKERNELS, 0};
    fa_cuda_binary bin;
    fa_status st = fa_cuda_compile(&prog, 9, 0, 0, &bin);
    CHECK_MSG(st == FA_SUCCESS, "%s (%s)", fa_status_string(st), fa_last_error());
    if (st == FA_SUCCESS) {
        CHECK(bin.cubin && bin.size > 0 && bin.log != NULL && !bin.from_cache);
        CHECK_MSG(strcmp(bin.arch, "sm_90") == 0, "arch %s", bin.arch);
        CHECK(bin.nreports == NKERNELS);
        int log_has_report = 0;
        for (int k = 0; k < NKERNELS && k < bin.nreports; k++) {
            const fa_cuda_kernel_report *full = &bin.reports[k];
            CHECK(full->registers > 0 && full->stack_bytes == 0);
            CHECK_MSG(strcmp(full->options, prog.defines) == 0, "options %s", full->options);

            /* The log as the binary's only witness. */
            fa_cuda_binary as_ptx = bin;
            as_ptx.cubin = 0;
            fa_cuda_kernel_report from_log = *full;
            fa_cuda_kernel_resources(&as_ptx, kernels[k], &from_log);
            if (from_log.registers >= 0) {
                log_has_report++;
                CHECK_MSG(from_log.registers == full->registers && from_log.stack_bytes == full->stack_bytes,
                          "%s: the log says %d registers and %d bytes of stack, the CUBIN %d and %d", kernels[k],
                          from_log.registers, from_log.stack_bytes, full->registers, full->stack_bytes);
            } else {
                CHECK(from_log.stack_bytes == -1 && from_log.spill_stores == -1);
            }

            /* The CUBIN without any log. */
            fa_cuda_binary no_log = bin;
            char empty[1] = {'\0'};
            no_log.log = empty;
            fa_cuda_kernel_report alone = *full;
            fa_cuda_kernel_resources(&no_log, kernels[k], &alone);
            CHECK_MSG(alone.registers == full->registers && alone.stack_bytes == 0 && alone.spill_stores == 0 &&
                          alone.spill_loads == 0,
                      "%s without a log: %d registers, %d stack, %d / %d spills", kernels[k], alone.registers,
                      alone.stack_bytes, alone.spill_stores, alone.spill_loads);
        }
        fprintf(stderr, "  ptxas reports in this NVRTC's log: %d of %d kernels\n", log_has_report, NKERNELS);
        fa_cuda_binary_free(&bin);
        CHECK(bin.data == NULL && bin.log == NULL);
    }
    cache_leave(&env);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* A second compile comes from the kernel cache with the same binary and
 * figures; a head dimension is no option of the program, so another one
 * finds the same binary. PTX (an architecture NVRTC does not know, 9.9)
 * has no ptxas report to keep beside it and is compiled again. */
FA_TEST(kernel_cache_roundtrip) {
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    cache_env env;
    CHECK(cache_enter(&env, NULL));
    fa_attention_desc d = problem(FA_DTYPE_BF16, 1);
    fa_cuda_kernel_report a[NKERNELS], b[NKERNELS];
    int na = 0, nb = 0;
    CHECK_OK(fa_cuda_standard_compile_kernels(&d, 9, 0, a, NKERNELS, &na));
    d.head_dim = 128;
    CHECK_OK(fa_cuda_standard_compile_kernels(&d, 9, 0, b, NKERNELS, &nb));
    CHECK(na == NKERNELS && nb == NKERNELS);
    for (int k = 0; k < na && k < nb && k < NKERNELS; k++) {
        CHECK_MSG(!a[k].from_cache && b[k].from_cache, "%s: first from cache %d, second %d", kernels[k],
                  a[k].from_cache, b[k].from_cache);
        CHECK(b[k].compile_seconds == 0.0);
        CHECK(a[k].binary_bytes == b[k].binary_bytes && a[k].binary_bytes > 0);
        CHECK_MSG(a[k].registers == b[k].registers && a[k].stack_bytes == b[k].stack_bytes &&
                      a[k].spill_stores == b[k].spill_stores && a[k].spill_loads == b[k].spill_loads,
                  "%s: %d/%d/%d registers/stack/spills compiled, %d/%d/%d cached", kernels[k], a[k].registers,
                  a[k].stack_bytes, a[k].spill_stores, b[k].registers, b[k].stack_bytes, b[k].spill_stores);
        check_real_code("cached", &b[k], kernels[k]);
    }

    /* The entry point of header cuda_standard.h compiles without reading
     * the cache, to the same binary. */
    size_t bytes = 0;
    int real_code = 0;
    char log[64];
    CHECK_OK(fa_cuda_standard_compile(&d, 9, 0, &bytes, &real_code, log, sizeof log));
    CHECK(bytes == a[0].binary_bytes && real_code == 1);

    for (int round = 0; round < 2; round++) {
        fa_cuda_kernel_report p[NKERNELS];
        int np = 0;
        CHECK_OK(fa_cuda_standard_compile_kernels(&d, 9, 9, p, NKERNELS, &np));
        CHECK(np == NKERNELS);
        for (int k = 0; k < np && k < NKERNELS; k++) {
            CHECK_MSG(!p[k].real_code && !p[k].from_cache, "9.9 round %d %s: real code %d, from cache %d", round,
                      kernels[k], p[k].real_code, p[k].from_cache);
            CHECK_MSG(p[k].registers == -1 && p[k].stack_bytes == -1, "9.9 %s: PTX with %d registers", kernels[k],
                      p[k].registers);
            CHECK(p[k].binary_bytes > 0);
        }
    }
    cache_leave(&env);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

/* Compile errors carry NVRTC's message and log; a program naming a kernel
 * it lacks, or a source that is not embedded, is an internal error; bad
 * arguments are refused before compiling. */
FA_TEST(errors_are_reported) {
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    cache_env env;
    CHECK(cache_enter(&env, "off"));
    fa_attention_desc d = problem(FA_DTYPE_F16, 0);
    fa_cuda_kernel_report r[NKERNELS];
    int n = 0;
    fa_status st = fa_cuda_standard_compile_kernels(&d, 1, 0, r, NKERNELS, &n);
    CHECK_MSG(st == FA_ERR_COMPILE, "sm_10: %s (%s)", fa_status_string(st), fa_last_error());
    CHECK_MSG(strstr(fa_last_error(), "sm_10") && strstr(fa_last_error(), "NVRTC") &&
                  strstr(fa_last_error(), "kernels_cuda/standard.cu"),
              "message: %s", fa_last_error());
    CHECK(n == 0);

    /* No dtype: common.cuh's #error, which the message must quote. */
    fa_cuda_binary bin;
    fa_cuda_program prog = {"kernels_cuda/standard.cu", std_header, 2, "-DCAUSAL", kernels, NKERNELS, 0};
    st = fa_cuda_compile(&prog, 9, 0, 1, &bin);
    CHECK_MSG(st == FA_ERR_COMPILE, "no dtype: %s (%s)", fa_status_string(st), fa_last_error());
    CHECK_MSG(strstr(fa_last_error(), "one of DTYPE_F32, DTYPE_F16, DTYPE_BF16") != NULL, "message: %s",
              fa_last_error());
    CHECK(bin.data == NULL && bin.log == NULL);

    const char *const missing[] = {"std_softmax", "std_nowhere"};
    prog = (fa_cuda_program){"kernels_cuda/standard.cu", std_header, 2, "-DDTYPE_F16", missing, 2, 0};
    CHECK_STATUS(fa_cuda_compile(&prog, 9, 0, 1, &bin), FA_ERR_INTERNAL);
    CHECK_MSG(strstr(fa_last_error(), "std_nowhere") != NULL, "message: %s", fa_last_error());
    prog = (fa_cuda_program){"kernels_cuda/nowhere.cu", std_header, 2, "-DDTYPE_F16", kernels, NKERNELS, 0};
    CHECK_STATUS(fa_cuda_compile(&prog, 9, 0, 1, &bin), FA_ERR_INTERNAL);
    CHECK_MSG(strstr(fa_last_error(), "kernels_cuda/nowhere.cu") != NULL, "message: %s", fa_last_error());
    prog = (fa_cuda_program){"kernels_cuda/standard.cu", std_header, 2, "-DDTYPE_F16", kernels, 0, 0};
    CHECK_STATUS(fa_cuda_compile(&prog, 9, 0, 1, &bin), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_cuda_compile(NULL, 9, 0, 1, &bin), FA_ERR_NULL_POINTER);

    CHECK_STATUS(fa_cuda_standard_compile_kernels(NULL, 9, 0, r, NKERNELS, &n), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_cuda_standard_compile_kernels(&d, 9, 0, r, NKERNELS, NULL), FA_ERR_NULL_POINTER);
    CHECK_STATUS(fa_cuda_standard_compile_kernels(&d, 9, 12, r, NKERNELS, &n), FA_ERR_INVALID_ARGUMENT);
    d.q.dtype = (fa_dtype)77;
    CHECK_STATUS(fa_cuda_standard_compile_kernels(&d, 9, 0, r, NKERNELS, &n), FA_ERR_INVALID_ARGUMENT);
    cache_leave(&env);
#else
    FA_SKIP("the CUDA backend is not built into this library");
#endif
}

FA_TEST_MAIN(FA_CASE(standard_sm80_sm90), FA_CASE(reports_without_ptxas_log), FA_CASE(kernel_cache_roundtrip),
             FA_CASE(errors_are_reported))
