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
    FA_TENSOR_O = 3, /* also dO */
    /* The tokens a KV-cache step appends (kv_cache, seqlen_new > 0):
     * [batch, seqlen_new, heads_kv, head_dim] in q's dtype. */
    FA_TENSOR_K_NEW = 4,
    FA_TENSOR_V_NEW = 5
} fa_tensor_role;

/* A tensor layout with packed (0) strides replaced by their values. */
typedef struct fa_layout {
    fa_dtype dtype;
    int64_t offset, stride_batch, stride_seq, stride_head;
    int heads;
    int seqlen;      /* per sequence (the longest one with varlen); a page
                        (page_size) for the pools of a paged KV cache */
} fa_layout;

const fa_tensor_desc *fa_desc_tensor(const fa_attention_desc *desc, fa_tensor_role role);
fa_layout fa_desc_layout(const fa_attention_desc *desc, fa_tensor_role role);
const char *fa_tensor_role_name(fa_tensor_role role);

/* The bound on every tensor a descriptor passes fa_attention_desc_check
 * with: its last byte lies below 2^62 bytes from the buffer start. The
 * kernels index in 64 bits (OpenCL long, CUDA and HIP long long), so every
 * element index and byte offset they form stays a factor of two clear of
 * overflow, and byte counts of tensors and their sums fit int64. */
#define FA_MAX_TENSOR_BYTES (INT64_C(1) << 62)

/* One dimension of a tensor, in elements. */
typedef struct fa_dim {
    int64_t extent, stride;
} fa_dim;

/* The four dimensions of a tensor: head_dim (stride 1), heads, tokens and
 * batch. With varlen the tokens are the batch's total and the batch
 * dimension has extent 1. The K and V pools of a paged KV cache are
 * [num_pages, page_size, heads_kv, head_dim]: tokens are a page's rows and
 * the batch dimension counts pages (stride_batch is the page stride). */
void fa_desc_dims(const fa_attention_desc *desc, fa_tensor_role role, fa_dim dims[4]);

/* Overlap and reach of a tensor's layout (dims[0] contiguous, the three
 * others in any stride order): FA_ERR_BAD_STRIDE where strides overlap or
 * the tensor ends past FA_MAX_TENSOR_BYTES (FA_ERR_INVALID_SIZE there when
 * the strides are the packed ones, explicit_strides 0). */
fa_status fa_desc_check_dims(const char *name, const fa_dim dims[4], int64_t offset, int64_t elem,
                             int explicit_strides);

/* The score options (core/desc_options.c): their argument check, which
 * fa_attention_desc_check ends with; the name of the first option a
 * descriptor enables, NULL when none; the bias layout as four dimensions
 * (keys, query rows, heads, batch) with packed strides resolved; and the
 * element index of bias[b, h, i, j] (broadcast dimensions read index 0). */
fa_status fa_desc_check_options(const fa_attention_desc *desc);
/* Whether the descriptor's inputs are fp8 (q.dtype e4m3; k and v follow
 * once the descriptor is checked). */
int fa_desc_is_fp8(const fa_attention_desc *desc);

/* Whether either side of the sliding window is bounded (-1: unlimited). */
int fa_desc_has_window(const fa_attention_desc *desc);
/* A descale factor as it multiplies: 0 means 1. */
double fa_desc_descale(float factor);
/* FA_ERR_BAD_SCALE naming the factor unless it is finite and >= 0. */
fa_status fa_check_descale(float factor, const char *name);
const char *fa_desc_option_in_use(const fa_attention_desc *desc);
void fa_desc_bias_dims(const fa_attention_desc *desc, fa_dim dims[4]);
int64_t fa_desc_bias_index(const fa_attention_desc *desc, int b, int h, int i, int j);
/* Elements (offset included) and bytes from the bias buffer's start to one
 * past its last element: 0 without a bias, -1 where that does not fit
 * int64 (only for a descriptor the check refuses). */
int64_t fa_desc_bias_extent(const fa_attention_desc *desc);
int64_t fa_desc_bias_bytes(const fa_attention_desc *desc);
/* Elements from offset 0 to one past the last element of a tensor of these
 * dimensions at this offset; 0 for a tensor of no elements, -1 where it
 * does not fit int64. */
int64_t fa_dims_extent(const fa_dim dims[4], int64_t offset);

/* Elements from the buffer start to one past the last element the tensor
 * touches (offset included), 0 when it has none; -1 where that does not fit
 * int64 (only for a descriptor the check refuses). */
int64_t fa_desc_tensor_extent(const fa_attention_desc *desc, fa_tensor_role role);
/* The same in bytes; -1 where it does not fit int64. */
int64_t fa_desc_tensor_bytes(const fa_attention_desc *desc, fa_tensor_role role);
/* Bytes of the log-sum-exp tensor (fp32, packed); -1 where it does not fit
 * int64. */
int64_t fa_desc_lse_bytes(const fa_attention_desc *desc);
/* Windows as the kernels see them: a bound at or past what can matter for
 * the shape (left >= seqlen_k - 1, right >= seqlen_q - 1), and every
 * negative one, becomes -1 (unlimited). The visible keys do not change;
 * what a kernel computes from a window bound then stays below the
 * sequence lengths. */
void fa_desc_normalize_windows(fa_attention_desc *desc);
/* The KV-cache fields (core/desc_kvcache.c): their argument check, which
 * fa_attention_desc_check runs before the layouts (also with kv_cache 0,
 * where every one of them must be unset), and what the backends derive
 * from them. */
fa_status fa_desc_check_kvcache(const fa_attention_desc *desc);
/* Entries of the block table a paged step takes: ceil(seqlen_k /
 * page_size) a sequence, batch of them; 0 for a contiguous cache. */
int64_t fa_desc_pages_per_seq(const fa_attention_desc *desc);
int64_t fa_desc_block_table_entries(const fa_attention_desc *desc);
/* Bytes of the rotary tables (each fp32 [seqlen_k, rotary_dim / 2]); 0
 * without rotary. */
int64_t fa_desc_rotary_table_bytes(const fa_attention_desc *desc);
/* Whether query i of a KV-cache step takes rotary position
 * cache_seqlens[b] + i (a causal mask, or a window that can bind: desc's
 * windows as fa_desc_normalize_windows leaves them) rather than
 * cache_seqlens[b] for every query. */
int fa_desc_rotary_query_offsets(const fa_attention_desc *desc);

/* softmax_scale resolved (0 -> 1/sqrt(head_dim), exact in double; kernels
 * receive it rounded to float). */
double fa_desc_scale(const fa_attention_desc *desc);

#endif
