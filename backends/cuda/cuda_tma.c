/* Tensor maps (cuTensorMapEncodeTiled) for the warp-specialised forward. */
#define FA_CUDA_DRIVER_TYPES
#include "cuda_tma.h"

#include "fa_internal.h"
#include "planner.h"

#include <stdint.h>

/* A 4-dimensional map of 128-byte boxes under the 128-byte swizzle the
 * kernels read (wgmma.cuh); what names the tensor in an error. */
static fa_status encode_swizzled(CUtensorMap *map, CUtensorMapDataType type, CUdeviceptr addr,
                                 const cuuint64_t dims[4], const cuuint64_t strides[3], const cuuint32_t box[4],
                                 const char *what) {
    const fa_cu_api *api = fa_cuda_api();
    if (!api->cuTensorMapEncodeTiled)
        return fa_fail(FA_ERR_UNSUPPORTED, "the CUDA driver has no cuTensorMapEncodeTiled (CUDA 12 or later)");
    const cuuint32_t steps[4] = {1, 1, 1, 1};
    const CUresult r = api->cuTensorMapEncodeTiled(map, type, 4, (void *)(uintptr_t)addr, dims, strides, box, steps,
                                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        const char *name = NULL;
        if (api->cuGetErrorName) api->cuGetErrorName(r, &name);
        return fa_fail(FA_ERR_UNSUPPORTED, "cuTensorMapEncodeTiled(%s, %llu x %llu x %llu x %llu): %s", what,
                       (unsigned long long)dims[0], (unsigned long long)dims[1], (unsigned long long)dims[2],
                       (unsigned long long)dims[3], name ? name : "error");
    }
    return FA_SUCCESS;
}

fa_status fa_cuda_tensor_map(CUtensorMap *map, CUdeviceptr base, const fa_attention_desc *d, fa_tensor_role role,
                             int box_rows) {
    const fa_layout l = fa_desc_layout(d, role);
    const int64_t e = (int64_t)fa_dtype_size(l.dtype);
    const int64_t count[3] = {l.seqlen, l.heads, d->batch};
    const int64_t stride[3] = {l.stride_seq * e, l.stride_head * e, l.stride_batch * e};
    /* A dimension of one index never steps: it gets a stride the driver
     * accepts, one past the bytes the others span. */
    int64_t span = (int64_t)d->head_dim * e;
    for (int i = 0; i < 3; i++)
        if (count[i] > 1) span += (count[i] - 1) * stride[i];
    span = (span + 15) / 16 * 16;
    cuuint64_t dims[4] = {(cuuint64_t)d->head_dim, 0, 0, 0}, strides[3];
    for (int i = 0; i < 3; i++) {
        dims[i + 1] = (cuuint64_t)count[i];
        strides[i] = (cuuint64_t)(count[i] > 1 ? stride[i] : span);
        if ((int64_t)strides[i] >= FA_TMA_MAX_STRIDE || strides[i] % 16)
            return fa_fail(FA_ERR_UNSUPPORTED, "%s: a stride of %llu bytes does not fit a tensor map (multiples of 16 "
                           "below 2^40)",
                           fa_tensor_role_name(role), (unsigned long long)strides[i]);
    }
    /* A box is one 128-byte line wide: 64 elements of fp16/bf16, 128 of
     * e4m3 (moved as bytes), past the end of a row of 64 or 192 head
     * dimensions too: the copy fills the rest with zeros. */
    const cuuint32_t box[4] = {(cuuint32_t)(128 / e), (cuuint32_t)box_rows, 1, 1};
    const CUtensorMapDataType type = l.dtype == FA_DTYPE_BF16        ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                     : l.dtype == FA_DTYPE_FP8_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                                    : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return encode_swizzled(map, type, base + (CUdeviceptr)(l.offset * e), dims, strides, box,
                           fa_tensor_role_name(role));
}

fa_status fa_cuda_vt_map(CUtensorMap *map, CUdeviceptr vt, const fa_attention_desc *d, int64_t keys_pad) {
    /* fa_fp8_vt_size held the (KV head, sequence) strides below
     * FA_TMA_MAX_STRIDE. */
    const cuuint64_t row = (cuuint64_t)keys_pad, head = row * (cuuint64_t)d->head_dim,
                     seq = head * (cuuint64_t)d->heads_kv;
    const cuuint64_t dims[4] = {row, (cuuint64_t)d->head_dim, (cuuint64_t)d->heads_kv, (cuuint64_t)d->batch};
    const cuuint64_t strides[3] = {row, head, seq};
    const cuuint32_t box[4] = {128, (cuuint32_t)d->head_dim, 1, 1};
    return encode_swizzled(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, vt, dims, strides, box, "V^T");
}
