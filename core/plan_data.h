/* What a backend derives on the host from a plan's checked descriptor: the
 * block mask's geometry, its per-tile map, and workspace sizes. Every count
 * comes from user input (sequence lengths, block sizes, heads), so every
 * one is computed with checked arithmetic: a size that does not fit is
 * refused, never wrapped into a small allocation. */
#ifndef FA_PLAN_DATA_H
#define FA_PLAN_DATA_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* Columns of the block mask, ceil(seqlen_k / block_k); 0 without one. */
int fa_block_cols(const fa_attention_desc *desc);

/* Tiles of tile rows over n positions, ceil(n / tile). */
int64_t fa_tile_count(int64_t n, int tile);

/* What the block mask leaves of each (br x bc) tile, row-major
 * [ceil(seqlen_q / br)][ceil(seqlen_k / bc)]: 0 nothing, 1 part, 2 all (the
 * kernels' FA_TILE_*). Positions past seqlen_q / seqlen_k never count: the
 * kernels bound-check those themselves. *map is malloc'ed (the caller
 * frees it); FA_ERR_OUT_OF_MEMORY when it cannot be. */
fa_status fa_tile_map_build(const fa_attention_desc *desc, const uint8_t *block_mask, int br, int bc,
                            uint8_t **map, size_t *bytes, int *cols);

/* *bytes = the product of n factors (a workspace of the plan, named by
 * what), or FA_ERR_OUT_OF_MEMORY when it does not fit size_t. */
fa_status fa_workspace_bytes(const char *what, const size_t *factors, int n, size_t *bytes);

#endif
