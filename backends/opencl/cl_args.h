/* Kernel arguments set in order, with the first failure kept: the OpenCL
 * attention and KV-cache launches share these (one header, static inline,
 * so each translation unit keeps its calls local). */
#ifndef FA_CL_ARGS_H
#define FA_CL_ARGS_H

#include "cl_backend.h"

#include <stdint.h>
#include <stdio.h>

/* A tensor layout with packed strides resolved (elements). */
typedef struct cl_layout {
    cl_long offset, stride_batch, stride_seq, stride_head;
} cl_layout;

typedef struct cl_args {
    cl_kernel kernel;
    cl_uint index;
    cl_int err;
    cl_uint failed_index;
} cl_args;

static inline void arg_set(cl_args *a, size_t size, const void *value, int is_mem) {
    if (a->err == CL_SUCCESS) {
        a->err = fa_cl.clSetKernelArg(a->kernel, a->index, size, value);
        if (a->err != CL_SUCCESS) a->failed_index = a->index;
        fa_cl_record_arg(a->kernel, a->index, size, value, is_mem);
    }
    a->index++;
}

static inline void arg_raw(cl_args *a, size_t size, const void *value) { arg_set(a, size, value, 0); }
static inline void arg_mem(cl_args *a, cl_mem m) { arg_set(a, sizeof m, &m, 1); }
static inline void arg_int(cl_args *a, int v) {
    const cl_int x = v;
    arg_raw(a, sizeof x, &x);
}
static inline void arg_uint(cl_args *a, cl_uint v) { arg_raw(a, sizeof v, &v); }
static inline void arg_long(cl_args *a, int64_t v) {
    const cl_long x = v;
    arg_raw(a, sizeof x, &x);
}
static inline void arg_float(cl_args *a, float v) {
    const cl_float x = v;
    arg_raw(a, sizeof x, &x);
}
static inline void arg_layout(cl_args *a, const cl_layout *l) {
    arg_long(a, l->offset);
    arg_long(a, l->stride_batch);
    arg_long(a, l->stride_seq);
    arg_long(a, l->stride_head);
}

/* FA_SUCCESS, or the first failed clSetKernelArg named by kernel and index. */
static inline fa_status args_done(const cl_args *a, const char *kernel) {
    if (a->err == CL_SUCCESS) return FA_SUCCESS;
    char what[96];
    snprintf(what, sizeof what, "clSetKernelArg(%s, %u)", kernel, (unsigned)a->failed_index);
    return fa_cl_error(a->err, what);
}

static inline cl_mem mem_of(void *buffer) { return ((fa_cl_buffer *)buffer)->mem; }

#endif
