/* Launch records (cl_backend.h): what tools/cl_replay needs to run an
 * OpenCL launch again through the CUDA driver on NVIDIA, where the program
 * binary NVIDIA's OpenCL returns is PTX, so that Nsight Compute (which does
 * not see OpenCL launches) can profile the very code NVIDIA's OpenCL built.
 *
 * FLASHATTN_OPENCL_RECORD       the folder; records are launch-NNN in it
 * FLASHATTN_OPENCL_RECORD_KERNEL only kernels whose name contains this
 * FLASHATTN_OPENCL_RECORD_MAX    at most this many launches (default 8)
 *
 * A record: meta.txt (kernel name, sizes, one line an argument: its value
 * in hex, or the file of the buffer it names, or null), program.bin, and
 * one file per distinct buffer, read just before the launch. Failures to
 * write are reported on stderr and never change the launch. */
#include "cl_backend.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define REC_MAX_ARGS 128
#define REC_MAX_VALUE 16

typedef struct rec_arg {
    size_t size;
    unsigned char value[REC_MAX_VALUE];
    int is_mem, set;
} rec_arg;

static _Thread_local struct {
    cl_kernel kernel;
    rec_arg args[REC_MAX_ARGS];
} rec;

static atomic_int rec_count;
/* Whether FLASHATTN_OPENCL_RECORD is set, looked up once a context:
 * every argument of every launch asks, and a scan of the environment each
 * time would add microseconds to short launches. -1: not looked up yet. */
static atomic_int rec_on = -1;

void fa_cl_record_refresh(void) { atomic_store(&rec_on, -1); }

static const char *rec_dir(void) {
    int on = atomic_load(&rec_on);
    if (on < 0) {
        const char *d = getenv("FLASHATTN_OPENCL_RECORD");
        on = d && d[0];
        atomic_store(&rec_on, on);
    }
    return on ? getenv("FLASHATTN_OPENCL_RECORD") : NULL;
}

void fa_cl_record_arg(cl_kernel kernel, cl_uint index, size_t size, const void *value, int is_mem) {
    if (!atomic_load(&rec_on) || !rec_dir()) return;
    if (rec.kernel != kernel) {
        memset(&rec, 0, sizeof rec);
        rec.kernel = kernel;
    }
    if (index >= REC_MAX_ARGS || size > REC_MAX_VALUE) return;
    rec_arg *a = &rec.args[index];
    a->size = size;
    a->is_mem = is_mem;
    a->set = 1;
    if (value) memcpy(a->value, value, size);
}

/* The contents of m into path; 0 on success. */
static int rec_buffer(fa_cl_context *ctx, cl_mem m, const char *path) {
    size_t bytes = 0;
    if (fa_cl.clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof bytes, &bytes, NULL) != CL_SUCCESS) return -1;
    void *host = malloc(bytes ? bytes : 1);
    if (!host) return -1;
    int rc = fa_cl.clEnqueueReadBuffer(ctx->queue, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL) == CL_SUCCESS ? 0 : -1;
    FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
    if (!f || fwrite(host, 1, bytes, f) != bytes) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    free(host);
    return rc;
}

static int rec_program(cl_kernel kernel, const char *path) {
    cl_program program;
    size_t size = 0;
    if (fa_cl.clGetKernelInfo(kernel, CL_KERNEL_PROGRAM, sizeof program, &program, NULL) != CL_SUCCESS ||
        fa_cl.clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS || !size)
        return -1;
    unsigned char *bin = malloc(size);
    if (!bin) return -1;
    int rc = fa_cl.clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS ? 0 : -1;
    FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
    if (!f || fwrite(bin, 1, size, f) != size) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    free(bin);
    return rc;
}

void fa_cl_record_launch(fa_cl_context *ctx, cl_kernel kernel, cl_uint dims, const size_t *global,
                         const size_t *local) {
    const char *dir = rec_dir();
    if (!dir || !ctx || !kernel) return;
    char name[256] = "";
    cl_uint nargs = 0;
    if (fa_cl.clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL) != CL_SUCCESS ||
        fa_cl.clGetKernelInfo(kernel, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL) != CL_SUCCESS)
        return;
    name[sizeof name - 1] = '\0';
    const char *only = getenv("FLASHATTN_OPENCL_RECORD_KERNEL");
    if (only && only[0] && !strstr(name, only)) return;
    if (rec.kernel != kernel || nargs > REC_MAX_ARGS) {
        fprintf(stderr, "flashattn record: %s: arguments not set through cl_args.h, not recorded\n", name);
        return;
    }
    for (cl_uint i = 0; i < nargs; i++)
        if (!rec.args[i].set) {
            fprintf(stderr, "flashattn record: %s: argument %u not recorded\n", name, (unsigned)i);
            return;
        }
    const char *max_env = getenv("FLASHATTN_OPENCL_RECORD_MAX");
    const int max = max_env && atoi(max_env) > 0 ? atoi(max_env) : 8;
    const int n = atomic_fetch_add(&rec_count, 1);
    if (n >= max) return;

    char path[4096], file[4200];
    snprintf(path, sizeof path, "%s/launch-%03d", dir, n);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return;
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "flashattn record: cannot create %s\n", path);
        return;
    }
    snprintf(file, sizeof file, "%s/program.bin", path);
    int bad = rec_program(kernel, file) != 0;
    snprintf(file, sizeof file, "%s/meta.txt", path);
    FILE *meta = fopen(file, "w");
    if (!meta) return;
    fprintf(meta, "kernel %s\ndims %u\nglobal", name, (unsigned)dims);
    for (cl_uint d = 0; d < 3; d++) fprintf(meta, " %zu", d < dims ? global[d] : (size_t)1);
    fprintf(meta, "\nlocal");
    for (cl_uint d = 0; d < 3; d++) fprintf(meta, " %zu", d < dims && local ? local[d] : (size_t)1);
    fprintf(meta, "\nargs %u\n", (unsigned)nargs);
    for (cl_uint i = 0; i < nargs; i++) {
        const rec_arg *a = &rec.args[i];
        if (a->is_mem) {
            cl_mem m;
            memcpy(&m, a->value, sizeof m);
            if (!m) {
                fprintf(meta, "arg %u null\n", (unsigned)i);
                continue;
            }
            /* A buffer named by several arguments is one file (aliasing kept). */
            cl_uint first = i;
            for (cl_uint j = 0; j < i; j++)
                if (rec.args[j].is_mem && memcmp(rec.args[j].value, a->value, sizeof m) == 0) {
                    first = j;
                    break;
                }
            fprintf(meta, "arg %u mem buf%03u.bin\n", (unsigned)i, (unsigned)first);
            if (first == i) {
                snprintf(file, sizeof file, "%s/buf%03u.bin", path, (unsigned)i);
                bad |= rec_buffer(ctx, m, file) != 0;
            }
        } else {
            fprintf(meta, "arg %u val %zu ", (unsigned)i, a->size);
            for (size_t b = 0; b < a->size; b++) fprintf(meta, "%02x", a->value[b]);
            fprintf(meta, "\n");
        }
    }
    if (fclose(meta) != 0) bad = 1;
    if (bad) fprintf(stderr, "flashattn record: %s: incomplete record in %s\n", name, path);
}
