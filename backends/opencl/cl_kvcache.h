/* KV-cache steps on OpenCL (cl_kvcache.c, kernels_cl/kvcache.cl). */
#ifndef FA_CL_KVCACHE_H
#define FA_CL_KVCACHE_H

#include "cl_backend.h"

/* Build the step's kernels for a plan whose descriptor has kv_cache = 1. */
fa_status fa_cl_kvcache_prepare(fa_cl_context *ctx, const fa_plan_s *plan, void **plan_impl);
/* Whether a plan object is a KV-cache plan's (FA_CL_PLAN_KVCACHE). */
int fa_cl_kvcache_owns(const void *plan_impl);
void fa_cl_kvcache_release(void *plan_impl);
/* One step: check, append, attend and merge, queued in order. */
fa_status fa_cl_kvcache_forward(void *plan_impl, const fa_plan_s *plan, const fa_kvcache_call *args);
fa_status fa_cl_kvcache_last_time_ms(void *plan_impl, double *ms);

#endif
