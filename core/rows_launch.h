/* The ring's element-wise passes (core/backend.h: rows, rows_merge) as the
 * GPU backends run them: the arguments checked, laid out in the one
 * parameter block that kernels_cuda/rows.cu and kernels_hip/rows.hip both
 * take by value, and the grid that covers the shape. What is left to a
 * backend is its runtime: the device address of a buffer handle, compiling
 * the program once per context and one launch.
 *
 * The kernels' geometry: a line is the dim elements of one (batch, row,
 * head); `lanes` threads share a line (a power of two, at most 32, so that
 * a warp reads a line's neighbouring elements together), a block of
 * FA_ROWS_THREADS threads holds FA_ROWS_THREADS / lanes lines, and the
 * blocks step over the lines until all are done: the grid stays within
 * FA_ROWS_MAX_BLOCKS whatever the views' size, and every index is 64-bit. */
#ifndef FA_ROWS_LAUNCH_H
#define FA_ROWS_LAUNCH_H

#include "backend.h"

#include <stddef.h>
#include <stdint.h>

#define FA_ROWS_THREADS 256 /* ROWS_THREADS of both kernels */
#define FA_ROWS_MAX_LANES 32
/* Many times the threads any GPU keeps resident; the blocks' loop covers
 * the lines beyond. */
#define FA_ROWS_MAX_BLOCKS 65535u

/* The views of one launch, in the parameter block's slots. */
enum { FA_ROWS_DST = 0, FA_ROWS_SRC = 1 };
enum { FA_ROWS_ACC_O = 0, FA_ROWS_PART_O = 1, FA_ROWS_ACC_L = 2, FA_ROWS_PART_L = 3 };
#define FA_ROWS_SLOTS 4

/* struct fa_rows_params of rows.cu and rows.hip, field for field: 8-byte
 * fields first, then an even number of 4-byte ones, so that no compiler
 * pads. A slot's offset and strides are in elements of its dtype (an
 * fa_dtype); an unused slot is all zero. */
typedef struct fa_rows_params {
    uint64_t ptr[FA_ROWS_SLOTS];
    int64_t off[FA_ROWS_SLOTS], sb[FA_ROWS_SLOTS], ss[FA_ROWS_SLOTS], sh[FA_ROWS_SLOTS];
    int64_t lines; /* batch * rows * heads */
    int32_t rows, heads, dim, lanes;
    int32_t dtype[FA_ROWS_SLOTS];
    int32_t op;    /* an fa_rows_op; the merge ignores it */
    float value;   /* FA_ROWS_FILL's */
} fa_rows_params;

_Static_assert(sizeof(fa_rows_params) == 21 * 8 + 10 * 4, "fa_rows_params has padding");

typedef struct fa_rows_launch {
    fa_rows_params params;
    unsigned blocks;  /* 0: the shape is empty, nothing to launch */
    unsigned threads; /* FA_ROWS_THREADS */
} fa_rows_launch;

/* A backend's buffer handle as device memory: its address and size. */
typedef void (*fa_rows_locate_fn)(void *buf, uint64_t *address, size_t *bytes);

/* The launch of rows (core/backend.h) or the reason it cannot run: a NULL
 * or unknown argument, a negative size, a stride or offset below 0
 * (FA_ERR_BAD_STRIDE), a view running past its buffer
 * (FA_ERR_OUT_OF_BOUNDS), an address not aligned to its element
 * (FA_ERR_MISALIGNED), each message naming the view. */
fa_status fa_rows_prepare(fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst,
                          const fa_rows_view *src, float value, fa_rows_locate_fn locate, fa_rows_launch *out);
/* The same for rows_merge; acc_o, acc_l and part_l must be fp32
 * (FA_ERR_DTYPE_MISMATCH), and the L views span shape with dim 1. */
fa_status fa_rows_merge_prepare(const fa_rows_shape *shape, const fa_rows_view *acc_o, const fa_rows_view *acc_l,
                                const fa_rows_view *part_o, const fa_rows_view *part_l, fa_rows_locate_fn locate,
                                fa_rows_launch *out);

#endif
