/* Host-side plan data shared by the backends (plan_data.h). */
#include "plan_data.h"

#include "checked.h"
#include "fa_internal.h"

#include <stdlib.h>

int64_t fa_tile_count(int64_t n, int tile) { return tile > 0 && n > 0 ? (n + tile - 1) / tile : 0; }

int fa_block_cols(const fa_attention_desc *desc) {
    /* At most seqlen_k: fits int. */
    return desc->block_mask ? (int)fa_tile_count(desc->seqlen_k, desc->block_k) : 0;
}

fa_status fa_workspace_bytes(const char *what, const size_t *factors, int n, size_t *bytes) {
    *bytes = 1;
    for (int i = 0; i < n; i++)
        if (fa_ckd_mul_size(bytes, *bytes, factors[i]))
            return fa_fail(FA_ERR_OUT_OF_MEMORY, "%s would take more bytes than size_t holds", what);
    return FA_SUCCESS;
}

fa_status fa_tile_map_build(const fa_attention_desc *d, const uint8_t *block_mask, int br, int bc, uint8_t **map,
                            size_t *bytes, int *cols) {
    *map = NULL;
    const int64_t rows = fa_tile_count(d->seqlen_q, br), ncols = fa_tile_count(d->seqlen_k, bc);
    const size_t block_cols = (size_t)fa_block_cols(d);
    size_t n;
    if (fa_ckd_mul_size(&n, (size_t)rows, (size_t)ncols))
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "a %lld x %lld tile map does not fit in memory", (long long)rows,
                       (long long)ncols);
    uint8_t *m = malloc(n ? n : 1);
    if (!m)
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "no host memory for a %lld x %lld tile map", (long long)rows,
                       (long long)ncols);
    for (int64_t tq = 0; tq < rows; tq++) {
        const int64_t q_end = (tq + 1) * br < d->seqlen_q ? (tq + 1) * br : d->seqlen_q;
        const int64_t bq0 = tq * br / d->block_q, bq1 = (q_end - 1) / d->block_q;
        for (int64_t tk = 0; tk < ncols; tk++) {
            const int64_t k_end = (tk + 1) * bc < d->seqlen_k ? (tk + 1) * bc : d->seqlen_k;
            const int64_t bk0 = tk * bc / d->block_k, bk1 = (k_end - 1) / d->block_k;
            int any = 0, all = 1;
            for (int64_t i = bq0; i <= bq1; i++)
                for (int64_t j = bk0; j <= bk1; j++) {
                    if (block_mask[(size_t)i * block_cols + (size_t)j])
                        any = 1;
                    else
                        all = 0;
                }
            m[(size_t)tq * (size_t)ncols + (size_t)tk] = (uint8_t)(any ? (all ? 2 : 1) : 0);
        }
    }
    *map = m;
    *bytes = n;
    *cols = (int)ncols;
    return FA_SUCCESS;
}
