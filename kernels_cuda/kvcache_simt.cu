/* A KV-cache step on the FP32 pipes (fa_forward_kvcache where the
 * tensor-core decoding kernel, decode.cu, does not run it: fp32, head dims
 * that are not multiples of 16): any dtype, any head_dim multiple of 8, any
 * architecture. Built with KV_CACHE and kvcache.cuh's options, and simt.cu's
 * tile shape (BR packed rows, BC keys, TR x TC micro-tiles). Kernels, in the
 * order backends/cuda/cuda_attention.c launches them:
 *
 *   fa_kv_prepare   one block per sequence: its lengths, rotary positions
 *                   and pages against the rules (kvcache.cuh), status[b] = 1
 *                   where they hold; for such a sequence the step's new
 *                   keys (rotated, rounded once as stored) and values
 *                   written into the cache. The launches after it read
 *                   status, so a sequence that breaks the rules appends
 *                   nothing, gets NaN rows, and no index is formed from its
 *                   data.
 *   fa_kv_attend    one block per (row tile, KV head, sequence x key split):
 *                   the query rows of the KV head's GQA group packed (row =
 *                   token * group + head in the group), so the group's heads
 *                   and tokens share every K/V tile; simt.cu's forward
 *                   otherwise (Q rotated and rounded to q's dtype as it is
 *                   loaded, the score options in the header's order, online
 *                   softmax in base 2). Keys come through the block table
 *                   or from the contiguous cache, the new ones from where
 *                   fa_kv_prepare wrote them (its launch has finished).
 *                   Shared memory, fa_plan_local_mem's SIMT forward:
 *                   Qt [D][BR], Kt [D][BC], Vs [BC][D], Pt [BC][BR].
 *   fa_splitk_merge (rowwise.cuh) with SPLITK.
 *
 * Sizes: packed rows (group x seqlen_q) below INT_MAX / 2 (the host checks),
 * key positions below seqlen_k < 2^31; element indices in 64 bits. */
#include "rowwise.cuh"
#include "common.cuh"
#include "simt_tiles.cuh"
#include "kvcache.cuh"

#if !defined(KV_CACHE) || !defined(FWD) || defined(VARLEN) || defined(DROPOUT) || defined(BLOCK_MASK)
#error "kvcache_simt.cu: a KV-cache step (KV_CACHE, FWD), fixed-length batches, no dropout or block mask"
#endif

#define NTR (BR / TR)
#define NTC (BC / TC)
#define WG (NTR * NTC)
#define D8 (HEAD_DIM / 8)
#define DPT ((HEAD_DIM + NTC - 1) / NTC)
#define PREP_THREADS 128 /* cuda_attention.c launches fa_kv_prepare with as many */

#if HEAD_DIM % NTC == 0
#define DIM_OK(x) true
#else
#define DIM_OK(x) ((x) < HEAD_DIM)
#endif

/* Token and head-in-group of packed row pr. */
FA_DEV void kv_unpack(int pr, int group, int *tok, int *gh) {
    *tok = pr / group;
    *gh = pr - *tok * group;
}

/* Element index of token j, head hk, dimension 0 of a cache tensor of a
 * sequence that keeps the rules (its pages are in the pool). */
#ifdef PAGED
#define CACHE_ROW(off, sb, ss, sh, kv, b, j, hk) cache_row(off, sb, ss, sh, __ldg(table_entry(kv, b, j)), j, hk)
#else
#define CACHE_ROW(off, sb, ss, sh, kv, b, j, hk) cache_row(off, sb, ss, sh, b, j, hk)
#endif

extern "C" __global__ void __launch_bounds__(PREP_THREADS) fa_kv_prepare(const fa_params p, const fa_kv_params kv) {
    const int b = blockIdx.x, tid = threadIdx.x;
    const fa_kv_seq s = kv_seq_of(p, kv, b);
    bool bad = s.bad; /* the same for the whole block */
#ifdef PAGED
    if (!bad) {
        const int npg = s.len_k / PAGED + (s.len_k % PAGED != 0);
        bad = __syncthreads_or(pages_bad(kv, b, 0, npg, tid, PREP_THREADS)) != 0;
    }
#endif
    if (tid == 0) kv.status[b] = bad ? 0 : 1;
#ifdef APPEND
    if (bad) return;
    const int heads_kv = p.heads_q / p.group;
    const i64 groups = (i64)kv.seqlen_new * heads_kv * D8;
    for (i64 e = tid; e < groups; e += PREP_THREADS) {
        const int x0 = (int)(e % D8) * 8;
        const i64 th = e / D8;
        const int hk = (int)(th % heads_kv), n = (int)(th / heads_kv), j = s.cs + n;
        const elem_t *krow = (const elem_t *)kv.k_new + kv.kn_off + (i64)b * kv.kn_sb + (i64)n * kv.kn_ss +
                             (i64)hk * kv.kn_sh;
        const elem_t *vrow = (const elem_t *)kv.v_new + kv.vn_off + (i64)b * kv.vn_sb + (i64)n * kv.vn_ss +
                             (i64)hk * kv.vn_sh;
        const i64 kr = CACHE_ROW(p.k_off, p.k_sb, p.k_ss, p.k_sh, kv, b, j, hk);
        const i64 vr = CACHE_ROW(p.v_off, p.v_sb, p.v_ss, p.v_sh, kv, b, j, hk);
        float v[8];
#ifdef ROTARY_DIM
        rotary8(krow, x0, j, kv, v);
#else
        load8(krow + x0, v);
#endif
        store8((elem_t *)p.k + kr + x0, v);
        load8(vrow + x0, v);
        store8((elem_t *)p.v + vr + x0, v);
    }
#endif
}

extern "C" __global__ void __launch_bounds__(WG) fa_kv_attend(const fa_params p, const fa_kv_params kv) {
    extern __shared__ __align__(16) float fsm[];
    float *Qt = fsm, *Kt = Qt + HEAD_DIM * BR, *Vs = Kt + HEAD_DIM * BC, *Pt = Vs + BC * HEAD_DIM;

    const int lid = threadIdx.x, tr = lid / NTC, tc = lid % NTC;
    const int hk = blockIdx.y, group = p.group;
#ifdef SPLITK
    const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
#else
    const int b = blockIdx.z;
#endif
    const int rows_total = group * p.seqlen_q, pr0 = blockIdx.x * BR;
    if (pr0 >= rows_total) return;
    fa_seq seq;
    seq.len_q = p.seqlen_q;
    seq.len_k = 0;
    seq.start_q = (i64)b * p.seqlen_q;
    seq.start_k = 0;

    /* This thread's rows: token (-1 for padding) and query head. */
    int row_tok[TR], row_h[TR];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        const int pr = pr0 + tr * TR + i;
        int tok = -1, gh = 0;
        if (pr < rows_total) kv_unpack(pr, group, &tok, &gh);
        row_tok[i] = tok;
        row_h[i] = hk * group + gh;
    }

    /* A sequence that breaks the rules: NaN rows, nothing read (the whole
     * block leaves here: no barrier is missed). */
    if (!__ldg(kv.status + b)) {
#pragma unroll
        for (int i = 0; i < TR; i++) {
            if (row_tok[i] < 0) continue;
#ifdef SPLITK
            const i64 row = (i64)(split * p.heads_q + row_h[i]) * p.total_q + seq.start_q + row_tok[i];
#pragma unroll
            for (int u = 0; u < DPT; u++) {
                const int x = tc + u * NTC;
                if (DIM_OK(x)) p.part_o[row * HEAD_DIM + x] = FA_NAN;
            }
            if (tc == 0) p.part_l[row] = FA_NAN;
#else
            elem_t *orow = (elem_t *)p.o + O_ROW(p, b, seq, row_tok[i], row_h[i]);
#pragma unroll
            for (int u = 0; u < DPT; u++) {
                const int x = tc + u * NTC;
                if (DIM_OK(x)) orow[x] = from_f32(FA_NAN);
            }
            if (tc == 0 && p.lse) p.lse[lse_index(p, b, row_h[i], row_tok[i], seq.start_q)] = FA_NAN;
#endif
        }
        return;
    }
    const int cs = __ldg(kv.cache_seqlens + b);
    seq.len_k = cs + kv.seqlen_new;
    const fa_mask mask = mask_of(p, seq);

    /* Q rows, rotated at cs + token (a causal mask or a window) or cs, and
     * rounded once to q's dtype as the tensor-core step rounds them. */
    for (int e = lid; e < BR * D8; e += WG) {
        const int r = e / D8, x0 = (e % D8) * 8, pr = pr0 + r;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (pr < rows_total) {
            int tok, gh;
            kv_unpack(pr, group, &tok, &gh);
            const elem_t *qrow = (const elem_t *)p.q + Q_ROW(p, b, seq, tok, hk * group + gh);
#ifdef ROTARY_DIM
#if defined(CAUSAL) || defined(WINDOW)
            rotary8(qrow, x0, cs + tok, kv, v);
#else
            rotary8(qrow, x0, cs, kv, v);
#endif
            if (x0 < ROTARY_DIM)
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = to_f32(from_f32(v[i]));
#else
            load8(qrow + x0, v);
#endif
        }
        store8_t(Qt, BR, x0, r, v);
    }

    const int tok_lo = pr0 / group, tok_hi = (min(pr0 + BR, rows_total) - 1) / group;
    int k_lo, k_hi, t_begin, t_end;
    key_range(mask, tok_lo, tok_hi, &k_lo, &k_hi);
    tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    split_tiles(split, p.num_splits, &t_begin, &t_end);
#endif

#ifdef SCORE_OPTIONS
    const float sl2 = FA_LOG2E;
#else
    const float sl2 = p.scale_log2;
#endif
#ifdef ALIBI
    /* Per row: its head's slope and the key on its diagonal, tok + len_k -
     * len_q (distances |diag - key|, bottom-right aligned). */
    float slope[TR];
    int diag[TR];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        slope[i] = row_tok[i] >= 0 ? __ldg(kv.alibi + row_h[i]) : 0.0f;
        diag[i] = row_tok[i] >= 0 ? (seq.len_k - seq.len_q) + row_tok[i] : 0;
    }
#endif

    float m[TR], l[TR], acc[TR][DPT];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        m[i] = -FA_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int u = 0; u < DPT; u++) acc[i][u] = 0.0f;
    }

    const elem_t *kg = (const elem_t *)p.k, *vg = (const elem_t *)p.v;
    for (int t = t_begin; t < t_end; t++) {
        const int k0 = t * BC;
        for (int e = lid; e < BC * D8; e += WG) {
            const int c = e / D8, x0 = (e % D8) * 8;
            float kk[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (c < seq.len_k - k0) {
                const int j = k0 + c;
                load8(kg + CACHE_ROW(p.k_off, p.k_sb, p.k_ss, p.k_sh, kv, b, j, hk) + x0, kk);
                load8(vg + CACHE_ROW(p.v_off, p.v_sb, p.v_ss, p.v_sh, kv, b, j, hk) + x0, vv);
            }
            store8_t(Kt, BC, x0, c, kk);
            store8_row(Vs + c * HEAD_DIM + x0, vv);
        }
        __syncthreads();

        float s[TR][TC];
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TC; j++) s[i][j] = 0.0f;
#pragma unroll 4
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], bk[TC];
            lds_n<TR>(a, Qt + x * BR + tr * TR);
            lds_n<TC>(bk, Kt + x * BC + tc * TC);
#pragma unroll
            for (int i = 0; i < TR; i++)
#pragma unroll
                for (int j = 0; j < TC; j++) s[i][j] = fmaf(a[i], bk[j], s[i][j]);
        }
        /* The score options in the header's order, then the masks; the
         * softmax in base 2. Padding rows are never stored. */
        const bool full = tile_full(p, mask, 0, t, tok_lo, k0, tok_hi - tok_lo + 1, BC, ROWS_STORED);
#pragma unroll
        for (int j = 0; j < TC; j++) {
            const int c = tc * TC + j;
            float col[TR];
#pragma unroll
            for (int i = 0; i < TR; i++) {
#ifdef SCORE_OPTIONS
                float x = s[i][j] * p.scale;
#ifdef SOFTCAP
                x = kv.softcap * fa_tanh(x * kv.softcap_inv);
#endif
#ifdef ALIBI
                x = fmaf(-slope[i], fabsf((float)((diag[i] - k0) - c)), x);
#endif
                x *= sl2;
#else
                float x = s[i][j] * sl2;
#endif
                if (!full && (row_tok[i] < 0 || !visible_left(mask, seq.len_q - row_tok[i], (seq.len_k - k0) - c)))
                    x = -FA_INF;
                s[i][j] = x;
                col[i] = x;
            }
            sts_n<TR>(Pt + c * BR + tr * TR, col);
        }
        __syncthreads();

        /* Row maxima over the whole tile; a row that has seen no visible key
         * keeps m = -inf and exponentiates against 0 (no inf - inf). */
        float alpha[TR], m_use[TR], mx[TR];
#pragma unroll
        for (int i = 0; i < TR; i++) mx[i] = m[i];
        for (int c = 0; c < BC; c++) {
            float pc[TR];
            lds_n<TR>(pc, Pt + c * BR + tr * TR);
#pragma unroll
            for (int i = 0; i < TR; i++) mx[i] = fmaxf(mx[i], pc[i]);
        }
#pragma unroll
        for (int i = 0; i < TR; i++) {
            m_use[i] = mx[i] == -FA_INF ? 0.0f : mx[i];
            alpha[i] = fa_exp2(m[i] - m_use[i]);
            m[i] = mx[i];
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < TC; j++) {
            float col[TR];
#pragma unroll
            for (int i = 0; i < TR; i++) col[i] = fa_exp2(s[i][j] - m_use[i]);
            sts_n<TR>(Pt + (tc * TC + j) * BR + tr * TR, col);
        }
        __syncthreads();

#pragma unroll
        for (int i = 0; i < TR; i++) {
            l[i] *= alpha[i];
#pragma unroll
            for (int u = 0; u < DPT; u++) acc[i][u] *= alpha[i];
        }
        for (int c = 0; c < BC; c++) {
            float vv[DPT];
#pragma unroll
            for (int u = 0; u < DPT; u++) {
                const int x = tc + u * NTC;
                vv[u] = DIM_OK(x) ? Vs[c * HEAD_DIM + x] : 0.0f;
            }
            float pc[TR];
            lds_n<TR>(pc, Pt + c * BR + tr * TR);
#pragma unroll
            for (int i = 0; i < TR; i++) {
                l[i] += pc[i];
#pragma unroll
                for (int u = 0; u < DPT; u++) acc[i][u] = fmaf(pc[i], vv[u], acc[i][u]);
            }
        }
        __syncthreads();
    }

    /* Normalise once; a row the masks leave no key gives O = 0 and L = -inf
     * (row_sees_key). */
#pragma unroll
    for (int i = 0; i < TR; i++) {
        if (row_tok[i] < 0) continue;
        const int tok = row_tok[i], h = row_h[i];
        const bool masked = m[i] == -FA_INF && !row_sees_key(mask, tok, 0);
        const float inv = 1.0f / l[i];
        const float lse_r = masked ? -FA_INF : row_lse(m[i], l[i]);
#ifdef SPLITK
        const i64 row = (i64)(split * p.heads_q + h) * p.total_q + seq.start_q + tok;
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (DIM_OK(x)) p.part_o[row * HEAD_DIM + x] = masked ? 0.0f : acc[i][u] * inv;
        }
        if (tc == 0) p.part_l[row] = lse_r;
#else
        elem_t *orow = (elem_t *)p.o + O_ROW(p, b, seq, tok, h);
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (DIM_OK(x)) orow[x] = from_f32(masked ? 0.0f : acc[i][u] * inv);
        }
        if (tc == 0 && p.lse) p.lse[lse_index(p, b, h, tok, seq.start_q)] = lse_r;
#endif
    }
}
