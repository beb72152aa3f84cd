/* libFuzzer target: the public API on the reference backend, driven by API
 * call sequences decoded from the fuzzer's bytes.
 *
 * The input is a program: each operation is one opcode byte followed by its
 * arguments (object slots, sizes, a descriptor, a device description), read
 * with the pickers of fuzz_input.h. Objects live in a few slots (contexts,
 * buffers, plans) so that operations meet in any order: a plan run on
 * buffers of another context, a buffer freed and then passed, a context
 * destroyed while its buffers live, a forward pass over outputs that alias
 * inputs.
 *
 * What every call must do (the oracle):
 * - return a fa_status; on failure, leave a non-empty fa_last_error() and
 *   change no byte of any buffer;
 * - on success of a pass, every tensor the descriptor describes lies inside
 *   its buffer (fuzz_oracle.c computes the spans from the header alone, in
 *   128-bit arithmetic), and no byte outside the output tensors' elements
 *   changed, inputs included;
 * - never read or write outside memory it was given: buffers of the
 *   reference are host memory, so AddressSanitizer sees every access, and
 *   wrapped memory sits between poisoned guards; the descriptor's host
 *   arrays (block mask, cu_seqlens) are freed right after fa_plan_create,
 *   which the header says copies them;
 * - a descriptor the check accepts has its flags in their domains and
 *   every tensor below 2^62 bytes; a pass that succeeds had no output
 *   overlapping another argument in the same buffer (the header's rules);
 * - the planner is deterministic and its plans fit the device;
 * - a KV-cache step (fa_forward_kvcache) writes O, L and only the appended
 *   tokens of the sequences whose cache lengths and pages keep the
 *   header's rules; the others get O and L NaN; and its buffers come out
 *   exactly as core/reference_kvcache.c leaves host copies of them.
 *
 * FA_FUZZ_TRACE=1 prints each call and descriptor (to read a crash). */
#include "flashattn.h"

#include "dtype.h"
#include "fa_internal.h"
#include "fuzz_gen.h"
#include "fuzz_input.h"
#include "fuzz_oracle.h"
#include "reference.h"

#include <math.h>
#include <sanitizer/asan_interface.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONTEXTS 2
#define BUFFERS 10
#define PLANS 3
#define MAX_OPS 64
/* Buffers stay small: a pass over them takes microseconds. */
#define MAX_BUFFER ((size_t)64 << 10)
/* (sequence, head) pairs a pass on the reference may walk. */
#define MAX_ROWS (1 << 20)
/* Multiply-adds a KV-cache step on the reference may take (its keys are
 * bounded by the capacity, not by its buffers). */
#define MAX_STEP_WORK ((fz_wide)1 << 22)
#define GUARD 64
#define MAX_TEXT 4096
/* Where the header says every tensor must end. */
#define TENSOR_LIMIT ((fz_wide)1 << 62)

/* Huge requests must fail as out of memory, not abort: the library's
 * checks are what is under test, not the allocator's. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1:max_allocation_size_mb=512"; }

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ------------------------------------------------------------------------ */
/* Options and failure reports                                              */

static int tracing;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *t = getenv("FA_FUZZ_TRACE");
    tracing = t && t[0] == '1';
    /* Hermetic: no kernel cache on disk, no bandwidth measurement. */
    setenv("FLASHATTN_CACHE_DIR", "off", 1);
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    return 0;
}

static void trace_desc(const fz_desc *d) {
    if (tracing) fz_desc_print(stderr, d);
}

static void trace(const char *fmt, ...) {
    if (!tracing) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void trace_ints(const char *name, const int32_t *v, int64_t n) {
    if (!tracing) return;
    fprintf(stderr, "    %s:", name);
    for (int64_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", (int)v[i]);
    fputs(n > 64 ? " ...\n" : "\n", stderr);
}

/* A broken promise: report it and abort, which libFuzzer records as a crash
 * with this input. */
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fa-fuzz: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* Every call goes through here: a valid status, and a message on failure. */
static fa_status checked(fa_status st, const char *call) {
    if ((int)st < 0 || st >= FA_STATUS_COUNT) die("%s returned %d, which is not a fa_status", call, (int)st);
    const char *msg = fa_last_error();
    if (!msg) die("%s: fa_last_error() is NULL", call);
    if (st != FA_SUCCESS && msg[0] == '\0') die("%s failed (%s) with an empty fa_last_error()", call, fa_status_string(st));
    trace("  %s -> %s%s%s", call, fa_status_string(st), st ? ": " : "", st ? msg : "");
    return st;
}

#define CALL(expr) (fa_clear_error(), checked((expr), #expr))

/* ------------------------------------------------------------------------ */
/* Objects                                                                  */

typedef struct fz_context {
    fa_context h;
    int id; /* unique per created context: buffers and plans name it */
} fz_context;

typedef struct fz_buffer {
    fa_buffer h;
    int ctx_id;
    size_t bytes;
    unsigned char *wrapped; /* guard + bytes + guard, or NULL when allocated */
} fz_buffer;

typedef struct fz_plan {
    fa_plan h;
    int ctx_id;
    fz_desc desc; /* the harness's own copy, for the oracle */
} fz_plan;

typedef struct state {
    fz_context ctx[CONTEXTS];
    fz_buffer buf[BUFFERS];
    fz_plan plan[PLANS];
    int next_id;
    unsigned char *scratch; /* host side of uploads and downloads */
} state;

static fz_context *context_of(state *s, int id) {
    for (int i = 0; i < CONTEXTS; i++)
        if (s->ctx[i].h && s->ctx[i].id == id) return &s->ctx[i];
    return NULL;
}

/* The bytes of a buffer, straight from host memory (the reference's
 * buffers are host memory). */
static unsigned char *host_bytes(const fz_buffer *b) {
    if (b->wrapped) return b->wrapped + GUARD;
    void *native = NULL;
    if (CALL(fa_buffer_get_native(b->h, &native)) != FA_SUCCESS || !native)
        die("fa_buffer_get_native gave no host pointer for a reference buffer");
    return native;
}

static void release_wrapped(fz_buffer *b) {
    if (!b->wrapped) return;
    ASAN_UNPOISON_MEMORY_REGION(b->wrapped, b->bytes + 2 * GUARD);
    free(b->wrapped);
    b->wrapped = NULL;
}

/* ------------------------------------------------------------------------ */
/* Descriptor checks                                                        */

static int tensor_unset(const fa_tensor_desc *t) {
    return t->dtype == FA_DTYPE_F32 && !t->offset && !t->stride_batch && !t->stride_seq && !t->stride_head;
}

/* The KV-cache fields of an accepted descriptor, as the header has them:
 * all unset without kv_cache; with it, pages of a multiple of 16 up to
 * 256 (and a pool of them), appends within the capacity in q's dtype,
 * an even rotary width up to head_dim, and none of the options a step
 * refuses. */
static void check_accepted_kvcache(const fa_attention_desc *d, const char *call) {
    if (d->kv_cache == 0) {
        if (d->page_size || d->num_pages || d->seqlen_new || d->rotary_dim || d->rotary_interleaved ||
            !tensor_unset(&d->k_new) || !tensor_unset(&d->v_new))
            die("%s accepted KV-cache fields with kv_cache = 0", call);
        return;
    }
    if (d->kv_cache != 1) die("%s accepted kv_cache = %d (0 or 1)", call, d->kv_cache);
    if (d->page_size ? d->page_size < 16 || d->page_size > 256 || d->page_size % 16 || d->num_pages <= 0
                     : d->num_pages != 0)
        die("%s accepted page_size = %d, num_pages = %d", call, d->page_size, d->num_pages);
    if (d->seqlen_new < 0 || d->seqlen_new > d->seqlen_k)
        die("%s accepted seqlen_new = %d with seqlen_k = %d", call, d->seqlen_new, d->seqlen_k);
    if (d->seqlen_new ? d->k_new.dtype != d->q.dtype || d->v_new.dtype != d->q.dtype
                      : !tensor_unset(&d->k_new) || !tensor_unset(&d->v_new))
        die("%s accepted k_new / v_new (dtypes %d, %d) with seqlen_new = %d", call, (int)d->k_new.dtype,
            (int)d->v_new.dtype, d->seqlen_new);
    if (d->rotary_dim < 0 || d->rotary_dim % 2 || d->rotary_dim > d->head_dim ||
        (d->rotary_interleaved != 0 && d->rotary_interleaved != 1))
        die("%s accepted rotary_dim = %d, rotary_interleaved = %d (head_dim %d)", call, d->rotary_dim,
            d->rotary_interleaved, d->head_dim);
    if (d->bias_batch || d->dropout_p != 0.0f || d->block_mask || d->cu_seqlens_q || d->cu_seqlens_k ||
        d->algorithm != FA_ALGO_FUSED)
        die("%s accepted kv_cache = 1 with a bias, dropout, a block mask, varlen or the standard algorithm", call);
}

/* An accepted descriptor: flags in their domains, every tensor inside the
 * 2^62 bytes the header allows. */
static void check_accepted(const fa_attention_desc *d, const char *call) {
    const struct {
        int value;
        const char *name;
    } flags[] = {{d->causal, "causal"}, {d->deterministic, "deterministic"}, {d->allow_tf32, "allow_tf32"}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i].value != 0 && flags[i].value != 1)
            die("%s accepted %s = %d (0 or 1)", call, flags[i].name, flags[i].value);
    if (!(isfinite(d->softcap) && d->softcap >= 0.0f)) die("%s accepted softcap = %g", call, (double)d->softcap);
    for (int h = 0; d->alibi_slopes && h < d->heads_q; h++)
        if (!isfinite(d->alibi_slopes[h])) die("%s accepted alibi_slopes[%d] = %g", call, h, (double)d->alibi_slopes[h]);
    if (d->bias_batch == 0 ? d->bias_heads != 0
                           : (d->bias_batch != 1 && d->bias_batch != d->batch) ||
                                 (d->bias_heads != 1 && d->bias_heads != d->heads_q) || d->cu_seqlens_q)
        die("%s accepted bias_batch = %d, bias_heads = %d (batch %d, heads_q %d%s)", call, d->bias_batch,
            d->bias_heads, d->batch, d->heads_q, d->cu_seqlens_q ? ", varlen" : "");
    check_accepted_kvcache(d, call);
    for (int r = 0; r < FZ_ROLE_COUNT; r++) {
        fz_span sp;
        if (!fz_tensor_span(d, (fz_role)r, &sp))
            die("%s accepted a descriptor whose %s tensor is not defined", call, fz_role_name((fz_role)r));
        if (sp.first < 0 || sp.end > TENSOR_LIMIT)
            die("%s accepted a descriptor whose %s tensor spans bytes [%.6g, %.6g), outside [0, 2^62)", call,
                fz_role_name((fz_role)r), (double)sp.first, (double)sp.end);
    }
}

/* ------------------------------------------------------------------------ */
/* Passes                                                                   */

typedef struct pass_buffers {
    fz_buffer *of_role[FZ_ROLE_COUNT]; /* NULL where the slot is empty */
    unsigned roles;                    /* the pass's roles, a bit each */
    int ex;                            /* through fa_forward_ex / fa_backward_ex */
} pass_buffers;

#define FORWARD_ROLES ((1u << FZ_Q) | (1u << FZ_K) | (1u << FZ_V) | (1u << FZ_O) | (1u << FZ_LSE) | (1u << FZ_BIAS))
#define BACKWARD_ROLES ((1u << (FZ_BIAS + 1)) - 1u)
#define KVCACHE_ROLES                                                                                            \
    ((1u << FZ_Q) | (1u << FZ_K) | (1u << FZ_V) | (1u << FZ_O) | (1u << FZ_LSE) | (1u << FZ_K_NEW) |              \
     (1u << FZ_V_NEW) | (1u << FZ_SEQLENS) | (1u << FZ_BLOCK_TABLE) | (1u << FZ_ROT_COS) | (1u << FZ_ROT_SIN))

typedef enum pass_kind { PASS_FORWARD, PASS_BACKWARD, PASS_KVCACHE } pass_kind;

static const char *pass_name(pass_kind kind) {
    return kind == PASS_FORWARD ? "fa_forward" : kind == PASS_BACKWARD ? "fa_backward" : "fa_forward_kvcache";
}

static int in_pass(const pass_buffers *pb, int r) { return (pb->roles >> r) & 1u; }

/* Distinct buffers of a pass, with their bytes before the call. */
typedef struct snapshot {
    fz_buffer *buf[FZ_ROLE_COUNT];
    unsigned char *before[FZ_ROLE_COUNT];
    int count;
} snapshot;

static void snapshot_take(snapshot *sn, const pass_buffers *pb) {
    memset(sn, 0, sizeof *sn);
    for (int r = 0; r < FZ_ROLE_COUNT; r++) {
        if (!in_pass(pb, r)) continue;
        fz_buffer *b = pb->of_role[r];
        if (!b || !b->h) continue;
        int seen = 0;
        for (int i = 0; i < sn->count; i++) seen |= sn->buf[i] == b;
        if (seen) continue;
        sn->before[sn->count] = malloc(b->bytes);
        if (!sn->before[sn->count]) die("out of host memory for a snapshot");
        memcpy(sn->before[sn->count], host_bytes(b), b->bytes);
        sn->buf[sn->count++] = b;
    }
}

static void snapshot_free(snapshot *sn) {
    for (int i = 0; i < sn->count; i++) free(sn->before[i]);
}

/* The tensors a pass writes: O and L (forward), dQ, dK and dV (backward),
 * O, L and the caches where tokens are appended (a KV-cache step). */
static int written(pass_kind kind, const fa_attention_desc *d, int r) {
    switch (kind) {
    case PASS_FORWARD: return r == FZ_O || r == FZ_LSE;
    case PASS_BACKWARD: return r == FZ_DQ || r == FZ_DK || r == FZ_DV;
    default: return r == FZ_O || r == FZ_LSE || (d && d->seqlen_new > 0 && (r == FZ_K || r == FZ_V));
    }
}

/* A buffer's bytes before the pass. */
static const unsigned char *before_bytes(const snapshot *sn, const fz_buffer *b) {
    for (int i = 0; i < sn->count; i++)
        if (sn->buf[i] == b) return sn->before[i];
    return NULL;
}

/* The cache lengths and block table a KV-cache step was given (as they
 * were before it), or NULL. */
static const int32_t *step_array(const snapshot *sn, const pass_buffers *pb, fz_role r) {
    return pb->of_role[r] ? (const int32_t *)(const void *)before_bytes(sn, pb->of_role[r]) : NULL;
}

/* After a pass: with ok, every byte outside the output tensors' elements in
 * each buffer is as before (of the caches, only the appended tokens of the
 * sequences that keep the rules); without, every byte is (d may then be
 * NULL). */
static void snapshot_compare(const snapshot *sn, const pass_buffers *pb, const fa_attention_desc *d, pass_kind kind,
                             int ok) {
    for (int i = 0; i < sn->count; i++) {
        fz_buffer *b = sn->buf[i];
        unsigned char *allowed = calloc(b->bytes, 1);
        if (!allowed) die("out of host memory for a write mask");
        for (int r = 0; ok && r < FZ_ROLE_COUNT; r++) {
            if (!in_pass(pb, r) || pb->of_role[r] != b || !written(kind, d, r)) continue;
            if (kind == PASS_KVCACHE && (r == FZ_K || r == FZ_V))
                fz_mark_appended(d, (fz_role)r, step_array(sn, pb, FZ_SEQLENS), step_array(sn, pb, FZ_BLOCK_TABLE),
                                 allowed, b->bytes);
            else if (!fz_mark_elements(d, (fz_role)r, allowed, b->bytes))
                memset(allowed, 1, b->bytes);
        }
        const unsigned char *now = host_bytes(b);
        for (size_t x = 0; x < b->bytes; x++)
            if (!allowed[x] && now[x] != sn->before[i][x])
                die("%s %s byte %zu of a %zu-byte buffer, outside every output tensor's elements", pass_name(kind),
                    ok ? "succeeded and changed" : "failed but changed", x, b->bytes);
        free(allowed);
    }
}

/* After a successful pass: every tensor inside its buffer. */
static void check_inside(const pass_buffers *pb, const fa_attention_desc *d, const char *call) {
    for (int r = 0; r < FZ_ROLE_COUNT; r++) {
        if (!in_pass(pb, r)) continue;
        fz_span sp;
        if (!fz_tensor_span(d, (fz_role)r, &sp))
            die("%s succeeded on a descriptor whose %s tensor is not defined", call, fz_role_name((fz_role)r));
        if (sp.end == sp.first) continue;
        size_t bytes = pb->of_role[r] ? pb->of_role[r]->bytes : 0;
        if (sp.first < 0 || sp.end > (fz_wide)bytes)
            die("%s succeeded but %s spans bytes [%.6g, %.6g) of a %zu-byte buffer", call, fz_role_name((fz_role)r),
                (double)sp.first, (double)sp.end, bytes);
    }
}

/* After a successful pass: no output shares a byte with another argument
 * of the same buffer (inputs may overlap each other freely). */
static void check_disjoint(const pass_buffers *pb, const fa_attention_desc *d, pass_kind kind, const char *call) {
    for (int r = 0; r < FZ_ROLE_COUNT; r++) {
        fz_buffer *b = pb->of_role[r];
        if (!in_pass(pb, r) || !b || !written(kind, d, r)) continue;
        unsigned char *mine = calloc(b->bytes, 1), *others = calloc(b->bytes, 1);
        if (!mine || !others) die("out of host memory for an overlap mask");
        int known = fz_mark_elements(d, (fz_role)r, mine, b->bytes);
        for (int o = 0; known && o < FZ_ROLE_COUNT; o++)
            if (in_pass(pb, o) && o != r && pb->of_role[o] == b) known = fz_mark_elements(d, (fz_role)o, others, b->bytes);
        for (size_t x = 0; known && x < b->bytes; x++)
            if (mine[x] && others[x])
                die("%s succeeded with %s overlapping another argument at byte %zu of their buffer", call,
                    fz_role_name((fz_role)r), x);
        free(mine);
        free(others);
    }
}

static fa_buffer handle(const fz_buffer *b) { return b ? b->h : NULL; }

/* One pass (forward or backward) on the plan and buffers, held to the
 * oracle. p may be NULL (the call must then fail). */
static void run_pass(fz_plan *p, const pass_buffers *pb, int forward) {
    snapshot sn;
    snapshot_take(&sn, pb);
    fz_buffer *const *x = pb->of_role;
    fa_plan h = p ? p->h : NULL;
    const char *call = forward ? "fa_forward" : "fa_backward";
    const fa_pass_args a = {handle(x[FZ_Q]),    handle(x[FZ_K]),  handle(x[FZ_V]),  handle(x[FZ_O]),
                            handle(x[FZ_LSE]),  handle(x[FZ_DOUT]), handle(x[FZ_DQ]), handle(x[FZ_DK]),
                            handle(x[FZ_DV]),   handle(x[FZ_BIAS])};
    fa_status st;
    if (pb->ex || a.bias)
        st = forward ? CALL(fa_forward_ex(h, &a)) : CALL(fa_backward_ex(h, &a));
    else
        st = forward ? CALL(fa_forward(h, a.q, a.k, a.v, a.o, a.lse))
                     : CALL(fa_backward(h, a.q, a.k, a.v, a.o, a.lse, a.dout, a.dq, a.dk, a.dv));
    if (st == FA_SUCCESS && !p) die("%s succeeded without a plan", call);
    if (st == FA_SUCCESS && p->desc.d.kv_cache) die("%s succeeded on a KV-cache plan", call);
    if (st == FA_SUCCESS && (p->desc.d.bias_batch > 0) != (a.bias != NULL))
        die("%s succeeded with%s a bias on a plan with bias_batch = %d", call, a.bias ? "" : "out",
            p->desc.d.bias_batch);
    if (st == FA_SUCCESS) {
        check_inside(pb, &p->desc.d, call);
        check_disjoint(pb, &p->desc.d, forward ? PASS_FORWARD : PASS_BACKWARD, call);
    }
    snapshot_compare(&sn, pb, p ? &p->desc.d : NULL, forward ? PASS_FORWARD : PASS_BACKWARD, st == FA_SUCCESS);
    snapshot_free(&sn);
}

/* ------------------------------------------------------------------------ */
/* Data                                                                     */

/* The dtype a role's buffer holds: O and dO in o's, the others in their
 * own tensor's (dQ, dK, dV in q's, k's, v's), L in fp32. */
static fa_dtype fill_dtype(const fa_attention_desc *d, fz_role r) {
    switch (r) {
    case FZ_LSE: return FA_DTYPE_F32;
    case FZ_BIAS: return d->bias.dtype;
    case FZ_O:
    case FZ_DOUT: return d->o.dtype;
    case FZ_K:
    case FZ_DK: return d->k.dtype;
    case FZ_V:
    case FZ_DV: return d->v.dtype;
    default: return d->q.dtype;
    }
}

/* Fills a buffer through fa_buffer_upload: values of a few magnitudes in
 * the buffer's dtype, with NaN, infinities and huge values sprinkled in;
 * clean: finite values of magnitude at most 4 only. */
static void fill(fz_in *in, fz_buffer *b, fa_dtype dtype, unsigned char *scratch, int clean) {
    if (!b || !b->h) return;
    uint32_t state = fz_u32(in) | 1u;
    float magnitude = fz_float(in, 0.0f, 4.0f);
    int specials = fz_choose(in, 4);
    if (clean) {
        magnitude = magnitude >= 0.0f && magnitude <= 4.0f ? magnitude : 4.0f;
        specials = 0;
    }
    size_t elem = fa_dtype_size(dtype);
    size_t count = b->bytes / elem;
    for (size_t i = 0; i < count; i++) {
        state ^= state << 13, state ^= state >> 17, state ^= state << 5;
        float v = magnitude * ((float)(state >> 8) / 8388608.0f - 1.0f);
        if (specials && state % 61 == 0) {
            const float odd[4] = {NAN, INFINITY, -INFINITY, 3.0e38f};
            v = odd[state / 61 % (unsigned)specials];
        }
        if (elem == 4) {
            memcpy(scratch + i * 4, &v, 4);
        } else if (elem == 1) {
            scratch[i] = fa_f64_to_e4m3((double)v);
        } else {
            uint16_t h = dtype == FA_DTYPE_F16 ? fa_f32_to_f16(v) : fa_f32_to_bf16(v);
            memcpy(scratch + i * 2, &h, 2);
        }
    }
    memset(scratch + count * elem, 0, b->bytes - count * elem);
    CALL(fa_buffer_upload(b->h, 0, scratch, b->bytes));
}

/* ------------------------------------------------------------------------ */
/* Operations                                                               */

static fz_buffer *pick_buffer(fz_in *in, state *s) {
    int i = fz_choose(in, BUFFERS + 1);
    return i < BUFFERS ? &s->buf[i] : NULL;
}

static fz_buffer *free_buffer_slot(state *s, int i) { return s->buf[i].h ? NULL : &s->buf[i]; }

static void op_context_create(fz_in *in, state *s) {
    fz_context *c = &s->ctx[fz_choose(in, CONTEXTS)];
    /* The reference only (other backends are not compiled into the fuzzing
     * build), by name, as "any", or an invalid backend. */
    static const int backends[] = {FA_BACKEND_REFERENCE, FA_BACKEND_REFERENCE, FA_BACKEND_ANY, FA_BACKEND_COUNT,
                                   -2, 1000};
    int backend = backends[fz_choose(in, (int)(sizeof backends / sizeof backends[0]))];
    int index = fz_int(in, -1, 0, 1);
    if (fz_choose(in, 32) == 0) {
        CALL(fa_context_create((fa_backend)backend, index, NULL));
        return;
    }
    if (c->h) return;
    fa_context h = NULL;
    fa_status st = CALL(fa_context_create((fa_backend)backend, index, &h));
    /* Only -1 means "best" (the header). */
    if (index < -1 && st != FA_ERR_INVALID_ARGUMENT)
        die("fa_context_create(%d, %d) gave %s, not invalid argument", backend, index, fa_status_string(st));
    if (st != FA_SUCCESS) return;
    fa_device_info info;
    if (CALL(fa_context_get_info(h, &info)) != FA_SUCCESS) die("fa_context_get_info failed on a new context");
    if (info.backend != FA_BACKEND_REFERENCE) {
        CALL(fa_context_destroy(h));
        return;
    }
    c->h = h;
    c->id = ++s->next_id;
}

static void op_context_destroy(fz_in *in, state *s) {
    int i = fz_choose(in, CONTEXTS + 1);
    if (i == CONTEXTS) {
        CALL(fa_context_destroy(NULL));
        return;
    }
    fz_context *c = &s->ctx[i];
    if (!c->h) return;
    /* Either the context lives on until its buffers and plans are gone, or
     * the call refuses: in both cases those objects stay usable. */
    if (CALL(fa_context_destroy(c->h)) == FA_SUCCESS) c->h = NULL;
}

static void op_context_misc(fz_in *in, state *s) {
    int i = fz_choose(in, CONTEXTS + 1);
    fa_context h = i < CONTEXTS ? s->ctx[i].h : NULL;
    fa_device_info info;
    void *nc = NULL, *nq = NULL;
    switch (fz_choose(in, 4)) {
    case 0: CALL(fa_context_get_info(h, fz_choose(in, 2) ? &info : NULL)); break;
    case 1: CALL(fa_context_synchronize(h)); break;
    case 2: CALL(fa_context_get_native(h, &nc, &nq)); break;
    default: CALL(fa_context_get_native(h, NULL, NULL)); break;
    }
}

static void add_buffer(fz_buffer *slot, const fz_context *c, fa_buffer h, size_t bytes, unsigned char *wrapped) {
    if (!c) die("a buffer was made without a context");
    slot->h = h;
    slot->ctx_id = c->id;
    slot->bytes = bytes;
    slot->wrapped = wrapped;
    size_t size = 0;
    if (CALL(fa_buffer_size(h, &size)) != FA_SUCCESS || size != bytes)
        die("fa_buffer_size says %zu bytes for a buffer of %zu", size, bytes);
}

static void alloc_into(fz_buffer *slot, fz_context *c, size_t bytes) {
    fa_buffer h = NULL;
    if (CALL(fa_buffer_alloc(c ? c->h : NULL, bytes, &h)) != FA_SUCCESS) return;
    if (bytes > MAX_BUFFER) die("fa_buffer_alloc of %zu bytes succeeded", bytes);
    add_buffer(slot, c, h, bytes, NULL);
    /* Defined contents, so that a run replays exactly. */
    static const unsigned char zeros[MAX_BUFFER];
    CALL(fa_buffer_upload(h, 0, zeros, bytes));
}

static fz_context *pick_context(fz_in *in, state *s) {
    int i = fz_choose(in, CONTEXTS + 1);
    return i < CONTEXTS && s->ctx[i].h ? &s->ctx[i] : NULL;
}

static void op_buffer_alloc(fz_in *in, state *s) {
    fz_context *c = pick_context(in, s);
    fz_buffer *slot = free_buffer_slot(s, fz_choose(in, BUFFERS));
    size_t bytes = fz_size(in, 1, MAX_BUFFER);
    /* Between MAX_BUFFER and what the allocator refuses lies nothing worth
     * the memory. */
    if (bytes > MAX_BUFFER && bytes < ((size_t)1 << 40)) bytes = MAX_BUFFER;
    if (!slot) return;
    alloc_into(slot, c, bytes);
}

/* A buffer of the size one of a plan's tensors needs, give or take. */
static void op_buffer_for_tensor(fz_in *in, state *s) {
    fz_plan *p = &s->plan[fz_choose(in, PLANS)];
    fz_role role = (fz_role)fz_choose(in, FZ_ROLE_COUNT);
    fz_buffer *slot = free_buffer_slot(s, fz_choose(in, BUFFERS));
    int delta = fz_int(in, 0, 0, 1) ? fz_int(in, -16, 16, 1) : 0;
    fz_context *c = p->h ? context_of(s, p->ctx_id) : NULL;
    fz_span sp;
    if (!slot || !c || !fz_tensor_span(&p->desc.d, role, &sp)) return;
    fz_wide bytes = sp.end + delta;
    if (bytes < 1) bytes = 1;
    if (bytes > (fz_wide)MAX_BUFFER) bytes = MAX_BUFFER;
    alloc_into(slot, c, (size_t)bytes);
}

static void op_buffer_wrap(fz_in *in, state *s) {
    fz_context *c = pick_context(in, s);
    fz_buffer *slot = free_buffer_slot(s, fz_choose(in, BUFFERS));
    size_t bytes = fz_size(in, 1, MAX_BUFFER);
    int null_native = fz_choose(in, 32) == 0;
    if (!slot) return;
    if (bytes == 0) {
        /* Refused before the memory is looked at. */
        fa_buffer h = NULL;
        if (CALL(fa_buffer_wrap(c ? c->h : NULL, s->scratch, 0, &h)) == FA_SUCCESS)
            die("fa_buffer_wrap of 0 bytes succeeded");
        return;
    }
    if (bytes > MAX_BUFFER) return;
    unsigned char *mem = malloc(bytes + 2 * GUARD);
    if (!mem) return;
    memset(mem + GUARD, 0, bytes);
    ASAN_POISON_MEMORY_REGION(mem, GUARD);
    ASAN_POISON_MEMORY_REGION(mem + GUARD + bytes, GUARD);
    fa_buffer h = NULL;
    if (CALL(fa_buffer_wrap(c ? c->h : NULL, null_native ? NULL : mem + GUARD, bytes, &h)) != FA_SUCCESS) {
        ASAN_UNPOISON_MEMORY_REGION(mem, bytes + 2 * GUARD);
        free(mem);
        return;
    }
    add_buffer(slot, c, h, bytes, mem);
}

static void op_buffer_free(fz_in *in, state *s) {
    fz_buffer *b = pick_buffer(in, s);
    if (!b) {
        CALL(fa_buffer_free(NULL));
        return;
    }
    if (!b->h) return;
    if (CALL(fa_buffer_free(b->h)) != FA_SUCCESS) die("fa_buffer_free failed on a live buffer");
    release_wrapped(b);
    memset(b, 0, sizeof *b);
}

static void op_buffer_copy(fz_in *in, state *s, int upload) {
    fz_buffer *b = pick_buffer(in, s);
    size_t offset = fz_size(in, 0, MAX_BUFFER);
    size_t bytes = fz_size(in, 0, MAX_BUFFER);
    int null_host = fz_choose(in, 32) == 0;
    if (b && !b->h) return;
    /* The host side holds at most MAX_BUFFER bytes, as much as any buffer:
     * a longer copy must be refused, and reading or writing past the
     * scratch would show. */
    void *host = null_host ? NULL : s->scratch;
    unsigned char *before = NULL;
    if (b) {
        before = malloc(b->bytes);
        if (!before) return;
        memcpy(before, host_bytes(b), b->bytes);
    }
    fa_status st = upload ? CALL(fa_buffer_upload(handle(b), offset, host, bytes))
                          : CALL(fa_buffer_download(handle(b), offset, host, bytes));
    if (b) {
        int inside = offset <= b->bytes && bytes <= b->bytes - offset;
        if (st == FA_SUCCESS && !inside)
            die("%s of [%zu, +%zu) succeeded on a %zu-byte buffer", upload ? "fa_buffer_upload" : "fa_buffer_download",
                offset, bytes, b->bytes);
        const unsigned char *now = host_bytes(b);
        for (size_t x = 0; x < b->bytes; x++) {
            int written = upload && st == FA_SUCCESS && x >= offset && x - offset < bytes;
            if (!written && now[x] != before[x])
                die("%s changed byte %zu of the buffer outside the range [%zu, +%zu)",
                    upload ? "fa_buffer_upload" : "fa_buffer_download", x, offset, bytes);
        }
    }
    free(before);
}

static void op_buffer_query(fz_in *in, state *s) {
    fz_buffer *b = pick_buffer(in, s);
    if (b && !b->h) return;
    size_t size = 0;
    void *native = NULL;
    switch (fz_choose(in, 4)) {
    case 0: CALL(fa_buffer_size(handle(b), NULL)); break;
    case 1: CALL(fa_buffer_get_native(handle(b), NULL)); break;
    case 2: CALL(fa_buffer_get_native(handle(b), &native)); break;
    default:
        if (CALL(fa_buffer_size(handle(b), &size)) == FA_SUCCESS && size != b->bytes)
            die("fa_buffer_size says %zu for a %zu-byte buffer", size, b->bytes);
        break;
    }
}

static void op_buffer_fill(fz_in *in, state *s) {
    fz_buffer *b = pick_buffer(in, s);
    fill(in, b, (fa_dtype)fz_choose(in, 3), s->scratch, 0);
}

/* The plan's info must be what the planner gives for its context's device:
 * the same problem on the same device always gets the same plan. */
static void check_plan_info(fz_plan *p, fz_context *c) {
    fa_plan_info got, want;
    fa_device_info info;
    if (CALL(fa_plan_get_info(p->h, &got)) != FA_SUCCESS) die("fa_plan_get_info failed on a live plan");
    if (!c || CALL(fa_context_get_info(c->h, &info)) != FA_SUCCESS) return;
    if (CALL(fa_plan_for_device(&info.desc, &p->desc.d, &want)) != FA_SUCCESS)
        die("fa_plan_create succeeded where fa_plan_for_device on its device fails");
    if (memcmp(&got, &want, sizeof got) != 0) die("fa_plan_get_info differs from fa_plan_for_device on the same device");
}

static void op_plan_create(fz_in *in, state *s) {
    fz_context *c = pick_context(in, s);
    fz_plan *p = &s->plan[fz_choose(in, PLANS)];
    int null_desc = fz_choose(in, 32) == 0;
    fz_desc given;
    fz_desc_read(in, &given);
    trace_desc(&given);
    if (p->h) {
        fz_desc_free(&given);
        return;
    }
    fz_desc keep;
    if (!fz_desc_copy(&keep, &given)) {
        fz_desc_free(&given);
        return;
    }
    fa_plan h = NULL;
    fa_status st = CALL(fa_plan_create(c ? c->h : NULL, null_desc ? NULL : &given.d, &h));
    /* The plan keeps its own copies of the host arrays (the header says so):
     * freeing them now makes any later use a heap-use-after-free. */
    fz_desc_free(&given);
    if (st != FA_SUCCESS) {
        fz_desc_free(&keep);
        return;
    }
    if (!c) die("fa_plan_create succeeded without a context");
    check_accepted(&keep.d, "fa_plan_create");
    if (CALL(fa_attention_desc_check(&keep.d)) != FA_SUCCESS)
        die("fa_plan_create accepted a descriptor that fa_attention_desc_check refuses");
    p->h = h;
    p->ctx_id = c->id;
    p->desc = keep;
    check_plan_info(p, c);
}

static void op_plan_destroy(fz_in *in, state *s) {
    int i = fz_choose(in, PLANS + 1);
    if (i == PLANS) {
        CALL(fa_plan_destroy(NULL));
        return;
    }
    fz_plan *p = &s->plan[i];
    if (!p->h) return;
    if (CALL(fa_plan_destroy(p->h)) != FA_SUCCESS) die("fa_plan_destroy failed on a live plan");
    fz_desc_free(&p->desc);
    memset(p, 0, sizeof *p);
}

static fz_plan *pick_plan(fz_in *in, state *s) {
    int i = fz_choose(in, PLANS + 1);
    return i < PLANS && s->plan[i].h ? &s->plan[i] : NULL;
}

/* The reference walks every (sequence, head) pair, empty sequences
 * included: a plan of a billion heads over no tokens fits any buffer but
 * takes seconds. Passes stay fast by skipping such plans. */
static int too_slow_to_run(const fz_plan *p) {
    if (!p) return 0;
    const fa_attention_desc *d = &p->desc.d;
    /* A KV-cache step reads up to seqlen_k keys a sequence, whatever its
     * buffers hold (a pool of one page serves any capacity). */
    const fz_wide step = (fz_wide)d->batch * d->seqlen_k * d->head_dim * ((fz_wide)d->heads_kv + (fz_wide)d->seqlen_q * d->heads_q);
    return (fz_wide)d->batch * d->heads_q > MAX_ROWS || (d->kv_cache && step > MAX_STEP_WORK);
}

/* ------------------------------------------------------------------------ */
/* KV-cache steps                                                           */

/* The promises of the header for each sequence of a successful step: one
 * that breaks the rules (fz_kv_seq_valid) has O and L NaN; one that keeps
 * them, on finite inputs of small magnitude (clean) with scales and slopes
 * that cannot overflow, has O finite and L not NaN (-inf for rows without
 * a key). */
static void check_step_rows(const snapshot *sn, const pass_buffers *pb, const fa_attention_desc *d, int clean) {
    const int32_t *lens = step_array(sn, pb, FZ_SEQLENS), *table = step_array(sn, pb, FZ_BLOCK_TABLE);
    const unsigned char *o = host_bytes(pb->of_role[FZ_O]);
    const float *lse = pb->of_role[FZ_LSE] ? (const float *)(const void *)host_bytes(pb->of_role[FZ_LSE]) : NULL;
    int bounded = clean && fabs(d->softmax_scale) <= 1e3;
    for (int h = 0; d->alibi_slopes && h < d->heads_q; h++) bounded &= fabsf(d->alibi_slopes[h]) <= 1e3f;
    for (int b = 0; b < d->batch; b++) {
        const int valid = fz_kv_seq_valid(d, lens, table, b);
        if (valid && !bounded) continue;
        for (int i = 0; i < d->seqlen_q; i++)
            for (int h = 0; h < d->heads_q; h++) {
                const fz_wide row = fz_element(d, FZ_O, b, i, h);
                for (int x = 0; x < d->head_dim; x++) {
                    const double v = fa_load_elem(o, d->o.dtype, (int64_t)row + x);
                    if (valid ? !isfinite(v) : !isnan(v))
                        die("fa_forward_kvcache: sequence %d (cache_seqlens %d) %s, but O[%d, %d, %d, %d] = %g", b,
                            (int)lens[b], valid ? "keeps the rules on clean data" : "breaks the rules", b, i, h, x, v);
                }
                const float l = lse ? lse[((int64_t)b * d->heads_q + h) * d->seqlen_q + i] : NAN;
                if (lse && (valid ? isnan(l) : !isnan(l)))
                    die("fa_forward_kvcache: sequence %d (cache_seqlens %d) %s, but L[%d, %d, %d] = %g", b, (int)lens[b],
                        valid ? "keeps the rules on clean data" : "breaks the rules", b, h, i, (double)l);
            }
    }
}

/* The step again on host copies of its buffers as they were before it,
 * through core/reference_kvcache.c: every buffer must come out byte for
 * byte as the backend left it (arguments sharing a buffer share its copy,
 * so aliasing is the same). */
static void check_step_reference(const snapshot *sn, const pass_buffers *pb, const fa_attention_desc *d) {
    unsigned char *copy[FZ_ROLE_COUNT] = {0};
    void *at[FZ_ROLE_COUNT] = {0};
    for (int i = 0; i < sn->count; i++) {
        copy[i] = malloc(sn->buf[i]->bytes);
        if (!copy[i]) die("out of host memory for a copy of a step's buffer");
        memcpy(copy[i], sn->before[i], sn->buf[i]->bytes);
        for (int r = 0; r < FZ_ROLE_COUNT; r++)
            if (in_pass(pb, r) && pb->of_role[r] == sn->buf[i]) at[r] = copy[i];
    }
    const fa_ref_kvcache_args a = {at[FZ_Q],        at[FZ_K],          at[FZ_V],       at[FZ_O],
                                   at[FZ_LSE],      at[FZ_SEQLENS],    at[FZ_BLOCK_TABLE], at[FZ_K_NEW],
                                   at[FZ_V_NEW],    at[FZ_ROT_COS],    at[FZ_ROT_SIN]};
    const fa_status st = fa_ref_forward_kvcache(d, &a);
    if (st != FA_SUCCESS && st != FA_ERR_OUT_OF_MEMORY)
        die("core/reference_kvcache.c refused a step the backend ran: %s", fa_last_error());
    for (int i = 0; st == FA_SUCCESS && i < sn->count; i++) {
        const unsigned char *now = host_bytes(sn->buf[i]);
        for (size_t x = 0; x < sn->buf[i]->bytes; x++)
            if (now[x] != copy[i][x])
                die("fa_forward_kvcache and core/reference_kvcache.c differ at byte %zu of a %zu-byte buffer", x,
                    sn->buf[i]->bytes);
    }
    for (int i = 0; i < sn->count; i++) free(copy[i]);
    fa_clear_error();
}

/* One KV-cache step held to the oracle. expect_success: the buffers are
 * exactly what the header asks for, so only running out of memory may
 * fail it. */
static void run_kvcache(fz_plan *p, const pass_buffers *all, int null_args, int clean, int expect_success) {
    /* L is optional: without it, it is no argument of the step. */
    pass_buffers given = *all;
    if (!given.of_role[FZ_LSE]) given.roles &= ~(1u << FZ_LSE);
    const pass_buffers *pb = &given;
    snapshot sn;
    snapshot_take(&sn, pb);
    fz_buffer *const *x = pb->of_role;
    const fa_kvcache_args a = {handle(x[FZ_Q]),       handle(x[FZ_K]),           handle(x[FZ_V]),
                               handle(x[FZ_O]),       handle(x[FZ_LSE]),         handle(x[FZ_SEQLENS]),
                               handle(x[FZ_BLOCK_TABLE]), handle(x[FZ_K_NEW]),   handle(x[FZ_V_NEW]),
                               handle(x[FZ_ROT_COS]), handle(x[FZ_ROT_SIN])};
    const char *call = "fa_forward_kvcache";
    const fa_status st = CALL(fa_forward_kvcache(p ? p->h : NULL, null_args ? NULL : &a));
    const fa_attention_desc *d = p ? &p->desc.d : NULL;
    if (st == FA_SUCCESS) {
        if (!p || null_args) die("%s succeeded without a plan or arguments", call);
        if (!d->kv_cache) die("%s succeeded on a plan with kv_cache = 0", call);
        check_inside(pb, d, call);
        check_disjoint(pb, d, PASS_KVCACHE, call);
    } else if (expect_success && st != FA_ERR_OUT_OF_MEMORY) {
        die("%s refused a step on buffers of exactly the sizes the header asks for: %s", call, fa_last_error());
    }
    snapshot_compare(&sn, pb, d, PASS_KVCACHE, st == FA_SUCCESS);
    if (st == FA_SUCCESS) {
        check_step_rows(&sn, pb, d, clean);
        check_step_reference(&sn, pb, d);
    }
    snapshot_free(&sn);
}

/* int32 arrays of a step: cache lengths up to the room left for the
 * append (the pickers' extremes give negative ones, INT_MAX, lengths past
 * the capacity), and block tables of pages in the pool, or entries outside
 * it (-1, num_pages, INT_MAX, INT_MIN), and hostile values past each
 * sequence's pages, which must never be read. */
static void fill_step_arrays(fz_in *in, const fa_attention_desc *d, fz_buffer *lens, fz_buffer *table,
                             unsigned char *scratch) {
    int32_t *v = (int32_t *)(void *)scratch;
    const int room = d->seqlen_k - d->seqlen_new;
    int32_t *len = malloc((size_t)d->batch * sizeof *len);
    if (!len) die("out of host memory for cache lengths");
    for (int b = 0; b < d->batch; b++) len[b] = v[b] = fz_int(in, 0, room, 1);
    CALL(fa_buffer_upload(lens->h, 0, scratch, lens->bytes));
    trace_ints("cache_seqlens", v, d->batch);
    if (!table) {
        free(len);
        return;
    }
    const int64_t per_seq = ((int64_t)d->seqlen_k + d->page_size - 1) / d->page_size;
    const int mode = fz_choose(in, 4);
    for (int b = 0; b < d->batch; b++)
        for (int64_t p = 0; p < per_seq; p++) {
            int32_t *e = &v[b * per_seq + p];
            const int used = len[b] >= 0 && p < ((int64_t)len[b] + d->seqlen_new + d->page_size - 1) / d->page_size;
            if (mode == 0)
                *e = fz_int(in, 0, d->num_pages - 1, 1);
            else if (used || mode == 1)
                *e = fz_choose(in, d->num_pages);
            else
                *e = (const int32_t[]){-1, INT32_MAX, INT32_MIN, d->num_pages}[fz_choose(in, 4)];
        }
    CALL(fa_buffer_upload(table->h, 0, scratch, table->bytes));
    trace_ints("block_table", v, d->batch * per_seq);
    free(len);
}

/* A step on fresh buffers of exactly the sizes the plan's tensors need,
 * filled with data (clean or with NaN and infinities) and with cache
 * lengths and block tables from fill_step_arrays. */
static void kvcache_step(fz_in *in, fz_plan *p, fz_context *c, unsigned char *scratch) {
    const fa_attention_desc *d = &p->desc.d;
    const int clean = fz_choose(in, 4) != 0, with_lse = fz_choose(in, 4) != 0;
    fz_buffer bufs[FZ_ROLE_COUNT];
    pass_buffers pb;
    memset(bufs, 0, sizeof bufs);
    memset(&pb, 0, sizeof pb);
    pb.roles = KVCACHE_ROLES;
    int ok = 1;
    for (int r = 0; r < FZ_ROLE_COUNT && ok; r++) {
        fz_span sp;
        if (!in_pass(&pb, r) || (r == FZ_LSE && !with_lse)) continue;
        ok = fz_tensor_span(d, (fz_role)r, &sp) && sp.end <= (fz_wide)MAX_BUFFER;
        if (!ok || sp.end == 0) continue; /* not asked for */
        alloc_into(&bufs[r], c, (size_t)sp.end);
        ok = bufs[r].h != NULL;
        pb.of_role[r] = &bufs[r];
        if (ok && r < FZ_SEQLENS)
            fill(in, &bufs[r], fill_dtype(d, (fz_role)r), scratch, clean);
        else if (ok && r >= FZ_ROT_COS)
            fill(in, &bufs[r], FA_DTYPE_F32, scratch, clean);
    }
    if (ok) {
        fill_step_arrays(in, d, &bufs[FZ_SEQLENS], pb.of_role[FZ_BLOCK_TABLE], scratch);
        run_kvcache(p, &pb, 0, clean, 1);
    }
    for (int r = 0; r < FZ_ROLE_COUNT; r++)
        if (bufs[r].h && CALL(fa_buffer_free(bufs[r].h)) != FA_SUCCESS) die("fa_buffer_free failed");
}

/* A step on any buffers of the slots (missing, too small, aliased, of
 * another context), on a KV-cache plan; now and then without arguments. */
static void kvcache_pass(fz_in *in, state *s, fz_plan *p) {
    pass_buffers pb;
    memset(&pb, 0, sizeof pb);
    pb.roles = KVCACHE_ROLES;
    const int null_args = fz_choose(in, 32) == 0;
    for (int r = 0; r < FZ_ROLE_COUNT; r++) {
        if (!in_pass(&pb, r)) continue;
        /* Mostly none of the arrays and tensors the plan does not ask for. */
        fz_span sp;
        if (fz_tensor_span(&p->desc.d, (fz_role)r, &sp) && sp.end == 0 && fz_choose(in, 8)) continue;
        fz_buffer *b = pick_buffer(in, s);
        pb.of_role[r] = b && b->h ? b : NULL;
    }
    run_kvcache(p, &pb, null_args, 0, 0);
}

static void op_pass(fz_in *in, state *s, int forward) {
    fz_plan *p = pick_plan(in, s);
    pass_buffers pb;
    memset(&pb, 0, sizeof pb);
    pb.roles = forward ? FORWARD_ROLES : BACKWARD_ROLES;
    pb.ex = fz_choose(in, 2);
    for (int r = 0; r < FZ_ROLE_COUNT; r++) {
        if (!in_pass(&pb, r)) continue;
        /* Mostly no bias, as most plans have none. */
        fz_buffer *b = r == FZ_BIAS && fz_choose(in, 4) ? NULL : pick_buffer(in, s);
        pb.of_role[r] = b && b->h ? b : NULL;
    }
    if (too_slow_to_run(p)) return;
    /* On a KV-cache plan, mostly its own call (fa_forward and fa_backward
     * refuse it). */
    if (p && p->desc.d.kv_cache && fz_choose(in, 4)) {
        kvcache_pass(in, s, p);
        return;
    }
    run_pass(p, &pb, forward);
}

/* A forward then a backward pass on fresh buffers of exactly the sizes the
 * plan's tensors need, filled with data: the path on which passes succeed. */
static void op_run(fz_in *in, state *s) {
    fz_plan *p = pick_plan(in, s);
    int slack = fz_int(in, 0, 0, 1) ? fz_int(in, 0, 64, 16) : 0;
    fz_context *c = p ? context_of(s, p->ctx_id) : NULL;
    if (!c || too_slow_to_run(p)) return;
    if (p->desc.d.kv_cache) {
        kvcache_step(in, p, c, s->scratch);
        return;
    }
    fz_buffer bufs[FZ_ROLE_COUNT];
    pass_buffers pb;
    memset(bufs, 0, sizeof bufs);
    memset(&pb, 0, sizeof pb);
    pb.roles = BACKWARD_ROLES;
    pb.ex = fz_choose(in, 2);
    int ok = 1;
    for (int r = 0; r < FZ_ROLE_COUNT && ok; r++) {
        /* The bias goes only to a plan that has one. */
        if (r == FZ_BIAS && p->desc.d.bias_batch == 0) continue;
        fz_span sp;
        ok = fz_tensor_span(&p->desc.d, (fz_role)r, &sp) && sp.end + slack <= (fz_wide)MAX_BUFFER;
        if (!ok) break;
        size_t bytes = sp.end + slack > 0 ? (size_t)(sp.end + slack) : 1;
        alloc_into(&bufs[r], c, bytes);
        ok = bufs[r].h != NULL;
        pb.of_role[r] = &bufs[r];
        if (ok)
            fill(in, &bufs[r], fill_dtype(&p->desc.d, (fz_role)r), s->scratch, 0);
    }
    if (ok) {
        pb.roles = FORWARD_ROLES;
        run_pass(p, &pb, 1);
        pb.roles = BACKWARD_ROLES;
        run_pass(p, &pb, 0);
        /* fa_forward_kvcache refuses a plan without kv_cache. */
        const fa_kvcache_args ka = {.q = bufs[FZ_Q].h, .k_cache = bufs[FZ_K].h, .v_cache = bufs[FZ_V].h,
                                    .o = bufs[FZ_O].h, .lse = bufs[FZ_LSE].h};
        if (CALL(fa_forward_kvcache(p->h, &ka)) != FA_ERR_INVALID_ARGUMENT)
            die("fa_forward_kvcache on a plan with kv_cache = 0 did not fail as an invalid argument");
    }
    for (int r = 0; r < FZ_ROLE_COUNT; r++)
        if (bufs[r].h && CALL(fa_buffer_free(bufs[r].h)) != FA_SUCCESS) die("fa_buffer_free failed");
}

/* fa_plan_info_format into exactly out_size bytes: NUL-terminated, the
 * length it needed returned, nothing written past out_size. */
static void check_format(fz_in *in, const fa_plan_info *info) {
    size_t out_size = fz_size(in, 0, MAX_TEXT);
    if (out_size > MAX_TEXT) out_size = MAX_TEXT;
    char *out = out_size ? malloc(out_size) : NULL;
    if (out_size && !out) return;
    if (out) memset(out, 'x', out_size);
    size_t need = fa_plan_info_format(info, out, out_size);
    size_t again = fa_plan_info_format(info, NULL, 0);
    if (need != again) die("fa_plan_info_format needs %zu bytes into a buffer and %zu into none", need, again);
    if (out) {
        size_t len = strnlen(out, out_size);
        if (len == out_size) die("fa_plan_info_format left %zu bytes unterminated", out_size);
        if (len != (need < out_size ? need : out_size - 1))
            die("fa_plan_info_format wrote %zu characters of %zu into %zu bytes", len, need, out_size);
    }
    free(out);
}

static void op_plan_query(fz_in *in, state *s) {
    fz_plan *p = pick_plan(in, s);
    fa_plan_info info;
    double ms = 0.0;
    switch (fz_choose(in, 4)) {
    case 0: CALL(fa_plan_get_info(p ? p->h : NULL, NULL)); break;
    case 1:
        if (CALL(fa_plan_last_time_ms(p ? p->h : NULL, fz_choose(in, 8) ? &ms : NULL)) == FA_SUCCESS &&
            !(ms >= 0.0 && isfinite(ms)))
            die("fa_plan_last_time_ms gave %g ms", ms);
        break;
    default:
        if (CALL(fa_plan_get_info(p ? p->h : NULL, &info)) == FA_SUCCESS) check_format(in, &info);
        break;
    }
}

/* A plan fits its device: tiles and work-groups within its limits, costs
 * not negative and not NaN (infinite where a described rate is absurdly
 * small, which the device check lets through). */
static void check_plan_fits(const fa_device_desc *dev, const fa_kernel_plan *k, const char *pass) {
    const double costs[] = {k->cost.hbm_read_bytes, k->cost.hbm_write_bytes, k->cost.flops, k->cost.compute_ms,
                            k->cost.memory_ms, k->cost.roofline_ms, k->cost.dram_read_bytes, k->cost.dram_write_bytes};
    for (size_t i = 0; i < sizeof costs / sizeof costs[0]; i++)
        if (!(costs[i] >= 0.0)) die("%s plan: cost field %zu is %g", pass, i, costs[i]);
    if (k->variant == FA_VARIANT_STANDARD) return;
    if (k->br <= 0 || k->bc <= 0 || k->split_k < 1 || k->stages < 1 || k->num_work_groups < 1)
        die("%s plan: br %d, bc %d, split_k %d, stages %d, %d work-groups", pass, k->br, k->bc, k->split_k, k->stages,
            k->num_work_groups);
    if (k->work_group_size < 1 || k->work_group_size > dev->max_work_group_size)
        die("%s plan: work-group of %d on a device of at most %d", pass, k->work_group_size,
            dev->max_work_group_size);
    if (k->local_mem_bytes > dev->local_mem_bytes)
        die("%s plan: %zu bytes of local memory on a device of %zu", pass, k->local_mem_bytes, dev->local_mem_bytes);
}

static void op_plan_for_device(fz_in *in, state *s) {
    (void)s;
    fa_device_desc dev;
    fz_device_read(in, &dev);
    if (tracing) fz_device_print(stderr, &dev);
    fz_desc d;
    fz_desc_read(in, &d);
    trace_desc(&d);
    int null_arg = fz_choose(in, 32);
    fa_plan_info info, again;
    fa_status st = CALL(fa_plan_for_device(null_arg == 0 ? NULL : &dev, null_arg == 1 ? NULL : &d.d,
                                           null_arg == 2 ? NULL : &info));
    if (st == FA_SUCCESS) {
        check_accepted(&d.d, "fa_plan_for_device");
        if (CALL(fa_plan_for_device(&dev, &d.d, &again)) != FA_SUCCESS || memcmp(&info, &again, sizeof info) != 0)
            die("fa_plan_for_device gave two different answers for the same problem");
        if (info.kv_cache != (d.d.kv_cache == 1)) die("fa_plan_for_device: plan kv_cache %d for a descriptor's %d", info.kv_cache, d.d.kv_cache);
        if (d.d.algorithm == FA_ALGO_FUSED) {
            check_plan_fits(&dev, &info.forward, "forward");
            /* A KV-cache step has no backward: its plan is empty. */
            if (!info.kv_cache) check_plan_fits(&dev, &info.backward, "backward");
        }
        check_format(in, &info);
    }
    fz_desc_free(&d);
}

static void op_desc_check(fz_in *in, state *s) {
    (void)s;
    fz_desc d;
    fz_desc_read(in, &d);
    trace_desc(&d);
    if (CALL(fa_attention_desc_check(fz_choose(in, 64) ? &d.d : NULL)) == FA_SUCCESS)
        check_accepted(&d.d, "fa_attention_desc_check");
    fz_desc_free(&d);
}

/* Calls that may be made from anywhere with anything. */
static void op_queries(fz_in *in, state *s) {
    int count = 0;
    char *reason = NULL;
    size_t reason_size = 0;
    fa_device_info info;
    switch (fz_choose(in, 8)) {
    case 0: CALL(fa_device_count(fz_choose(in, 8) ? &count : NULL)); break;
    case 1: CALL(fa_device_get_info(fz_int(in, -1, 4, 1), fz_choose(in, 8) ? &info : NULL)); break;
    case 2:
        reason_size = fz_size(in, 0, 600);
        if (reason_size > 600) reason_size = 600;
        reason = reason_size ? malloc(reason_size) : NULL;
        CALL(fa_backend_get_status((fa_backend)fz_int(in, -1, 4, 1), reason, reason_size));
        if (reason && strnlen(reason, reason_size) == reason_size)
            die("fa_backend_get_status left its reason unterminated");
        free(reason);
        break;
    case 3: {
        int v = fz_int(in, -1, FA_STATUS_COUNT + 1, 1);
        if (!fa_status_string((fa_status)v) || !fa_backend_name((fa_backend)v) || !fa_dtype_name((fa_dtype)v) ||
            !fa_variant_name((fa_variant)v))
            die("a name function returned NULL for %d", v);
        (void)fa_dtype_size((fa_dtype)v);
        break;
    }
    case 4: {
        uint64_t seed = (uint64_t)fz_i64(in, 0, 255, 1), offset = (uint64_t)fz_i64(in, 0, 255, 1);
        float p = fz_float(in, 0.0f, 1.0f);
        int args[5];
        for (int i = 0; i < 5; i++) args[i] = fz_int(in, 0, 64, 1);
        int keep = fa_dropout_keep(seed, offset, p, args[0], args[1], args[2], args[3], args[4]);
        if (keep != 0 && keep != 1) die("fa_dropout_keep returned %d", keep);
        break;
    }
    case 5: {
        fa_plan_info raw;
        for (size_t i = 0; i < sizeof raw; i++) ((unsigned char *)&raw)[i] = fz_byte(in);
        check_format(in, fz_choose(in, 16) ? &raw : NULL);
        break;
    }
    case 6: {
        fz_desc d;
        fz_desc_read(in, &d);
        (void)fa_attention_total_q(&d.d);
        (void)fa_attention_total_k(&d.d);
        (void)fa_attention_total_q(NULL);
        fa_attention_desc_init(NULL);
        fz_desc_free(&d);
        break;
    }
    default: {
        int major = -1, minor = -1, patch = -1;
        const char *v = fa_version(&major, &minor, &patch);
        char expect[64];
        snprintf(expect, sizeof expect, "%d.%d.%d", major, minor, patch);
        if (!v || strcmp(v, expect) != 0) die("fa_version says %s but %s", v ? v : "(null)", expect);
        break;
    }
    }
    (void)s;
}

/* ------------------------------------------------------------------------ */
/* The program                                                              */

static void op_upload(fz_in *in, state *s) { op_buffer_copy(in, s, 1); }
static void op_download(fz_in *in, state *s) { op_buffer_copy(in, s, 0); }
static void op_forward(fz_in *in, state *s) { op_pass(in, s, 1); }
static void op_backward(fz_in *in, state *s) { op_pass(in, s, 0); }

/* The opcode is the index in this table (the corpus depends on the order:
 * append, never insert). */
static const struct {
    const char *name;
    void (*run)(fz_in *in, state *s);
} ops[] = {
    {"context_create", op_context_create}, {"context_destroy", op_context_destroy},
    {"context_misc", op_context_misc},     {"buffer_alloc", op_buffer_alloc},
    {"buffer_for_tensor", op_buffer_for_tensor}, {"buffer_wrap", op_buffer_wrap},
    {"buffer_free", op_buffer_free},       {"upload", op_upload},
    {"download", op_download},             {"buffer_query", op_buffer_query},
    {"buffer_fill", op_buffer_fill},       {"plan_create", op_plan_create},
    {"plan_destroy", op_plan_destroy},     {"forward", op_forward},
    {"backward", op_backward},             {"run", op_run},
    {"plan_query", op_plan_query},         {"plan_for_device", op_plan_for_device},
    {"desc_check", op_desc_check},         {"queries", op_queries},
};

/* Plans, then buffers, then contexts: the order every caller may use. */
static void teardown(state *s) {
    for (int i = 0; i < PLANS; i++)
        if (s->plan[i].h) {
            if (CALL(fa_plan_destroy(s->plan[i].h)) != FA_SUCCESS) die("fa_plan_destroy failed at teardown");
            fz_desc_free(&s->plan[i].desc);
        }
    for (int i = 0; i < BUFFERS; i++)
        if (s->buf[i].h) {
            if (CALL(fa_buffer_free(s->buf[i].h)) != FA_SUCCESS) die("fa_buffer_free failed at teardown");
            release_wrapped(&s->buf[i]);
        }
    for (int i = 0; i < CONTEXTS; i++)
        if (s->ctx[i].h && CALL(fa_context_destroy(s->ctx[i].h)) != FA_SUCCESS)
            die("fa_context_destroy failed at teardown, with nothing left on the context");
    free(s->scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    state s;
    memset(&s, 0, sizeof s);
    s.scratch = malloc(MAX_BUFFER);
    if (!s.scratch) return 0;
    memset(s.scratch, 0, MAX_BUFFER);
    for (int n = 0; n < MAX_OPS && in.n > 0; n++) {
        int op = fz_choose(&in, (int)(sizeof ops / sizeof ops[0]));
        trace("%s", ops[op].name);
        ops[op].run(&in, &s);
    }
    teardown(&s);
    return 0;
}
