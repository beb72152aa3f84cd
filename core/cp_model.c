/* The ring's cost model. Every rank runs the same schedule: at step s it
 * attends its queries to the K/V chunk of rank (r - s) mod W while that
 * chunk moves on to rank r + 1 and the next one arrives; backward, dK and
 * dV of the chunk follow it one step behind, in fp32, and go home to
 * their owner after the last step. A step lasts as long as the slower of
 * the busiest rank's attention and the transfer.
 *
 * Each step's attention is a chunk-pair problem the planner already
 * costs (its roofline), so the ring inherits the IO model's view of the
 * device: tile shapes, waves, memory-bound passes. Under a causal mask a
 * rank's step s >= 1 depends only on whether the visiting chunk comes from
 * an earlier rank (src < r) or a later one:
 * - contiguous: an earlier chunk is wholly visible, a later one wholly
 *   hidden, so the last rank works every step and the first only once;
 * - zigzag (rank r holds chunks r and 2W-1-r of 2W): an earlier rank's
 *   first chunk is visible to all local queries and its second to none
 *   (L x L/2); a later rank's K/V are visible only to the local second
 *   chunk (L/2 x L). Both are half a full pair, as is the causal diagonal
 *   of step 0, which is ring-flash-attn's zigzag balance. */
#include "cp_model.h"

#include "desc.h"
#include "fa_internal.h"
#include "planner.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Nominal rates each direction, as the other figures of the planner are
 * vendors' peaks; sustained transfers reach about 80-90% of them, which
 * the latency term does not cover.
 * - NVLink 4 (H100 SXM): 18 links of 25 GB/s each direction, 450 GB/s
 *   (NVIDIA's "900 GB/s" counts both directions); a small NCCL send/recv
 *   between GPUs of one NVSwitch node costs about 2 us.
 * - PCIe 5.0 x16: 32 GT/s on 16 lanes with 128b/130b encoding, 63 GB/s
 *   each direction before packet headers (about 52-56 GB/s of data with
 *   256-byte payloads); GPU-to-GPU through the root complex or a switch,
 *   about 5 us for a small NCCL transfer.
 * - InfiniBand NDR, 400 Gb/s a port: 50 GB/s each direction; with
 *   GPUDirect RDMA a small transfer between nodes costs about 3 us (about
 *   1 us of it the adapters and a switch hop, the rest NCCL's protocol). */
static const fa_cp_link named_links[] = {
    {"NVLink 4", 450.0, 2.0},
    {"PCIe 5 x16", 63.0, 5.0},
    {"InfiniBand 400G", 50.0, 3.0},
};

int fa_cp_named_link_count(void) { return (int)FA_ARRAY_SIZE(named_links); }

const fa_cp_link *fa_cp_named_link(int index) {
    return index >= 0 && index < fa_cp_named_link_count() ? &named_links[index] : NULL;
}

double fa_cp_default_latency_us(double gbs) {
    const fa_cp_link *best = &named_links[0];
    for (int i = 1; i < fa_cp_named_link_count(); i++)
        if (fabs(log(gbs / named_links[i].gbs)) < fabs(log(gbs / best->gbs))) best = &named_links[i];
    return best->latency_us;
}

static const char *layout_name(fa_cp_layout layout) { return layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous"; }

fa_status fa_cp_check(const fa_attention_desc *desc, fa_cp_layout layout, int world) {
    if (!desc) return fa_fail(FA_ERR_NULL_POINTER, "desc is NULL");
    if (world < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "world = %d: a ring needs at least one rank", world);
    if (layout != FA_CP_CONTIGUOUS && layout != FA_CP_ZIGZAG)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "layout = %d is not a fa_cp_layout", (int)layout);
    FA_CHECK(fa_attention_desc_check(desc));
    if (desc->cu_seqlens_q || desc->cu_seqlens_k)
        return fa_fail(FA_ERR_UNSUPPORTED, "cu_seqlens: the ring model takes fixed-length batches");
    if (desc->dropout_p > 0)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "dropout_p = %g: the ring model does not cost dropout yet (the ring cuts every step into "
                       "single query x key chunk pieces then, which the model's pairs do not follow)",
                       (double)desc->dropout_p);
    const char *option = fa_desc_option_in_use(desc);
    if (option) return fa_fail(FA_ERR_UNSUPPORTED, "%s: the ring runs without the score options", option);
    fa_attention_desc normalized = *desc;
    fa_desc_normalize_windows(&normalized);
    if (fa_desc_has_window(&normalized))
        return fa_fail(FA_ERR_UNSUPPORTED, "window (%d, %d): the ring model follows no window, only the causal mask",
                       desc->window_left, desc->window_right);
    if (desc->block_mask)
        return fa_fail(FA_ERR_UNSUPPORTED, "block_mask: the ring model follows no block mask, only the causal mask");
    const int64_t parts = layout == FA_CP_ZIGZAG ? 2 * (int64_t)world : world;
    if (desc->seqlen_q % parts || desc->seqlen_k % parts)
        return fa_fail(FA_ERR_INVALID_SIZE, "%s = %d is not a multiple of %lld (the %s layout over %d ranks)",
                       desc->seqlen_q % parts ? "seqlen_q" : "seqlen_k",
                       desc->seqlen_q % parts ? desc->seqlen_q : desc->seqlen_k, (long long)parts,
                       layout_name(layout), world);
    /* The causal mask is bottom-right aligned: only equal lengths put each
     * rank's diagonal on its own chunks, which both layouts count on. */
    if (desc->causal && desc->seqlen_q != desc->seqlen_k)
        return fa_fail(FA_ERR_UNSUPPORTED, "causal with seqlen_q = %d and seqlen_k = %d: the ring model takes "
                       "equal lengths under a causal mask", desc->seqlen_q, desc->seqlen_k);
    return FA_SUCCESS;
}

static fa_status check_link(const fa_cp_link *link) {
    if (!link) return fa_fail(FA_ERR_NULL_POINTER, "link is NULL");
    if (!isfinite(link->gbs) || link->gbs <= 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "link bandwidth = %g GB/s: must be finite and > 0", link->gbs);
    if (!isfinite(link->latency_us) || link->latency_us < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "link latency = %g us: must be finite and >= 0", link->latency_us);
    return FA_SUCCESS;
}

/* One chunk pair's cost, both passes; zero for a pair a rank skips. */
typedef struct pair_cost {
    double ms[2];
    double flops[2];
} pair_cost;

/* The whole problem's tensor layouts describe the caller's buffers, not
 * the work: chunk pairs and the single-device baseline are costed packed. */
static fa_attention_desc packed(const fa_attention_desc *desc, int64_t rows, int64_t keys, int causal) {
    fa_attention_desc d = *desc;
    d.seqlen_q = (int)rows;
    d.seqlen_k = (int)keys;
    d.causal = causal;
    fa_tensor_desc *tensors[] = {&d.q, &d.k, &d.v, &d.o};
    for (size_t i = 0; i < FA_ARRAY_SIZE(tensors); i++) {
        const fa_dtype dtype = tensors[i]->dtype;
        memset(tensors[i], 0, sizeof *tensors[i]);
        tensors[i]->dtype = dtype;
    }
    return d;
}

static fa_status pair(const fa_device_desc *dev, const fa_attention_desc *whole, int64_t rows, int64_t keys,
                      int causal, pair_cost *out) {
    memset(out, 0, sizeof *out);
    const fa_attention_desc d = packed(whole, rows, keys, causal);
    fa_plan_info info;
    FA_CHECK(fa_plan_for_device(dev, &d, &info));
    out->ms[FA_PASS_FORWARD] = info.forward.cost.roofline_ms;
    out->ms[FA_PASS_BACKWARD] = info.backward.cost.roofline_ms;
    out->flops[FA_PASS_FORWARD] = info.forward.cost.flops;
    out->flops[FA_PASS_BACKWARD] = info.backward.cost.flops;
    return FA_SUCCESS;
}

/* What a rank computes at step 0 and at a later step, by whether the
 * visiting chunk comes from an earlier rank or a later one. */
typedef struct ring_work {
    pair_cost diagonal, from_earlier, from_later;
} ring_work;

static fa_status ring_work_of(const fa_device_desc *dev, const fa_attention_desc *whole, fa_cp_layout layout,
                              int world, int64_t local_q, int64_t local_k, ring_work *w) {
    memset(w, 0, sizeof *w);
    FA_CHECK(pair(dev, whole, local_q, local_k, whole->causal, &w->diagonal));
    if (world == 1) return FA_SUCCESS;
    if (!whole->causal) {
        FA_CHECK(pair(dev, whole, local_q, local_k, 0, &w->from_earlier));
        w->from_later = w->from_earlier;
    } else if (layout == FA_CP_CONTIGUOUS) {
        FA_CHECK(pair(dev, whole, local_q, local_k, 0, &w->from_earlier));
    } else {
        FA_CHECK(pair(dev, whole, local_q, local_k / 2, 0, &w->from_earlier));
        FA_CHECK(pair(dev, whole, local_q / 2, local_k, 0, &w->from_later));
    }
    return FA_SUCCESS;
}

static double transfer_ms(const fa_cp_link *link, double bytes) {
    return bytes > 0 ? link->latency_us * 1e-3 + bytes / (link->gbs * 1e9) * 1e3 : 0.0;
}

static void set_step(fa_cp_step *step, int count, double compute_ms, double flops_max, double flops_min,
                     double bytes, const fa_cp_link *link) {
    step->count = count;
    step->compute_ms = compute_ms;
    step->flops_max = flops_max;
    step->flops_min = flops_min;
    step->send_bytes = bytes;
    step->transfer_ms = transfer_ms(link, bytes);
    step->step_ms = fmax(step->compute_ms, step->transfer_ms);
}

/* One pass's steps, tail, total and imbalance for a rank's local lengths. */
static void ring_pass(const fa_attention_desc *whole, int world, const fa_cp_link *link, int64_t local_k,
                      const ring_work *w, fa_pass pass, fa_cp_pass *out) {
    memset(out, 0, sizeof *out);
    const double per_tensor = (double)whole->batch * (double)local_k * whole->heads_kv * whole->head_dim;
    const double kv_bytes = 2.0 * per_tensor * (double)fa_dtype_size(whole->k.dtype);
    const double grad_bytes = pass == FA_PASS_BACKWARD ? 2.0 * per_tensor * 4.0 : 0.0;
    const int ring = world > 1;

    const double earlier_ms = w->from_earlier.ms[pass], later_ms = w->from_later.ms[pass];
    const double earlier_flops = w->from_earlier.flops[pass], later_flops = w->from_later.flops[pass];
    const double later_step_ms = fmax(earlier_ms, later_ms);
    const double flops_max = fmax(earlier_flops, later_flops), flops_min = fmin(earlier_flops, later_flops);

    set_step(&out->steps[FA_CP_STEP_FIRST], 1, w->diagonal.ms[pass], w->diagonal.flops[pass],
             w->diagonal.flops[pass], ring ? kv_bytes : 0.0, link);
    set_step(&out->steps[FA_CP_STEP_MIDDLE], world > 2 ? world - 2 : 0, later_step_ms, flops_max, flops_min,
             world > 2 ? kv_bytes + grad_bytes : 0.0, link);
    set_step(&out->steps[FA_CP_STEP_LAST], ring, ring ? later_step_ms : 0.0, ring ? flops_max : 0.0,
             ring ? flops_min : 0.0, ring ? grad_bytes : 0.0, link);
    out->tail_bytes = ring ? grad_bytes : 0.0;
    out->tail_ms = transfer_ms(link, out->tail_bytes);

    out->total_ms = out->tail_ms;
    for (int k = 0; k < FA_CP_STEP_KINDS; k++) out->total_ms += out->steps[k].count * out->steps[k].step_ms;
    /* Rank r meets r chunks of earlier ranks and W-1-r of later ones: its
     * work grows or shrinks linearly in r, so the busiest rank is the
     * first or the last and the mean rank sits in the middle. Counted in
     * useful FLOPs, not time: two pairs of equal work may get tiles of
     * unequal efficiency, which the step times already show. */
    const double diagonal = w->diagonal.flops[pass];
    const double busiest = diagonal + (world - 1) * flops_max;
    const double mean = diagonal + 0.5 * (world - 1) * (earlier_flops + later_flops);
    out->imbalance = mean > 0 ? busiest / mean : 1.0;
}

static int pass_hides(const fa_cp_pass *p) {
    for (int k = 0; k < FA_CP_STEP_KINDS; k++)
        if (p->steps[k].count > 0 && p->steps[k].compute_ms < p->steps[k].transfer_ms) return 0;
    return 1;
}

/* Query rows that go with local_k keys in the problem's proportion, even
 * so that the zigzag's halves stay whole. */
static int64_t rows_for_keys(const fa_attention_desc *whole, int64_t local_k) {
    const int64_t rows = 2 * (int64_t)llround((double)local_k * whole->seqlen_q / whole->seqlen_k / 2.0);
    return rows > 2 ? rows : 2;
}

static fa_status hides_at(const fa_device_desc *dev, const fa_attention_desc *whole, fa_cp_layout layout,
                          int world, const fa_cp_link *link, int64_t local_k, fa_pass pass, int *hides) {
    ring_work w;
    FA_CHECK(ring_work_of(dev, whole, layout, world, rows_for_keys(whole, local_k), local_k, &w));
    fa_cp_pass p;
    ring_pass(whole, world, link, local_k, &w, pass, &p);
    *hides = pass_hides(&p);
    return FA_SUCCESS;
}

/* Compute grows as the square of the local length and a transfer as the
 * length: doubling finds the first power of two that hides, bisection the
 * smallest multiple of FA_CP_LENGTH_QUANTUM below it that still does. */
static fa_status hiding_length(const fa_device_desc *dev, const fa_attention_desc *whole, fa_cp_layout layout,
                               int world, const fa_cp_link *link, fa_pass pass, int64_t *out) {
    *out = 0;
    if (world == 1) return FA_SUCCESS;
    int64_t fails = 0, hides_len = FA_CP_LENGTH_QUANTUM;
    for (;;) {
        int hides = 0;
        FA_CHECK(hides_at(dev, whole, layout, world, link, hides_len, pass, &hides));
        if (hides) break;
        if (hides_len >= FA_CP_LONGEST_SEARCHED) {
            *out = -1;
            return FA_SUCCESS;
        }
        fails = hides_len;
        hides_len *= 2;
    }
    while (hides_len - fails > FA_CP_LENGTH_QUANTUM) {
        const int64_t mid = fails + (hides_len - fails) / (2 * FA_CP_LENGTH_QUANTUM) * FA_CP_LENGTH_QUANTUM;
        int hides = 0;
        FA_CHECK(hides_at(dev, whole, layout, world, link, mid, pass, &hides));
        if (hides) hides_len = mid;
        else fails = mid;
    }
    *out = hides_len;
    return FA_SUCCESS;
}

fa_status fa_cp_predict(const fa_device_desc *device, const fa_attention_desc *desc, fa_cp_layout layout,
                        int world, const fa_cp_link *link, fa_cp_prediction *out) {
    if (!device) return fa_fail(FA_ERR_NULL_POINTER, "device is NULL");
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "out is NULL");
    memset(out, 0, sizeof *out);
    FA_CHECK(fa_cp_check(desc, layout, world));
    FA_CHECK(check_link(link));
    out->layout = layout;
    out->world = world;
    out->link = *link;
    out->causal = desc->causal;
    out->local_q = desc->seqlen_q / world;
    out->local_k = desc->seqlen_k / world;

    ring_work w;
    FA_CHECK(ring_work_of(device, desc, layout, world, out->local_q, out->local_k, &w));
    pair_cost single;
    FA_CHECK(pair(device, desc, desc->seqlen_q, desc->seqlen_k, desc->causal, &single));
    fa_cp_pass *passes[2] = {&out->forward, &out->backward};
    for (int p = 0; p < 2; p++) {
        fa_cp_pass *pass = passes[p];
        ring_pass(desc, world, link, out->local_k, &w, (fa_pass)p, pass);
        pass->single_ms = single.ms[p];
        pass->ideal_ms = single.ms[p] / world;
        pass->efficiency = pass->total_ms > 0 ? pass->ideal_ms / pass->total_ms : 1.0;
        FA_CHECK(hiding_length(device, desc, layout, world, link, (fa_pass)p, &pass->hiding_len));
    }
    const int64_t f = out->forward.hiding_len, b = out->backward.hiding_len;
    out->hiding_len = f < 0 || b < 0 ? -1 : (f > b ? f : b);
    fa_clear_error();
    return FA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* The table                                                                */
/* ------------------------------------------------------------------------ */

typedef struct text {
    char *out;
    size_t size, len;
} text;

static void put(text *t, const char *fmt, ...) FA_PRINTF(2, 3);
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = t->len < t->size ? vsnprintf(t->out + t->len, t->size - t->len, fmt, ap)
                                   : vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n;
}

static void put_step(text *t, const char *pass, const char *label, const fa_cp_step *s) {
    char work[32];
    if (s->flops_max <= 0 || s->flops_min == s->flops_max) snprintf(work, sizeof work, "equal");
    else snprintf(work, sizeof work, "%.0f-100%%", 100.0 * s->flops_min / s->flops_max);
    put(t, "  %-9s %-12s %11.4f  %-9s", pass, label, s->compute_ms, work);
    if (s->send_bytes > 0) put(t, " %9.2f %11.4f", s->send_bytes / 1e6, s->transfer_ms);
    else put(t, " %9s %11s", "-", "-");
    put(t, " %10.4f%s\n", s->step_ms, s->transfer_ms > s->compute_ms ? "  exposed" : "");
}

static void put_pass(text *t, const char *name, const fa_cp_prediction *p, const fa_cp_pass *pass) {
    char label[3][32];
    snprintf(label[FA_CP_STEP_FIRST], sizeof label[0], p->world == 1 ? "0 only" : p->causal ? "0 diagonal" : "0");
    if (pass->steps[FA_CP_STEP_MIDDLE].count == 1) snprintf(label[FA_CP_STEP_MIDDLE], sizeof label[0], "1");
    else snprintf(label[FA_CP_STEP_MIDDLE], sizeof label[0], "1..%d", p->world - 2);
    snprintf(label[FA_CP_STEP_LAST], sizeof label[0], "%d last", p->world - 1);
    const char *shown = name;
    for (int k = 0; k < FA_CP_STEP_KINDS; k++) {
        if (pass->steps[k].count == 0) continue;
        put_step(t, shown, label[k], &pass->steps[k]);
        shown = "";
    }
    if (pass->tail_ms > 0)
        put(t, "  %-9s %-12s %11s  %-9s %9.2f %11.4f %10.4f  exposed\n", "", "dK, dV home", "-", "",
            pass->tail_bytes / 1e6, pass->tail_ms, pass->tail_ms);
    put(t, "  %-9s total %.4f ms against %.4f ms for 1/%d of the work on one device: efficiency %.0f%%\n", "",
        pass->total_ms, pass->ideal_ms, p->world, 100.0 * pass->efficiency);
}

/* Both passes' FLOPs are the same multiples of the score cells, so one
 * figure speaks for both. */
static void put_balance(text *t, const fa_cp_prediction *p) {
    if (p->forward.imbalance <= 1.0 + 1e-9) put(t, "  every rank does the same work\n");
    else put(t, "  the busiest rank does %.2fx the mean rank's work\n", p->forward.imbalance);
}

static void put_hiding(text *t, const fa_cp_prediction *p) {
    if (p->world == 1) {
        put(t, "  nothing travels on one rank\n");
        return;
    }
    char f[32], b[32];
    snprintf(f, sizeof f, p->forward.hiding_len < 0 ? "none" : "%lld", (long long)p->forward.hiding_len);
    snprintf(b, sizeof b, p->backward.hiding_len < 0 ? "none" : "%lld", (long long)p->backward.hiding_len);
    if (p->hiding_len < 0)
        put(t, "  transfers do not hide on every step below %lld tokens a rank (forward %s, backward %s)\n",
            (long long)FA_CP_LONGEST_SEARCHED, f, b);
    else
        put(t, "  transfers hide on every step from %lld tokens a rank (forward %s, backward %s; multiples of %d)\n",
            (long long)p->hiding_len, f, b, FA_CP_LENGTH_QUANTUM);
}

size_t fa_cp_prediction_format(const fa_cp_prediction *p, char *out, size_t out_size) {
    text t = {out, out_size, 0};
    if (out_size) out[0] = '\0';
    if (!p) return 0;
    put(&t, "ring over %d rank%s (%s layout), %s: %g GB/s a direction, %g us a transfer\n", p->world,
        p->world == 1 ? "" : "s", layout_name(p->layout), p->link.name ? p->link.name : "link", p->link.gbs,
        p->link.latency_us);
    put(&t, "  %lld queries and %lld keys a rank\n", (long long)p->local_q, (long long)p->local_k);
    put(&t, "  %-9s %-12s %11s  %-9s %9s %11s %10s\n", "pass", "step", "compute ms", "rank work", "sends MB",
        "transfer ms", "step ms");
    put_pass(&t, "forward", p, &p->forward);
    put_pass(&t, "backward", p, &p->backward);
    put_balance(&t, p);
    put_hiding(&t, p);
    return t.len;
}
