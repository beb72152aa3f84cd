/* KV-cache steps on OpenCL (fa_forward_kvcache): the program of
 * kernels_cl/kvcache.cl (with splitk.cl's merge) built for the plan's
 * packed-row tile, its workspace (validity flags, split partials) and the
 * four launches of a step: check, append, attend, merge. */
#include "cl_kvcache.h"
#include "cl_args.h"

#include "desc.h"
#include "dtype.h"
#include "fa_internal.h"
#include "plan_data.h"
#include "planner.h"
#include "planner_decode.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_CHECK_WG 64 /* kvcache.cl's */
#define KV_MAX_EVENTS 4


typedef struct fa_cl_kv_plan {
    fa_cl_plan_kind kind; /* FA_CL_PLAN_KVCACHE; first, see cl_backend.h */
    fa_cl_context *ctx;
    int br, bc, tr, tc, wg, num_splits;
    int64_t row_tiles;
    cl_program program;
    cl_kernel check, append, attend, merge;
    cl_mem status;            /* int32 [batch]: 1 where the sequence keeps the rules */
    cl_mem part_o, part_l;    /* split partials */
    cl_mem lse_scratch;       /* the merge's L where the caller passes none */
    cl_mem alibi;             /* heads_q slopes */
    cl_mem dummy;
    cl_layout q, k, v, o, k_new, v_new;
    cl_event events[KV_MAX_EVENTS];
    int event_count;
} fa_cl_kv_plan;

int fa_cl_kvcache_owns(const void *plan_impl) {
    return plan_impl && *(const fa_cl_plan_kind *)plan_impl == FA_CL_PLAN_KVCACHE;
}

static void release_events(fa_cl_kv_plan *p) {
    for (int i = 0; i < p->event_count; i++)
        if (p->events[i]) fa_cl.clReleaseEvent(p->events[i]);
    p->event_count = 0;
}

void fa_cl_kvcache_release(void *plan_impl) {
    fa_cl_kv_plan *p = plan_impl;
    if (!p) return;
    release_events(p);
    cl_kernel kernels[] = {p->check, p->append, p->attend, p->merge};
    for (size_t i = 0; i < FA_ARRAY_SIZE(kernels); i++)
        if (kernels[i]) fa_cl.clReleaseKernel(kernels[i]);
    if (p->program) fa_cl.clReleaseProgram(p->program);
    cl_mem mems[] = {p->status, p->part_o, p->part_l, p->lse_scratch, p->alibi, p->dummy};
    for (size_t i = 0; i < FA_ARRAY_SIZE(mems); i++)
        if (mems[i]) fa_cl.clReleaseMemObject(mems[i]);
    free(p);
}

static cl_layout layout_of(const fa_attention_desc *d, fa_tensor_role role) {
    const fa_layout l = fa_desc_layout(d, role);
    const cl_layout c = {l.offset, l.stride_batch, l.stride_seq, l.stride_head};
    return c;
}

/* The plan's tile as the kernels take it: the planner's packed SIMT tile
 * (planner_decode.c), checked against what kvcache.cl can run. */
static fa_status check_plan(const fa_cl_context *ctx, const fa_attention_desc *d, const fa_kernel_plan *kp) {
    if (kp->variant != FA_VARIANT_SIMT && kp->variant != FA_VARIANT_SPLITK)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache: forward variant %s has no OpenCL KV-cache kernel (simt and splitk do)",
                       fa_variant_name(kp->variant));
    if (kp->br <= 0 || kp->bc <= 0 || kp->thread_rows <= 0 || kp->thread_cols <= 0 || kp->br % kp->thread_rows ||
        kp->bc % kp->thread_cols || kp->bc % 8 ||
        kp->work_group_size != (kp->br / kp->thread_rows) * (kp->bc / kp->thread_cols) || kp->split_k < 1)
        return fa_fail(FA_ERR_INTERNAL, "kv_cache plan: tile %d x %d, micro-tile %d x %d, work-group %d, split_k %d "
                                        "is not one kvcache.cl runs",
                       kp->br, kp->bc, kp->thread_rows, kp->thread_cols, kp->work_group_size, kp->split_k);
    if (kp->work_group_size > ctx->info.desc.max_work_group_size)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache plan: work-group of %d exceeds the device's %d",
                       kp->work_group_size, ctx->info.desc.max_work_group_size);
    const size_t local = fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_FORWARD, d, kp->br, kp->bc, 1);
    if (local > ctx->info.desc.local_mem_bytes)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache plan: %zu bytes of local memory exceed the device's %zu", local,
                       ctx->info.desc.local_mem_bytes);
    /* Packed rows are ints in the kernel, with room for a tile past them. */
    if ((int64_t)(d->heads_q / d->heads_kv) * d->seqlen_q > INT_MAX / 2)
        return fa_fail(FA_ERR_UNSUPPORTED, "kv_cache: %lld packed query rows per KV head (heads_q / heads_kv x "
                                           "seqlen_q) exceed the OpenCL kernel's %d",
                       (long long)(d->heads_q / d->heads_kv) * d->seqlen_q, INT_MAX / 2);
    return FA_SUCCESS;
}

static fa_status build(fa_cl_kv_plan *p, const fa_plan_s *plan) {
    static const char *const paths[] = {"kernels_cl/common.h", "kernels_cl/kvcache.cl", "kernels_cl/splitk.cl"};
    const fa_attention_desc *d = &plan->desc;
    char options[512];
    const int n = snprintf(options, sizeof options, "-DHEAD_DIM=%d -DBR=%d -DBC=%d -DTR=%d -DTC=%d %s%s%s%s%s%s%s%s%s",
                           d->head_dim, p->br, p->bc, p->tr, p->tc, fa_dtype_build_option(d->q.dtype),
                           d->causal ? " -DCAUSAL" : "",
                           fa_desc_has_window(d) ? " -DWINDOW" : "",
                           d->page_size > 0 ? " -DPAGED" : "", d->rotary_dim > 0 ? " -DROTARY" : "",
                           d->rotary_dim > 0 && d->rotary_interleaved ? " -DROTARY_INTERLEAVED" : "",
                           d->softcap > 0.0f ? " -DSOFTCAP" : "", d->alibi_slopes ? " -DALIBI" : "",
                           p->num_splits > 1 ? " -DSPLITK" : "");
    if (n < 0 || (size_t)n >= sizeof options)
        return fa_fail(FA_ERR_INTERNAL, "KV-cache build options do not fit in %zu bytes", sizeof options);
    FA_CHECK(fa_cl_build(p->ctx, paths, (int)FA_ARRAY_SIZE(paths), options, &p->program));
    FA_CHECK(fa_cl_create_kernel(p->program, "fa_kv_check", &p->check));
    FA_CHECK(fa_cl_create_kernel(p->program, "fa_kv_append", &p->append));
    FA_CHECK(fa_cl_create_kernel(p->program, "fa_kv_attend", &p->attend));
    return fa_cl_create_kernel(p->program, "fa_splitk_merge", &p->merge);
}

fa_status fa_cl_kvcache_prepare(fa_cl_context *ctx, const fa_plan_s *plan, void **plan_impl) {
    const fa_attention_desc *d = &plan->desc;
    const fa_kernel_plan *kp = &plan->info.forward;
    FA_CHECK(check_plan(ctx, d, kp));
    fa_cl_kv_plan *p = calloc(1, sizeof *p);
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for an OpenCL KV-cache plan");
    p->kind = FA_CL_PLAN_KVCACHE;
    p->ctx = ctx;
    p->br = kp->br;
    p->bc = kp->bc;
    p->tr = kp->thread_rows;
    p->tc = kp->thread_cols;
    p->wg = kp->work_group_size;
    p->num_splits = kp->split_k;
    p->row_tiles = fa_kvcache_row_tiles(d, p->br);
    p->q = layout_of(d, FA_TENSOR_Q);
    p->k = layout_of(d, FA_TENSOR_K);
    p->v = layout_of(d, FA_TENSOR_V);
    p->o = layout_of(d, FA_TENSOR_O);
    p->k_new = layout_of(d, FA_TENSOR_K_NEW);
    p->v_new = layout_of(d, FA_TENSOR_V_NEW);

    const size_t heads = (size_t)d->heads_q, tokens = (size_t)plan->total_q, dim = (size_t)d->head_dim;
    size_t bytes = 0;
    fa_status st = fa_cl_create_plan_buffer(ctx, 16, NULL, "a placeholder buffer", &p->dummy);
    if (st == FA_SUCCESS)
        st = fa_cl_create_plan_buffer(ctx, (size_t)d->batch * sizeof(cl_int), NULL, "the KV-cache validity flags",
                                      &p->status);
    if (st == FA_SUCCESS && d->alibi_slopes)
        st = fa_cl_create_plan_buffer(ctx, heads * sizeof(float), plan->alibi_slopes, "the ALiBi slopes", &p->alibi);
    if (st == FA_SUCCESS && p->num_splits > 1) {
        st = fa_workspace_bytes("split-K partial outputs",
                                (size_t[]){(size_t)p->num_splits, heads, tokens, dim, sizeof(float)}, 5, &bytes);
        if (st == FA_SUCCESS) st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "split-K partial outputs", &p->part_o);
        if (st == FA_SUCCESS)
            st = fa_workspace_bytes("split-K partial log-sum-exps",
                                    (size_t[]){(size_t)p->num_splits, heads, tokens, sizeof(float)}, 4, &bytes);
        if (st == FA_SUCCESS)
            st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "split-K partial log-sum-exps", &p->part_l);
        if (st == FA_SUCCESS)
            st = fa_workspace_bytes("the merged log-sum-exps", (size_t[]){heads, tokens, sizeof(float)}, 3, &bytes);
        if (st == FA_SUCCESS)
            st = fa_cl_create_plan_buffer(ctx, bytes, NULL, "the merged log-sum-exps", &p->lse_scratch);
    }
    if (st == FA_SUCCESS) st = build(p, plan);
    if (st != FA_SUCCESS) {
        fa_cl_kvcache_release(p);
        return st;
    }
    *plan_impl = p;
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */


static cl_mem mem_or(const fa_cl_kv_plan *p, void *buffer) { return buffer ? mem_of(buffer) : p->dummy; }
static cl_mem own_or(const fa_cl_kv_plan *p, cl_mem m) { return m ? m : p->dummy; }

static fa_status launch(fa_cl_kv_plan *p, cl_kernel kernel, cl_uint dims, const size_t *global, const size_t *local) {
    cl_event *ev = p->event_count < KV_MAX_EVENTS ? &p->events[p->event_count] : NULL;
    fa_status st = fa_cl_launch(p->ctx, kernel, dims, global, local, ev);
    if (st == FA_SUCCESS && ev && *ev) p->event_count++;
    return st;
}

fa_status fa_cl_kvcache_forward(void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *a) {
    fa_cl_kv_plan *p = plan_impl;
    if (!p || !plan || !a) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : !plan ? "plan" : "args");
    const fa_attention_desc *d = &plan->desc;
    const int64_t pages_per_seq = fa_desc_pages_per_seq(d);
    const int query_offsets = fa_desc_rotary_query_offsets(d);
    release_events(p);

    cl_args c = {p->check, 0, CL_SUCCESS, 0};
    arg_mem(&c, mem_of(a->cache_seqlens));
    arg_mem(&c, mem_or(p, a->block_table));
    arg_mem(&c, p->status);
    arg_int(&c, d->seqlen_k);
    arg_int(&c, d->seqlen_q);
    arg_int(&c, d->seqlen_new);
    arg_int(&c, d->num_pages);
    arg_int(&c, d->page_size);
    arg_long(&c, pages_per_seq);
    arg_int(&c, d->rotary_dim);
    arg_int(&c, query_offsets);
    FA_CHECK(args_done(&c, "fa_kv_check"));
    const size_t check_global[1] = {(size_t)d->batch * KV_CHECK_WG}, check_local[1] = {KV_CHECK_WG};
    FA_CHECK(launch(p, p->check, 1, check_global, check_local));

    if (d->seqlen_new > 0) {
        cl_args w = {p->append, 0, CL_SUCCESS, 0};
        arg_mem(&w, mem_of(a->k_new));
        arg_mem(&w, mem_of(a->v_new));
        arg_mem(&w, mem_of(a->k_cache));
        arg_mem(&w, mem_of(a->v_cache));
        arg_mem(&w, mem_of(a->cache_seqlens));
        arg_mem(&w, mem_or(p, a->block_table));
        arg_mem(&w, p->status);
        arg_mem(&w, mem_or(p, a->rotary_cos));
        arg_mem(&w, mem_or(p, a->rotary_sin));
        arg_layout(&w, &p->k_new);
        arg_layout(&w, &p->v_new);
        arg_layout(&w, &p->k);
        arg_layout(&w, &p->v);
        arg_int(&w, d->seqlen_new);
        arg_int(&w, d->heads_kv);
        arg_int(&w, d->page_size);
        arg_long(&w, pages_per_seq);
        arg_int(&w, d->rotary_dim);
        FA_CHECK(args_done(&w, "fa_kv_append"));
        const size_t global[3] = {(size_t)d->head_dim / 2, (size_t)d->seqlen_new * (size_t)d->heads_kv,
                                  (size_t)d->batch};
        FA_CHECK(launch(p, p->append, 3, global, NULL));
    }

    cl_args t = {p->attend, 0, CL_SUCCESS, 0};
    arg_mem(&t, mem_of(a->q));
    arg_mem(&t, mem_of(a->k_cache));
    arg_mem(&t, mem_of(a->v_cache));
    arg_mem(&t, mem_of(a->o));
    arg_mem(&t, mem_or(p, a->lse));
    arg_mem(&t, mem_of(a->cache_seqlens));
    arg_mem(&t, mem_or(p, a->block_table));
    arg_mem(&t, p->status);
    arg_mem(&t, mem_or(p, a->rotary_cos));
    arg_mem(&t, mem_or(p, a->rotary_sin));
    arg_mem(&t, own_or(p, p->alibi));
    arg_mem(&t, own_or(p, p->part_o));
    arg_mem(&t, own_or(p, p->part_l));
    arg_layout(&t, &p->q);
    arg_layout(&t, &p->k);
    arg_layout(&t, &p->v);
    arg_layout(&t, &p->o);
    arg_int(&t, d->seqlen_q);
    arg_int(&t, d->seqlen_new);
    arg_int(&t, d->heads_q);
    arg_int(&t, d->heads_q / d->heads_kv);
    arg_int(&t, p->num_splits);
    arg_float(&t, plan->scale);
    arg_float(&t, d->softcap);
    arg_int(&t, d->window_left);
    arg_int(&t, d->window_right);
    arg_int(&t, d->page_size);
    arg_long(&t, pages_per_seq);
    arg_int(&t, d->rotary_dim);
    arg_int(&t, query_offsets);
    arg_int(&t, a->lse != NULL);
    FA_CHECK(args_done(&t, "fa_kv_attend"));
    const size_t global[3] = {(size_t)p->row_tiles * (size_t)p->wg, (size_t)d->heads_kv,
                              (size_t)d->batch * (size_t)p->num_splits};
    const size_t local[3] = {(size_t)p->wg, 1, 1};
    FA_CHECK(launch(p, p->attend, 3, global, local));
    if (p->num_splits == 1) return FA_SUCCESS;

    cl_args m = {p->merge, 0, CL_SUCCESS, 0};
    arg_mem(&m, p->part_o);
    arg_mem(&m, p->part_l);
    arg_mem(&m, mem_of(a->o));
    arg_mem(&m, a->lse ? mem_of(a->lse) : p->lse_scratch);
    arg_layout(&m, &p->o);
    arg_int(&m, d->seqlen_q);
    arg_int(&m, d->heads_q);
    arg_long(&m, plan->total_q);
    arg_mem(&m, p->dummy);
    arg_int(&m, p->num_splits);
    FA_CHECK(args_done(&m, "fa_splitk_merge"));
    const size_t mglobal[3] = {(size_t)d->head_dim, (size_t)d->seqlen_q, (size_t)d->batch * (size_t)d->heads_q};
    return launch(p, p->merge, 3, mglobal, NULL);
}

fa_status fa_cl_kvcache_last_time_ms(void *plan_impl, double *ms) {
    fa_cl_kv_plan *p = plan_impl;
    if (!p || !ms) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", !p ? "plan_impl" : "ms");
    if (p->event_count == 0) return fa_fail(FA_ERR_UNSUPPORTED, "no KV-cache step has run on this plan");
    double total = 0.0;
    for (int i = 0; i < p->event_count; i++) {
        const double t = fa_cl_event_ms(p->events[i]);
        if (t < 0.0) return fa_fail(FA_ERR_UNSUPPORTED, "the OpenCL queue could not time the last step");
        total += t;
    }
    *ms = total;
    return FA_SUCCESS;
}
