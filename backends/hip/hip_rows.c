/* The ring's element-wise passes on HIP (core/backend.h: rows,
 * rows_merge): kernels_hip/rows.hip, compiled by hiprtc through the kernel
 * cache on a context's first pass and kept with the context, launched on
 * the stream in use without waiting for it. The checks, the parameter block
 * and the grid are core/rows_launch.c's. */
#define FA_HIP_RUNTIME_TYPES
#include "hip_runtime_internal.h"

#include "fa_internal.h"
#include "rows_launch.h"

#include <stdint.h>
#include <string.h>

void fa_hip_rows_program(fa_hip_program *out) {
    memset(out, 0, sizeof *out);
    out->paths[out->path_count++] = "kernels_hip/rows.hip";
    out->kernels[out->kernel_count++] = "fa_rows";
    out->kernels[out->kernel_count++] = "fa_rows_merge";
}

void fa_hip_rows_release(fa_hip_context *ctx) {
    if (!ctx->rows_module) return;
    (void)fa_hip_api_get()->hipModuleUnload(ctx->rows_module);
    ctx->rows_module = NULL;
}

static fa_status launch(fa_hip_context *ctx, int merge, fa_rows_launch *l) {
    if (l->blocks == 0) return FA_SUCCESS;
    int previous;
    FA_CHECK(fa_hip_enter(ctx, &previous));
    fa_status st = FA_SUCCESS;
    fa_hip_program prog;
    fa_hip_rows_program(&prog);
    if (!ctx->rows_module) st = fa_hip_load_program(ctx, &prog, &ctx->rows_module, ctx->rows_fn);
    if (st == FA_SUCCESS) {
        void *args[] = {&l->params};
        st = fa_hip_launch(ctx, ctx->rows_fn[merge], prog.kernels[merge], l->blocks, 1, 1, l->threads, 0, args);
    }
    fa_hip_leave(ctx, previous);
    return st;
}

fa_status fa_hip_rows(void *handle, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                      const fa_rows_view *src, float value) {
    fa_rows_launch l;
    FA_CHECK(fa_rows_prepare(op, shape, dst, src, value, fa_hip_buffer_locate, &l));
    return launch(handle, 0, &l);
}

fa_status fa_hip_rows_merge(void *handle, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                            const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l) {
    fa_rows_launch l;
    FA_CHECK(fa_rows_merge_prepare(shape, acc_o, acc_l, part_o, part_l, fa_hip_buffer_locate, &l));
    return launch(handle, 1, &l);
}
