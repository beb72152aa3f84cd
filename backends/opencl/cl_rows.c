/* The ring's element-wise passes (core/backend.h: rows, rows_merge) on
 * OpenCL: kernels_cl/rows.cl, one program per context, built on the first
 * pass that needs it and kept until the context goes (a ring runs these
 * passes at every step, so neither a plan nor a call may own the program).
 * Passes are queued on the queue in use and never waited for, as the
 * attention passes. */
#include "cl_runtime_internal.h"

#include "fa_internal.h"
#include "rows_launch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct fa_cl_rows_kernels {
    cl_program program;
    cl_kernel rows, merge_o, merge_l;
};

/* Work-items a compute unit gets before they stride over the elements:
 * enough to fill a GPU's unit, and no more, as each one's loop is cheap. */
#define ROWS_ITEMS_PER_UNIT 2048
/* The global size is a multiple of this, so that the driver, which picks
 * the work-group size, can pick a large one. */
#define ROWS_GLOBAL_QUANTUM 256

/* kernels_cl/rows.cl's op and dtype codes. */
enum { RS_F32 = 0, RS_F16 = 1, RS_BF16 = 2 };
enum { RS_COPY = 0, RS_ADD = 1, RS_FILL = 2 };

void fa_cl_rows_release(fa_cl_context *ctx) {
    struct fa_cl_rows_kernels *k = ctx ? ctx->rows : NULL;
    if (!k) return;
    if (k->rows) fa_cl.clReleaseKernel(k->rows);
    if (k->merge_o) fa_cl.clReleaseKernel(k->merge_o);
    if (k->merge_l) fa_cl.clReleaseKernel(k->merge_l);
    if (k->program) fa_cl.clReleaseProgram(k->program);
    free(k);
    ctx->rows = NULL;
}

/* The context's program, built (or read from the kernel cache) on first
 * use. A failed build is not remembered: the next pass tries again and
 * reports the compiler's log again. */
static fa_status rows_kernels(fa_cl_context *ctx, struct fa_cl_rows_kernels **out) {
    if (!ctx->rows) {
        struct fa_cl_rows_kernels *k = calloc(1, sizeof *k);
        if (!k) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for the rows kernels");
        ctx->rows = k;
        static const char *const paths[] = {"kernels_cl/rows.cl"};
        fa_status st = fa_cl_build(ctx, paths, 1, "", &k->program);
        if (st == FA_SUCCESS) st = fa_cl_create_kernel(k->program, "fa_rows", &k->rows);
        if (st == FA_SUCCESS) st = fa_cl_create_kernel(k->program, "fa_rows_merge_o", &k->merge_o);
        if (st == FA_SUCCESS) st = fa_cl_create_kernel(k->program, "fa_rows_merge_l", &k->merge_l);
        if (st != FA_SUCCESS) {
            fa_cl_rows_release(ctx);
            return st;
        }
    }
    *out = ctx->rows;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Arguments                                                                 */

typedef struct rows_args {
    cl_kernel kernel;
    const char *name;
    cl_uint index;
    cl_int err;
    cl_uint failed_index;
} rows_args;

static void arg_raw(rows_args *a, size_t size, const void *value) {
    if (a->err == CL_SUCCESS) {
        a->err = fa_cl.clSetKernelArg(a->kernel, a->index, size, value);
        if (a->err != CL_SUCCESS) a->failed_index = a->index;
    }
    a->index++;
}

static void arg_mem(rows_args *a, cl_mem m) { arg_raw(a, sizeof m, &m); }
static void arg_int(rows_args *a, int v) {
    cl_int x = v;
    arg_raw(a, sizeof x, &x);
}
static void arg_long(rows_args *a, int64_t v) {
    cl_long x = v;
    arg_raw(a, sizeof x, &x);
}
static void arg_ulong(rows_args *a, uint64_t v) {
    cl_ulong x = v;
    arg_raw(a, sizeof x, &x);
}
static void arg_float(rows_args *a, float v) {
    cl_float x = v;
    arg_raw(a, sizeof x, &x);
}

static void arg_buffer(rows_args *a, const fa_rows_view *v) { arg_mem(a, ((const fa_cl_buffer *)v->buf)->mem); }
/* RS_VIEW in rows.cl. */
static void arg_layout(rows_args *a, const fa_rows_view *v) {
    arg_long(a, v->offset);
    arg_long(a, v->stride_batch);
    arg_long(a, v->stride_seq);
    arg_long(a, v->stride_head);
}

static int kernel_dtype(fa_dtype t) { return t == FA_DTYPE_F16 ? RS_F16 : t == FA_DTYPE_BF16 ? RS_BF16 : RS_F32; }

/* Enqueued on the queue in use; no event, no wait. */
static fa_status run(fa_cl_context *ctx, const rows_args *a, uint64_t count) {
    if (a->err != CL_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "clSetKernelArg(%s, %u)", a->name, (unsigned)a->failed_index);
        return fa_cl_error(a->err, what);
    }
    const int units = ctx->info.desc.compute_units > 0 ? ctx->info.desc.compute_units : 1;
    uint64_t items = (uint64_t)units * ROWS_ITEMS_PER_UNIT;
    if (count < items) items = count;
    items = (items + ROWS_GLOBAL_QUANTUM - 1) / ROWS_GLOBAL_QUANTUM * ROWS_GLOBAL_QUANTUM;
    const size_t global = (size_t)items;
    fa_status st = fa_cl_launch(ctx, a->kernel, 1, &global, NULL, NULL);
    if (st != FA_SUCCESS) {
        fa_fail_append(" (kernel ");
        fa_fail_append(a->name);
        fa_fail_append(")");
    }
    return st;
}

/* A cl_mem has no address the checks could test for alignment: offsets
 * are in elements, so every view is aligned; its size bounds the views. */
static void locate(void *buf, uint64_t *address, size_t *bytes) {
    *address = 0;
    *bytes = ((const fa_cl_buffer *)buf)->bytes;
}

/* ------------------------------------------------------------------------ */

fa_status fa_cl_rows(void *handle, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                     const fa_rows_view *src, float value) {
    fa_cl_context *ctx = handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fa_rows_launch launch;
    FA_CHECK(fa_rows_prepare(op, shape, dst, src, value, locate, &launch));
    if (!launch.blocks) return FA_SUCCESS;
    const uint64_t count = (uint64_t)launch.params.lines * (uint64_t)shape->dim;
    /* FILL reads no source; the kernel still wants a buffer there. */
    const fa_rows_view *from = op == FA_ROWS_FILL ? dst : src;
    struct fa_cl_rows_kernels *k = NULL;
    FA_CHECK(rows_kernels(ctx, &k));

    rows_args a = {k->rows, "fa_rows", 0, CL_SUCCESS, 0};
    arg_int(&a, op == FA_ROWS_COPY ? RS_COPY : op == FA_ROWS_ADD ? RS_ADD : RS_FILL);
    arg_buffer(&a, dst);
    arg_int(&a, kernel_dtype(dst->dtype));
    arg_layout(&a, dst);
    arg_buffer(&a, from);
    arg_int(&a, kernel_dtype(from->dtype));
    arg_layout(&a, from);
    arg_int(&a, shape->rows);
    arg_int(&a, shape->heads);
    arg_int(&a, shape->dim);
    arg_ulong(&a, count);
    arg_float(&a, value);
    return run(ctx, &a, count);
}

fa_status fa_cl_rows_merge(void *handle, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                           const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l) {
    fa_cl_context *ctx = handle;
    if (!ctx) return fa_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fa_rows_launch launch;
    FA_CHECK(fa_rows_merge_prepare(shape, acc_o, acc_l, part_o, part_l, locate, &launch));
    if (!launch.blocks) return FA_SUCCESS;
    const uint64_t lines = (uint64_t)launch.params.lines, count = lines * (uint64_t)shape->dim;
    struct fa_cl_rows_kernels *k = NULL;
    FA_CHECK(rows_kernels(ctx, &k));

    {
        rows_args o = {k->merge_o, "fa_rows_merge_o", 0, CL_SUCCESS, 0};
        arg_buffer(&o, acc_o);
        arg_layout(&o, acc_o);
        arg_buffer(&o, acc_l);
        arg_layout(&o, acc_l);
        arg_buffer(&o, part_o);
        arg_int(&o, kernel_dtype(part_o->dtype));
        arg_layout(&o, part_o);
        arg_buffer(&o, part_l);
        arg_layout(&o, part_l);
        arg_int(&o, shape->rows);
        arg_int(&o, shape->heads);
        arg_int(&o, shape->dim);
        arg_ulong(&o, count);
        FA_CHECK(run(ctx, &o, count));
    }

    rows_args l = {k->merge_l, "fa_rows_merge_l", 0, CL_SUCCESS, 0};
    arg_buffer(&l, acc_l);
    arg_layout(&l, acc_l);
    arg_buffer(&l, part_l);
    arg_layout(&l, part_l);
    arg_int(&l, shape->rows);
    arg_int(&l, shape->heads);
    arg_ulong(&l, lines);
    return run(ctx, &l, lines);
}
