/* One problem's passes through the public API on a context, from host
 * inputs to host outputs, for the tests of state that changes between calls
 * (the caller's queue, the dropout seed). The steps are separate so that a
 * test can act between enqueueing a pass and reading its results. */
#ifndef FA_CALL_RUNNER_H
#define FA_CALL_RUNNER_H

#include "flashattn.h"

#include <stdint.h>

/* A problem: a descriptor with packed tensors and random inputs in its
 * dtype. n_q counts the elements of Q (O, dO, dQ), n_k of K (V, dK, dV),
 * n_lse of L. */
typedef struct call_problem {
    fa_attention_desc desc;
    int64_t n_q, n_k, n_lse;
    void *q, *k, *v, *dout;
} call_problem;

/* Host outputs of a forward and a backward pass. */
typedef struct call_host {
    void *o, *dq, *dk, *dv;
    float *lse;
} call_host;

/* The buffers of a problem on one context. */
typedef struct call_buffers {
    fa_buffer q, k, v, o, lse, dout, dq, dk, dv;
} call_buffers;

void call_problem_init(call_problem *p, const fa_attention_desc *desc, uint64_t seed);
void call_problem_free(call_problem *p);

/* Buffers on ctx: inputs uploaded, outputs filled with NaN. Returns 0, after
 * a failed CHECK, when a call fails (the buffers made are freed). */
int call_buffers_init(call_buffers *b, fa_context ctx, const call_problem *p);
void call_buffers_free(call_buffers *b);

fa_status call_forward(fa_plan plan, const call_buffers *b);
fa_status call_backward(fa_plan plan, const call_buffers *b);

/* Every output downloaded (malloc'ed). Returns 0, after a failed CHECK, when
 * a download fails. */
int call_download(const call_buffers *b, const call_problem *p, call_host *out);
void call_host_free(call_host *h);

/* CHECKs the outputs of both passes against the fp64 reference of the
 * problem's descriptor, within the dtype's tolerance; what names the run. */
void call_check_reference(const call_problem *p, const call_host *out, const char *what);
/* 1 when two runs' outputs agree bit for bit. */
int call_host_equal(const call_problem *p, const call_host *a, const call_host *b);

#endif
