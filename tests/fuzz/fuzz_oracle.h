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
 * bias) is an input of both passes. */
typedef enum fz_role {
    FZ_Q, FZ_K, FZ_V, FZ_O, FZ_LSE, FZ_DOUT, FZ_DQ, FZ_DK, FZ_DV, FZ_BIAS, FZ_ROLE_COUNT
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

#endif
