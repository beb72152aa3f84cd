/* The planner and IO model (GUIDE section 3): plain C, no vendor headers. */
#ifndef FA_PLANNER_H
#define FA_PLANNER_H

#include "flashattn.h"

#include <stdint.h>

/* Bytes of one shared-memory tile of the CUDA tensor-core kernels: rows by
 * width_bytes, laid out as kernels_cuda/mma.cuh says (TILE_BYTES). */
size_t fa_mma_tile_bytes(size_t rows, size_t width_bytes);

/* Whether a variant's products run on matrix units (MMA, WGMMA): the
 * tensor-core peak, fragment-shaped micro-tiles, up to two stages. */
int fa_variant_on_matrix_units(fa_variant variant);

/* OpenCL backward variants that add dQ into an fp32 accumulator with
 * atomics (the streaming and matrix-unit kernels; not in deterministic
 * mode); the others compute dQ in a kernel of their own. */
int fa_cl_dq_accumulates(fa_variant variant);

/* Local memory a plan may use on a device: what it reports, less what the
 * drivers keep for themselves. */
size_t fa_plan_usable_local_mem(const fa_device_desc *dev);
/* The local memory a kernel of this variant may use on dev: less than the
 * usable figure where its tiles are static (HIP's SIMT kernels through the
 * mapping on NVIDIA). */
size_t fa_plan_variant_local_mem(const fa_device_desc *dev, fa_variant variant);

/* Blocks per SM the warpgroup forward (FA_VARIANT_WGMMA) is built to share
 * an SM with, 1 or 2: its register budget, which the planner and the CUDA
 * backend (its launch bounds) must agree on. */
int fa_wgmma_blocks_per_sm(const fa_attention_desc *desc, int bc);

/* Warps sharing each 16-key strip of the CUDA tensor-core backward
 * (kernels_cuda/bwd_mma.cu DK_SPLIT), each holding dK and dV for 1 / split
 * of the head dimensions: 1, or 2 or 4 for fp16/bf16 above head_dim 128.
 * The planner, the CUDA backend and fa_plan_local_mem agree on it. */
int fa_mma_bwd_dk_split(const fa_attention_desc *desc);

/* Whether a SIMT forward work-group of (br / tr) x (bc / tc) work-items,
 * each holding a tr x tc micro-tile of the scores, runs on dev: the
 * work-group limits, whole SIMD groups and the register budget. */
int fa_plan_simt_layout_ok(const fa_device_desc *dev, const fa_attention_desc *desc, int br, int bc, int tr, int tc);

/* The head dimensions the warp-specialised forward (kernels_cuda/fwd_tma.cu,
 * 16-bit inputs) is built for: head_dim rounded up to whole 64-column
 * blocks. Where they differ, its tensor maps fill the columns past head_dim
 * with zeros on loads and leave them out of O's store, so the kernel built
 * for the rounded size computes the problem exactly; the planner, the CUDA
 * backend and fa_plan_local_mem agree on it. */
int fa_tma_head_dim(const fa_attention_desc *desc);

/* Whether the warp-specialised backward (kernels_cuda/bwd_mma.cu with TMA)
 * adds each step's dQ during the next step (BWD_DQ_LAG), in a third dS^T
 * tile: where two consumer warpgroups take dQ in turns by bulk reductions
 * (bc 128, head_dim above 64, dQ by atomics), without a causal mask or a
 * window. The CUDA backend and fa_plan_local_mem agree on it. */
int fa_tma_bwd_dq_lag(const fa_attention_desc *desc, int bc);

/* Whether the FP8 forward (kernels_cuda/fwd_tma.cu VT_GLOBAL) reads V^T
 * written once to global memory by a pre-pass instead of transposing each
 * V stage in shared memory: fp8 inputs with 128-key tiles (a row of V^T
 * one 128-byte line). FLASHATTN_FP8_VT=transposers keeps the in-kernel
 * transposers, for comparison. The planner, the CUDA backend and
 * fa_plan_local_mem agree on it. */
int fa_fp8_vt_global(const fa_attention_desc *desc, int bc);

/* The head_dim the warp-specialised backward (bwd_mma.cu built with TMA)
 * runs a problem at: 64, 96, 128, 192 or 256, the next of them from
 * head_dim (96 only itself). At 160 and 224 the planner takes it padded (the tensor maps fill the
 * rest of each row with zeros, the stores leave it out, the fp32 dQ
 * accumulator keeps rows of the padded width). */
int fa_tma_bwd_head_dim(const fa_attention_desc *desc);
/* The problem as the warp-specialised backward is built for it: a copy of
 * desc with fa_tma_bwd_head_dim's head_dim (the kernel's tiles, the dQ
 * accumulator's rows); the tensors keep their own. */
fa_attention_desc fa_tma_bwd_desc(const fa_attention_desc *desc);

/* The pre-pass's V^T: keys_pad (seqlen_k rounded up to 128) bytes a row,
 * head_dim rows a (sequence, KV head); *bytes the whole buffer.
 * FA_ERR_UNSUPPORTED where it exceeds SIZE_MAX or a tensor map's strides
 * (below 2^40 bytes). */
fa_status fa_fp8_vt_size(const fa_attention_desc *desc, int64_t *keys_pad, size_t *bytes);
/* A tensor map's strides (cuTensorMapEncodeTiled): multiples of 16 bytes
 * below this. */
#define FA_TMA_MAX_STRIDE ((int64_t)1 << 40)

/* Local memory (bytes) one work-group of the given variant needs for a tile
 * shape. Kernels declare exactly this much; tests hold them to it. */
size_t fa_plan_local_mem(fa_variant variant, fa_pass pass, const fa_attention_desc *desc, int br,
                         int bc, int stages);

/* What a br x bc tile shape leaves to compute of a problem, summed over the
 * batch: the tile pairs the kernels visit (the band reaches them and the
 * block mask leaves a block of them on) and the rows they read. Counted in
 * closed form: the time depends on the batch's sequences (one for a
 * fixed-length batch, cu_seqlens' count for varlen) and the block mask's
 * size, never on the sequence lengths. */
typedef struct fa_tile_visits {
    int br, bc;                /* the tile shape counted */
    double pairs;              /* visited (query tile, key tile) pairs */
    double key_rows;           /* sum over visited pairs of the key tile's rows */
    double query_rows;         /* sum over visited pairs of the query tile's rows */
    double visible_cells;      /* score cells the masks leave visible (one head) */
    int64_t longest_k, its_q;  /* the first sequence with the most keys: its lengths */
    int64_t longest_q, its_k;  /* the first with the most queries */
} fa_tile_visits;

fa_tile_visits fa_io_tile_visits(const fa_attention_desc *desc, int br, int bc);

/* IO model: predicted HBM traffic, FLOPs and roofline time of one pass for a
 * kernel plan (fused) or of standard attention. fa_io_fused_visits takes
 * the tile visits of the plan's br x bc, which many plans share. */
fa_cost fa_io_fused(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                    const fa_kernel_plan *plan);
fa_cost fa_io_fused_visits(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                           const fa_kernel_plan *plan, const fa_tile_visits *visits);
fa_cost fa_io_standard(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass);
/* FLOPs as the FlashAttention papers count them: forward 4 * b * h * sq * sk * d
 * over the visible fraction of the score matrix, backward 2.5x that. */
double fa_attention_flops(const fa_attention_desc *desc, fa_pass pass);
/* Cells of the score matrices, sum over the batch of sq * sk (one head). */
double fa_score_cells(const fa_attention_desc *desc);
/* Fraction of the sq x sk score matrix (summed over the batch) the masks leave visible. */
double fa_visible_fraction(const fa_attention_desc *desc);

/* Peak rates the roofline uses (FLOP/s, bytes/s) for a dtype on a device. */
double fa_device_peak_flops(const fa_device_desc *dev, fa_dtype dtype, int allow_tf32);
double fa_device_bandwidth(const fa_device_desc *dev);

/* Devices described by hand (GUIDE section 3): the planner's tests, fa-info
 * --describe, and the OpenCL tests that force other vendors' tiles onto PoCL. */
typedef struct fa_described_device {
    const char *key;            /* "h100", "mi250x", "mi300x", "arc-a770", "nvidia-opencl", "pocl-cpu" */
    fa_device_desc desc;
} fa_described_device;

int fa_described_device_count(void);
const fa_described_device *fa_described_device_get(int index);
const fa_described_device *fa_described_device_find(const char *key);

#endif
