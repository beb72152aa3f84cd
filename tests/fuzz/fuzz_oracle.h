/* What a descriptor describes, computed from the public header's words
 * alone (in 128-bit arithmetic, so nothing here can overflow): the bytes
 * each tensor occupies in its buffer. The fuzzer holds every successful
 * call to it: tensors inside their buffers, outputs written only where
 * their elements are. */
#ifndef FA_FUZZ_ORACLE_H
#define FA_FUZZ_ORACLE_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* Wide enough that no product of the header's int and int64 fields
 * overflows (__extension__: a GNU type, named once). */
__extension__ typedef __int128 fz_wide;

/* Tensors of a pass. The gradients share the layouts and dtype of their
 * tensors (dQ q's, dK k's, dV v's, dO o's); lse is fp32, packed; the bias
 * [bias_batch, bias_heads, seqlen_q, seqlen_k] (no element without a
 * bias) is an input of both passes.
 * A KV-cache step (kv_cache = 1) reads q and writes o and lse as above; k
 * and v are its caches (pools [num_pages, page_size, heads_kv, head_dim]
 * with page_size > 0), k_new and v_new [batch, seqlen_new, heads_kv,
 * head_dim] (none with seqlen_new = 0), and the int32 / fp32 arrays start
 * at byte 0 of their buffers: cache_seqlens [batch], block_table [batch,
 * ceil(seqlen_k / page_size)] (paged), rotary cos and sin [seqlen_k,
 * rotary_dim / 2] (rotary_dim > 0); none without kv_cache = 1. */
typedef enum fz_role {
    FZ_Q, FZ_K, FZ_V, FZ_O, FZ_LSE, FZ_DOUT, FZ_DQ, FZ_DK, FZ_DV, FZ_BIAS,
    FZ_K_NEW, FZ_V_NEW, FZ_SEQLENS, FZ_BLOCK_TABLE, FZ_ROT_COS, FZ_ROT_SIN, FZ_ROLE_COUNT
} fz_role;

const char *fz_role_name(fz_role role);

/* Byte range [first, end) a tensor spans in its buffer (end == first when
 * it has no element). Returns 0 when the range cannot be computed because
 * a field the header requires is out of its domain (bad dtype, negative
 * shape), which only a failing check may accept. */
typedef struct fz_span {
    fz_wide first, end;
    fz_wide elements;
} fz_span;
int fz_tensor_span(const fa_attention_desc *d, fz_role role, fz_span *span);

/* Marks in allowed[0, bytes) every byte of the tensor's elements that lies
 * inside the buffer. Returns 0 when there were too many elements to walk
 * (the caller then allows the whole span). */
int fz_mark_elements(const fa_attention_desc *d, fz_role role, unsigned char *allowed, size_t bytes);

/* Element index of (sequence b, token t, head h, dimension 0) of a
 * tensor without varlen offsets; K and V of a paged cache are indexed by
 * (page, row in the page, head). -1 when the tensor is not defined. */
fz_wide fz_element(const fa_attention_desc *d, fz_role role, int64_t b, int64_t t, int64_t h);

/* A KV-cache step's rules for sequence b (the header's words): a length
 * >= 0, room for the append, rotary positions below seqlen_k, and pages in
 * [0, num_pages) among the ceil(len_k / page_size) it uses. Sequences that
 * break them get O and L NaN and append nothing. */
int fz_kv_seq_valid(const fa_attention_desc *d, const int32_t *cache_seqlens, const int32_t *block_table, int b);

/* Marks the bytes a step may write in a cache (role FZ_K or FZ_V): the
 * seqlen_new appended tokens of every valid sequence, at its positions
 * cache_seqlens[b] .. + seqlen_new - 1 (through the block table when
 * paged). */
void fz_mark_appended(const fa_attention_desc *d, fz_role role, const int32_t *cache_seqlens,
                      const int32_t *block_table, unsigned char *allowed, size_t bytes);

#endif
