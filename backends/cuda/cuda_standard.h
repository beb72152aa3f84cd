/* Standard (unfused) attention on the CUDA backend (GUIDE section 4): S =
 * scale Q K^T, P = softmax(S) and the backward pass's dP and dS
 * materialised in device memory, the products through cuBLAS, which is
 * loaded at run time: libcublas.so.13, .12, .11, libcublas.so, then the
 * same names under /usr/local/cuda/lib64. When the environment variable
 * FLASHATTN_CUBLAS_LIBRARY is set and not empty, its value (a file name or
 * path) replaces that list. The library builds and runs without cuBLAS:
 * FA_ALGO_STANDARD plans then fail with FA_ERR_UNSUPPORTED and the loader's
 * reason, and the fused path is unaffected.
 *
 * cuda_attention.c routes plans with desc.algorithm == FA_ALGO_STANDARD
 * here; the arguments are those of the backend interface (core/backend.h).
 * This header names no vendor type, so tests include it without the CUDA
 * toolkit's include directory. */
#ifndef FA_CUDA_STANDARD_H
#define FA_CUDA_STANDARD_H

#include "backend.h"
#include "flashattn.h"

#include <stddef.h>

struct fa_cuda_context;

fa_status fa_cuda_standard_prepare(struct fa_cuda_context *ctx, const fa_plan_s *plan, void **plan_impl);
/* Whether plan_impl is a live plan of this file (release and timing see no
 * descriptor). NULL is not. */
int fa_cuda_standard_owns(const void *plan_impl);
void fa_cuda_standard_release(void *plan_impl);
fa_status fa_cuda_standard_forward(void *plan_impl, const fa_plan_s *plan, const fa_fwd_args *args);
fa_status fa_cuda_standard_backward(void *plan_impl, const fa_plan_s *plan, const fa_bwd_args *args);
/* Device time of the last pass, between CUDA events recorded before its
 * first command and after its last one. */
fa_status fa_cuda_standard_last_time_ms(void *plan_impl, double *ms);

/* For tests and the benchmark: bytes of device memory the plan holds now
 * (score matrices and the small arrays beside them); the backward pass's
 * share is allocated on its first run. */
fa_status fa_cuda_standard_device_bytes(const void *plan_impl, size_t *bytes);
/* Allocations each score matrix of a prepared plan is split over. */
int fa_cuda_standard_chunk_count(const void *plan_impl);
/* Whether cuBLAS has been loaded into this process (loading is retried on
 * every plan until it succeeds, then kept). */
int fa_cuda_standard_blas_loaded(void);

/* Test hooks; they apply to plans prepared afterwards. A cap on the bytes of
 * one score allocation (0: the default), so that small problems run split
 * over several; and whether every tensor goes through a packed copy, the
 * path taken for layouts cuBLAS cannot address (a token stride beyond
 * 32 bits). */
void fa_cuda_standard_set_chunk_limit(size_t bytes);
void fa_cuda_standard_set_force_pack(int on);

/* Compiles kernels_cuda/standard.cu with NVRTC for the options of desc
 * (dtype, masks, dropout, varlen) and compute capability cc_major.cc_minor,
 * as plan creation would, without a device and without reading the kernel
 * cache (the result is stored in it). The compiler's log (ptxas' report of
 * every kernel for real code) goes to log, truncated to log_size. */
fa_status fa_cuda_standard_compile(const fa_attention_desc *desc, int cc_major, int cc_minor, size_t *binary_bytes,
                                   int *real_code, char *log, size_t log_size);

#endif
