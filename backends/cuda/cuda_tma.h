/* Tensor maps for the warp-specialised forward (kernels_cuda/fwd_tma.cu,
 * kernels_cuda/tma.cuh). */
#ifndef FA_CUDA_TMA_H
#define FA_CUDA_TMA_H

#include "cuda_runtime_internal.h"
#include "desc.h"

/* The map of one operand of a pass, {head_dim, tokens, heads, batch}
 * elements from buffer address base (the layout's offset added here),
 * read and written in boxes of one 128-byte swizzled line (64 head
 * dimensions of fp16/bf16, 128 of e4m3) by box_rows tokens.
 * FA_ERR_UNSUPPORTED where the driver has no tensor maps or refuses the
 * layout (the planner takes only layouts it accepts: core/planner.c
 * tma_layouts_ok). */
fa_status fa_cuda_tensor_map(CUtensorMap *map, CUdeviceptr base, const fa_attention_desc *d, fa_tensor_role role,
                             int box_rows);

/* The map of fwd_tma.cu VT_GLOBAL's V^T (fa_fp8_vt writes it at vt):
 * {keys_pad, head_dim, heads_kv, batch} bytes, keys innermost, read in
 * boxes of 128 keys by every head dimension under the 128-byte swizzle. */
fa_status fa_cuda_vt_map(CUtensorMap *map, CUdeviceptr vt, const fa_attention_desc *d, int64_t keys_pad);

#endif
