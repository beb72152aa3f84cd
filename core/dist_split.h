/* How one ring step's attention (this rank's queries against the keys of
 * the rank whose chunk visits) is cut into pieces that ordinary plans can
 * compute: each piece is a rectangle of local query rows and visiting key
 * rows whose mask, seen from the piece's own bottom-right corner, is a
 * causal mask, a window, a block mask or none, as fa_attention_desc
 * defines them. */
#ifndef FA_DIST_SPLIT_H
#define FA_DIST_SPLIT_H

#include "flashattn.h"

#include <stdint.h>

typedef struct fa_dist_piece {
    int64_t row0, nrows;   /* local query rows (tokens, for varlen) */
    int64_t key0, nkeys;   /* rows of the visiting key chunk */
    /* With dropout: where the piece's first query and key lie in the whole
     * sequence, the origin its plan draws the mask from
     * (fa_plan_set_dropout_origin; drop_col0 a multiple of 4). */
    int64_t drop_row0, drop_col0;
    /* The piece as a problem of its own: shapes, masks, varlen offsets;
     * tensor layouts are the caller's to set. Its block_mask and
     * cu_seqlens point into the arrays below. */
    fa_attention_desc desc;
    uint8_t *block_mask;
    int32_t *cu_q, *cu_k;
} fa_dist_piece;

/* Tokens of one sequence as the ring cuts it (fa_cp_part). */
typedef struct fa_dist_span {
    int64_t global, len, local;
} fa_dist_span;

/* The pieces of the step at which rank `rank` holds the keys of rank
 * `source`. whole: the whole problem, already checked, without score
 * options, and with dropout only where it is not variable-length and every
 * chunk of keys starts at a multiple of 4 (core/dist.c checks both). With
 * dropout each piece is one cell (one query part against one key part,
 * whose global positions are contiguous), its first key at a multiple of 4
 * in the whole sequence. *pieces is NULL when the step has nothing to
 * compute. FA_ERR_UNSUPPORTED names what the pieces cannot express. */
fa_status fa_dist_split(const fa_attention_desc *whole, fa_cp_layout layout, int world, int rank, int source,
                        fa_dist_piece **pieces, int *count);
void fa_dist_pieces_free(fa_dist_piece *pieces, int count);

#endif
