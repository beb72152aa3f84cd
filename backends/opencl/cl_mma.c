/* The OpenCL backend's matrix-unit kernels: layer, sources, options and
 * checks (cl_mma.h). The geometry is core/planner_cl_mma.c's. */
#include "cl_mma.h"

#include "cl_runtime_internal.h"
#include "fa_internal.h"

#include <stdio.h>
#include <string.h>

fa_mma_layout fa_cl_mma_layer(const fa_cl_context *ctx, int *emulated) {
    const fa_cl_device *d = ctx ? fa_cl_device_get(ctx->index) : NULL;
    if (emulated) *emulated = d ? d->mma_emulated : 0;
    return d ? (fa_mma_layout)d->mma_layout : FA_MMA_LAYOUT_NONE;
}

size_t fa_cl_mma_extra_local(const fa_cl_context *ctx, fa_mma_layout layout, int warps) {
    int emulated = 0;
    (void)fa_cl_mma_layer(ctx, &emulated);
    return emulated ? fa_cl_mma_scratch_bytes(layout, warps) : 0;
}

fa_status fa_cl_mma_check(const fa_cl_context *ctx, const fa_attention_desc *d, fa_pass pass,
                          const fa_kernel_plan *kp, fa_cl_mma_geometry *g) {
    const char *name = pass == FA_PASS_BACKWARD ? "backward" : "forward";
    const fa_device_desc *dev = &ctx->info.desc;
    const fa_mma_layout family = fa_cl_mma_layer(ctx, NULL);
    if (family == FA_MMA_LAYOUT_NONE || fa_mma_layout_of(dev) != family)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: variant mma, but %s has no matrix units OpenCL reaches", name,
                       dev->name);
    if (!fa_cl_mma_applies(dev, d))
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: the matrix-unit kernels take fp16 or bf16, not %s", name,
                       fa_dtype_name(d->q.dtype));
    if (kp->split_k > 1 && pass == FA_PASS_BACKWARD)
        return fa_fail(FA_ERR_INTERNAL, "backward plan: split_k %d, the backward never splits keys", kp->split_k);
    if (!fa_cl_mma_geometry_of(dev, d, pass, kp->br, kp->bc, kp->thread_rows, kp->thread_cols, kp->stages, g))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "%s plan: br %d, bc %d, thread_rows %d, thread_cols %d, stages %d is no %s matrix-unit tile at "
                       "head_dim %d",
                       name, kp->br, kp->bc, kp->thread_rows, kp->thread_cols, kp->stages,
                       fa_mma_layout_get(family)->name, d->head_dim);
    const int wg = g->warps * fa_mma_layout_get(g->layout)->sub_group;
    if (kp->work_group_size != wg)
        return fa_fail(FA_ERR_INTERNAL, "%s plan: work_group_size %d, the tile's sub-groups make %d", name,
                       kp->work_group_size, wg);
    const int most = g->dq_warps > g->warps ? g->dq_warps : g->warps;
    const size_t local = g->local_mem + fa_cl_mma_extra_local(ctx, g->layout, most);
    if (local > dev->local_mem_bytes)
        return fa_fail(FA_ERR_UNSUPPORTED, "%s plan: %zu bytes of local memory exceed the device's %zu", name, local,
                       dev->local_mem_bytes);
    return FA_SUCCESS;
}

int fa_cl_mma_sources(fa_mma_layout layout, const char *const *files, int count, const char **paths, int cap) {
    const fa_mma_layout_info *l = fa_mma_layout_get(layout);
    const int nvidia = layout == FA_MMA_LAYOUT_NVIDIA;
    if (!l || count + 5 + nvidia > cap) return 0;
    int n = 0;
    paths[n++] = "kernels_cl/common.h";
    paths[n++] = "kernels_cl/mma_frag.h";
    paths[n++] = l->header;
    paths[n++] = "kernels_cl/mma_generic.h";
    paths[n++] = "kernels_cl/mma_common.h";
    /* Hopper's warpgroup products, which need mma_common.h's tile macros. */
    if (nvidia) paths[n++] = "kernels_cl/wgmma_nvidia.h";
    for (int i = 0; i < count; i++) paths[n++] = files[i];
    return n;
}

fa_status fa_cl_mma_options(fa_mma_layout layout, int emulated, int warps, char *out, size_t size) {
    const fa_mma_layout_info *l = fa_mma_layout_get(layout);
    if (!l) return fa_fail(FA_ERR_INTERNAL, "layout %d has no matrix-unit layer", (int)layout);
    const size_t used = strlen(out);
    const int n = snprintf(out + used, size - used, " -DWARPS=%d -D%s%s", warps, l->macro,
                           emulated ? " -DFA_MMA_EMULATE" : "");
    if (n < 0 || (size_t)n >= size - used)
        return fa_fail(FA_ERR_INTERNAL, "matrix-unit build options do not fit in %zu bytes", size);
    return FA_SUCCESS;
}
