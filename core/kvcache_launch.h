/* The host side of a KV-cache step (fa_forward_kvcache) that the CUDA and
 * HIP backends share: the kernels take the same build options and the same
 * second parameter block (struct fa_kv_params of kernels_cuda/kvcache.cuh
 * and kernels_hip/kvcache.hip), the FP32-pipe step the same plan and grid,
 * and every step the same argument checks. What is left to a backend is
 * its runtime: compiling, allocating, the device address of a buffer
 * handle, and the launches. (OpenCL's kernels_cl/kvcache.cl takes its
 * arguments one by one and none of this.)
 *
 * The FP32-pipe step is three kernels, in stream order: fa_kv_prepare (one
 * block of FA_KV_PREP_THREADS per sequence: its verdict and the append),
 * fa_kv_attend (one block per row tile of the GQA group's packed rows, KV
 * head, sequence x key split) and, with splits, the backend's split merge. */
#ifndef FA_KVCACHE_LAUNCH_H
#define FA_KVCACHE_LAUNCH_H

#include "backend.h"
#include "plan.h"

#include <stddef.h>
#include <stdint.h>

/* fa_kv_prepare's block: PREP_THREADS of kvcache_simt.cu and kvcache.hip. */
#define FA_KV_PREP_THREADS 128
/* Grid dimensions y and z: 65535 on every CUDA and HIP device. */
#define FA_KV_MAX_GRID_YZ 65535u

/* struct fa_kv_params of the kernels, field for field: the device
 * addresses first (CUdeviceptr and HIP pointers alike are 64-bit), then
 * k_new's and v_new's element offsets and strides, then an even number of
 * 4-byte fields, so that no compiler pads. */
typedef struct fa_kv_params {
    uint64_t cache_seqlens; /* int32 [batch]: tokens cached before the step */
    uint64_t block_table;   /* int32 [batch][max_pages] (paged caches) */
    uint64_t k_new, v_new;  /* [batch, seqlen_new, heads_kv, head_dim] (append) */
    uint64_t rot_cos, rot_sin; /* fp32 [seqlen_k][rotary_dim / 2] (rotary) */
    uint64_t alibi;         /* fp32 [heads_q] raw slopes (the plan's copy) */
    uint64_t status;        /* int32 [batch]: fa_kv_prepare's verdicts (the plan's) */
    int64_t kn_off, kn_sb, kn_ss, kn_sh;
    int64_t vn_off, vn_sb, vn_ss, vn_sh;
    float softcap, softcap_inv;
    int32_t seqlen_new, num_pages, max_pages, reserved;
} fa_kv_params;

_Static_assert(sizeof(fa_kv_params) == 8 * 8 + 8 * 8 + 2 * 4 + 4 * 4, "fa_kv_params has padding");

/* The build options a step adds to the backend's dtype, tile and mask
 * options (softcap and ALiBi are among the latter), in a fixed order so
 * that equal descriptors give equal kernel-cache keys. */
#define FA_KV_MAX_DEFINES 8
#define FA_KV_DEFINE_SIZE 32
typedef struct fa_kv_defines {
    char text[FA_KV_MAX_DEFINES][FA_KV_DEFINE_SIZE]; /* "-DKV_CACHE", "-DPAGED=64", ... */
    int count;
} fa_kv_defines;

/* What the kernels need of the descriptor beyond the decoding shape, and
 * the options that compile it in: pages of a multiple of 16 tokens up to
 * 256 (FA_ERR_UNSUPPORTED naming page_size), seqlen_new within the
 * capacity, an even rotary_dim up to head_dim, no varlen, block mask,
 * dropout or bias (FA_ERR_UNSUPPORTED); k_new and v_new in q's dtype
 * (FA_ERR_DTYPE_MISMATCH) with offsets and strides of whole 16 bytes, as
 * the kernels copy rows 16 bytes at a time (FA_ERR_MISALIGNED). */
fa_status fa_kvcache_defines(const fa_attention_desc *d, fa_kv_defines *out);

/* The FP32-pipe step's plan (the planner's packed-row SIMT tile,
 * core/planner_decode.c) against what the kernels run: variant SIMT or
 * SPLITK (FA_ERR_UNSUPPORTED naming it), a tile of whole micro-tiles with
 * work_group_size threads, split_k >= 1 (FA_ERR_UNSUPPORTED); and the
 * packed rows of a KV head within the kernels' int with room for a tile
 * past them, the grid within the devices' (FA_ERR_UNSUPPORTED). `who`
 * names the backend in the messages. */
fa_status fa_kvcache_check_simt(const fa_attention_desc *d, const fa_kernel_plan *kp, const char *who);

/* The key splits the step's kernels run: split_k of a split plan, else 1. */
int fa_kvcache_splits(const fa_kernel_plan *kp);

/* The attention's grid, (row tiles of the packed rows, heads_kv, batch x
 * splits), checked against the devices' limits (FA_ERR_UNSUPPORTED). */
fa_status fa_kvcache_grid(const fa_attention_desc *d, const fa_kernel_plan *kp, unsigned grid[3]);

/* The plan's device workspace: the verdicts (int32 [batch]) and, for a
 * split plan, the partial outputs (fp32 [splits][heads_q][total_q]
 * [head_dim]) and log-sum-exps (fp32 [splits][heads_q][total_q]); 0 bytes
 * for what the plan does not use. Sizes overflowing size_t:
 * FA_ERR_OUT_OF_MEMORY (fa_workspace_bytes). */
typedef struct fa_kv_workspace {
    size_t status_bytes, part_o_bytes, part_l_bytes;
} fa_kv_workspace;
fa_status fa_kvcache_workspace(const fa_plan_s *plan, int splits, fa_kv_workspace *out);

/* The parameter block's plan-time fields from the descriptor: k_new's and
 * v_new's layouts (packed strides resolved as include/flashattn.h lays
 * them out), seqlen_new, the pool and the block table's row (paged), the
 * softcap and its inverse. The device addresses are zero: alibi and status
 * are the backend's buffers, the rest come with each step
 * (fa_kvcache_bind). */
void fa_kvcache_params(const fa_attention_desc *d, fa_kv_params *kv);

/* A backend's buffer handle as device memory: its address and size. */
typedef void (*fa_kv_locate_fn)(void *buf, uint64_t *address, size_t *bytes);

/* The tensors of one step, as device addresses. */
typedef struct fa_kv_tensors {
    uint64_t q, k_cache, v_cache, o, lse; /* lse 0: the caller passed none */
} fa_kv_tensors;

/* One step's buffers into the tensors and kv's per-step addresses: the
 * ones the descriptor asks for must be there (FA_ERR_NULL_POINTER naming
 * them; core/api.c has already refused the ones it does not ask for), the
 * tensors 16-byte aligned and the int32 and fp32 tables 4-byte aligned
 * (FA_ERR_MISALIGNED): the kernels' loads assume it. */
fa_status fa_kvcache_bind(const fa_attention_desc *d, const fa_kvcache_call *a, fa_kv_locate_fn locate,
                          fa_kv_params *kv, fa_kv_tensors *t);

#endif
