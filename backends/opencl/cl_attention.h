/* Queries of the attention half of the OpenCL backend beyond the backend
 * interface, for tests and tools. */
#ifndef FA_CL_ATTENTION_H
#define FA_CL_ATTENTION_H

#include "cl_backend.h"

/* Local memory (bytes, CL_KERNEL_LOCAL_MEM_SIZE) of the largest kernel of a
 * pass as the driver compiled it for a prepared plan. */
fa_status fa_cl_plan_kernel_local_mem(void *plan_impl, fa_pass pass, size_t *bytes);

#endif
