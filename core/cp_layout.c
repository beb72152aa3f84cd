/* Where each rank's tokens lie under the context-parallel layouts, and the
 * host helpers that cut a whole tensor into a rank's part and back. */
#include "checked.h"
#include "fa_internal.h"

#include <string.h>

static int layout_parts(fa_cp_layout layout) { return layout == FA_CP_ZIGZAG ? 2 : 1; }

fa_status fa_cp_part(fa_cp_layout layout, int64_t n, int world, int rank, int part, int64_t *start,
                     int64_t *len, int64_t *local) {
    if (!start || !len || !local) return fa_fail(FA_ERR_NULL_POINTER, "start, len and local must not be NULL");
    if (layout != FA_CP_CONTIGUOUS && layout != FA_CP_ZIGZAG)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "layout = %d is not a fa_cp_layout", (int)layout);
    if (world < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "world = %d, must be >= 1", world);
    if (rank < 0 || rank >= world)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "rank = %d is outside [0, %d)", rank, world);
    const int parts = layout_parts(layout);
    if (part < 0 || part >= parts)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "part = %d, the %s layout has %d part%s a rank", part,
                       layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous", parts, parts > 1 ? "s" : "");
    const int64_t chunks = (int64_t)world * parts;
    if (n < 1 || n % chunks != 0)
        return fa_fail(FA_ERR_INVALID_SIZE, "%lld tokens do not cut into %lld equal chunks (%s layout, %d ranks)",
                       (long long)n, (long long)chunks, layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous", world);
    const int64_t c = n / chunks;
    const int64_t chunk = part == 0 ? rank : chunks - 1 - rank;
    *start = chunk * c;
    *len = c;
    *local = part * c;
    return FA_SUCCESS;
}

static fa_status cp_copy(fa_cp_layout layout, int world, int rank, int64_t outer, int64_t n, size_t token_bytes,
                         const void *src, void *dst, int to_local) {
    if (!src || !dst) return fa_fail(FA_ERR_NULL_POINTER, "whole and local must not be NULL");
    if (outer < 1) return fa_fail(FA_ERR_INVALID_SIZE, "outer = %lld, must be >= 1", (long long)outer);
    if (token_bytes == 0) return fa_fail(FA_ERR_INVALID_SIZE, "token_bytes is 0");
    int64_t start, len, local;
    FA_CHECK(fa_cp_part(layout, n, world, rank, 0, &start, &len, &local));
    const int64_t n_local = n / world;
    size_t whole_bytes, tok;
    /* The whole tensor must be addressable: everything below is a product
     * of factors of it. */
    if (fa_ckd_size_of_i64(&tok, n) || fa_ckd_mul_size(&whole_bytes, tok, token_bytes) ||
        fa_ckd_size_of_i64(&tok, outer) || fa_ckd_mul_size(&whole_bytes, whole_bytes, tok))
        return fa_fail(FA_ERR_INVALID_SIZE, "%lld x %lld tokens of %zu bytes do not fit in memory", (long long)outer,
                       (long long)n, token_bytes);
    for (int64_t o = 0; o < outer; o++)
        for (int part = 0; part < layout_parts(layout); part++) {
            FA_CHECK(fa_cp_part(layout, n, world, rank, part, &start, &len, &local));
            const size_t whole_at = ((size_t)o * (size_t)n + (size_t)start) * token_bytes;
            const size_t local_at = ((size_t)o * (size_t)n_local + (size_t)local) * token_bytes;
            const size_t bytes = (size_t)len * token_bytes;
            if (to_local)
                memcpy((char *)dst + local_at, (const char *)src + whole_at, bytes);
            else
                memcpy((char *)dst + whole_at, (const char *)src + local_at, bytes);
        }
    return FA_SUCCESS;
}

fa_status fa_cp_scatter(fa_cp_layout layout, int world, int rank, int64_t outer, int64_t n, size_t token_bytes,
                        const void *whole, void *local) {
    return cp_copy(layout, world, rank, outer, n, token_bytes, whole, local, 1);
}

fa_status fa_cp_gather(fa_cp_layout layout, int world, int rank, int64_t outer, int64_t n, size_t token_bytes,
                       const void *local, void *whole) {
    return cp_copy(layout, world, rank, outer, n, token_bytes, local, whole, 0);
}
