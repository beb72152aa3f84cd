/* The ring's element-wise passes (core/backend.h: rows, rows_merge) on host
 * memory, for the reference backend. Here a view's buf is the address of
 * its buffer's first byte, not a backend handle. */
#ifndef FA_REFERENCE_ROWS_H
#define FA_REFERENCE_ROWS_H

#include "backend.h"

fa_status fa_ref_rows(fa_rows_op op, const fa_rows_shape *shape, const fa_rows_view *dst, const fa_rows_view *src,
                      float value);
fa_status fa_ref_rows_merge(const fa_rows_shape *shape, const fa_rows_view *acc_o, const fa_rows_view *acc_l,
                            const fa_rows_view *part_o, const fa_rows_view *part_l);

#endif
