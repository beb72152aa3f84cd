/* The ring's element-wise passes (context parallelism): copy, add and fill
 * over [batch, rows, heads, dim] views, and the merge of a partial
 * attention result into an fp32 accumulator through the log-sum-exp. What
 * each computes is stated above `rows` in core/backend.h; the arguments
 * are checked and the grid sized by core/rows_launch.c, which
 * backends/hip/hip_rows.c launches. The twin of kernels_cuda/rows.cu: the
 * same geometry and arithmetic, on dtype.h's conversions.
 *
 * Dtypes are arguments, not build options: one program per context serves
 * every pair, and no build option is needed (not even WAVE: a line's lanes
 * are at most 32, a block's lines meet only at a barrier). */

#define FA_ROWS_THREADS 256 /* core/rows_launch.h */

/* fa_dtype, fa_rows_op */
#define FA_DT_F32 0
#define FA_DT_F16 1
#define FA_DT_BF16 2
#define FA_OP_ADD 1
#define FA_OP_FILL 2

/* Slots of the views: rows' dst and src, the merge's four. */
#define FA_DST 0
#define FA_SRC 1
#define FA_ACC_O 0
#define FA_PART_O 1
#define FA_ACC_L 2
#define FA_PART_L 3

/* fa_rows_params of core/rows_launch.h, field for field. */
struct fa_rows_params {
    unsigned long long ptr[4];
    fa_long off[4], sb[4], ss[4], sh[4];
    fa_long lines;
    int rows, heads, dim, lanes;
    int dtype[4];
    int op;
    float value;
};

static_assert(sizeof(fa_rows_params) == 21 * 8 + 10 * 4, "fa_rows_params differs from the host's layout");

template <int T> struct fa_elem;
template <> struct fa_elem<FA_DT_F32> {
    typedef float t;
    FA_FN float load(const float *p, fa_long i) { return p[i]; }
    FA_FN void store(float *p, fa_long i, float v) { p[i] = v; }
};
template <> struct fa_elem<FA_DT_F16> {
    typedef fa_ushort t;
    FA_FN float load(const fa_ushort *p, fa_long i) { return fa_half_to_float(p[i]); }
    FA_FN void store(fa_ushort *p, fa_long i, float v) { p[i] = fa_float_to_half(v); }
};
template <> struct fa_elem<FA_DT_BF16> {
    typedef fa_ushort t;
    FA_FN float load(const fa_ushort *p, fa_long i) { return fa_bf16_to_float(p[i]); }
    FA_FN void store(fa_ushort *p, fa_long i, float v) { p[i] = fa_bf16_round(v); }
};

/* A line's (batch, row, head), from line = (b * rows + s) * heads + h. */
struct fa_line_pos {
    fa_long b, s, h;
};

FA_FN fa_line_pos fa_pos_of(const fa_rows_params &p, fa_long line) {
    fa_line_pos q;
    q.h = line % p.heads;
    const fa_long bs = line / p.heads;
    q.s = bs % p.rows;
    q.b = bs / p.rows;
    return q;
}

/* Index of the line's first element in the view of a slot. */
FA_FN fa_long fa_start_of(const fa_rows_params &p, int slot, const fa_line_pos &q) {
    return p.off[slot] + q.b * p.sb[slot] + q.s * p.ss[slot] + q.h * p.sh[slot];
}

template <int D, int S> FA_FN void fa_rows_lines(const fa_rows_params &p) {
    typedef typename fa_elem<D>::t dst_t;
    typedef typename fa_elem<S>::t src_t;
    dst_t *dst = (dst_t *)p.ptr[FA_DST];
    const src_t *src = (const src_t *)p.ptr[FA_SRC];
    const int lane = (int)threadIdx.x & (p.lanes - 1);
    const fa_long per_block = FA_ROWS_THREADS / p.lanes;
    /* Read once: AMD's compiler put a value chosen in the loop in LDS. */
    const bool fill = p.op == FA_OP_FILL, add = p.op == FA_OP_ADD;
    const float value = p.value;
    for (fa_long line = (fa_long)blockIdx.x * per_block + (int)threadIdx.x / p.lanes; line < p.lines;
         line += (fa_long)gridDim.x * per_block) {
        const fa_line_pos q = fa_pos_of(p, line);
        const fa_long d0 = fa_start_of(p, FA_DST, q), s0 = fa_start_of(p, FA_SRC, q);
        for (int x = lane; x < p.dim; x += p.lanes) {
            float v = fill ? value : fa_elem<S>::load(src, s0 + x);
            if (add) v = fa_elem<D>::load(dst, d0 + x) + v;
            fa_elem<D>::store(dst, d0 + x, v);
        }
    }
}

template <int D> FA_FN void fa_rows_into(const fa_rows_params &p) {
    switch (p.op == FA_OP_FILL ? D : p.dtype[FA_SRC]) {
    case FA_DT_F16: fa_rows_lines<D, FA_DT_F16>(p); break;
    case FA_DT_BF16: fa_rows_lines<D, FA_DT_BF16>(p); break;
    default: fa_rows_lines<D, FA_DT_F32>(p); break;
    }
}

extern "C" __global__ __launch_bounds__(FA_ROWS_THREADS) void fa_rows(const fa_rows_params p) {
    switch (p.dtype[FA_DST]) {
    case FA_DT_F16: fa_rows_into<FA_DT_F16>(p); break;
    case FA_DT_BF16: fa_rows_into<FA_DT_BF16>(p); break;
    default: fa_rows_into<FA_DT_F32>(p); break;
    }
}

/* How a line's accumulator takes the part: its new L, and O's weights. */
struct fa_merge_step {
    bool skip;   /* the part saw no key: the line stays */
    bool assign; /* the accumulator saw none: O = part */
    float l, w_acc, w_part;
};

FA_FN fa_merge_step fa_merge_of(float la, float lp) {
    fa_merge_step m;
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

template <int P> FA_FN void fa_merge_lines(const fa_rows_params &p) {
    typedef typename fa_elem<P>::t part_t;
    float *acc_o = (float *)p.ptr[FA_ACC_O];
    const part_t *part_o = (const part_t *)p.ptr[FA_PART_O];
    float *acc_l = (float *)p.ptr[FA_ACC_L];
    const float *part_l = (const float *)p.ptr[FA_PART_L];
    const int lane = (int)threadIdx.x & (p.lanes - 1);
    const fa_long per_block = FA_ROWS_THREADS / p.lanes;
    /* The whole block takes each step, so that every thread meets the
     * barrier: a line's lanes read its L before the first lane rewrites it. */
    for (fa_long first = (fa_long)blockIdx.x * per_block; first < p.lines; first += (fa_long)gridDim.x * per_block) {
        const fa_long line = first + (int)threadIdx.x / p.lanes;
        const bool live = line < p.lines;
        fa_line_pos q = {0, 0, 0};
        float la = 0.0f, lp = -FA_INF;
        if (live) {
            q = fa_pos_of(p, line);
            la = acc_l[fa_start_of(p, FA_ACC_L, q)];
            lp = part_l[fa_start_of(p, FA_PART_L, q)];
        }
        const fa_merge_step m = fa_merge_of(la, lp);
        __syncthreads();
        if (!live || m.skip) continue;
        const fa_long a0 = fa_start_of(p, FA_ACC_O, q), p0 = fa_start_of(p, FA_PART_O, q);
        for (int x = lane; x < p.dim; x += p.lanes) {
            const float part = fa_elem<P>::load(part_o, p0 + x);
            acc_o[a0 + x] = m.assign ? part : acc_o[a0 + x] * m.w_acc + part * m.w_part;
        }
        if (lane == 0) acc_l[fa_start_of(p, FA_ACC_L, q)] = m.l;
    }
}

extern "C" __global__ __launch_bounds__(FA_ROWS_THREADS) void fa_rows_merge(const fa_rows_params p) {
    switch (p.dtype[FA_PART_O]) {
    case FA_DT_F16: fa_merge_lines<FA_DT_F16>(p); break;
    case FA_DT_BF16: fa_merge_lines<FA_DT_BF16>(p); break;
    default: fa_merge_lines<FA_DT_F32>(p); break;
    }
}
