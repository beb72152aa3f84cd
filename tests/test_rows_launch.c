/* The launch of the ring's element-wise passes as core/rows_launch.c lays
 * it out for the CUDA and HIP kernels, on buffers that exist only as
 * addresses and sizes: the grid for lines of every width, the parameter
 * block's slots, and every refusal (each naming the view) before a kernel
 * could run past a buffer. */
#include "harness.h"

#include "fa_internal.h"
#include "rows_launch.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

/* A buffer as the kernels would see it. */
typedef struct fake_buffer {
    uint64_t address;
    size_t bytes;
} fake_buffer;

static void locate(void *buf, uint64_t *address, size_t *bytes) {
    const fake_buffer *b = buf;
    *address = b->address;
    *bytes = b->bytes;
}

/* A packed [batch, rows, heads, dim] view of the whole buffer. */
static fa_rows_view packed(fake_buffer *buf, fa_dtype dtype, const fa_rows_shape *sh, int64_t offset) {
    fa_rows_view v;
    v.buf = buf;
    v.dtype = dtype;
    v.offset = offset;
    v.stride_head = sh->dim;
    v.stride_seq = (int64_t)sh->heads * sh->dim;
    v.stride_batch = (int64_t)sh->rows * v.stride_seq;
    return v;
}

static size_t elems_of(const fa_rows_shape *sh) { return (size_t)sh->batch * sh->rows * sh->heads * sh->dim; }

FA_TEST(grid_for_every_line_width) {
    static const struct {
        int dim, lanes;
    } widths[] = {{1, 1}, {2, 2}, {3, 4}, {8, 8}, {33, 32}, {64, 32}, {72, 32}, {256, 32}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(widths); i++) {
        const fa_rows_shape sh = {2, 37, 3, widths[i].dim};
        fake_buffer dst = {0x10000, elems_of(&sh) * 4}, src = {0x20000, elems_of(&sh) * 2};
        const fa_rows_view dv = packed(&dst, FA_DTYPE_F32, &sh, 0), sv = packed(&src, FA_DTYPE_BF16, &sh, 0);
        fa_rows_launch l;
        CHECK_OK(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, &sv, 0.0f, locate, &l));
        const int64_t lines = 2 * 37 * 3, per_block = FA_ROWS_THREADS / widths[i].lanes;
        CHECK_MSG(l.params.lanes == widths[i].lanes, "dim %d: %d lanes", widths[i].dim, l.params.lanes);
        CHECK(l.params.lines == lines && l.threads == FA_ROWS_THREADS);
        CHECK_MSG(l.blocks == (unsigned)((lines + per_block - 1) / per_block), "dim %d: %u blocks", widths[i].dim,
                  l.blocks);
    }
    /* Lines beyond what the grid holds: the blocks go round. */
    const fa_rows_shape many = {64, 1 << 20, 16, 1};
    fake_buffer huge = {0x100000, (size_t)1 << 40};
    const fa_rows_view hv = packed(&huge, FA_DTYPE_F32, &many, 0);
    fa_rows_launch l;
    CHECK_OK(fa_rows_prepare(FA_ROWS_FILL, &many, &hv, NULL, 2.0f, locate, &l));
    CHECK(l.blocks == FA_ROWS_MAX_BLOCKS && l.params.lines == (int64_t)64 * (1 << 20) * 16);
    /* Empty shapes launch nothing, whatever the views. */
    const fa_rows_shape empty[] = {{0, 5, 5, 5}, {5, 0, 5, 5}, {5, 5, 0, 5}, {5, 5, 5, 0}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(empty); i++) {
        CHECK_OK(fa_rows_prepare(FA_ROWS_COPY, &empty[i], NULL, NULL, 0.0f, locate, &l));
        CHECK(l.blocks == 0);
        CHECK_OK(fa_rows_merge_prepare(&empty[i], NULL, NULL, NULL, NULL, locate, &l));
        CHECK(l.blocks == 0);
    }
}

FA_TEST(parameter_block_slots) {
    const fa_rows_shape sh = {2, 5, 3, 16};
    fake_buffer dst = {0x1000, 4096 * 4}, src = {0x9000, 4096 * 2};
    fa_rows_view dv = packed(&dst, FA_DTYPE_F32, &sh, 7), sv = packed(&src, FA_DTYPE_F16, &sh, 3);
    dv.stride_head = 20;
    dv.stride_seq = 64;
    dv.stride_batch = 400;
    fa_rows_launch l;
    CHECK_OK(fa_rows_prepare(FA_ROWS_ADD, &sh, &dv, &sv, 9.0f, locate, &l));
    const fa_rows_params *p = &l.params;
    CHECK(p->ptr[FA_ROWS_DST] == 0x1000 && p->ptr[FA_ROWS_SRC] == 0x9000);
    CHECK(p->off[FA_ROWS_DST] == 7 && p->sb[FA_ROWS_DST] == 400 && p->ss[FA_ROWS_DST] == 64 && p->sh[FA_ROWS_DST] == 20);
    CHECK(p->off[FA_ROWS_SRC] == 3 && p->sh[FA_ROWS_SRC] == 16);
    CHECK(p->dtype[FA_ROWS_DST] == FA_DTYPE_F32 && p->dtype[FA_ROWS_SRC] == FA_DTYPE_F16);
    CHECK(p->op == FA_ROWS_ADD && p->value == 0.0f && p->rows == 5 && p->heads == 3 && p->dim == 16);
    /* Fill reads no source: none is needed, and its value travels. */
    CHECK_OK(fa_rows_prepare(FA_ROWS_FILL, &sh, &dv, NULL, 9.0f, locate, &l));
    CHECK(l.params.op == FA_ROWS_FILL && l.params.value == 9.0f && l.params.ptr[FA_ROWS_SRC] == 0);

    /* The merge: O views of shape, L views of dim 1 each laid out its way. */
    const fa_rows_shape lsh = {2, 5, 3, 1};
    fake_buffer ao = {0x100, 4096 * 4}, po = {0x200, 4096 * 2}, al = {0x300, 30 * 4}, pl = {0x400, 31 * 4};
    const fa_rows_view aov = packed(&ao, FA_DTYPE_F32, &sh, 0), pov = packed(&po, FA_DTYPE_BF16, &sh, 0);
    const fa_rows_view alv = {&al, FA_DTYPE_F32, 0, 15, 1, 5}, plv = packed(&pl, FA_DTYPE_F32, &lsh, 1);
    CHECK_OK(fa_rows_merge_prepare(&sh, &aov, &alv, &pov, &plv, locate, &l));
    p = &l.params;
    CHECK(p->ptr[FA_ROWS_ACC_O] == 0x100 && p->ptr[FA_ROWS_PART_O] == 0x200 && p->ptr[FA_ROWS_ACC_L] == 0x300 &&
          p->ptr[FA_ROWS_PART_L] == 0x400);
    CHECK(p->dtype[FA_ROWS_PART_O] == FA_DTYPE_BF16 && p->ss[FA_ROWS_ACC_L] == 1 && p->sh[FA_ROWS_ACC_L] == 5);
    CHECK(p->off[FA_ROWS_PART_L] == 1 && l.params.lanes == 16 && l.blocks == 2);
}

FA_TEST(refusals_name_the_view) {
    const fa_rows_shape sh = {2, 5, 3, 16};
    const size_t n = elems_of(&sh);
    fake_buffer dst = {0x1000, n * 4}, src = {0x9000, n * 2};
    const fa_rows_view dv = packed(&dst, FA_DTYPE_F32, &sh, 0), sv = packed(&src, FA_DTYPE_BF16, &sh, 0);
    fa_rows_launch l;
    CHECK_OK(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, &sv, 0.0f, locate, &l));

    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, NULL, &sv, 0.0f, locate, &l), FA_ERR_NULL_POINTER, "dst");
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, NULL, 0.0f, locate, &l), FA_ERR_NULL_POINTER, "src");
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, NULL, &dv, &sv, 0.0f, locate, &l), FA_ERR_NULL_POINTER, "shape");
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, &sv, 0.0f, NULL, &l), FA_ERR_NULL_POINTER, "locate");
    CHECK_FAILS(fa_rows_prepare((fa_rows_op)7, &sh, &dv, &sv, 0.0f, locate, &l), FA_ERR_INVALID_ARGUMENT, "op");
    fa_rows_view bad = sv;
    bad.buf = NULL;
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, &bad, 0.0f, locate, &l), FA_ERR_NULL_POINTER, "src->buf");
    bad = sv;
    bad.dtype = (fa_dtype)9;
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, &bad, 0.0f, locate, &l), FA_ERR_INVALID_ARGUMENT, "src");
    bad = dv;
    bad.stride_seq = -1;
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &bad, &sv, 0.0f, locate, &l), FA_ERR_BAD_STRIDE, "dst");

    /* One element past the buffer, at the last line's last element. */
    fake_buffer short_src = {0x9000, n * 2 - 2};
    bad = packed(&short_src, FA_DTYPE_BF16, &sh, 0);
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, &bad, 0.0f, locate, &l), FA_ERR_OUT_OF_BOUNDS, "src");
    bad = packed(&src, FA_DTYPE_BF16, &sh, 1);
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &dv, &bad, 0.0f, locate, &l), FA_ERR_OUT_OF_BOUNDS, "src");
    fake_buffer odd = {0x1002, n * 4};
    bad = packed(&odd, FA_DTYPE_F32, &sh, 0);
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &bad, &sv, 0.0f, locate, &l), FA_ERR_MISALIGNED, "dst");
    /* Indices past 64 bits, and lines past them. */
    bad = dv;
    bad.stride_batch = INT64_MAX;
    CHECK_FAILS(fa_rows_prepare(FA_ROWS_COPY, &sh, &bad, &sv, 0.0f, locate, &l), FA_ERR_INVALID_SIZE, "dst");
    const fa_rows_shape vast = {INT_MAX, INT_MAX, INT_MAX, 1};
    CHECK_STATUS(fa_rows_prepare(FA_ROWS_COPY, &vast, &dv, &sv, 0.0f, locate, &l), FA_ERR_INVALID_SIZE);
    const fa_rows_shape negative = {2, -1, 3, 16};
    CHECK_STATUS(fa_rows_prepare(FA_ROWS_COPY, &negative, &dv, &sv, 0.0f, locate, &l), FA_ERR_INVALID_SIZE);

    /* The merge keeps its accumulator and both L in fp32. */
    const fa_rows_shape lsh = {2, 5, 3, 1};
    fake_buffer ao = {0x100, n * 4}, ah = {0x100, n * 2}, al = {0x300, 30 * 4}, pl = {0x400, 30 * 4};
    const fa_rows_view aov = packed(&ao, FA_DTYPE_F32, &sh, 0), ahv = packed(&ah, FA_DTYPE_F16, &sh, 0);
    const fa_rows_view alv = packed(&al, FA_DTYPE_F32, &lsh, 0), plv = packed(&pl, FA_DTYPE_F32, &lsh, 0);
    CHECK_OK(fa_rows_merge_prepare(&sh, &aov, &alv, &sv, &plv, locate, &l));
    CHECK_FAILS(fa_rows_merge_prepare(&sh, &ahv, &alv, &sv, &plv, locate, &l), FA_ERR_DTYPE_MISMATCH, "acc_o");
    const fa_rows_view half_l = packed(&al, FA_DTYPE_F16, &lsh, 0);
    CHECK_FAILS(fa_rows_merge_prepare(&sh, &aov, &half_l, &sv, &plv, locate, &l), FA_ERR_DTYPE_MISMATCH, "acc_l");
    CHECK_FAILS(fa_rows_merge_prepare(&sh, &aov, &alv, &sv, &half_l, locate, &l), FA_ERR_DTYPE_MISMATCH, "part_l");
    fake_buffer short_l = {0x400, 29 * 4};
    const fa_rows_view slv = packed(&short_l, FA_DTYPE_F32, &lsh, 0);
    CHECK_FAILS(fa_rows_merge_prepare(&sh, &aov, &alv, &sv, &slv, locate, &l), FA_ERR_OUT_OF_BOUNDS, "part_l");
    CHECK_FAILS(fa_rows_merge_prepare(&sh, &aov, NULL, &sv, &plv, locate, &l), FA_ERR_NULL_POINTER, "acc_l");
}

FA_TEST_MAIN(FA_CASE(grid_for_every_line_width), FA_CASE(parameter_block_slots), FA_CASE(refusals_name_the_view))
