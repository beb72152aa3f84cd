/* Checks, parameter block and grid of the ring's element-wise passes on the
 * GPU backends (rows_launch.h). */
#include "rows_launch.h"

#include "checked.h"
#include "fa_internal.h"

#include <string.h>

static fa_status check_shape(const fa_rows_shape *shape, int64_t *lines) {
    if (!shape) return fa_fail(FA_ERR_NULL_POINTER, "shape is NULL");
    if (shape->batch < 0 || shape->rows < 0 || shape->heads < 0 || shape->dim < 0)
        return fa_fail(FA_ERR_INVALID_SIZE, "shape %d x %d x %d x %d has a negative extent", shape->batch,
                       shape->rows, shape->heads, shape->dim);
    if (fa_ckd_mul_i64(lines, shape->batch, shape->rows) || fa_ckd_mul_i64(lines, *lines, shape->heads))
        return fa_fail(FA_ERR_INVALID_SIZE, "shape %d x %d x %d: more lines than 64 bits count", shape->batch,
                       shape->rows, shape->heads);
    return FA_SUCCESS;
}

/* The view in its slot, once it is known to lie within its buffer, aligned,
 * over shape with dim elements a line. */
static fa_status place_view(const char *name, const fa_rows_view *v, const fa_rows_shape *shape, int dim,
                            fa_rows_locate_fn locate, int slot, fa_rows_params *p) {
    if (!v) return fa_fail(FA_ERR_NULL_POINTER, "%s is NULL", name);
    if (!v->buf) return fa_fail(FA_ERR_NULL_POINTER, "%s->buf is NULL", name);
    const size_t esize = fa_dtype_size(v->dtype);
    if (esize == 0) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s->dtype = %d is not a fa_dtype", name, (int)v->dtype);
    if (v->offset < 0 || v->stride_batch < 0 || v->stride_seq < 0 || v->stride_head < 0)
        return fa_fail(FA_ERR_BAD_STRIDE, "%s: offset %lld and strides %lld, %lld, %lld must not be negative", name,
                       (long long)v->offset, (long long)v->stride_batch, (long long)v->stride_seq,
                       (long long)v->stride_head);
    uint64_t address = 0;
    size_t bytes = 0;
    locate(v->buf, &address, &bytes);
    if (address % esize)
        return fa_fail(FA_ERR_MISALIGNED, "%s: device address 0x%llx is not aligned to its %zu-byte elements", name,
                       (unsigned long long)address, esize);
    /* The last element's index: every extent is at least 1 here. */
    int64_t last = v->offset, step;
    const int64_t extents[4][2] = {{shape->batch, v->stride_batch},
                                   {shape->rows, v->stride_seq},
                                   {shape->heads, v->stride_head},
                                   {dim, 1}};
    for (int i = 0; i < 4; i++)
        if (fa_ckd_mul_i64(&step, extents[i][0] - 1, extents[i][1]) || fa_ckd_add_i64(&last, last, step))
            return fa_fail(FA_ERR_INVALID_SIZE, "%s: its last element's index exceeds 64 bits", name);
    size_t end;
    if (fa_ckd_size_of_i64(&end, last) || fa_ckd_add_size(&end, end, 1) || fa_ckd_mul_size(&end, end, esize) ||
        end > bytes)
        return fa_fail(FA_ERR_OUT_OF_BOUNDS, "%s: element %lld of %s lies past the end of its %zu-byte buffer", name,
                       (long long)last, fa_dtype_name(v->dtype), bytes);
    p->ptr[slot] = address;
    p->off[slot] = v->offset;
    p->sb[slot] = v->stride_batch;
    p->ss[slot] = v->stride_seq;
    p->sh[slot] = v->stride_head;
    p->dtype[slot] = (int32_t)v->dtype;
    return FA_SUCCESS;
}

static fa_status require_f32(const char *name, const fa_rows_view *v) {
    if (v->dtype != FA_DTYPE_F32)
        return fa_fail(FA_ERR_DTYPE_MISMATCH, "%s is %s: the merge keeps it in fp32", name, fa_dtype_name(v->dtype));
    return FA_SUCCESS;
}

/* The grid over lines of shape->dim elements. */
static void size_grid(const fa_rows_shape *shape, int64_t lines, fa_rows_launch *out) {
    int lanes = 1;
    while (lanes < shape->dim && lanes < FA_ROWS_MAX_LANES) lanes *= 2;
    const int64_t per_block = FA_ROWS_THREADS / lanes;
    const int64_t blocks = shape->dim == 0 ? 0 : (lines + per_block - 1) / per_block;
    out->params.lines = lines;
    out->params.rows = shape->rows;
    out->params.heads = shape->heads;
    out->params.dim = shape->dim;
    out->params.lanes = lanes;
    out->threads = FA_ROWS_THREADS;
    out->blocks = blocks > (int64_t)FA_ROWS_MAX_BLOCKS ? FA_ROWS_MAX_BLOCKS : (unsigned)blocks;
}

static fa_status start(const fa_rows_shape *shape, fa_rows_locate_fn locate, fa_rows_launch *out, int64_t *lines) {
    if (!out) return fa_fail(FA_ERR_NULL_POINTER, "out is NULL");
    memset(out, 0, sizeof *out);
    if (!locate) return fa_fail(FA_ERR_NULL_POINTER, "locate is NULL");
    return check_shape(shape, lines);
}

static int empty(const fa_rows_shape *shape, int64_t lines) { return lines == 0 || shape->dim == 0; }

fa_status fa_rows_prepare(fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                          const fa_rows_view *src, float value, fa_rows_locate_fn locate, fa_rows_launch *out) {
    int64_t lines = 0;
    FA_CHECK(start(shape, locate, out, &lines));
    if (op != FA_ROWS_COPY && op != FA_ROWS_ADD && op != FA_ROWS_FILL)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "op = %d is not a fa_rows_op", (int)op);
    if (empty(shape, lines)) return FA_SUCCESS;
    fa_rows_params *p = &out->params;
    FA_CHECK(place_view("dst", dst, shape, shape->dim, locate, FA_ROWS_DST, p));
    if (op != FA_ROWS_FILL) FA_CHECK(place_view("src", src, shape, shape->dim, locate, FA_ROWS_SRC, p));
    p->op = (int32_t)op;
    p->value = op == FA_ROWS_FILL ? value : 0.0f;
    size_grid(shape, lines, out);
    return FA_SUCCESS;
}

fa_status fa_rows_merge_prepare(const fa_rows_shape *shape, const fa_rows_view *acc_o, const fa_rows_view *acc_l,
                                const fa_rows_view *part_o, const fa_rows_view *part_l, fa_rows_locate_fn locate,
                                fa_rows_launch *out) {
    int64_t lines = 0;
    FA_CHECK(start(shape, locate, out, &lines));
    if (empty(shape, lines)) return FA_SUCCESS;
    fa_rows_params *p = &out->params;
    FA_CHECK(place_view("acc_o", acc_o, shape, shape->dim, locate, FA_ROWS_ACC_O, p));
    FA_CHECK(place_view("part_o", part_o, shape, shape->dim, locate, FA_ROWS_PART_O, p));
    FA_CHECK(place_view("acc_l", acc_l, shape, 1, locate, FA_ROWS_ACC_L, p));
    FA_CHECK(place_view("part_l", part_l, shape, 1, locate, FA_ROWS_PART_L, p));
    FA_CHECK(require_f32("acc_o", acc_o));
    FA_CHECK(require_f32("acc_l", acc_l));
    FA_CHECK(require_f32("part_l", part_l));
    size_grid(shape, lines, out);
    return FA_SUCCESS;
}
