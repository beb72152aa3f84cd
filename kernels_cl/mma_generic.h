/* The fragment layer's operations written once on a layout's index
 * functions (mma_frag.h): all of them for an emulated layout
 * (FA_MMA_EMULATE), the ones a native layout leaves out otherwise (it
 * defines FA_NATIVE_LOADS, _LOADS2, _MMA, _SHFL, _PACK, _COPY, _C2A, _EXP2
 * for those it has).
 * The emulated instruction and shuffles exchange through the sub-group's
 * FA_SCR_WORDS words of local scratch between two work-group barriers. */

#ifndef FA_C_RUN
#define FA_C_RUN 1
#endif
#ifndef FA_KERNEL_ATTRS
#define FA_KERNEL_ATTRS
#endif

/* The xor masks of a row's lanes together: the lane with none of these
 * bits is the first of the lanes that share its rows. */
#define FA_RED_BIT_(i) (FA_RED_STEPS > (i) ? FA_RED_MASK(i) : 0)
#define FA_RED_ALL                                                             \
    (FA_RED_BIT_(0) | FA_RED_BIT_(1) | FA_RED_BIT_(2) | FA_RED_BIT_(3) | FA_RED_BIT_(4) | FA_RED_BIT_(5))

/* Scratch: an A and a B matrix of 16-bit values for the instruction, one
 * row slot's values of every lane for a shuffle, or every lane's A
 * fragment for an exchange of accumulators (fa_c_to_a across lanes). */
#if defined(FA_C2A_LANE) && !defined(FA_NATIVE_C2A)
#define FA_SCR_C2A (FA_SG * FA_A_WORDS)
#else
#define FA_SCR_C2A 0
#endif
#if !defined(FA_NATIVE_MMA) || !defined(FA_NATIVE_SHFL) || FA_SCR_C2A > 0
#define FA_SCR_WORDS FA_MMA_MAX(FA_MMA_MAX((FA_M * FA_K + FA_K * FA_N) / 2, FA_SG * FA_C_ROWS), FA_SCR_C2A)
#else
#define FA_SCR_WORDS 0
#endif

/* The kernel's declaration of the scratch of nsg sub-groups, and the
 * layer's view of work-item lid (after that declaration). */
#if FA_SCR_WORDS > 0
#define FA_FRAG_SCRATCH(nsg) __local uint fa_frag_scratch[(nsg) * FA_SCR_WORDS] __attribute__((aligned(16)))
#define FA_FRAG_CTX(lid) fa_frag_of((lid), fa_frag_scratch + (lid) / FA_SG * FA_SCR_WORDS)
#else
#define FA_FRAG_SCRATCH(nsg) (void)0
#define FA_FRAG_CTX(lid) fa_frag_of((lid), (__local uint *)0)
#endif

FA_FN fa_frag_ctx fa_frag_of(int lid, __local uint *scratch) {
    fa_frag_ctx c;
    c.lane = lid % FA_SG;
    c.sg = lid / FA_SG;
    c.scratch = scratch;
    return c;
}

#ifndef FA_NATIVE_LOADS
/* A fragment of `words` words from a local tile whose rows are indexed by
 * ROW(lane, element) from r0 and columns by COL from c0. */
#define FA_DEFINE_LOAD(name, frag, words, ROW, COL)                                        \
    FA_FN void name(frag *f, __local const ushort *tile, int ld, int r0, int c0, fa_frag_ctx ctx) { \
        const int l = ctx.lane;                                                            \
        FA_MMA_UNROLL for (int w = 0; w < (words); w++) {                                  \
            const uint lo = tile[(r0 + ROW(l, 2 * w)) * ld + c0 + COL(l, 2 * w)];          \
            const uint hi = tile[(r0 + ROW(l, 2 * w + 1)) * ld + c0 + COL(l, 2 * w + 1)];  \
            f->w[w] = lo | hi << 16;                                                       \
        }                                                                                  \
    }
FA_DEFINE_LOAD(fa_load_a, fa_a, FA_A_WORDS, FA_A_ROW, FA_A_COL)
FA_DEFINE_LOAD(fa_load_b_nk, fa_b, FA_B_WORDS, FA_B_N, FA_B_K)
FA_DEFINE_LOAD(fa_load_b_kn, fa_b, FA_B_WORDS, FA_B_K, FA_B_N)
#endif

#ifndef FA_NATIVE_LOADS2
FA_FN void fa_load_b2_nk(fa_b *b0, fa_b *b1, __local const ushort *tile, int ld, int n0, int k0, fa_frag_ctx ctx) {
    fa_load_b_nk(b0, tile, ld, n0, k0, ctx);
    fa_load_b_nk(b1, tile, ld, n0 + FA_N, k0, ctx);
}
FA_FN void fa_load_b2_kn(fa_b *b0, fa_b *b1, __local const ushort *tile, int ld, int k0, int n0, fa_frag_ctx ctx) {
    fa_load_b_kn(b0, tile, ld, k0, n0, ctx);
    fa_load_b_kn(b1, tile, ld, k0, n0 + FA_N, ctx);
}
#endif

#ifndef FA_SG_UNIFORM_OPS
#define FA_SG_UNIFORM_OPS 0
#endif

#ifndef FA_NATIVE_EXP2
FA_FN float fa_exp2(float x) { return exp2(x); }
#endif

#ifndef FA_NATIVE_MMA
/* Every lane lays its elements of A and B out in full matrices, then
 * computes its own accumulator elements from them, k in order. */
FA_FN void fa_mma(fa_c *c, const fa_a *a, const fa_b *b, fa_frag_ctx ctx) {
    __local ushort *sa = (__local ushort *)ctx.scratch, *sb = sa + FA_M * FA_K;
    const int l = ctx.lane;
    for (int i = 0; i < 2 * FA_A_WORDS; i++) sa[FA_A_ROW(l, i) * FA_K + FA_A_COL(l, i)] = fa_word_half(a->w[i / 2], i);
    for (int i = 0; i < 2 * FA_B_WORDS; i++) sb[FA_B_K(l, i) * FA_N + FA_B_N(l, i)] = fa_word_half(b->w[i / 2], i);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = 0; e < FA_C_ELEMS; e++) {
        const int r = FA_C_ROW(l, e), n = FA_C_COL(l, e);
        float acc = c->x[e];
        for (int k = 0; k < FA_K; k++) acc = fma(fa_h2f(sa[r * FA_K + k]), fa_h2f(sb[k * FA_N + n]), acc);
        c->x[e] = acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

#ifndef FA_NATIVE_SHFL
/* n <= FA_C_ROWS values. */
FA_FN void fa_shfl_xor(float *v, int n, int mask, fa_frag_ctx ctx) {
    __local float *s = (__local float *)ctx.scratch;
    for (int i = 0; i < n; i++) s[i * FA_SG + ctx.lane] = v[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < n; i++) v[i] = s[i * FA_SG + (ctx.lane ^ mask)];
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

#ifndef FA_NATIVE_PACK
FA_FN uint fa_pack2(float lo, float hi) { return (uint)fa_f2h(lo) | (uint)fa_f2h(hi) << 16; }
#endif

#ifndef FA_NATIVE_COPY
/* 16 bytes global -> local (valid 0: zeros); fa_copy_wait: all copies of
 * this work-item have landed (the caller's barrier then publishes them). */
FA_FN void fa_copy16(__local ushort *dst, __global const ushort *src, int valid) {
    *(__local uint4 *)dst = valid ? *(__global const uint4 *)src : (uint4)(0u);
}
FA_FN void fa_copy_wait(void) {}
#endif

/* The maxima and sums of a lane's FA_C_ROWS row slots over the lanes that
 * share each row. */
FA_FN void fa_rows_max(float *v, fa_frag_ctx ctx) {
    FA_MMA_UNROLL for (int step = 0; step < FA_RED_STEPS; step++) {
        float o[FA_C_ROWS];
        FA_MMA_UNROLL for (int s = 0; s < FA_C_ROWS; s++) o[s] = v[s];
        fa_shfl_xor(o, FA_C_ROWS, FA_RED_MASK(step), ctx);
        FA_MMA_UNROLL for (int s = 0; s < FA_C_ROWS; s++) v[s] = fmax(v[s], o[s]);
    }
}

FA_FN void fa_rows_sum(float *v, fa_frag_ctx ctx) {
    FA_MMA_UNROLL for (int step = 0; step < FA_RED_STEPS; step++) {
        float o[FA_C_ROWS];
        FA_MMA_UNROLL for (int s = 0; s < FA_C_ROWS; s++) o[s] = v[s];
        fa_shfl_xor(o, FA_C_ROWS, FA_RED_MASK(step), ctx);
        FA_MMA_UNROLL for (int s = 0; s < FA_C_ROWS; s++) v[s] += o[s];
    }
}

#if FA_C2A_REGS && !defined(FA_C2A_LANE)
/* The A fragment of k-step ks from the accumulators c[] of a row strip's
 * n-tiles, rounded to the storage dtype: every element is the lane's own. */
FA_FN void fa_c_to_a(fa_a *a, const fa_c *c, int ks, fa_frag_ctx ctx) {
    (void)ctx;
    FA_MMA_UNROLL for (int w = 0; w < FA_A_WORDS; w++)
        a->w[w] = fa_pack2(c[FA_C2A_TILE(ks, 2 * w)].x[FA_C2A_ELEM(ks, 2 * w)],
                           c[FA_C2A_TILE(ks, 2 * w + 1)].x[FA_C2A_ELEM(ks, 2 * w + 1)]);
}
#elif FA_C2A_REGS && !defined(FA_NATIVE_C2A)
/* Across lanes: every lane puts the element each A slot takes from it, as
 * 16 bits, beside the other lanes'; then reads its slots from the lanes
 * FA_C2A_LANE names. */
FA_FN void fa_c_to_a(fa_a *a, const fa_c *c, int ks, fa_frag_ctx ctx) {
    __local ushort *s = (__local ushort *)ctx.scratch;
    const int l = ctx.lane;
    for (int i = 0; i < 2 * FA_A_WORDS; i++) s[i * FA_SG + l] = fa_f2h(c[FA_C2A_TILE(ks, i)].x[FA_C2A_ELEM(ks, i)]);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = 0; w < FA_A_WORDS; w++)
        a->w[w] = (uint)s[2 * w * FA_SG + FA_C2A_LANE(l, ks, 2 * w)] |
                  (uint)s[(2 * w + 1) * FA_SG + FA_C2A_LANE(l, ks, 2 * w + 1)] << 16;
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif
