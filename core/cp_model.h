/* The ring's cost model (context parallelism): what each step of ring
 * attention computes and sends, for a device the planner describes and a
 * link between ranks, and from which local length the transfers hide
 * behind the attention. Plain C, no vendor headers. */
#ifndef FA_CP_MODEL_H
#define FA_CP_MODEL_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* One direction of the link between neighbouring ranks. */
typedef struct fa_cp_link {
    const char *name;           /* for the table; NULL: "link" */
    double gbs;                 /* GB/s (10^9 bytes) each direction, > 0 */
    double latency_us;          /* per transfer, >= 0 */
} fa_cp_link;

/* Typical links between two GPUs of a ring (cp_model.c cites the figures). */
int fa_cp_named_link_count(void);
const fa_cp_link *fa_cp_named_link(int index);
/* The latency of the named link closest in bandwidth: a link's class, more
 * than its exact rate, sets what one transfer costs to start. */
double fa_cp_default_latency_us(double gbs);

/* The ring's W steps come in three kinds: the first (each rank's own K/V:
 * the causal diagonal), the middle ones (alike), and the last (nothing
 * more to pass on forward; only the previous step's dK, dV backward). */
enum { FA_CP_STEP_FIRST, FA_CP_STEP_MIDDLE, FA_CP_STEP_LAST, FA_CP_STEP_KINDS };

typedef struct fa_cp_step {
    int count;                  /* steps of this kind; 0: none */
    double compute_ms;          /* the busiest rank's attention */
    double flops_max, flops_min;/* the most and least useful work a rank does */
    double send_bytes;          /* what each rank sends during the step; 0: nothing */
    double transfer_ms;         /* latency + bytes / bandwidth; 0 when nothing is sent */
    double step_ms;             /* max(compute, transfer): the ring waits for both */
} fa_cp_step;

typedef struct fa_cp_pass {
    fa_cp_step steps[FA_CP_STEP_KINDS];
    double tail_bytes;          /* backward: the last dK, dV going home after the last step */
    double tail_ms;             /* their transfer, which nothing hides */
    double total_ms;            /* the steps and the tail */
    double single_ms;           /* one device, the whole problem */
    double ideal_ms;            /* single_ms / world: 1/W of the work, no communication */
    double efficiency;          /* ideal_ms / total_ms */
    double imbalance;           /* the busiest rank's useful FLOPs over the mean rank's */
    int64_t hiding_len;         /* local tokens from which every step hides: a multiple of
                                   128; 0: nothing travels (world 1); -1: none up to
                                   FA_CP_LONGEST_SEARCHED */
} fa_cp_pass;

/* The hiding length search stops here (local tokens a rank). */
#define FA_CP_LONGEST_SEARCHED (INT64_C(1) << 24)
/* Its granularity: the tiles' multiple, so a rank's share fills whole tiles. */
#define FA_CP_LENGTH_QUANTUM 128

typedef struct fa_cp_prediction {
    fa_cp_layout layout;
    int world;
    fa_cp_link link;
    int causal;
    int64_t local_q, local_k;   /* tokens a rank holds */
    fa_cp_pass forward, backward;
    int64_t hiding_len;         /* the larger of the two passes' (-1 if either has none) */
} fa_cp_prediction;

/* What the model takes, independent of any device: world >= 1, a known
 * layout, sequence lengths that the layout divides, fixed-length batches
 * without score options, no dropout (the ring runs it, in pieces the model
 * does not follow), and the masks the model follows (causal with seqlen_q
 * == seqlen_k; no window or block mask). The message names what is wrong. */
fa_status fa_cp_check(const fa_attention_desc *desc, fa_cp_layout layout, int world);

/* desc is the WHOLE problem (all ranks' tokens). */
fa_status fa_cp_predict(const fa_device_desc *device, const fa_attention_desc *desc, fa_cp_layout layout,
                        int world, const fa_cp_link *link, fa_cp_prediction *out);

/* A short table; truncated to fit out (always NUL-terminated). Returns the
 * length it needed, excluding the NUL. */
size_t fa_cp_prediction_format(const fa_cp_prediction *p, char *out, size_t out_size);

#endif
