/* A host-side model of matrix instructions' lane layouts, from the
 * vendors' documentation alone: for each instruction, which lane and which
 * slot of its fragment hold each element of A (m x k), B (k x n) and the
 * accumulator C (m x n), and an emulation of the instruction on per-lane
 * registers laid out that way. Kernel fragment layers state their own
 * layouts as index functions (lane, slot) -> element; feeding those
 * through this model must reproduce a plain matrix product
 * (tests/test_hip_mma_layouts.c for the HIP layers, tests/test_mma_layouts.c
 * for the OpenCL ones). Written in the other direction (element
 * -> lane, slot) and from the tables, not from any kernel header, so that
 * a mistake in a layer cannot hide behind the same mistake here.
 *
 * Shapes, wavefront widths and index functions are data: a new layout is a
 * new table entry. */
#ifndef FA_MMA_MODEL_H
#define FA_MMA_MODEL_H

#include <stdint.h>

typedef enum fa_mma_input {
    FA_MMA_IN_F16 = 0,
    FA_MMA_IN_BF16 = 1
} fa_mma_input;

/* Where an element lives in a wavefront's fragments. */
typedef struct fa_mma_loc {
    int lane, slot;
} fa_mma_loc;

typedef struct fa_mma_model {
    const char *instruction;  /* the vendor's name: "v_mfma_f32_32x32x8f16", an OpenCL built-in */
    const char *source;       /* the document the layout is taken from */
    fa_mma_input input;       /* type of A and B; C is fp32 */
    int m, n, k;              /* C (m x n) += A (m x k) B (k x n) */
    int lanes;                /* lanes that run one instruction */
    int a_slots, b_slots;     /* 16-bit elements of A, B per lane */
    int c_slots;              /* fp32 elements of C per lane */
    int copies;               /* lanes holding each A and B element (2: RDNA3's two halves) */
    fa_mma_loc (*a_at)(int row, int col, int copy);
    fa_mma_loc (*b_at)(int kk, int col, int copy);
    fa_mma_loc (*c_at)(int row, int col);
} fa_mma_model;

int fa_mma_model_count(void);
const fa_mma_model *fa_mma_model_get(int index);
/* By instruction name; NULL when none has it. */
const fa_mma_model *fa_mma_model_find(const char *instruction);

/* 16-bit storage values to and from fp32 (round to nearest even; NaN
 * kept). */
float fa_mma_to_float(uint16_t h, fa_mma_input type);
uint16_t fa_mma_from_float(float f, fa_mma_input type);

/* One instruction on a wavefront's registers: c[lane * c_slots + slot] +=
 * (A B)[element], with A read from a[lane * a_slots + slot] and B from
 * b[lane * b_slots + slot] where the layout puts each element. Products of
 * 16-bit values are exact; each element's sum runs in double over k in
 * order and is rounded to fp32 once. Returns how many A and B elements
 * differ between their copies (a layer that fills one half of an RDNA3
 * wavefront only): 0 for well-formed fragments. */
int fa_mma_model_run(const fa_mma_model *model, const uint16_t *a, const uint16_t *b, float *c);

/* ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16, after the PTX ISA:
 * lanes 8 j .. 8 j + 7 give the addresses of the rows of matrix j (lane
 * 8 j + r: row r, eight consecutive 16-bit elements from tile[row[l] * ld +
 * col[l]]); register j of lane l receives elements 2 (l % 4) and 2 (l % 4)
 * + 1 of row l / 4 of matrix j (low half first), or with trans elements l
 * / 4 of rows 2 (l % 4) and 2 (l % 4) + 1. regs is [32][num]. */
void fa_mma_ldmatrix(const uint16_t *tile, int ld, const int *row, const int *col, int num, int trans,
                     uint32_t *regs);

#endif
