/* The ring's element-wise passes (context parallelism): copy, add and fill
 * over [batch, rows, heads, dim] views, and the merge of a partial
 * attention result into an fp32 accumulator through the log-sum-exp. What
 * each computes is stated above `rows` in core/backend.h; the arguments
 * are checked and the grid sized by core/rows_launch.c, which
 * backends/cuda/cuda_rows.c launches.
 *
 * Dtypes are arguments, not build options: one program per context serves
 * every pair, and the switch on them is taken once per thread, the same
 * way by the whole grid. A line is the dim contiguous elements of one
 * (batch, row, head): p.lanes threads share it, the block's lines follow
 * each other, and blocks step over the lines until all are done. Every
 * index is 64-bit. The twin of kernels_hip/rows.hip. */
#include "dtype.cuh"

#define ROWS_THREADS 256 /* FA_ROWS_THREADS */

/* fa_dtype, fa_rows_op */
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define OP_COPY 0
#define OP_ADD 1
#define OP_FILL 2

/* Slots of the views: rows' dst and src, the merge's four. */
#define DST 0
#define SRC 1
#define ACC_O 0
#define PART_O 1
#define ACC_L 2
#define PART_L 3

/* fa_rows_params of core/rows_launch.h, field for field. */
struct fa_rows_params {
    u64 ptr[4];
    i64 off[4], sb[4], ss[4], sh[4];
    i64 lines;
    int rows, heads, dim, lanes;
    int dtype[4];
    int op;
    float value;
};

static_assert(sizeof(fa_rows_params) == 21 * 8 + 10 * 4, "fa_rows_params differs from the host's layout");

template <int T> struct elem;
template <> struct elem<DT_F32> {
    typedef float t;
    FA_DEV float load(const float *p, i64 i) { return p[i]; }
    FA_DEV void store(float *p, i64 i, float v) { p[i] = v; }
};
template <> struct elem<DT_F16> {
    typedef u16 t;
    FA_DEV float load(const u16 *p, i64 i) { return f16_to_f32(p[i]); }
    FA_DEV void store(u16 *p, i64 i, float v) { p[i] = f32_to_f16(v); }
};
template <> struct elem<DT_BF16> {
    typedef u16 t;
    FA_DEV float load(const u16 *p, i64 i) { return bf16_to_f32(p[i]); }
    FA_DEV void store(u16 *p, i64 i, float v) { p[i] = f32_to_bf16(v); }
};

/* A line's (batch, row, head), from line = (b * rows + s) * heads + h. */
struct line_pos {
    i64 b, s, h;
};

FA_DEV line_pos pos_of(const fa_rows_params &p, i64 line) {
    line_pos q;
    q.h = line % p.heads;
    const i64 bs = line / p.heads;
    q.s = bs % p.rows;
    q.b = bs / p.rows;
    return q;
}

/* Index of the line's first element in the view of a slot. */
FA_DEV i64 start_of(const fa_rows_params &p, int slot, const line_pos &q) {
    return p.off[slot] + q.b * p.sb[slot] + q.s * p.ss[slot] + q.h * p.sh[slot];
}

template <int D, int S> FA_DEV void rows_lines(const fa_rows_params &p) {
    typedef typename elem<D>::t dst_t;
    typedef typename elem<S>::t src_t;
    dst_t *dst = (dst_t *)p.ptr[DST];
    const src_t *src = (const src_t *)p.ptr[SRC];
    const int lane = (int)threadIdx.x & (p.lanes - 1);
    const i64 per_block = ROWS_THREADS / p.lanes;
    /* Read once: AMD's compiler put a value chosen in the loop in LDS. */
    const bool fill = p.op == OP_FILL, add = p.op == OP_ADD;
    const float value = p.value;
    for (i64 line = (i64)blockIdx.x * per_block + (int)threadIdx.x / p.lanes; line < p.lines;
         line += (i64)gridDim.x * per_block) {
        const line_pos q = pos_of(p, line);
        const i64 d0 = start_of(p, DST, q), s0 = start_of(p, SRC, q);
        for (int x = lane; x < p.dim; x += p.lanes) {
            float v = fill ? value : elem<S>::load(src, s0 + x);
            if (add) v = elem<D>::load(dst, d0 + x) + v;
            elem<D>::store(dst, d0 + x, v);
        }
    }
}

template <int D> FA_DEV void rows_into(const fa_rows_params &p) {
    switch (p.op == OP_FILL ? D : p.dtype[SRC]) {
    case DT_F16: rows_lines<D, DT_F16>(p); break;
    case DT_BF16: rows_lines<D, DT_BF16>(p); break;
    default: rows_lines<D, DT_F32>(p); break;
    }
}

extern "C" __global__ __launch_bounds__(ROWS_THREADS) void fa_rows(const fa_rows_params p) {
    switch (p.dtype[DST]) {
    case DT_F16: rows_into<DT_F16>(p); break;
    case DT_BF16: rows_into<DT_BF16>(p); break;
    default: rows_into<DT_F32>(p); break;
    }
}

/* How a line's accumulator takes the part: its new L, and O's weights. */
struct merge_step {
    bool skip;   /* the part saw no key: the line stays */
    bool assign; /* the accumulator saw none: O = part */
    float l, w_acc, w_part;
};

FA_DEV merge_step merge_of(float la, float lp) {
    merge_step m;
    m.skip = false;
    m.assign = false;
    m.w_acc = m.w_part = m.l = FA_NAN;
    if (fa_isnan(la) || fa_isnan(lp)) return m;
    if (lp == -FA_INF) {
        m.skip = true;
    } else if (la == -FA_INF) {
        m.assign = true;
        m.l = lp;
    } else {
        const float mx = la > lp ? la : lp;
        m.l = mx + log1pf(expf(-fabsf(la - lp)));
        m.w_acc = expf(la - m.l);
        m.w_part = expf(lp - m.l);
    }
    return m;
}

template <int P> FA_DEV void merge_lines(const fa_rows_params &p) {
    typedef typename elem<P>::t part_t;
    float *acc_o = (float *)p.ptr[ACC_O];
    const part_t *part_o = (const part_t *)p.ptr[PART_O];
    float *acc_l = (float *)p.ptr[ACC_L];
    const float *part_l = (const float *)p.ptr[PART_L];
    const int lane = (int)threadIdx.x & (p.lanes - 1);
    const i64 per_block = ROWS_THREADS / p.lanes;
    /* The whole block takes each step, so that every thread meets the
     * barrier: a line's lanes read its L before the first lane rewrites it. */
    for (i64 first = (i64)blockIdx.x * per_block; first < p.lines; first += (i64)gridDim.x * per_block) {
        const i64 line = first + (int)threadIdx.x / p.lanes;
        const bool live = line < p.lines;
        line_pos q = {0, 0, 0};
        float la = 0.0f, lp = -FA_INF;
        if (live) {
            q = pos_of(p, line);
            la = acc_l[start_of(p, ACC_L, q)];
            lp = part_l[start_of(p, PART_L, q)];
        }
        const merge_step m = merge_of(la, lp);
        __syncthreads();
        if (!live || m.skip) continue;
        const i64 a0 = start_of(p, ACC_O, q), p0 = start_of(p, PART_O, q);
        for (int x = lane; x < p.dim; x += p.lanes) {
            const float part = elem<P>::load(part_o, p0 + x);
            acc_o[a0 + x] = m.assign ? part : acc_o[a0 + x] * m.w_acc + part * m.w_part;
        }
        if (lane == 0) acc_l[start_of(p, ACC_L, q)] = m.l;
    }
}

extern "C" __global__ __launch_bounds__(ROWS_THREADS) void fa_rows_merge(const fa_rows_params p) {
    switch (p.dtype[PART_O]) {
    case DT_F16: merge_lines<DT_F16>(p); break;
    case DT_BF16: merge_lines<DT_BF16>(p); break;
    default: merge_lines<DT_F32>(p); break;
    }
}
