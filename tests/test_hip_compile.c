/* The HIP kernels compiled for AMD GPUs that are not here (GUIDE section
 * 5). The programs of the plans the planner makes for the described MI250X
 * (wavefront 64) and for a described RX 6800 XT (gfx1030, wavefront 32),
 * over dtypes, head dimensions, forward, split-K and backward, are compiled
 * with Debian's hipcc: the MI250X's for gfx908, gfx90a and gfx940, and,
 * rebuilt for a 32-wide wavefront, with the RX 6800 XT's own for gfx1030
 * (HIP runs gfx10 in wave32 only). Programs with every optional feature
 * (causal, window, block mask, dropout, varlen) are compiled for gfx90a and
 * gfx1030. The resource use the compiler records in each code object is
 * printed as a table. Scratch memory in a main variant (no optional
 * feature) fails, as does local memory other than the planner's budget.
 * The matrix-core programs the planner makes for the MI250X, the MI300X
 * and an RX 7900 XTX compile for gfx90a, gfx940 and gfx1100
 * (amd_mma_variants), failing on any spill. The score options (softcap,
 * ALiBi, bias) compile in every kernel family for gfx90a, gfx1030 and
 * gfx1100 without scratch (amd_score_options) and for sm_90 through the
 * mapping without a stack frame (nvidia_score_options). The runtime path
 * (hiprtc) and, where the NVIDIA mapping is built, NVRTC behind it compile
 * a sample too. The ring's element-wise passes (rows.hip,
 * one program for every target) compile without scratch memory for every
 * AMD target above (rows_amd_targets), by hiprtc and through the mapping.
 *
 * Without a HIP compiler these cases skip.
 *
 * fa-test-labels: compile */
#include "harness.h"
#include "test_util.h"

#include "fa_internal.h"
#include "flashattn.h"
#include "planner.h"

#ifdef FA_WITH_HIP
#include "backends/hip/hip_runtime_internal.h"
#include "planner_hip_mma.h"
#endif
#ifdef FA_WITH_CUDA
#include "backends/cuda/cubin_info.h"
#endif

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef FA_HIPCC_PATH
#define FA_HIPCC_PATH "hipcc"
#endif

#ifdef FA_WITH_HIP

extern char **environ;

/* ------------------------------------------------------------------------ */
/* Described devices                                                         */

/* An RDNA2 card, described from its data sheet (72 CUs at up to 2250 MHz,
 * 512 GB/s, wave32, 64 KiB of LDS per work-group, no matrix units): the
 * planner's wavefront-32 AMD plans. */
static fa_device_desc gfx1030_device(void) {
    fa_device_desc d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "AMD Radeon RX 6800 XT");
    snprintf(d.vendor, sizeof d.vendor, "Advanced Micro Devices, Inc.");
    snprintf(d.arch, sizeof d.arch, "gfx1030");
    d.backend = FA_BACKEND_HIP;
    d.type = FA_DEVICE_GPU;
    d.local_mem_bytes = 64 * 1024;
    d.max_work_group_size = 1024;
    d.simd_width = 32;
    d.compute_units = 72;
    d.clock_mhz = 2250;
    d.bandwidth_gbs = 512.0;
    d.global_mem_bytes = (size_t)16 << 30;
    d.fp32_flops_per_clock_cu = 128.0;
    return d;
}

/* ------------------------------------------------------------------------ */
/* Code objects: the AMDGPU metadata note (msgpack) of an ELF               */

typedef struct kernel_usage {
    char name[48];
    long vgpr, sgpr, agpr, lds, scratch, vgpr_spill, sgpr_spill, wave;
} kernel_usage;

#define MAX_KERNELS 4

typedef struct mp {
    const unsigned char *p, *end;
    int bad;
} mp;

static uint64_t mp_be(mp *m, int n) {
    uint64_t v = 0;
    if (m->end - m->p < n) {
        m->bad = 1;
        return 0;
    }
    for (int i = 0; i < n; i++) v = (v << 8) | m->p[i];
    m->p += n;
    return v;
}

/* Reads one value's header: kind 'u' (unsigned, in *v), 's' (string of *v
 * bytes at *s), 'm' (map of *v pairs), 'a' (array of *v), 'x' (anything
 * else, already skipped). */
static char mp_head(mp *m, uint64_t *v, const unsigned char **s) {
    if (m->p >= m->end) {
        m->bad = 1;
        return 'x';
    }
    unsigned c = *m->p++;
    *v = 0;
    if (c <= 0x7f) {
        *v = c;
        return 'u';
    }
    if (c >= 0xe0) return 'x';
    if ((c & 0xe0) == 0xa0) {
        /* fixstr */
        uint64_t len = c & 0x1f;
        if ((uint64_t)(m->end - m->p) < len) {
            m->bad = 1;
            return 'x';
        }
        *s = m->p;
        *v = len;
        m->p += len;
        return 's';
    }
    if ((c & 0xf0) == 0x80) {
        *v = c & 0x0f;
        return 'm';
    }
    if ((c & 0xf0) == 0x90) {
        *v = c & 0x0f;
        return 'a';
    }
    uint64_t n = 0;
    switch (c) {
    case 0xc0: case 0xc2: case 0xc3: return 'x';
    case 0xcc: *v = mp_be(m, 1); return 'u';
    case 0xcd: *v = mp_be(m, 2); return 'u';
    case 0xce: *v = mp_be(m, 4); return 'u';
    case 0xcf: *v = mp_be(m, 8); return 'u';
    case 0xd0: m->p += 1; return 'x';
    case 0xd1: m->p += 2; return 'x';
    case 0xd2: case 0xca: m->p += 4; return 'x';
    case 0xd3: case 0xcb: m->p += 8; return 'x';
    case 0xd4: m->p += 2; return 'x';
    case 0xd5: m->p += 3; return 'x';
    case 0xd6: m->p += 5; return 'x';
    case 0xd7: m->p += 9; return 'x';
    case 0xd8: m->p += 17; return 'x';
    case 0xc4: case 0xd9: n = mp_be(m, 1); break;
    case 0xc5: case 0xda: n = mp_be(m, 2); break;
    case 0xc6: case 0xdb: n = mp_be(m, 4); break;
    case 0xc7: n = mp_be(m, 1) + 1; break;
    case 0xc8: n = mp_be(m, 2) + 1; break;
    case 0xc9: n = mp_be(m, 4) + 1; break;
    case 0xdc: *v = mp_be(m, 2); return 'a';
    case 0xdd: *v = mp_be(m, 4); return 'a';
    case 0xde: *v = mp_be(m, 2); return 'm';
    case 0xdf: *v = mp_be(m, 4); return 'm';
    default: m->bad = 1; return 'x';
    }
    if ((uint64_t)(m->end - m->p) < n) {
        m->bad = 1;
        return 'x';
    }
    if (c >= 0xd9 && c <= 0xdb) {
        *s = m->p;
        *v = n;
        m->p += n;
        return 's';
    }
    m->p += n;
    return 'x';
}

static void mp_skip(mp *m, int depth) {
    uint64_t v;
    const unsigned char *s;
    char k = mp_head(m, &v, &s);
    if (depth > 32) {
        m->bad = 1;
        return;
    }
    if (k == 'm') v *= 2;
    if (k == 'm' || k == 'a')
        for (uint64_t i = 0; i < v && !m->bad; i++) mp_skip(m, depth + 1);
}

static int mp_key_is(const unsigned char *s, uint64_t n, const char *key) {
    return strlen(key) == n && memcmp(s, key, n) == 0;
}

static void read_kernel(mp *m, uint64_t pairs, kernel_usage *k) {
    static const struct {
        const char *key;
        size_t offset;
    } fields[] = {
        {".vgpr_count", offsetof(kernel_usage, vgpr)},
        {".sgpr_count", offsetof(kernel_usage, sgpr)},
        {".agpr_count", offsetof(kernel_usage, agpr)},
        {".group_segment_fixed_size", offsetof(kernel_usage, lds)},
        {".private_segment_fixed_size", offsetof(kernel_usage, scratch)},
        {".vgpr_spill_count", offsetof(kernel_usage, vgpr_spill)},
        {".sgpr_spill_count", offsetof(kernel_usage, sgpr_spill)},
        {".wavefront_size", offsetof(kernel_usage, wave)},
    };
    for (uint64_t i = 0; i < pairs && !m->bad; i++) {
        uint64_t n, v;
        const unsigned char *s = NULL, *vs = NULL;
        if (mp_head(m, &n, &s) != 's') {
            m->bad = 1;
            return;
        }
        const unsigned char *save = m->p;
        char kind = mp_head(m, &v, &vs);
        if (mp_key_is(s, n, ".name") && kind == 's') {
            size_t len = v < sizeof k->name - 1 ? (size_t)v : sizeof k->name - 1;
            memcpy(k->name, vs, len);
            k->name[len] = '\0';
            continue;
        }
        int used = 0;
        for (size_t f = 0; f < FA_ARRAY_SIZE(fields) && kind == 'u'; f++)
            if (mp_key_is(s, n, fields[f].key)) {
                *(long *)((char *)k + fields[f].offset) = (long)v;
                used = 1;
            }
        if (!used && (kind == 'm' || kind == 'a')) {
            m->p = save;
            mp_skip(m, 0);
        }
    }
}

/* The kernels' resource use from a code object; the number of kernels
 * found, -1 when the file is no AMDGPU code object. */
static int read_code_object(const unsigned char *elf, size_t size, kernel_usage *out, int max) {
    if (size < 64 || memcmp(elf, "\177ELF", 4) != 0 || elf[4] != 2 || elf[5] != 1) return -1;
    uint64_t shoff = 0, shentsize = 0, shnum = 0;
    for (int i = 7; i >= 0; i--) shoff = (shoff << 8) | elf[0x28 + i];
    shentsize = (uint64_t)elf[0x3a] | (uint64_t)elf[0x3b] << 8;
    shnum = (uint64_t)elf[0x3c] | (uint64_t)elf[0x3d] << 8;
    int found = 0;
    for (uint64_t sct = 0; sct < shnum; sct++) {
        uint64_t at = shoff + sct * shentsize;
        if (at + 64 > size) return -1;
        const unsigned char *sh = elf + at;
        uint32_t type = (uint32_t)sh[4] | (uint32_t)sh[5] << 8 | (uint32_t)sh[6] << 16 | (uint32_t)sh[7] << 24;
        if (type != 7) continue; /* SHT_NOTE */
        uint64_t off = 0, len = 0;
        for (int i = 7; i >= 0; i--) {
            off = (off << 8) | sh[0x18 + i];
            len = (len << 8) | sh[0x20 + i];
        }
        if (off > size || len > size - off) return -1;
        const unsigned char *note = elf + off, *nend = elf + off + len;
        while (nend - note >= 12) {
            uint32_t namesz = (uint32_t)note[0] | (uint32_t)note[1] << 8 | (uint32_t)note[2] << 16 | (uint32_t)note[3] << 24;
            uint32_t descsz = (uint32_t)note[4] | (uint32_t)note[5] << 8 | (uint32_t)note[6] << 16 | (uint32_t)note[7] << 24;
            uint32_t ntype = (uint32_t)note[8] | (uint32_t)note[9] << 8 | (uint32_t)note[10] << 16 | (uint32_t)note[11] << 24;
            size_t name_pad = (namesz + 3u) & ~3u, desc_pad = (descsz + 3u) & ~3u;
            if ((size_t)(nend - note) < 12 + name_pad + desc_pad) break;
            const unsigned char *desc = note + 12 + name_pad;
            if (ntype == 32 && namesz == 7 && memcmp(note + 12, "AMDGPU", 7) == 0) {
                mp m = {desc, desc + descsz, 0};
                uint64_t pairs;
                const unsigned char *s;
                if (mp_head(&m, &pairs, &s) != 'm') return -1;
                for (uint64_t i = 0; i < pairs && !m.bad; i++) {
                    uint64_t n, count;
                    if (mp_head(&m, &n, &s) != 's') return -1;
                    if (!mp_key_is(s, n, "amdhsa.kernels")) {
                        mp_skip(&m, 0);
                        continue;
                    }
                    if (mp_head(&m, &count, &s) != 'a') return -1;
                    for (uint64_t kx = 0; kx < count && !m.bad; kx++) {
                        uint64_t kp;
                        if (mp_head(&m, &kp, &s) != 'm') return -1;
                        kernel_usage k;
                        memset(&k, 0, sizeof k);
                        read_kernel(&m, kp, &k);
                        if (found < max) out[found++] = k;
                    }
                }
                if (m.bad) return -1;
            }
            note += 12 + name_pad + desc_pad;
        }
    }
    return found;
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0) {
            buf = malloc((size_t)n);
            if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            }
            *size = (size_t)n;
        }
    }
    fclose(f);
    return buf;
}

/* ------------------------------------------------------------------------ */
/* The programs the planner emits                                           */

typedef struct variant {
    const char *name;         /* a program the planner does not make: its label */
    fa_pass pass;
    fa_dtype dtype;
    int head_dim, wave;
    int main;                 /* no optional feature */
    int features;             /* for_each_plan's feature set */
    const char *options;      /* score options (a score_options_sweep program): its label; no scratch allowed */
    int mma;                  /* a matrix-core program: local memory dynamic, no spills anywhere */
    unsigned targets;         /* bit t: compiled for targets[t] */
    size_t local_budget;      /* the planner's local memory of the tile */
    fa_kernel_plan kp;
    fa_hip_program prog;
} variant;

#define MAX_VARIANTS 512

typedef struct variant_set {
    variant v[MAX_VARIANTS];
    int count;
    int overflow;
} variant_set;

typedef struct target {
    const char *arch;
    int wave;
} target;

/* gfx1030 runs HIP in wave32 only (ROCm refuses its wave64 mode), so the
 * MI250X's tiles reach it rebuilt for a 32-wide wavefront. gfx1100 (RDNA3)
 * compiles without a device library, which Debian's ROCm 5.2 lacks for it
 * (tests/hip_gfx11_shim.h stands in). */
static const target targets[] = {{"gfx908", 64}, {"gfx90a", 64}, {"gfx940", 64}, {"gfx1030", 32}, {"gfx1100", 32}};
#define T_GFX908 (1u << 0)
#define T_GFX90A (1u << 1)
#define T_GFX940 (1u << 2)
#define T_GFX1030 (1u << 3)
#define T_GFX1100 (1u << 4)

static int same_program(const fa_hip_program *a, const fa_hip_program *b) {
    if (a->define_count != b->define_count || a->path_count != b->path_count) return 0;
    for (int i = 0; i < a->define_count; i++)
        if (strcmp(a->defines[i], b->defines[i]) != 0) return 0;
    for (int i = 0; i < a->path_count; i++)
        if (strcmp(a->paths[i], b->paths[i]) != 0) return 0;
    return 1;
}

static const int32_t varlen_cu[] = {0, 1000, 3000};
static uint8_t block_mask_bytes[64 * 64];

/* Every optional feature at once: causal, window, block mask, dropout,
 * varlen (on the shapes whose batch the offsets fit). */
static void set_all_features(fa_attention_desc *d) {
    d->causal = 1;
    d->window_left = 256;
    d->window_right = 0;
    d->dropout_p = 0.1f;
    d->dropout_seed = 1;
    d->block_q = 64;
    d->block_k = 64;
    int rows = (d->seqlen_q + 63) / 64, cols = (d->seqlen_k + 63) / 64;
    d->block_mask = block_mask_bytes;
    d->block_mask_bytes = (size_t)rows * (size_t)cols;
    if (d->batch == 2 && d->seqlen_q == d->seqlen_k && d->seqlen_q >= 2000) {
        d->cu_seqlens_q = varlen_cu;
        d->cu_seqlens_k = varlen_cu;
    }
}

/* A plan's program, once per distinct program; dev (for matrix-core
 * plans, whose layer is the device's) or NULL (SIMT plans). */
static void add_variant(variant_set *set, const fa_device_desc *dev, const fa_attention_desc *d,
                        const fa_kernel_plan *kp, fa_pass pass, int wave, int features, unsigned mask) {
    variant v;
    memset(&v, 0, sizeof v);
    fa_status st =
        dev ? fa_hip_program_for_device(dev, d, kp, pass, &v.prog) : fa_hip_program_for(d, kp, pass, wave, &v.prog);
    CHECK_MSG(st == FA_SUCCESS, "no HIP program for a %s plan %dx%d/%dx%d at head_dim %d: %s",
              pass == FA_PASS_FORWARD ? "forward" : "backward", kp->br, kp->bc, kp->thread_rows, kp->thread_cols,
              d->head_dim, fa_last_error());
    if (st != FA_SUCCESS) return;
    for (int i = 0; i < set->count; i++)
        if (set->v[i].wave == wave && same_program(&set->v[i].prog, &v.prog)) {
            set->v[i].targets |= mask;
            return;
        }
    if (set->count >= MAX_VARIANTS) {
        set->overflow = 1;
        return;
    }
    v.pass = pass;
    v.dtype = d->q.dtype;
    v.head_dim = d->head_dim;
    v.wave = wave;
    v.main = !features;
    v.features = features;
    v.targets = mask;
    v.kp = *kp;
    v.mma = kp->variant == FA_VARIANT_MMA;
    v.local_budget = v.mma ? kp->local_mem_bytes : fa_plan_local_mem(FA_VARIANT_SIMT, pass, d, kp->br, kp->bc, 1);
    set->v[set->count++] = v;
}

/* What a sweep does with one plan: the problem, its plan, and which
 * feature set it was planned with. */
typedef void (*plan_fn)(void *user, const fa_attention_desc *d, const fa_plan_info *info, int features);

/* The plans a device gets for training shapes, a small batch and decoding
 * (the split-K plans), every head dimension, the given dtypes, for the
 * feature sets first to last (0 no optional feature, 1 all of them, 2 all
 * of them in deterministic mode). */
static void for_each_plan(const fa_device_desc *dev, const fa_dtype *dtypes, int ndtypes, int first, int last,
                          plan_fn fn, void *user) {
    static const int shapes[][4] = {{8, 2048, 2048, 16}, {2, 2048, 2048, 16}, {1, 512, 512, 8},
                                    {2, 4, 8192, 16}, {1, 1, 4096, 32}};
    static const int dims[] = {32, 64, 96, 128, 256};
    memset(block_mask_bytes, 1, sizeof block_mask_bytes);
    for (int features = first; features <= last; features++)
        for (int t = 0; t < ndtypes; t++)
            for (size_t i = 0; i < FA_ARRAY_SIZE(dims); i++)
                for (size_t s = 0; s < FA_ARRAY_SIZE(shapes); s++) {
                    fa_attention_desc d;
                    fa_attention_desc_init(&d);
                    d.batch = shapes[s][0];
                    d.seqlen_q = shapes[s][1];
                    d.seqlen_k = shapes[s][2];
                    d.heads_q = d.heads_kv = shapes[s][3];
                    d.head_dim = dims[i];
                    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dtypes[t];
                    if (features) set_all_features(&d);
                    d.deterministic = features == 2;
                    fa_plan_info info;
                    fa_status st = fa_plan_for_device(dev, &d, &info);
                    CHECK_MSG(st == FA_SUCCESS, "planning for %s (%s): %s", dev->name, dev->arch, fa_last_error());
                    if (st == FA_SUCCESS) fn(user, &d, &info, features);
                }
}

typedef struct simt_sweep {
    variant_set *set;
    int wave;
    unsigned mask;
} simt_sweep;

static void add_simt_plan(void *user, const fa_attention_desc *d, const fa_plan_info *info, int features) {
    const simt_sweep *w = user;
    add_variant(w->set, NULL, d, &info->forward, FA_PASS_FORWARD, w->wave, features, w->mask);
    add_variant(w->set, NULL, d, &info->backward, FA_PASS_BACKWARD, w->wave, features, w->mask);
}

/* The programs of a device's plans (for_each_plan), with no optional
 * feature or with all of them; built for a wavefront of wave lanes and the
 * targets in mask. */
static void enumerate(const fa_device_desc *dev, int wave, int features, const fa_dtype *dtypes, int ndtypes,
                      unsigned mask, variant_set *set) {
    simt_sweep w = {set, wave, mask};
    for_each_plan(dev, dtypes, ndtypes, features, features, add_simt_plan, &w);
}

static void variant_label(const variant *v, char *out, size_t size) {
    if (v->name) {
        snprintf(out, size, "%s", v->name);
        return;
    }
    if (v->options) {
        snprintf(out, size, "%s %-4s d%-3d %3dx%-3d %dx%d w%d%s %s",
                 v->pass == FA_PASS_FORWARD ? (v->kp.variant == FA_VARIANT_SPLITK ? "splitk" : v->mma ? "fwdmma" : "fwd   ")
                                            : v->mma ? (v->features == 2 ? "bwddet" : "bwdmma") : "bwd   ",
                 fa_dtype_name(v->dtype), v->head_dim, v->kp.br, v->kp.bc, v->kp.thread_rows, v->kp.thread_cols,
                 v->wave, v->kp.stages > 1 ? " s2" : "", v->options);
        return;
    }
    snprintf(out, size, "%s %-4s d%-3d %3dx%-3d %dx%d wg%-4d w%d%s %s",
             v->pass == FA_PASS_FORWARD ? (v->kp.variant == FA_VARIANT_SPLITK ? "splitk" : v->mma ? "fwdmma" : "fwd   ")
                                        : v->mma ? "bwdmma" : "bwd   ",
             fa_dtype_name(v->dtype), v->head_dim, v->kp.br, v->kp.bc, v->kp.thread_rows, v->kp.thread_cols,
             v->kp.work_group_size, v->wave, v->kp.stages > 1 ? " s2" : "",
             v->features == 0 ? "-" : v->features == 1 ? "all" : "all det");
}

/* ------------------------------------------------------------------------ */
/* Compiling with hipcc, a few at a time                                    */

typedef struct job {
    int variant, target;
    pid_t pid;
    int status;               /* exit status; -1 not run */
    kernel_usage k[MAX_KERNELS];
    int kernels;
} job;

static const char *hipcc_path(void) {
    const char *env = getenv("FA_HIPCC");
    return env && env[0] ? env : FA_HIPCC_PATH;
}

/* Runs argv in env with stdout and stderr to log; the child's pid, or -1. */
static pid_t spawn_env(char *const *argv, char *const *env, const char *log) {
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) return -1;
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

static pid_t spawn(char *const *argv, const char *log) { return spawn_env(argv, environ, log); }

static int wait_exit(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The compiler command hipcc runs for a target's compiles. hipcc is a Perl
 * script that starts clang three times (--version twice,
 * -print-target-triple) and a shell before each compile: about 0.2 s of
 * the 0.9 s a compile takes. The command it prints for a target's first
 * compile (HIPCC_VERBOSE=1) ends with the arguments it was given as it
 * passes them on; what comes before (clang and hipcc's own options) is
 * kept, and the target's later compiles run it with their own arguments:
 * the command hipcc would have run. Where the printed command does not end
 * so, or FA_HIP_COMPILE_DIRECT=0, every compile goes through hipcc. */
#define HEAD_WORDS 64
typedef struct compiler_head {
    int state;   /* HEAD_UNKNOWN, HEAD_PROBING (job probe runs verbose), HEAD_KNOWN, HEAD_HIPCC */
    int probe;
    int count;
    char *words[HEAD_WORDS + 1];
    char *text;  /* the printed command, split in place into words */
} compiler_head;
enum { HEAD_UNKNOWN, HEAD_PROBING, HEAD_KNOWN, HEAD_HIPCC };

typedef struct work {
    char dir[256];
    const variant_set *set;
    job *jobs;
    int count;
    /* Per target, hip/hip_runtime.h precompiled ("" where that failed or
     * FA_HIP_COMPILE_PCH=0): parsing it took about 0.85 s of each 1.5 s
     * compile on two cores; the code objects and their resource notes come
     * out the same (compare the tables of a run with FA_HIP_COMPILE_PCH=0). */
    char pch[FA_ARRAY_SIZE(targets)][320];
    compiler_head head[FA_ARRAY_SIZE(targets)];
    char **verbose_env; /* environ with HIPCC_VERBOSE=1 */
} work;

static void job_paths(const work *w, int j, char *src, char *obj, char *log, size_t size) {
    snprintf(src, size, "%s/v%d.hip", w->dir, w->jobs[j].variant);
    snprintf(obj, size, "%s/j%d.o", w->dir, j);
    snprintf(log, size, "%s/j%d.log", w->dir, j);
}

/* The start of every hipcc command line for target t (argv room for 5;
 * arch holds the offload option): device code only, unbundled, -O3. */
static int hipcc_head(const target *t, char *arch, size_t arch_size, char **argv) {
    snprintf(arch, arch_size, "--offload-arch=%s", t->arch);
    argv[0] = (char *)hipcc_path();
    argv[1] = (char *)"--cuda-device-only";
    argv[2] = (char *)"--no-gpu-bundle-output";
    argv[3] = arch;
    argv[4] = (char *)"-O3";
    return 5;
}

/* What a target adds to its compiles (argv room for 3), the shim after
 * the runtime header; the count. */
static int target_options(const target *t, int shim, char **argv) {
    if (strcmp(t->arch, "gfx1100") != 0) return 0;
    argv[0] = (char *)"-nogpulib";
    if (!shim) return 1;
    argv[1] = (char *)"-include";
    argv[2] = (char *)FA_SOURCE_DIR "/tests/hip_gfx11_shim.h";
    return 3;
}

/* hip/hip_runtime.h precompiled for each target the jobs use, with the
 * jobs' own options; a target whose header does not precompile is
 * compiled with -include as before. */
static void precompile_runtime_header(work *w) {
    const char *env = getenv("FA_HIP_COMPILE_PCH");
    if (env && strcmp(env, "0") == 0) return;
    char header[320];
    snprintf(header, sizeof header, "%s/runtime.h", w->dir);
    FILE *f = fopen(header, "w");
    if (!f) return;
    int ok = fputs("#include <hip/hip_runtime.h>\n", f) >= 0;
    ok &= fclose(f) == 0;
    if (!ok) return;
    unsigned used = 0;
    for (int j = 0; j < w->count; j++) used |= 1u << w->jobs[j].target;
    int made = 0;
    for (size_t t = 0; t < FA_ARRAY_SIZE(targets); t++) {
        if (!(used & (1u << t))) continue;
        char arch[64], out[320], log[320];
        snprintf(out, sizeof out, "%s/runtime-%s.pch", w->dir, targets[t].arch);
        snprintf(log, sizeof log, "%s/runtime-%s.log", w->dir, targets[t].arch);
        char *argv[24];
        int n = hipcc_head(&targets[t], arch, sizeof arch, argv);
        n += target_options(&targets[t], 0, argv + n);
        argv[n++] = (char *)"-x";
        argv[n++] = (char *)"hip";
        argv[n++] = (char *)"-Xclang";
        argv[n++] = (char *)"-emit-pch";
        argv[n++] = (char *)"-S";
        argv[n++] = header;
        argv[n++] = (char *)"-o";
        argv[n++] = out;
        argv[n] = NULL;
        const pid_t pid = spawn(argv, log);
        if (pid > 0 && wait_exit(pid) == 0) {
            snprintf(w->pch[t], sizeof w->pch[t], "%s", out);
            made++;
        }
        remove(log);
    }
    fprintf(stderr, "hip/hip_runtime.h precompiled for %d of the targets\n", made);
}

/* Job j's hipcc command line into argv (room for 48; the paths and the
 * offload option in the caller's buffers); the count. */
static int job_argv(const work *w, int j, char **argv, char *src, char *obj, char *log, char *arch, size_t size) {
    const job *jb = &w->jobs[j];
    const variant *v = &w->set->v[jb->variant];
    const target *t = &targets[jb->target];
    job_paths(w, j, src, obj, log, size);
    int n = hipcc_head(t, arch, size, argv);
    /* hiprtc's implicit header, so that hipcc sees what hiprtc sees. */
    const char *pch = w->pch[jb->target];
    if (pch[0]) {
        argv[n++] = (char *)"-Xclang";
        argv[n++] = (char *)"-include-pch";
        argv[n++] = (char *)"-Xclang";
        argv[n++] = (char *)pch;
    } else {
        argv[n++] = (char *)"-include";
        argv[n++] = (char *)"hip/hip_runtime.h";
    }
    n += target_options(t, 1, argv + n);
    for (int i = 0; i < v->prog.define_count; i++) argv[n++] = (char *)v->prog.defines[i];
    argv[n++] = (char *)"-c";
    argv[n++] = src;
    argv[n++] = (char *)"-o";
    argv[n++] = obj;
    argv[n] = NULL;
    return n;
}

static int ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

/* What hipcc passes on of its arguments argv[1..n): all but the offload
 * option, a source file preceded by "-x hip". Into out (room for n + 2). */
static int passed_on(char *const *argv, int n, char **out) {
    int k = 0;
    for (int i = 1; i < n; i++) {
        if (strncmp(argv[i], "--offload-arch=", 15) == 0) continue;
        if (argv[i][0] != '-' && ends_with(argv[i], ".hip")) {
            out[k++] = (char *)"-x";
            out[k++] = (char *)"hip";
        }
        out[k++] = argv[i];
    }
    return k;
}

/* Splits a shell command line in place into words (double and single
 * quotes, backslash escapes: what hipcc's quoting produces); the count, or
 * -1 past max words or on an unterminated quote. */
static int shell_words(char *line, char **words, int max) {
    int count = 0;
    char *r = line;
    for (;;) {
        while (*r == ' ' || *r == '\t') r++;
        if (!*r) return count;
        if (count == max) return -1;
        char *word = r, *out = r;
        while (*r && *r != ' ' && *r != '\t') {
            if (*r == '\\' && r[1]) {
                *out++ = r[1];
                r += 2;
            } else if (*r == '"' || *r == '\'') {
                const char q = *r++;
                while (*r && *r != q) {
                    if (q == '"' && *r == '\\' && (r[1] == '"' || r[1] == '\\' || r[1] == '$' || r[1] == '`')) r++;
                    *out++ = *r++;
                }
                if (*r != q) return -1;
                r++;
            } else {
                *out++ = *r++;
            }
        }
        const int last = *r == '\0';
        *out = '\0';
        words[count++] = word;
        if (last) return count;
        r++;
    }
}

/* environ with HIPCC_VERBOSE=1 (malloc'ed), or NULL where
 * FA_HIP_COMPILE_DIRECT=0: the environment of a target's first compile. */
static char **verbose_environment(void) {
    const char *env = getenv("FA_HIP_COMPILE_DIRECT");
    if (env && strcmp(env, "0") == 0) return NULL;
    size_t n = 0;
    while (environ[n]) n++;
    char **e = malloc((n + 2) * sizeof *e);
    if (!e) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "HIPCC_VERBOSE=", 14) != 0) e[k++] = environ[i];
    e[k++] = (char *)"HIPCC_VERBOSE=1";
    e[k] = NULL;
    return e;
}

/* After the target's probe job: keeps the head of the command hipcc ran
 * for it where the rest is what it was given, else stays with hipcc. */
static void learn_head(work *w, int j, const char *log) {
    compiler_head *h = &w->head[w->jobs[j].target];
    h->state = HEAD_HIPCC;
    size_t size = 0;
    unsigned char *text = read_file(log, &size);
    if (!text) return;
    char *t = realloc(text, size + 1);
    if (!t) {
        free(text);
        return;
    }
    t[size] = '\0';
    char *line = strstr(t, "hipcc-cmd: ");
    char *words[HEAD_WORDS + 48];
    int count = -1;
    if (line) {
        line += strlen("hipcc-cmd: ");
        line[strcspn(line, "\n")] = '\0';
        count = shell_words(line, words, (int)FA_ARRAY_SIZE(words));
    }
    char src[320], obj[320], lg[320], arch[64];
    char *argv[48], *tail[50];
    const int n = job_argv(w, j, argv, src, obj, lg, arch, sizeof src);
    const int k = passed_on(argv, n, tail);
    int same = count > k && count - k <= HEAD_WORDS && words[0][0] == '/';
    for (int i = 0; same && i < k; i++) same = strcmp(words[count - k + i], tail[i]) == 0;
    if (!same) {
        free(t);
        fprintf(stderr, "%s: %s; every compile through hipcc\n", arch + strlen("--offload-arch="),
                count < 0 ? "hipcc printed no command (HIPCC_VERBOSE=1)" : "hipcc's command does not end with its arguments");
        return;
    }
    h->text = t;
    h->count = count - k;
    for (int i = 0; i < h->count; i++) h->words[i] = words[i];
    h->state = HEAD_KNOWN;
}

static pid_t start_job(work *w, int j) {
    char src[320], obj[320], log[320], arch[64];
    char *argv[48];
    const int n = job_argv(w, j, argv, src, obj, log, arch, sizeof src);
    compiler_head *h = &w->head[w->jobs[j].target];
    if (h->state == HEAD_KNOWN) {
        char *direct[HEAD_WORDS + 51];
        for (int i = 0; i < h->count; i++) direct[i] = h->words[i];
        direct[h->count + passed_on(argv, n, direct + h->count)] = NULL;
        return spawn(direct, log);
    }
    if (h->state == HEAD_UNKNOWN && w->verbose_env) {
        h->state = HEAD_PROBING;
        h->probe = j;
        return spawn_env(argv, w->verbose_env, log);
    }
    return spawn(argv, log);
}

static void finish_job(work *w, int j, int status) {
    job *jb = &w->jobs[j];
    char src[320], obj[320], log[320];
    job_paths(w, j, src, obj, log, sizeof src);
    jb->status = status;
    compiler_head *h = &w->head[jb->target];
    if (h->state == HEAD_PROBING && h->probe == j) {
        if (status == 0)
            learn_head(w, j, log);
        else
            h->state = HEAD_HIPCC;
    }
    if (status == 0) {
        size_t size = 0;
        unsigned char *elf = read_file(obj, &size);
        jb->kernels = elf ? read_code_object(elf, size, jb->k, MAX_KERNELS) : -1;
        free(elf);
    } else {
        size_t size = 0;
        unsigned char *text = read_file(log, &size);
        fprintf(stderr, "  hipcc failed (%d) for %s:\n%.*s\n", status, targets[jb->target].arch, (int)(size > 4000 ? 4000 : size),
                text ? (const char *)text : "(no log)");
        free(text);
    }
    remove(obj);
    remove(log);
}

/* Every job, at most `parallel` compilers at a time. */
static void run_jobs(work *w, int parallel) {
    int next = 0, running = 0;
    int *slot = malloc((size_t)parallel * sizeof *slot);
    if (!slot) return;
    for (int i = 0; i < parallel; i++) slot[i] = -1;
    while (next < w->count || running > 0) {
        for (int i = 0; i < parallel && next < w->count; i++) {
            if (slot[i] >= 0) continue;
            w->jobs[next].pid = start_job(w, next);
            if (w->jobs[next].pid < 0) {
                w->jobs[next].status = 127;
                next++;
                continue;
            }
            slot[i] = next++;
            running++;
        }
        if (running == 0) break;
        int status = 0;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < parallel; i++)
            if (slot[i] >= 0 && w->jobs[slot[i]].pid == pid) {
                finish_job(w, slot[i], WIFEXITED(status) ? WEXITSTATUS(status) : 128);
                slot[i] = -1;
                running--;
            }
    }
    free(slot);
}

static int write_source(const char *path, const fa_hip_program *prog) {
    char *text = NULL;
    size_t size = 0;
    if (fa_hip_program_source(prog, "gfx90a", &text, &size) != FA_SUCCESS) return 0;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(text, 1, size, f) == size;
    if (f) ok &= fclose(f) == 0;
    free(text);
    return ok;
}

static int hipcc_works(void) {
    /* hipcc otherwise asks the (absent) GPUs for a default target first. */
    setenv("HCC_AMDGPU_TARGET", "gfx90a", 1);
    char log[64];
    snprintf(log, sizeof log, "/tmp/fa-hipcc-%ld.log", (long)getpid());
    char *argv[] = {(char *)hipcc_path(), (char *)"--version", NULL};
    pid_t pid = spawn(argv, log);
    int ok = pid > 0 && wait_exit(pid) == 0;
    remove(log);
    return ok;
}

static int cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

#endif /* FA_WITH_HIP */

/* ------------------------------------------------------------------------ */
/* Cases                                                                     */

#ifdef FA_WITH_HIP
/* Compiles every program of the set for its targets, prints the table of
 * resource use and fails on compile errors, on scratch memory (spilled
 * registers) in main SIMT variants and in every matrix-core variant, and
 * on local memory other than the planner's: the SIMT kernels' static tiles
 * exactly its budget (the dQ kernel no more), the matrix-core kernels none
 * static (theirs is the dynamic block the planner's figure sizes, shown
 * as "dyn"). */
static void compile_set(variant_set *set) {
    CHECK_MSG(!set->overflow, "more than %d distinct programs", MAX_VARIANTS);
    work w;
    memset(&w, 0, sizeof w);
    w.set = set;
    const char *tmp = getenv("TMPDIR");
    snprintf(w.dir, sizeof w.dir, "%s/fa-hip-compile-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    CHECK_MSG(mkdtemp(w.dir) != NULL, "mkdtemp(%s) failed", w.dir);
    w.jobs = calloc((size_t)set->count * FA_ARRAY_SIZE(targets), sizeof *w.jobs);
    CHECK(w.jobs != NULL);
    if (!w.jobs) return;
    for (int i = 0; i < set->count; i++) {
        char src[320];
        snprintf(src, sizeof src, "%s/v%d.hip", w.dir, i);
        CHECK_MSG(write_source(src, &set->v[i].prog), "cannot write %s", src);
        for (size_t t = 0; t < FA_ARRAY_SIZE(targets); t++)
            if (set->v[i].targets & (1u << t)) {
                w.jobs[w.count].variant = i;
                w.jobs[w.count].target = (int)t;
                w.jobs[w.count].status = -1;
                w.count++;
            }
    }
    const int parallel = cpu_count();
    fprintf(stderr, "%d distinct programs, %d compiles, %d at a time\n", set->count, w.count, parallel);
    time_t t0 = time(NULL);
    precompile_runtime_header(&w);
    w.verbose_env = verbose_environment();
    run_jobs(&w, parallel);
    int direct = 0;
    for (size_t t = 0; t < FA_ARRAY_SIZE(targets); t++) direct += w.head[t].state == HEAD_KNOWN;
    fprintf(stderr, "compiled in %ld s (%d targets' compiles after their first by hipcc's clang command)\n",
            (long)(time(NULL) - t0), direct);

    /* The table: one row per program and target, one column group per
     * kernel (VGPRs, SGPRs, AGPRs, LDS bytes, scratch bytes per lane). */
    printf("%-56s %-8s %s\n", "program (pass dtype dim tile threads wg wave stages features)", "target",
           "kernel: vgpr/sgpr/agpr lds scratch");
    int failed = 0, scratch_main = 0, scratch_other = 0, scratch_mma = 0, lds_wrong = 0;
    for (int j = 0; j < w.count; j++) {
        const job *jb = &w.jobs[j];
        const variant *v = &set->v[jb->variant];
        const target *t = &targets[jb->target];
        char label[112];
        variant_label(v, label, sizeof label);
        const char *tname = t->arch;
        if (jb->status != 0 || jb->kernels != v->prog.kernel_count) {
            failed++;
            printf("%-56s %-8s FAILED (status %d, %d kernels)\n", label, tname, jb->status, jb->kernels);
            continue;
        }
        printf("%-56s %-8s", label, tname);
        if (v->mma) printf(" dyn %zu", v->local_budget);
        for (int k = 0; k < jb->kernels; k++) {
            const kernel_usage *u = &jb->k[k];
            printf(" %s: %ld/%ld/%ld %ld %ld", u->name + 3, u->vgpr, u->sgpr, u->agpr, u->lds, u->scratch);
            if (u->scratch > 0 || u->vgpr_spill > 0) {
                if (v->mma)
                    scratch_mma++;
                else if (v->main || v->options)
                    scratch_main++;
                else
                    scratch_other++;
            }
            /* The forward and dK/dV kernels declare exactly the planner's
             * budget, the dQ kernel no more than it. */
            const int exact = strcmp(u->name, "fa_forward") == 0 || strcmp(u->name, "fa_bwd_dkdv") == 0;
            const int bounded = strcmp(u->name, "fa_bwd_dq") == 0;
            /* The KV-cache attention's tiles are dynamic; its prepare
             * kernel holds one flag. */
            const int dynamic = v->mma || strcmp(u->name, "fa_kv_attend") == 0;
            const int flag = strcmp(u->name, "fa_kv_prepare") == 0;
            if ((exact && (size_t)u->lds != v->local_budget) || (bounded && (size_t)u->lds > v->local_budget) ||
                (dynamic && u->lds != 0) || (flag && u->lds > 16)) {
                lds_wrong++;
                printf(" [LDS %ld, budget %zu%s]", u->lds, v->local_budget, dynamic ? " dynamic" : "");
            }
            if (u->wave != t->wave) printf(" [wave %ld]", u->wave);
        }
        printf("\n");
    }
    printf("%d programs x targets, %d failed; scratch in %d main, %d optional-feature and %d matrix-core kernels\n",
           w.count, failed, scratch_main, scratch_other, scratch_mma);
    CHECK_MSG(failed == 0, "%d compiles failed", failed);
    CHECK_MSG(scratch_main == 0, "%d kernels of main or score-option variants use scratch memory", scratch_main);
    CHECK_MSG(scratch_mma == 0, "%d matrix-core kernels spill registers", scratch_mma);
    CHECK_MSG(lds_wrong == 0, "%d kernels declare other local memory than the planner budgets", lds_wrong);
    for (int i = 0; i < set->count; i++) {
        char src[320];
        snprintf(src, sizeof src, "%s/v%d.hip", w.dir, i);
        remove(src);
    }
    for (size_t t = 0; t < FA_ARRAY_SIZE(targets); t++)
        if (w.pch[t][0]) remove(w.pch[t]);
    char header[320];
    snprintf(header, sizeof header, "%s/runtime.h", w.dir);
    remove(header);
    rmdir(w.dir);
    for (size_t t = 0; t < FA_ARRAY_SIZE(targets); t++) free(w.head[t].text);
    free(w.verbose_env);
    free(w.jobs);
}

typedef struct mma_amd_sweep {
    variant_set *set;
    const fa_device_desc *dev;
    unsigned mask;
} mma_amd_sweep;

static void add_amd_mma_plan(void *user, const fa_attention_desc *d, const fa_plan_info *info, int features) {
    const mma_amd_sweep *w = user;
    if (info->forward.variant == FA_VARIANT_MMA)
        add_variant(w->set, w->dev, d, &info->forward, FA_PASS_FORWARD, w->dev->simd_width, features, w->mask);
    if (info->backward.variant == FA_VARIANT_MMA)
        add_variant(w->set, w->dev, d, &info->backward, FA_PASS_BACKWARD, w->dev->simd_width, features, w->mask);
}

/* An RDNA3 card, described from its data sheet (RX 7900 XTX: 96 CUs at up
 * to 2500 MHz, 960 GB/s, wave32, 64 KiB of LDS per work-group, WMMA at 512
 * fp16 flops a clock per CU): the planner's WMMA plans. */
static fa_device_desc gfx1100_device(void) {
    fa_device_desc d = gfx1030_device();
    snprintf(d.name, sizeof d.name, "AMD Radeon RX 7900 XTX");
    snprintf(d.arch, sizeof d.arch, "gfx1100");
    d.compute_units = 96;
    d.clock_mhz = 2500;
    d.bandwidth_gbs = 960.0;
    d.global_mem_bytes = (size_t)24 << 30;
    d.fp32_flops_per_clock_cu = 256.0;
    d.matrix_flops_per_clock_cu = 512.0;
    d.matrix_m = d.matrix_n = d.matrix_k = 16;
    return d;
}

/* The three AMD generations the matrix-core and KV-cache sweeps compile
 * for: the MI250X (gfx90a), the MI300X as gfx940 (the CDNA3 name ROCm 5.2
 * knows; the MI300X is gfx942) and the RX 7900 XTX (gfx1100); 0 where the
 * described devices are missing. */
static int amd_matrix_devices(fa_device_desc *cdna2, fa_device_desc *cdna3, fa_device_desc *rdna3) {
    const fa_described_device *mi250 = fa_described_device_find("mi250x"), *mi300 = fa_described_device_find("mi300x");
    CHECK(mi250 != NULL && mi300 != NULL);
    if (!mi250 || !mi300) return 0;
    *cdna2 = mi250->desc;
    *cdna3 = mi300->desc;
    snprintf(cdna3->arch, sizeof cdna3->arch, "gfx940");
    *rdna3 = gfx1100_device();
    return 1;
}
#endif

/* Every SIMT planner variant for every AMD target, with its resource use. */
FA_TEST(amd_targets) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    if (!hipcc_works()) FA_SKIP("no HIP compiler (hipcc) runs here");
    static variant_set set;
    memset(&set, 0, sizeof set);
    const fa_described_device *mi = fa_described_device_find("mi250x");
    CHECK(mi != NULL);
    if (!mi) return;
    /* The SIMT kernels' tiles: the MI250X's matrix cores set aside (its
     * fp16 and bf16 plans there are the matrix-core kernels', which
     * amd_mma_variants compiles). */
    fa_device_desc mi_simt = mi->desc;
    mi_simt.matrix_flops_per_clock_cu = 0.0;
    const fa_device_desc rdna = gfx1030_device();
    static const fa_dtype all_dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    /* With every optional feature on: fp32 and bf16, the two load and
     * store paths (fp16 differs from bf16 only in the conversion), for one
     * target of each wavefront width; a budget of about five minutes on
     * two cores leaves no room for more. */
    static const fa_dtype feature_dtypes[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    enumerate(&mi_simt, 64, 0, all_dtypes, 3, T_GFX908 | T_GFX90A | T_GFX940, &set);
    enumerate(&mi_simt, 32, 0, all_dtypes, 3, T_GFX1030, &set);
    enumerate(&rdna, 32, 0, all_dtypes, 3, T_GFX1030, &set);
    enumerate(&mi_simt, 64, 1, feature_dtypes, 2, T_GFX90A, &set);
    enumerate(&rdna, 32, 1, feature_dtypes, 2, T_GFX1030, &set);
    compile_set(&set);
#endif
}

/* The ring's element-wise passes (kernels_hip/rows.hip): one program, no
 * build option, for every AMD target above, without scratch memory. */
FA_TEST(rows_amd_targets) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    if (!hipcc_works()) FA_SKIP("no HIP compiler (hipcc) runs here");
    static variant_set set;
    memset(&set, 0, sizeof set);
    variant *v = &set.v[set.count++];
    fa_hip_rows_program(&v->prog);
    v->name = "rows (every dtype pair, merge)";
    v->main = 1;
    v->targets = T_GFX908 | T_GFX90A | T_GFX940 | T_GFX1030 | T_GFX1100;
    compile_set(&set);
#endif
}

/* The matrix-core variants the planner plans for AMD, with their resource
 * use; a spill anywhere fails. MFMA: the MI250X's plans for gfx90a, fp16
 * without options and bf16 with every option, plain and deterministic; the
 * MI300X's for gfx940 (the CDNA3 name ROCm 5.2 knows; the MI300X is
 * gfx942), bf16 without options: each instruction form on each CDNA
 * generation, fp16 and bf16 differing otherwise in their conversions only,
 * in about half the time of every plan for every target. WMMA: the RX 7900
 * XTX's plans for gfx1100, fp16 and bf16, with and without every option. */
FA_TEST(amd_mma_variants) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    if (!hipcc_works()) FA_SKIP("no HIP compiler (hipcc) runs here");
    static variant_set set;
    memset(&set, 0, sizeof set);
    fa_device_desc cdna2, cdna3, rdna3;
    if (!amd_matrix_devices(&cdna2, &cdna3, &rdna3)) return;
    static const fa_dtype both[] = {FA_DTYPE_F16, FA_DTYPE_BF16}, f16[] = {FA_DTYPE_F16}, bf16[] = {FA_DTYPE_BF16};
    const struct {
        const fa_device_desc *dev;
        unsigned mask;
        const fa_dtype *plain; /* dtypes without options */
        int nplain, options;   /* options: bf16 with every option too */
    } runs[] = {{&cdna2, T_GFX90A, f16, 1, 1}, {&cdna3, T_GFX940, bf16, 1, 0}, {&rdna3, T_GFX1100, both, 2, 1}};
    for (size_t i = 0; i < FA_ARRAY_SIZE(runs); i++) {
        mma_amd_sweep w = {&set, runs[i].dev, runs[i].mask};
        const int before = set.count;
        for_each_plan(runs[i].dev, runs[i].plain, runs[i].nplain, 0, 0, add_amd_mma_plan, &w);
        if (runs[i].options) for_each_plan(runs[i].dev, bf16, 1, 1, 2, add_amd_mma_plan, &w);
        CHECK_MSG(set.count > before, "no matrix-core plan for %s (%s)", runs[i].dev->name, runs[i].dev->arch);
    }
    compile_set(&set);
#endif
}

#ifdef FA_WITH_HIP
/* ------------------------------------------------------------------------ */
/* Score options (softcap, ALiBi, bias): programs the planner's plans get   */
/* with them, a representative set rather than every plan.                  */

/* Each option alone, and all three together with the masks and dropout
 * (the most registers a logit takes: causal, window, block mask). */
typedef struct score_case {
    const char *label;
    int softcap, alibi, bias_f32, bias_own, masks;
} score_case;

static const score_case score_cases[] = {
    {"softcap", 1, 0, 0, 0, 0},
    {"alibi", 0, 1, 0, 0, 0},
    {"bias f32", 0, 0, 1, 0, 0},
    {"bias", 0, 0, 0, 1, 0},
    {"all3 masks drop", 1, 1, 0, 1, 1},
};

static float score_slopes[64];

/* A training shape (forward and backward plans) or a decoding one (the
 * split-K forward), no varlen (a bias excludes it), with case c's options
 * in dtype dt at head_dim dim. */
static fa_attention_desc score_desc(const score_case *c, fa_dtype dt, int dim, int decode) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 2;
    d.seqlen_q = decode ? 4 : 2048;
    d.seqlen_k = decode ? 8192 : 2048;
    d.heads_q = d.heads_kv = 16;
    d.head_dim = dim;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt;
    for (int h = 0; h < 64; h++) score_slopes[h] = 1.0f / (float)(2 << (h % 8));
    if (c->softcap) d.softcap = 30.0f;
    if (c->alibi) d.alibi_slopes = score_slopes;
    if (c->bias_f32 || c->bias_own) {
        d.bias_batch = 1;
        d.bias_heads = d.heads_q;
        d.bias.dtype = c->bias_f32 ? FA_DTYPE_F32 : dt;
    }
    if (c->masks) {
        d.causal = 1;
        d.window_left = 256;
        d.window_right = 0;
        d.dropout_p = 0.1f;
        d.dropout_seed = 1;
        memset(block_mask_bytes, 1, sizeof block_mask_bytes);
        d.block_q = d.block_k = 64;
        d.block_mask = block_mask_bytes;
        d.block_mask_bytes = (size_t)((d.seqlen_q + 63) / 64) * (size_t)((d.seqlen_k + 63) / 64);
    }
    return d;
}

/* The variant add_variant appends (or merges into an equal program),
 * labelled with its score options. */
static void add_score_variant(variant_set *set, const fa_device_desc *dev, const fa_attention_desc *d,
                              const fa_kernel_plan *kp, fa_pass pass, int wave, int features, unsigned mask,
                              const char *label) {
    const int before = set->count;
    add_variant(set, dev, d, kp, pass, wave, features, mask);
    if (set->count > before) set->v[set->count - 1].options = label;
}

/* The cases a device's sweep takes: each option alone in one dtype and
 * head_dim (fp16 and bf16 in turn, dims[0] for the first two, dims[1] for
 * the others) where alone is set, and all three with the masks and dropout
 * in fp16 at dims[0] and bf16 at dims[1]. */
typedef struct score_pick {
    const score_case *c;
    fa_dtype dtype;
    int dim;
} score_pick;

static int score_picks(int alone, const int dims[2], score_pick *out) {
    int n = 0;
    for (size_t c = 0; c < FA_ARRAY_SIZE(score_cases); c++) {
        if (score_cases[c].masks) {
            out[n++] = (score_pick){&score_cases[c], FA_DTYPE_F16, dims[0]};
            out[n++] = (score_pick){&score_cases[c], FA_DTYPE_BF16, dims[1]};
        } else if (alone) {
            out[n++] = (score_pick){&score_cases[c], c % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F16, dims[c / 2 ? 1 : 0]};
        }
    }
    return n;
}

/* The score-option programs of a device's plans for targets mask: mma,
 * the matrix-core kernels (forward, and with mma_bwd the backward with
 * atomics and the deterministic one), else the SIMT ones (forward,
 * backward, and the split-K forward of a decoding shape). */
static void add_score_programs(variant_set *set, const fa_device_desc *dev, int mma, int mma_bwd, unsigned mask,
                               int alone, const int dims[2]) {
    score_pick picks[FA_ARRAY_SIZE(score_cases) + 1];
    const int n = score_picks(alone, dims, picks);
    for (int i = 0; i < n; i++) {
        const score_pick *pk = &picks[i];
        /* SIMT: training, then decoding; mma: training, then deterministic. */
        for (int kind = 0; kind < 2; kind++) {
            fa_attention_desc d = score_desc(pk->c, pk->dtype, pk->dim, !mma && kind == 1);
            d.deterministic = mma && kind == 1;
            fa_plan_info info;
            fa_status st = fa_plan_for_device(dev, &d, &info);
            CHECK_MSG(st == FA_SUCCESS, "planning %s for %s: %s", pk->c->label, dev->name, fa_last_error());
            if (st != FA_SUCCESS) continue;
            const fa_variant fwd = mma ? FA_VARIANT_MMA : kind ? FA_VARIANT_SPLITK : FA_VARIANT_SIMT;
            const fa_variant bwd = mma ? FA_VARIANT_MMA : FA_VARIANT_SIMT;
            const int features = d.deterministic ? 2 : pk->c->masks;
            const int want_bwd = mma ? mma_bwd : kind == 0;
            CHECK_MSG(info.forward.variant == fwd && (!want_bwd || info.backward.variant == bwd),
                      "%s %s d%d on %s: planned %s / %s", pk->c->label, fa_dtype_name(pk->dtype), pk->dim, dev->name,
                      fa_variant_name(info.forward.variant), fa_variant_name(info.backward.variant));
            if (info.forward.variant == fwd)
                add_score_variant(set, mma ? dev : NULL, &d, &info.forward, FA_PASS_FORWARD, dev->simd_width,
                                  features, mask, pk->c->label);
            if (want_bwd && info.backward.variant == bwd)
                add_score_variant(set, mma ? dev : NULL, &d, &info.backward, FA_PASS_BACKWARD, dev->simd_width,
                                  features, mask, pk->c->label);
        }
    }
}

/* A matrix-core tile the planner does not choose, for its layer: tr x tc
 * picks the layer (mma_frag.h's geometry), stages 1. */
static void add_forced_mma(variant_set *set, const fa_device_desc *dev, const fa_attention_desc *d, fa_pass pass,
                           int br, int bc, int tr, int tc, unsigned mask, const char *label) {
    fa_hip_mma_geometry g;
    CHECK_MSG(fa_hip_mma_geometry_of(dev, d, pass, br, bc, tr, tc, &g), "%s: no %s geometry %dx%d/%dx%d at d%d",
              label, pass ? "backward" : "forward", br, bc, tr, tc, d->head_dim);
    fa_kernel_plan kp;
    memset(&kp, 0, sizeof kp);
    kp.variant = FA_VARIANT_MMA;
    kp.br = br;
    kp.bc = bc;
    kp.thread_rows = tr;
    kp.thread_cols = tc;
    kp.work_group_size = g.warps * fa_hip_mma_layer_get(g.layer)->lanes;
    kp.split_k = 1;
    kp.stages = 1;
    kp.local_mem_bytes = fa_hip_mma_local_mem(dev, d, pass, &kp);
    add_score_variant(set, dev, d, &kp, pass, dev->simd_width, d->deterministic ? 2 : 1, mask, label);
}
#endif

/* The score options (softcap, ALiBi, bias) in every kernel family, a spill
 * anywhere failing. Each option alone and all three with the masks and
 * dropout: the SIMT forward, backward and split-K forward of the MI250X's
 * plans (its matrix cores set aside) for gfx90a, and the matrix-core
 * forward, backward and deterministic backward of its plans (MFMA 16x16)
 * for gfx90a, at head_dim 64 and 128; all three only (the most registers)
 * on the RX 6800 XT's SIMT plans for gfx1030 (wave32), on a 32x32 MFMA
 * tile (which the planner does not choose) for gfx90a, and on the RX 7900
 * XTX's WMMA forward plans for gfx1100 (head_dim 32, the only one the
 * planner gives WMMA; its backward plans are SIMT). 47 compiles. */
FA_TEST(amd_score_options) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    if (!hipcc_works()) FA_SKIP("no HIP compiler (hipcc) runs here");
    static variant_set set;
    memset(&set, 0, sizeof set);
    const fa_described_device *mi = fa_described_device_find("mi250x");
    CHECK(mi != NULL);
    if (!mi) return;
    fa_device_desc mi_simt = mi->desc;
    mi_simt.matrix_flops_per_clock_cu = 0.0;
    const fa_device_desc rdna = gfx1030_device(), rdna3 = gfx1100_device();
    static const int d64_128[2] = {64, 128}, d32[2] = {32, 32};
    add_score_programs(&set, &mi_simt, 0, 0, T_GFX90A, 1, d64_128);
    add_score_programs(&set, &rdna, 0, 0, T_GFX1030, 0, d64_128);
    add_score_programs(&set, &mi->desc, 1, 1, T_GFX90A, 1, d64_128);
    /* The RX 7900 XTX's backward plans are SIMT. */
    add_score_programs(&set, &rdna3, 1, 0, T_GFX1100, 0, d32);
    /* MFMA 32x32: two wavefronts of one strip, 64 keys a tile. */
    const score_case *all = &score_cases[FA_ARRAY_SIZE(score_cases) - 1];
    fa_attention_desc d = score_desc(all, FA_DTYPE_F16, 64, 0);
    add_forced_mma(&set, &mi->desc, &d, FA_PASS_FORWARD, 64, 64, 1, 32, T_GFX90A, "all3 masks drop mfma32");
    add_forced_mma(&set, &mi->desc, &d, FA_PASS_BACKWARD, 64, 64, 32, 1, T_GFX90A, "all3 masks drop mfma32");
    d.deterministic = 1;
    add_forced_mma(&set, &mi->desc, &d, FA_PASS_BACKWARD, 64, 64, 32, 1, T_GFX90A, "all3 masks drop mfma32");
    compile_set(&set);
#endif
}

#ifdef FA_WITH_HIP
/* ------------------------------------------------------------------------ */
/* KV-cache steps (kernels_hip/kvcache.hip): the planner's packed-row SIMT  */
/* tiles for decoding shapes with every cache option, and the tiles the     */
/* device test forces.                                                      */

typedef struct kv_compile_case {
    const char *label;
    fa_test_kv_shape shape; /* dtype, dim, group, seqlen_q, seqlen_k, batch, page_size, seqlen_new,
                               rotary_dim, interleaved, softcap, alibi, causal, window */
    int br, bc, tr, tc, split; /* br 0: the planner's tile and splits */
} kv_compile_case;

#define KV_F16 FA_DTYPE_F16
#define KV_BF16 FA_DTYPE_BF16
#define KV_F32 FA_DTYPE_F32
/* Every build option at least twice (PAGED at 16, 48, 64 and 256; APPEND;
 * ROTARY_DIM half-split and interleaved, partial and whole; SOFTCAP; ALIBI;
 * CAUSAL; WINDOW; SPLITK and not), each dtype, head dims 32 to 256 and
 * ones that are not multiples of 16; batch 1 splits the keys, batch 64
 * does not. The last four are tests/test_kvcache.c's forced tiles. */
static const kv_compile_case kv_compile_cases[] = {
    {"kv fp16 d128 g4 paged 64 append", {KV_F16, 128, 4, 1, 8192, 1, 64, 1, 0, 0, 0, 0, 0, 0}, 0, 0, 0, 0, 0},
    {"kv bf16 d64 g8 contiguous append rotary 64 causal", {KV_BF16, 64, 8, 1, 8192, 64, 0, 1, 64, 0, 0, 0, 1, 0}, 0, 0,
     0, 0, 0},
    {"kv fp32 d128 g1 contiguous", {KV_F32, 128, 1, 1, 8192, 64, 0, 0, 0, 0, 0, 0, 0, 0}, 0, 0, 0, 0, 0},
    {"kv fp16 d256 g8 paged 256 rotary 128 il softcap alibi", {KV_F16, 256, 8, 1, 8192, 1, 256, 0, 128, 1, 1, 1, 0, 0},
     0, 0, 0, 0, 0},
    {"kv bf16 d96 g2 sq4 paged 16 append rotary 32 causal window",
     {KV_BF16, 96, 2, 4, 8192, 1, 16, 4, 32, 0, 0, 0, 1, 1}, 0, 0, 0, 0, 0},
    {"kv fp16 d40 g4 sq2 paged 16 everything", {KV_F16, 40, 4, 2, 8192, 1, 16, 2, 24, 1, 1, 1, 1, 1}, 0, 0, 0, 0, 0},
    {"kv fp32 d64 g4 sq2 paged 48 append softcap causal", {KV_F32, 64, 4, 2, 8192, 64, 48, 2, 0, 0, 1, 0, 1, 0}, 0, 0,
     0, 0, 0},
    {"kv bf16 d72 g2 contiguous append rotary 72 alibi", {KV_BF16, 72, 2, 1, 8192, 1, 0, 1, 72, 0, 0, 1, 0, 0}, 0, 0,
     0, 0, 0},
    {"kv fp16 d64 g8 sq3 forced 8x16/2x2 causal", {KV_F16, 64, 8, 3, 8192, 2, 0, 3, 0, 0, 0, 0, 1, 0}, 8, 16, 2, 2, 1},
    {"kv bf16 d64 g3 sq5 forced 8x32/4x4 window paged 16 split 3", {KV_BF16, 64, 3, 5, 8192, 2, 16, 2, 0, 0, 0, 0, 0, 1},
     8, 32, 4, 4, 3},
    {"kv fp32 d64 g4 forced 32x64/8x8 alibi", {KV_F32, 64, 4, 1, 8192, 2, 0, 1, 0, 0, 0, 1, 0, 0}, 32, 64, 8, 8, 1},
    {"kv fp16 d40 g8 sq3 forced 16x16/1x1 rotary 40 split 4", {KV_F16, 40, 8, 3, 8192, 1, 0, 3, 40, 0, 0, 0, 1, 0}, 16,
     16, 1, 1, 4},
};

static float kv_slopes[64];

static fa_attention_desc kv_compile_desc(const kv_compile_case *k) {
    for (size_t i = 0; i < FA_ARRAY_SIZE(kv_slopes); i++) kv_slopes[i] = 0.5f / (float)(i + 1);
    return fa_test_kv_desc(&k->shape, kv_slopes);
}

/* Case k's forward plan on dev: the planner's (a packed-row SIMT tile:
 * the HIP backend has no other KV-cache kernel), or the forced tile. */
static int kv_compile_plan(const fa_device_desc *dev, const kv_compile_case *k, fa_attention_desc *d,
                           fa_kernel_plan *kp) {
    *d = kv_compile_desc(k);
    fa_plan_info info;
    fa_status st = fa_plan_for_device(dev, d, &info);
    CHECK_MSG(st == FA_SUCCESS, "%s on %s: planning failed: %s", k->label, dev->arch, fa_last_error());
    if (st != FA_SUCCESS) return 0;
    CHECK_MSG(info.kv_cache && (info.forward.variant == FA_VARIANT_SIMT || info.forward.variant == FA_VARIANT_SPLITK),
              "%s on %s: planned %s", k->label, dev->arch, fa_variant_name(info.forward.variant));
    *kp = info.forward;
    if (k->br > 0) {
        kp->br = k->br;
        kp->bc = k->bc;
        kp->thread_rows = k->tr;
        kp->thread_cols = k->tc;
        kp->work_group_size = (k->br / k->tr) * (k->bc / k->tc);
        kp->split_k = k->split;
        kp->variant = k->split > 1 ? FA_VARIANT_SPLITK : FA_VARIANT_SIMT;
    }
    return 1;
}

/* The KV-cache programs of the cases on a device for targets mask. The
 * planner's count as main variants (scratch fails); the forced tiles,
 * which it never gives these devices, as optional ones (scratch is
 * reported: gfx1100 spills the 4 x 4 and 8 x 8 micro-tiles). */
static void add_kvcache_programs(variant_set *set, const fa_device_desc *dev, unsigned mask) {
    for (size_t i = 0; i < FA_ARRAY_SIZE(kv_compile_cases); i++) {
        const kv_compile_case *k = &kv_compile_cases[i];
        fa_attention_desc d;
        fa_kernel_plan kp;
        if (!kv_compile_plan(dev, k, &d, &kp)) continue;
        const int before = set->count;
        add_variant(set, dev, &d, &kp, FA_PASS_FORWARD, dev->simd_width, 1, mask);
        if (set->count == before) continue;
        variant *v = &set->v[set->count - 1];
        if (k->br > 0)
            v->name = k->label;
        else
            v->options = k->label;
    }
}

/* The cases' programs on the three AMD generations, compiled. */
static void compile_kvcache_sweep(void) {
    static variant_set set;
    memset(&set, 0, sizeof set);
    fa_device_desc devs[3];
    if (!amd_matrix_devices(&devs[0], &devs[1], &devs[2])) return;
    const unsigned masks[3] = {T_GFX90A, T_GFX940, T_GFX1100};
    for (int i = 0; i < 3; i++) add_kvcache_programs(&set, &devs[i], masks[i]);
    compile_set(&set);
}
#endif

/* The KV-cache step's kernels (kernels_hip/kvcache.hip, with splitk.hip's
 * merge) for every cache option, as the planner tiles them for the MI250X
 * (gfx90a), the MI300X (gfx940, the CDNA3 name ROCm 5.2 knows) and the RX
 * 7900 XTX (gfx1100, wave32), and the device test's forced tiles: a
 * compile error, a spill (scratch) in a planned variant, or static local
 * memory in the attention (its tiles are dynamic, fa_plan_local_mem's
 * size) fails. */
FA_TEST(amd_kvcache_variants) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    if (!hipcc_works()) FA_SKIP("no HIP compiler (hipcc) runs here");
    compile_kvcache_sweep();
#endif
}

#ifdef FA_WITH_HIP
static fa_attention_desc small_desc(fa_dtype dt, int dim) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 1;
    d.seqlen_q = d.seqlen_k = 256;
    d.heads_q = d.heads_kv = 2;
    d.head_dim = dim;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = dt;
    return d;
}

static fa_kernel_plan tile(int br, int bc, int tr, int tc) {
    fa_kernel_plan kp;
    memset(&kp, 0, sizeof kp);
    kp.variant = FA_VARIANT_SIMT;
    kp.br = br;
    kp.bc = bc;
    kp.thread_rows = tr;
    kp.thread_cols = tc;
    kp.work_group_size = (br / tr) * (bc / tc);
    kp.split_k = 1;
    kp.stages = 1;
    return kp;
}

/* Compiles a program with the runtime path and checks the code object
 * holds its kernels, built for a wavefront of wave lanes (AMD code
 * objects); hands the code to the caller where code is not NULL. */
static void rtc_program(const char *arch, const fa_hip_program *prog, int wave, int is_elf) {
    void *code = NULL;
    size_t size = 0;
    fa_status st = fa_hip_compile(arch, prog, &code, &size);
    CHECK_MSG(st == FA_SUCCESS, "hiprtc for %s: %s", arch, fa_last_error());
    if (st != FA_SUCCESS) return;
    CHECK_MSG(size > 64 && (!is_elf || memcmp(code, "\177ELF", 4) == 0), "%s: %zu bytes, not a code object", arch,
              size);
    if (is_elf) {
        kernel_usage k[MAX_KERNELS];
        int n = read_code_object(code, size, k, MAX_KERNELS);
        CHECK_MSG(n == prog->kernel_count, "%s: %d kernels in the code object, %d expected", arch, n,
                  prog->kernel_count);
        for (int i = 0; i < n; i++) {
            int listed = 0;
            for (int j = 0; j < prog->kernel_count; j++) listed |= strcmp(k[i].name, prog->kernels[j]) == 0;
            CHECK_MSG(listed, "%s: unexpected kernel %s", arch, k[i].name);
            CHECK_MSG(k[i].wave == wave, "%s: %s built for wavefront %ld, not %d", arch, k[i].name, k[i].wave, wave);
        }
    } else {
        for (int j = 0; j < prog->kernel_count; j++) {
            const char *name = prog->kernels[j];
            size_t len = strlen(name);
            int seen = 0;
            for (size_t at = 0; at + len <= size && !seen; at++) seen = memcmp((const char *)code + at, name, len) == 0;
            CHECK_MSG(seen, "%s: kernel %s not in the code", arch, name);
        }
    }
    free(code);
}

static void rtc_sample(const char *arch, const fa_attention_desc *d, const fa_kernel_plan *kp, fa_pass pass,
                       int wave, int is_elf) {
    fa_hip_program prog;
    CHECK_OK(fa_hip_program_for(d, kp, pass, wave, &prog));
    rtc_program(arch, &prog, wave, is_elf);
}
#endif

/* hiprtc, as the backend calls it at run time: a sample of programs for
 * the AMD targets whose code objects hiprtc of ROCm 5.2 produces (its
 * gfx940 support aborts; hipcc covers gfx940 above), and a compile error
 * that reaches the caller with the compiler's log. */
FA_TEST(hiprtc_runtime_path) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    /* The AMD runtime's hiprtc, not the NVIDIA mapping's. */
    setenv("FLASHATTN_HIP_LIBRARY", "libamdhip64.so", 1);
    setenv("FLASHATTN_CACHE_DIR", "off", 1);
    fa_hip_program probe;
    fa_attention_desc d = small_desc(FA_DTYPE_F16, 64);
    fa_kernel_plan kp = tile(32, 32, 2, 2);
    CHECK_OK(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 64, &probe));
    void *code = NULL;
    size_t size = 0;
    fa_status st = fa_hip_compile("gfx90a", &probe, &code, &size);
    free(code);
    if (st == FA_ERR_BACKEND_UNAVAILABLE) FA_SKIP("no hiprtc here (libamdhip64 or libhiprtc)");
    CHECK_MSG(st == FA_SUCCESS, "hiprtc: %s", fa_last_error());

    rtc_sample("gfx908", &d, &kp, FA_PASS_BACKWARD, 64, 1);
    d = small_desc(FA_DTYPE_BF16, 128);
    d.causal = 1;
    d.dropout_p = 0.2f;
    kp = tile(16, 32, 1, 1);
    rtc_sample("gfx90a", &d, &kp, FA_PASS_BACKWARD, 64, 1);
    kp = tile(64, 16, 1, 1);
    rtc_sample("gfx1030", &d, &kp, FA_PASS_FORWARD, 32, 1);
    /* Every score option, as hiprtc builds them at run time. */
    static const float slopes[2] = {0.5f, 0.25f};
    d.softcap = 30.0f;
    d.alibi_slopes = slopes;
    d.bias_batch = 1;
    d.bias_heads = d.heads_q;
    d.bias.dtype = FA_DTYPE_F32;
    rtc_sample("gfx1030", &d, &kp, FA_PASS_FORWARD, 32, 1);
    kp = tile(16, 32, 1, 1);
    d.bias.dtype = FA_DTYPE_BF16;
    rtc_sample("gfx90a", &d, &kp, FA_PASS_BACKWARD, 64, 1);
    /* A KV-cache step with every option and split keys. */
    fa_attention_desc kd = kv_compile_desc(&kv_compile_cases[5]);
    kp = tile(16, 16, 1, 1);
    kp.variant = FA_VARIANT_SPLITK;
    kp.split_k = 2;
    rtc_sample("gfx90a", &kd, &kp, FA_PASS_FORWARD, 64, 1);
    /* The ring's element-wise passes: one program for every target. */
    fa_hip_program rows;
    fa_hip_rows_program(&rows);
    rtc_program("gfx90a", &rows, 64, 1);
    rtc_program("gfx1030", &rows, 32, 1);

    /* Without WAVE the source stops at its #error: FA_ERR_COMPILE, with the
     * compiler's words in the message. */
    fa_hip_program broken = probe;
    int w = 0;
    for (int i = 0; i < broken.define_count; i++)
        if (strncmp(broken.defines[i], "-DWAVE=", 7) != 0) memcpy(broken.defines[w++], broken.defines[i], FA_HIP_DEFINE_SIZE);
    broken.define_count = w;
    code = NULL;
    st = fa_hip_compile("gfx90a", &broken, &code, &size);
    free(code);
    CHECK_STATUS(st, FA_ERR_COMPILE);
    CHECK_MSG(strstr(fa_last_error(), "WAVE") != NULL, "the compile log is missing: %s", fa_last_error());
#endif
}

/* The NVIDIA mapping's hiprtc (NVRTC) on the same programs, prelude
 * included: needs the mapping library of an FA_HIP_NVIDIA build and the
 * CUDA toolkit's NVRTC, not a GPU. */
FA_TEST(nvidia_mapping_compiles) {
#if !defined(FA_WITH_HIP) || !defined(FA_HIP_ON_CUDA_LIBRARY)
    FA_SKIP("the HIP-on-CUDA mapping is not built (FA_HIP_NVIDIA=OFF)");
#else
    setenv("FLASHATTN_HIP_LIBRARY", FA_HIP_ON_CUDA_LIBRARY, 1);
    setenv("FLASHATTN_CACHE_DIR", "off", 1);
    fa_attention_desc d = small_desc(FA_DTYPE_F16, 64);
    fa_kernel_plan kp = tile(32, 32, 2, 2);
    fa_hip_program prog;
    CHECK_OK(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 32, &prog));
    void *code = NULL;
    size_t size = 0;
    fa_status st = fa_hip_compile("sm_90", &prog, &code, &size);
    free(code);
    if (st == FA_ERR_BACKEND_UNAVAILABLE || (st == FA_ERR_COMPILE && strstr(fa_last_error(), "NVRTC not found")))
        FA_SKIP("no NVRTC here");
    CHECK_MSG(st == FA_SUCCESS, "NVRTC through the mapping: %s", fa_last_error());
    const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        d = small_desc(dts[i], 128);
        d.causal = 1;
        d.dropout_p = 0.1f;
        d.window_left = 30;
        /* Within CUDA's 48 KiB of static shared memory at head_dim 128. */
        kp = tile(8, 32, 1, 2);
        rtc_sample("sm_80", &d, &kp, FA_PASS_BACKWARD, 32, 0);
        kp.variant = FA_VARIANT_SPLITK;
        kp.split_k = 4;
        rtc_sample("sm_90", &d, &kp, FA_PASS_FORWARD, 32, 0);
    }
    /* The ring's element-wise passes, without a stack frame where the
     * CUBIN can be read. */
    fa_hip_program rows;
    fa_hip_rows_program(&rows);
    static const char *const archs[] = {"sm_80", "sm_90"};
    for (size_t a = 0; a < FA_ARRAY_SIZE(archs); a++) {
        code = NULL;
        st = fa_hip_compile(archs[a], &rows, &code, &size);
        CHECK_MSG(st == FA_SUCCESS, "the rows program through the mapping for %s: %s", archs[a], fa_last_error());
#ifdef FA_WITH_CUDA
        for (int k = 0; k < rows.kernel_count && st == FA_SUCCESS; k++) {
            int regs = -1, frame = -1;
            CHECK_MSG(fa_cubin_kernel_resources(code, size, rows.kernels[k], &regs, &frame) == 0 && frame == 0,
                      "%s %s: %d registers, a %d-byte stack frame", archs[a], rows.kernels[k], regs, frame);
        }
#endif
        free(code);
    }
    /* An AMD architecture is refused by the mapping, with a reason. */
    code = NULL;
    st = fa_hip_compile("gfx90a", &prog, &code, &size);
    free(code);
    CHECK_STATUS(st, FA_ERR_COMPILE);
    CHECK_MSG(strstr(fa_last_error(), "gfx90a") != NULL, "no reason given: %s", fa_last_error());
#endif
}

/* Why the sweeps through the NVIDIA mapping cannot run in this build
 * (undefined: they can). */
#if !defined(FA_WITH_HIP) || !defined(FA_HIP_ON_CUDA_LIBRARY)
#define NVIDIA_MAPPING_MISSING "the HIP-on-CUDA mapping is not built (FA_HIP_NVIDIA=OFF)"
#elif !defined(FA_WITH_CUDA)
#define NVIDIA_MAPPING_MISSING "the CUDA backend (its CUBIN reader) is not built into this library"
#endif

#if defined(FA_WITH_HIP) && defined(FA_HIP_ON_CUDA_LIBRARY) && defined(FA_WITH_CUDA)
/* An NVIDIA GPU as the HIP backend sees it through the mapping
 * (backends/hip_nvidia/): the described H100 (or an A100 for sm_80) with
 * its opt-in shared memory a block (227 KiB, 163 KiB on the A100: the
 * matrix-core kernels' dynamic tiles), its architecture sm_XY and the
 * tensor-core rate hip_backend.c gives it. */
static fa_device_desc nvidia_through_mapping(int sm) {
    fa_device_desc d = fa_described_device_find("h100")->desc;
    d.backend = FA_BACKEND_HIP;
    d.local_mem_bytes = 227 * 1024;
    snprintf(d.arch, sizeof d.arch, "sm_%d", sm);
    if (sm < 90) {
        d.local_mem_bytes = 163 * 1024;
        d.compute_units = 108;
        d.clock_mhz = 1410;
        d.bandwidth_gbs = 1555.0;
        d.matrix_flops_per_clock_cu = 2048.0;
    }
    return d;
}

typedef struct mma_job {
    char arch[32];
    char label[112];
    fa_hip_program prog;
    fa_status status;
    char error[400];
    int regs[3], frame[3];
} mma_job;

#define MAX_MMA_JOBS 256

typedef struct mma_pool {
    mma_job *jobs;
    int count, next;
    pthread_mutex_t lock;
} mma_pool;

static void *mma_worker(void *arg) {
    mma_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        const int i = p->next < p->count ? p->next++ : -1;
        pthread_mutex_unlock(&p->lock);
        if (i < 0) return NULL;
        mma_job *j = &p->jobs[i];
        void *code = NULL;
        size_t size = 0;
        j->status = fa_hip_compile(j->arch, &j->prog, &code, &size);
        if (j->status != FA_SUCCESS) {
            snprintf(j->error, sizeof j->error, "%s", fa_last_error());
            continue;
        }
        for (int k = 0; k < j->prog.kernel_count; k++)
            if (fa_cubin_kernel_resources(code, size, j->prog.kernels[k], &j->regs[k], &j->frame[k]) != 0)
                j->regs[k] = j->frame[k] = -1;
        free(code);
    }
}

typedef struct mma_sweep {
    const fa_device_desc *dev;
    mma_job *jobs;
    int *count;
} mma_sweep;

/* One job per distinct matrix-core program of a plan. */
static void add_mma_plan(void *user, const fa_attention_desc *d, const fa_plan_info *info, int features) {
    const mma_sweep *w = user;
    const fa_kernel_plan *kp[2] = {&info->forward, &info->backward};
    for (int pass = 0; pass < 2; pass++) {
        if (kp[pass]->variant != FA_VARIANT_MMA) continue;
        mma_job j;
        memset(&j, 0, sizeof j);
        fa_status st = fa_hip_program_for_device(w->dev, d, kp[pass], (fa_pass)pass, &j.prog);
        CHECK_MSG(st == FA_SUCCESS, "no program for a planned %s tile: %s", pass ? "backward" : "forward",
                  fa_last_error());
        if (st != FA_SUCCESS) continue;
        snprintf(j.arch, sizeof j.arch, "%s", w->dev->arch);
        int dup = 0;
        for (int k = 0; k < *w->count && !dup; k++)
            dup = strcmp(w->jobs[k].arch, j.arch) == 0 && same_program(&w->jobs[k].prog, &j.prog);
        if (dup) continue;
        CHECK_MSG(*w->count < MAX_MMA_JOBS, "more than %d matrix-core programs", MAX_MMA_JOBS);
        if (*w->count >= MAX_MMA_JOBS) return;
        snprintf(j.label, sizeof j.label, "%s %-4s d%-3d %3dx%-3d %2dx%-2d wg%-4d %s", pass ? "bwd" : "fwd",
                 fa_dtype_name(d->q.dtype), d->head_dim, kp[pass]->br, kp[pass]->bc, kp[pass]->thread_rows,
                 kp[pass]->thread_cols, kp[pass]->work_group_size,
                 features == 0 ? "-" : features == 1 ? "all" : "all det");
        w->jobs[(*w->count)++] = j;
    }
}

/* The matrix-core programs of a device's plans (for_each_plan). */
static void enumerate_mma(const fa_device_desc *dev, const fa_dtype *dtypes, int ndtypes, int first, int last,
                          mma_job *jobs, int *count) {
    mma_sweep w = {dev, jobs, count};
    for_each_plan(dev, dtypes, ndtypes, first, last, add_mma_plan, &w);
}

/* Compiles the jobs through the mapping's hiprtc (NVRTC), a few threads at
 * a time, prints their registers and stack frames, and fails on a compile
 * error or a frame (spilled registers); 0 where no NVRTC runs here. */
static int nvrtc_jobs(mma_job *jobs, int count) {
    void *code = NULL;
    size_t size = 0;
    fa_status st = fa_hip_compile(jobs[0].arch, &jobs[0].prog, &code, &size);
    free(code);
    if (st == FA_ERR_BACKEND_UNAVAILABLE || (st == FA_ERR_COMPILE && strstr(fa_last_error(), "NVRTC not found")))
        return 0;

    mma_pool pool = {jobs, count, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t tid[8];
    const int threads = cpu_count() < 8 ? cpu_count() : 8;
    int started = 0;
    time_t t0 = time(NULL);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&tid[started], NULL, mma_worker, &pool) == 0) started++;
    if (started == 0) mma_worker(&pool);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    fprintf(stderr, "%d programs compiled by NVRTC in %ld s\n", count, (long)(time(NULL) - t0));

    printf("%-52s %-6s %s\n", "program (pass dtype dim tile micro-tile wg features)", "arch", "kernel: registers/frame");
    int failed = 0, spilled = 0;
    for (int i = 0; i < count; i++) {
        const mma_job *j = &jobs[i];
        if (j->status != FA_SUCCESS) {
            failed++;
            printf("%-52s %-6s FAILED: %.300s\n", j->label, j->arch, j->error);
            continue;
        }
        printf("%-52s %-6s", j->label, j->arch);
        for (int k = 0; k < j->prog.kernel_count; k++) {
            printf(" %s: %d/%d", j->prog.kernels[k] + 3, j->regs[k], j->frame[k]);
            if (j->regs[k] < 0 || j->frame[k] != 0) spilled++;
        }
        printf("\n");
    }
    printf("%d programs, %d failed, %d kernels with a stack frame or unreadable\n", count, failed, spilled);
    CHECK_MSG(failed == 0, "%d programs failed to compile", failed);
    CHECK_MSG(spilled == 0, "%d kernels spill registers (or their CUBIN was unreadable)", spilled);
    return 1;
}

/* The mapping's NVRTC, the kernel cache off so that every program
 * compiles; the jobs array the sweeps fill, one at a time. */
static mma_job *mapping_jobs(void) {
    static mma_job jobs[MAX_MMA_JOBS];
    setenv("FLASHATTN_HIP_LIBRARY", FA_HIP_ON_CUDA_LIBRARY, 1);
    setenv("FLASHATTN_CACHE_DIR", "off", 1);
    memset(jobs, 0, sizeof jobs);
    return jobs;
}

/* Compiles a sweep's jobs (nvrtc_jobs), what naming its programs; skips
 * where no NVRTC runs here. */
static void compile_nvidia_jobs(mma_job *jobs, int count, const char *what) {
    CHECK_MSG(count > 0, "no %s program for NVIDIA through the mapping", what);
    if (count == 0) return;
    if (!nvrtc_jobs(jobs, count)) FA_SKIP("no NVRTC here");
}

/* One job for a plan's program, labelled with its score options. */
static void add_score_job(const fa_device_desc *dev, const fa_attention_desc *d, const fa_kernel_plan *kp,
                          fa_pass pass, const char *label, mma_job *jobs, int *count) {
    CHECK_MSG(*count < MAX_MMA_JOBS, "more than %d NVRTC programs", MAX_MMA_JOBS);
    if (*count >= MAX_MMA_JOBS) return;
    mma_job *j = &jobs[*count];
    memset(j, 0, sizeof *j);
    fa_status st = fa_hip_program_for_device(dev, d, kp, pass, &j->prog);
    CHECK_MSG(st == FA_SUCCESS, "no program for a planned %s tile: %s", pass ? "backward" : "forward", fa_last_error());
    if (st != FA_SUCCESS) return;
    snprintf(j->arch, sizeof j->arch, "%s", dev->arch);
    snprintf(j->label, sizeof j->label, "%s %-4s d%-3d %3dx%-3d %2dx%-2d %s",
             pass ? (kp->variant == FA_VARIANT_MMA ? (d->deterministic ? "bwddet" : "bwdmma") : "bwd")
                  : (kp->variant == FA_VARIANT_MMA ? "fwdmma" : kp->variant == FA_VARIANT_SPLITK ? "splitk" : "fwd"),
             fa_dtype_name(d->q.dtype), d->head_dim, kp->br, kp->bc, kp->thread_rows, kp->thread_cols, label);
    for (int k = 0; k < *count; k++)
        if (strcmp(jobs[k].arch, j->arch) == 0 && same_program(&jobs[k].prog, &j->prog)) return;
    (*count)++;
}

/* The score-option picks (amd_score_options' cases) on an NVIDIA device
 * through the mapping: mma, its matrix-core plans (forward, backward,
 * deterministic backward), else its SIMT ones (forward, backward, the
 * split-K forward of a decoding shape). */
static void add_nvidia_score_jobs(const fa_device_desc *dev, int mma, mma_job *jobs, int *count) {
    static const int dims[2] = {64, 128};
    score_pick picks[FA_ARRAY_SIZE(score_cases) + 1];
    const int n = score_picks(1, dims, picks);
    for (int i = 0; i < n; i++)
        for (int kind = 0; kind < 2; kind++) {
            fa_attention_desc d = score_desc(picks[i].c, picks[i].dtype, picks[i].dim, !mma && kind == 1);
            d.deterministic = mma && kind == 1;
            fa_plan_info info;
            fa_status st = fa_plan_for_device(dev, &d, &info);
            CHECK_MSG(st == FA_SUCCESS, "planning %s for %s: %s", picks[i].c->label, dev->name, fa_last_error());
            if (st != FA_SUCCESS) continue;
            const fa_variant fwd = mma ? FA_VARIANT_MMA : kind ? FA_VARIANT_SPLITK : FA_VARIANT_SIMT;
            const fa_variant bwd = mma ? FA_VARIANT_MMA : FA_VARIANT_SIMT;
            const int want_bwd = mma || kind == 0;
            CHECK_MSG(info.forward.variant == fwd && (!want_bwd || info.backward.variant == bwd),
                      "%s %s d%d on %s: planned %s / %s", picks[i].c->label, fa_dtype_name(picks[i].dtype),
                      picks[i].dim, dev->arch, fa_variant_name(info.forward.variant),
                      fa_variant_name(info.backward.variant));
            if (info.forward.variant == fwd)
                add_score_job(dev, &d, &info.forward, FA_PASS_FORWARD, picks[i].c->label, jobs, count);
            if (want_bwd && info.backward.variant == bwd)
                add_score_job(dev, &d, &info.backward, FA_PASS_BACKWARD, picks[i].c->label, jobs, count);
        }
}

/* The KV-cache cases (amd_kvcache_variants') as an H100 (sm_90) and an
 * A100 (sm_80) seen through HIP get them. */
static void add_nvidia_kvcache_jobs(mma_job *jobs, int *count) {
    const fa_device_desc devs[] = {nvidia_through_mapping(90), nvidia_through_mapping(80)};
    for (size_t v = 0; v < FA_ARRAY_SIZE(devs); v++)
        for (size_t i = 0; i < FA_ARRAY_SIZE(kv_compile_cases); i++) {
            const kv_compile_case *k = &kv_compile_cases[i];
            fa_attention_desc d;
            fa_kernel_plan kp;
            if (kv_compile_plan(&devs[v], k, &d, &kp))
                add_score_job(&devs[v], &d, &kp, FA_PASS_FORWARD, k->label, jobs, count);
        }
}
#endif

/* The NVIDIA layer of the matrix-core kernels, as the GPU machine runs it:
 * the programs the planner makes for an H100 (sm_90) and an A100 (sm_80)
 * through the HIP-on-CUDA mapping compiled by NVRTC behind the prelude (the
 * mapping's hiprtc), registers and stack frame read from each kernel's
 * CUBIN; a frame (spilled registers) fails. sm_90 gets fp16 and bf16
 * without options and bf16 with every option (the two dtypes differ in
 * their conversions only), plain and deterministic; sm_80, whose code is
 * the same PTX, bf16 without options: a budget of minutes on two cores. */
FA_TEST(nvidia_mma_variants) {
#ifdef NVIDIA_MAPPING_MISSING
    FA_SKIP(NVIDIA_MAPPING_MISSING);
#else
    mma_job *jobs = mapping_jobs();
    int count = 0;
    const fa_device_desc devs[] = {nvidia_through_mapping(90), nvidia_through_mapping(80)};
    static const fa_dtype both[] = {FA_DTYPE_F16, FA_DTYPE_BF16}, bf16[] = {FA_DTYPE_BF16};
    enumerate_mma(&devs[0], both, 2, 0, 0, jobs, &count);
    enumerate_mma(&devs[0], bf16, 1, 1, 2, jobs, &count);
    enumerate_mma(&devs[1], bf16, 1, 0, 0, jobs, &count);
    compile_nvidia_jobs(jobs, count, "matrix-core");
#endif
}

/* The score options on NVIDIA through the mapping, as amd_score_options
 * picks them (each alone, all three with the masks and dropout; fp16 and
 * bf16, head_dim 64 and 128): the H100's matrix-core plans (forward,
 * backward, deterministic backward) and its SIMT plans with the tensor
 * cores set aside (forward, backward, split-K forward), compiled by NVRTC
 * for sm_90; a stack frame (spilled registers) fails. */
FA_TEST(nvidia_score_options) {
#ifdef NVIDIA_MAPPING_MISSING
    FA_SKIP(NVIDIA_MAPPING_MISSING);
#else
    mma_job *jobs = mapping_jobs();
    int count = 0;
    const fa_device_desc h100 = nvidia_through_mapping(90);
    fa_device_desc simt = h100;
    simt.matrix_flops_per_clock_cu = 0.0;
    add_nvidia_score_jobs(&h100, 1, jobs, &count);
    add_nvidia_score_jobs(&simt, 0, jobs, &count);
    compile_nvidia_jobs(jobs, count, "score-option");
#endif
}

/* The KV-cache step on NVIDIA through the mapping: amd_kvcache_variants'
 * cases as the planner tiles them for an H100 (sm_90) and an A100 (sm_80)
 * seen through HIP, compiled by NVRTC behind the prelude; a stack frame
 * (spilled registers) fails. */
FA_TEST(nvidia_kvcache_variants) {
#ifdef NVIDIA_MAPPING_MISSING
    FA_SKIP(NVIDIA_MAPPING_MISSING);
#else
    mma_job *jobs = mapping_jobs();
    int count = 0;
    add_nvidia_kvcache_jobs(jobs, &count);
    compile_nvidia_jobs(jobs, count, "KV-cache");
#endif
}

/* Shapes the kernels cannot run are refused before any compile. */
FA_TEST(program_checks) {
#ifndef FA_WITH_HIP
    FA_SKIP("the HIP backend is not built into this library");
#else
    fa_attention_desc d = small_desc(FA_DTYPE_F32, 64);
    fa_hip_program prog;
    fa_kernel_plan kp = tile(16, 16, 4, 4);
    CHECK_OK(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 64, &prog));
    CHECK(prog.kernel_count == 1 && strcmp(prog.kernels[0], "fa_forward") == 0);
    int has_wave = 0;
    for (int i = 0; i < prog.define_count; i++) has_wave |= strcmp(prog.defines[i], "-DWAVE=64") == 0;
    CHECK_MSG(has_wave, "the wavefront width is not a build option");
    CHECK_OK(fa_hip_program_for(&d, &kp, FA_PASS_BACKWARD, 32, &prog));
    CHECK(prog.kernel_count == 3);
    kp.variant = FA_VARIANT_SPLITK;
    kp.split_k = 3;
    CHECK_OK(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 32, &prog));
    CHECK(prog.kernel_count == 2 && strcmp(prog.kernels[1], "fa_splitk_merge") == 0);
    kp = tile(16, 16, 3, 2);
    kp.work_group_size = 40;
    CHECK_STATUS(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 64, &prog), FA_ERR_INTERNAL);
    kp = tile(16, 16, 4, 4);
    kp.work_group_size = 7;
    CHECK_STATUS(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 64, &prog), FA_ERR_INTERNAL);
    kp = tile(16, 16, 4, 4);
    CHECK_STATUS(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 48, &prog), FA_ERR_INVALID_ARGUMENT);
    kp.variant = FA_VARIANT_MMA;
    CHECK_STATUS(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 64, &prog), FA_ERR_UNSUPPORTED);
    kp = tile(16, 16, 4, 4);
    d.head_dim = 260;
    CHECK_STATUS(fa_hip_program_for(&d, &kp, FA_PASS_FORWARD, 64, &prog), FA_ERR_UNSUPPORTED_HEAD_DIM);
    CHECK_STATUS(fa_hip_program_for(NULL, &kp, FA_PASS_FORWARD, 64, &prog), FA_ERR_NULL_POINTER);

    /* A KV-cache step: its kernels and options, forward only, the FP32
     * pipes only, pages the kernels take. */
    fa_attention_desc kd = kv_compile_desc(&kv_compile_cases[5]);
    kp = tile(16, 16, 1, 1);
    kp.variant = FA_VARIANT_SPLITK;
    kp.split_k = 2;
    CHECK_OK(fa_hip_program_for(&kd, &kp, FA_PASS_FORWARD, 64, &prog));
    CHECK(prog.kernel_count == 3 && strcmp(prog.kernels[0], "fa_kv_prepare") == 0 &&
          strcmp(prog.kernels[1], "fa_kv_attend") == 0 && strcmp(prog.kernels[2], "fa_splitk_merge") == 0);
    static const char *const kv_options[] = {"-DKV_CACHE", "-DPAGED=16", "-DAPPEND", "-DROTARY_DIM=24",
                                             "-DROTARY_INTERLEAVED", "-DSOFTCAP", "-DALIBI", "-DSPLITK"};
    for (size_t i = 0; i < FA_ARRAY_SIZE(kv_options); i++) {
        int seen = 0;
        for (int j = 0; j < prog.define_count; j++) seen += strcmp(prog.defines[j], kv_options[i]) == 0;
        CHECK_MSG(seen == 1, "%s appears %d times in the KV-cache program's options", kv_options[i], seen);
    }
    CHECK_STATUS(fa_hip_program_for(&kd, &kp, FA_PASS_BACKWARD, 64, &prog), FA_ERR_UNSUPPORTED);
    kp.variant = FA_VARIANT_MMA;
    const fa_device_desc *mi = &fa_described_device_find("mi250x")->desc;
    CHECK_STATUS(fa_hip_program_for_device(mi, &kd, &kp, FA_PASS_FORWARD, &prog), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "mma") != NULL, "message: %s", fa_last_error());
    kp = tile(16, 16, 1, 1);
    kd.page_size = 8;
    CHECK_STATUS(fa_hip_program_for(&kd, &kp, FA_PASS_FORWARD, 64, &prog), FA_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(fa_last_error(), "page_size") != NULL, "message: %s", fa_last_error());
    kd.page_size = 16;
    kd.k_new.stride_seq = 4 * 40 + 4; /* 8-byte rows */
    CHECK_STATUS(fa_hip_program_for(&kd, &kp, FA_PASS_FORWARD, 64, &prog), FA_ERR_MISALIGNED);
#endif
}

FA_TEST_MAIN(FA_CASE(amd_targets), FA_CASE(rows_amd_targets), FA_CASE(amd_mma_variants), FA_CASE(amd_score_options),
             FA_CASE(amd_kvcache_variants), FA_CASE(hiprtc_runtime_path), FA_CASE(nvidia_mapping_compiles),
             FA_CASE(nvidia_mma_variants), FA_CASE(nvidia_score_options), FA_CASE(nvidia_kvcache_variants),
             FA_CASE(program_checks))
