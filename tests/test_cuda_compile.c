/* The CUDA kernels compiled by NVRTC without a GPU: every program the
 * planner can ask for on a described H100 (sm_90) and A100 (sm_80), for
 * every dtype (fp32 on the FP32 pipes and on TF32 tensor cores), head
 * dimensions from 8 to 256, plain and fully masked options (causal, window,
 * block-sparse, dropout, varlen, deterministic) and decoding (split-K),
 * the backward above head_dim 128 with warps sharing key strips, and a
 * representative set of KV-cache steps (contiguous and paged, append,
 * rotary, softcap, ALiBi). The
 * tensor-core kernels must not spill: ptxas' own report (the compile log of
 * --ptxas-options=-v) is read for every kernel, and a table of registers
 * and spills is printed. Runs wherever NVRTC loads; skips otherwise.
 *
 * fa-test-labels: compile */
#include "harness.h"
#include "test_util.h"

#include "desc.h"
#include "fa_internal.h"
#include "flashattn.h"
#include "planner.h"

#ifdef FA_WITH_CUDA
#include "backends/cuda/cuda_runtime_internal.h"
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FA_WITH_CUDA

static char g_skip[512];

static int nvrtc_here(void) {
    char why[400];
    if (fa_cuda_nvrtc_available(why, sizeof why)) return 1;
    snprintf(g_skip, sizeof g_skip, "NVRTC cannot be loaded here: %s", why);
    return 0;
}

#define REQUIRE_NVRTC()                                                                    \
    do {                                                                                   \
        if (!nvrtc_here()) FA_SKIP(g_skip);                                                \
    } while (0)

/* An A100 (SXM, 40 GB) described by hand: 108 SMs, 163 KiB of shared memory
 * per block with opt-in, 2048 dense fp16 flops per clock and SM. */
static fa_device_desc a100(void) {
    fa_device_desc d = fa_described_device_find("h100")->desc;
    snprintf(d.name, sizeof d.name, "NVIDIA A100-SXM4-40GB");
    snprintf(d.arch, sizeof d.arch, "sm_80");
    d.local_mem_bytes = 166912;
    d.compute_units = 108;
    d.clock_mhz = 1410;
    d.bandwidth_gbs = 1555.0;
    d.fp32_flops_per_clock_cu = 128.0;
    d.matrix_flops_per_clock_cu = 2048.0;
    return d;
}

/* ------------------------------------------------------------------------ */
/* Jobs: one plan each, compiled on a small pool of threads                  */

#define MAX_REPORTS 8

typedef struct job {
    char label[96];
    fa_attention_desc desc;
    fa_plan_info info;
    int cc_major, cc_minor;
    int forward_only; /* fa_cuda_compile_forward */
    fa_status status;
    char error[1024];
    fa_cuda_kernel_report reports[MAX_REPORTS];
    int count;
} job;

typedef struct pool {
    job *jobs;
    int njobs;
    int next;
    pthread_mutex_t lock;
} pool;

static void *worker(void *arg) {
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->njobs) return NULL;
        job *j = &p->jobs[i];
        j->status = (j->forward_only ? fa_cuda_compile_forward : fa_cuda_compile_plan)(
            &j->desc, &j->info, j->cc_major, j->cc_minor, j->reports, MAX_REPORTS, &j->count);
        if (j->status != FA_SUCCESS) snprintf(j->error, sizeof j->error, "%s", fa_last_error());
    }
}

static void run_jobs(job *jobs, int n) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores > 1 ? (cores > 4 ? 4 : (int)cores) : 1;
    pool p = {jobs, n, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t tid[4];
    int started = 0;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&tid[started], NULL, worker, &p) == 0) started++;
    if (started == 0) worker(&p);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
}

/* ------------------------------------------------------------------------ */
/* The problems                                                              */

typedef enum dmode { MODE_F16, MODE_BF16, MODE_TF32, MODE_F32, MODE_COUNT } dmode;
static const char *const mode_names[] = {"fp16", "bf16", "tf32", "fp32"};

static const int32_t cu_q[] = {0, 700, 1900, 2048, 4000};
static const int32_t cu_k[] = {0, 900, 1900, 2100, 4096};
static uint8_t g_mask[64 * 64];

static fa_attention_desc problem(dmode mode, int dim, int option_set) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    fa_dtype t = mode == MODE_F16 ? FA_DTYPE_F16 : mode == MODE_BF16 ? FA_DTYPE_BF16 : FA_DTYPE_F32;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t;
    d.allow_tf32 = mode == MODE_TF32;
    d.head_dim = dim;
    d.heads_q = 16;
    d.heads_kv = 4;
    if (option_set == 2) {
        /* Decoding: a few queries over many keys. */
        d.batch = 2;
        d.seqlen_q = 4;
        d.seqlen_k = 8192;
        return d;
    }
    d.batch = 4;
    d.seqlen_q = d.seqlen_k = 2048;
    if (option_set == 1 || option_set == 3) {
        /* 3: every mask, no dropout, dQ by atomics. */
        d.causal = 1;
        d.window_left = 700;
        d.window_right = 0;
        d.dropout_p = option_set == 1 ? 0.1f : 0.0f;
        d.dropout_seed = 1;
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
        d.block_q = d.block_k = 64;
        d.block_mask = g_mask;
        d.block_mask_bytes = (size_t)32 * 32;
        d.deterministic = option_set == 1;
    }
    return d;
}

static const int dims[] = {8, 32, 40, 64, 80, 96, 128, 192, 256};
/* plain, all-options, decode, masks (problem()) */
#define OPTION_SETS 4

/* Builds the job list for one device; returns the number of jobs. */
static int make_jobs(const fa_device_desc *dev, int cc_major, int cc_minor, job *jobs, int cap) {
    for (size_t i = 0; i < sizeof g_mask; i++) g_mask[i] = (uint8_t)((i * 7 + 3) % 5 != 0);
    int n = 0;
    for (int m = 0; m < MODE_COUNT; m++)
        for (size_t di = 0; di < FA_ARRAY_SIZE(dims); di++)
            for (int os = 0; os < OPTION_SETS; os++) {
                if (n >= cap) return n;
                job *j = &jobs[n];
                memset(j, 0, sizeof *j);
                j->desc = problem((dmode)m, dims[di], os);
                j->cc_major = cc_major;
                j->cc_minor = cc_minor;
                snprintf(j->label, sizeof j->label, "%s d%d %s", mode_names[m], dims[di],
                         os == 0 ? "plain" : os == 1 ? "all-options" : os == 2 ? "decode" : "masks");
                fa_status st = fa_plan_for_device(dev, &j->desc, &j->info);
                CHECK_MSG(st == FA_SUCCESS, "%s: planning failed: %s", j->label, fa_last_error());
                if (st == FA_SUCCESS) n++;
            }
    return n;
}

/* ptxas did not make the kernel's warpgroup MMAs wait for one another
 * (its C7510 note: about half the tensor pipe's rate where it does). */
static void check_not_serialized(const fa_cuda_kernel_report *r, const char *what) {
    CHECK_MSG(r->wgmma_serialized != 1, "%s %s %s: ptxas serialised its warpgroup MMAs (options %s)", r->arch, what,
              r->kernel, r->options);
}

/* Prints the table of a device's jobs and checks every kernel; returns how
 * many plans run tensor-core kernels. */
static int print_and_check_jobs(const char *device, job *jobs, int n) {
    printf("\n%-8s %-28s %-8s %-18s %5s %5s %6s %6s %7s %s\n", "device", "problem", "program", "kernel", "thr",
           "regs", "spillS", "spillL", "smem", "plan");
    int kernels = 0, mma_kernels = 0, mma_programs_seen = 0;
    double seconds = 0.0;
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        CHECK_MSG(j->status == FA_SUCCESS, "%s %s: %s (%s)", device, j->label, fa_status_string(j->status), j->error);
        if (j->status != FA_SUCCESS) continue;
        CHECK_MSG(j->count >= (j->forward_only ? 1 : 2) && j->count <= MAX_REPORTS, "%s %s: %d kernels", device, j->label, j->count);
        const fa_kernel_plan *f = &j->info.forward, *b = &j->info.backward;
        char plan[96];
        snprintf(plan, sizeof plan, "f %s %dx%d/%d s%d k%d, b %s %dx%d/%d", fa_variant_name(f->variant), f->br,
                 f->bc, f->work_group_size, f->stages, f->split_k, fa_variant_name(b->variant), b->br, b->bc,
                 b->work_group_size);
        for (int k = 0; k < j->count && k < MAX_REPORTS; k++) {
            const fa_cuda_kernel_report *r = &j->reports[k];
            kernels++;
            seconds += r->compile_seconds;
            printf("%-8s %-28s %-8s %-18s %5d %5d %6d %6d %7zu %s\n", r->arch, j->label, r->program, r->kernel,
                   r->threads, r->registers, r->spill_stores, r->spill_loads, r->shared_bytes, k == 0 ? plan : "");
            CHECK_MSG(r->real_code, "%s %s %s: compiled to PTX, not to the architecture's own code", r->arch,
                      j->label, r->kernel);
            CHECK_MSG(r->registers > 0 && r->registers <= 255, "%s %s %s: ptxas reported %d registers", r->arch,
                      j->label, r->kernel, r->registers);
            check_not_serialized(r, j->label);
            /* The planner's local-memory budget is what the kernels ask for. */
            if (strstr(r->kernel, "fwd_mma") || strstr(r->kernel, "fwd_simt") || strstr(r->kernel, "fwd_decode") ||
                strstr(r->kernel, "kv_attend"))
                CHECK_MSG(r->shared_bytes == f->local_mem_bytes, "%s %s %s: %zu bytes of shared memory, plan %zu",
                          r->arch, j->label, r->kernel, r->shared_bytes, f->local_mem_bytes);
            if (strstr(r->kernel, "dkdv"))
                CHECK_MSG(r->shared_bytes == b->local_mem_bytes, "%s %s %s: %zu bytes of shared memory, plan %zu",
                          r->arch, j->label, r->kernel, r->shared_bytes, b->local_mem_bytes);
            if (r->tensor_cores && (strstr(r->kernel, "_mma") || strstr(r->kernel, "_decode"))) {
                mma_kernels++;
                CHECK_MSG(r->spill_stores == 0 && r->spill_loads == 0 && r->stack_bytes == 0,
                          "%s %s %s spills: %d bytes stored, %d loaded, %d bytes of stack (options %s)", r->arch,
                          j->label, r->kernel, r->spill_stores, r->spill_loads, r->stack_bytes, r->options);
            }
        }
        if (fa_variant_on_matrix_units(f->variant) || fa_variant_on_matrix_units(b->variant)) mma_programs_seen++;
    }
    printf("%s: %d plans, %d kernels (%d on tensor cores), %.1f s of compiling (0 for cache hits)\n", device, n,
           kernels, mma_kernels, seconds);
    return mma_programs_seen;
}

/* min_mma: tensor-core plans the sweep must contain at least. */
static void print_and_check(const char *device, job *jobs, int n, int min_mma) {
    const int mma_programs_seen = print_and_check_jobs(device, jobs, n);
    CHECK_MSG(mma_programs_seen >= min_mma, "only %d plans use tensor cores", mma_programs_seen);
}

static void sweep(const char *device, const fa_device_desc *dev, int cc_major, int cc_minor) {
    const int cap = MODE_COUNT * (int)FA_ARRAY_SIZE(dims) * OPTION_SETS;
    job *jobs = calloc((size_t)cap, sizeof *jobs);
    CHECK(jobs != NULL);
    if (!jobs) return;
    int n = make_jobs(dev, cc_major, cc_minor, jobs, cap);
    CHECK(n == cap);
    run_jobs(jobs, n);
    /* The sweep reaches the tensor-core kernels of every dtype mode but fp32. */
    print_and_check(device, jobs, n, 3 * 6);
    /* Every dtype, head dimension and option set planned tensor-core
     * kernels wherever the m16n8k16 shape divides the head dimension; on
     * sm_90 the fp16/bf16 forward is the warpgroup one wherever 64-column
     * blocks divide it, and nowhere else; so is the backward, within its
     * register rule. */
    for (int i = 0; i < n; i++) {
        const fa_attention_desc *d = &jobs[i].desc;
        const fa_variant fv = jobs[i].info.forward.variant, bv = jobs[i].info.backward.variant;
        int mma_dtype = d->q.dtype != FA_DTYPE_F32 || d->allow_tf32;
        int wgmma_shape = cc_major == 9 && cc_minor == 0 && d->q.dtype != FA_DTYPE_F32 && d->head_dim % 64 == 0 &&
                          d->seqlen_q > 16;
        if (mma_dtype && d->head_dim % 16 == 0 && d->seqlen_q > 16 && d->head_dim <= 128)
            CHECK_MSG(fa_variant_on_matrix_units(fv), "%s %s: forward %s", device, jobs[i].label, fa_variant_name(fv));
        /* The warp-specialised one where its tensor maps describe the
         * problem (fixed-length sequences) and, at head_dim 256, without
         * the options that spilled there. */
        /* Head dims between whole 64-column blocks (96 here) run it
         * built for the next block, with fixed lengths. */
        const int padded = cc_major == 9 && cc_minor == 0 && d->q.dtype != FA_DTYPE_F32 && d->head_dim % 64 != 0 &&
                           d->head_dim % 32 == 0 && d->head_dim > 64 && d->head_dim < 256 && d->seqlen_q > 16 &&
                           !d->cu_seqlens_q;
        const int bounds = d->window_left >= 0 || d->window_right >= 0 || d->block_mask;
        const int tma_regs = d->head_dim <= 192 || (!d->softcap && !d->alibi_slopes && !d->bias_batch &&
                                                    !(d->dropout_p > 0.0f && bounds));
        const int tma_shape = (wgmma_shape || padded) && !d->cu_seqlens_q && tma_regs;
        CHECK_MSG((fv == FA_VARIANT_WGMMA || fv == FA_VARIANT_WGMMA_TMA) == (wgmma_shape || tma_shape) &&
                      (fv == FA_VARIANT_WGMMA_TMA) == tma_shape,
                  "%s %s: forward %s", device, jobs[i].label, fa_variant_name(fv));
        /* The warpgroup backward up to head_dim 128 (decoding too): at 128
         * not where dropout's Philox state comes with masks or varlen (the
         * all-options set here; dropout_backward_sm90 below has neither);
         * the warp-specialised one among them with fixed lengths. */
        const int crowded = d->dropout_p > 0.0f && d->cu_seqlens_q;
        const int wgmma_bwd = cc_major == 9 && cc_minor == 0 && d->q.dtype != FA_DTYPE_F32 &&
                              d->head_dim % 64 == 0 && d->head_dim <= (crowded ? 64 : 128);
        /* At 192 and 256 the warp-specialised one with fixed lengths,
         * without dropout or score options (two warpgroups sharing the
         * keys). */
        const int tma_split = cc_major == 9 && cc_minor == 0 && d->q.dtype != FA_DTYPE_F32 &&
                            (d->head_dim == 256 || d->head_dim == 192) && !d->cu_seqlens_q && d->dropout_p <= 0.0f &&
                            !fa_desc_option_in_use(d);
        /* At 96 (built for 96), 160 and 224 (for 192 and 256) the
         * warp-specialised one where the next whole block plans it: fixed
         * lengths, not deterministic, no score options, at 192 and 256 no
         * dropout. */
        const int tma_pad = cc_major == 9 && cc_minor == 0 && d->q.dtype != FA_DTYPE_F32 && d->head_dim % 32 == 0 &&
                            d->head_dim > 64 && d->head_dim % 64 != 0 && !d->cu_seqlens_q &&
                            !d->deterministic && !fa_desc_option_in_use(d) &&
                            (d->head_dim < 128 || d->dropout_p <= 0.0f);
        CHECK_MSG((bv == FA_VARIANT_WGMMA || bv == FA_VARIANT_WGMMA_TMA) == (wgmma_bwd || tma_split || tma_pad) &&
                      (bv == FA_VARIANT_WGMMA_TMA) == ((wgmma_bwd && !d->cu_seqlens_q) || tma_split || tma_pad),
                  "%s %s: backward %s", device, jobs[i].label, fa_variant_name(bv));
        /* fp16/bf16 backward on tensor cores at every head_dim the
         * m16n8k16 shape divides, above 128 with warps sharing key strips
         * (bwd_mma.cu DK_SPLIT), which the plan's text names. */
        if (d->q.dtype != FA_DTYPE_F32 && d->head_dim % 16 == 0) {
            CHECK_MSG(fa_variant_on_matrix_units(bv), "%s %s: backward %s", device, jobs[i].label, fa_variant_name(bv));
            char text[4096];
            fa_plan_info_format(&jobs[i].info, text, sizeof text);
            CHECK_MSG((strstr(text, "key strips shared by") != NULL) == (d->head_dim > 128), "%s %s: plan text\n%s",
                      device, jobs[i].label, text);
        }
        if (!mma_dtype || d->head_dim % 16)
            CHECK_MSG(!fa_variant_on_matrix_units(fv) && !fa_variant_on_matrix_units(bv), "%s %s: tensor cores planned", device, jobs[i].label);
    }
    free(jobs);
}

/* Every decoding kernel the planner can emit: each dtype, each head_dim it
 * takes, each tile height (the group's rows: 1 x 16 up to 64), with and
 * without key splits, with no masks and with all of them (causal, window,
 * varlen: the most registers). */
static const int32_t dec_cu_q[] = {0, 1, 3, 4};
static const int32_t dec_cu_k[] = {0, 4000, 4001, 9000};

static int decode_jobs(const fa_device_desc *dev, int cc_major, int cc_minor, job *jobs, int cap) {
    static const int groups[] = {1, 8, 16, 32}; /* rows 4 x group, seqlen_q 4: 4 .. 128 (> 64: not decode) */
    int n = 0;
    for (int t = 0; t < 2; t++)
        for (int dim = 16; dim <= 256; dim += 16)
            for (size_t gi = 0; gi < FA_ARRAY_SIZE(groups); gi++)
                for (int opts = 0; opts < 2; opts++)
                    for (int split = 0; split < 2; split++) {
                        fa_attention_desc d;
                        fa_attention_desc_init(&d);
                        d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = t ? FA_DTYPE_BF16 : FA_DTYPE_F16;
                        d.head_dim = dim;
                        d.heads_kv = 2;
                        d.heads_q = 2 * groups[gi];
                        d.seqlen_q = 4;
                        d.seqlen_k = 9000;
                        /* Many sequences leave the device no room to split. */
                        d.batch = split ? 1 : 512;
                        if (opts) {
                            d.causal = 1;
                            d.window_left = 3000;
                            d.window_right = 0;
                            d.batch = split ? 3 : 512;
                            if (split) {
                                d.cu_seqlens_q = dec_cu_q;
                                d.cu_seqlens_k = dec_cu_k;
                            }
                        }
                        fa_plan_info info;
                        fa_status st = fa_plan_for_device(dev, &d, &info);
                        CHECK_MSG(st == FA_SUCCESS, "decode d%d g%d: %s", dim, groups[gi], fa_last_error());
                        if (st != FA_SUCCESS || info.forward.variant != FA_VARIANT_DECODE) continue;
                        CHECK_MSG((info.forward.split_k > 1) == split, "decode d%d g%d opts %d: %d splits", dim,
                                  groups[gi], opts, info.forward.split_k);
                        /* One job per distinct program. */
                        int seen = 0;
                        for (int i = 0; i < n && !seen; i++) {
                            const fa_attention_desc *e = &jobs[i].desc;
                            const fa_kernel_plan *f = &jobs[i].info.forward;
                            seen = e->q.dtype == d.q.dtype && e->head_dim == dim && e->causal == d.causal &&
                                   (e->cu_seqlens_q != NULL) == (d.cu_seqlens_q != NULL) &&
                                   f->br == info.forward.br && f->stages == info.forward.stages &&
                                   (f->split_k > 1) == (info.forward.split_k > 1);
                        }
                        if (seen) continue;
                        if (n >= cap) return n;
                        job *j = &jobs[n++];
                        memset(j, 0, sizeof *j);
                        j->desc = d;
                        j->info = info;
                        j->cc_major = cc_major;
                        j->cc_minor = cc_minor;
                        j->forward_only = 1;
                        snprintf(j->label, sizeof j->label, "%s d%d g%d %s%s", t ? "bf16" : "fp16", dim,
                                 groups[gi], opts ? "masks" : "plain", split ? " split" : "");
                    }
    return n;
}

static void decode_sweep(const char *device, const fa_device_desc *dev, int cc_major, int cc_minor) {
    const int cap = 2 * 16 * 4 * 2 * 2;
    job *jobs = calloc((size_t)cap, sizeof *jobs);
    CHECK(jobs != NULL);
    if (!jobs) return;
    const int n = decode_jobs(dev, cc_major, cc_minor, jobs, cap);
    /* Groups of 32 at 4 tokens are 128 rows: not decoding; the rest are,
     * and per dtype, head_dim, options and splits they make one to three
     * programs (16, 32 and 64 rows where the registers allow). */
    CHECK_MSG(n >= 2 * 16 * 2 * 2 && n <= 2 * 16 * 3 * 2 * 2, "%d decoding programs", n);
    run_jobs(jobs, n);
    print_and_check(device, jobs, n, n);
    free(jobs);
}

/* KV-cache steps (decode.cu built with KV_CACHE): a representative set,
 * each option in at least one program, the heaviest combinations (64 rows,
 * every option; head_dim 256) and the generic tile copies (head_dim 80,
 * whose rows do not split evenly over the threads), with and without key
 * splits, each as the planner plans it (the decoding plan over the
 * cache's capacity: kernels_cuda/README.md). */
typedef struct kv_case {
    const char *label;
    int bf16, dim, group, seqlen_q, split;
    int page_size, seqlen_new, rotary_dim, interleaved, softcap, alibi, causal, window;
} kv_case;

static const kv_case kv_cases[] = {
    /* the benchmark's steps: contiguous, then 64- and 256-token pages with one new token */
    {"bf16 d128 g8 contiguous", 1, 128, 8, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"bf16 d128 g8 pages 64 append", 1, 128, 8, 1, 1, 64, 1, 0, 0, 0, 0, 0, 0},
    {"bf16 d128 g8 pages 256 append rotary causal", 1, 128, 8, 1, 1, 256, 1, 128, 0, 0, 0, 1, 0},
    /* every option on 64 packed rows (4 strips a warp), and on two row tiles of 32 */
    {"fp16 d64 g16 sq4 pages 32 everything", 0, 64, 16, 4, 1, 32, 4, 64, 0, 1, 1, 1, 1},
    {"bf16 d128 g16 sq4 pages 64 everything", 1, 128, 16, 4, 1, 64, 4, 128, 1, 1, 1, 1, 1},
    /* interleaved rotary, softcap, ALiBi, a window, no split */
    {"fp16 d64 g4 pages 16 interleaved window", 0, 64, 4, 1, 0, 16, 1, 32, 1, 1, 1, 0, 1},
    /* pages that do not divide the tile; a chunk half rotated (dims 72..75 of 72..79) */
    {"fp16 d128 g8 sq4 pages 48 rotary 76", 0, 128, 8, 4, 1, 48, 4, 76, 0, 0, 1, 1, 0},
    {"bf16 d256 g1 pages 128 softcap", 1, 256, 1, 2, 1, 128, 2, 0, 0, 1, 0, 1, 0},
    /* generic copies: 10 chunks a row; rotary half 20 */
    {"bf16 d80 g8 contiguous append rotary 40", 1, 80, 8, 2, 1, 0, 2, 40, 0, 0, 0, 1, 0},
    {"bf16 d128 g4 contiguous append no split", 1, 128, 4, 2, 0, 0, 2, 0, 0, 1, 1, 1, 0},
};

static float kv_slopes[64];

static int kvcache_jobs(const fa_device_desc *dev, int cc_major, int cc_minor, job *jobs, int cap) {
    for (size_t i = 0; i < FA_ARRAY_SIZE(kv_slopes); i++) kv_slopes[i] = 0.5f / (float)(i + 1);
    int n = 0;
    for (size_t c = 0; c < FA_ARRAY_SIZE(kv_cases) && n < cap; c++) {
        const kv_case *k = &kv_cases[c];
        const fa_dtype t = k->bf16 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
        /* Many sequences leave the device no room to split. */
        const fa_test_kv_shape shape = {t,            k->dim,          k->group,   k->seqlen_q, 16384,
                                        k->split ? 1 : 512, k->page_size, k->seqlen_new, k->rotary_dim,
                                        k->interleaved, k->softcap,    k->alibi,   k->causal,   k->window};
        fa_attention_desc d = fa_test_kv_desc(&shape, kv_slopes);
        /* The decoding sweep's longer window and larger pool. */
        if (k->window) d.window_left = 1000;
        if (k->page_size) d.num_pages = 4096;
        job *j = &jobs[n];
        memset(j, 0, sizeof *j);
        fa_status st = fa_plan_for_device(dev, &d, &j->info);
        CHECK_MSG(st == FA_SUCCESS, "%s: planning failed: %s", k->label, fa_last_error());
        if (st != FA_SUCCESS) continue;
        CHECK_MSG(j->info.forward.variant == FA_VARIANT_DECODE && (j->info.forward.split_k > 1) == k->split,
                  "%s: planned %s with %d splits", k->label, fa_variant_name(j->info.forward.variant),
                  j->info.forward.split_k);
        j->desc = d;
        j->cc_major = cc_major;
        j->cc_minor = cc_minor;
        j->forward_only = 1;
        snprintf(j->label, sizeof j->label, "kv %s%s", k->label, k->split ? " split" : "");
        n++;
    }
    return n;
}

static void kvcache_sweep(const char *device, const fa_device_desc *dev, int cc_major, int cc_minor) {
    job jobs[FA_ARRAY_SIZE(kv_cases)];
    const int n = kvcache_jobs(dev, cc_major, cc_minor, jobs, (int)FA_ARRAY_SIZE(kv_cases));
    CHECK_MSG(n == (int)FA_ARRAY_SIZE(kv_cases), "%d of %d KV-cache programs planned", n,
              (int)FA_ARRAY_SIZE(kv_cases));
    run_jobs(jobs, n);
    print_and_check(device, jobs, n, n);
    for (int i = 0; i < n; i++) {
        const job *j = &jobs[i];
        if (j->status != FA_SUCCESS || j->count < 1) continue;
        /* One kernel (a split step merges in its last block) built for the
         * cache with the descriptor's options. */
        const fa_cuda_kernel_report *r = &j->reports[0];
        const fa_attention_desc *d = &j->desc;
        CHECK_MSG(j->count == 1 && strcmp(r->kernel, "fa_fwd_decode") == 0, "%s: %d kernels, first %s", j->label,
                  j->count, r->kernel);
        CHECK_MSG(strstr(r->options, "-DKV_CACHE") != NULL, "%s: options %s", j->label, r->options);
        CHECK_MSG((strstr(r->options, "-DPAGED=") != NULL) == (d->page_size > 0), "%s: options %s", j->label,
                  r->options);
        CHECK_MSG((strstr(r->options, "-DAPPEND") != NULL) == (d->seqlen_new > 0), "%s: options %s", j->label,
                  r->options);
        CHECK_MSG((strstr(r->options, "-DROTARY_DIM=") != NULL) == (d->rotary_dim > 0), "%s: options %s", j->label,
                  r->options);
        CHECK_MSG((strstr(r->options, "-DSOFTCAP") != NULL) == (d->softcap > 0.0f), "%s: options %s", j->label,
                  r->options);
        CHECK_MSG((strstr(r->options, "-DALIBI") != NULL) == (d->alibi_slopes != NULL), "%s: options %s", j->label,
                  r->options);
        CHECK_MSG((strstr(r->options, "-DSPLIT_MERGE_LAST") != NULL) == (j->info.forward.split_k > 1),
                  "%s: options %s", j->label, r->options);
    }
}

/* The KV-cache step on the FP32 pipes (kvcache_simt.cu), for what the
 * decoding kernel does not run (fp32, head dims that are not multiples of
 * 16): packed-row SIMT tiles of the shapes the planner and the device-
 * generic test's forced tiles use, every option in one of them, split and
 * not. Three kernels (two without splits); the attention's shared memory
 * is the plan's. */
typedef struct kv_simt_case {
    const char *label;
    fa_dtype dtype;
    int dim, group, seqlen_q, br, bc, tr, tc, split;
    int page_size, seqlen_new, rotary_dim, interleaved, softcap, alibi, causal, window;
} kv_simt_case;

static const kv_simt_case kv_simt_cases[] = {
    {"fp32 d128 g8 contiguous", FA_DTYPE_F32, 128, 8, 1, 16, 64, 2, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fp32 d64 g2 sq4 pages 64 append rotary causal", FA_DTYPE_F32, 64, 2, 4, 8, 32, 4, 4, 3, 64, 4, 32, 0, 0, 0, 1, 0},
    {"fp16 d40 g4 pages 16 everything", FA_DTYPE_F16, 40, 4, 2, 16, 16, 1, 1, 4, 16, 2, 24, 1, 1, 1, 1, 1},
    {"bf16 d72 g2 contiguous append", FA_DTYPE_BF16, 72, 2, 1, 8, 16, 2, 2, 1, 0, 1, 72, 0, 0, 1, 0, 0},
    {"fp32 d64 g4 sq2 pages 48 softcap", FA_DTYPE_F32, 64, 4, 2, 32, 64, 8, 8, 1, 48, 2, 0, 0, 1, 0, 1, 0},
};

static void kvcache_simt_sweep(const char *device, int cc_major, int cc_minor) {
    enum { N = (int)FA_ARRAY_SIZE(kv_simt_cases) };
    job jobs[N];
    for (int i = 0; i < N; i++) {
        const kv_simt_case *k = &kv_simt_cases[i];
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        const fa_test_kv_shape shape = {k->dtype,      k->dim,         k->group,       k->seqlen_q, 4096,
                                        2,             k->page_size,   k->seqlen_new,  k->rotary_dim,
                                        k->interleaved, k->softcap,    k->alibi,       k->causal,   k->window};
        const fa_attention_desc d = fa_test_kv_desc(&shape, kv_slopes);
        fa_kernel_plan *f = &j->info.forward;
        f->variant = k->split > 1 ? FA_VARIANT_SPLITK : FA_VARIANT_SIMT;
        f->br = k->br;
        f->bc = k->bc;
        f->thread_rows = k->tr;
        f->thread_cols = k->tc;
        f->work_group_size = (k->br / k->tr) * (k->bc / k->tc);
        f->split_k = k->split;
        f->stages = 1;
        f->local_mem_bytes = fa_plan_local_mem(FA_VARIANT_SIMT, FA_PASS_FORWARD, &d, k->br, k->bc, 1);
        j->desc = d;
        j->cc_major = cc_major;
        j->cc_minor = cc_minor;
        j->forward_only = 1;
        snprintf(j->label, sizeof j->label, "kv simt %s%s", k->label, k->split > 1 ? " split" : "");
    }
    run_jobs(jobs, N);
    print_and_check(device, jobs, N, 0);
    for (int i = 0; i < N; i++) {
        const job *j = &jobs[i];
        if (j->status != FA_SUCCESS) continue;
        const int split = j->info.forward.split_k > 1;
        CHECK_MSG(j->count == 2 + split, "%s: %d kernels", j->label, j->count);
        if (j->count < 2) continue;
        CHECK_MSG(strcmp(j->reports[0].kernel, "fa_kv_prepare") == 0 && strcmp(j->reports[1].kernel, "fa_kv_attend") == 0,
                  "%s: kernels %s, %s", j->label, j->reports[0].kernel, j->reports[1].kernel);
        if (split && j->count > 2) CHECK(strcmp(j->reports[2].kernel, "fa_splitk_merge") == 0);
        CHECK_MSG(strstr(j->reports[1].options, "-DKV_CACHE") != NULL, "%s: options %s", j->label,
                  j->reports[1].options);
    }
}

/* ------------------------------------------------------------------------ */
/* Score options (softcap, ALiBi, additive bias)                             */

enum {
    SC_SOFTCAP = 1,
    SC_ALIBI = 2,
    SC_BIAS = 4,     /* in the dtype, per batch and head */
    SC_BIAS_F32 = 8, /* the bias in fp32 */
    SC_HEAVY = 16,   /* beside dropout, a window and a block mask */
    SC_VARLEN = 32,  /* variable-length sequences and a window (no bias there) */
    SC_DECODE = 64   /* a decoding shape: 4 queries over 8192 keys */
};
#define SC_ALL (SC_SOFTCAP | SC_ALIBI | SC_BIAS)

/* What score options compile to, a representative set rather than the
 * full cross (CI's time): each option alone and all three together, fp16
 * and bf16, head_dim 64 and 128, causal and not; all three, or softcap
 * and ALiBi, beside the masks, dropout and deterministic mode (the most
 * registers); softcap and ALiBi over variable-length sequences; the
 * wide-head backward (192, 256); TF32 and the FP32 pipes; a decoding
 * shape. Each sits at a register edge of the planner's (core/planner.c). */
static const struct score_job {
    dmode mode;
    int dim, causal, deterministic, opts;
} score_jobs[] = {
    {MODE_F16, 64, 1, 0, SC_SOFTCAP},
    {MODE_BF16, 64, 0, 0, SC_ALIBI},
    {MODE_F16, 64, 0, 0, SC_BIAS},
    {MODE_F16, 128, 0, 0, SC_BIAS | SC_BIAS_F32},
    {MODE_BF16, 128, 1, 0, SC_SOFTCAP | SC_ALIBI},
    {MODE_BF16, 128, 1, 0, SC_ALL},
    {MODE_F16, 64, 0, 0, SC_SOFTCAP | SC_ALIBI},
    {MODE_F16, 64, 1, 0, SC_ALL | SC_HEAVY},
    {MODE_BF16, 96, 1, 0, SC_SOFTCAP | SC_ALIBI | SC_HEAVY},
    {MODE_BF16, 128, 1, 1, SC_ALL | SC_BIAS_F32 | SC_HEAVY},
    {MODE_F16, 128, 1, 0, SC_SOFTCAP | SC_ALIBI | SC_VARLEN},
    {MODE_F16, 256, 1, 0, SC_ALL},
    {MODE_BF16, 192, 0, 1, SC_ALL | SC_BIAS_F32},
    {MODE_TF32, 128, 1, 0, SC_ALL},
    {MODE_F32, 64, 1, 1, SC_ALL},
    {MODE_F16, 128, 0, 0, SC_ALL | SC_DECODE},
};
static const float g_slopes[16] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.75f, 1.0f,  0.2f,
                                   0.3f, 0.01f, 0.4f,   0.6f,    0.15f,    0.05f, 0.9f, 0.35f};

/* Whether the options define name (-Dname, alone or with a value). */
static int has_define(const char *options, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = strstr(options, "-D"); p; p = strstr(p + 2, "-D"))
        if (strncmp(p + 2, name, n) == 0 && (p[2 + n] == '\0' || p[2 + n] == ' ' || p[2 + n] == '=')) return 1;
    return 0;
}

static fa_attention_desc score_problem(const struct score_job *sj) {
    fa_attention_desc d = problem(sj->mode, sj->dim, sj->opts & SC_DECODE ? 2 : 0);
    d.causal = sj->causal;
    d.deterministic = sj->deterministic;
    if (sj->opts & SC_SOFTCAP) d.softcap = 30.0f;
    if (sj->opts & SC_ALIBI) d.alibi_slopes = g_slopes;
    if (sj->opts & SC_BIAS) {
        d.bias_batch = d.batch;
        d.bias_heads = d.heads_q;
        d.bias.dtype = sj->opts & SC_BIAS_F32 ? FA_DTYPE_F32 : d.q.dtype;
    }
    if (sj->opts & SC_HEAVY) {
        d.window_left = 700;
        d.window_right = 0;
        d.dropout_p = 0.1f;
        d.dropout_seed = 1;
        d.block_q = d.block_k = 64;
        d.block_mask = g_mask;
        d.block_mask_bytes = (size_t)32 * 32;
    }
    if (sj->opts & SC_VARLEN) {
        d.cu_seqlens_q = cu_q;
        d.cu_seqlens_k = cu_k;
        d.window_left = 700;
    }
    return d;
}

/* Every job plans and compiles without spilling in the tensor-core
 * kernels; each program has the plan's options compiled in; no plan takes
 * the packed decoding kernel (it has none of them): a decoding shape runs
 * the split-K forward. */
static void score_sweep(const char *device, const fa_device_desc *dev, int cc_major, int cc_minor) {
    for (size_t i = 0; i < sizeof g_mask; i++) g_mask[i] = (uint8_t)((i * 7 + 3) % 5 != 0);
    const int cap = (int)FA_ARRAY_SIZE(score_jobs);
    job jobs[FA_ARRAY_SIZE(score_jobs)];
    int n = 0;
    for (int i = 0; i < cap; i++) {
        const struct score_job *sj = &score_jobs[i];
        job *j = &jobs[n];
        memset(j, 0, sizeof *j);
        j->desc = score_problem(sj);
        j->cc_major = cc_major;
        j->cc_minor = cc_minor;
        snprintf(j->label, sizeof j->label, "%s d%d%s%s%s%s%s%s%s%s", mode_names[sj->mode], sj->dim,
                 sj->causal ? " causal" : "", sj->opts & SC_SOFTCAP ? " cap" : "", sj->opts & SC_ALIBI ? " alibi" : "",
                 sj->opts & SC_BIAS ? (sj->opts & SC_BIAS_F32 ? " bias32" : " bias") : "",
                 sj->opts & SC_HEAVY ? " +masks,drop" : "", sj->opts & SC_VARLEN ? " varlen" : "",
                 sj->opts & SC_DECODE ? " decode" : "", sj->deterministic ? " det" : "");
        fa_status st = fa_plan_for_device(dev, &j->desc, &j->info);
        CHECK_MSG(st == FA_SUCCESS, "%s: planning failed: %s", j->label, fa_last_error());
        if (st == FA_SUCCESS) n++;
    }
    CHECK(n == cap);
    run_jobs(jobs, n);
    print_and_check_jobs(device, jobs, n);
    for (int i = 0; i < n; i++) {
        const job *j = &jobs[i];
        const fa_variant fv = j->info.forward.variant;
        CHECK_MSG(fv != FA_VARIANT_DECODE, "%s %s: the packed decoding kernel was planned", device, j->label);
        if (j->desc.seqlen_q <= 16)
            CHECK_MSG(fv == FA_VARIANT_SPLITK, "%s %s: forward %s", device, j->label, fa_variant_name(fv));
        const fa_attention_desc *d = &j->desc;
        const int bias_f32 = d->bias_batch > 0 && d->bias.dtype == FA_DTYPE_F32 && d->q.dtype != FA_DTYPE_F32;
        for (int k = 0; k < j->count && k < MAX_REPORTS; k++) {
            const char *o = j->reports[k].options;
            CHECK_MSG(has_define(o, "SOFTCAP") == (d->softcap > 0.0f) && has_define(o, "ALIBI") == !!d->alibi_slopes &&
                          has_define(o, "BIAS") == (d->bias_batch > 0) && has_define(o, "BIAS_F32") == bias_f32,
                      "%s %s %s: options %s", device, j->label, j->reports[k].kernel, o);
        }
    }
}

#endif /* FA_WITH_CUDA */

#ifdef FA_WITH_CUDA
#define REQUIRE_CUDA_BUILD() ((void)0)
#else
#define REQUIRE_CUDA_BUILD() FA_SKIP("the CUDA backend is not built into this library")
#define REQUIRE_NVRTC() ((void)0)
#endif

FA_TEST(h100_sm90_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    sweep("h100", &fa_described_device_find("h100")->desc, 9, 0);
#endif
}

FA_TEST(a100_sm80_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    fa_device_desc d = a100();
    sweep("a100", &d, 8, 0);
#endif
}

FA_TEST(h100_sm90_decode_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    decode_sweep("h100", &fa_described_device_find("h100")->desc, 9, 0);
#endif
}

FA_TEST(a100_sm80_decode_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    fa_device_desc d = a100();
    decode_sweep("a100", &d, 8, 0);
#endif
}

FA_TEST(h100_sm90_kvcache_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    kvcache_sweep("h100", &fa_described_device_find("h100")->desc, 9, 0);
#endif
}

FA_TEST(a100_sm80_kvcache_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    fa_device_desc d = a100();
    kvcache_sweep("a100", &d, 8, 0);
#endif
}

FA_TEST(h100_sm90_score_options) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    score_sweep("h100", &fa_described_device_find("h100")->desc, 9, 0);
#endif
}

FA_TEST(a100_sm80_score_options) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    fa_device_desc d = a100();
    score_sweep("a100", &d, 8, 0);
#endif
}

/* The FP32-pipe KV-cache step: sm_90 and sm_80 (any architecture runs it;
 * these are the two CI compiles for). */
FA_TEST(kvcache_simt_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    kvcache_simt_sweep("h100", 9, 0);
    kvcache_simt_sweep("a100", 8, 0);
#endif
}

/* What the CUDA cache path refuses before compiling: a forward that is not
 * the decoding kernel, page sizes the page ring does not take, k_new rows
 * that are not 16-byte aligned, a bias; and a KV-cache plan compiles no
 * backward even when asked for the whole plan. */
FA_TEST(kvcache_refusals) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    const fa_device_desc *h100 = &fa_described_device_find("h100")->desc;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = d.k_new.dtype = d.v_new.dtype = FA_DTYPE_BF16;
    d.batch = 2;
    d.seqlen_q = 1;
    d.seqlen_k = 4096;
    d.heads_q = 32;
    d.heads_kv = 4;
    d.head_dim = 128;
    d.kv_cache = 1;
    d.page_size = 64;
    d.num_pages = 256;
    d.seqlen_new = 1;
    fa_plan_info info;
    CHECK_OK(fa_plan_for_device(h100, &d, &info));
    CHECK(info.forward.variant == FA_VARIANT_DECODE);
    fa_cuda_kernel_report rep[MAX_REPORTS];
    int n = 0;
    CHECK_OK(fa_cuda_compile_plan(&d, &info, 9, 0, rep, MAX_REPORTS, &n));
    CHECK_MSG(n == 1 && rep[0].pass == FA_PASS_FORWARD, "%d kernels for a cache plan", n);
    fa_attention_desc bad = d;
    bad.page_size = 8;
    CHECK_STATUS(fa_cuda_compile_forward(&bad, &info, 9, 0, rep, MAX_REPORTS, &n), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "page_size") != NULL, "message: %s", fa_last_error());
    bad = d;
    bad.page_size = 272;
    CHECK_STATUS(fa_cuda_compile_forward(&bad, &info, 9, 0, rep, MAX_REPORTS, &n), FA_ERR_UNSUPPORTED);
    bad = d;
    bad.k_new.stride_seq = 4 * 128 + 4; /* 8-byte rows */
    CHECK_STATUS(fa_cuda_compile_forward(&bad, &info, 9, 0, rep, MAX_REPORTS, &n), FA_ERR_MISALIGNED);
    CHECK_MSG(strstr(fa_last_error(), "k_new") != NULL, "message: %s", fa_last_error());
    bad = d;
    bad.v_new.dtype = FA_DTYPE_F16;
    CHECK_STATUS(fa_cuda_compile_forward(&bad, &info, 9, 0, rep, MAX_REPORTS, &n), FA_ERR_DTYPE_MISMATCH);
    bad = d;
    bad.bias_batch = 1;
    bad.bias_heads = 1;
    CHECK_STATUS(fa_cuda_compile_forward(&bad, &info, 9, 0, rep, MAX_REPORTS, &n), FA_ERR_UNSUPPORTED);
    /* A forward the cache path does not run. */
    fa_plan_info other = info;
    other.forward.variant = FA_VARIANT_MMA;
    CHECK_STATUS(fa_cuda_compile_forward(&d, &other, 9, 0, rep, MAX_REPORTS, &n), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "decoding kernel") != NULL && strstr(fa_last_error(), "mma") != NULL,
              "message: %s", fa_last_error());
#endif
}

/* The warp-specialised backward with dropout alone (bwd_mma.cu keep_bits),
 * which the sweep's option sets do not reach: at head_dim 64 and 128, fp16
 * and bf16, dQ by atomics and deterministic, on a described H100 it is
 * planned (64 x 64, two stages, at 128) and its backward kernels do not
 * spill. */
FA_TEST(dropout_backward_sm90) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    job jobs[8];
    int n = 0;
    for (int m = MODE_F16; m <= MODE_BF16; m++)
        for (int dim = 64; dim <= 128; dim += 64)
            for (int det = 0; det < 2; det++) {
                job *j = &jobs[n];
                memset(j, 0, sizeof *j);
                j->desc = problem((dmode)m, dim, 0);
                j->desc.dropout_p = 0.1f;
                j->desc.dropout_seed = 1;
                j->desc.deterministic = det;
                j->cc_major = 9;
                snprintf(j->label, sizeof j->label, "%s d%d dropout%s", mode_names[m], dim, det ? " deterministic" : "");
                fa_status st = fa_plan_for_device(&fa_described_device_find("h100")->desc, &j->desc, &j->info);
                CHECK_MSG(st == FA_SUCCESS, "%s: planning failed: %s", j->label, fa_last_error());
                if (st == FA_SUCCESS) n++;
            }
    run_jobs(jobs, n);
    for (int i = 0; i < n; i++) {
        const job *j = &jobs[i];
        const fa_kernel_plan *b = &j->info.backward;
        CHECK_MSG(j->status == FA_SUCCESS, "%s: %s (%s)", j->label, fa_status_string(j->status), j->error);
        CHECK_MSG(b->variant == FA_VARIANT_WGMMA_TMA && (j->desc.head_dim < 128 || (b->bc == 64 && b->stages == 2)),
                  "%s: backward %s %d x %d s%d", j->label, fa_variant_name(b->variant), b->br, b->bc, b->stages);
        for (int k = 0; k < j->count && k < MAX_REPORTS; k++) {
            const fa_cuda_kernel_report *r = &j->reports[k];
            printf("%-8s %-28s %-18s %5d %5d %6d %6d\n", r->arch, j->label, r->kernel, r->threads, r->registers,
                   r->spill_stores, r->spill_loads);
            check_not_serialized(r, j->label);
            if (r->pass == FA_PASS_BACKWARD && r->tensor_cores && strstr(r->kernel, "_mma"))
                CHECK_MSG(r->spill_stores == 0 && r->spill_loads == 0 && r->stack_bytes == 0,
                          "%s %s spills: %d bytes stored, %d loaded (options %s)", j->label, r->kernel,
                          r->spill_stores, r->spill_loads, r->options);
        }
    }
#endif
}

/* A second compile of the same program comes from the kernel cache with
 * the same binary size and ptxas report. */
FA_TEST(kernel_cache_roundtrip) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    char dir[] = "/tmp/fa-cuda-cache-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const char *old = getenv("FLASHATTN_CACHE_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("FLASHATTN_CACHE_DIR", dir, 1);
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = 512;
    d.heads_q = d.heads_kv = 4;
    d.head_dim = 64;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_BF16;
    d.softmax_scale = 0.37f; /* any: the scale is a run-time argument */
    fa_plan_info info;
    CHECK_OK(fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info));
    fa_cuda_kernel_report a[MAX_REPORTS], b[MAX_REPORTS];
    int na = 0, nb = 0;
    CHECK_OK(fa_cuda_compile_plan(&d, &info, 9, 0, a, MAX_REPORTS, &na));
    CHECK_OK(fa_cuda_compile_plan(&d, &info, 9, 0, b, MAX_REPORTS, &nb));
    CHECK(na == nb && na >= 2);
    for (int i = 0; i < na && i < nb && i < MAX_REPORTS; i++) {
        CHECK_MSG(!a[i].from_cache && b[i].from_cache, "%s: first from cache %d, second %d", a[i].kernel,
                  a[i].from_cache, b[i].from_cache);
        CHECK(a[i].binary_bytes == b[i].binary_bytes && a[i].binary_bytes > 0);
        CHECK(a[i].registers == b[i].registers && a[i].spill_stores == b[i].spill_stores);
        CHECK(strcmp(a[i].kernel, b[i].kernel) == 0);
    }
    /* The kernels take the scale at run time: another scale, same binaries. */
    d.softmax_scale = 0.0f;
    fa_plan_info info2;
    CHECK_OK(fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info2));
    CHECK_OK(fa_cuda_compile_plan(&d, &info2, 9, 0, b, MAX_REPORTS, &nb));
    for (int i = 0; i < nb && i < MAX_REPORTS; i++) CHECK_MSG(b[i].from_cache, "%s recompiled", b[i].kernel);
    if (saved) {
        setenv("FLASHATTN_CACHE_DIR", saved, 1);
        free(saved);
    } else {
        unsetenv("FLASHATTN_CACHE_DIR");
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
#endif
}

/* A split decoding step merges in its own launch by default and with
 * "meet" or "last" (one kernel, SPLIT_MERGE_LAST, no spills), in fa_splitk_merge's with
 * FLASHATTN_DECODE_MERGE=kernel, and any other value is refused naming the
 * variable. */
FA_TEST(decode_merge_choice) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    const char *var = "FLASHATTN_DECODE_MERGE";
    const char *old = getenv(var);
    char *saved = old ? strdup(old) : NULL;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = 1;
    d.seqlen_k = 16384;
    d.heads_q = 32;
    d.heads_kv = 4;
    d.head_dim = 128;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_BF16;
    fa_plan_info info;
    CHECK_OK(fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info));
    CHECK_MSG(info.forward.variant == FA_VARIANT_DECODE && info.forward.split_k > 1, "planned %s, %d splits",
              fa_variant_name(info.forward.variant), info.forward.split_k);
    fa_cuda_kernel_report rep[MAX_REPORTS];
    int n = 0;
    const char *values[] = {NULL, "meet", "last", "kernel"};
    for (int i = 0; i < 4; i++) {
        if (values[i])
            CHECK(setenv(var, values[i], 1) == 0);
        else
            CHECK(unsetenv(var) == 0);
        const int last = i < 3;
        CHECK_OK(fa_cuda_compile_forward(&d, &info, 9, 0, rep, MAX_REPORTS, &n));
        CHECK_MSG(n == (last ? 1 : 2), "%s=%s: %d kernels", var, values[i] ? values[i] : "(unset)", n);
        if (n < 1) continue;
        CHECK(strcmp(rep[0].kernel, "fa_fwd_decode") == 0);
        CHECK_MSG((strstr(rep[0].options, "-DSPLIT_MERGE_LAST") != NULL) == last, "options: %s", rep[0].options);
        CHECK_MSG(rep[0].spill_stores == 0 && rep[0].spill_loads == 0, "fa_fwd_decode spills %d/%d",
                  rep[0].spill_stores, rep[0].spill_loads);
        if (!last && n == 2) CHECK(strcmp(rep[1].kernel, "fa_splitk_merge") == 0);
    }
    CHECK(setenv(var, "both", 1) == 0);
    CHECK_STATUS(fa_cuda_compile_forward(&d, &info, 9, 0, rep, MAX_REPORTS, &n), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(fa_last_error(), var) != NULL, "message: %s", fa_last_error());
    if (saved) {
        setenv(var, saved, 1);
        free(saved);
    } else {
        unsetenv(var);
    }
#endif
}

/* An architecture NVRTC does not know is a compile error carrying NVRTC's
 * own message; a plan the kernels cannot run is refused before compiling. */
FA_TEST(errors_are_reported) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    const char *old = getenv("FLASHATTN_CACHE_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("FLASHATTN_CACHE_DIR", "off", 1);
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = 256;
    d.heads_q = d.heads_kv = 2;
    d.head_dim = 64;
    fa_plan_info info, bad;
    CHECK_OK(fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info));
    CHECK(info.forward.variant == FA_VARIANT_SIMT);
    int n = 0;
    fa_status st = fa_cuda_compile_plan(&d, &info, 1, 0, NULL, 0, &n);
    CHECK_MSG(st == FA_ERR_COMPILE, "sm_10: %s (%s)", fa_status_string(st), fa_last_error());
    CHECK_MSG(strstr(fa_last_error(), "sm_10") != NULL && strstr(fa_last_error(), "NVRTC") != NULL, "message: %s",
              fa_last_error());

    /* Tensor-core plans: before sm_80, with a warp count, tile or head_dim
     * the kernels do not have. */
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
    setenv("FLASHATTN_PLAN_TMA_BWD", "0", 1); /* the warpgroup backward's refusals */
    CHECK_OK(fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info));
    unsetenv("FLASHATTN_PLAN_TMA_BWD");
    CHECK(info.forward.variant == FA_VARIANT_WGMMA_TMA && info.backward.variant == FA_VARIANT_WGMMA);
    CHECK_STATUS(fa_cuda_compile_plan(&d, &info, 7, 5, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    /* So does the warpgroup backward: beside an sm_80 forward, and in
     * shapes it does not have (128 queries; 4 threads a key). */
    fa_device_desc sm80 = a100();
    CHECK_OK(fa_plan_for_device(&sm80, &d, &bad));
    CHECK(bad.forward.variant == FA_VARIANT_MMA);
    bad.backward = info.backward;
    CHECK_STATUS(fa_cuda_compile_plan(&d, &bad, 8, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "backward") != NULL && strstr(fa_last_error(), "sm_90") != NULL,
              "message: %s", fa_last_error());
    bad = info;
    bad.backward.br = 128;
    CHECK_STATUS(fa_cuda_compile_plan(&d, &bad, 9, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    bad = info;
    bad.backward.work_group_size = 4 * bad.backward.bc;
    CHECK_STATUS(fa_cuda_compile_plan(&d, &bad, 9, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    /* The warpgroup forward exists on sm_90 alone. */
    CHECK_STATUS(fa_cuda_compile_plan(&d, &info, 8, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "sm_90") != NULL, "message: %s", fa_last_error());
    CHECK_STATUS(fa_cuda_compile_plan(&d, &info, 10, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    bad = info;
    bad.forward.bc = 48; /* not a warpgroup key tile */
    CHECK_STATUS(fa_cuda_compile_plan(&d, &bad, 9, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    bad = info;
    bad.forward.work_group_size = 96;
    CHECK_STATUS(fa_cuda_compile_plan(&d, &bad, 9, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    bad = info;
    bad.backward.bc = 24;
    CHECK_STATUS(fa_cuda_compile_plan(&d, &bad, 9, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    d.head_dim = 40;
    CHECK_STATUS(fa_cuda_compile_plan(&d, &info, 9, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED);
    d.head_dim = 64;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F32;
    CHECK_STATUS(fa_cuda_compile_plan(&d, &info, 9, 0, NULL, 0, &n), FA_ERR_UNSUPPORTED); /* no allow_tf32 */
    if (saved) {
        setenv("FLASHATTN_CACHE_DIR", saved, 1);
        free(saved);
    } else {
        unsetenv("FLASHATTN_CACHE_DIR");
    }
#endif
}

/* The small programs a context compiles on first use: the ring's
 * element-wise passes (kernels_cuda/rows.cu) and the benchmarks' read
 * (kernels_cuda/stream_read.cu), as on an A100 and an H100: real code for
 * the architecture, every kernel, no spills. */
FA_TEST(small_programs_sm80_sm90) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    typedef fa_status (*program_compile_fn)(int, int, fa_cuda_kernel_report *, int, int *);
    static const int ccs[][2] = {{8, 0}, {9, 0}};
    static const struct {
        program_compile_fn compile;
        int nkernels;
        const char *kernels[2];
    } programs[] = {{fa_cuda_rows_compile, 2, {"fa_rows", "fa_rows_merge"}},
                    {fa_cuda_read_compile, 1, {"fa_stream_read", NULL}}};
    for (size_t p = 0; p < FA_ARRAY_SIZE(programs); p++)
        for (size_t c = 0; c < FA_ARRAY_SIZE(ccs); c++) {
            fa_cuda_kernel_report rep[MAX_REPORTS];
            int n = 0;
            fa_status st = programs[p].compile(ccs[c][0], ccs[c][1], rep, MAX_REPORTS, &n);
            CHECK_MSG(st == FA_SUCCESS, "%s sm_%d%d: %s", programs[p].kernels[0], ccs[c][0], ccs[c][1],
                      fa_last_error());
            if (st != FA_SUCCESS) continue;
            CHECK_MSG(n == programs[p].nkernels, "sm_%d%d: %d kernels", ccs[c][0], ccs[c][1], n);
            for (int k = 0; k < n && k < programs[p].nkernels; k++) {
                const fa_cuda_kernel_report *r = &rep[k];
                printf("%-8s %-14s %5d threads %3d registers %d/%d bytes spilled, %d bytes of stack%s\n", r->arch,
                       r->kernel, r->threads, r->registers, r->spill_stores, r->spill_loads, r->stack_bytes,
                       r->from_cache ? " (cached)" : "");
                CHECK_MSG(strcmp(r->kernel, programs[p].kernels[k]) == 0, "kernel %d is %s", k, r->kernel);
                CHECK_MSG(r->real_code, "%s %s: compiled to PTX, not to the architecture's own code", r->arch,
                          r->kernel);
                CHECK_MSG(r->registers > 0 && r->registers <= 255, "%s %s: %d registers", r->arch, r->kernel,
                          r->registers);
                CHECK_MSG(r->spill_stores == 0 && r->spill_loads == 0 && r->stack_bytes == 0,
                          "%s %s spills: %d bytes stored, %d loaded, %d bytes of stack", r->arch, r->kernel,
                          r->spill_stores, r->spill_loads, r->stack_bytes);
            }
        }
#endif
}

#ifdef FA_WITH_CUDA
/* The warp-specialised kernels' problems as the variant sweeps below take
 * them, case k: head_dim 128 or 64, fp16 or bf16; options k / 2 = 1 causal
 * GQA, 2 a window and a 16 x 16 block mask, 3 softcap with an fp32 bias
 * and causal (4: the caller's). */
static fa_attention_desc tma_problem(int k, int seqlen) {
    static uint8_t blocks[16 * 16];
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (uint8_t)((i * 5 + 1) % 3 != 0);
    const int opts = k / 2;
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 2;
    d.seqlen_q = d.seqlen_k = seqlen;
    d.heads_q = 16;
    d.heads_kv = opts == 1 ? 4 : 16;
    d.head_dim = k % 2 ? 64 : 128;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = k % 4 < 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    if (opts == 1) d.causal = 1;
    if (opts == 2) {
        d.window_left = 300;
        d.window_right = 10;
        d.block_mask = blocks;
        d.block_q = d.block_k = seqlen / 16;
        d.block_mask_bytes = sizeof blocks;
    }
    if (opts == 3) {
        d.softcap = 30.0f;
        d.bias_batch = 1;
        d.bias_heads = 16;
        d.bias.dtype = FA_DTYPE_F32;
        d.causal = 1;
    }
    return d;
}

/* The key-side kernel (fa_bwd_dkdv_mma) of info's backward compiled for
 * sm_90 into *out: the compile succeeds, the kernel is there, the line
 * printed, no spills. Returns whether *out holds it (case k in messages). */
static int key_side_compiled(const fa_attention_desc *d, const fa_plan_info *info, int k,
                             fa_cuda_kernel_report *out) {
    fa_cuda_kernel_report rep[MAX_REPORTS];
    int n = 0;
    const fa_status st = fa_cuda_compile_plan(d, info, 9, 0, rep, MAX_REPORTS, &n);
    CHECK_MSG(st == FA_SUCCESS, "case %d: %s", k, st ? fa_last_error() : "");
    for (int i = 0; st == FA_SUCCESS && i < n; i++) {
        const fa_cuda_kernel_report *r = &rep[i];
        if (strcmp(r->kernel, "fa_bwd_dkdv_mma") != 0) continue;
        printf("%-8s d%-4d %s: %d threads %3d registers %d/%d bytes spilled, %zu bytes shared\n", r->arch,
               d->head_dim, r->options + 0, r->threads, r->registers, r->spill_stores, r->spill_loads,
               r->shared_bytes);
        CHECK_MSG(r->spill_stores == 0 && r->spill_loads == 0 && r->stack_bytes == 0,
                  "case %d spills: %d bytes stored, %d loaded, %d bytes of stack", k, r->spill_stores, r->spill_loads,
                  r->stack_bytes);
        check_not_serialized(r, "key-side case");
        *out = *r;
        return 1;
    }
    CHECK_MSG(st != FA_SUCCESS, "case %d: no key-side kernel among %d", k, n);
    return 0;
}
#endif

/* The warp-specialised backward (bwd_mma.cu built with TMA) as the planner
 * emits it on an H100, with every option it takes and deterministic: sm_90a
 * code, no spills, a producer warpgroup beside the consumers. */
FA_TEST(h100_sm90_tma_backward_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    setenv("FLASHATTN_PLAN_TMA_BWD", "1", 1);
    for (int k = 0; k < 12; k++) {
        const int dim = k % 2 ? 64 : 128, opts = k / 2;
        fa_attention_desc d = tma_problem(k, 4096);
        if (opts == 4) d.dropout_p = 0.1f;
        d.deterministic = opts == 5;
        fa_plan_info info;
        fa_status st = fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info);
        if (st == FA_SUCCESS && info.backward.variant != FA_VARIANT_WGMMA_TMA) {
            /* Options whose warpgroup tile has no room for the producer's
             * second dS^T stay on the warpgroup kernel: say which. */
            printf("case %d: d%d options %d: backward %s\n", k, dim, opts, fa_variant_name(info.backward.variant));
            continue;
        }
        fa_cuda_kernel_report r;
        if (st != FA_SUCCESS || !key_side_compiled(&d, &info, k, &r)) {
            CHECK_MSG(st == FA_SUCCESS, "case %d: %s", k, fa_last_error());
            continue;
        }
        /* Each step's dQ added during the next where the planner says
         * (two consumer warpgroups, bulk reductions, no window, not
         * deterministic: d128 plain and causal, cases 0 and 2). */
        CHECK_MSG(r.real_code && strcmp(r.arch, "sm_90") == 0 && has_define(r.options, "TMA") &&
                      r.threads == info.backward.work_group_size &&
                      has_define(r.options, "BWD_DQ_LAG") == fa_tma_bwd_dq_lag(&d, info.backward.bc) &&
                      has_define(r.options, "BWD_DQ_LAG") == (k == 0 || k == 2),
                  "case %d: %s %s, %d threads", k, r.arch, r.options, r.threads);
    }
    unsetenv("FLASHATTN_PLAN_TMA_BWD");
#endif
}

/* The warp-specialised backward at head dims between whole 64-column
 * blocks, as planned on an H100: 96 built for itself, 160 and 224 for the
 * padded 192 and 256 with IO_DIM the tensors'; plain, causal with GQA, and
 * (96) windowed with a block mask and with dropout; no spills, and the
 * rowwise kernels of the same program (fa_bwd_dot, fa_bwd_dq_convert)
 * built with it. */
FA_TEST(h100_sm90_tma_backward_padded) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    static const int pad_dims[] = {96, 160, 224};
    for (size_t i = 0; i < FA_ARRAY_SIZE(pad_dims); i++)
        for (int opts = 0; opts < (pad_dims[i] == 96 ? 4 : 2); opts++) {
            fa_attention_desc d = tma_problem(opts == 1 ? 2 : opts == 2 ? 4 : 0, 4096);
            d.head_dim = pad_dims[i];
            d.dropout_p = opts == 3 ? 0.1f : 0.0f;
            fa_plan_info info;
            CHECK_OK(fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info));
            CHECK_MSG(info.backward.variant == FA_VARIANT_WGMMA_TMA, "d%d options %d: backward %s", pad_dims[i], opts,
                      fa_variant_name(info.backward.variant));
            if (info.backward.variant != FA_VARIANT_WGMMA_TMA) continue;
            fa_cuda_kernel_report r;
            if (!key_side_compiled(&d, &info, (int)i * 4 + opts, &r)) continue;
            char io[24], hd[24];
            snprintf(io, sizeof io, "IO_DIM=%d", pad_dims[i]);
            snprintf(hd, sizeof hd, "HEAD_DIM=%d", fa_tma_bwd_head_dim(&d));
            const int padded = fa_tma_bwd_head_dim(&d) != pad_dims[i];
            CHECK_MSG(has_define(r.options, "TMA") && has_define(r.options, io) == padded &&
                          has_define(r.options, hd) &&
                          has_define(r.options, "DK_SPLIT=2") == (pad_dims[i] > 128),
                      "d%d options %d: %s", pad_dims[i], opts, r.options);
        }
#endif
}

/* The TMA backward's 128 queries a step at head_dim 64 (the S^T and dP^T
 * accumulators twice as wide), as planned there: plain and causal without
 * spills, 64 where deterministic. Windows, block masks and score options
 * spilled 56-132 bytes at 128 queries, the deterministic dQ 20 (NVRTC
 * 13.0): not a tile to plan with them. */
FA_TEST(h100_sm90_tma_backward_wide_rows) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    /* Plain and causal with GQA: 128 queries; deterministic: 64. */
    for (int k = 0; k < 3; k++) {
        fa_attention_desc d = tma_problem(k == 1 ? 3 : 1, 4096);
        d.deterministic = k == 2;
        const int rows = k == 2 ? 64 : 128;
        fa_plan_info info;
        fa_status st = fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info);
        CHECK_MSG(st == FA_SUCCESS && info.backward.variant == FA_VARIANT_WGMMA_TMA && info.backward.br == rows &&
                      info.backward.bc == 128,
                  "case %d: %s %d x %d", k, st ? fa_last_error() : fa_variant_name(info.backward.variant),
                  info.backward.br, info.backward.bc);
        if (st != FA_SUCCESS || info.backward.variant != FA_VARIANT_WGMMA_TMA) continue;
        fa_cuda_kernel_report r;
        if (key_side_compiled(&d, &info, k, &r))
            CHECK_MSG(has_define(r.options, k == 2 ? "BR=64" : "BR=128"), "case %d: %s", k, r.options);
    }
#endif
}

/* Head_dim 256 and 192 on the warp-specialised backward (as planned on
 * sm_90): two consumer warpgroups sharing 64 keys (DK_SPLIT 2; half of dK
 * and dV each at 256, one of them each at 192), plain with GQA, causal, a window with a
 * block mask, deterministic; fp16 and bf16 at 256, bf16 at 192, sm_90a
 * code without spills. */
FA_TEST(h100_sm90_tma_backward_split) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    for (int k = 0; k < 12; k++) {
        fa_attention_desc d = tma_problem(k % 4 == 3 ? 4 : k % 4 == 1 ? 3 : k % 4 == 2 ? 5 : 0, 4096);
        d.head_dim = k < 8 ? 256 : 192;
        d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = k < 4 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
        d.deterministic = k % 4 == 3;
        fa_plan_info info;
        fa_status st = fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info);
        CHECK_MSG(st == FA_SUCCESS && info.backward.variant == FA_VARIANT_WGMMA_TMA && info.backward.br == 64 &&
                      info.backward.bc == 64 && info.backward.work_group_size == 384,
                  "case %d: %s %d x %d", k, st ? fa_last_error() : fa_variant_name(info.backward.variant),
                  info.backward.br, info.backward.bc);
        if (st != FA_SUCCESS || info.backward.variant != FA_VARIANT_WGMMA_TMA) continue;
        fa_cuda_kernel_report r;
        if (key_side_compiled(&d, &info, k, &r))
            CHECK_MSG(has_define(r.options, "DK_SPLIT=2") && has_define(r.options, "TMA") && r.threads == 384 &&
                          has_define(r.options, k < 8 ? "HEAD_DIM=256" : "HEAD_DIM=192") &&
                          r.shared_bytes == info.backward.local_mem_bytes,
                      "case %d: %s, %zu bytes shared", k, r.options, r.shared_bytes);
    }
#endif
}

/* Head dims between whole 64-column blocks on the warp-specialised forward
 * built for the next block (FLASHATTN_PLAN_TMA_PAD=1): 96, 160 and 224 as
 * the planner emits them, plain, causal with GQA, a window and block mask
 * with dropout, softcap with a bias; sm_90a code of the padded head_dim,
 * no spills. Where the padded build has no room for the options (224 pads
 * to 256), the plan stays on mma.sync. */
FA_TEST(h100_sm90_tma_padded_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    setenv("FLASHATTN_PLAN_TMA_PAD", "1", 1);
    static const int padded_dims[] = {96, 160, 224};
    for (int k = 0; k < 12; k++) {
        const int opts = k % 4, dim = padded_dims[k / 4];
        fa_attention_desc d = tma_problem(2 * opts, 2048);
        d.head_dim = dim;
        d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = (k / 4 + opts) % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
        if (opts == 2) d.dropout_p = 0.1f;
        fa_plan_info info;
        fa_status st = fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info);
        CHECK_MSG(st == FA_SUCCESS, "case %d: %s", k, st ? fa_last_error() : "");
        if (st != FA_SUCCESS) continue;
        if (info.forward.variant != FA_VARIANT_WGMMA_TMA) {
            printf("case %d: d%d options %d: forward %s\n", k, dim, opts, fa_variant_name(info.forward.variant));
            CHECK_MSG(dim == 224 && opts >= 2, "case %d: d%d options %d planned %s", k, dim, opts,
                      fa_variant_name(info.forward.variant));
            continue;
        }
        fa_cuda_kernel_report rep[MAX_REPORTS];
        int n = 0;
        st = fa_cuda_compile_forward(&d, &info, 9, 0, rep, MAX_REPORTS, &n);
        CHECK_MSG(st == FA_SUCCESS && n == 1, "case %d: %s", k, st ? fa_last_error() : "kernels");
        if (st != FA_SUCCESS || n != 1) continue;
        const fa_cuda_kernel_report *r = &rep[0];
        printf("%-8s d%-4d %s: %d threads %3d registers %d/%d bytes spilled\n", r->arch, dim, r->options + 0,
               r->threads, r->registers, r->spill_stores, r->spill_loads);
        char want[32];
        snprintf(want, sizeof want, "HEAD_DIM=%d", fa_tma_head_dim(&d));
        CHECK_MSG(strcmp(r->kernel, "fa_fwd_tma") == 0 && strstr(r->options, want) && r->spill_stores == 0 &&
                      r->spill_loads == 0 && r->stack_bytes == 0,
                  "case %d: %s, %d bytes spilled", k, r->options, r->spill_stores);
        check_not_serialized(r, "padded case");
    }
    unsetenv("FLASHATTN_PLAN_TMA_PAD");
#endif
}

/* The warp-specialised forward (fwd_tma.cu) as the planner emits it on an
 * H100, with every option it takes and each product schedule
 * (FLASHATTN_TMA_SCHEDULE; the planner's are overlap at head_dim 128 and
 * plain at 64): sm_90a code, no spills, the options compiled in. */
FA_TEST(h100_sm90_tma_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    static const char *const schedules[] = {NULL, "both", NULL, "plain", "pingpong"};
    for (int k = 0; k < 10; k++) {
        const int dim = k % 2 ? 64 : 128, opts = k / 2;
        fa_attention_desc d = tma_problem(k, 2048);
        if (opts == 2) d.dropout_p = 0.1f;
        if (opts == 4) d.alibi_slopes = g_slopes;
        if (schedules[opts]) setenv("FLASHATTN_TMA_SCHEDULE", schedules[opts], 1);
        fa_plan_info info;
        fa_status st = fa_plan_for_device(&fa_described_device_find("h100")->desc, &d, &info);
        CHECK_MSG(st == FA_SUCCESS && info.forward.variant == FA_VARIANT_WGMMA_TMA, "case %d: %s, forward %s", k,
                  st ? fa_last_error() : "planned", fa_variant_name(info.forward.variant));
        fa_cuda_kernel_report rep[MAX_REPORTS];
        int n = 0;
        if (st == FA_SUCCESS) st = fa_cuda_compile_forward(&d, &info, 9, 0, rep, MAX_REPORTS, &n);
        unsetenv("FLASHATTN_TMA_SCHEDULE");
        CHECK_MSG(st == FA_SUCCESS && n == 1, "case %d: %s", k, st ? fa_last_error() : "kernels");
        if (st != FA_SUCCESS || n != 1) continue;
        const fa_cuda_kernel_report *r = &rep[0];
        printf("%-8s d%-4d %s: %d threads %3d registers %d/%d bytes spilled\n", r->arch, dim, r->options + 0,
               r->threads, r->registers, r->spill_stores, r->spill_loads);
        const char *sched = schedules[opts] ? schedules[opts] : dim == 128 ? "overlap" : "plain";
        /* Turns (PINGPONG) are between two consumer warpgroups: head_dim
         * 128 with dropout, a block mask, a window or score options, or 64
         * with dropout; the others run three, at 128 with neither schedule
         * (the overlap's scores do not fit their registers there). */
        const int two = d.dropout_p > 0.0f || (dim == 128 && (d.block_mask || fa_desc_option_in_use(&d) ||
                                                              fa_desc_has_window(&d)));
        const int overlap = !(dim == 128 && !two) && (strcmp(sched, "both") == 0 || strcmp(sched, "overlap") == 0);
        const int pingpong = two && (strcmp(sched, "both") == 0 || strcmp(sched, "pingpong") == 0);
        CHECK_MSG(strcmp(r->kernel, "fa_fwd_tma") == 0 && r->real_code && strcmp(r->arch, "sm_90") == 0 &&
                      r->threads == (two ? 384 : 512),
                  "case %d: %s %s, %d threads", k, r->arch, r->kernel, r->threads);
        CHECK_MSG(r->spill_stores == 0 && r->spill_loads == 0 && r->stack_bytes == 0,
                  "case %d spills: %d bytes stored, %d loaded, %d bytes of stack", k, r->spill_stores,
                  r->spill_loads, r->stack_bytes);
        check_not_serialized(r, "schedule case");
        CHECK_MSG(has_define(r->options, "OVERLAP") == overlap && has_define(r->options, "PINGPONG") == pingpong &&
                      has_define(r->options, "CAUSAL") == (d.causal != 0) &&
                      has_define(r->options, "DROPOUT") == (d.dropout_p > 0.0f) &&
                      has_define(r->options, "BLOCK_MASK") == (d.block_mask != NULL) &&
                      has_define(r->options, "SOFTCAP") == (d.softcap > 0.0f) &&
                      has_define(r->options, "ALIBI") == (d.alibi_slopes != NULL) &&
                      has_define(r->options, "BIAS") == (d.bias_batch > 0),
                  "case %d: options %s", k, r->options);
    }
#endif
}

/* FP8 (e4m3) inputs: fwd_tma.cu built with FP8, as the planner emits it on
 * an H100 at every head_dim it takes, plain (GQA), causal and with a
 * window, O in bf16 and fp16, with the planned product schedule (both at
 * head_dim 128) and at head_dim 128 with each other one
 * (FLASHATTN_TMA_SCHEDULE), and its
 * 192-key tiles forced: sm_90a code, no spills, the planned shared
 * memory. */
#ifdef FA_WITH_CUDA
static fa_attention_desc fp8_problem(int dim, int opts) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 2;
    d.seqlen_q = d.seqlen_k = 4096;
    d.heads_q = 16;
    d.heads_kv = opts == 0 ? 4 : 16;
    d.head_dim = dim;
    d.q.dtype = d.k.dtype = d.v.dtype = FA_DTYPE_FP8_E4M3;
    d.o.dtype = opts == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    d.descale_q = 0.5f;
    d.descale_v = 2.0f;
    d.causal = opts == 1 || opts == 3;
    if (opts >= 2) {
        d.window_left = 500;
        d.window_right = opts == 2 ? 30 : 0;
    }
    return d;
}
#endif

FA_TEST(h100_sm90_fp8_variants) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    REQUIRE_NVRTC();
    const fa_device_desc *h100 = &fa_described_device_find("h100")->desc;
    static const int fp8_dims[] = {64, 128, 192, 256};
    static const char *const schedules[] = {NULL, "both", "pingpong", "plain", "overlap"};
    for (size_t s = 0; s < FA_ARRAY_SIZE(schedules); s++)
        for (size_t di = 0; di < FA_ARRAY_SIZE(fp8_dims); di++)
            for (int opts = 0; opts < 4; opts++) {
                const int dim = fp8_dims[di];
                /* Other schedules: at head_dim 128, causal problems (two
                 * consumer warpgroups, where each schedule applies). */
                if (schedules[s] && (dim != 128 || opts != 1)) continue;
                fa_attention_desc d = fp8_problem(dim, opts);
                fa_plan_info info;
                fa_status st = fa_plan_for_device(h100, &d, &info);
                const fa_kernel_plan *f = &info.forward;
                CHECK_MSG(st == FA_SUCCESS && f->variant == FA_VARIANT_WGMMA_TMA && info.fp8 == 1,
                          "d%d opts %d: %s, forward %s", dim, opts, st ? fa_last_error() : "planned",
                          fa_variant_name(f->variant));
                if (st != FA_SUCCESS) continue;
                if (schedules[s]) setenv("FLASHATTN_TMA_SCHEDULE", schedules[s], 1);
                fa_cuda_kernel_report rep[MAX_REPORTS];
                int n = 0;
                st = fa_cuda_compile_forward(&d, &info, 9, 0, rep, MAX_REPORTS, &n);
                unsetenv("FLASHATTN_TMA_SCHEDULE");
                /* 128-key tiles take V^T from fa_fp8_vt, a second kernel. */
                const int vt_global = fa_fp8_vt_global(&d, f->bc);
                CHECK_MSG(vt_global == (f->bc == 128) && (f->workspace_bytes > 0) == vt_global,
                          "d%d opts %d: %d x %d, V^T pre-pass %d, workspace %zu", dim, opts, f->br, f->bc, vt_global,
                          f->workspace_bytes);
                CHECK_MSG(st == FA_SUCCESS && n == 1 + vt_global, "d%d opts %d: %s, %d kernels", dim, opts,
                          st ? fa_last_error() : "compiled", n);
                if (st != FA_SUCCESS || n != 1 + vt_global) continue;
                if (vt_global) {
                    const fa_cuda_kernel_report *v = &rep[1];
                    printf("%-8s d%-4d %s: %d threads %3d registers %d/%d bytes spilled, %zu bytes shared\n", v->arch,
                           dim, v->kernel, v->threads, v->registers, v->spill_stores, v->spill_loads, v->shared_bytes);
                    CHECK_MSG(strcmp(v->kernel, "fa_fp8_vt") == 0 && v->real_code && v->threads == 256 &&
                                  v->spill_stores == 0 && v->spill_loads == 0 && v->stack_bytes == 0 &&
                                  has_define(v->options, "VT_GLOBAL"),
                              "d%d opts %d: %s, %d threads, %d/%d bytes spilled", dim, opts, v->kernel, v->threads,
                              v->spill_stores, v->spill_loads);
                }
                const fa_cuda_kernel_report *r = &rep[0];
                printf("%-8s d%-4d %3dx%-3d s%d %s: %d threads %3d registers %d/%d bytes spilled, %zu bytes shared\n",
                       r->arch, dim, f->br, f->bc, f->stages, r->options + 0, r->threads, r->registers,
                       r->spill_stores, r->spill_loads, r->shared_bytes);
                CHECK_MSG(strcmp(r->kernel, "fa_fwd_tma") == 0 &&
                              r->real_code && strcmp(r->arch, "sm_90") == 0 && r->threads == f->work_group_size &&
                              r->threads == (dim == 64 || (dim == 128 && opts == 0) ? 512 : 384),
                          "d%d opts %d: %s %s %s, %d threads", dim, opts, r->arch, r->program, r->kernel, r->threads);
                CHECK_MSG(r->spill_stores == 0 && r->spill_loads == 0 && r->stack_bytes == 0,
                          "d%d opts %d spills: %d bytes stored, %d loaded, %d bytes of stack", dim, opts,
                          r->spill_stores, r->spill_loads, r->stack_bytes);
                check_not_serialized(r, "fp8 case");
                CHECK_MSG(r->shared_bytes == f->local_mem_bytes && f->local_mem_bytes <= fa_plan_usable_local_mem(h100),
                          "d%d opts %d: %zu bytes of shared memory, plan %zu", dim, opts, r->shared_bytes,
                          f->local_mem_bytes);
                CHECK_MSG(has_define(r->options, "FP8") && has_define(r->options, "DTYPE_F16") == (opts == 1) &&
                              has_define(r->options, "DTYPE_BF16") == (opts != 1) &&
                              has_define(r->options, "CAUSAL") == (d.causal != 0) &&
                              has_define(r->options, "WINDOW") == (opts >= 2) && !has_define(r->options, "DTYPE_F32"),
                          "d%d opts %d: options %s", dim, opts, r->options);
                /* As planned: both schedules at head_dim 128 with a mask
                 * (two consumer warpgroups), neither without one (three),
                 * the overlap alone above, neither at 64. */
                const int three = dim == 128 && opts == 0;
                CHECK_MSG(schedules[s] || (has_define(r->options, "OVERLAP") == (dim >= 128 && !three) &&
                                           has_define(r->options, "PINGPONG") == (dim == 128 && !three)),
                          "d%d opts %d: planned schedule %s", dim, opts, r->options);
            }
    /* The 192-key tiles the kernel takes beside the planner's (timed by
     * bench/fp8_gpu.sh): no spills there either. */
    static const int wide[][3] = {{128, 128, 0}, {128, 128, 1}, {128, 64, 1}, {64, 128, 1}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(wide); i++) {
        fa_attention_desc d = fp8_problem(wide[i][0], wide[i][2]);
        fa_plan_info info;
        CHECK_OK(fa_plan_for_device(h100, &d, &info));
        fa_kernel_plan *f = &info.forward;
        f->br = wide[i][1];
        f->bc = 192;
        f->work_group_size = 128 * (f->br / 64 + 1);
        f->thread_cols = f->bc / 4;
        f->stages = 2;
        f->local_mem_bytes = fa_plan_local_mem(FA_VARIANT_WGMMA_TMA, FA_PASS_FORWARD, &d, f->br, f->bc, 2);
        fa_cuda_kernel_report rep[MAX_REPORTS];
        int n = 0;
        const fa_status st = fa_cuda_compile_forward(&d, &info, 9, 0, rep, MAX_REPORTS, &n);
        CHECK_MSG(st == FA_SUCCESS && n == 1, "d%d %dx192: %s", wide[i][0], f->br, st ? fa_last_error() : "kernels");
        if (st != FA_SUCCESS || n != 1) continue;
        printf("%-8s d%-4d %3dx%-3d s2 %s: %d threads %d/%d bytes spilled, %zu bytes shared\n", rep[0].arch,
               wide[i][0], f->br, f->bc, rep[0].options, rep[0].threads, rep[0].spill_stores, rep[0].spill_loads,
               rep[0].shared_bytes);
        CHECK_MSG(rep[0].spill_stores == 0 && rep[0].spill_loads == 0 && rep[0].stack_bytes == 0 &&
                      f->local_mem_bytes <= fa_plan_usable_local_mem(h100),
                  "d%d %dx192: %d bytes spilled, %zu bytes shared", wide[i][0], f->br, rep[0].spill_stores,
                  f->local_mem_bytes);
    }
#endif
}

/* What the FP8 forward does not take is refused by name when the plan is
 * compiled (as at plan creation), never built: options, varlen, head
 * dimensions, devices other than sm_90. */
FA_TEST(fp8_refusals) {
    REQUIRE_CUDA_BUILD();
#ifdef FA_WITH_CUDA
    const fa_device_desc *h100 = &fa_described_device_find("h100")->desc;
    static const int32_t cu2[] = {0, 1000, 4096};
    static const struct {
        int what;
        const char *needle;
        fa_status status;
    } cases[] = {
        {0, "dropout_p", FA_ERR_UNSUPPORTED},     {1, "block_mask", FA_ERR_UNSUPPORTED},
        {2, "softcap", FA_ERR_UNSUPPORTED},       {3, "alibi_slopes", FA_ERR_UNSUPPORTED},
        {4, "bias", FA_ERR_UNSUPPORTED},          {5, "cu_seqlens_q", FA_ERR_UNSUPPORTED},
        {6, "head_dim 96", FA_ERR_UNSUPPORTED_HEAD_DIM}, {7, "sm_90 only", FA_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < FA_ARRAY_SIZE(cases); i++) {
        fa_attention_desc d = fp8_problem(128, 0);
        fa_device_desc dev = *h100;
        int cc_major = 9;
        switch (cases[i].what) {
        case 0: d.dropout_p = 0.1f; break;
        case 1:
            d.block_mask = g_mask;
            d.block_q = d.block_k = 128;
            d.block_mask_bytes = (size_t)32 * 32;
            break;
        case 2: d.softcap = 30.0f; break;
        case 3: d.alibi_slopes = g_slopes; break;
        case 4:
            d.bias_batch = 1;
            d.bias_heads = 1;
            d.bias.dtype = FA_DTYPE_F32;
            break;
        case 5:
            d.batch = 2;
            d.cu_seqlens_q = d.cu_seqlens_k = cu2;
            break;
        case 6: d.head_dim = 96; break;
        default:
            snprintf(dev.arch, sizeof dev.arch, "sm_80");
            cc_major = 8;
            break;
        }
        fa_plan_info info;
        CHECK_OK(fa_plan_for_device(&dev, &d, &info));
        CHECK_MSG(info.forward.variant != FA_VARIANT_WGMMA_TMA && info.fp8 == 1, "case %zu: planned %s", i,
                  fa_variant_name(info.forward.variant));
        fa_cuda_kernel_report rep[MAX_REPORTS];
        int n = 0;
        CHECK_FAILS(fa_cuda_compile_forward(&d, &info, cc_major, 0, rep, MAX_REPORTS, &n), cases[i].status,
                    cases[i].needle);
        CHECK_MSG(strstr(fa_last_error(), "fp8_e4m3") != NULL, "case %zu: \"%s\" does not name the dtype", i,
                  fa_last_error());
    }
#endif
}

FA_TEST_MAIN(FA_CASE(h100_sm90_variants), FA_CASE(a100_sm80_variants), FA_CASE(h100_sm90_decode_variants),
             FA_CASE(a100_sm80_decode_variants), FA_CASE(h100_sm90_kvcache_variants),
             FA_CASE(a100_sm80_kvcache_variants), FA_CASE(kvcache_simt_variants), FA_CASE(kvcache_refusals),
             FA_CASE(h100_sm90_score_options), FA_CASE(a100_sm80_score_options), FA_CASE(h100_sm90_tma_variants), FA_CASE(h100_sm90_tma_backward_variants), FA_CASE(h100_sm90_tma_backward_wide_rows), FA_CASE(h100_sm90_tma_backward_padded), FA_CASE(h100_sm90_tma_backward_split), FA_CASE(h100_sm90_tma_padded_variants),
             FA_CASE(h100_sm90_fp8_variants), FA_CASE(fp8_refusals),
             FA_CASE(dropout_backward_sm90),
             FA_CASE(kernel_cache_roundtrip),
             FA_CASE(decode_merge_choice), FA_CASE(errors_are_reported), FA_CASE(small_programs_sm80_sm90))
