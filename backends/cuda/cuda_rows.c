/* The ring's element-wise passes on CUDA (core/backend.h: rows,
 * rows_merge): kernels_cuda/rows.cu, compiled by NVRTC through the kernel
 * cache on a context's first pass and kept with the context, launched on
 * the stream in use without waiting for it. The checks, the parameter block
 * and the grid are core/rows_launch.c's. */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_runtime_internal.h"
#include "cuda_compile.h"

#include "fa_internal.h"
#include "rows_launch.h"

#include <stdint.h>
#include <stdio.h>

static const char *const rows_headers[] = {"kernels_cuda/dtype.cuh"};
static const char *const rows_kernels[] = {"fa_rows", "fa_rows_merge"};

static const fa_cuda_program rows_program = {"kernels_cuda/rows.cu", rows_headers, (int)FA_ARRAY_SIZE(rows_headers),
                                             "", rows_kernels, (int)FA_ARRAY_SIZE(rows_kernels), 0};

fa_status fa_cuda_rows_compile(int cc_major, int cc_minor, fa_cuda_kernel_report *reports, int max_reports,
                               int *count) {
    return fa_cuda_program_report(&rows_program, cc_major, cc_minor, FA_ROWS_THREADS, reports, max_reports, count);
}

/* The module of the context, loading it on the first pass (the context is
 * current). */
static fa_status load_rows(fa_cuda_context *ctx) {
    if (ctx->rows_module) return FA_SUCCESS;
    CUfunction fn[2];
    FA_CHECK(fa_cuda_program_load(&rows_program, ctx, &ctx->rows_module, fn));
    ctx->rows_fn = fn[0];
    ctx->rows_merge_fn = fn[1];
    return FA_SUCCESS;
}

void fa_cuda_rows_release(fa_cuda_context *ctx) {
    if (!ctx->rows_module) return;
    (void)fa_cuda_api()->cuModuleUnload(ctx->rows_module);
    ctx->rows_module = NULL;
}

void fa_cuda_buffer_locate(void *buf, uint64_t *address, size_t *bytes) {
    const fa_cuda_buffer *b = buf;
    *address = (uint64_t)b->ptr;
    *bytes = b->bytes;
}

static fa_status launch(fa_cuda_context *ctx, int merge, fa_rows_launch *l) {
    if (l->blocks == 0) return FA_SUCCESS;
    FA_CHECK(fa_cuda_push(ctx));
    fa_status st = load_rows(ctx);
    if (st == FA_SUCCESS) {
        void *args[] = {&l->params};
        CUresult r = fa_cuda_api()->cuLaunchKernel(merge ? ctx->rows_merge_fn : ctx->rows_fn, l->blocks, 1, 1,
                                                   l->threads, 1, 1, 0, ctx->stream, args, NULL);
        if (r != CUDA_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "cuLaunchKernel(%s, %u blocks)", rows_kernels[merge], l->blocks);
            st = fa_cuda_error(r, what);
        }
    }
    fa_cuda_pop();
    return st;
}

fa_status fa_cuda_rows(void *handle, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                       const fa_rows_view *src, float value) {
    fa_rows_launch l;
    FA_CHECK(fa_rows_prepare(op, shape, dst, src, value, fa_cuda_buffer_locate, &l));
    return launch(handle, 0, &l);
}

fa_status fa_cuda_rows_merge(void *handle, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                             const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l) {
    fa_rows_launch l;
    FA_CHECK(fa_rows_merge_prepare(shape, acc_o, acc_l, part_o, part_l, fa_cuda_buffer_locate, &l));
    return launch(handle, 1, &l);
}
