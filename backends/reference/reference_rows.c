/* The ring's element-wise passes on host memory. Arithmetic is fp32, as the
 * backends' kernels do it (core/backend.h), not the fp64 of the attention
 * reference: the ring's results must equal a device's bit for bit where
 * the operations allow it, and fp64 sums would round differently. */
#include "reference_rows.h"

#include "dtype.h"
#include "fa_internal.h"

#include <math.h>
#include <stdint.h>

/* Index of element (b, r, h, 0) of a view. */
static int64_t line_start(const fa_rows_view *v, int b, int r, int h) {
    return v->offset + b * v->stride_batch + r * v->stride_seq + h * v->stride_head;
}

static float load(const fa_rows_view *v, int64_t i) {
    const unsigned char *base = v->buf;
    switch (v->dtype) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)(const void *)base)[i]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)(const void *)base)[i]);
    default: return ((const float *)(const void *)base)[i];
    }
}

static void store(const fa_rows_view *v, int64_t i, float x) {
    unsigned char *base = v->buf;
    switch (v->dtype) {
    case FA_DTYPE_F16: ((uint16_t *)(void *)base)[i] = fa_f32_to_f16(x); break;
    case FA_DTYPE_BF16: ((uint16_t *)(void *)base)[i] = fa_f32_to_bf16(x); break;
    default: ((float *)(void *)base)[i] = x; break;
    }
}

fa_status fa_ref_rows(fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst, const fa_rows_view *src,
                      float value) {
    for (int b = 0; b < shape->batch; b++)
        for (int r = 0; r < shape->rows; r++)
            for (int h = 0; h < shape->heads; h++) {
                const int64_t d0 = line_start(dst, b, r, h);
                const int64_t s0 = op == FA_ROWS_FILL ? 0 : line_start(src, b, r, h);
                for (int x = 0; x < shape->dim; x++) {
                    float v = value;
                    if (op == FA_ROWS_COPY) v = load(src, s0 + x);
                    if (op == FA_ROWS_ADD) v = load(dst, d0 + x) + load(src, s0 + x);
                    store(dst, d0 + x, v);
                }
            }
    return FA_SUCCESS;
}

/* How one (batch, row, head) folds its part in. NaN is looked at first, so
 * that a NaN in either L makes the whole row NaN whatever the other L is
 * (-inf included): the blend's NaN weights do it. */
typedef enum merge_kind { MERGE_KEEP, MERGE_TAKE, MERGE_BLEND } merge_kind;

typedef struct merge_fold {
    merge_kind kind;
    float weight_acc, weight_part, l;
} merge_fold;

static merge_fold fold_of(float la, float lp) {
    merge_fold f = {MERGE_BLEND, NAN, NAN, NAN};
    if (isnan(la) || isnan(lp)) return f;
    if (lp == -INFINITY) {
        f.kind = MERGE_KEEP;
    } else if (la == -INFINITY) {
        f.kind = MERGE_TAKE;
        f.l = lp;
    } else {
        const float m = la > lp ? la : lp;
        f.l = m + log1pf(expf(-fabsf(la - lp)));
        f.weight_acc = expf(la - f.l);
        f.weight_part = expf(lp - f.l);
    }
    return f;
}

fa_status fa_ref_rows_merge(const fa_rows_shape *shape, const fa_rows_view *acc_o, const fa_rows_view *acc_l,
                            const fa_rows_view *part_o, const fa_rows_view *part_l) {
    for (int b = 0; b < shape->batch; b++)
        for (int r = 0; r < shape->rows; r++)
            for (int h = 0; h < shape->heads; h++) {
                const int64_t la_at = line_start(acc_l, b, r, h);
                const merge_fold f = fold_of(load(acc_l, la_at), load(part_l, line_start(part_l, b, r, h)));
                if (f.kind == MERGE_KEEP) continue;
                const int64_t a0 = line_start(acc_o, b, r, h), p0 = line_start(part_o, b, r, h);
                for (int x = 0; x < shape->dim; x++) {
                    const float p = load(part_o, p0 + x);
                    store(acc_o, a0 + x,
                          f.kind == MERGE_TAKE ? p : load(acc_o, a0 + x) * f.weight_acc + p * f.weight_part);
                }
                store(acc_l, la_at, f.l);
            }
    return FA_SUCCESS;
}
