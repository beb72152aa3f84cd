/* Intel XMX (Xe-HPG: Arc, Flex; Xe-LPG+ with XMX): DPAS 8x8x16 through
 * cl_intel_subgroup_matrix_multiply_accumulate, intel_sub_group_f16_f16_
 * and _bf16_bf16_matrix_mad_k16 with fp32 accumulators, at sub-group size
 * 8 (cl_intel_required_subgroup_size). See mma_frag.h for the contract.
 *
 * The built-in (the extension's specification, M = 8): `a` is 8 rows of
 * 16 k, a work-item giving two 16-bit values (k = 2 l, 2 l + 1) of each
 * row as one int; `b` is one column (n = l) of 16 k, two values an int;
 * the result is one column of 8 rows, component m of work-item l being
 * row m. This layer runs it on swapped operands, D^T = B^T A^T, so that a
 * lane holds a whole row of C and no row needs an exchange:
 *   A (8 x 16, 8 words)   lane l: row l, element i is column i
 *   B (16 x 8, 8 words)   lane l: rows (k) 2 l and 2 l + 1, element i is
 *                         row 2 l + i % 2 of column i / 2
 *   C (8 x 8, 8 floats)   lane l: row l, element e is column e
 * Two n-tiles of C side by side are, element for element, the A fragment
 * of the 16 columns they cover. */

#define FA_SG 8
#define FA_M 8
#define FA_N 8
#define FA_K 16
#define FA_A_WORDS 8
#define FA_B_WORDS 8
#define FA_C_ELEMS 8
#define FA_C_ROWS 1

#define FA_A_ROW(l, i) (l)
#define FA_A_COL(l, i) (i)
#define FA_B_K(l, i) (2 * (l) + (i) % 2)
#define FA_B_N(l, i) ((i) / 2)
#define FA_C_ROW(l, e) (l)
#define FA_C_COL(l, e) (e)
#define FA_C_SLOT(e) 0
#define FA_C_SLOT_ROW(l, s) (l)
#define FA_C_RUN 4

#define FA_RED_STEPS 0
#define FA_RED_MASK(i) 0

#define FA_C2A_REGS 1
#define FA_C2A_TILE(ks, i) (2 * (ks) + (i) / 8)
#define FA_C2A_ELEM(ks, i) ((i) % 8)

/* The built-ins as tests/mma_model.c names them, run on swapped operands. */
#define FA_INSTR_F16 "intel_sub_group_f16_f16_matrix_mad_k16"
#define FA_INSTR_BF16 "intel_sub_group_bf16_bf16_matrix_mad_k16"
#define FA_SWAPPED 1

#ifndef FA_HOST_MODEL
FA_DECLARE_FRAGMENTS();
#endif

#if !defined(FA_HOST_MODEL) && !defined(FA_MMA_EMULATE)

/* The built-ins are declared where the compiler defines the extension's
 * macro (an offline compiler may need it as a build option). */
#ifndef cl_intel_subgroup_matrix_multiply_accumulate
#error "mma_intel.h: the compiler offers no cl_intel_subgroup_matrix_multiply_accumulate"
#endif

#define FA_KERNEL_ATTRS __attribute__((intel_reqd_sub_group_size(8)))

#define FA_NATIVE_MMA 1
FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b, fa_frag_ctx ctx) {
    (void)ctx;
    const int8 ta = as_int8(vload8(0, b->w)), tb = as_int8(vload8(0, a->w));
    float8 acc = vload8(0, c->x);
#if defined(DTYPE_F16)
    acc = intel_sub_group_f16_f16_matrix_mad_k16(ta, tb, acc);
#else
    acc = intel_sub_group_bf16_bf16_matrix_mad_k16(ta, tb, acc);
#endif
    vstore8(acc, 0, c->x);
}

/* No row is shared between lanes; the shuffle stays for the contract. */
#define FA_NATIVE_SHFL 1
FA_FN void fa_shfl_xor(float *v, int n, int mask, fa_frag_ctx ctx) {
    (void)ctx;
    for (int i = 0; i < n; i++) v[i] = intel_sub_group_shuffle_xor(v[i], (uint)mask);
}

#endif
