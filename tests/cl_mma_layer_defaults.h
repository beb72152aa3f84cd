/* What a kernels_cl/mma_<layout>.h may leave undefined, as
 * kernels_cl/mma_generic.h takes it, for tests/test_mma_layouts.c: the
 * accumulators of a lane become its own A operand (no FA_C2A_LANE). */
#ifdef FA_C2A_LANE
#define CL_C2A_EXCHANGE 1
#else
#define CL_C2A_EXCHANGE 0
#define FA_C2A_LANE(l, ks, i) (l)
#endif
#ifndef FA_C_RUN
#define FA_C_RUN 1
#endif
