/* Warpgroup MMA (sm_90a) building blocks for fwd_mma.cu's WGMMA build:
 * the shared-memory tile layout the instructions read, its loader, the
 * operand descriptors and the ordering the asynchronous products need.
 *
 * Tiles (fp16/bf16, HEAD_DIM a multiple of 64, or 96 with a half-used
 * second line) are stored the way the 128-byte swizzle mode reads them:
 * the HEAD_DIM columns split into blocks of 64 (one 128-byte line per
 * row), each block all ROWS rows long; in a
 * block, row r is the 128 bytes at r * 128, and its 16-byte chunk c sits at
 * chunk c ^ (r & 7). Blocks start on 1024-byte boundaries, so the hardware's
 * swizzle (address bits 4-6 XOR bits 7-9) finds the same place. K-major
 * operands (Q and K, whose rows run along the reduction) step through a
 * block 32 bytes per k16 step; V, read N-major for P V, steps 16 keys
 * (2048 bytes) per k16 step and finds its next 64 columns a block further.
 * bwd_mma.cu's WGMMA build reads its tiles the same ways (Q and dO K-major
 * for S^T and dP^T, N-major for dK and dV; K N-major for dQ) and stores
 * dS^T, BR columns wide, in the same layout for dQ = dS K, whose A operand
 * it is, read MN-major.
 *
 * Built with FP8 (fwd_tma.cu; Q, K and V e4m3, O in the fp16/bf16 storage
 * dtype) a 128-byte line holds 128 head dimensions, and a k32 step of the
 * products is 32 bytes of it, as a 16-bit k16 step is: Q and K tiles have
 * SW_LINES lines a row, the last half empty at head_dim 64 and 192 (the
 * tensor maps fill it with zeros, and no step reads it). 8-bit operands
 * are K-major only, so the B operand of P V is V transposed in shared
 * memory (fwd_tma.cu), head dimensions down and keys along the line. */
#ifndef FA_CUDA_WGMMA_CUH
#define FA_CUDA_WGMMA_CUH

#include "common.cuh"
#include "mma.cuh"
#include "wgmma_ops.cuh"

/* Head_dim 96 (the warp-specialised backward alone): tiles of two 128-byte
 * lines a row, the second half filled with zeros by the tensor maps and
 * left out of the products (K_STEPS; N of 96). */
#if ELEM_BYTES != 2 || (HEAD_DIM % 64 != 0 && !(defined(BWD) && defined(TMA) && HEAD_DIM == 96))
#error "wgmma.cuh: fp16/bf16 with HEAD_DIM a multiple of 64 (96 in the warp-specialised backward)"
#endif

#ifdef FP8
#define IN_BYTES 1 /* bytes of a Q, K or V element */
#else
#define IN_BYTES ELEM_BYTES
#endif
#define SW_BLOCK_CHUNKS 8 /* 16-byte chunks in a 128-byte line */
#define SW_LINES ((HEAD_DIM * IN_BYTES + 127) / 128) /* 128-byte lines a row of Q or K */
#define SW_TILE_BYTES(ROWS) ((ROWS) * SW_LINES * 128)
#define K_STEPS (HEAD_DIM * IN_BYTES / 32) /* product steps over the head dimensions, 32 bytes each */

/* Byte offset of chunk c (of ROW_CHUNKS) of row r in a tile of ROWS rows. */
template <int ROWS> FA_DEV u32 sw_off(int r, int c) {
    return (u32)((c / SW_BLOCK_CHUNKS) * ROWS * 128 + r * 128 + (((c % SW_BLOCK_CHUNKS) ^ (r & 7)) << 4));
}

/* Fills a tile of ROWS rows from global memory rows src + r * stride
 * (elements); rows >= valid are zero-filled. Threads share the chunks as
 * load_tile_async does; where their row step is a multiple of 8 a thread's
 * swizzle never changes. */
template <int ROWS, int NTHREADS>
FA_DEV void load_tile_sw(u32 dst, const elem_t *src, i64 stride, int valid, int tid) {
    constexpr int STEP = TILE_CHUNK_STEP(ROWS, NTHREADS);
    asm volatile("" : "+r"(tid), "+l"(stride)); /* see load_tile_async */
    if constexpr (STEP > 0 && STEP % 8 == 0) {
        const int c = tid % ROW_CHUNKS;
        int r = tid / ROW_CHUNKS;
        const elem_t *g = src + (i64)r * stride + c * CHUNK_ELEMS;
        const i64 g_step = (i64)STEP * stride;
        u32 s = dst + sw_off<ROWS>(r, c);
#pragma unroll 1
        for (; r < ROWS; r += STEP, g += g_step) {
            const bool ok = r < valid;
            cp_async16(s, ok ? g : src, ok ? 16 : 0);
            s += STEP * 128;
        }
    } else {
#pragma unroll 1
        for (int e = tid; e < ROWS * ROW_CHUNKS; e += NTHREADS) {
            const int r = e / ROW_CHUNKS, c = e - r * ROW_CHUNKS;
            const bool ok = r < valid;
            cp_async16(dst + sw_off<ROWS>(r, c), ok ? src + (i64)r * stride + c * CHUNK_ELEMS : src, ok ? 16 : 0);
        }
    }
}

/* Operand descriptors, 128-byte swizzle: start address, leading and stride
 * byte offsets in 16-byte units. K-major: 8-row groups 1024 bytes apart
 * (the leading offset is unused). N-major: 8-row groups along k 1024 bytes
 * apart, 64-column blocks block_bytes apart. The high word (stride offset,
 * swizzle mode) is a constant; the low word is the tile's (sw_desc_lo), and
 * a step's descriptor adds the step's offset to it (sw_desc_at): shared
 * memory ends below 256 KiB, so the 14-bit address field never carries. */
#define SW_DESC_HI ((1024u >> 4) | 1u << 30)
FA_DEV u32 sw_desc_lo(u32 addr, u32 leading_bytes) { return ((addr & 0x3ffffu) >> 4) | (leading_bytes >> 4) << 16; }
FA_DEV u32 desc_lo_k_major(u32 addr) { return sw_desc_lo(addr, 16); }
FA_DEV u32 desc_lo_n_major(u32 addr, u32 block_bytes) { return sw_desc_lo(addr, block_bytes); }
/* Kept opaque per use: hoisted out of the key loop, a descriptor per step
 * would hold two registers for the whole kernel. */
FA_DEV u32 desc_fresh(u32 lo) {
    asm volatile("" : "+r"(lo));
    return lo;
}
FA_DEV u64 sw_desc_at(u32 lo, u32 offset_bytes) { return (u64)SW_DESC_HI << 32 | (lo + (offset_bytes >> 4)); }

/* Tile bytes from its start to (32-byte) k step s of a K-major operand. */
template <int ROWS> FA_DEV u32 k_step_off(int s) { return (u32)((s / 4) * ROWS * 128 + (s % 4) * 32); }

/* acc (64 x N) = A B^T over HEAD_DIM, A and B K-major: A the 64 rows at
 * descriptor word a_lo of a tile A_ROWS long, B the N rows at b_lo of a
 * tile B_ROWS long (N unless B is part of its tile). The first step
 * overwrites acc. */
template <int N, int A_ROWS, int B_ROWS = N> FA_DEV void wg_rows_by_rows(float (*acc)[4], u32 a_lo, u32 b_lo) {
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ks++)
        wgmma_ss<N>(acc, sw_desc_at(a_lo, k_step_off<A_ROWS>(ks)), sw_desc_at(b_lo, k_step_off<B_ROWS>(ks)), ks);
}

/* acc (64 x HEAD_DIM) += A B over STEPS k steps: A from registers (one
 * fragment a step), B at descriptor word b_lo: N-major, 16 rows a step;
 * with FP8 K-major (its rows are B's HEAD_DIM columns), 32 bytes a step. */
template <int STEPS> FA_DEV void wg_regs_by_rows(float (*acc)[4], u32 (*a)[AREGS], u32 b_lo) {
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
#ifdef FP8
        wgmma_rs<HEAD_DIM>(acc, a[s], sw_desc_at(b_lo, k_step_off<HEAD_DIM>(s)));
#else
        wgmma_rs<HEAD_DIM>(acc, a[s], sw_desc_at(b_lo, (u32)s * 16 * 128));
#endif
    }
}

/* Stores C fragment values (rows r0 + g and + 8, n-tile columns 8 j + 2 t,
 * + 1) into a swizzled tile of ROWS rows, rounded once: a warp's eight
 * rows land on eight different chunks of the banks. */
template <int ROWS> FA_DEV void store_c_sw(unsigned char *tile, int r0, int j, const float *c, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        *(u32 *)(tile + sw_off<ROWS>(r0 + g + 8 * hf, j) + t * 4) = pack2(c[2 * hf], c[2 * hf + 1]);
}

/* Copies through the generic proxy (cp.async) become visible to the
 * products' reads (async proxy) after this and a barrier. */
FA_DEV void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* Orders the registers an accumulator had before the products that use it. */
FA_DEV void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FA_DEV void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> FA_DEV void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
/* After wg_wait: no use of an accumulator moves above the wait. */
template <int GROUPS> FA_DEV void wg_hold(float (*d)[4]) {
#pragma unroll
    for (int j = 0; j < GROUPS; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e]));
}

/* After wg_wait: registers an in-flight product read as its A operand
 * stay untouched until then (the compiler does not know the product reads
 * them after the instruction has issued). */
template <int STEPS> FA_DEV void wg_keep(u32 (*a)[AREGS]) {
#pragma unroll
    for (int s = 0; s < STEPS; s++)
#pragma unroll
        for (int i = 0; i < AREGS; i++) asm volatile("" : "+r"(a[s][i]));
}

#endif
