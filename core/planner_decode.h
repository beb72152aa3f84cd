/* The decoding problem on CUDA (core/planner_decode.c): GQA-packed rows,
 * keys split to fill the device, K and V read once per KV head. */
#ifndef FA_PLANNER_DECODE_H
#define FA_PLANNER_DECODE_H

#include "flashattn.h"

#include <stdint.h>

/* The kernel's fixed geometry (kernels_cuda/decode.cu): four warps of 16
 * keys each per key tile. */
#define FA_DECODE_WARPS 4
#define FA_DECODE_BC 64

/* Whether a forward pass is planned as packed decoding (FA_VARIANT_DECODE)
 * on this device; sm is the CUDA architecture (90 for sm_90, 0 for none). */
int fa_decode_applies(const fa_device_desc *dev, const fa_attention_desc *desc, int sm);

/* The forward plan of a problem fa_decode_applies to, cost and workspace
 * aside; FA_ERR_UNSUPPORTED when no tile fits the device's local memory. */
fa_status fa_decode_plan(const fa_device_desc *dev, const fa_attention_desc *desc, fa_kernel_plan *out);

/* Shared memory of the kernel: Q, then K and V per stage or the warps'
 * partial rows at the end, whichever is larger. */
size_t fa_decode_local_mem(const fa_attention_desc *desc, int br, int stages);

/* The query tokens a row tile of br packed rows stands for in the IO
 * model's tile visits, and how many row tiles share one token's heads
 * (each reads the keys again). */
int fa_decode_token_rows(const fa_attention_desc *desc, int br);
int fa_decode_tiles_per_token(const fa_attention_desc *desc, int br);

/* Key splits of a plan with br packed rows: as many as one wave of one
 * block a compute unit holds where that is two or more, else of two blocks
 * a compute unit; each split keeping at least two key tiles, at most 128;
 * 1 where the blocks without splits fill half a wave or more. */
int fa_decode_split_count(const fa_device_desc *dev, const fa_attention_desc *desc, int br);

/* A KV-cache step (desc->kv_cache) is decoding whatever its lengths: its
 * keys are the cache, planned over its capacity (seqlen_k), its query
 * rows the GQA group's heads times seqlen_q packed per KV head, so that K
 * and V are read once per KV head (and row tile); pages do not change the
 * bytes. On CUDA's matrix units (fp16/bf16, head_dim a multiple of 16)
 * the plan is FA_VARIANT_DECODE (fa_decode_plan: rows packed into tiles of
 * 16 to 64, more row tiles where the group's rows are more, no minimum of
 * keys); elsewhere, and where no decoding tile fits, SIMT tiles of packed
 * rows (kernels_cl/kvcache.cl): br packed rows x bc keys, the work-group
 * and micro-tile of the SIMT forward, FA_VARIANT_SPLITK where the keys
 * split (FA_VARIANT_SIMT where they do not). split_k, br, bc, the work-
 * group and num_work_groups (batch x heads_kv x row tiles x split_k) are
 * what the kernels launch. */
int fa_decode_applies_kvcache(const fa_device_desc *dev, const fa_attention_desc *desc, int sm);
fa_status fa_kvcache_plan(const fa_device_desc *dev, const fa_attention_desc *desc, int sm, fa_kernel_plan *out);
/* Row tiles of br packed rows (group x seqlen_q per KV head). */
int64_t fa_kvcache_row_tiles(const fa_attention_desc *desc, int br);

#endif
