/* The attention suite's hooks for the OpenCL backend (tests/opencl_suite.c),
 * shared by the OpenCL test files: forcing tile shapes (FMA, streaming or
 * matrix-unit kernels), checking a plan's local memory, and telling which
 * described devices' matrix-unit tiles run on the context. */
#ifndef FA_OPENCL_SUITE_H
#define FA_OPENCL_SUITE_H

#include "attention_suite.h"

/* compiled is 0 where the OpenCL backend is not built in. */
extern const suite_backend opencl_suite;

/* Forced FMA tiles run in the streaming kernels while on is set (else in
 * the kernels an OpenCL plan with those tiles uses); key splits always run
 * SPLITK, and tiles marked mma the matrix-unit kernels. */
void opencl_suite_stream(int on);

/* Forced matrix-unit backward tiles run in this many stages (0 or 1: one;
 * 2: the pipelined dK/dV kernel) until set back. */
void opencl_suite_mma_bwd_stages(int stages);

/* Whether the last plan the suite checked built that pass on Hopper's
 * warpgroup products (backends/opencl/cl_attention.c). */
int opencl_suite_last_wgmma(fa_pass pass);

/* Whether FLASHATTN_OPENCL_MMA_EMULATE names a layout for this run. */
int opencl_suite_emulating(void);

#endif
