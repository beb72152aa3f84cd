/* fa-cl-replay: runs one OpenCL launch recorded by the OpenCL backend
 * (FLASHATTN_OPENCL_RECORD, backends/opencl/cl_record.c) again through the
 * CUDA driver: NVIDIA's OpenCL returns its programs as PTX, which the
 * driver loads as it is, so the replay runs the code NVIDIA's OpenCL built
 * on the recorded buffers, with the recorded sizes and arguments. Its point
 * is Nsight Compute, which profiles CUDA launches but not OpenCL ones:
 *
 *   FLASHATTN_OPENCL_RECORD=rec FLASHATTN_OPENCL_RECORD_KERNEL=fa_bwd_dkdv \
 *     fa-run --backend opencl ... --backward
 *   ncu --set full fa-cl-replay rec/launch-000
 *
 * It prints the median time of the launches after the warm-up (cuEvent),
 * which should match the OpenCL event's time of the same launch. The
 * libcuda entry points are loaded at run time, as the CUDA backend does. */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 128

typedef struct arg {
    enum { ARG_VAL, ARG_MEM, ARG_NULL } kind;
    unsigned char value[16];
    size_t size;
    int buffer; /* ARG_MEM: the argument index whose file holds the buffer */
} arg;

typedef struct record {
    char kernel[256];
    unsigned global[3], local[3];
    int nargs;
    arg args[MAX_ARGS];
} record;

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*module_load)(CUmodule *, const void *, unsigned, CUjit_option *, void **);
    CUresult (*function_get)(CUfunction *, CUmodule, const char *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_sync)(CUevent);
    CUresult (*event_elapsed)(float *, CUevent, CUevent);
    CUresult (*sync)(void);
    CUresult (*error_string)(CUresult, const char **);
} cu;

static void *sym(void *lib, const char *a, const char *b) {
    void *p = dlsym(lib, a);
    if (!p && b) p = dlsym(lib, b);
    if (!p) fprintf(stderr, "libcuda has no %s\n", a);
    return p;
}

static int load_cuda(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cannot load libcuda.so.1: %s\n", dlerror());
        return -1;
    }
    void *p[15] = {
        sym(lib, "cuInit", NULL),
        sym(lib, "cuDeviceGet", NULL),
        sym(lib, "cuDevicePrimaryCtxRetain", NULL),
        sym(lib, "cuCtxSetCurrent", NULL),
        sym(lib, "cuModuleLoadDataEx", NULL),
        sym(lib, "cuModuleGetFunction", NULL),
        sym(lib, "cuMemAlloc_v2", "cuMemAlloc"),
        sym(lib, "cuMemcpyHtoD_v2", "cuMemcpyHtoD"),
        sym(lib, "cuLaunchKernel", NULL),
        sym(lib, "cuEventCreate", NULL),
        sym(lib, "cuEventRecord", NULL),
        sym(lib, "cuEventSynchronize", NULL),
        sym(lib, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
        sym(lib, "cuCtxSynchronize", NULL),
        sym(lib, "cuGetErrorString", NULL),
    };
    for (int i = 0; i < 15; i++)
        if (!p[i]) return -1;
    memcpy(&cu.init, &p[0], sizeof p[0]);
    memcpy(&cu.device_get, &p[1], sizeof p[1]);
    memcpy(&cu.primary_retain, &p[2], sizeof p[2]);
    memcpy(&cu.ctx_set, &p[3], sizeof p[3]);
    memcpy(&cu.module_load, &p[4], sizeof p[4]);
    memcpy(&cu.function_get, &p[5], sizeof p[5]);
    memcpy(&cu.mem_alloc, &p[6], sizeof p[6]);
    memcpy(&cu.htod, &p[7], sizeof p[7]);
    memcpy(&cu.launch, &p[8], sizeof p[8]);
    memcpy(&cu.event_create, &p[9], sizeof p[9]);
    memcpy(&cu.event_record, &p[10], sizeof p[10]);
    memcpy(&cu.event_sync, &p[11], sizeof p[11]);
    memcpy(&cu.event_elapsed, &p[12], sizeof p[12]);
    memcpy(&cu.sync, &p[13], sizeof p[13]);
    memcpy(&cu.error_string, &p[14], sizeof p[14]);
    return 0;
}

static int check(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return 0;
    const char *s = NULL;
    cu.error_string(r, &s);
    fprintf(stderr, "%s: %s (%d)\n", what, s ? s : "unknown error", (int)r);
    return -1;
}

/* The whole file, NUL-terminated; NULL on failure. */
static unsigned char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *data = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n + 1)) &&
        fread(data, 1, (size_t)n, f) == (size_t)n) {
        data[n] = '\0';
        *size = (size_t)n;
    } else {
        free(data);
        data = NULL;
    }
    fclose(f);
    return data;
}

/* NVIDIA's OpenCL reads the launch's global offsets (OpenCL 1.2's
 * global_work_offset, in work-groups and work-items) from the environment
 * registers %envreg0..5, which a CUDA launch leaves undefined: the backend
 * never passes an offset, so each becomes the literal 0. Returns the count
 * replaced, or -1 where an environment register of another meaning is read. */
static int zero_offsets(unsigned char *ptx) {
    int replaced = 0;
    for (char *at = strstr((char *)ptx, "%envreg"); at; at = strstr(at, "%envreg")) {
        char *end = at + 7;
        const long reg = strtol(end, &end, 10);
        if (end == at + 7 || reg < 0 || reg > 5) {
            fprintf(stderr, "the program reads %.10s, which a CUDA launch does not set\n", at);
            return -1;
        }
        /* "%envregN" -> "0" and spaces: the same length, the same PTX. */
        memset(at, ' ', (size_t)(end - at));
        at[0] = '0';
        at = end;
        replaced++;
    }
    return replaced;
}

static int hexbyte(const char *s) {
    unsigned v;
    return sscanf(s, "%2x", &v) == 1 ? (int)v : -1;
}

static int read_meta(const char *dir, record *r) {
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    memset(r, 0, sizeof *r);
    int ok = 1;
    while (ok && fgets(line, sizeof line, f)) {
        unsigned i;
        char kind[8], text[64];
        size_t size;
        if (sscanf(line, "kernel %255s", r->kernel) == 1) continue;
        if (sscanf(line, "global %u %u %u", &r->global[0], &r->global[1], &r->global[2]) == 3) continue;
        if (sscanf(line, "local %u %u %u", &r->local[0], &r->local[1], &r->local[2]) == 3) continue;
        if (sscanf(line, "args %d", &r->nargs) == 1) {
            ok = r->nargs >= 0 && r->nargs <= MAX_ARGS;
            continue;
        }
        if (sscanf(line, "arg %u %7s", &i, kind) != 2) continue;
        ok = i < MAX_ARGS;
        if (!ok) break;
        arg *a = &r->args[i];
        if (strcmp(kind, "null") == 0) {
            a->kind = ARG_NULL;
        } else if (strcmp(kind, "mem") == 0 && sscanf(line, "arg %*u mem buf%d.bin", &a->buffer) == 1) {
            a->kind = ARG_MEM;
        } else if (strcmp(kind, "val") == 0 && sscanf(line, "arg %*u val %zu %63s", &size, text) == 2 && size <= 16 &&
                   strlen(text) == 2 * size) {
            a->kind = ARG_VAL;
            a->size = size;
            for (size_t b = 0; b < size && ok; b++) {
                const int v = hexbyte(text + 2 * b);
                ok = v >= 0;
                a->value[b] = (unsigned char)v;
            }
        } else {
            ok = 0;
        }
    }
    fclose(f);
    if (!ok || !r->kernel[0] || !r->local[0]) fprintf(stderr, "%s: not a launch record\n", path);
    return ok && r->kernel[0] && r->local[0] ? 0 : -1;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: fa-cl-replay RECORD_DIR [REPEATS [WARMUP]]\n");
        return 2;
    }
    const char *dir = argv[1];
    const int repeats = argc > 2 ? atoi(argv[2]) : 5, warmup = argc > 3 ? atoi(argv[3]) : 1;
    if (repeats < 1 || repeats > 1000 || warmup < 0 || warmup > 1000) {
        fprintf(stderr, "repeats 1..1000, warmup 0..1000\n");
        return 2;
    }
    record r;
    if (read_meta(dir, &r) || load_cuda()) return 1;
    CUdevice dev;
    CUcontext ctx;
    if (check(cu.init(0), "cuInit") || check(cu.device_get(&dev, 0), "cuDeviceGet") ||
        check(cu.primary_retain(&ctx, dev), "cuDevicePrimaryCtxRetain") || check(cu.ctx_set(ctx), "cuCtxSetCurrent"))
        return 1;
    char path[4200];
    size_t size = 0;
    snprintf(path, sizeof path, "%s/program.bin", dir);
    unsigned char *ptx = slurp(path, &size);
    if (!ptx) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    if (zero_offsets(ptx) < 0) return 1;
    char log[8192] = "";
    CUjit_option opt[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *val[2] = {log, (void *)(size_t)sizeof log};
    CUmodule mod;
    CUfunction fn;
    if (check(cu.module_load(&mod, ptx, 2, opt, val), "cuModuleLoadDataEx (is program.bin NVIDIA's PTX?)")) {
        fprintf(stderr, "%s\n", log);
        return 1;
    }
    free(ptx);
    if (check(cu.function_get(&fn, mod, r.kernel), r.kernel)) return 1;

    CUdeviceptr mem[MAX_ARGS] = {0};
    void *params[MAX_ARGS];
    for (int i = 0; i < r.nargs; i++) {
        arg *a = &r.args[i];
        if (a->kind == ARG_MEM && a->buffer == i) {
            snprintf(path, sizeof path, "%s/buf%03d.bin", dir, i);
            unsigned char *data = slurp(path, &size);
            if (!data) {
                fprintf(stderr, "cannot read %s\n", path);
                return 1;
            }
            if (check(cu.mem_alloc(&mem[i], size ? size : 1), "cuMemAlloc") ||
                (size && check(cu.htod(mem[i], data, size), "cuMemcpyHtoD")))
                return 1;
            free(data);
        }
    }
    for (int i = 0; i < r.nargs; i++) {
        arg *a = &r.args[i];
        if (a->kind == ARG_MEM) {
            if (a->buffer < 0 || a->buffer > i || r.args[a->buffer].kind != ARG_MEM) {
                fprintf(stderr, "argument %d names buffer %d\n", i, a->buffer);
                return 1;
            }
            mem[i] = mem[a->buffer];
        }
        params[i] = a->kind == ARG_VAL ? (void *)a->value : (void *)&mem[i];
    }
    const unsigned grid[3] = {r.global[0] / r.local[0], r.global[1] / r.local[1], r.global[2] / r.local[2]};
    CUevent start, end;
    if (check(cu.event_create(&start, 0), "cuEventCreate") || check(cu.event_create(&end, 0), "cuEventCreate"))
        return 1;
    float times[1000];
    for (int it = 0; it < warmup + repeats; it++) {
        if (check(cu.event_record(start, NULL), "cuEventRecord") ||
            check(cu.launch(fn, grid[0], grid[1], grid[2], r.local[0], r.local[1], r.local[2], 0, NULL, params, NULL),
                  "cuLaunchKernel") ||
            check(cu.event_record(end, NULL), "cuEventRecord") || check(cu.event_sync(end), "cuEventSynchronize"))
            return 1;
        float ms = 0.0f;
        if (check(cu.event_elapsed(&ms, start, end), "cuEventElapsedTime")) return 1;
        if (it >= warmup) times[it - warmup] = ms;
    }
    qsort(times, (size_t)repeats, sizeof times[0], cmp_float);
    printf("%s grid %u x %u x %u, block %u x %u x %u: median %.4f ms over %d (min %.4f, max %.4f)\n", r.kernel,
           grid[0], grid[1], grid[2], r.local[0], r.local[1], r.local[2], times[repeats / 2], repeats, times[0],
           times[repeats - 1]);
    return check(cu.sync(), "cuCtxSynchronize") ? 1 : 0;
}
