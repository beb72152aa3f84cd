/* Descriptor helpers shared by the API checks, the reference and the
 * backends: resolved layouts and the extent of each tensor. */
#ifndef FA_DESC_H
#define FA_DESC_H

#include "flashattn.h"

#include <stdint.h>

typedef enum fa_tensor_role {
    FA_TENSOR_Q = 0, /* also dQ */
    FA_TENSOR_K = 1, /* also dK */
    FA_TENSOR_V = 2, /* also dV */
    FA_TENSOR_O = 3  /* also dO */
} fa_tensor_role;

/* A tensor layout with packed (0) strides replaced by their values. */
typedef struct fa_layout {
    fa_dtype dtype;
    int64_t offset, stride_batch, stride_seq, stride_head;
    int heads;
    int seqlen;      /* per sequence (the longest one with varlen) */
} fa_layout;

const fa_tensor_desc *fa_desc_tensor(const fa_attention_desc *desc, fa_tensor_role role);
fa_layout fa_desc_layout(const fa_attention_desc *desc, fa_tensor_role role);
const char *fa_tensor_role_name(fa_tensor_role role);

/* Elements from the buffer start to one past the last element the tensor
 * touches (offset included). */
int64_t fa_desc_tensor_extent(const fa_attention_desc *desc, fa_tensor_role role);
/* Bytes of the log-sum-exp tensor (fp32, packed). */
int64_t fa_desc_lse_bytes(const fa_attention_desc *desc);
/* softmax_scale resolved (0 -> 1/sqrt(head_dim), exact in double; kernels
 * receive it rounded to float). */
double fa_desc_scale(const fa_attention_desc *desc);

#endif
