/* Fragment layer, NVIDIA (the HIP-on-CUDA mapping, sm_80 and later):
 * mma.sync.aligned.m16n8k16.row.col with fp32 accumulators, ldmatrix for
 * the operand loads and cp.async for the tile copies, as inline PTX (NVRTC
 * compiles this behind hip_nvidia_prelude.h). The contract is mma_frag.h's.
 *
 * Lane l = 4 g + t (g = l / 4, t = l % 4), after the PTX ISA's fragment
 * figures for m16n8k16 with .f16 / .bf16 inputs:
 *   A (16 x 16, 8 elements)  element i: row g + 8 ((i / 2) % 2), column
 *                            2 t + i % 2 + 8 (i / 4)
 *   B (16 x 8, 4 elements)   element i: k 2 t + i % 2 + 8 (i / 2), column g
 *   C (16 x 8, 4 floats)     element e: row g + 8 (e / 2), column 2 t + e % 2
 * Scores are held untransposed (FA_OWN_N 0: a work-group's own rows run
 * along M): the four lanes of a group share rows g and g + 8 (xor 1, 2),
 * and two n-tiles of C side by side are, element for element, the A
 * operand of the 16 columns they cover. */

#define FA_LAYER_NAME "nvidia"
#define FA_SG 32
#define FA_M 16
#define FA_N 8
#define FA_K 16
#define FA_A_ELEMS 8
#define FA_B_ELEMS 4
#define FA_C_ELEMS 4

#define FA_A_ROW(l, i) ((l) / 4 + 8 * ((i) / 2 % 2))
#define FA_A_COL(l, i) (2 * ((l) % 4) + (i) % 2 + 8 * ((i) / 4))
#define FA_B_K(l, i) (2 * ((l) % 4) + (i) % 2 + 8 * ((i) / 2))
#define FA_B_N(l, i) ((l) / 4)
#define FA_C_ROW(l, e) ((l) / 4 + 8 * ((e) / 2))
#define FA_C_COL(l, e) (2 * ((l) % 4) + (e) % 2)

#define FA_OWN_N 0
#define FA_OWN_SLOTS 2
#define FA_OWN_SLOT(e) ((e) / 2)
#define FA_OWN_IDX(l, s) ((l) / 4 + 8 * (s))
#define FA_RED_STEPS 2
#define FA_RED_MASK(i) (1 << (i))

/* The P operand (A) of k-step ks: n-tiles 2 ks and 2 ks + 1 of the scores,
 * in the lane's own registers. */
#define FA_X2P_FRAG(ks, i) (2 * (ks) + (i) / 4)
#define FA_X2P_ELEM(ks, i) ((i) % 4)
#define FA_X2P_LANE(l, ks, i) (l)

/* Elements 2 j, 2 j + 1 are neighbouring columns of one row, the first
 * even: one Philox call serves both where keys run along N. */
#define FA_C_RUN_M 1
#define FA_C_RUN_N 2
/* Runs of elements a lane holds at consecutive k of one row of A (one
 * column of B), from an element index multiple of the run. */
#define FA_A_KRUN 2
#define FA_B_KRUN 2

#define FA_INSTR_F16 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define FA_INSTR_BF16 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"

/* Where lane l points ldmatrix (row, column of the tile relative to the
 * fragment's origin) for each load; checked on the host against the loads'
 * index functions through a model of ldmatrix (tests/mma_model.c). */
#define FA_LDSM_A_ROW(l) ((l) % 8 + 8 * ((l) / 8 % 2))   /* x4: A from [m][k] */
#define FA_LDSM_A_COL(l) (8 * ((l) / 16))
#define FA_LDSM_AT_ROW(l) ((l) % 8 + 8 * ((l) / 16))     /* x4.trans: A from [k][m] */
#define FA_LDSM_AT_COL(l) (8 * ((l) / 8 % 2))
#define FA_LDSM_BNK_ROW(l) ((l) % 8)                     /* x2: B from [n][k] */
#define FA_LDSM_BNK_COL(l) (8 * ((l) / 8 % 2))
#define FA_LDSM_BKN_ROW(l) ((l) % 16)                    /* x2.trans: B from [k][n] */
#define FA_LDSM_BKN_COL(l) 0
/* The x4 forms of the B loads: two fragments side by side along n (n0 and
 * n0 + 8) in one instruction, registers 0-1 the first, 2-3 the second. */
#define FA_LDSM_BNK2_ROW(l) ((l) % 8 + 8 * ((l) / 16))   /* x4: B pair from [n][k] */
#define FA_LDSM_BNK2_COL(l) (8 * ((l) / 8 % 2))
#define FA_LDSM_BKN2_ROW(l) ((l) % 16)                   /* x4.trans: B pair from [k][n] */
#define FA_LDSM_BKN2_COL(l) (8 * ((l) / 16))

#ifndef FA_HOST_MODEL

struct fa_a {
    fa_uint w[FA_A_ELEMS / 2];
};
struct fa_b {
    fa_uint w[FA_B_ELEMS / 2];
};
struct fa_c {
    float x[FA_C_ELEMS];
};

FA_FN fa_uint fa_smem_addr(const void *p) { return (fa_uint)__cvta_generic_to_shared(p); }

/* The shared-space address of tile[(r0 + row) ld + c0 + col] for ldmatrix:
 * the lane's part (row, col) converted first, the fragment's origin (r0,
 * c0: constants in the unrolled loops) added in bytes after, so that every
 * load of a tile shares one register and takes its origin as the
 * instruction's offset. Written the other way round, the compiler kept
 * an address register per origin. */
FA_FN fa_uint fa_ldsm_addr(const fa_ushort *tile, int ld, int row, int col, int r0, int c0) {
    return fa_smem_addr(tile + row * ld + col) + 2u * (fa_uint)(r0 * ld + c0);
}

#define FA_NATIVE_LOADS 1

FA_FN void fa_load_a(fa_a *a, const fa_ushort *tile, int ld, int r0, int k0, int lane) {
    const fa_uint addr = fa_ldsm_addr(tile, ld, FA_LDSM_A_ROW(lane), FA_LDSM_A_COL(lane), r0, k0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a->w[0]), "=r"(a->w[1]), "=r"(a->w[2]), "=r"(a->w[3])
                 : "r"(addr));
}

FA_FN void fa_load_a_t(fa_a *a, const fa_ushort *tile, int ld, int m0, int k0, int lane) {
    const fa_uint addr = fa_ldsm_addr(tile, ld, FA_LDSM_AT_ROW(lane), FA_LDSM_AT_COL(lane), k0, m0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a->w[0]), "=r"(a->w[1]), "=r"(a->w[2]), "=r"(a->w[3])
                 : "r"(addr));
}

FA_FN void fa_load_b_nk(fa_b *b, const fa_ushort *tile, int ld, int n0, int k0, int lane) {
    const int l = lane % 16; /* the x2 form reads lanes 0-15's addresses only */
    const fa_uint addr = fa_ldsm_addr(tile, ld, FA_LDSM_BNK_ROW(l), FA_LDSM_BNK_COL(l), n0, k0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(b->w[0]), "=r"(b->w[1])
                 : "r"(addr));
}

FA_FN void fa_load_b_kn(fa_b *b, const fa_ushort *tile, int ld, int k0, int n0, int lane) {
    const int l = lane % 16;
    const fa_uint addr = fa_ldsm_addr(tile, ld, FA_LDSM_BKN_ROW(l), FA_LDSM_BKN_COL(l), k0, n0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(b->w[0]), "=r"(b->w[1])
                 : "r"(addr));
}

/* B fragments n0 and n0 + FA_N (b[0], b[1]) in one ldmatrix x4: half the
 * load instructions of two x2 loads for the same bytes. */
#define FA_NATIVE_B2 1
FA_FN void fa_load_b_nk2(fa_b *b, const fa_ushort *tile, int ld, int n0, int k0, int lane) {
    const fa_uint addr = fa_ldsm_addr(tile, ld, FA_LDSM_BNK2_ROW(lane), FA_LDSM_BNK2_COL(lane), n0, k0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b[0].w[0]), "=r"(b[0].w[1]), "=r"(b[1].w[0]), "=r"(b[1].w[1])
                 : "r"(addr));
}

FA_FN void fa_load_b_kn2(fa_b *b, const fa_ushort *tile, int ld, int k0, int n0, int lane) {
    const fa_uint addr = fa_ldsm_addr(tile, ld, FA_LDSM_BKN2_ROW(lane), FA_LDSM_BKN2_COL(lane), k0, n0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b[0].w[0]), "=r"(b[0].w[1]), "=r"(b[1].w[0]), "=r"(b[1].w[1])
                 : "r"(addr));
}

FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b) {
#if defined(DTYPE_F16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c->x[0]), "+f"(c->x[1]), "+f"(c->x[2]), "+f"(c->x[3])
                 : "r"(a->w[0]), "r"(a->w[1]), "r"(a->w[2]), "r"(a->w[3]), "r"(b->w[0]), "r"(b->w[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c->x[0]), "+f"(c->x[1]), "+f"(c->x[2]), "+f"(c->x[3])
                 : "r"(a->w[0]), "r"(a->w[1]), "r"(a->w[2]), "r"(a->w[3]), "r"(b->w[0]), "r"(b->w[1]));
#endif
}

/* Two fp32 values as one word of 16-bit pairs (lo in the low half), rounded
 * to nearest even. */
#define FA_NATIVE_PACK 1
FA_FN fa_uint fa_pack2(float lo, float hi) {
    fa_uint r;
#if defined(DTYPE_F16)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

/* 2^x on the special-function unit (inputs here are <= 0 or -inf). */
#define FA_NATIVE_EXP2 1
FA_FN float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 16 (fa_copy4: 4) bytes global -> local without a stop in registers;
 * valid 0 writes zeros and reads nothing. fa_copy_commit closes a group of copies,
 * fa_copy_wait(n) waits until at most n groups are in flight (then a
 * barrier publishes them to the work-group). */
#define FA_NATIVE_COPY 1
FA_FN void fa_copy16(fa_ushort *dst, const fa_ushort *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(fa_smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
FA_FN void fa_copy4(float *dst, const float *src, int valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(fa_smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
FA_FN void fa_copy_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
#define fa_copy_wait(n) asm volatile("cp.async.wait_group " #n ";" ::: "memory")

/* Additions to dQ's fp32 accumulator: sm_90 adds two neighbouring floats
 * in one reduction. */
#define FA_NATIVE_ATOMIC 1
FA_FN void fa_atomic_add(float *p, float v) { atomicAdd(p, v); }
FA_FN void fa_atomic_add2(float *p, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

#endif /* FA_HOST_MODEL */
