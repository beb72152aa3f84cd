/* Attention on the FP32 pipes (any dtype, any head_dim multiple of 8, any
 * architecture): the fallback for shapes and devices the tensor-core
 * kernels do not cover, and the split-K decoding kernel.
 *
 * A block of NTR x NTC threads holds a BR x BC score tile, each thread a
 * TR x TC micro-tile of it and the matching TR rows x DPT head dimensions
 * (columns tc + u * NTC) of an output. Tiles live in shared memory in fp32
 * (converted on load), transposed where a thread reads them along rows.
 *
 * Kernels (options BR BC TR TC; FWD [SPLITK] or BWD [DQ_ATOMIC]):
 *   fa_fwd_simt       one block per (query tile, query head, sequence [x key
 *                     split]); shared memory, exactly fa_plan_local_mem's SIMT
 *                     forward figure: Qt [D][BR], Kt [D][BC], Vs [BC][D],
 *                     Pt [BC][BR]. With SPLITK each split writes its
 *                     normalised partial O and L (fp32) for fa_splitk_merge.
 *   fa_bwd_dkdv_simt  one block per (key tile, kv head, sequence), looping
 *                     over the query heads of the group and the query tiles:
 *                     dK, dV in registers; with DQ_ATOMIC also dS K into the
 *                     fp32 dQ accumulator. Shared memory, exactly the SIMT
 *                     backward figure: Kt, Vt [D][BC], Qs, dOs [BR][D],
 *                     Ps, dSs [BR][BC], Ls, Ds [BR].
 *   fa_bwd_dq_simt    without DQ_ATOMIC: one block per (query tile, query
 *                     head, sequence), dQ summed in a fixed order.
 * Softmax in base 2 with scale * log2 e folded into the scores; with score
 * options (SOFTCAP ALIBI BIAS) each score is common.cuh's score_log2 of
 * its raw product instead, in the forward and in both backward kernels
 * alike, and dS takes the cap's derivative. */
#include "rowwise.cuh"
#include "common.cuh"
#include "simt_tiles.cuh"

#define NTR (BR / TR)
#define NTC (BC / TC)
#define WG (NTR * NTC)
#define D8 (HEAD_DIM / 8)
#define DPT ((HEAD_DIM + NTC - 1) / NTC)
#define KPT ((BC + NTR - 1) / NTR)

#if HEAD_DIM % NTC == 0
#define DIM_OK(x) true
#else
#define DIM_OK(x) ((x) < HEAD_DIM)
#endif

/* ------------------------------------------------------------------------ */

#ifdef FWD
extern "C" __global__ void __launch_bounds__(WG) fa_fwd_simt(const fa_params p) {
    extern __shared__ __align__(16) float fsm[];
    float *Qt = fsm, *Kt = Qt + HEAD_DIM * BR, *Vs = Kt + HEAD_DIM * BC, *Pt = Vs + BC * HEAD_DIM;

    const int lid = threadIdx.x, tr = lid / NTC, tc = lid % NTC;
    const int tq = blockIdx.x, q0 = tq * BR, h = blockIdx.y;
    const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
    const int hk = h / p.group;
    const fa_seq seq = seq_of(p, b);
    if (q0 >= seq.len_q) return;
    const fa_mask mask = mask_of(p, seq);
    const float sl2 = p.scale_log2;
    (void)split;
#ifdef SCORE_OPTIONS
    const fa_score sc = score_of(p, b, h);
    (void)sl2;
#endif
#ifdef DROPOUT
    const u32 bh = (u32)b * (u32)p.heads_q + (u32)h;
#endif

    const elem_t *qg = (const elem_t *)p.q + Q_ROW(p, b, seq, q0, h);
    const elem_t *kg = (const elem_t *)p.k + K_ROW(p, b, seq, 0, hk);
    const elem_t *vg = (const elem_t *)p.v + V_ROW(p, b, seq, 0, hk);
    for (int e = lid; e < BR * D8; e += WG) {
        const int r = e / D8, x0 = (e % D8) * 8;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < seq.len_q - q0) load8(qg + (i64)r * p.q_ss + x0, v);
        store8_t(Qt, BR, x0, r, v);
    }

    int k_lo, k_hi, t_begin, t_end;
    key_range(mask, q0, tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
#ifdef SPLITK
    split_tiles(split, p.num_splits, &t_begin, &t_end);
#endif

    float m[TR], l[TR], acc[TR][DPT];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        m[i] = -FA_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int u = 0; u < DPT; u++) acc[i][u] = 0.0f;
    }

    for (int t = next_key_tile(p, tq, t_begin, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
        const int k0 = t * BC;
        for (int e = lid; e < BC * D8; e += WG) {
            const int c = e / D8, x0 = (e % D8) * 8;
            float kv[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (c < seq.len_k - k0) {
                load8(kg + ((i64)k0 + c) * p.k_ss + x0, kv);
                load8(vg + ((i64)k0 + c) * p.v_ss + x0, vv);
            }
            store8_t(Kt, BC, x0, c, kv);
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
        const bool full = tile_full(p, mask, tq, t, q0, k0, BR, BC, ROWS_STORED);
#ifdef SCORE_OPTIONS
        const fa_score_at so = score_at(sc, mask, seq.len_q - q0 - tr * TR, seq.len_k - k0 - tc * TC);
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TC; j++) {
                float t;
                s[i][j] = score_elem<true>(sc, so, s[i][j], i, j, &t);
            }
#endif
#pragma unroll
        for (int j = 0; j < TC; j++) {
            float col[TR];
#pragma unroll
            for (int i = 0; i < TR; i++) {
#ifndef SCORE_OPTIONS
                s[i][j] *= sl2;
#endif
                if (!full && !visible(mask, q0, tr * TR + i, k0, tc * TC + j)) s[i][j] = -FA_INF;
                col[i] = s[i][j];
            }
            sts_n<TR>(Pt + (tc * TC + j) * BR + tr * TR, col);
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
            for (int i = 0; i < TR; i++) {
                float pv = fa_exp2(s[i][j] - m_use[i]);
#ifdef DROPOUT
                /* A dropped probability is marked by its sign (values are
                 * >= 0; a dropped 0 becomes -0). */
                if (!dropout_keep(p, bh, (u32)q0 + (u32)(tr * TR + i), (u32)k0 + (u32)(tc * TC + j))) pv = -pv;
#endif
                col[i] = pv;
            }
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
#ifdef DROPOUT
                l[i] += fabsf(pc[i]);
                const float pv = fmaxf(pc[i], 0.0f);
#else
                l[i] += pc[i];
                const float pv = pc[i];
#endif
#pragma unroll
                for (int u = 0; u < DPT; u++) acc[i][u] = fmaf(pv, vv[u], acc[i][u]);
            }
        }
        __syncthreads();
    }

    /* Normalise once; a row the masks leave no key gives O = 0 (whatever
     * 0 * NaN its accumulator met) and L = -inf (row_sees_key). */
#pragma unroll
    for (int i = 0; i < TR; i++) {
        if (tr * TR + i >= seq.len_q - q0) continue;
        const int r = q0 + tr * TR + i;
        const bool masked = m[i] == -FA_INF && !row_sees_key(mask, q0, tr * TR + i);
        const float inv = p.drop_scale / l[i];
        const float lse_r = masked ? -FA_INF : row_lse(m[i], l[i]);
#ifdef SPLITK
        const i64 row = (i64)(split * p.heads_q + h) * p.total_q + seq.start_q + r;
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (DIM_OK(x)) p.part_o[row * HEAD_DIM + x] = masked ? 0.0f : acc[i][u] * inv;
        }
        if (tc == 0) p.part_l[row] = lse_r;
#else
        elem_t *orow = (elem_t *)p.o + O_ROW(p, b, seq, r, h);
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (DIM_OK(x)) orow[x] = from_f32(masked ? 0.0f : acc[i][u] * inv);
        }
        if (tc == 0) p.lse[lse_index(p, b, h, r, seq.start_q)] = lse_r;
#endif
    }
}

#endif

/* ------------------------------------------------------------------------ */
/* Backward                                                                   */

#ifdef BWD
/* z / (1 - p) of element (query row r, key c): keep_scale or 0. With
 * s = q.k, P = exp2(s scale log2 e - L log2 e), with r and c offsets in the
 * tile at (q0, k0):
 *   dS = P (z dP - D),   dV += z P dO,   dK += dS q,   dQ += dS k. */
#ifdef DROPOUT
#define DROP_Z(r, c) (dropout_keep(p, bh, (u32)q0 + (u32)(r), (u32)k0 + (u32)(c)) ? p.drop_scale : 0.0f)
#else
#define DROP_Z(r, c) 1.0f
#endif

extern "C" __global__ void __launch_bounds__(WG) fa_bwd_dkdv_simt(const fa_params p) {
    extern __shared__ __align__(16) float fsm[];
    float *Kt = fsm, *Vt = Kt + HEAD_DIM * BC;
    float *Qs = Vt + HEAD_DIM * BC, *dOs = Qs + BR * HEAD_DIM;
    float *Ps = dOs + BR * HEAD_DIM, *dSs = Ps + BR * BC;
    float *Ls = dSs + BR * BC, *Ds = Ls + BR;

    const int lid = threadIdx.x, tr = lid / NTC, tc = lid % NTC;
    const int tk = blockIdx.x, k0 = tk * BC, hk = blockIdx.y, b = blockIdx.z;
    const fa_seq seq = seq_of(p, b);
    if (k0 >= seq.len_k) return;
    const fa_mask mask = mask_of(p, seq);
    const float sl2 = p.scale_log2;
    (void)sl2;

    const elem_t *kg = (const elem_t *)p.k + K_ROW(p, b, seq, k0, hk);
    const elem_t *vg = (const elem_t *)p.v + V_ROW(p, b, seq, k0, hk);
    for (int e = lid; e < BC * D8; e += WG) {
        const int c = e / D8, x0 = (e % D8) * 8;
        float kv[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (c < seq.len_k - k0) {
            load8(kg + (i64)c * p.k_ss + x0, kv);
            load8(vg + (i64)c * p.v_ss + x0, vv);
        }
        store8_t(Kt, BC, x0, c, kv);
        store8_t(Vt, BC, x0, c, vv);
    }

    float acc_k[KPT][DPT], acc_v[KPT][DPT];
#pragma unroll
    for (int j = 0; j < KPT; j++)
#pragma unroll
        for (int u = 0; u < DPT; u++) acc_k[j][u] = acc_v[j][u] = 0.0f;

    int r_lo, r_hi, t_begin, t_end;
    query_range(mask, k0, tile_last(k0, BC, seq.len_k), &r_lo, &r_hi);
    tile_span(r_lo, r_hi, BR, &t_begin, &t_end);

    for (int hh = 0; hh < p.group; hh++) {
        const int h = hk * p.group + hh;
#ifdef DROPOUT
        const u32 bh = (u32)b * (u32)p.heads_q + (u32)h;
#endif
#ifdef SCORE_OPTIONS
        const fa_score sc = score_of(p, b, h);
#endif
        for (int tq = next_query_tile(p, tk, t_begin, t_end); tq < t_end;
             tq = next_query_tile(p, tk, tq + 1, t_end)) {
            const int q0 = tq * BR;
            const elem_t *qg = (const elem_t *)p.q + Q_ROW(p, b, seq, q0, h);
            const elem_t *og = (const elem_t *)p.dout + O_ROW(p, b, seq, q0, h);
            for (int e = lid; e < BR * D8; e += WG) {
                const int r = e / D8, x0 = (e % D8) * 8;
                float qv[8] = {0, 0, 0, 0, 0, 0, 0, 0}, gv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                if (r < seq.len_q - q0) {
                    load8(qg + (i64)r * p.q_ss + x0, qv);
                    load8(og + (i64)r * p.o_ss + x0, gv);
                }
                store8_row(Qs + r * HEAD_DIM + x0, qv);
                store8_row(dOs + r * HEAD_DIM + x0, gv);
            }
            for (int r = lid; r < BR; r += WG) {
                float lv = FA_INF, dv = 0.0f;
                if (r < seq.len_q - q0) {
                    const i64 li = lse_index(p, b, h, q0 + r, seq.start_q);
                    const float L = p.lse[li];
                    lv = L == -FA_INF ? FA_INF : L * FA_LOG2E;
                    dv = p.dvec[li];
                }
                Ls[r] = lv;
                Ds[r] = dv;
            }
            __syncthreads();

            float s[TR][TC], dp[TR][TC];
#pragma unroll
            for (int i = 0; i < TR; i++)
#pragma unroll
                for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 2
            for (int x = 0; x < HEAD_DIM; x += 4) {
                float a[TR][4], gq[TR][4];
#pragma unroll
                for (int i = 0; i < TR; i++) {
                    lds_n<4>(a[i], Qs + (tr * TR + i) * HEAD_DIM + x);
                    lds_n<4>(gq[i], dOs + (tr * TR + i) * HEAD_DIM + x);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float kk[TC], vv[TC];
                    lds_n<TC>(kk, Kt + (x + e) * BC + tc * TC);
                    lds_n<TC>(vv, Vt + (x + e) * BC + tc * TC);
#pragma unroll
                    for (int i = 0; i < TR; i++)
#pragma unroll
                        for (int j = 0; j < TC; j++) {
                            s[i][j] = fmaf(a[i][e], kk[j], s[i][j]);
                            dp[i][j] = fmaf(gq[i][e], vv[j], dp[i][j]);
                        }
                }
            }
            const bool full = tile_full(p, mask, tq, tk, q0, k0, BR, BC, ROWS_FEED_KEYS);
#ifdef SCORE_OPTIONS
            const fa_score_at so = score_at(sc, mask, seq.len_q - q0 - tr * TR, seq.len_k - k0 - tc * TC);
#endif
#pragma unroll
            for (int i = 0; i < TR; i++) {
                const int rl = tr * TR + i;
#pragma unroll
                for (int j = 0; j < TC; j++) {
                    const int cl = tc * TC + j;
                    const bool seen = full || visible(mask, q0, rl, k0, cl);
#ifdef SCORE_OPTIONS
                    float t;
                    const float pv = fa_exp2(score_elem<true>(sc, so, s[i][j], i, j, &t) - Ls[rl]);
                    const float z = DROP_Z(rl, cl);
                    dp[i][j] = seen ? pv * (dp[i][j] * z - Ds[rl]) * score_dcap(t) : 0.0f;
#else
                    const float pv = fa_exp2(s[i][j] * sl2 - Ls[rl]);
                    const float z = DROP_Z(rl, cl);
                    dp[i][j] = seen ? pv * (dp[i][j] * z - Ds[rl]) : 0.0f;
#endif
                    s[i][j] = seen ? pv * z : 0.0f;
                }
                sts_n<TC>(Ps + rl * BC + tc * TC, s[i]);
                sts_n<TC>(dSs + rl * BC + tc * TC, dp[i]);
            }
            __syncthreads();

            /* dV += P^T dO, dK += dS^T Q over the tile's rows. */
            for (int r = 0; r < BR; r++) {
                float pr[KPT], dsr[KPT], qr[DPT], gr[DPT];
#pragma unroll
                for (int j = 0; j < KPT; j++) {
                    const int c = min(tr + j * NTR, BC - 1);
                    pr[j] = Ps[r * BC + c];
                    dsr[j] = dSs[r * BC + c];
                }
#pragma unroll
                for (int u = 0; u < DPT; u++) {
                    const int x = min(tc + u * NTC, HEAD_DIM - 1);
                    qr[u] = Qs[r * HEAD_DIM + x];
                    gr[u] = dOs[r * HEAD_DIM + x];
                }
#pragma unroll
                for (int j = 0; j < KPT; j++)
#pragma unroll
                    for (int u = 0; u < DPT; u++) {
                        acc_v[j][u] = fmaf(pr[j], gr[u], acc_v[j][u]);
                        acc_k[j][u] = fmaf(dsr[j], qr[u], acc_k[j][u]);
                    }
            }
#ifdef DQ_ATOMIC
            /* dQ += dS K for the tile's rows tr * TR + i, dims tc + u * NTC;
             * each thread walks the keys from its own starting column so the
             * threads of a row group read different banks of Kt. */
            {
                float dq[TR][DPT];
#pragma unroll
                for (int i = 0; i < TR; i++)
#pragma unroll
                    for (int u = 0; u < DPT; u++) dq[i][u] = 0.0f;
                for (int cc = 0; cc < BC; cc++) {
                    const int c = (cc + tc) % BC;
                    float kr[DPT], dsc[TR];
#pragma unroll
                    for (int u = 0; u < DPT; u++) kr[u] = Kt[min(tc + u * NTC, HEAD_DIM - 1) * BC + c];
#pragma unroll
                    for (int i = 0; i < TR; i++) dsc[i] = dSs[(tr * TR + i) * BC + c];
#pragma unroll
                    for (int i = 0; i < TR; i++)
#pragma unroll
                        for (int u = 0; u < DPT; u++) dq[i][u] = fmaf(dsc[i], kr[u], dq[i][u]);
                }
#pragma unroll
                for (int i = 0; i < TR; i++) {
                    if (tr * TR + i >= seq.len_q - q0) continue;
                    float *row = p.dq_acc + lse_index(p, b, h, q0 + tr * TR + i, seq.start_q) * HEAD_DIM;
#pragma unroll
                    for (int u = 0; u < DPT; u++) {
                        const int x = tc + u * NTC;
                        if (DIM_OK(x)) atomicAdd(row + x, dq[i][u]);
                    }
                }
            }
#endif
            __syncthreads();
        }
    }

    elem_t *dkg = (elem_t *)p.dk + K_ROW(p, b, seq, k0, hk);
    elem_t *dvg = (elem_t *)p.dv + V_ROW(p, b, seq, k0, hk);
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int c = tr + j * NTR;
        if (c >= BC || c >= seq.len_k - k0) continue;
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (!DIM_OK(x)) continue;
            dkg[(i64)c * p.k_ss + x] = from_f32(acc_k[j][u] * p.scale);
            dvg[(i64)c * p.v_ss + x] = from_f32(acc_v[j][u]);
        }
    }
}

#ifndef DQ_ATOMIC
/* Shared memory within the SIMT backward figure: Qt, dOt [D][BR],
 * Kt, Vt [D][BC], dSt [BC][BR], Ls, Ds [BR]. */
extern "C" __global__ void __launch_bounds__(WG) fa_bwd_dq_simt(const fa_params p) {
    extern __shared__ __align__(16) float fsm[];
    float *Qt = fsm, *dOt = Qt + HEAD_DIM * BR, *Kt = dOt + HEAD_DIM * BR, *Vt = Kt + HEAD_DIM * BC;
    float *dSt = Vt + HEAD_DIM * BC, *Ls = dSt + BC * BR, *Ds = Ls + BR;

    const int lid = threadIdx.x, tr = lid / NTC, tc = lid % NTC;
    const int tq = blockIdx.x, q0 = tq * BR, h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
    const fa_seq seq = seq_of(p, b);
    if (q0 >= seq.len_q) return;
    const fa_mask mask = mask_of(p, seq);
    const float sl2 = p.scale_log2;
#ifdef DROPOUT
    const u32 bh = (u32)b * (u32)p.heads_q + (u32)h;
#endif
#ifdef SCORE_OPTIONS
    const fa_score sc = score_of(p, b, h);
    (void)sl2;
#endif

    const elem_t *qg = (const elem_t *)p.q + Q_ROW(p, b, seq, q0, h);
    const elem_t *og = (const elem_t *)p.dout + O_ROW(p, b, seq, q0, h);
    for (int e = lid; e < BR * D8; e += WG) {
        const int r = e / D8, x0 = (e % D8) * 8;
        float qv[8] = {0, 0, 0, 0, 0, 0, 0, 0}, gv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < seq.len_q - q0) {
            load8(qg + (i64)r * p.q_ss + x0, qv);
            load8(og + (i64)r * p.o_ss + x0, gv);
        }
        store8_t(Qt, BR, x0, r, qv);
        store8_t(dOt, BR, x0, r, gv);
    }
    for (int r = lid; r < BR; r += WG) {
        float lv = FA_INF, dv = 0.0f;
        if (r < seq.len_q - q0) {
            const i64 li = lse_index(p, b, h, q0 + r, seq.start_q);
            const float L = p.lse[li];
            lv = L == -FA_INF ? FA_INF : L * FA_LOG2E;
            dv = p.dvec[li];
        }
        Ls[r] = lv;
        Ds[r] = dv;
    }

    float acc[TR][DPT];
#pragma unroll
    for (int i = 0; i < TR; i++)
#pragma unroll
        for (int u = 0; u < DPT; u++) acc[i][u] = 0.0f;

    int k_lo, k_hi, t_begin, t_end;
    key_range(mask, q0, tile_last(q0, BR, seq.len_q), &k_lo, &k_hi);
    tile_span(k_lo, k_hi, BC, &t_begin, &t_end);
    const elem_t *kg = (const elem_t *)p.k + K_ROW(p, b, seq, 0, hk);
    const elem_t *vg = (const elem_t *)p.v + V_ROW(p, b, seq, 0, hk);

    for (int t = next_key_tile(p, tq, t_begin, t_end); t < t_end; t = next_key_tile(p, tq, t + 1, t_end)) {
        const int k0 = t * BC;
        for (int e = lid; e < BC * D8; e += WG) {
            const int c = e / D8, x0 = (e % D8) * 8;
            float kv[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (c < seq.len_k - k0) {
                load8(kg + ((i64)k0 + c) * p.k_ss + x0, kv);
                load8(vg + ((i64)k0 + c) * p.v_ss + x0, vv);
            }
            store8_t(Kt, BC, x0, c, kv);
            store8_t(Vt, BC, x0, c, vv);
        }
        __syncthreads();

        float s[TR][TC], dp[TR][TC];
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TC; j++) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
        for (int x = 0; x < HEAD_DIM; x++) {
            float a[TR], gq[TR], kk[TC], vv[TC];
            lds_n<TR>(a, Qt + x * BR + tr * TR);
            lds_n<TR>(gq, dOt + x * BR + tr * TR);
            lds_n<TC>(kk, Kt + x * BC + tc * TC);
            lds_n<TC>(vv, Vt + x * BC + tc * TC);
#pragma unroll
            for (int i = 0; i < TR; i++)
#pragma unroll
                for (int j = 0; j < TC; j++) {
                    s[i][j] = fmaf(a[i], kk[j], s[i][j]);
                    dp[i][j] = fmaf(gq[i], vv[j], dp[i][j]);
                }
        }
        const bool full = tile_full(p, mask, tq, t, q0, k0, BR, BC, ROWS_STORED);
#ifdef SCORE_OPTIONS
        const fa_score_at so = score_at(sc, mask, seq.len_q - q0 - tr * TR, seq.len_k - k0 - tc * TC);
#endif
#pragma unroll
        for (int j = 0; j < TC; j++) {
            const int cl = tc * TC + j;
            float col[TR];
#pragma unroll
            for (int i = 0; i < TR; i++) {
                const int rl = tr * TR + i;
                const bool seen = full || visible(mask, q0, rl, k0, cl);
#ifdef SCORE_OPTIONS
                float t;
                const float pv = fa_exp2(score_elem<true>(sc, so, s[i][j], i, j, &t) - Ls[rl]);
                col[i] = seen ? pv * (dp[i][j] * DROP_Z(rl, cl) - Ds[rl]) * score_dcap(t) : 0.0f;
#else
                const float pv = fa_exp2(s[i][j] * sl2 - Ls[rl]);
                col[i] = seen ? pv * (dp[i][j] * DROP_Z(rl, cl) - Ds[rl]) : 0.0f;
#endif
            }
            sts_n<TR>(dSt + cl * BR + tr * TR, col);
        }
        __syncthreads();

        /* dQ += dS K over the tile's keys. */
        for (int cc = 0; cc < BC; cc++) {
            const int c = (cc + tc) % BC;
            float kr[DPT], dsc[TR];
#pragma unroll
            for (int u = 0; u < DPT; u++) kr[u] = Kt[min(tc + u * NTC, HEAD_DIM - 1) * BC + c];
            lds_n<TR>(dsc, dSt + c * BR + tr * TR);
#pragma unroll
            for (int i = 0; i < TR; i++)
#pragma unroll
                for (int u = 0; u < DPT; u++) acc[i][u] = fmaf(dsc[i], kr[u], acc[i][u]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TR; i++) {
        if (tr * TR + i >= seq.len_q - q0) continue;
        elem_t *row = (elem_t *)p.dq + Q_ROW(p, b, seq, q0 + tr * TR + i, h);
#pragma unroll
        for (int u = 0; u < DPT; u++) {
            const int x = tc + u * NTC;
            if (DIM_OK(x)) row[x] = from_f32(acc[i][u] * p.scale);
        }
    }
}
#endif
#endif
