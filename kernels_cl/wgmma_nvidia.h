/* Hopper's warpgroup products (wgmma) for NVIDIA's layer, shared by the
 * forward and backward kernels that take them (fwd_mma.cl FA_FWD_WGMMA,
 * bwd_mma.cl FA_BWD_WGMMA). NVIDIA's OpenCL writes PTX for .target sm_90,
 * where ptxas refuses wgmma: the lines are written as PTX comments with
 * core/ptx_patch.h's marker (FA_SM90A), which the backend unmasks in the
 * source build's PTX and builds again for sm_90a (cl_build.c, programs
 * built with FA_NV_SM90A; nothing here without it).
 *
 * Operands a product reads from local memory are tiles of 64-element
 * (128-byte) rows whose 16-byte chunks are swizzled (chunk c of row r at
 * c ^ (r % 8)), a head dimension past 64 in a second block of the tile's
 * rows; a 64 x N accumulator is N / 8 n-tiles of mma.sync's per sub-group
 * (a sub-group holds 16 of its 64 rows), as are its A fragments from
 * registers. */
#ifdef FA_NV_SM90A
#ifdef DTYPE_BF16
#define FA_WG_T "bf16"
#else
#define FA_WG_T "f16"
#endif
#define FA_SW_ROW 64 /* elements of a swizzled row */
/* Descriptor of a K-major operand at shared address addr: 128-byte
 * swizzle, 8-row groups 1024 bytes apart. */
FA_FN ulong fa_wg_desc(uint addr) {
    return (ulong)((addr & 0x3FFFFu) >> 4) | (ulong)1 << 16 | (ulong)(1024 >> 4) << 32 | (ulong)1 << 62;
}

/* Descriptor of an N-major operand (read transposed) at addr, in a
 * swizzled tile of rows rows: k-steps of 16 rows 2048 bytes apart, the
 * second 64 columns rows * 128 bytes further. */
FA_FN ulong fa_wg_desc_n(uint addr, int rows) {
    return (ulong)((addr & 0x3FFFFu) >> 4) | (ulong)((rows * 128) >> 4) << 16 | (ulong)(1024 >> 4) << 32 | (ulong)1 << 62;
}

/* Rows [0, rows) of a HEAD_DIM-wide operand into a swizzled tile of rows
 * rows: a work-item copies the same chunk of every (FA_THREADS /
 * D_CHUNKS)-th row, a multiple of 8 rows apart, so its swizzled place
 * moves by whole rows. */
#if (FA_THREADS / D_CHUNKS) % 8 == 0
FA_FN void fa_fetch_rows_sw(__local ushort *dst, __global const ushort *src, long stride, int rows, int valid,
                            int lid) {
    const int rstep = FA_THREADS / D_CHUNKS, c = lid % D_CHUNKS, r0 = lid / D_CHUNKS;
    __global const ushort *s = src + (long)r0 * stride + c * 8;
    __local ushort *d = dst + (D_CHUNKS > 8 ? (c / 8) * rows * FA_SW_ROW : 0) + r0 * FA_SW_ROW +
                        (((c % 8) ^ (r0 & 7)) * 8);
    FA_MMA_UNROLL for (int i = 0; i < rows / rstep; i++) {
        const int ok = r0 + i * rstep < valid;
        fa_copy16(d + i * rstep * FA_SW_ROW, s, ok);
        s += (long)rstep * stride;
    }
}
#endif

/* The accumulator operands of a 64 x N product (N / 8 n-tiles of four),
 * the PTX lists naming them (%0 on), an A fragment's words, and the
 * masked lines (FA_SM90A: core/ptx_patch.h's FA_PTX_SM90A_MARK). */
#define FA_WG_ACC4(a, j) "+f"((a)[j].x[0]), "+f"((a)[j].x[1]), "+f"((a)[j].x[2]), "+f"((a)[j].x[3])
#define FA_WG_ACC16(a) FA_WG_ACC4(a, 0), FA_WG_ACC4(a, 1), FA_WG_ACC4(a, 2), FA_WG_ACC4(a, 3)
#define FA_WG_ACC32(a) FA_WG_ACC16(a), FA_WG_ACC4(a, 4), FA_WG_ACC4(a, 5), FA_WG_ACC4(a, 6), FA_WG_ACC4(a, 7)
#define FA_WG_D16 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FA_WG_D32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_WG_ACC64(a)                                                                                          \
    FA_WG_ACC32(a), FA_WG_ACC4(a, 8), FA_WG_ACC4(a, 9), FA_WG_ACC4(a, 10), FA_WG_ACC4(a, 11), FA_WG_ACC4(a, 12), \
        FA_WG_ACC4(a, 13), FA_WG_ACC4(a, 14), FA_WG_ACC4(a, 15)
#define FA_WG_D64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
    "%59, %60, %61, %62, %63}"
#define FA_WG_A(f) "r"((f).w[0]), "r"((f).w[1]), "r"((f).w[2]), "r"((f).w[3])
#define FA_WG_STEPS (HEAD_DIM / 16) /* k-steps over the head dimensions */
/* Byte offset of k-step s of a K-major swizzled tile of ROWS rows (the
 * second 64 columns a block further). */
#define FA_WG_KOFF(ROWS, s) ((uint)((s) / 4) * (uint)(ROWS) * 128u + (uint)((s) % 4) * 32u)
#define FA_SM90A "// @sm_90a "
#define FA_WG_FENCE FA_SM90A "wgmma.fence.sync.aligned;\n\t"
#define FA_WG_DONE FA_SM90A "wgmma.commit_group.sync.aligned;\n\t" FA_SM90A "wgmma.wait_group.sync.aligned 0;"
#define FA_WG_OP(n) FA_SM90A "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." FA_WG_T "." FA_WG_T " "

/* Two k-steps of a product whose A fragments come from registers, into a
 * 64 x 32 (PAIR16) or 64 x 64 (PAIR32) accumulator: operands the
 * accumulator, A's two fragments, B's two descriptors. */
#define FA_WG_RS_PAIR16                                                                                         \
    FA_WG_OP(32) FA_WG_D16 ", {%16, %17, %18, %19}, %24, 1, 1, 1, 0;\n\t" FA_WG_OP(32) FA_WG_D16                   \
                           ", {%20, %21, %22, %23}, %25, 1, 1, 1, 0;"
#define FA_WG_RS_PAIR32                                                                                         \
    FA_WG_OP(64) FA_WG_D32 ", {%32, %33, %34, %35}, %40, 1, 1, 1, 0;\n\t" FA_WG_OP(64) FA_WG_D32                   \
                           ", {%36, %37, %38, %39}, %41, 1, 1, 1, 0;"

/* Defines name(acc, a, tile): acc (this sub-group's 16 rows of the 64)
 * += A B^T over the HEAD_DIM head dimensions, A's fragments from registers
 * (a[s], k-step s), B K-major from its swizzled tile of ROWS rows; two
 * k-steps an asm statement (operand counts), the fence in the first and
 * the wait in the last. PAIR and ACC: the accumulator's width
 * (FA_WG_RS_PAIR16 and FA_WG_ACC16, or the 32s). */
#define FA_WG_RS_OVER_DIMS(name, PAIR, ACC, ROWS)                                                              \
    FA_FN void name(fa_c *acc, const fa_a *a, __local const ushort *tile) {                                      \
        const uint ta = fa_shared_addr(tile);                                                                    \
        ulong db[FA_WG_STEPS];                                                                                   \
        FA_MMA_UNROLL for (int s = 0; s < FA_WG_STEPS; s++) db[s] = fa_wg_desc(ta + FA_WG_KOFF(ROWS, s));         \
        __asm__ __volatile__(FA_WG_FENCE PAIR                                                                    \
                             : ACC(acc)                                                                          \
                             : FA_WG_A(a[0]), FA_WG_A(a[1]), "l"(db[0]), "l"(db[1])                              \
                             : "memory");                                                                        \
        FA_MMA_UNROLL for (int k = 2; k < FA_WG_STEPS - 2; k += 2)                                               \
            __asm__ __volatile__(PAIR                                                                            \
                                 : ACC(acc)                                                                      \
                                 : FA_WG_A(a[k]), FA_WG_A(a[k + 1]), "l"(db[k]), "l"(db[k + 1])                  \
                                 : "memory");                                                                    \
        __asm__ __volatile__(PAIR "\n\t" FA_WG_DONE                                                               \
                             : ACC(acc)                                                                          \
                             : FA_WG_A(a[FA_WG_STEPS - 2]), FA_WG_A(a[FA_WG_STEPS - 1]), "l"(db[FA_WG_STEPS - 2]), \
                               "l"(db[FA_WG_STEPS - 1])                                                          \
                             : "memory");                                                                        \
    }

#if HEAD_DIM == 64 || HEAD_DIM == 128
/* A product of 16 rows by HEAD_DIM columns with A from registers and B
 * read N-major: its accumulator operands and instruction (A's words and
 * B's descriptor after the accumulator). */
#if HEAD_DIM == 64
#define FA_WG_ACC_D FA_WG_ACC32
#define FA_WG_RS_D FA_WG_OP(64) FA_WG_D32 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;"
#else
#define FA_WG_ACC_D FA_WG_ACC64
#define FA_WG_RS_D FA_WG_OP(128) FA_WG_D64 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;"
#endif

/* Defines name(acc, a, tile): acc (this sub-group's 16 rows x HEAD_DIM)
 * += A B over STEPS k-steps, A's fragments from registers (a[s]), B the
 * first 16 STEPS rows of a swizzled tile of ROWS rows read N-major (16
 * rows, 2048 bytes, a k-step); one k-step an asm statement (operand
 * counts), the fence in the first and the wait in the last. */
#define FA_WG_RS_OVER_ROWS(name, STEPS, ROWS)                                                                   \
    FA_FN void name(fa_c *acc, const fa_a *a, __local const ushort *tile) {                                      \
        const uint ta = fa_shared_addr(tile);                                                                    \
        ulong db[STEPS];                                                                                         \
        FA_MMA_UNROLL for (int s = 0; s < (STEPS); s++) db[s] = fa_wg_desc_n(ta + 2048u * (uint)s, ROWS);         \
        __asm__ __volatile__(FA_WG_FENCE FA_WG_RS_D : FA_WG_ACC_D(acc) : FA_WG_A(a[0]), "l"(db[0]) : "memory");    \
        FA_MMA_UNROLL for (int s = 1; s < (STEPS) - 1; s++)                                                      \
            __asm__ __volatile__(FA_WG_RS_D : FA_WG_ACC_D(acc) : FA_WG_A(a[s]), "l"(db[s]) : "memory");           \
        __asm__ __volatile__(FA_WG_RS_D "\n\t" FA_WG_DONE                                                          \
                             : FA_WG_ACC_D(acc)                                                                  \
                             : FA_WG_A(a[(STEPS) - 1]), "l"(db[(STEPS) - 1])                                     \
                             : "memory");                                                                        \
    }
#endif

/* Copies a work-item made (cp.async) seen by the warpgroup products. */
FA_FN void fa_wg_fence(void) { __asm__ __volatile__("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif
