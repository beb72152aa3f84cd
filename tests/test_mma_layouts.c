/* The fragment layers of the OpenCL matrix-unit kernels
 * (kernels_cl/mma_<layout>.h) against the documented lane layouts of their
 * instructions: the model the HIP layers are held to as well
 * (tests/mma_model.c), on the host, for every layout and both dtypes:
 * NVIDIA mma.sync m16n8k16, Intel DPAS 8x8x16, AMD MFMA 32x32x8 and
 * 16x16x16, AMD WMMA 16x16x16. The index functions are the headers' own
 * macros (compiled here as C with FA_HOST_MODEL), fed through the model:
 * - one instruction on fragments laid out by the index functions (operands
 *   swapped where the layer swaps them, FA_SWAPPED) gives the plain
 *   product, every element of C held by exactly one lane;
 * - the kernels' two products over one strip of rows, at every other side
 *   (8 to 128) and head_dim (8 to 256, padded with zeros to whole
 *   fragments) the planner can give the layout: scores over head_dim, then
 *   the scores turned into the 16-bit A operand of the next product
 *   through FA_C2A_* (registers, or an exchange of lanes) times a tile of
 *   that many rows;
 * - the lanes the reduction masks reach from a lane are exactly the lanes
 *   that hold its rows, in the same slot, one of them owning the row; the
 *   runs of elements sharing a Philox call (FA_C_RUN) are what they claim;
 * - the layout table the planner and the backend read (core/mma_layouts.h)
 *   states what the headers state. */
#include "harness.h"
#include "mma_layouts.h"
#include "mma_model.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FA_HOST_MODEL 1

typedef int (*idx2)(int, int);

/* One layout, read from its header. */
typedef struct cl_layer {
    fa_mma_layout id;
    const char *instr_f16, *instr_bf16;
    int sg, m, n, k, a_words, b_words, c_elems, c_rows, c2a, c2a_exchange, run, swapped, red_steps, red_mask[6];
    idx2 a_row, a_col, b_k, b_n, c_row, c_col, slot_row;
    int (*slot)(int e);
    int (*c2a_tile)(int ks, int i), (*c2a_elem)(int ks, int i), (*c2a_lane)(int l, int ks, int i);
} cl_layer;

#define RED_MASK_OR_0(i) (FA_RED_STEPS > (i) ? FA_RED_MASK(i) : 0)

/* The functions and table entry of the layout whose macros are in scope. */
#define CAPTURE_LAYOUT(P, ID)                                                                                      \
    static int P##_a_row(int l, int i) { return FA_A_ROW(l, i); }                                                  \
    static int P##_a_col(int l, int i) { return FA_A_COL(l, i); }                                                  \
    static int P##_b_k(int l, int i) { return FA_B_K(l, i); }                                                      \
    static int P##_b_n(int l, int i) { return FA_B_N(l, i); }                                                      \
    static int P##_c_row(int l, int e) { return FA_C_ROW(l, e); }                                                  \
    static int P##_c_col(int l, int e) { return FA_C_COL(l, e); }                                                  \
    static int P##_slot(int e) { return FA_C_SLOT(e); }                                                            \
    static int P##_slot_row(int l, int s) { return FA_C_SLOT_ROW(l, s); }                                          \
    static int P##_c2a_tile(int ks, int i) { return FA_C2A_TILE(ks, i); }                                          \
    static int P##_c2a_elem(int ks, int i) { return FA_C2A_ELEM(ks, i); }                                          \
    static int P##_c2a_lane(int l, int ks, int i) { return FA_C2A_LANE(l, ks, i); }                                \
    static cl_layer P##_layer(void) {                                                                              \
        cl_layer L = {ID, FA_INSTR_F16, FA_INSTR_BF16, FA_SG, FA_M, FA_N, FA_K, FA_A_WORDS, FA_B_WORDS,            \
                      FA_C_ELEMS, FA_C_ROWS, FA_C2A_REGS, CL_C2A_EXCHANGE, FA_C_RUN, FA_SWAPPED, FA_RED_STEPS,     \
                      {RED_MASK_OR_0(0), RED_MASK_OR_0(1), RED_MASK_OR_0(2), RED_MASK_OR_0(3), RED_MASK_OR_0(4),   \
                       RED_MASK_OR_0(5)},                                                                          \
                      P##_a_row, P##_a_col, P##_b_k, P##_b_n, P##_c_row, P##_c_col, P##_slot_row, P##_slot,        \
                      P##_c2a_tile, P##_c2a_elem, P##_c2a_lane};                                                   \
        return L;                                                                                                  \
    }

#include "kernels_cl/mma_nvidia.h"
#include "cl_mma_layer_defaults.h"
CAPTURE_LAYOUT(nvidia, FA_MMA_LAYOUT_NVIDIA)
#include "cl_mma_layer_undef.h"
#undef CL_C2A_EXCHANGE

#include "kernels_cl/mma_intel.h"
#include "cl_mma_layer_defaults.h"
CAPTURE_LAYOUT(intel, FA_MMA_LAYOUT_INTEL)
#include "cl_mma_layer_undef.h"
#undef CL_C2A_EXCHANGE

#include "kernels_cl/mma_amd_mfma.h"
#include "cl_mma_layer_defaults.h"
CAPTURE_LAYOUT(mfma32, FA_MMA_LAYOUT_AMD_MFMA)
#include "cl_mma_layer_undef.h"
#undef CL_C2A_EXCHANGE

#define FA_MMA_AMD_MFMA16 1
#include "kernels_cl/mma_amd_mfma.h"
#include "cl_mma_layer_defaults.h"
CAPTURE_LAYOUT(mfma16, FA_MMA_LAYOUT_AMD_MFMA16)
#include "cl_mma_layer_undef.h"
#undef CL_C2A_EXCHANGE
#undef FA_MMA_AMD_MFMA16

#include "kernels_cl/mma_amd_wmma.h"
#include "cl_mma_layer_defaults.h"
CAPTURE_LAYOUT(wmma, FA_MMA_LAYOUT_AMD_WMMA)
#include "cl_mma_layer_undef.h"
#undef CL_C2A_EXCHANGE

#define N_LAYERS 5
static void layers(cl_layer out[N_LAYERS]) {
    out[0] = nvidia_layer();
    out[1] = intel_layer();
    out[2] = mfma32_layer();
    out[3] = mfma16_layer();
    out[4] = wmma_layer();
}

static const char *name_of(const cl_layer *L) { return fa_mma_layout_get(L->id)->name; }

static const fa_mma_model *model_of(const cl_layer *L, fa_mma_input t) {
    return fa_mma_model_find(t == FA_MMA_IN_BF16 ? L->instr_bf16 : L->instr_f16);
}

/* ------------------------------------------------------------------------ */
/* Fragments of a whole sub-group, 16-bit element i of lane l at
 * [l * elems + i], as the loads of mma_generic.h give them. */

static void load_a(const cl_layer *L, const uint16_t *t, int ld, int r0, int k0, uint16_t *a) {
    const int e = 2 * L->a_words;
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < e; i++) a[l * e + i] = t[(r0 + L->a_row(l, i)) * ld + k0 + L->a_col(l, i)];
}

/* B from a tile of rows n (n_rows) or of rows k. */
static void load_b(const cl_layer *L, const uint16_t *t, int ld, int n0, int k0, int n_rows, uint16_t *b) {
    const int e = 2 * L->b_words;
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < e; i++) {
            const int n = n0 + L->b_n(l, i), kk = k0 + L->b_k(l, i);
            b[l * e + i] = n_rows ? t[n * ld + kk] : t[kk * ld + n];
        }
}

/* The layer's operation: the instruction on (a, b), or on (b, a) where the
 * layer swaps them. Returns the copies that disagree (0: well formed). */
static int layer_mma(const cl_layer *L, const fa_mma_model *M, const uint16_t *a, const uint16_t *b, float *c) {
    return L->swapped ? fa_mma_model_run(M, b, a, c) : fa_mma_model_run(M, a, b, c);
}

static uint16_t *random16(fa_rng *rng, int rows, int cols, int valid_cols, fa_mma_input t) {
    uint16_t *m = calloc((size_t)rows * (size_t)cols, sizeof *m);
    for (int r = 0; m && r < rows; r++)
        for (int c = 0; c < valid_cols; c++)
            m[r * cols + c] = fa_mma_from_float((float)fa_rng_uniform(rng, -2.0, 2.0), t);
    return m;
}

/* Whether got is sum_i x[i xs] y[i ys] (exact in double) up to fp32's
 * roundings. */
static int is_sum(float got, const uint16_t *x, int xs, const uint16_t *y, int ys, int n, fa_mma_input t) {
    double want = 0.0, scale = 0.0;
    for (int i = 0; i < n; i++) {
        const double term = (double)fa_mma_to_float(x[i * xs], t) * fa_mma_to_float(y[i * ys], t);
        want += term;
        scale += fabs(term);
    }
    return fabs(got - want) <= 1e-6 * scale + 1e-12;
}

/* ------------------------------------------------------------------------ */

/* One operation: C = A B through the fragments, each element of C held
 * once. */
static void check_instruction(const cl_layer *L, const fa_mma_model *M, fa_rng *rng) {
    uint16_t *A = random16(rng, L->m, L->k, L->k, M->input), *B = random16(rng, L->k, L->n, L->n, M->input);
    uint16_t *a = calloc((size_t)(L->sg * 2 * L->a_words), 2), *b = calloc((size_t)(L->sg * 2 * L->b_words), 2);
    float *c = calloc((size_t)(L->sg * L->c_elems), sizeof(float));
    int *held = calloc((size_t)(L->m * L->n), sizeof(int));
    if (A && B && a && b && c && held) {
        load_a(L, A, L->k, 0, 0, a);
        load_b(L, B, L->n, 0, 0, 0, b);
        const int disagree = layer_mma(L, M, a, b, c);
        int wrong = 0, outside = 0, not_once = 0;
        for (int l = 0; l < L->sg; l++)
            for (int e = 0; e < L->c_elems; e++) {
                const int r = L->c_row(l, e), col = L->c_col(l, e);
                if (r < 0 || r >= L->m || col < 0 || col >= L->n) {
                    outside++;
                    continue;
                }
                held[r * L->n + col]++;
                wrong += !is_sum(c[l * L->c_elems + e], A + r * L->k, 1, B + col, L->n, L->k, M->input);
            }
        for (int i = 0; i < L->m * L->n; i++) not_once += held[i] != 1;
        CHECK_MSG(disagree == 0 && wrong == 0 && outside == 0 && not_once == 0,
                  "%s %s: %d operand copies disagree, %d elements wrong, %d outside C, %d not held once", name_of(L),
                  M->instruction, disagree, wrong, outside, not_once);
    }
    free(A);
    free(B);
    free(a);
    free(b);
    free(c);
    free(held);
}

/* The A operand of k-step ks from the accumulators acc (n-tiles of one
 * strip, fragment t of lane l at [(t * sg + l) * c_elems]), rounded to 16
 * bits, as fa_c_to_a takes it. Returns the indices out of range. */
static int c_to_a(const cl_layer *L, const float *acc, int tiles, int ks, fa_mma_input type, uint16_t *a) {
    const int e = 2 * L->a_words;
    int bad = 0;
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < e; i++) {
            const int t = L->c2a_tile(ks, i), el = L->c2a_elem(ks, i), src = L->c2a_lane(l, ks, i);
            if (t < 0 || t >= tiles || el < 0 || el >= L->c_elems || src < 0 || src >= L->sg) {
                bad++;
                continue;
            }
            a[l * e + i] = fa_mma_from_float(acc[((size_t)t * L->sg + src) * L->c_elems + el], type);
        }
    return bad;
}

/* The kernels' products over one strip of m own rows: S = Own Oth^T over
 * dim (head_dim padded to dp), then O = S16 Z over the `other` rows of Z,
 * with S16 the A operand from the accumulators. Returns the wrong
 * elements. */
static int check_products(const cl_layer *L, const fa_mma_model *M, fa_rng *rng, int other, int dim, int dp) {
    const fa_mma_input t = M->input;
    const int nt = other / L->n, ks_s = dp / L->k, ks_o = other / L->k, nt_o = dp / L->n, ae = 2 * L->a_words;
    uint16_t *Own = random16(rng, L->m, dp, dim, t), *Oth = random16(rng, other, dp, dim, t);
    uint16_t *Z = random16(rng, other, dp, dim, t), *S16 = calloc((size_t)(L->m * other), 2);
    uint16_t *a = calloc((size_t)(L->sg * ae), 2), *b = calloc((size_t)(L->sg * 2 * L->b_words), 2);
    float *s = calloc((size_t)(nt * L->sg * L->c_elems), sizeof(float));
    float *o = calloc((size_t)(nt_o * L->sg * L->c_elems), sizeof(float));
    int wrong = 0;
    if (!Own || !Oth || !Z || !S16 || !a || !b || !s || !o) {
        wrong = -1;
        goto out;
    }
    for (int j = 0; j < nt; j++)
        for (int ks = 0; ks < ks_s; ks++) {
            load_a(L, Own, dp, 0, ks * L->k, a);
            load_b(L, Oth, dp, j * L->n, ks * L->k, 1, b);
            wrong += layer_mma(L, M, a, b, s + (size_t)j * L->sg * L->c_elems) != 0;
        }
    for (int j = 0; j < nt; j++)
        for (int l = 0; l < L->sg; l++)
            for (int e = 0; e < L->c_elems; e++) {
                const int r = L->c_row(l, e), c = j * L->n + L->c_col(l, e);
                const float got = s[((size_t)j * L->sg + l) * L->c_elems + e];
                wrong += !is_sum(got, Own + r * dp, 1, Oth + c * dp, 1, dp, t);
                S16[r * other + c] = fa_mma_from_float(got, t);
            }
    for (int f = 0; f < nt_o; f++)
        for (int p = 0; p < ks_o; p++) {
            wrong += c_to_a(L, s, nt, p, t, a);
            load_b(L, Z, dp, f * L->n, p * L->k, 0, b);
            wrong += layer_mma(L, M, a, b, o + (size_t)f * L->sg * L->c_elems) != 0;
        }
    for (int f = 0; f < nt_o; f++)
        for (int l = 0; l < L->sg; l++)
            for (int e = 0; e < L->c_elems; e++) {
                const int r = L->c_row(l, e), x = f * L->n + L->c_col(l, e);
                wrong += !is_sum(o[((size_t)f * L->sg + l) * L->c_elems + e], S16 + r * other, 1, Z + x, dp, other, t);
            }
out:
    free(Own);
    free(Oth);
    free(Z);
    free(S16);
    free(a);
    free(b);
    free(s);
    free(o);
    return wrong;
}

/* For every lane and row slot: the lanes holding that row are the lane's
 * xor-reach under the masks, all in the same slot, one of them (no mask
 * bit set) owning it; every element on a valid slot of its own row. */
static void check_rows(const cl_layer *L) {
    int reach_all = 0, bad_sets = 0, bad_owner = 0, bad_slot = 0;
    for (int i = 0; i < L->red_steps; i++) reach_all |= L->red_mask[i];
    for (int l = 0; l < L->sg; l++) {
        for (int e = 0; e < L->c_elems; e++) {
            const int sl = L->slot(e);
            bad_slot += sl < 0 || sl >= L->c_rows || L->slot_row(l, sl) != L->c_row(l, e);
        }
        for (int sl = 0; sl < L->c_rows; sl++) {
            const int row = L->slot_row(l, sl);
            int owners = 0;
            for (int other = 0; other < L->sg; other++) {
                int holds = 0, in_slot = 1;
                for (int e = 0; e < L->c_elems; e++)
                    if (L->c_row(other, e) == row) {
                        holds = 1;
                        in_slot &= L->slot(e) == sl;
                    }
                const int reached = ((l ^ other) & ~reach_all) == 0;
                bad_sets += holds != reached || (holds && !in_slot);
                owners += holds && (other & reach_all) == 0;
            }
            bad_owner += owners != 1;
        }
    }
    CHECK_MSG(bad_sets == 0 && bad_owner == 0 && bad_slot == 0,
              "%s: %d lanes off their rows' reduction sets, %d rows without one owner, %d elements off their slot",
              name_of(L), bad_sets, bad_owner, bad_slot);
}

/* Elements e .. e + run - 1 (e a multiple of the run) of a lane: one row,
 * consecutive columns from a multiple of the run, which divides 4. */
static void check_runs(const cl_layer *L) {
    int bad = 4 % L->run != 0;
    for (int l = 0; l < L->sg; l++)
        for (int e = 0; e < L->c_elems; e++) {
            const int e0 = e - e % L->run;
            bad += L->c_row(l, e) != L->c_row(l, e0) || L->c_col(l, e) != L->c_col(l, e0) + e % L->run ||
                   L->c_col(l, e0) % L->run != 0;
        }
    CHECK_MSG(bad == 0, "%s: %d elements break runs of %d", name_of(L), bad, L->run);
}

/* ------------------------------------------------------------------------ */

FA_TEST(instruction_products) {
    cl_layer ls[N_LAYERS];
    layers(ls);
    fa_rng rng;
    fa_rng_seed(&rng, 31);
    for (int i = 0; i < N_LAYERS; i++)
        for (int t = FA_MMA_IN_F16; t <= FA_MMA_IN_BF16; t++) {
            const cl_layer *L = &ls[i];
            const fa_mma_model *M = model_of(L, (fa_mma_input)t);
            CHECK_MSG(M != NULL, "%s: no model of %s", name_of(L), t ? L->instr_bf16 : L->instr_f16);
            if (!M) continue;
            /* The instruction's shape is the layer's, transposed where the
             * operands are swapped. */
            const int mm = L->swapped ? L->n : L->m, nn = L->swapped ? L->m : L->n;
            const int a_slots = 2 * (L->swapped ? L->b_words : L->a_words);
            const int b_slots = 2 * (L->swapped ? L->a_words : L->b_words);
            CHECK_MSG(M->m == mm && M->n == nn && M->k == L->k && M->lanes == L->sg && M->a_slots == a_slots &&
                          M->b_slots == b_slots && M->c_slots == L->c_elems,
                      "%s: the header's shape is not %s's", name_of(L), M->instruction);
            check_instruction(L, M, &rng);
        }
}

/* Every other side (8 to 128) and head dim (8 to 256) the planner can give
 * a layout: the products the kernels run on them. */
FA_TEST(kernel_products_every_planned_shape) {
    cl_layer ls[N_LAYERS];
    layers(ls);
    static const int sides[] = {8, 16, 32, 64, 128};
    fa_rng rng;
    fa_rng_seed(&rng, 37);
    for (int i = 0; i < N_LAYERS; i++) {
        const cl_layer *L = &ls[i];
        const int align = L->k > L->n ? L->k : L->n;
        int shapes = 0;
        for (int t = FA_MMA_IN_F16; t <= FA_MMA_IN_BF16; t++) {
            const fa_mma_model *M = model_of(L, (fa_mma_input)t);
            if (!M) continue;
            for (size_t s = 0; s < sizeof sides / sizeof sides[0]; s++)
                for (int dim = 8; dim <= 256; dim += 8) {
                    const int other = sides[s], dp = (dim + align - 1) / align * align;
                    if (other % L->n || other % L->k) continue;
                    const int wrong = check_products(L, M, &rng, other, dim, dp);
                    CHECK_MSG(wrong == 0, "%s %s: other side %d, head_dim %d: %d wrong elements", name_of(L),
                              M->instruction, other, dim, wrong);
                    shapes++;
                }
        }
        fprintf(stderr, "  %-10s %d tile shapes (both dtypes)\n", name_of(L), shapes);
        CHECK_MSG(shapes > 0, "%s: no shape checked", name_of(L));
    }
}

FA_TEST(rows_and_runs) {
    cl_layer ls[N_LAYERS];
    layers(ls);
    for (int i = 0; i < N_LAYERS; i++) {
        check_rows(&ls[i]);
        check_runs(&ls[i]);
    }
}

/* The table the planner and the backend read states what the headers
 * state, and every layout is there once. */
FA_TEST(table_matches_headers) {
    cl_layer ls[N_LAYERS];
    layers(ls);
    CHECK(FA_MMA_LAYOUT_COUNT == N_LAYERS + 1);
    for (int i = 0; i < N_LAYERS; i++) {
        const cl_layer *L = &ls[i];
        const fa_mma_layout_info *t = fa_mma_layout_get(L->id);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK_MSG(t->m == L->m && t->n == L->n && t->k == L->k && t->sub_group == L->sg && t->a_words == L->a_words &&
                      t->b_words == L->b_words && t->c_elems == L->c_elems && t->c_rows == L->c_rows &&
                      t->c2a_regs == L->c2a && t->c2a_exchange == L->c2a_exchange,
                  "%s: core/mma_layouts.c and %s disagree", t->name, t->header);
        CHECK(fa_mma_layout_named(t->name) == L->id);
        const fa_mma_layout_info *family = fa_mma_layout_get(t->family);
        CHECK_MSG(family && family->family == t->family && strcmp(family->header, t->header) == 0 &&
                      family->sub_group == t->sub_group,
                  "%s: its family %s is no family of one header and sub-group", t->name, family ? family->name : "-");
    }
    CHECK(fa_mma_layout_named("tpu") == FA_MMA_LAYOUT_NONE && fa_mma_layout_get(FA_MMA_LAYOUT_NONE) == NULL &&
          fa_mma_layout_get(FA_MMA_LAYOUT_COUNT) == NULL);
}

/* A device's layouts: its family's, the family first, by its matrix
 * shape; none off OpenCL or without a rate. */
FA_TEST(layouts_of_devices) {
    fa_device_desc dev;
    memset(&dev, 0, sizeof dev);
    dev.backend = FA_BACKEND_OPENCL;
    dev.matrix_flops_per_clock_cu = 1024.0;
    fa_mma_layout ids[FA_MMA_MAX_LAYOUTS];
    for (int i = 1; i < FA_MMA_LAYOUT_COUNT; i++) {
        const fa_mma_layout_info *t = fa_mma_layout_get((fa_mma_layout)i);
        if ((int)t->family != i) continue;
        dev.matrix_m = t->m;
        dev.matrix_n = t->n;
        dev.matrix_k = t->k;
        const int n = fa_mma_layouts_of(&dev, ids);
        const fa_mma_layout family = (fa_mma_layout)i;
        int members = 0;
        for (int j = 1; j < FA_MMA_LAYOUT_COUNT; j++) members += fa_mma_layout_get((fa_mma_layout)j)->family == family;
        CHECK_MSG(fa_mma_layout_of(&dev) == family && n == members && ids[0] == family, "%s: %d layouts, family %d",
                  t->name, n, (int)fa_mma_layout_of(&dev));
        for (int j = 0; j < n; j++) CHECK(fa_mma_layout_get(ids[j])->family == family);
    }
    dev.matrix_m = 32;
    dev.matrix_n = 32;
    dev.matrix_k = 8;
    CHECK(fa_mma_layouts_of(&dev, ids) == 2 && ids[0] == FA_MMA_LAYOUT_AMD_MFMA && ids[1] == FA_MMA_LAYOUT_AMD_MFMA16);
    dev.backend = FA_BACKEND_HIP;
    CHECK(fa_mma_layout_of(&dev) == FA_MMA_LAYOUT_NONE && fa_mma_layouts_of(&dev, ids) == 0);
    dev.backend = FA_BACKEND_OPENCL;
    dev.matrix_flops_per_clock_cu = 0.0;
    CHECK(fa_mma_layouts_of(&dev, ids) == 0);
}

FA_TEST_MAIN(FA_CASE(instruction_products), FA_CASE(kernel_products_every_planned_shape), FA_CASE(rows_and_runs),
             FA_CASE(table_matches_headers), FA_CASE(layouts_of_devices))
