/* The CPU reference exposed as a device: host memory buffers, and passes
 * computed by core/reference.c in fp64. It needs no runtime, so the API is
 * usable (and testable) on any machine; it is ranked last when the library
 * picks the best device. Plans are made for it like for any device, but the
 * reference does not tile: its plan is nominal. */
#include "backend.h"
#include "fa_internal.h"
#include "plan.h"
#include "reference.h"
#include "reference_rows.h"
#include "rows_launch.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct ref_buffer {
    unsigned char *data;
    size_t bytes;
    int owned;
} ref_buffer;

typedef struct ref_plan {
    double last_ms;
    int has_time;
} ref_plan;

static fa_status ref_init(char *reason, size_t reason_size) { return FA_SUCCESS; }

static int ref_device_count(void) { return 1; }

static fa_status ref_device_info(int index, fa_device_info *info) {
    memset(info, 0, sizeof *info);
    info->backend = FA_BACKEND_REFERENCE;
    info->index = index;
    strcpy(info->driver_version, fa_version(NULL, NULL, NULL));
    fa_device_desc *d = &info->desc;
    strcpy(d->name, "CPU reference (fp64, single thread)");
    strcpy(d->vendor, "flashattn");
    strcpy(d->arch, "host");
    d->backend = FA_BACKEND_REFERENCE;
    d->type = FA_DEVICE_CPU;
    /* Nominal figures: the reference runs plain loops on one core. */
    d->local_mem_bytes = 1u << 20;
    d->max_work_group_size = 1024;
    d->simd_width = 1;
    d->compute_units = 1;
    d->clock_mhz = 1000;
    d->bandwidth_gbs = 10.0;
    d->global_mem_bytes = (size_t)1 << 32;
    d->fp32_flops_per_clock_cu = 2.0;
    return FA_SUCCESS;
}

static fa_status ref_context_create(int index, void **ctx) {
    /* The reference has no device state; any non-NULL token will do. */
    static int token;
    *ctx = &token;
    return FA_SUCCESS;
}

static void ref_context_destroy(void *ctx) {}

static fa_status ref_context_synchronize(void *ctx) { return FA_SUCCESS; }

static fa_status ref_context_native(void *ctx, void **native_context, void **native_queue) {
    *native_context = NULL;
    *native_queue = NULL;
    return FA_SUCCESS;
}

static fa_status ref_buffer_alloc(void *ctx, size_t bytes, void **buf) {
    ref_buffer *b = malloc(sizeof *b);
    unsigned char *data = malloc(bytes);
    if (!b || !data) {
        free(b);
        free(data);
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
    }
    b->data = data;
    b->bytes = bytes;
    b->owned = 1;
    *buf = b;
    return FA_SUCCESS;
}

static fa_status ref_buffer_wrap(void *ctx, void *native, size_t bytes, void **buf) {
    ref_buffer *b = malloc(sizeof *b);
    if (!b) return fa_fail(FA_ERR_OUT_OF_MEMORY, "buffer allocation failed");
    b->data = native;
    b->bytes = bytes;
    b->owned = 0;
    *buf = b;
    return FA_SUCCESS;
}

static void ref_buffer_free(void *ctx, void *buf) {
    ref_buffer *b = buf;
    if (b->owned) free(b->data);
    free(b);
}

static fa_status ref_buffer_upload(void *ctx, void *buf, size_t offset, const void *src, size_t bytes) {
    memcpy(((ref_buffer *)buf)->data + offset, src, bytes);
    return FA_SUCCESS;
}

static fa_status ref_buffer_download(void *ctx, void *buf, size_t offset, void *dst, size_t bytes) {
    memcpy(dst, ((ref_buffer *)buf)->data + offset, bytes);
    return FA_SUCCESS;
}

static void *ref_buffer_native(void *ctx, void *buf) { return ((ref_buffer *)buf)->data; }

static fa_status ref_plan_prepare(void *ctx, const fa_plan_s *plan, void **plan_impl) {
    /* Unfused attention has no score options in the reference either. */
    if (plan->desc.algorithm == FA_ALGO_STANDARD) FA_CHECK(fa_refuse_score_options(&plan->desc, "reference (standard algorithm)"));
    ref_plan *p = calloc(1, sizeof *p);
    if (!p) return fa_fail(FA_ERR_OUT_OF_MEMORY, "plan allocation failed");
    *plan_impl = p;
    return FA_SUCCESS;
}

static void ref_plan_release(void *ctx, void *plan_impl) { free(plan_impl); }

static double seconds_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define DATA(h) (((ref_buffer *)(h))->data)

/* Read at every pass: the origin may be set after the plan was prepared. */
static fa_ref_dropout_origin origin_of(const fa_plan_s *plan) {
    const fa_ref_dropout_origin o = {plan->drop_row0, plan->drop_col0};
    return o;
}

static fa_status ref_forward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *a) {
    ref_plan *p = plan_impl;
    double t0 = seconds_now();
    const fa_ref_dropout_origin origin = origin_of(plan);
    fa_status st = plan->desc.algorithm == FA_ALGO_STANDARD
                       ? fa_ref_standard_forward_at(&plan->desc, origin, DATA(a->q), DATA(a->k), DATA(a->v),
                                                    DATA(a->o), (float *)(void *)DATA(a->lse))
                       : fa_ref_forward_at(&plan->desc, origin, a->bias ? DATA(a->bias) : NULL, DATA(a->q), DATA(a->k), DATA(a->v), DATA(a->o),
                                           (float *)(void *)DATA(a->lse));
    p->last_ms = 1e3 * (seconds_now() - t0);
    p->has_time = st == FA_SUCCESS;
    return st;
}

static fa_status ref_backward(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *a) {
    ref_plan *p = plan_impl;
    double t0 = seconds_now();
    fa_status st = fa_ref_backward_at(&plan->desc, origin_of(plan), a->bias ? DATA(a->bias) : NULL, DATA(a->q), DATA(a->k), DATA(a->v),
                                      DATA(a->o), (const float *)(const void *)DATA(a->lse), DATA(a->dout),
                                      DATA(a->dq), DATA(a->dk), DATA(a->dv));
    p->last_ms = 1e3 * (seconds_now() - t0);
    p->has_time = st == FA_SUCCESS;
    return st;
}

static fa_status ref_forward_kvcache(void *ctx, void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *a) {
    ref_plan *p = plan_impl;
    double t0 = seconds_now();
#define HOST_OR_NULL(h) ((h) ? (void *)DATA(h) : NULL)
    const fa_ref_kvcache_args r = {DATA(a->q),
                                   DATA(a->k_cache),
                                   DATA(a->v_cache),
                                   DATA(a->o),
                                   (float *)HOST_OR_NULL(a->lse),
                                   (const int32_t *)(void *)DATA(a->cache_seqlens),
                                   (const int32_t *)HOST_OR_NULL(a->block_table),
                                   HOST_OR_NULL(a->k_new),
                                   HOST_OR_NULL(a->v_new),
                                   (const float *)HOST_OR_NULL(a->rotary_cos),
                                   (const float *)HOST_OR_NULL(a->rotary_sin)};
#undef HOST_OR_NULL
    fa_status st = fa_ref_forward_kvcache(&plan->desc, &r);
    p->last_ms = 1e3 * (seconds_now() - t0);
    p->has_time = st == FA_SUCCESS;
    return st;
}

/* The views name backend handles; reference_rows.c takes host addresses. */
static fa_rows_view host_view(const fa_rows_view *v) {
    fa_rows_view h = *v;
    h.buf = v->buf ? DATA(v->buf) : NULL;
    return h;
}

static void locate(void *buf, uint64_t *address, size_t *bytes) {
    *address = (uint64_t)(uintptr_t)((ref_buffer *)buf)->data;
    *bytes = ((ref_buffer *)buf)->bytes;
}

/* The checks every backend makes (core/rows_launch.c), then host loops. */
static fa_status ref_rows(void *ctx, fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                          const fa_rows_view *src, float value) {
    fa_rows_launch launch;
    FA_CHECK(fa_rows_prepare(op, shape, dst, src, value, locate, &launch));
    if (!launch.blocks) return FA_SUCCESS;
    const fa_rows_view d = host_view(dst);
    const fa_rows_view s = op == FA_ROWS_FILL ? d : host_view(src);
    return fa_ref_rows(op, shape, &d, op == FA_ROWS_FILL ? NULL : &s, value);
}

static fa_status ref_rows_merge(void *ctx, const fa_rows_shape *shape, const fa_rows_view *acc_o,
                                const fa_rows_view *acc_l, const fa_rows_view *part_o, const fa_rows_view *part_l) {
    fa_rows_launch launch;
    FA_CHECK(fa_rows_merge_prepare(shape, acc_o, acc_l, part_o, part_l, locate, &launch));
    if (!launch.blocks) return FA_SUCCESS;
    const fa_rows_view ao = host_view(acc_o), al = host_view(acc_l), po = host_view(part_o), pl = host_view(part_l);
    return fa_ref_rows_merge(shape, &ao, &al, &po, &pl);
}

static fa_status ref_last_time_ms(void *ctx, void *plan_impl, double *ms) {
    ref_plan *p = plan_impl;
    if (!p->has_time) return fa_fail(FA_ERR_UNSUPPORTED, "no pass has run on this plan");
    *ms = p->last_ms;
    return FA_SUCCESS;
}

const fa_backend_ops fa_reference_backend = {
    .id = FA_BACKEND_REFERENCE,
    .name = "reference",
    .init = ref_init,
    .device_count = ref_device_count,
    .device_info = ref_device_info,
    .context_create = ref_context_create,
    .context_destroy = ref_context_destroy,
    .context_synchronize = ref_context_synchronize,
    .context_native = ref_context_native,
    .buffer_alloc = ref_buffer_alloc,
    .buffer_wrap = ref_buffer_wrap,
    .buffer_free = ref_buffer_free,
    .buffer_upload = ref_buffer_upload,
    .buffer_download = ref_buffer_download,
    .buffer_native = ref_buffer_native,
    .plan_prepare = ref_plan_prepare,
    .plan_release = ref_plan_release,
    .forward = ref_forward,
    .backward = ref_backward,
    .forward_kvcache = ref_forward_kvcache,
    .rows = ref_rows,
    .rows_merge = ref_rows_merge,
    .last_time_ms = ref_last_time_ms,
};
