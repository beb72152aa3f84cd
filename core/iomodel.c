/* The IO model (GUIDE section 3): predicted HBM bytes, FLOPs and roofline
 * time of fused and of standard attention, after the FlashAttention paper's
 * analysis. Everything here is exact integer counting carried in doubles
 * (exact below 2^53), so the same problem always gives the same numbers.
 *
 * Masks are handled without ever walking the sq x sk score matrix: the
 * causal and sliding-window masks together are a diagonal band
 * lo <= j - i <= hi, whose cells inside a rectangle have a closed form, and
 * the block-sparse mask is walked block by block. */
#include "planner.h"

#include "desc.h"
#include "planner_cl_mma.h"
#include "planner_decode.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A band bound that never binds: beyond any |j - i| of a sequence. */
#define FA_BAND_OPEN INT64_C(0x100000000)

/* Key j is visible to query i (positions in one sequence) when
 * lo <= j - i <= hi; an absent bound is FA_BAND_OPEN in size. */
typedef struct band {
    int64_t lo, hi;
} band;

typedef struct block_mask {
    const uint8_t *bytes; /* NULL: no block mask */
    size_t size;
    int64_t block_q, block_k, stride;
} block_mask;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static double dtype_bytes(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4.0 : dtype == FA_DTYPE_FP8_E4M3 ? 1.0 : 2.0; }

static void seq_lengths(const fa_attention_desc *d, int b, int64_t *sq, int64_t *sk) {
    if (d->cu_seqlens_q && d->cu_seqlens_k) {
        *sq = max64(0, (int64_t)d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b]);
        *sk = max64(0, (int64_t)d->cu_seqlens_k[b + 1] - d->cu_seqlens_k[b]);
    } else {
        *sq = max64(0, d->seqlen_q);
        *sk = max64(0, d->seqlen_k);
    }
}

/* The header's mask rules with off = sk - sq: causal j <= i + off; window
 * i + off - left <= j <= i + off + right. */
static band seq_band(const fa_attention_desc *d, int64_t sq, int64_t sk) {
    int64_t off = sk - sq;
    band bd = {-FA_BAND_OPEN, FA_BAND_OPEN};
    if (d->causal) bd.hi = off;
    if (d->window_right >= 0) bd.hi = min64(bd.hi, off + d->window_right);
    if (d->window_left >= 0) bd.lo = off - d->window_left;
    return bd;
}

static block_mask get_block_mask(const fa_attention_desc *d) {
    block_mask bm = {NULL, 0, 1, 1, 0};
    if (!d->block_mask || d->block_q <= 0 || d->block_k <= 0) return bm;
    bm.bytes = d->block_mask;
    bm.size = d->block_mask_bytes;
    bm.block_q = d->block_q;
    bm.block_k = d->block_k;
    bm.stride = ceil_div(max64(1, d->seqlen_k), d->block_k);
    return bm;
}

/* A block past the end of a (mis-sized) mask counts as visible: the model
 * never reads outside the caller's bytes. */
static int block_on(const block_mask *bm, int64_t bi, int64_t bj) {
    int64_t index = bi * bm->stride + bj;
    if (index < 0 || (uint64_t)index >= (uint64_t)bm->size) return 1;
    return bm->bytes[index] != 0;
}

/* Sum over x in [x0, x0 + n) of clamp(x, 0, w). */
static int64_t sum_clamped(int64_t x0, int64_t n, int64_t w) {
    int64_t x1 = x0 + n, total = 0;
    int64_t a = max64(x0, 1), b = min64(x1, w + 1); /* the rising part, x in [a, b) */
    if (b > a) {
        /* One of the two factors is even; halve it first to stay in range. */
        int64_t count = b - a, first_plus_last = a + b - 1;
        total += count % 2 == 0 ? count / 2 * first_plus_last : first_plus_last / 2 * count;
    }
    int64_t c = max64(x0, w + 1); /* the flat part at w */
    if (x1 > c) total += (x1 - c) * w;
    return total;
}

/* Cells (i, j) of [r0, r1) x [c0, c1) with j - i <= t. */
static int64_t cells_below(int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t t) {
    return sum_clamped(r0 + t - c0 + 1, r1 - r0, c1 - c0);
}

/* Cells of [r0, r1) x [c0, c1) inside the band. */
static int64_t band_cells(const band *bd, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0 || bd->lo > bd->hi) return 0;
    int64_t upper = cells_below(r0, r1, c0, c1, bd->hi);
    int64_t lower = cells_below(r0, r1, c0, c1, bd->lo - 1);
    return max64(0, upper - lower);
}

static double seq_visible_cells(const fa_attention_desc *d, const block_mask *bm, int64_t sq, int64_t sk) {
    band bd = seq_band(d, sq, sk);
    if (!bm->bytes) return (double)band_cells(&bd, 0, sq, 0, sk);
    double total = 0.0;
    int64_t nbq = ceil_div(sq, bm->block_q), nbk = ceil_div(sk, bm->block_k);
    for (int64_t bi = 0; bi < nbq; bi++) {
        int64_t r0 = bi * bm->block_q, r1 = min64(sq, r0 + bm->block_q);
        for (int64_t bj = 0; bj < nbk; bj++) {
            if (!block_on(bm, bi, bj)) continue;
            int64_t c0 = bj * bm->block_k, c1 = min64(sk, c0 + bm->block_k);
            total += (double)band_cells(&bd, r0, r1, c0, c1);
        }
    }
    return total;
}

/* The batch's sequences as (sq, sk) shapes with multiplicities: every
 * sequence of a fixed-length batch has one shape, counted once; varlen
 * sequences one by one (the cu_seqlens the caller passed). */
typedef struct seq_iter {
    const fa_attention_desc *d;
    int next;
} seq_iter;

static int seq_next(seq_iter *it, int64_t *sq, int64_t *sk, double *count) {
    const fa_attention_desc *d = it->d;
    if (it->next >= d->batch) return 0;
    if (!(d->cu_seqlens_q && d->cu_seqlens_k)) {
        seq_lengths(d, 0, sq, sk);
        *count = (double)d->batch;
        it->next = d->batch;
        return 1;
    }
    seq_lengths(d, it->next++, sq, sk);
    *count = 1.0;
    return 1;
}

/* Visible cells and all cells of the score matrices, summed over the batch
 * (one head). */
static double visible_cells(const fa_attention_desc *d) {
    block_mask bm = get_block_mask(d);
    double visible = 0.0, count;
    int64_t sq, sk;
    seq_iter it = {d, 0};
    while (seq_next(&it, &sq, &sk, &count)) visible += count * seq_visible_cells(d, &bm, sq, sk);
    return visible;
}

double fa_score_cells(const fa_attention_desc *desc) {
    double all = 0.0, count;
    int64_t sq, sk;
    seq_iter it = {desc, 0};
    while (desc && seq_next(&it, &sq, &sk, &count)) all += count * ((double)sq * (double)sk);
    return all;
}

double fa_visible_fraction(const fa_attention_desc *desc) {
    if (!desc) return 0.0;
    const double all = fa_score_cells(desc);
    return all > 0.0 ? visible_cells(desc) / all : 0.0;
}

double fa_attention_flops(const fa_attention_desc *desc, fa_pass pass) {
    if (!desc) return 0.0;
    double forward = 4.0 * (double)desc->head_dim * (double)desc->heads_q * visible_cells(desc);
    return pass == FA_PASS_BACKWARD ? 2.5 * forward : forward;
}

static double simt_peak(const fa_device_desc *dev) {
    return (double)dev->compute_units * (double)dev->clock_mhz * 1e6 * dev->fp32_flops_per_clock_cu;
}

double fa_device_peak_flops(const fa_device_desc *dev, fa_dtype dtype, int allow_tf32) {
    if (!dev) return 0.0;
    double simt = simt_peak(dev);
    if (!(dev->matrix_flops_per_clock_cu > 0.0)) return simt;
    double matrix = (double)dev->compute_units * (double)dev->clock_mhz * 1e6 * dev->matrix_flops_per_clock_cu;
    if (dtype == FA_DTYPE_F16 || dtype == FA_DTYPE_BF16) return matrix > simt ? matrix : simt;
    /* e4m3 products run at twice the 16-bit rate (Hopper's; the only fp8
     * kernels are CUDA sm_90's). */
    if (dtype == FA_DTYPE_FP8_E4M3) return 2.0 * matrix > simt ? 2.0 * matrix : simt;
    /* TF32 runs at half the fp16 matrix rate on the matrix units that have it. */
    if (allow_tf32 && matrix / 2.0 > simt) return matrix / 2.0;
    return simt;
}

double fa_device_bandwidth(const fa_device_desc *dev) { return dev ? dev->bandwidth_gbs * 1e9 : 0.0; }

/* ------------------------------------------------------------------------ */
/* Tiles                                                                    */

/* What a tile shape leaves to compute of one sequence. A (query tile, key
 * tile) pair is visited when the band reaches it and the block mask leaves
 * on at least one of the blocks it overlaps: the kernels' skip rule (the band
 * per query tile, the blocks through a per-tile map built on the host).
 *
 * Counted in closed form, in time independent of the sequence length:
 * query tile t's rows reach keys [max(0, t br + lo), min(sk - 1, t br + ch)]
 * (one interval: the rows' intervals shift by one key per row; ch is
 * br - 1 + hi, less for the last, partial, tile), so its first and last key
 * tiles are floors of linear functions of t, clamped, and their sums over a
 * run of tiles are floor sums (Euclid-like, logarithmic). A block mask
 * splits the query tiles into runs over the same block rows; within a run
 * the key tiles under a block left on form a few intervals, and each
 * interval's share of every tile's reach is again a clamped floor. */
typedef struct tile_stats {
    double pairs;      /* visited (query tile, key tile) pairs */
    double key_rows;   /* sum over visited pairs of the key tile's rows */
    double query_rows; /* sum over visited pairs of the query tile's rows */
} tile_stats;

/* floor(a / b) and ceil(a / b) for b > 0 and any sign of a. */
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static int64_t ceil_div_any(int64_t a, int64_t b) { return -floor_div(-a, b); }

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return min64(max64(x, lo), hi); }

/* Sum over i in [0, n) of floor((a i + b) / m), a, b >= 0, m > 0: whole
 * multiples of m are summed directly, and the rest counted the other way
 * round (lattice points under the line), which swaps the roles of a and m
 * as Euclid's algorithm does. Every term is part of the sum, which the
 * callers keep below 2^63. */
static uint64_t floor_sum(uint64_t n, uint64_t m, uint64_t a, uint64_t b) {
    uint64_t sum = 0;
    while (n > 0) {
        if (a >= m) {
            sum += n * (n - 1) / 2 * (a / m);
            a %= m;
        }
        if (b >= m) {
            sum += n * (b / m);
            b %= m;
        }
        const uint64_t top = a * n + b;
        if (top < m) break;
        n = top / m;
        b = top % m;
        const uint64_t t = m;
        m = a;
        a = t;
    }
    return sum;
}

/* Sum over t in [t0, t1) of floor(clamp(step t + c, lo, hi) / div), for
 * 0 <= lo <= hi, step, div > 0. */
static int64_t clamped_floor_sum(int64_t t0, int64_t t1, int64_t step, int64_t c, int64_t lo, int64_t hi,
                                 int64_t div) {
    if (t1 <= t0) return 0;
    const int64_t rise = clamp64(ceil_div_any(lo - c, step), t0, t1);     /* first t above lo */
    const int64_t flat = clamp64(floor_div(hi - c, step) + 1, rise, t1); /* first t past hi */
    int64_t sum = (rise - t0) * (lo / div) + (t1 - flat) * (hi / div);
    if (flat > rise) sum += (int64_t)floor_sum((uint64_t)(flat - rise), (uint64_t)div, (uint64_t)step,
                                               (uint64_t)(step * rise + c));
    return sum;
}

/* Query tiles [t0, t1) of one sequence: tile t's rows end at t br + qe and
 * reach keys up to t br + qe + hi. */
typedef struct tile_run {
    int64_t br, bc, sq, sk;
    int64_t lo, ch;       /* the band: keys from t br + lo to t br + ch */
    int64_t qe;           /* the tile's last row past t br */
    int64_t rows;         /* rows of each tile of the run */
    int64_t key_tiles, pad; /* key tiles; rows the last one lacks */
} tile_run;

/* Visited pairs between query tiles [t0, t1) and key tiles [a, b]: each
 * tile's key tiles are [max(first(t), a), min(last(t), b)], counted where
 * that is not empty. */
static void count_interval(const tile_run *r, int64_t t0, int64_t t1, int64_t a, int64_t b, tile_stats *st) {
    const int64_t br = r->br, bc = r->bc;
    /* last(t) >= a from t_a on; first(t) <= b up to t_b. */
    t0 = max64(t0, ceil_div_any(a * bc - r->ch, br));
    t1 = min64(t1, floor_div(b * bc + bc - 1 - r->lo, br) + 1);
    if (t1 <= t0) return;
    const int64_t top = clamped_floor_sum(t0, t1, br, r->ch, 0, min64(r->sk - 1, b * bc + bc - 1), bc);
    const int64_t bottom = clamped_floor_sum(t0, t1, br, r->lo, a * bc, r->sk - 1, bc);
    const int64_t pairs = top - bottom + (t1 - t0);
    /* Tiles whose range reaches the last key tile, which lacks pad rows. */
    int64_t short_last = 0;
    if (b == r->key_tiles - 1) short_last = t1 - max64(t0, ceil_div_any((r->key_tiles - 1) * bc - r->ch, br));
    st->pairs += (double)pairs;
    st->key_rows += (double)(pairs * bc - max64(0, short_last) * r->pad);
    st->query_rows += (double)pairs * (double)r->rows;
}

/* Visited pairs of query tiles [t0, t1) that all lie over block rows
 * [bi0, bi1]: the key tiles under a block left on in any of those rows, as
 * merged intervals. A block past the end of a (mis-sized) mask counts as
 * on: the model never reads outside the caller's bytes. */
static void count_block_rows(const tile_run *r, const block_mask *bm, int64_t t0, int64_t t1, int64_t bi0,
                             int64_t bi1, tile_stats *st) {
    /* Only the block columns under the key tiles the run's keys reach. */
    const int64_t k0 = max64(0, t0 * r->br + r->lo) / r->bc * r->bc;
    const int64_t k1 = min64(r->sk, (min64(r->sk - 1, (t1 - 1) * r->br + r->ch) / r->bc + 1) * r->bc) - 1;
    int64_t a = -1, b = -1; /* the interval being merged */
    for (int64_t bj = k0 / bm->block_k; bj <= k1 / bm->block_k; bj++) {
        int on = 0;
        for (int64_t bi = bi0; bi <= bi1 && !on; bi++) on = block_on(bm, bi, bj);
        if (!on) continue;
        const int64_t first = bj * bm->block_k / r->bc;
        const int64_t last = min64(r->sk - 1, (bj + 1) * bm->block_k - 1) / r->bc;
        if (a >= 0 && first <= b + 1) {
            b = max64(b, last);
            continue;
        }
        if (a >= 0) count_interval(r, t0, t1, a, b, st);
        a = first;
        b = last;
    }
    if (a >= 0) count_interval(r, t0, t1, a, b, st);
}

static void count_run(const tile_run *r, const block_mask *bm, int64_t t0, int64_t t1, tile_stats *st) {
    /* Tiles whose reach meets the sequence: t br + ch >= 0 and t br + lo <= sk - 1. */
    t0 = max64(t0, ceil_div_any(-r->ch, r->br));
    t1 = min64(t1, floor_div(r->sk - 1 - r->lo, r->br) + 1);
    if (!bm->bytes) {
        count_interval(r, t0, t1, 0, r->key_tiles - 1, st);
        return;
    }
    /* Runs of tiles over the same block rows. */
    for (int64_t t = t0; t < t1;) {
        const int64_t bi0 = t * r->br / bm->block_q, bi1 = (t * r->br + r->qe) / bm->block_q;
        const int64_t end = min64(t1, min64(ceil_div((bi0 + 1) * bm->block_q, r->br),
                                            ceil_div_any((bi1 + 1) * bm->block_q - r->qe, r->br)));
        count_block_rows(r, bm, t, end, bi0, bi1, st);
        t = end;
    }
}

static void seq_tiles(const fa_attention_desc *d, const block_mask *bm, int64_t sq, int64_t sk, int64_t br,
                      int64_t bc, tile_stats *st) {
    band bd = seq_band(d, sq, sk);
    if (bd.lo > bd.hi || sq <= 0 || sk <= 0) return;
    const int64_t tiles = ceil_div(sq, br), key_tiles = ceil_div(sk, bc);
    /* The whole tiles, then the last one, whose rows end at sq - 1. */
    tile_run r = {br, bc, sq, sk, bd.lo, br - 1 + bd.hi, br - 1, br, key_tiles, key_tiles * bc - sk};
    count_run(&r, bm, 0, tiles - 1, st);
    const int64_t last = tiles - 1, last_rows = sq - last * br;
    r.qe = last_rows - 1;
    r.ch = last_rows - 1 + bd.hi;
    r.rows = last_rows;
    count_run(&r, bm, last, tiles, st);
}

fa_tile_visits fa_io_tile_visits(const fa_attention_desc *desc, int br, int bc) {
    fa_tile_visits v;
    memset(&v, 0, sizeof v);
    v.br = br;
    v.bc = bc;
    if (!desc || br <= 0 || bc <= 0) return v;
    const block_mask bm = get_block_mask(desc);
    double count;
    int64_t sq, sk;
    seq_iter it = {desc, 0};
    while (seq_next(&it, &sq, &sk, &count)) {
        tile_stats st = {0, 0, 0};
        seq_tiles(desc, &bm, sq, sk, br, bc, &st);
        v.pairs += count * st.pairs;
        v.key_rows += count * st.key_rows;
        v.query_rows += count * st.query_rows;
        if (sk > v.longest_k) {
            v.longest_k = sk;
            v.its_q = sq;
        }
        if (sq > v.longest_q) {
            v.longest_q = sq;
            v.its_k = sk;
        }
    }
    v.visible_cells = visible_cells(desc);
    return v;
}

/* The launch grids. Forward: one work-group per (query tile, query head,
 * sequence, key split). Backward: one per (key tile, kv head, sequence),
 * looping over the query heads that share the kv head. */
static double forward_groups(const fa_attention_desc *d, int br, int split) {
    return (double)d->batch * (double)d->heads_q * (double)ceil_div(d->seqlen_q, br) * (double)split;
}

static double backward_groups(const fa_attention_desc *d, int bc) {
    return (double)d->batch * (double)d->heads_kv * (double)ceil_div(d->seqlen_k, bc);
}

/* Time of work spread over groups work-groups on the compute units: the last
 * wave runs partly empty (the tail effect), and fewer work-groups than
 * compute units leave the rest idle. */
static double wave_time_ms(double flops, double peak, double groups, int compute_units) {
    if (!(peak > 0.0) || !(groups > 0.0) || compute_units <= 0) return 0.0;
    double per_cu = groups / (double)compute_units;
    return flops / peak * (ceil(per_cu) / per_cu) * 1e3;
}

/* SIMT kernels feed their FMAs from local memory. A work-item holding a
 * tr x tc micro-tile of the scores reads tr + tc words per tr * tc FMAs, and
 * for its tr x dpt share of O (dpt = head_dim over the bc / tc work-items of
 * a row) tr + dpt words per tr * dpt FMAs. Local memory delivers about one
 * word per four FMA lanes and clock (32 banks of 4 bytes against 128 lanes
 * on NVIDIA and AMD compute units alike), so micro-tiles that read more than
 * a quarter word per FMA leave the FMA units waiting by that factor. The
 * streaming forward (FA_VARIANT_SIMT_STREAM) reads the same words per FMA:
 * it splits the products over head_dim and over the tile into chunks, but
 * every chunk is read by the same micro-tiles. */
#define FA_FMA_LANES_PER_LOCAL_WORD 4.0

static double local_factor(double reads_per_fma) {
    const double factor = FA_FMA_LANES_PER_LOCAL_WORD * reads_per_fma;
    return factor > 1.0 ? factor : 1.0;
}

static double simt_local_factor(const fa_attention_desc *d, const fa_kernel_plan *p) {
    const double tr = p->thread_rows > 0 ? p->thread_rows : 1, tc = p->thread_cols > 0 ? p->thread_cols : 1;
    const double row_items = (double)p->bc / tc;
    const double dpt = ceil((double)d->head_dim / row_items);
    const double reads_s = (tr + tc) / (tr * tc), reads_o = (tr + dpt) / (tr * dpt);
    return local_factor(0.5 * (reads_s + reads_o));
}

/* The streaming backward kernels (kernels_cl/bwd.cl), product by product.
 * S and dP: a tr x tc micro-tile, tr + tc words per tr * tc FMAs each. dV
 * and dK: a work-item sums tc keys x kd dimensions (kd = head_dim over the
 * br / tr work-items of a key column), tc + kd words per tc * kd FMAs each.
 * dQ: tr rows x qd dimensions (qd = head_dim over the bc / tc work-items of
 * a row), tr + qd words per tr * qd FMAs. The dK/dV kernel computes S, dP,
 * dV and dK (and dQ where it adds dQ to an accumulator); the dQ kernel of
 * deterministic mode S, dP and dQ. Factors of the dK/dV kernel (*kv) and
 * of the dQ kernel (*q). */
static void stream_backward_factors(const fa_attention_desc *d, const fa_kernel_plan *p, int dq_kernel,
                                    double *kv, double *q) {
    const double tr = p->thread_rows > 0 ? p->thread_rows : 1, tc = p->thread_cols > 0 ? p->thread_cols : 1;
    const double dim = d->head_dim;
    const double kd = ceil(dim / ((double)p->br / tr)), qd = ceil(dim / ((double)p->bc / tc));
    const double s = (tr + tc) / (tr * tc), k = (tc + kd) / (tc * kd), r = (tr + qd) / (tr * qd);
    if (dq_kernel) {
        *kv = local_factor((2.0 * s + 2.0 * k) / 4.0);
        *q = local_factor((2.0 * s + r) / 3.0);
    } else {
        *kv = local_factor((2.0 * s + 2.0 * k + r) / 5.0);
        *q = *kv;
    }
}

/* Memory time at the device's bandwidth, or at the share of it that groups
 * work-groups can draw when they are fewer than the compute units (each
 * streams through one compute unit's load units). */
static void finish(fa_cost *c, const fa_device_desc *dev, double groups) {
    double bw = fa_device_bandwidth(dev);
    if (groups > 0.0 && dev->compute_units > 0 && groups < (double)dev->compute_units)
        bw *= groups / (double)dev->compute_units;
    c->memory_ms = bw > 0.0 ? (c->hbm_read_bytes + c->hbm_write_bytes) / bw * 1e3 : 0.0;
    c->roofline_ms = c->compute_ms > c->memory_ms ? c->compute_ms : c->memory_ms;
}

/* OpenCL C 1.2 has no floating-point atomics, so the OpenCL SIMT backward
 * (kernels_cl/bwd.cl) computes dQ in a kernel of its own that re-reads K and
 * V per query tile; so do the CUDA backward and the OpenCL streaming and
 * matrix-unit ones (which add through an integer compare-and-swap, or the hardware's float
 * add where the device has one) in deterministic mode, where atomics would
 * make the sums' order depend on timing. Otherwise the backends accumulate
 * dQ in fp32 in global memory once per key tile. */
static int backward_recomputes_dq(const fa_device_desc *dev, const fa_attention_desc *desc,
                                  const fa_kernel_plan *plan) {
    if (dev->backend == FA_BACKEND_OPENCL) return !fa_cl_dq_accumulates(plan->variant) || desc->deterministic;
    return dev->backend == FA_BACKEND_CUDA && desc->deterministic;
}

/* A sequence's tensors read and written once each by a fused pass: the
 * traffic of fa_io_fused with every re-read served by a cache. */
static void once_traffic(const fa_attention_desc *desc, fa_pass pass, int recompute_dq, int split, double sq,
                         double sk, double *rd, double *wr) {
    const double e = dtype_bytes(desc->q.dtype), dim = (double)desc->head_dim;
    const double hq = (double)desc->heads_q, hkv = (double)desc->heads_kv;
    if (pass == FA_PASS_FORWARD) {
        *rd += hq * sq * dim * e * split + 2.0 * hkv * sk * dim * e;
        *wr += hq * sq * dim * dtype_bytes(desc->o.dtype) + hq * sq * 4.0;
        if (split > 1) {
            *rd += split * hq * sq * (dim + 1.0) * 4.0;
            *wr += split * hq * sq * (dim + 1.0) * 4.0;
        }
        return;
    }
    /* D from O and dO; K, V, Q, dO, L, D in; dK, dV, dQ out (through the
     * fp32 accumulator: zeroed, summed in the cache, read to convert). */
    *rd += 2.0 * hq * sq * dim * e + 2.0 * hkv * sk * dim * e + hq * sq * (2.0 * dim * e + 8.0);
    *wr += hq * sq * 4.0 + 2.0 * hkv * sk * dim * e + hq * sq * dim * e;
    if (!recompute_dq) {
        *rd += hq * sq * dim * 4.0;
        *wr += hq * sq * dim * 4.0;
    }
}

/* A forward whose rows are a GQA group's heads times tokens packed per KV
 * head: CUDA's decoding kernel, and every KV-cache step. */
static int packed_rows(const fa_attention_desc *desc, fa_pass pass, const fa_kernel_plan *plan) {
    return pass == FA_PASS_FORWARD && (plan->variant == FA_VARIANT_DECODE || desc->kv_cache);
}

/* The query rows of a tile as the tile visits count them: a packed plan's
 * rows are a GQA group's heads times tokens, of which the visits see the
 * tokens. */
static int visit_rows(const fa_attention_desc *desc, fa_pass pass, const fa_kernel_plan *plan) {
    return packed_rows(desc, pass, plan) ? fa_decode_token_rows(desc, plan->br) : plan->br;
}

fa_cost fa_io_fused(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                    const fa_kernel_plan *plan) {
    if (!plan) return fa_io_fused_visits(dev, desc, pass, plan, NULL);
    const fa_tile_visits v = fa_io_tile_visits(desc, visit_rows(desc, pass, plan), plan->bc);
    return fa_io_fused_visits(dev, desc, pass, plan, &v);
}

/* Special-function units (the softmax's exp2): 16 results a clock and
 * compute unit, NVIDIA's rate from sm_80 to sm_90 (four per SM
 * sub-partition) and AMD CDNA's (64 lanes at a quarter rate), taken for
 * every device. Next to the matrix units they are slow: on an H100 a
 * head_dim-128 forward spends half as long on its exponentials as on its
 * products (FlashAttention-3's observation), a head_dim-64 one as long. */
#define FA_EXP_PER_CLOCK_CU 16.0

static double exp_rate(const fa_device_desc *dev) {
    return (double)dev->compute_units * (double)dev->clock_mhz * 1e6 * FA_EXP_PER_CLOCK_CU;
}

/* How a kernel's pipeline sets its products beside its exponentials. The
 * warp-specialised kernels (FA_VARIANT_WGMMA_TMA) with two or more
 * consumer warpgroups run one group's softmax while another's products
 * (or, within a group, the next tile's) occupy the matrix units, so the
 * longer of the two counts; every other kernel computes a tile's scores,
 * then their exponentials, then the next products in the same warps, so
 * both count. */
static double pipeline_time(const fa_kernel_plan *plan, double products_ms, double exps_ms) {
    if (plan->variant == FA_VARIANT_WGMMA_TMA && plan->work_group_size >= 384)
        return products_ms > exps_ms ? products_ms : exps_ms;
    return products_ms + exps_ms;
}

/* OpenCL's matrix-unit backward with K and V packed in the workspace
 * (planner_cl_mma.c, k_packed): the bytes of their packed key tiles, one
 * slot a key tile and kv head (padding keys and dimensions included); 0
 * for every other plan. */
static double cl_packed_kv_bytes(const fa_device_desc *dev, const fa_attention_desc *desc,
                                 const fa_kernel_plan *plan) {
    fa_cl_mma_geometry g;
    if (dev->backend != FA_BACKEND_OPENCL || plan->variant != FA_VARIANT_MMA ||
        !fa_cl_mma_geometry_of(dev, desc, FA_PASS_BACKWARD, plan->br, plan->bc, plan->thread_rows,
                               plan->thread_cols, plan->stages, &g) ||
        !g.k_packed)
        return 0.0;
    /* Every sequence alike without cu_seqlens. */
    const int seqs = desc->cu_seqlens_k ? desc->batch : 1;
    double tiles = 0.0;
    for (int b = 0; b < seqs; b++) {
        int64_t sq, sk;
        seq_lengths(desc, b, &sq, &sk);
        tiles += (double)ceil_div(sk, plan->bc);
    }
    if (!desc->cu_seqlens_k) tiles *= desc->batch;
    return (double)desc->heads_kv * tiles * (double)fa_cl_mma_packed_slot_bytes(&g, plan->bc);
}

fa_cost fa_io_fused_visits(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass,
                           const fa_kernel_plan *plan, const fa_tile_visits *v) {
    fa_cost c = {0, 0, 0, 0, 0, 0, 0, 0};
    if (!dev || !desc || !plan) return c;
    if (plan->variant == FA_VARIANT_STANDARD) return fa_io_standard(dev, desc, pass);
    if (plan->br <= 0 || plan->bc <= 0 || !v || v->br != visit_rows(desc, pass, plan) || v->bc != plan->bc) return c;
    /* Decoding (and a KV-cache step) reads each key tile once per KV head
     * and row tile (more than one only where a tile holds less than a
     * group's heads), and computes all of a tile's packed rows. Pages of a
     * paged cache do not change the bytes. */
    const int decode = packed_rows(desc, pass, plan);
    const double kv_heads_read = decode ? (double)desc->heads_kv * fa_decode_tiles_per_token(desc, plan->br)
                                        : (double)desc->heads_q;

    const double e = dtype_bytes(desc->q.dtype), dim = (double)desc->head_dim;
    const double hq = (double)desc->heads_q, hkv = (double)desc->heads_kv;
    const int split = pass == FA_PASS_FORWARD && plan->split_k > 1 ? plan->split_k : 1;
    const int recompute_dq = backward_recomputes_dq(dev, desc, plan);
    /* Every term is linear in a sequence's lengths and tile visits, so the
     * batch's sums stand for its sequences. */
    const double sq = (double)fa_attention_total_q(desc), sk = (double)fa_attention_total_k(desc);
    double rd = 0.0, wr = 0.0;
    /* Each tensor once (the bytes no tile shape avoids), and the largest
     * working set the work-groups of one head re-read: the first longest
     * sequence's (keys forward, queries backward). */
    double once_rd = 0.0, once_wr = 0.0, head_set, head_groups = 1.0;
    once_traffic(desc, pass, recompute_dq, split, sq, sk, &once_rd, &once_wr);
    if (pass == FA_PASS_FORWARD) {
        head_set = 2.0 * (double)v->longest_k * dim * e;
        if (head_set > 0.0) head_groups = ceil((double)v->its_q / v->br) * split;
    } else {
        head_set = (double)v->longest_q * (2.0 * dim * e + 8.0 + (recompute_dq ? 0.0 : dim * 4.0));
        if (head_set > 0.0) head_groups = ceil((double)v->its_k / plan->bc);
    }
    if (pass == FA_PASS_FORWARD) {
        /* Q once per split, K and V once per visited pair, O and L once.
         * The streaming kernels read the work-group's own Q tile again
         * for every key tile (backward: K and V of the key tile for
         * every query tile, and Q and dO of a query tile a second time
         * for dK and dV): re-reads of the same few kilobytes within
         * microseconds, which the cache serves, not HBM. */
        rd += hq * sq * dim * e * split + kv_heads_read * v->key_rows * dim * e * 2.0;
        wr += hq * sq * dim * dtype_bytes(desc->o.dtype) + hq * sq * 4.0; /* O in o's dtype (fp16/bf16 beside fp8) */
        if (fa_fp8_vt_global(desc, plan->bc)) {
            /* The pre-pass reads V and writes V^T once (keys padded to 128);
             * the tiles then read V^T where they read V. */
            const double vt = hkv * (double)desc->batch * ceil((double)desc->seqlen_k / 128.0) * 128.0 * dim * e;
            rd += vt;
            wr += vt;
        }
        if (split > 1) {
            /* fp32 partial O and L of every split, written then merged. */
            double partials = split * hq * sq * (dim + 1.0) * 4.0;
            rd += partials;
            wr += partials;
        }
    } else {
        /* D = rowsum(dO * O) first. */
        rd += 2.0 * hq * sq * dim * e;
        wr += hq * sq * 4.0;
        /* K and V read, dK and dV written once per kv head; Q, dO, L and D
         * once per visited pair. */
        rd += 2.0 * hkv * sk * dim * e + hq * v->query_rows * (2.0 * dim * e + 8.0);
        wr += 2.0 * hkv * sk * dim * e;
        const double packed = cl_packed_kv_bytes(dev, desc, plan);
        if (packed > 0.0) {
            /* The pre-pass reads K and V and writes their packed tiles,
             * which the dK/dV kernel reads in their place. */
            rd += packed;
            wr += packed;
        }
        if (recompute_dq) {
            /* The dQ kernel: Q, dO, L, D once, K and V per visited pair. */
            rd += hq * sq * (2.0 * dim * e + 8.0) + hq * v->key_rows * 2.0 * dim * e;
            wr += hq * sq * dim * e;
        } else {
            /* fp32 dQ accumulator: zeroed, read and written per visited
             * pair, then converted to the storage dtype. */
            wr += hq * sq * dim * 4.0;
            rd += hq * v->query_rows * dim * 4.0;
            wr += hq * v->query_rows * dim * 4.0;
            rd += hq * sq * dim * 4.0;
            wr += hq * sq * dim * e;
        }
    }

    if (pass == FA_PASS_FORWARD && desc->kv_cache) {
        /* The step's own traffic: k_new and v_new read and written into
         * the cache, the rotary tables' rows for them and the queries, the
         * lengths and the block table. */
        const double sb = (double)desc->batch, sn = (double)desc->seqlen_new;
        const double append = 2.0 * hkv * sb * sn * dim * e;
        const double rot = (double)desc->rotary_dim * 4.0 * sb * (sn + (double)desc->seqlen_q);
        const double meta = sb * 4.0 * (1.0 + (double)fa_desc_pages_per_seq(desc));
        rd += append + rot + meta;
        wr += append;
        once_rd += append + rot + meta;
        once_wr += append;
    }
    c.hbm_read_bytes = rd;
    c.hbm_write_bytes = wr;
    /* One work-group per compute unit in flight (the fewest), launched
     * head by head: they span this many heads' working sets at once. */
    const double heads_in_flight = ceil((double)(dev->compute_units > 0 ? dev->compute_units : 1) / head_groups);
    const int cached = dev->l2_cache_bytes > 0 && heads_in_flight * head_set <= (double)dev->l2_cache_bytes;
    c.dram_read_bytes = cached && once_rd < rd ? once_rd : rd;
    c.dram_write_bytes = cached && once_wr < wr ? once_wr : wr;
    const double forward_flops = 4.0 * dim * hq * v->visible_cells;
    c.flops = pass == FA_PASS_BACKWARD ? 2.5 * forward_flops : forward_flops;

    /* Compute time counts the work the tiles execute: a visited tile is
     * computed whole, masked cells included. Per cell and head dimension the
     * forward does 2 products (4 flops), the backward 5 (10 flops), or 7
     * (14 flops) where dQ has a kernel of its own that recomputes P and dP. */
    const double cells = v->pairs * (double)plan->br * (double)plan->bc * dim * (decode ? kv_heads_read : hq);
    const double peak = fa_variant_on_matrix_units(plan->variant)
                            ? fa_device_peak_flops(dev, desc->q.dtype, desc->allow_tf32)
                            : simt_peak(dev) / simt_local_factor(desc, plan);
    /* The streaming backward's kernels, each with its own reads per FMA. */
    double peak_kv = peak, peak_q = peak;
    if (pass == FA_PASS_BACKWARD && plan->variant == FA_VARIANT_SIMT_STREAM) {
        double fkv, fq;
        stream_backward_factors(desc, plan, recompute_dq, &fkv, &fq);
        peak_kv = simt_peak(dev) / fkv;
        peak_q = simt_peak(dev) / fq;
    }
    /* Exponentials of matrix-unit kernels (one a computed score: cells /
     * dim of them per head), on the special-function units. */
    const int exps = fa_variant_on_matrix_units(plan->variant);
    const double exp_cells = cells / dim, sfu = exp_rate(dev);
    double groups;
    if (pass == FA_PASS_FORWARD) {
        groups = plan->num_work_groups > 0 ? (double)plan->num_work_groups : forward_groups(desc, plan->br, split);
        c.compute_ms = pipeline_time(plan, wave_time_ms(4.0 * cells, peak, groups, dev->compute_units),
                                     exps ? wave_time_ms(exp_cells, sfu, groups, dev->compute_units) : 0.0);
    } else {
        groups = plan->num_work_groups > 0 ? (double)plan->num_work_groups : backward_groups(desc, plan->bc);
        if (recompute_dq) {
            double dq_groups = (double)desc->batch * hq * (double)ceil_div(desc->seqlen_q, plan->br);
            /* The dQ kernel is never warp-specialised: its exponentials
             * follow its products. */
            c.compute_ms = pipeline_time(plan, wave_time_ms(8.0 * cells, peak_kv, groups, dev->compute_units),
                                         exps ? wave_time_ms(exp_cells, sfu, groups, dev->compute_units) : 0.0) +
                           wave_time_ms(6.0 * cells, peak_q, dq_groups, dev->compute_units) +
                           (exps ? wave_time_ms(exp_cells, sfu, dq_groups, dev->compute_units) : 0.0);
        } else {
            c.compute_ms = pipeline_time(plan, wave_time_ms(10.0 * cells, peak_kv, groups, dev->compute_units),
                                         exps ? wave_time_ms(exp_cells, sfu, groups, dev->compute_units) : 0.0);
        }
    }
    finish(&c, dev, groups);
    return c;
}

/* Standard attention materialises every N x N matrix in the storage dtype
 * and computes it whole (masks are applied by the softmax, not skipped).
 * Forward: S = Q K^T, P = softmax(S) (and L), O = P V. Backward, from
 * (Q, K, V, O, L, dO) as the API passes no P: S = Q K^T and P = exp(S - L)
 * again, dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D),
 * dQ = dS K, dK = dS^T Q; every operand read and every result written once
 * per query head. */
fa_cost fa_io_standard(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass) {
    fa_cost c = {0, 0, 0, 0, 0, 0, 0, 0};
    if (!dev || !desc) return c;
    const double e = dtype_bytes(desc->q.dtype), dim = (double)desc->head_dim, hq = (double)desc->heads_q;
    double rd = 0.0, wr = 0.0, cells_all = 0.0, count;
    int64_t sq64, sk64;
    seq_iter it = {desc, 0};
    while (seq_next(&it, &sq64, &sk64, &count)) {
        const double sq = (double)sq64, sk = (double)sk64, nn = sq * sk * e;
        const double qb = sq * dim * e, kb = sk * dim * e;
        cells_all += count * (sq * sk);
        if (pass == FA_PASS_FORWARD) {
            rd += count * hq * (qb + kb      /* S = Q K^T */
                                + nn         /* softmax reads S */
                                + nn + kb);  /* O = P V */
            wr += count * hq * (nn + nn + sq * 4.0 + qb);
        } else {
            rd += count * hq * (qb + kb              /* S = Q K^T */
                                + nn + sq * 4.0      /* P = exp(S - L) */
                                + nn + qb            /* dV = P^T dO */
                                + qb + kb            /* dP = dO V^T */
                                + 2.0 * qb           /* D = rowsum(dO * O) */
                                + 2.0 * nn + sq * 4.0 /* dS = P * (dP - D) */
                                + nn + kb            /* dQ = dS K */
                                + nn + qb);          /* dK = dS^T Q */
            wr += count * hq * (nn + nn + kb + nn + sq * 4.0 + nn + qb + kb);
        }
    }
    c.hbm_read_bytes = rd;
    c.hbm_write_bytes = wr;
    /* S, P and dP stream through once each: nothing is re-read. */
    c.dram_read_bytes = rd;
    c.dram_write_bytes = wr;
    double full = 4.0 * dim * hq * cells_all;
    c.flops = pass == FA_PASS_BACKWARD ? 2.5 * full : full;
    /* Its products run in a vendor GEMM: on matrix units through cuBLAS; the
     * OpenCL (CLBlast) and HIP paths use vector units. */
    double peak = dev->backend == FA_BACKEND_CUDA ? fa_device_peak_flops(dev, desc->q.dtype, desc->allow_tf32)
                                                  : simt_peak(dev);
    c.compute_ms = peak > 0.0 ? c.flops / peak * 1e3 : 0.0;
    finish(&c, dev, 0.0);
    return c;
}
