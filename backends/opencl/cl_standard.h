/* Standard (unfused) attention on the OpenCL backend (GUIDE section 4):
 * S = scale Q K^T and P = softmax(S) materialised in global memory, the
 * products through CLBlast, which is loaded at run time (libclblast.so.1,
 * then libclblast.so; FLASHATTN_CLBLAST_LIBRARY names another file). The
 * library builds and runs without CLBlast: FA_ALGO_STANDARD plans then fail
 * with FA_ERR_UNSUPPORTED and the loader's reason, and the fused path is
 * unaffected.
 *
 * cl_attention.c routes plans with desc.algorithm == FA_ALGO_STANDARD here;
 * the arguments are those of the backend interface (core/backend.h). */
#ifndef FA_CL_STANDARD_H
#define FA_CL_STANDARD_H

#include "cl_backend.h"

#include <stddef.h>

fa_status fa_cl_standard_prepare(fa_cl_context *ctx, const fa_plan_s *plan, void **plan_impl);
/* Whether plan_impl is a live plan of this file (so release and timing,
 * which see no descriptor, know where to go). NULL is not. */
int fa_cl_standard_owns(const void *plan_impl);
void fa_cl_standard_release(void *plan_impl);
fa_status fa_cl_standard_forward(void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args);
fa_status fa_cl_standard_backward(void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args);
/* Device time from the start of the last pass's first command to the end of
 * its last one. */
fa_status fa_cl_standard_last_time_ms(void *plan_impl, double *ms);

/* For tests and the benchmark: bytes of device memory the plan holds now
 * (score matrices, fp32 copies, row vectors); the backward pass's share is
 * allocated on its first run. */
fa_status fa_cl_standard_device_bytes(const void *plan_impl, size_t *bytes);
/* Test hook: caps the bytes of one buffer of a score matrix (0: only the
 * device's limits), so that small problems run split over several
 * buffers. Applies to plans prepared afterwards. */
void fa_cl_standard_set_chunk_limit(size_t bytes);
/* Buffers each score matrix of a prepared plan is split over. */
int fa_cl_standard_chunk_count(const void *plan_impl);
/* Whether CLBlast has been loaded into this process (loading is retried on
 * every plan until it succeeds, then kept). */
int fa_cl_standard_blas_loaded(void);

#endif
