/* Lane layouts of matrix instructions, element -> (lane, slot), from:
 * - NVIDIA: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
 *   type" (groupID = lane / 4, threadID_in_group = lane % 4);
 * - AMD CDNA2/CDNA3: the MI200 / MI300 ISA reference guides' MFMA operand
 *   tables (as the AMD Matrix Instruction Calculator prints them:
 *   "A[i][k]: lane i + 32 * (k / 4), item k % 4" and so on); the bf16 _1k
 *   forms lay out their operands as the f16 ones;
 * - AMD RDNA3: the RDNA3 ISA reference guide's WMMA section (A and B are
 *   replicated in both 16-lane halves; D of f32 in lane j + 16 (i % 2),
 *   VGPR i / 2);
 * - Intel: cl_intel_subgroup_matrix_multiply_accumulate, section 6.13.X,
 *   at sub-group size 8 with M = 8 (a: component r of every work-item is
 *   row r, work-item l giving columns 2 l and 2 l + 1 of it; b: work-item
 *   l gives column l, two rows an int; the result: component r of
 *   work-item l is row r, column l). */
#include "mma_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static fa_mma_loc loc(int lane, int slot) {
    fa_mma_loc l = {lane, slot};
    return l;
}

/* NVIDIA mma.m16n8k16: a0..a7 row groupID (+ 8 for a2, a3, a6, a7),
 * column 2 tig + (i & 1) (+ 8 from a4); b0..b3 row 2 tig + (i & 1) (+ 8
 * from b2), column groupID; c0..c3 row groupID (+ 8 for c2, c3), column
 * 2 tig + (i & 1). */
static fa_mma_loc nv_a(int row, int col, int copy) {
    (void)copy;
    return loc(4 * (row % 8) + (col % 8) / 2, col % 2 + 2 * (row / 8) + 4 * (col / 8));
}
static fa_mma_loc nv_b(int kk, int col, int copy) {
    (void)copy;
    return loc(4 * col + (kk % 8) / 2, kk % 2 + 2 * (kk / 8));
}
static fa_mma_loc nv_c(int row, int col) { return loc(4 * (row % 8) + col / 2, col % 2 + 2 * (row / 8)); }

/* CDNA v_mfma_f32_32x32x8{f16,bf16_1k}. */
static fa_mma_loc mfma32_a(int row, int col, int copy) {
    (void)copy;
    return loc(row + 32 * (col / 4), col % 4);
}
static fa_mma_loc mfma32_b(int kk, int col, int copy) {
    (void)copy;
    return loc(col + 32 * (kk / 4), kk % 4);
}
static fa_mma_loc mfma32_c(int row, int col) { return loc(col + 32 * (row / 4 % 2), 4 * (row / 8) + row % 4); }

/* CDNA v_mfma_f32_16x16x16{f16,bf16_1k}. */
static fa_mma_loc mfma16_a(int row, int col, int copy) {
    (void)copy;
    return loc(row + 16 * (col / 4), col % 4);
}
static fa_mma_loc mfma16_b(int kk, int col, int copy) {
    (void)copy;
    return loc(col + 16 * (kk / 4), kk % 4);
}
static fa_mma_loc mfma16_c(int row, int col) { return loc(col + 16 * (row / 4), row % 4); }

/* RDNA3 v_wmma_f32_16x16x16_{f16,bf16} (wave32). */
static fa_mma_loc wmma_a(int row, int col, int copy) { return loc(row + 16 * copy, col); }
static fa_mma_loc wmma_b(int kk, int col, int copy) { return loc(col + 16 * copy, kk); }
static fa_mma_loc wmma_c(int row, int col) { return loc(col + 16 * (row % 2), row / 2); }

/* Intel DPAS 8x8x16 at sub-group size 8: 16-bit slot s of a lane's a is
 * half s % 2 of component s / 2, of its b half s % 2 of int s / 2. */
static fa_mma_loc dpas8_a(int row, int col, int copy) {
    (void)copy;
    return loc(col / 2, 2 * row + col % 2);
}
static fa_mma_loc dpas8_b(int kk, int col, int copy) {
    (void)copy;
    return loc(col, kk);
}
static fa_mma_loc dpas8_c(int row, int col) { return loc(col, row); }

#define PTX "PTX ISA: mma.m16n8k16 fragments (.f16 / .bf16)"
#define CDNA "AMD CDNA3 ISA guide: MFMA operand layouts"
#define RDNA3 "AMD RDNA3 ISA guide: WMMA operand layouts"
#define XMX "cl_intel_subgroup_matrix_multiply_accumulate, sub-group size 8"

static const fa_mma_model models[] = {
    {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", PTX, FA_MMA_IN_F16, 16, 8, 16, 32, 8, 4, 4, 1, nv_a, nv_b,
     nv_c},
    {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", PTX, FA_MMA_IN_BF16, 16, 8, 16, 32, 8, 4, 4, 1, nv_a,
     nv_b, nv_c},
    {"v_mfma_f32_32x32x8f16", CDNA, FA_MMA_IN_F16, 32, 32, 8, 64, 4, 4, 16, 1, mfma32_a, mfma32_b, mfma32_c},
    {"v_mfma_f32_32x32x8bf16_1k", CDNA, FA_MMA_IN_BF16, 32, 32, 8, 64, 4, 4, 16, 1, mfma32_a, mfma32_b, mfma32_c},
    {"v_mfma_f32_16x16x16f16", CDNA, FA_MMA_IN_F16, 16, 16, 16, 64, 4, 4, 4, 1, mfma16_a, mfma16_b, mfma16_c},
    {"v_mfma_f32_16x16x16bf16_1k", CDNA, FA_MMA_IN_BF16, 16, 16, 16, 64, 4, 4, 4, 1, mfma16_a, mfma16_b, mfma16_c},
    {"v_wmma_f32_16x16x16_f16", RDNA3, FA_MMA_IN_F16, 16, 16, 16, 32, 16, 16, 8, 2, wmma_a, wmma_b, wmma_c},
    {"v_wmma_f32_16x16x16_bf16", RDNA3, FA_MMA_IN_BF16, 16, 16, 16, 32, 16, 16, 8, 2, wmma_a, wmma_b, wmma_c},
    {"intel_sub_group_f16_f16_matrix_mad_k16", XMX, FA_MMA_IN_F16, 8, 8, 16, 8, 16, 16, 8, 1, dpas8_a, dpas8_b,
     dpas8_c},
    {"intel_sub_group_bf16_bf16_matrix_mad_k16", XMX, FA_MMA_IN_BF16, 8, 8, 16, 8, 16, 16, 8, 1, dpas8_a, dpas8_b,
     dpas8_c},
};

int fa_mma_model_count(void) { return (int)(sizeof models / sizeof models[0]); }

const fa_mma_model *fa_mma_model_get(int index) {
    return index >= 0 && index < fa_mma_model_count() ? &models[index] : NULL;
}

const fa_mma_model *fa_mma_model_find(const char *instruction) {
    if (!instruction) return NULL;
    for (int i = 0; i < fa_mma_model_count(); i++)
        if (strcmp(models[i].instruction, instruction) == 0) return &models[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float fa_mma_to_float(uint16_t h, fa_mma_input type) {
    if (type == FA_MMA_IN_BF16) return u2f((uint32_t)h << 16);
    const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400), exp - 25);
    return sign ? -v : v;
}

uint16_t fa_mma_from_float(float f, fa_mma_input type) {
    const uint32_t u = f2u(f);
    if (type == FA_MMA_IN_BF16) {
        if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
        return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    const float a = fabsf(f);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u); /* rounds past the largest half */
    /* Round to the grid of the half's exponent (subnormal below 2^-14),
     * nearest even, with exact scaling by powers of two. */
    int e;
    frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
    int q = e - 11 < -24 ? -24 : e - 11;   /* quantum 2^q */
    const float scaled = ldexpf(a, -q);
    float r = nearbyintf(scaled);          /* current rounding mode: nearest even */
    if (r >= 2048.0f) { /* carried into the next binade */
        r /= 2.0f;
        q++;
    }
    const int mant = (int)r;
    if (mant < 1024) return (uint16_t)(sign | mant); /* subnormal (q = -24) */
    const int exp = q + 25;
    return (uint16_t)(sign | (exp << 10) | (mant & 0x3ff));
}

/* An operand (rows x cols) as values from the registers where the layout
 * puts each element; returns how many elements differ between copies. */
static int gather(const fa_mma_model *m, const uint16_t *regs, int slots, int rows, int cols,
                  fa_mma_loc (*at)(int, int, int), double *out) {
    int mismatched = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const fa_mma_loc l0 = at(r, c, 0);
            const uint16_t v = regs[l0.lane * slots + l0.slot];
            for (int cp = 1; cp < m->copies; cp++) {
                const fa_mma_loc l = at(r, c, cp);
                mismatched += regs[l.lane * slots + l.slot] != v;
            }
            out[r * cols + c] = fa_mma_to_float(v, m->input);
        }
    return mismatched;
}

int fa_mma_model_run(const fa_mma_model *m, const uint16_t *a, const uint16_t *b, float *c) {
    double *av = malloc(sizeof(double) * (size_t)(m->m * m->k));
    double *bv = malloc(sizeof(double) * (size_t)(m->k * m->n));
    if (!av || !bv) {
        free(av);
        free(bv);
        return -1;
    }
    const int mismatched = gather(m, a, m->a_slots, m->m, m->k, m->a_at, av) +
                           gather(m, b, m->b_slots, m->k, m->n, m->b_at, bv);
    for (int i = 0; i < m->m; i++)
        for (int j = 0; j < m->n; j++) {
            const fa_mma_loc l = m->c_at(i, j);
            float *dst = &c[l.lane * m->c_slots + l.slot];
            double sum = *dst;
            for (int kk = 0; kk < m->k; kk++) sum += av[i * m->k + kk] * bv[kk * m->n + j];
            *dst = (float)sum;
        }
    free(av);
    free(bv);
    return mismatched;
}

void fa_mma_ldmatrix(const uint16_t *tile, int ld, const int *row, const int *col, int num, int trans,
                     uint32_t *regs) {
    for (int j = 0; j < num; j++)
        for (int l = 0; l < 32; l++) {
            uint16_t e[2];
            for (int h = 0; h < 2; h++) {
                /* Row r, element x of matrix j. */
                const int r = trans ? 2 * (l % 4) + h : l / 4, x = trans ? l / 4 : 2 * (l % 4) + h;
                const int src = 8 * j + r;
                e[h] = tile[row[src] * ld + col[src] + x];
            }
            regs[l * num + j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
        }
}
