/* NVRTC compiles for the CUDA backend: cuda_compile.h states the rules. */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"
#include "cuda_compile.h"
#include "cubin_info.h"

#include "fa_internal.h"
#include "kcache.h"
#include "kernel_sources.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CC_MAX_HEADERS 16
/* Options before the program's defines: the architecture, the language,
 * ptxas' verbose report. */
#define CC_FIXED_OPTIONS 3

static const char *file_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* "kernels_cuda/fwd_mma.cu" -> "fwd_mma": the program's name in reports
 * and in the names of kept logs. */
static void program_name(const char *path, char *out, size_t size) {
    const char *name = file_name(path);
    const char *dot = strrchr(name, '.');
    const int len = (int)(dot ? (size_t)(dot - name) : strlen(name));
    snprintf(out, size, "%.*s", len, name);
}

/* Real code when NVRTC lists the device's own architecture (or cannot list
 * any, as releases before 11.2 cannot); otherwise the newest virtual
 * architecture below it, whose PTX the driver compiles at load time. */
static void choose_arch(const fa_nvrtc_api *nv, int major, int minor, char *arch, size_t size, int *cubin) {
    const int want = major * 10 + minor;
    int best = -1, exact = 0, n = 0;
    if (nv->nvrtcGetNumSupportedArchs && nv->nvrtcGetSupportedArchs &&
        nv->nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n < 256) {
        int archs[256];
        if (nv->nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS)
            for (int i = 0; i < n; i++) {
                if (archs[i] == want) exact = 1;
                if (archs[i] <= want && archs[i] > best) best = archs[i];
            }
    } else {
        exact = 1;
    }
    if (exact || best < 0) {
        snprintf(arch, size, "sm_%d", want);
        *cubin = 1;
    } else {
        snprintf(arch, size, "compute_%d", best);
        *cubin = 0;
    }
}

static double now_seconds(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The program's text followed by each header's under a marker line naming
 * it: what the cache key hashes, so that a change to any of them compiles
 * again. */
static char *combined_source(const fa_kernel_source *main_src, const fa_kernel_source *const *hdr,
                             const char *const *names, int nheaders, size_t *size) {
    size_t total = main_src->size + 1;
    for (int i = 0; i < nheaders; i++) total += hdr[i]->size + strlen(names[i]) + 16;
    char *buf = malloc(total);
    if (!buf) return NULL;
    size_t at = main_src->size;
    memcpy(buf, main_src->text, main_src->size);
    for (int i = 0; i < nheaders; i++) {
        at += (size_t)snprintf(buf + at, total - at, "\n//@@ %s\n", names[i]);
        memcpy(buf + at, hdr[i]->text, hdr[i]->size);
        at += hdr[i]->size;
    }
    buf[at] = '\0';
    *size = at;
    return buf;
}

static fa_status nvrtc_fail(const fa_nvrtc_api *nv, nvrtcResult r, const char *what, const char *source) {
    const char *text = nv->nvrtcGetErrorString ? nv->nvrtcGetErrorString(r) : NULL;
    return fa_fail(FA_ERR_COMPILE, "%s (%s): %s", what, source, text ? text : "NVRTC error");
}

/* Whether a log holds ptxas' report of every kernel of the program. */
static int log_reports_all(const fa_cuda_program *prog, const char *log) {
    if (!log) return 0;
    for (int i = 0; i < prog->nkernels; i++) {
        char needle[96];
        snprintf(needle, sizeof needle, "Compiling entry function '%s'", prog->kernels[i]);
        const char *at = strstr(log, needle);
        if (!at || !strstr(at, "Used ")) return 0;
    }
    return 1;
}

static void keep_log(const char *program, const char *arch, const char *options, const char *log) {
    const char *dir = getenv("FLASHATTN_CUDA_LOG_DIR");
    if (!dir || !dir[0] || !log) return;
    uint32_t h = 2166136261u;
    for (const char *c = options; *c; c++) h = (h ^ (uint8_t)*c) * 16777619u;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s-%s-%08x.log", dir, program, arch, (unsigned)h);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "options: %s\n%s", options, log);
    fclose(f);
}

static int ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

/* Whether name stands as a whole word in the binary: a symbol in a CUBIN's
 * string table, an .entry in PTX. */
static int binary_names(const fa_cuda_binary *b, const char *name) {
    const size_t n = strlen(name);
    const char *data = b->data;
    if (n == 0 || b->size < n) return 0;
    for (size_t i = 0; i + n <= b->size; i++) {
        if (data[i] != name[0] || memcmp(data + i, name, n) != 0) continue;
        if (i > 0 && ident_char(data[i - 1])) continue;
        if (i + n < b->size && ident_char(data[i + n])) continue;
        return 1;
    }
    return 0;
}

/* Whether ptxas' log says it serialised the kernel's warpgroup MMAs: each
 * then waits for the one before, at about half the tensor pipe's rate (a
 * function call in the pipeline did it to fwd_tma's FWD_TRACE build,
 * bench/results/h200.md). The note names the function last:
 * "... are serialized due to <reason> in the function '<kernel>'". */
static int log_serializes_wgmma(const char *log, const char *kernel) {
    static const char note[] = "wgmma.mma_async instructions are serialized";
    char needle[96];
    snprintf(needle, sizeof needle, "in the function '%s'", kernel);
    for (const char *at = strstr(log, note); at; at = strstr(at + 1, note)) {
        const char *eol = strchr(at, '\n');
        const char *name = strstr(at, needle);
        if (name && (!eol || name < eol)) return 1;
    }
    return 0;
}

/* ptxas' report of one kernel in a compile log. */
static void parse_log_report(const char *log, const char *kernel, fa_cuda_kernel_report *rep) {
    rep->registers = rep->spill_stores = rep->spill_loads = rep->stack_bytes = rep->wgmma_serialized = -1;
    if (!log) return;
    rep->wgmma_serialized = log_serializes_wgmma(log, kernel);
    char needle[96];
    snprintf(needle, sizeof needle, "Compiling entry function '%s'", kernel);
    const char *at = strstr(log, needle);
    if (!at) return;
    at += strlen(needle);
    const char *next = strstr(at, "Compiling entry function");
    const char *end = next ? next : at + strlen(at);
    for (const char *line = strchr(at, '\n'); line && line + 1 < end; line = strchr(line + 1, '\n')) {
        const char *text = line + 1, *s;
        int a, b, c;
        if ((s = strstr(text, "bytes stack frame")) && s < end &&
            sscanf(text, "ptxas . %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &a, &b, &c) ==
                3) {
            rep->stack_bytes = a;
            rep->spill_stores = b;
            rep->spill_loads = c;
        } else if ((s = strstr(text, "Used ")) && s < end && sscanf(s, "Used %d registers", &a) == 1) {
            rep->registers = a;
        }
    }
}

void fa_cuda_kernel_resources(const fa_cuda_binary *bin, const char *kernel, fa_cuda_kernel_report *rep) {
    parse_log_report(bin->log, kernel, rep);
    int regs, frame;
    if (!bin->cubin || fa_cubin_kernel_resources(bin->data, bin->size, kernel, &regs, &frame) != 0) return;
    rep->registers = regs;
    rep->stack_bytes = frame;
    if (rep->spill_stores < 0 && frame == 0) rep->spill_stores = rep->spill_loads = 0;
}

void fa_cuda_binary_free(fa_cuda_binary *bin) {
    if (!bin) return;
    free(bin->data);
    free(bin->log);
    memset(bin, 0, sizeof *bin);
}

/* Every kernel must be in the binary; then one report each. */
static fa_status finish(const fa_cuda_program *prog, int major, int minor, fa_cuda_binary *out) {
    for (int i = 0; i < prog->nkernels; i++)
        if (!binary_names(out, prog->kernels[i]))
            return fa_fail(FA_ERR_INTERNAL, "%s compiled for %s (%s) lacks the kernel %s", prog->source, out->arch,
                           prog->defines, prog->kernels[i]);
    char name[sizeof out->reports[0].program];
    program_name(prog->source, name, sizeof name);
    for (int i = 0; i < prog->nkernels; i++) {
        fa_cuda_kernel_report *rep = &out->reports[i];
        memset(rep, 0, sizeof *rep);
        snprintf(rep->program, sizeof rep->program, "%s", name);
        snprintf(rep->kernel, sizeof rep->kernel, "%s", prog->kernels[i]);
        snprintf(rep->options, sizeof rep->options, "%s", prog->defines);
        snprintf(rep->arch, sizeof rep->arch, "sm_%d%d", major, minor);
        rep->from_cache = out->from_cache;
        rep->real_code = out->cubin;
        rep->binary_bytes = out->size;
        rep->compile_seconds = out->seconds;
        fa_cuda_kernel_resources(out, prog->kernels[i], rep);
    }
    out->nreports = prog->nkernels;
    return FA_SUCCESS;
}

static fa_status check_program(const fa_cuda_program *prog) {
    if (!prog) return fa_fail(FA_ERR_NULL_POINTER, "prog is NULL");
    if (!prog->source || !prog->defines)
        return fa_fail(FA_ERR_NULL_POINTER, "prog->%s is NULL", !prog->source ? "source" : "defines");
    if (prog->nheaders < 0 || prog->nheaders > CC_MAX_HEADERS || (prog->nheaders > 0 && !prog->headers))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "prog->headers: %d headers (at most %d)", prog->nheaders,
                       CC_MAX_HEADERS);
    if (prog->nkernels < 1 || prog->nkernels > FA_CUDA_MAX_KERNELS || !prog->kernels)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "prog->kernels: %d kernels (1 to %d)", prog->nkernels,
                       FA_CUDA_MAX_KERNELS);
    for (int i = 0; i < prog->nkernels; i++) {
        const char *k = prog->kernels[i];
        if (!k || !k[0] || strlen(k) >= sizeof ((fa_cuda_kernel_report *)0)->kernel)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "prog->kernels[%d] is empty or longer than %zu characters", i,
                           sizeof ((fa_cuda_kernel_report *)0)->kernel - 1);
    }
    return FA_SUCCESS;
}

/* A cached binary that may stand for a compile (the header's rule), or 0. */
static int cache_hit(const fa_cuda_program *prog, const fa_kcache_key *key, const fa_kcache_key *log_key,
                     fa_cuda_binary *out) {
    void *bin = NULL, *logd = NULL;
    size_t bin_size = 0, log_size = 0;
    if (fa_kcache_load(key, &bin, &bin_size) != FA_SUCCESS || bin_size == 0) {
        free(bin);
        return 0;
    }
    char *text = NULL;
    if (fa_kcache_load(log_key, &logd, &log_size) == FA_SUCCESS) {
        text = malloc(log_size + 1);
        if (text) {
            memcpy(text, logd, log_size);
            text[log_size] = '\0';
        }
    } else if (out->cubin) {
        text = calloc(1, 1);
    }
    free(logd);
    if (!text || !(out->cubin || log_reports_all(prog, text))) {
        free(text);
        free(bin);
        return 0;
    }
    out->data = bin;
    out->size = bin_size;
    out->log = text;
    out->from_cache = 1;
    return 1;
}

/* NVRTC itself: fills out's data, log and seconds. */
static fa_status run_nvrtc(const fa_nvrtc_api *nv, const fa_cuda_program *prog, const fa_kernel_source *main_src,
                           const fa_kernel_source *const *hdr, const char *const *names, const char *const *opts,
                           int nopt, const char *joined, fa_cuda_binary *out) {
    const double t0 = now_seconds();
    const char *htext[CC_MAX_HEADERS];
    for (int i = 0; i < prog->nheaders; i++) htext[i] = hdr[i]->text;
    nvrtcProgram handle = NULL;
    nvrtcResult r = nv->nvrtcCreateProgram(&handle, main_src->text, file_name(prog->source), prog->nheaders, htext,
                                           names);
    if (r != NVRTC_SUCCESS) return nvrtc_fail(nv, r, "nvrtcCreateProgram", prog->source);
    const nvrtcResult cr = nv->nvrtcCompileProgram(handle, nopt, opts);
    size_t log_size = 0;
    char *log = NULL;
    if (nv->nvrtcGetProgramLogSize(handle, &log_size) == NVRTC_SUCCESS) {
        log = malloc(log_size + 1);
        if (log && nv->nvrtcGetProgramLog(handle, log) != NVRTC_SUCCESS) log[0] = '\0';
        if (log) log[log_size] = '\0';
    }
    char program[64];
    program_name(prog->source, program, sizeof program);
    keep_log(program, out->arch, joined, log);
    fa_status st = FA_SUCCESS;
    if (cr != NVRTC_SUCCESS) {
        st = fa_fail(FA_ERR_COMPILE, "NVRTC could not compile %s for %s (%s): %s", prog->source, out->arch, joined,
                     nv->nvrtcGetErrorString(cr));
        fa_fail_append("\n");
        fa_fail_append(log ? log : "(no log)");
    } else {
        size_t size = 0;
        r = out->cubin ? nv->nvrtcGetCUBINSize(handle, &size) : nv->nvrtcGetPTXSize(handle, &size);
        if (r == NVRTC_SUCCESS && size > 0) {
            out->data = malloc(size);
            if (!out->data)
                st = fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a %zu-byte kernel binary", size);
            else
                r = out->cubin ? nv->nvrtcGetCUBIN(handle, out->data) : nv->nvrtcGetPTX(handle, out->data);
            out->size = size;
        }
        if (st == FA_SUCCESS && (r != NVRTC_SUCCESS || size == 0))
            st = nvrtc_fail(nv, r, out->cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX", prog->source);
    }
    nv->nvrtcDestroyProgram(&handle);
    out->seconds = now_seconds() - t0;
    out->log = log ? log : calloc(1, 1);
    if (st == FA_SUCCESS && !out->log) st = fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a compile log");
    return st;
}

fa_status fa_cuda_compile(const fa_cuda_program *prog, int major, int minor, int lookup, fa_cuda_binary *out) {
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "out is NULL");
    memset(out, 0, sizeof *out);
    FA_CHECK(check_program(prog));
    char why[512];
    const fa_nvrtc_api *nv = fa_cuda_nvrtc(why, sizeof why);
    if (!nv)
        return fa_fail(FA_ERR_UNSUPPORTED, "the CUDA kernels are compiled at run time, and NVRTC is missing: %s", why);
    const fa_kernel_source *main_src = fa_kernel_source_find(prog->source);
    if (!main_src) return fa_fail(FA_ERR_INTERNAL, "kernel source %s is not embedded in the library", prog->source);
    const fa_kernel_source *hdr[CC_MAX_HEADERS];
    const char *names[CC_MAX_HEADERS];
    for (int i = 0; i < prog->nheaders; i++) {
        hdr[i] = prog->headers[i] ? fa_kernel_source_find(prog->headers[i]) : NULL;
        if (!hdr[i])
            return fa_fail(FA_ERR_INTERNAL, "kernel source %s is not embedded in the library",
                           prog->headers[i] ? prog->headers[i] : "(NULL header)");
        names[i] = file_name(prog->headers[i]);
    }

    char arch_opt[64];
    choose_arch(nv, major, minor, out->arch, sizeof out->arch, &out->cubin);
    if (prog->arch_specific) {
        /* Architecture-specific instructions exist only as real code for
         * the device's own architecture, never as PTX for a later one. */
        if (!out->cubin)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "%s needs real code for sm_%d%da, and NVRTC %d.%d cannot target sm_%d%d (it offers %s)",
                           prog->source, major, minor, nv->version_major, nv->version_minor, major, minor, out->arch);
        const size_t len = strlen(out->arch);
        if (len + 1 < sizeof out->arch) {
            out->arch[len] = 'a';
            out->arch[len + 1] = '\0';
        }
    }
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", out->arch);

    /* The options, one each; joined with single spaces they are the cache
     * key's options (and the kept log's name). */
    const size_t defines_len = strlen(prog->defines);
    char *defines = malloc(defines_len + 1);
    const char **opts = malloc((CC_FIXED_OPTIONS + defines_len / 2 + 1) * sizeof *opts);
    char *joined = malloc(sizeof arch_opt + 64 + defines_len);
    char *source = NULL;
    fa_status st = FA_SUCCESS;
    if (!defines || !opts || !joined) {
        st = fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for the options of %s", prog->source);
        goto done;
    }
    memcpy(defines, prog->defines, defines_len + 1);
    int nopt = 0;
    opts[nopt++] = arch_opt;
    opts[nopt++] = "-std=c++17";
    opts[nopt++] = "--ptxas-options=-v";
    char *save = NULL;
    for (char *tok = strtok_r(defines, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) opts[nopt++] = tok;
    size_t jl = 0;
    for (int i = 0; i < nopt; i++) {
        const size_t len = strlen(opts[i]);
        if (i) joined[jl++] = ' ';
        memcpy(joined + jl, opts[i], len);
        jl += len;
    }
    joined[jl] = '\0';

    size_t src_size = 0;
    source = combined_source(main_src, hdr, names, prog->nheaders, &src_size);
    if (!source) {
        st = fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for the kernel source");
        goto done;
    }
    char driver[64];
    snprintf(driver, sizeof driver, "nvrtc %d.%d", nv->version_major, nv->version_minor);
    const fa_kcache_key key = {"cuda", source, src_size, joined, out->arch, driver};
    const fa_kcache_key log_key = {"cuda_log", source, src_size, joined, out->arch, driver};

    if (lookup && cache_hit(prog, &key, &log_key, out)) {
        st = finish(prog, major, minor, out);
        goto done;
    }
    st = run_nvrtc(nv, prog, main_src, hdr, names, opts, nopt, joined, out);
    if (st == FA_SUCCESS) st = finish(prog, major, minor, out);
    if (st == FA_SUCCESS) {
        /* A cache that cannot be written costs only the next compile. The
         * log goes first: a process that finds the binary finds its log. */
        if (out->cubin || log_reports_all(prog, out->log))
            (void)fa_kcache_store(&log_key, out->log, strlen(out->log));
        (void)fa_kcache_store(&key, out->data, out->size);
        fa_clear_error();
    }
done:
    if (st != FA_SUCCESS) fa_cuda_binary_free(out);
    free(source);
    free(joined);
    free(opts);
    free(defines);
    return st;
}

fa_status fa_cuda_program_report(const fa_cuda_program *prog, int cc_major, int cc_minor, int threads,
                                 fa_cuda_kernel_report *reports, int max_reports, int *count) {
    if (!count) return fa_fail(FA_ERR_NULL_POINTER, "count is NULL");
    *count = 0;
    fa_cuda_binary bin;
    FA_CHECK(fa_cuda_compile(prog, cc_major, cc_minor, 1, &bin));
    for (int i = 0; i < bin.nreports && i < max_reports && reports; i++) {
        reports[i] = bin.reports[i];
        reports[i].threads = threads;
    }
    *count = bin.nreports;
    fa_cuda_binary_free(&bin);
    return FA_SUCCESS;
}

fa_status fa_cuda_program_load(const fa_cuda_program *prog, const fa_cuda_context *ctx, CUmodule *module,
                               CUfunction *fns) {
    const fa_cu_api *cu = fa_cuda_api();
    fa_cuda_binary bin;
    FA_CHECK(fa_cuda_compile(prog, ctx->cc_major, ctx->cc_minor, 1, &bin));
    CUmodule m = NULL;
    CUresult r = cu->cuModuleLoadData(&m, bin.data);
    fa_cuda_binary_free(&bin);
    char what[160];
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuModuleLoadData(%s)", prog->source);
        return fa_cuda_error(r, what);
    }
    for (int i = 0; i < prog->nkernels; i++) {
        r = cu->cuModuleGetFunction(&fns[i], m, prog->kernels[i]);
        if (r != CUDA_SUCCESS) {
            (void)cu->cuModuleUnload(m);
            snprintf(what, sizeof what, "cuModuleGetFunction(%s)", prog->kernels[i]);
            return fa_cuda_error(r, what);
        }
    }
    *module = m;
    return FA_SUCCESS;
}
