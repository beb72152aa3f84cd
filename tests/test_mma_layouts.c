/* The fragment layouts of the OpenCL matrix-unit kernels, on the host: the
 * index functions of kernels_cl/mma_<layout>.h (included here as plain C,
 * FA_HOST_MODEL) against a plain matrix product and against the layout
 * table the planner and the backend read (core/mma_layouts.h). For every
 * layout:
 * - A, B and C fragments cover their matrices, every element held the same
 *   number of times (C exactly once), every index in range;
 * - an instruction run on fragments laid out by the index functions gives,
 *   read back through them, the plain product;
 * - the lanes the reduction masks reach from a lane are exactly the lanes
 *   that hold its rows, in the same slot, and one of them owns the row;
 * - where accumulators turn into A operands in registers, each A element
 *   is the accumulator element of the same row and column;
 * - paired elements (FA_C_PAIRED) share a row and an even column pair. */
#include "harness.h"
#include "mma_layouts.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct layout_model {
    fa_mma_layout id;
    int sg, m, n, k, a_words, b_words, c_elems, c_rows, c2a, paired, red_steps;
    int (*a_row)(int l, int i), (*a_col)(int l, int i);
    int (*b_k)(int l, int i), (*b_n)(int l, int i);
    int (*c_row)(int l, int e), (*c_col)(int l, int e);
    int (*slot)(int e), (*slot_row)(int l, int s);
    int (*red_mask)(int step);
    int (*c2a_tile)(int i), (*c2a_elem)(int i);
} layout_model;

#define FA_HOST_MODEL

/* A model of the layout whose macros are defined now; undone after. */
#define MODEL(name, ID)                                                                    \
    static int name##_a_row(int l, int i) { return FA_A_ROW(l, i); }                       \
    static int name##_a_col(int l, int i) { return FA_A_COL(l, i); }                       \
    static int name##_b_k(int l, int i) { return FA_B_K(l, i); }                           \
    static int name##_b_n(int l, int i) { return FA_B_N(l, i); }                           \
    static int name##_c_row(int l, int e) { return FA_C_ROW(l, e); }                       \
    static int name##_c_col(int l, int e) { return FA_C_COL(l, e); }                       \
    static int name##_slot(int e) { return FA_C_SLOT(e); }                                 \
    static int name##_slot_row(int l, int s) { return FA_C_SLOT_ROW(l, s); }               \
    static int name##_red_mask(int i) { return FA_RED_MASK(i); }                           \
    static int name##_c2a_tile(int i) { return NAME_C2A_TILE(i); }                         \
    static int name##_c2a_elem(int i) { return NAME_C2A_ELEM(i); }                         \
    static const layout_model name##_model = {                                             \
        ID, FA_SG, FA_M, FA_N, FA_K, FA_A_WORDS, FA_B_WORDS, FA_C_ELEMS, FA_C_ROWS, FA_C2A_REGS, \
        NAME_PAIRED, FA_RED_STEPS, name##_a_row, name##_a_col, name##_b_k, name##_b_n,     \
        name##_c_row, name##_c_col, name##_slot, name##_slot_row, name##_red_mask,         \
        name##_c2a_tile, name##_c2a_elem}

#include "kernels_cl/mma_nvidia.h"
#define NAME_C2A_TILE(i) FA_C2A_TILE(i)
#define NAME_C2A_ELEM(i) FA_C2A_ELEM(i)
#define NAME_PAIRED FA_C_PAIRED
MODEL(nvidia, FA_MMA_LAYOUT_NVIDIA);
#undef NAME_C2A_TILE
#undef NAME_C2A_ELEM
#undef NAME_PAIRED

static const layout_model *const models[] = {&nvidia_model};

#define MAX_LANES 64
#define MAX_DIM 32

/* Coverage: every (row, col) of a rows x cols matrix held `times` times by
 * (lane, element), all indices in range. */
static void check_cover(const char *what, const layout_model *L, int rows, int cols, int elems,
                        int (*row)(int, int), int (*col)(int, int)) {
    int count[MAX_DIM][MAX_DIM];
    memset(count, 0, sizeof count);
    int out_of_range = 0;
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < elems; i++) {
            const int r = row(l, i), c = col(l, i);
            if (r < 0 || r >= rows || c < 0 || c >= cols) {
                out_of_range++;
                continue;
            }
            count[r][c]++;
        }
    const int times = L->sg * elems / (rows * cols);
    int uneven = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) uneven += count[r][c] != times;
    CHECK_MSG(out_of_range == 0 && uneven == 0 && times >= 1 && L->sg * elems == times * rows * cols,
              "%s %s: %d indices out of range, %d elements not held %d times", fa_mma_layout_get(L->id)->name, what,
              out_of_range, uneven, times);
}

/* A random small integer matrix product through the fragments: exact in
 * any order. */
static void check_product(const layout_model *L) {
    int a[MAX_DIM][MAX_DIM], b[MAX_DIM][MAX_DIM];
    uint32_t x = 12345u;
    for (int r = 0; r < L->m; r++)
        for (int c = 0; c < L->k; c++) a[r][c] = (int)((x = x * 1664525u + 1013904223u) >> 28) - 8;
    for (int r = 0; r < L->k; r++)
        for (int c = 0; c < L->n; c++) b[r][c] = (int)((x = x * 1664525u + 1013904223u) >> 28) - 8;
    /* Fragments as the loads give them. */
    int fa[MAX_LANES][2 * 16], fb[MAX_LANES][2 * 16];
    for (int l = 0; l < L->sg; l++) {
        for (int i = 0; i < 2 * L->a_words; i++) fa[l][i] = a[L->a_row(l, i)][L->a_col(l, i)];
        for (int i = 0; i < 2 * L->b_words; i++) fb[l][i] = b[L->b_k(l, i)][L->b_n(l, i)];
    }
    /* The instruction: the matrices as the lanes hold them (a replicated
     * element must agree), then each lane's accumulator elements. */
    int ga[MAX_DIM][MAX_DIM], gb[MAX_DIM][MAX_DIM], disagree = 0;
    for (int l = 0; l < L->sg; l++) {
        for (int i = 0; i < 2 * L->a_words; i++) ga[L->a_row(l, i)][L->a_col(l, i)] = fa[l][i];
        for (int i = 0; i < 2 * L->b_words; i++) gb[L->b_k(l, i)][L->b_n(l, i)] = fb[l][i];
    }
    for (int l = 0; l < L->sg; l++) {
        for (int i = 0; i < 2 * L->a_words; i++) disagree += ga[L->a_row(l, i)][L->a_col(l, i)] != fa[l][i];
        for (int i = 0; i < 2 * L->b_words; i++) disagree += gb[L->b_k(l, i)][L->b_n(l, i)] != fb[l][i];
    }
    int wrong = 0;
    for (int l = 0; l < L->sg; l++)
        for (int e = 0; e < L->c_elems; e++) {
            const int r = L->c_row(l, e), c = L->c_col(l, e);
            int got = 0, want = 0;
            for (int k = 0; k < L->k; k++) {
                got += ga[r][k] * gb[k][c];
                want += a[r][k] * b[k][c];
            }
            wrong += got != want;
        }
    CHECK_MSG(disagree == 0 && wrong == 0, "%s: %d replicated elements disagree, %d products wrong",
              fa_mma_layout_get(L->id)->name, disagree, wrong);
}

/* The reduction masks reach exactly the lanes of a lane's rows. */
static void check_rows(const layout_model *L) {
    int bad = 0, owners_bad = 0, slot_bad = 0, all = 0;
    for (int i = 0; i < L->red_steps; i++) all |= L->red_mask(i);
    for (int l = 0; l < L->sg; l++) {
        for (int e = 0; e < L->c_elems; e++) slot_bad += L->slot(e) < 0 || L->slot(e) >= L->c_rows ||
                                                         L->c_row(l, e) != L->slot_row(l, L->slot(e));
        for (int s = 0; s < L->c_rows; s++) {
            const int row = L->slot_row(l, s);
            /* Lanes that hold the row, and whether in slot s. */
            int holds[MAX_LANES] = {0}, same_slot = 1;
            for (int m = 0; m < L->sg; m++)
                for (int e = 0; e < L->c_elems; e++)
                    if (L->c_row(m, e) == row) {
                        holds[m] = 1;
                        same_slot &= L->slot(e) == s;
                    }
            int reach[MAX_LANES] = {0}, owners = 0;
            for (int x = 0; x < L->sg; x++)
                if ((x & ~all) == 0) reach[l ^ x] = 1;
            for (int m = 0; m < L->sg; m++) {
                bad += holds[m] != reach[m];
                owners += holds[m] && (m & all) == 0;
            }
            bad += !same_slot;
            owners_bad += owners != 1;
        }
    }
    CHECK_MSG(bad == 0 && owners_bad == 0 && slot_bad == 0,
              "%s: %d lane sets differ from the masks' reach, %d rows without one owner, %d elements off their slot",
              fa_mma_layout_get(L->id)->name, bad, owners_bad, slot_bad);
}

/* Accumulators of the n-tiles of one k-step as the A operand. */
static void check_c_to_a(const layout_model *L) {
    if (!L->c2a) return;
    int wrong = 0;
    for (int l = 0; l < L->sg; l++)
        for (int i = 0; i < 2 * L->a_words; i++) {
            const int t = L->c2a_tile(i), e = L->c2a_elem(i);
            wrong += t < 0 || t >= L->k / L->n || e < 0 || e >= L->c_elems || L->c_row(l, e) != L->a_row(l, i) ||
                     t * L->n + L->c_col(l, e) != L->a_col(l, i);
        }
    CHECK_MSG(wrong == 0, "%s: %d A elements are not the accumulator of their row and column",
              fa_mma_layout_get(L->id)->name, wrong);
}

static void check_pairs(const layout_model *L) {
    if (!L->paired) return;
    int wrong = 0;
    for (int l = 0; l < L->sg; l++)
        for (int e = 0; e + 1 < L->c_elems; e += 2)
            wrong += L->c_row(l, e) != L->c_row(l, e + 1) || L->c_col(l, e) % 2 != 0 ||
                     L->c_col(l, e + 1) != L->c_col(l, e) + 1;
    CHECK_MSG(wrong == 0, "%s: %d element pairs are not two columns of a row", fa_mma_layout_get(L->id)->name, wrong);
}

FA_TEST(table_matches_headers) {
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        const layout_model *L = models[i];
        const fa_mma_layout_info *t = fa_mma_layout_get(L->id);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK_MSG(t->m == L->m && t->n == L->n && t->k == L->k && t->sub_group == L->sg && t->a_words == L->a_words &&
                      t->b_words == L->b_words && t->c_elems == L->c_elems && t->c_rows == L->c_rows &&
                      t->c2a_regs == L->c2a,
                  "%s: core/mma_layouts.c and %s disagree", t->name, t->header);
        CHECK(fa_mma_layout_named(t->name) == L->id);
        /* Fragment sizes: a lane's share of A (m x k), B (k x n), C (m x n). */
        CHECK(L->sg * 2 * L->a_words >= L->m * L->k && L->sg * 2 * L->b_words >= L->k * L->n);
        CHECK(L->sg * L->c_elems == L->m * L->n && L->c_elems % L->c_rows == 0);
    }
    CHECK(fa_mma_layout_named("tpu") == FA_MMA_LAYOUT_NONE && fa_mma_layout_get(FA_MMA_LAYOUT_NONE) == NULL);
}

FA_TEST(fragments_cover_matrices) {
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        const layout_model *L = models[i];
        check_cover("A", L, L->m, L->k, 2 * L->a_words, L->a_row, L->a_col);
        check_cover("B", L, L->k, L->n, 2 * L->b_words, L->b_k, L->b_n);
        check_cover("C", L, L->m, L->n, L->c_elems, L->c_row, L->c_col);
    }
}

FA_TEST(product_through_fragments) {
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) check_product(models[i]);
}

FA_TEST(row_reductions) {
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) check_rows(models[i]);
}

FA_TEST(accumulators_as_operands) {
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        check_c_to_a(models[i]);
        check_pairs(models[i]);
    }
}

FA_TEST_MAIN(FA_CASE(table_matches_headers), FA_CASE(fragments_cover_matrices), FA_CASE(product_through_fragments),
             FA_CASE(row_reductions), FA_CASE(accumulators_as_operands))
