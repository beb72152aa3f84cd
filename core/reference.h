/* The CPU reference: plain loops, fp64 accumulation, every option of the
 * attention descriptor. It defines what every kernel must compute.
 *
 * Semantics (GUIDE section 2), for query row i of sequence b, head h, and
 * kv head hk = h / (heads_q / heads_kv):
 *   s_j   = scale * q_i . k_j                  for visible keys j (masks)
 *           then softcap, bias, ALiBi as the descriptor's score options say
 *           (include/flashattn.h)
 *   L_i   = log sum_j exp(s_j)                 (-inf if no key is visible)
 *   p_j   = exp(s_j - L_i)
 *   o_i   = sum_j p_j * z_j / (1 - p_drop) * v_j   z_j: dropout keep bit
 * A row with no visible key gives o_i = 0 and L_i = -inf. Everything else
 * is plain IEEE arithmetic, NaN and infinities included: the rules above
 * fa_forward in include/flashattn.h, which every kernel follows.
 * Backward, from (Q, K, V, O, L, dO):
 *   D_i    = dO_i . O_i
 *   dP_ij  = z_ij / (1 - p_drop) * dO_i . v_j
 *   dS_ij  = p_ij * (dP_ij - D_i) * (1 - tanh^2(scale q_i.k_j / softcap))
 *            (the last factor only with softcap)
 *   dQ_i   = scale * sum_j dS_ij k_j
 *   dK_j   = scale * sum_{i, heads sharing hk} dS_ij q_i
 *   dV_j   = sum_{i, heads sharing hk} p_ij z_ij / (1 - p_drop) dO_i
 */
#ifndef FA_REFERENCE_H
#define FA_REFERENCE_H

#include "desc.h"
#include "flashattn.h"

#include <stdint.h>

/* Visibility of key j to query i (positions within one sequence of lengths
 * sq, sk), for the causal, window and block-sparse masks of desc. */
int fa_ref_visible(const fa_attention_desc *desc, int sq, int sk, int i, int j);

/* Sequence b's query / key token range [*start, *start + *len) in the
 * packed (varlen) or batched layout. */
void fa_ref_seq_q(const fa_attention_desc *desc, int b, int64_t *start, int *len);
void fa_ref_seq_k(const fa_attention_desc *desc, int b, int64_t *start, int *len);

/* Element index of (b, token t within sequence b, head h, dim x) in the
 * tensor of that role (dQ, dK, dV, dO share the layouts of Q, K, V, O). */
int64_t fa_ref_index(const fa_attention_desc *desc, fa_tensor_role role, int b, int t, int h, int x);
/* Index of L for (b, h, t). */
int64_t fa_ref_lse_index(const fa_attention_desc *desc, int b, int h, int t);

/* Number of elements a tensor spans (max index + 1), offset included. */
int64_t fa_ref_tensor_span(const fa_attention_desc *desc, fa_tensor_role role);

/* fp64 core on double arrays (laid out as the descriptor says; dtypes in the
 * descriptor are ignored). The desc must have passed fa_attention_desc_check. */
void fa_ref_forward_f64(const fa_attention_desc *desc, const double *q, const double *k,
                        const double *v, double *o, double *lse);
void fa_ref_backward_f64(const fa_attention_desc *desc, const double *q, const double *k,
                         const double *v, const double *o, const double *lse,
                         const double *dout, double *dq, double *dk, double *dv);

/* The same with the descriptor's score options: bias holds the additive
 * bias as desc->bias lays it out (as doubles; NULL exactly when
 * desc->bias_batch is 0). Softcap and ALiBi need no data (slopes are in
 * the descriptor). The backward produces no bias or slope gradient. */
void fa_ref_forward_f64_ex(const fa_attention_desc *desc, const double *bias, const double *q,
                           const double *k, const double *v, double *o, double *lse);
void fa_ref_backward_f64_ex(const fa_attention_desc *desc, const double *bias, const double *q,
                            const double *k, const double *v, const double *o, const double *lse,
                            const double *dout, double *dq, double *dk, double *dv);

/* On storage arrays of the descriptor's dtypes: inputs converted exactly to
 * double, outputs rounded once (nearest even) to the storage dtype; L fp32.
 * Softcap and ALiBi included; a descriptor with a bias needs the _at forms,
 * which take its data (these pass NULL: FA_ERR_NULL_POINTER). */
fa_status fa_ref_forward(const fa_attention_desc *desc, const void *q, const void *k,
                         const void *v, void *o, float *lse);
fa_status fa_ref_backward(const fa_attention_desc *desc, const void *q, const void *k,
                          const void *v, const void *o, const float *lse, const void *dout,
                          void *dq, void *dk, void *dv);

/* Where the problem's rows and columns lie in a larger problem whose
 * dropout mask it draws (a plan's dropout origin, core/plan.h): element
 * (i, j) keeps or drops as element (row0 + i, col0 + j) does there. The
 * functions without _at take (0, 0) and no bias. bias: the additive bias in
 * desc->bias's dtype and layout, NULL exactly when desc->bias_batch is 0. */
typedef struct fa_ref_dropout_origin {
    int64_t row0, col0;
} fa_ref_dropout_origin;

fa_status fa_ref_forward_at(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const void *bias,
                            const void *q, const void *k, const void *v, void *o, float *lse);
fa_status fa_ref_backward_at(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const void *bias,
                             const void *q, const void *k, const void *v, const void *o, const float *lse,
                             const void *dout, void *dq, void *dk, void *dv);

/* Unfused standard attention (S and P materialised), in the storage dtype's
 * precision: S rounded to the dtype, softmax in fp32, P rounded to the dtype,
 * O = P V accumulated in fp32. The second opinion GUIDE section 2 compares
 * errors against ("no worse than twice unfused attention in the dtype"). */
fa_status fa_ref_standard_forward(const fa_attention_desc *desc, const void *q, const void *k,
                                  const void *v, void *o, float *lse);
fa_status fa_ref_standard_forward_at(const fa_attention_desc *desc, fa_ref_dropout_origin origin, const void *q,
                                     const void *k, const void *v, void *o, float *lse);

/* A KV-cache step (desc->kv_cache = 1; core/reference_kvcache.c) on host
 * arrays in the descriptor's layouts: the append (k_cache and v_cache are
 * written), the rotary embedding (fp64, rounded once to q's dtype) and the
 * attention over each sequence's cache_seqlens[b] + seqlen_new keys.
 * Sequences that break the header's rules get O and L NaN and append
 * nothing. lse may be NULL; block_table, k_new / v_new and the rotary
 * tables only where the descriptor asks for them. */
typedef struct fa_ref_kvcache_args {
    const void *q;
    void *k_cache, *v_cache;
    void *o;
    float *lse;
    const int32_t *cache_seqlens;
    const int32_t *block_table;
    const void *k_new, *v_new;
    const float *rotary_cos, *rotary_sin;
} fa_ref_kvcache_args;

fa_status fa_ref_forward_kvcache(const fa_attention_desc *desc, const fa_ref_kvcache_args *args);
/* Whether sequence b's length, pages and rotary positions keep the
 * header's rules (else its O and L are NaN). */
int fa_ref_kvcache_seq_valid(const fa_attention_desc *desc, const int32_t *cache_seqlens,
                             const int32_t *block_table, int b);

#endif
