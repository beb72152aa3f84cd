/* Hopper's asynchronous copy machinery for the warp-specialised kernels
 * (fwd_tma.cu): tensor-map copies (TMA) between global memory and the
 * swizzled shared tiles of wgmma.cuh, the transaction barriers (mbarrier)
 * that say when a copy has landed or a stage is free again, named
 * barriers between warpgroups, and the register budget a warpgroup hands
 * over to another (setmaxnreg).
 *
 * A tensor map is the driver's 128-byte description of a strided tensor
 * (cuTensorMapEncodeTiled, backends/cuda/cuda_tma.c): here always
 * {head_dim, tokens, heads, batch} elements, boxes of 64 head dimensions
 * (one 128-byte swizzled line a row) by a tile's rows. Rows outside the
 * tensor read as zeros and are never written. */
#ifndef FA_CUDA_TMA_CUH
#define FA_CUDA_TMA_CUH

#include "common.cuh"

struct __align__(64) fa_tensor_map {
    u64 words[16];
};

/* ------------------------------------------------------------------------ */
/* Transaction barriers                                                      */

FA_DEV void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the barriers' initialisation visible to the copy engine. */
FA_DEV void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/* The producer's arrival, announcing the bytes the phase's copies bring. */
FA_DEV void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
FA_DEV void mbar_arrive(u32 bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }

/* Waits until the phase of the given parity has completed. */
FA_DEV void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

/* ------------------------------------------------------------------------ */
/* Tensor-map copies                                                         */

FA_DEV void tma_prefetch_map(const fa_tensor_map *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)map) : "memory");
}

/* Box at (c0 head dimensions, c1 tokens, head c2, sequence c3) into the
 * shared tile at dst, completing bytes on barrier bar. */
FA_DEV void tma_load(u32 dst, const fa_tensor_map *map, int c0, int c1, int c2, int c3, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];\n" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

FA_DEV void tma_store(const fa_tensor_map *map, u32 src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     (u64)map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
FA_DEV void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* The stores have read their shared memory (it may be reused or freed). */
FA_DEV void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

/* Adds bytes of fp32 values in shared memory at src to global memory at
 * dst, element by element (the L2's reduction: no atomics issued by the
 * thread); both 16-byte aligned, bytes a multiple of 16. */
FA_DEV void bulk_reduce_add_f32(float *dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"((u64)dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
/* The thread's bulk groups have completed (their writes are done). */
FA_DEV void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

/* ------------------------------------------------------------------------ */
/* Warpgroups                                                                */

/* Named barrier id among count threads (id 0 is __syncthreads'). */
FA_DEV void named_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
FA_DEV void named_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

template <int REGS> FA_DEV void regs_shrink() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS> FA_DEV void regs_grow() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

#endif
