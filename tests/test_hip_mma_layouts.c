/* The HIP matrix-core kernels' fragment layers (kernels_hip/mma_<layer>.h)
 * against the documented lane layouts of their instructions
 * (tests/mma_model.c), on the host, for every layer and dtype the planner
 * plans (core/planner_hip_mma.c): NVIDIA mma.sync m16n8k16, CDNA MFMA
 * 32x32x8 and 16x16x16 (f16, bf16_1k), RDNA3 WMMA 16x16x16 (f16, bf16).
 *
 * Each layer's index functions are the header's own macros (compiled here
 * as C with FA_HOST_MODEL), fed through the model:
 * - one instruction on fragments laid out by the index functions gives
 *   the plain matrix product;
 * - the kernels' two products, at every tile side and head dimension the
 *   planner can pick for the layer: the score product (own rows x other
 *   rows over head_dim, in the layer's orientation) and the accumulating
 *   product whose operand is the scores turned into 16-bit values through
 *   FA_X2P_* (registers, or an exchange of lanes);
 * - the lanes sharing an own row are the xor-closure of the reduction
 *   masks, with one leader; the runs that share a Philox call and the
 *   vector loads' runs are what their macros claim;
 * - NVIDIA: ldmatrix pointed as the layer points it (FA_LDSM_*) delivers
 *   exactly the loads' index functions;
 * - the planner's layer table states what the headers state. */
#include "harness.h"
#include "mma_model.h"
#include "planner_hip_mma.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FA_HOST_MODEL 1

typedef int (*idx2)(int, int);

/* One layer, read from its header. */
typedef struct layer {
    const char *name, *instr_f16, *instr_bf16;
    int sg, m, n, k, a_elems, b_elems, c_elems;
    int own_n, own_slots, red_steps, red_masks[6];
    int own_t, other_t, p_elems, other_run, c_run_m, c_run_n, a_krun, b_krun;
    idx2 a_row, a_col, b_k, b_n, c_row, c_col, own_idx, x2p_frag, x2p_elem, own_of, other_of;
    int (*own_slot)(int e);
    int (*x2p_lane)(int l, int ks, int i);
    /* NVIDIA: where each load points ldmatrix (row, column of A, A^T, B
     * from [n][k], B from [k][n], then the B pairs' x4 forms); NULL
     * elsewhere. */
    int (*ldsm[12])(int l);
} layer;

#include "kernels_hip/mma_frag.h"

#define RED_MASK_OR_0(i) (FA_RED_STEPS > (i) ? FA_RED_MASK(i) : 0)

/* The functions and table entry of the layer whose macros are in scope. */
#define CAPTURE_LAYER(P)                                                                                           \
    static int P##_a_row(int l, int i) { return FA_A_ROW(l, i); }                                                  \
    static int P##_a_col(int l, int i) { return FA_A_COL(l, i); }                                                  \
    static int P##_b_k(int l, int i) { return FA_B_K(l, i); }                                                      \
    static int P##_b_n(int l, int i) { return FA_B_N(l, i); }                                                      \
    static int P##_c_row(int l, int e) { return FA_C_ROW(l, e); }                                                  \
    static int P##_c_col(int l, int e) { return FA_C_COL(l, e); }                                                  \
    static int P##_own_of(int l, int e) { return FA_OWN_OF(l, e); }                                                \
    static int P##_other_of(int l, int e) { return FA_OTHER_OF(l, e); }                                            \
    static int P##_own_slot(int e) { return FA_OWN_SLOT(e); }                                                      \
    static int P##_own_idx(int l, int s) { return FA_OWN_IDX(l, s); }                                              \
    static int P##_x2p_frag(int ks, int i) { return FA_X2P_FRAG(ks, i); }                                          \
    static int P##_x2p_elem(int ks, int i) { return FA_X2P_ELEM(ks, i); }                                          \
    static int P##_x2p_lane(int l, int ks, int i) { return FA_X2P_LANE(l, ks, i); }                                \
    static layer P##_layer(void) {                                                                                 \
        layer L = {FA_LAYER_NAME, FA_INSTR_F16, FA_INSTR_BF16, FA_SG, FA_M, FA_N, FA_K, FA_A_ELEMS,                \
                   FA_B_ELEMS, FA_C_ELEMS, FA_OWN_N, FA_OWN_SLOTS, FA_RED_STEPS,                                   \
                   {RED_MASK_OR_0(0), RED_MASK_OR_0(1), RED_MASK_OR_0(2), RED_MASK_OR_0(3),                        \
                    RED_MASK_OR_0(4), RED_MASK_OR_0(5)},                                                           \
                   FA_OWN_T, FA_OTHER_T, FA_P_ELEMS, FA_OTHER_RUN, FA_C_RUN_M, FA_C_RUN_N, FA_A_KRUN,              \
                   FA_B_KRUN, P##_a_row, P##_a_col, P##_b_k, P##_b_n, P##_c_row, P##_c_col,                        \
                   P##_own_idx, P##_x2p_frag, P##_x2p_elem, P##_own_of, P##_other_of, P##_own_slot,                \
                   P##_x2p_lane, {NULL}};                                                                          \
        return L;                                                                                                  \
    }

#include "kernels_hip/mma_nvidia.h"
CAPTURE_LAYER(nvidia)
static int ldsm_a_row(int l) { return FA_LDSM_A_ROW(l); }
static int ldsm_a_col(int l) { return FA_LDSM_A_COL(l); }
static int ldsm_at_row(int l) { return FA_LDSM_AT_ROW(l); }
static int ldsm_at_col(int l) { return FA_LDSM_AT_COL(l); }
static int ldsm_bnk_row(int l) { return FA_LDSM_BNK_ROW(l); }
static int ldsm_bnk_col(int l) { return FA_LDSM_BNK_COL(l); }
static int ldsm_bkn_row(int l) { return FA_LDSM_BKN_ROW(l); }
static int ldsm_bkn_col(int l) { return FA_LDSM_BKN_COL(l); }
static int ldsm_bnk2_row(int l) { return FA_LDSM_BNK2_ROW(l); }
static int ldsm_bnk2_col(int l) { return FA_LDSM_BNK2_COL(l); }
static int ldsm_bkn2_row(int l) { return FA_LDSM_BKN2_ROW(l); }
static int ldsm_bkn2_col(int l) { return FA_LDSM_BKN2_COL(l); }
#include "hip_mma_layer_undef.h"

#define FA_MFMA32 1
#include "kernels_hip/mma_cdna.h"
CAPTURE_LAYER(mfma32)
#include "hip_mma_layer_undef.h"
#undef FA_MFMA32

#define FA_MFMA16 1
#include "kernels_hip/mma_cdna.h"
CAPTURE_LAYER(mfma16)
#include "hip_mma_layer_undef.h"
#undef FA_MFMA16

#include "kernels_hip/mma_rdna3.h"
CAPTURE_LAYER(wmma)
#include "hip_mma_layer_undef.h"

#define MAX_LAYERS 4
static int layers(layer out[MAX_LAYERS]) {
    out[0] = nvidia_layer();
    out[0].ldsm[0] = ldsm_a_row;
    out[0].ldsm[1] = ldsm_a_col;
    out[0].ldsm[2] = ldsm_at_row;
    out[0].ldsm[3] = ldsm_at_col;
    out[0].ldsm[4] = ldsm_bnk_row;
    out[0].ldsm[5] = ldsm_bnk_col;
    out[0].ldsm[6] = ldsm_bkn_row;
    out[0].ldsm[7] = ldsm_bkn_col;
    out[0].ldsm[8] = ldsm_bnk2_row;
    out[0].ldsm[9] = ldsm_bnk2_col;
    out[0].ldsm[10] = ldsm_bkn2_row;
    out[0].ldsm[11] = ldsm_bkn2_col;
    out[1] = mfma32_layer();
    out[2] = mfma16_layer();
    out[3] = wmma_layer();
    return MAX_LAYERS;
}

/* ------------------------------------------------------------------------ */
/* The loads' index functions (mma_frag.h): fragments of a whole wavefront. */

static void load_a(const layer *L, const uint16_t *t, int ld, int r0, int k0, uint16_t *a) {
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < L->a_elems; i++) a[l * L->a_elems + i] = t[(r0 + L->a_row(l, i)) * ld + k0 + L->a_col(l, i)];
}
static void load_a_t(const layer *L, const uint16_t *t, int ld, int m0, int k0, uint16_t *a) {
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < L->a_elems; i++) a[l * L->a_elems + i] = t[(k0 + L->a_col(l, i)) * ld + m0 + L->a_row(l, i)];
}
static void load_b_nk(const layer *L, const uint16_t *t, int ld, int n0, int k0, uint16_t *b) {
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < L->b_elems; i++) b[l * L->b_elems + i] = t[(n0 + L->b_n(l, i)) * ld + k0 + L->b_k(l, i)];
}
static void load_b_kn(const layer *L, const uint16_t *t, int ld, int k0, int n0, uint16_t *b) {
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < L->b_elems; i++) b[l * L->b_elems + i] = t[(k0 + L->b_k(l, i)) * ld + n0 + L->b_n(l, i)];
}

static uint16_t *random16(fa_rng *rng, int count, fa_mma_input type) {
    uint16_t *t = malloc(sizeof(uint16_t) * (size_t)(count > 0 ? count : 1));
    for (int i = 0; t && i < count; i++) t[i] = fa_mma_from_float((float)fa_rng_uniform(rng, -2.0, 2.0), type);
    return t;
}

static double *to_doubles(const uint16_t *t, int count, fa_mma_input type) {
    double *v = malloc(sizeof(double) * (size_t)(count > 0 ? count : 1));
    for (int i = 0; v && i < count; i++) v[i] = fa_mma_to_float(t[i], type);
    return v;
}

/* Whether an fp32 result is the dot product of x[i xs] and y[i ys], i < n
 * (exact in double), up to the roundings of fp32 accumulation. */
static int is_dot(float got, const double *x, int xs, const double *y, int ys, int n) {
    double want = 0.0, scale = 0.0;
    for (int i = 0; i < n; i++) {
        const double term = x[i * xs] * y[i * ys];
        want += term;
        scale += fabs(term);
    }
    return fabs(got - want) <= 1e-6 * scale + 1e-12;
}

/* ------------------------------------------------------------------------ */

/* One instruction: fragments laid out by the index functions give A B, and
 * every element of C is some lane's exactly once. */
static void check_instruction(const layer *L, const fa_mma_model *M, fa_rng *rng) {
    uint16_t *A = random16(rng, L->m * L->k, M->input), *B = random16(rng, L->k * L->n, M->input);
    uint16_t *a = calloc((size_t)(L->sg * L->a_elems), 2), *b = calloc((size_t)(L->sg * L->b_elems), 2);
    float *c = calloc((size_t)(L->sg * L->c_elems), sizeof(float));
    int *seen = calloc((size_t)(L->m * L->n), sizeof(int));
    double *Ad = A ? to_doubles(A, L->m * L->k, M->input) : NULL, *Bd = B ? to_doubles(B, L->k * L->n, M->input) : NULL;
    if (!A || !B || !a || !b || !c || !seen || !Ad || !Bd) goto out;
    load_a(L, A, L->k, 0, 0, a);
    load_b_kn(L, B, L->n, 0, 0, b);
    CHECK_MSG(fa_mma_model_run(M, a, b, c) == 0, "%s: A or B differs between the copies of %s", L->name,
              M->instruction);
    int wrong = 0, bad_index = 0;
    for (int l = 0; l < L->sg; l++)
        for (int e = 0; e < L->c_elems; e++) {
            const int i = L->c_row(l, e), j = L->c_col(l, e);
            if (i < 0 || i >= L->m || j < 0 || j >= L->n) {
                bad_index++;
                continue;
            }
            seen[i * L->n + j]++;
            wrong += !is_dot(c[l * L->c_elems + e], Ad + i * L->k, 1, Bd + j, L->n, L->k);
        }
    int coverage = 0;
    for (int i = 0; i < L->m * L->n; i++) coverage += seen[i] != 1;
    CHECK_MSG(bad_index == 0 && wrong == 0 && coverage == 0,
              "%s %s: %d elements outside C, %d wrong, %d not held exactly once", L->name, M->instruction, bad_index,
              wrong, coverage);
out:
    free(A);
    free(B);
    free(Ad);
    free(Bd);
    free(a);
    free(b);
    free(c);
    free(seen);
}

/* The kernels' products over one strip of FA_OWN_T own rows: scores of
 * `other` other rows over `dim` head dimensions, then those scores
 * (rounded to 16 bits) times a Z tile of `other` rows, as fwd_mma.hip and
 * bwd_mma.hip sequence them. Returns the number of wrong elements. */
static int check_products(const layer *L, const fa_mma_model *M, fa_rng *rng, int other, int dim) {
    const int own = L->own_t, nj = other / L->other_t, pk = other / L->k, nf = dim / L->other_t, kt = dim / L->k;
    const int lanes = L->sg;
    uint16_t *Own = random16(rng, own * dim, M->input), *Oth = random16(rng, other * dim, M->input);
    uint16_t *Z = random16(rng, other * dim, M->input);
    uint16_t *a = calloc((size_t)(lanes * L->a_elems), 2), *b = calloc((size_t)(lanes * L->b_elems), 2);
    float *s = calloc((size_t)(nj * lanes * L->c_elems), sizeof(float));
    float *acc = calloc((size_t)(nf * lanes * L->c_elems), sizeof(float));
    double *S = calloc((size_t)(own * other), sizeof(double));
    double *Ownd = Own ? to_doubles(Own, own * dim, M->input) : NULL, *Othd = Oth ? to_doubles(Oth, other * dim, M->input) : NULL;
    double *Zd = Z ? to_doubles(Z, other * dim, M->input) : NULL;
    int wrong = 0;
    if (!Own || !Oth || !Z || !a || !b || !s || !acc || !S || !Ownd || !Othd || !Zd) {
        wrong = -1;
        goto out;
    }
    /* Score product: own operand from the own tile, other operand from the
     * other tile's rows j * other_t .., in the layer's orientation. */
    for (int j = 0; j < nj; j++)
        for (int ks = 0; ks < kt; ks++) {
            if (L->own_n) {
                load_a(L, Oth, dim, j * L->other_t, ks * L->k, a);
                load_b_nk(L, Own, dim, 0, ks * L->k, b);
            } else {
                load_a(L, Own, dim, 0, ks * L->k, a);
                load_b_nk(L, Oth, dim, j * L->other_t, ks * L->k, b);
            }
            wrong += fa_mma_model_run(M, a, b, s + (size_t)j * lanes * L->c_elems) != 0;
        }
    for (int j = 0; j < nj; j++)
        for (int l = 0; l < lanes; l++)
            for (int e = 0; e < L->c_elems; e++) {
                const int r = L->own_of(l, e), c = j * L->other_t + L->other_of(l, e);
                const float got = s[((size_t)j * lanes + l) * L->c_elems + e];
                wrong += !is_dot(got, Ownd + r * dim, 1, Othd + c * dim, 1, dim);
                S[r * other + c] = fa_mma_to_float(fa_mma_from_float(got, M->input), M->input);
            }
    /* Accumulating product: the scores as the X operand of k-step p (from
     * the lanes and elements FA_X2P_* name), Z's rows p * k .. and head
     * dimensions f * dim_t ... */
    const int p_elems = L->p_elems;
    uint16_t *p = L->own_n ? b : a;
    for (int f = 0; f < nf; f++)
        for (int q = 0; q < pk; q++) {
            for (int l = 0; l < lanes; l++)
                for (int i = 0; i < p_elems; i++) {
                    const int fr = L->x2p_frag(q, i), src = L->x2p_lane(l, q, i), el = L->x2p_elem(q, i);
                    if (fr < 0 || fr >= nj || src < 0 || src >= lanes || el < 0 || el >= L->c_elems) {
                        wrong++;
                        continue;
                    }
                    p[l * p_elems + i] = fa_mma_from_float(s[((size_t)fr * lanes + src) * L->c_elems + el], M->input);
                }
            if (L->own_n)
                load_a_t(L, Z, dim, f * L->other_t, q * L->k, a);
            else
                load_b_kn(L, Z, dim, q * L->k, f * L->other_t, b);
            wrong += fa_mma_model_run(M, a, b, acc + (size_t)f * lanes * L->c_elems) != 0;
        }
    for (int f = 0; f < nf; f++)
        for (int l = 0; l < lanes; l++)
            for (int e = 0; e < L->c_elems; e++) {
                const int r = L->own_of(l, e), x = f * L->other_t + L->other_of(l, e);
                wrong += !is_dot(acc[((size_t)f * lanes + l) * L->c_elems + e], S + r * other, 1, Zd + x, dim, other);
            }
out:
    free(Own);
    free(Oth);
    free(Z);
    free(Ownd);
    free(Othd);
    free(Zd);
    free(a);
    free(b);
    free(s);
    free(acc);
    free(S);
    return wrong;
}

/* The lanes holding each own row of a fragment, their slots, the
 * reduction masks' xor-closure and the rows' leaders. */
static void check_rows(const layer *L) {
    int red_all = 0;
    for (int i = 0; i < L->red_steps; i++) red_all |= L->red_masks[i];
    for (int r = 0; r < L->own_t; r++) {
        uint64_t holders = 0;
        int slot_ok = 1, leaders = 0;
        for (int l = 0; l < L->sg; l++)
            for (int e = 0; e < L->c_elems; e++)
                if (L->own_of(l, e) == r) {
                    holders |= 1ull << l;
                    slot_ok &= L->own_idx(l, L->own_slot(e)) == r;
                }
        for (int l = 0; l < L->sg; l++) {
            if (!(holders >> l & 1u)) continue;
            leaders += (l & red_all) == 0;
            uint64_t closure = 0;
            for (int x = 0; x < 64; x++)
                if ((x & ~red_all) == 0 && (l ^ x) < L->sg) closure |= 1ull << (l ^ x);
            CHECK_MSG(closure == holders, "%s: own row %d: lane %d's reduction partners are not the row's lanes", L->name,
                      r, l);
        }
        CHECK_MSG(slot_ok, "%s: own row %d: FA_OWN_IDX of an element's slot names another row", L->name, r);
        CHECK_MSG(leaders == 1, "%s: own row %d has %d leaders", L->name, r, leaders);
    }
    for (int e = 0; e < L->c_elems; e++)
        CHECK_MSG(L->own_slot(e) >= 0 && L->own_slot(e) < L->own_slots, "%s: element %d on slot %d", L->name, e,
                  L->own_slot(e));
}

/* Runs: a lane's elements e .. e + run - 1 (e a multiple of the run) lie
 * on one row (column) at consecutive columns (rows) from a multiple of the
 * run, which divides 4: forward they share a Philox call (four keys) and
 * fa_put_acc stores them in pairs. The vector loads' runs likewise. */
static void check_runs(const layer *L) {
    CHECK_MSG(4 % L->c_run_n == 0 && 4 % L->c_run_m == 0 && (L->c_run_m == 1 || L->c_run_n == 1),
              "%s: runs %d x %d", L->name, L->c_run_m, L->c_run_n);
    for (int l = 0; l < L->sg; l++) {
        for (int e = 0; e < L->c_elems; e++) {
            const int e0 = e - e % L->c_run_n, e1 = e - e % L->c_run_m;
            CHECK_MSG(L->c_row(l, e) == L->c_row(l, e0) && L->c_col(l, e) == L->c_col(l, e0) + e % L->c_run_n &&
                          L->c_col(l, e0) % L->c_run_n == 0,
                      "%s: lane %d element %d is not in a run of %d along n", L->name, l, e, L->c_run_n);
            CHECK_MSG(L->c_col(l, e) == L->c_col(l, e1) && L->c_row(l, e) == L->c_row(l, e1) + e % L->c_run_m &&
                          L->c_row(l, e1) % L->c_run_m == 0,
                      "%s: lane %d element %d is not in a run of %d along m", L->name, l, e, L->c_run_m);
        }
        for (int i = 0; i < L->a_elems; i++) {
            const int i0 = i - i % L->a_krun;
            CHECK_MSG(L->a_row(l, i) == L->a_row(l, i0) && L->a_col(l, i) == L->a_col(l, i0) + i % L->a_krun &&
                          L->a_col(l, i0) % L->a_krun == 0,
                      "%s: A element %d of lane %d is not in its vector run", L->name, i, l);
        }
        for (int i = 0; i < L->b_elems; i++) {
            const int i0 = i - i % L->b_krun;
            CHECK_MSG(L->b_n(l, i) == L->b_n(l, i0) && L->b_k(l, i) == L->b_k(l, i0) + i % L->b_krun &&
                          L->b_k(l, i0) % L->b_krun == 0,
                      "%s: B element %d of lane %d is not in its vector run", L->name, i, l);
        }
    }
    CHECK_MSG(L->other_run == (L->own_n ? L->c_run_m : L->c_run_n), "%s: FA_OTHER_RUN", L->name);
}

/* NVIDIA: ldmatrix from the addresses the layer gives it (lanes 0-15 for
 * the x2 forms, as the device code reads them) equals the loads' index
 * functions, on a tile with padded rows; the x4 forms of the B loads give
 * two fragments side by side along n (registers 0-1 at n0, 2-3 at n0 +
 * FA_N), as two single loads would. */
static void check_ldmatrix(const layer *L, fa_rng *rng) {
    const int ld = 40, r0 = 16, c0 = 8; /* the fragment's origin inside the tile */
    uint16_t *t = random16(rng, 48 * ld, FA_MMA_IN_F16);
    uint16_t want[32 * 8], half[32 * 4];
    uint32_t regs[32 * 4];
    int row[32], col[32];
    if (!t) return;
    for (int form = 0; form < 6; form++) {
        const int num = form < 2 || form >= 4 ? 4 : 2, trans = form == 1 || form == 3 || form == 5;
        for (int l = 0; l < 32; l++) {
            const int src = num == 2 ? l % 16 : l;
            row[l] = r0 + L->ldsm[2 * form](src);
            col[l] = c0 + L->ldsm[2 * form + 1](src);
        }
        fa_mma_ldmatrix(t, ld, row, col, num, trans, regs);
        switch (form) {
        case 0: load_a(L, t, ld, r0, c0, want); break;
        case 1: load_a_t(L, t, ld, c0, r0, want); break;
        case 2: load_b_nk(L, t, ld, r0, c0, want); break;
        case 3: load_b_kn(L, t, ld, r0, c0, want); break;
        default:
            /* Lane l's registers: its B elements at n0, then at n0 + FA_N. */
            for (int p = 0; p < 2; p++) {
                if (form == 4)
                    load_b_nk(L, t, ld, r0 + p * L->n, c0, half);
                else
                    load_b_kn(L, t, ld, r0, c0 + p * L->n, half);
                for (int l = 0; l < 32; l++)
                    for (int i = 0; i < L->b_elems; i++) want[l * 2 * L->b_elems + p * L->b_elems + i] = half[l * L->b_elems + i];
            }
            break;
        }
        int wrong = 0;
        for (int l = 0; l < 32; l++)
            for (int w = 0; w < num; w++)
                wrong += regs[l * num + w] != ((uint32_t)want[l * 2 * num + 2 * w] | (uint32_t)want[l * 2 * num + 2 * w + 1] << 16);
        CHECK_MSG(wrong == 0, "%s: ldmatrix form %d: %d registers differ from the load's index functions", L->name, form,
                  wrong);
    }
    free(t);
}

/* ------------------------------------------------------------------------ */

static const fa_mma_model *model_of(const layer *L, fa_dtype t) {
    return fa_mma_model_find(t == FA_DTYPE_BF16 ? L->instr_bf16 : L->instr_f16);
}

FA_TEST(instruction_products) {
    layer ls[MAX_LAYERS];
    const int n = layers(ls);
    fa_rng rng;
    fa_rng_seed(&rng, 17);
    for (int i = 0; i < n; i++)
        for (int t = FA_DTYPE_F16; t <= FA_DTYPE_BF16; t++) {
            const fa_mma_model *M = model_of(&ls[i], (fa_dtype)t);
            CHECK_MSG(M != NULL, "%s: no model of %s", ls[i].name, t == FA_DTYPE_BF16 ? ls[i].instr_bf16 : ls[i].instr_f16);
            if (!M) continue;
            CHECK_MSG(M->m == ls[i].m && M->n == ls[i].n && M->k == ls[i].k && M->lanes == ls[i].sg &&
                          M->a_slots == ls[i].a_elems && M->b_slots == ls[i].b_elems && M->c_slots == ls[i].c_elems,
                      "%s: the header's shape is not %s's", ls[i].name, M->instruction);
            check_instruction(&ls[i], M, &rng);
        }
}

/* Every tile side (8 to 128) and head dimension (8 to 256) the planner
 * can give a layer: the products the kernels run on them. */
FA_TEST(kernel_products_every_planned_shape) {
    layer ls[MAX_LAYERS];
    const int n = layers(ls);
    static const int sides[] = {8, 16, 32, 64, 128};
    fa_rng rng;
    fa_rng_seed(&rng, 23);
    for (int i = 0; i < n; i++) {
        const layer *L = &ls[i];
        int shapes = 0;
        for (int t = FA_DTYPE_F16; t <= FA_DTYPE_BF16; t++) {
            const fa_mma_model *M = model_of(L, (fa_dtype)t);
            if (!M) continue;
            for (size_t s = 0; s < sizeof sides / sizeof sides[0]; s++)
                for (int dim = 8; dim <= 256; dim += 8) {
                    const int other = sides[s];
                    if (other % L->other_t || other % L->k || dim % L->k || dim % L->other_t) continue;
                    const int wrong = check_products(L, M, &rng, other, dim);
                    CHECK_MSG(wrong == 0, "%s %s: other side %d, head_dim %d: %d wrong elements", L->name,
                              M->instruction, other, dim, wrong);
                    shapes++;
                }
        }
        fprintf(stderr, "  %-7s %d tile shapes (both dtypes)\n", L->name, shapes);
        CHECK_MSG(shapes > 0, "%s: no shape checked", L->name);
    }
}

FA_TEST(rows_runs_and_loads) {
    layer ls[MAX_LAYERS];
    const int n = layers(ls);
    fa_rng rng;
    fa_rng_seed(&rng, 29);
    for (int i = 0; i < n; i++) {
        check_rows(&ls[i]);
        check_runs(&ls[i]);
        if (ls[i].ldsm[0]) check_ldmatrix(&ls[i], &rng);
    }
}

/* The planner's table (what a plan's layer is) states what the headers
 * state, and names the header that holds it. */
FA_TEST(planner_table_matches_headers) {
    layer ls[MAX_LAYERS];
    const int n = layers(ls);
    int found = 0;
    for (int id = FA_HIP_MMA_NONE + 1; id < FA_HIP_MMA_LAYER_COUNT; id++) {
        const fa_hip_mma_layer_info *info = fa_hip_mma_layer_get((fa_hip_mma_layer)id);
        CHECK(info != NULL);
        if (!info) continue;
        const layer *L = NULL;
        for (int i = 0; i < n; i++)
            if (strcmp(ls[i].name, info->name) == 0) L = &ls[i];
        CHECK_MSG(L != NULL, "planner layer %s has no header here", info->name);
        if (!L) continue;
        found++;
        CHECK_MSG(info->m == L->m && info->n == L->n && info->k == L->k && info->lanes == L->sg &&
                      info->own_n == L->own_n && info->a_elems == L->a_elems && info->b_elems == L->b_elems &&
                      info->c_elems == L->c_elems && info->own_slots == L->own_slots,
                  "%s: the planner's table differs from the header", info->name);
        char path[64];
        snprintf(path, sizeof path, "kernels_hip/mma_%s.h",
                 strcmp(L->name, "nvidia") == 0 ? "nvidia" : strcmp(L->name, "wmma") == 0 ? "rdna3" : "cdna");
        CHECK_MSG(strcmp(info->header, path) == 0, "%s: header %s, expected %s", info->name, info->header, path);
    }
    CHECK(found == n);
    CHECK(fa_hip_mma_layer_get(FA_HIP_MMA_NONE) == NULL && fa_hip_mma_layer_get(FA_HIP_MMA_LAYER_COUNT) == NULL);
}

/* The model's own conversions: fp16 round to nearest even at the edges. */
FA_TEST(model_conversions) {
    CHECK(fa_mma_from_float(1.0f, FA_MMA_IN_F16) == 0x3c00);
    CHECK(fa_mma_from_float(-2.0f, FA_MMA_IN_F16) == 0xc000);
    CHECK(fa_mma_from_float(65504.0f, FA_MMA_IN_F16) == 0x7bff);
    CHECK(fa_mma_from_float(65520.0f, FA_MMA_IN_F16) == 0x7c00);
    CHECK(fa_mma_from_float(1.0f + 1.0f / 2048.0f, FA_MMA_IN_F16) == 0x3c00);          /* tie to even */
    CHECK(fa_mma_from_float(1.0f + 3.0f / 2048.0f, FA_MMA_IN_F16) == 0x3c02);          /* tie to even, up */
    CHECK(fa_mma_from_float(ldexpf(1.0f, -24), FA_MMA_IN_F16) == 0x0001);             /* smallest subnormal */
    CHECK(fa_mma_from_float(ldexpf(1.0f, -14), FA_MMA_IN_F16) == 0x0400);             /* smallest normal */
    CHECK(fa_mma_from_float(ldexpf(1023.5f, -24), FA_MMA_IN_F16) == 0x0400);          /* subnormal carries */
    CHECK(fa_mma_from_float(1.0f, FA_MMA_IN_BF16) == 0x3f80);
    for (int h = 0; h < 0x7c00; h += 7) {
        CHECK(fa_mma_from_float(fa_mma_to_float((uint16_t)h, FA_MMA_IN_F16), FA_MMA_IN_F16) == h);
        CHECK(fa_mma_from_float(fa_mma_to_float((uint16_t)h, FA_MMA_IN_BF16), FA_MMA_IN_BF16) == h);
    }
    CHECK(fa_mma_model_find("no such instruction") == NULL && fa_mma_model_find(NULL) == NULL);
    CHECK(fa_mma_model_get(-1) == NULL && fa_mma_model_get(fa_mma_model_count()) == NULL);
}

FA_TEST_MAIN(FA_CASE(instruction_products), FA_CASE(kernel_products_every_planned_shape), FA_CASE(rows_runs_and_loads),
             FA_CASE(planner_table_matches_headers), FA_CASE(model_conversions))
