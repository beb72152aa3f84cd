/* The ring's element-wise passes (core/backend.h: rows, rows_merge) over
 * [batch, rows, heads, dim] views: an offset and three strides in elements,
 * dim contiguous. One program serves every dtype pair: dtypes are kernel
 * arguments (the branches are uniform over a launch), so a context builds
 * it once. Built on its own, without common.h, which wants a plan's tile.
 *
 * Work-items stride over the elements in row-major order of the shape, so
 * neighbours touch neighbouring words of dim; any global size and any
 * work-group size compute the same thing. Indices are 64-bit: a view may
 * lie past 2^32 elements of its buffer. Arithmetic is fp32, as the host
 * model (backends/reference/reference_rows.c). */

#define RS_F32 0
#define RS_F16 1
#define RS_BF16 2

#define RS_COPY 0
#define RS_ADD 1
#define RS_FILL 2

/* Static: OpenCL C 1.2 follows C99, where a plain inline definition may
 * leave an undefined symbol when the compiler declines to inline it. */
#define RS_FN static inline

/* half is only used as a pointer type: vload_half/vstore_half need no
 * cl_khr_fp16, which NVIDIA's OpenCL lacks. */
RS_FN float rs_load(__global const uchar *base, int dtype, long i) {
    if (dtype == RS_F16) return vload_half(0, (__global const half *)base + i);
    if (dtype == RS_BF16) return as_float((uint)((__global const ushort *)base)[i] << 16);
    return ((__global const float *)base)[i];
}

/* Round to nearest even on the bits; a NaN stays a (quiet) NaN instead of
 * rounding up into the infinity pattern. */
RS_FN ushort rs_bf16_round(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

RS_FN void rs_store(__global uchar *base, int dtype, long i, float v) {
    if (dtype == RS_F16)
        vstore_half_rte(v, 0, (__global half *)base + i);
    else if (dtype == RS_BF16)
        ((__global ushort *)base)[i] = rs_bf16_round(v);
    else
        ((__global float *)base)[i] = v;
}

/* n / d and its remainder. 64-bit division is emulated, and slow, on
 * GPUs; indices below 2^32 (nearly all) take the 32-bit one. */
RS_FN ulong rs_divmod(ulong n, uint d, uint *rem) {
    if ((n >> 32) == 0) {
        const uint q = (uint)n / d;
        *rem = (uint)n - q * d;
        return q;
    }
    const ulong q = n / d;
    *rem = (uint)(n - q * d);
    return q;
}

/* Element e (row-major over [batch, rows, heads, dim]) as coordinates. */
typedef struct rs_pos {
    long b, r, h, x;
} rs_pos;

RS_FN rs_pos rs_locate(ulong e, int rows, int heads, int dim) {
    rs_pos p;
    uint rem;
    ulong line = rs_divmod(e, (uint)dim, &rem);
    p.x = rem;
    line = rs_divmod(line, (uint)heads, &rem);
    p.h = rem;
    p.b = (long)rs_divmod(line, (uint)rows, &rem);
    p.r = rem;
    return p;
}

#define RS_VIEW(name) long name##_off, long name##_sb, long name##_ss, long name##_sh
#define RS_AT(name, p) (name##_off + (p).b * name##_sb + (p).r * name##_ss + (p).h * name##_sh + (p).x)

/* dst = src (COPY), dst + src (ADD) or value (FILL), over count =
 * batch * rows * heads * dim elements. src is not read for FILL. */
__kernel void fa_rows(int op, __global uchar *dst, int dst_dtype, RS_VIEW(dst), __global const uchar *src,
                      int src_dtype, RS_VIEW(src), int rows, int heads, int dim, ulong count, float value) {
    for (ulong e = get_global_id(0); e < count; e += get_global_size(0)) {
        const rs_pos p = rs_locate(e, rows, heads, dim);
        const long at = RS_AT(dst, p);
        float v = value;
        if (op != RS_FILL) {
            v = rs_load(src, src_dtype, RS_AT(src, p));
            if (op == RS_ADD) v = rs_load(dst, dst_dtype, at) + v;
        }
        rs_store(dst, dst_dtype, at, v);
    }
}

/* ------------------------------------------------------------------------ */
/* Merge through the log-sum-exp. The O pass and the L pass are two kernels, */
/* queued in that order: every element of a row's O reads the row's old L,  */
/* and work-items of one row may run in different work-groups, so no one of */
/* them may overwrite L before the others have read it. Both compute the    */
/* merged L by the same code, so the O pass's weights belong to the L that  */
/* the L pass stores.                                                        */

#define RS_KEEP 0
#define RS_TAKE 1
#define RS_BLEND 2

typedef struct rs_fold {
    int kind;
    float weight_acc, weight_part, l;
} rs_fold;

/* NaN is looked at first, so that a NaN in either L makes the whole row NaN
 * whatever the other L is (-inf included): the blend's NaN weights do it. */
RS_FN rs_fold rs_fold_of(float la, float lp) {
    rs_fold f;
    f.kind = RS_BLEND;
    f.weight_acc = f.weight_part = f.l = NAN;
    if (isnan(la) || isnan(lp)) return f;
    if (lp == -INFINITY) {
        f.kind = RS_KEEP;
    } else if (la == -INFINITY) {
        f.kind = RS_TAKE;
        f.l = lp;
    } else {
        const float m = la > lp ? la : lp;
        f.l = m + log1p(exp(-fabs(la - lp)));
        f.weight_acc = exp(la - f.l);
        f.weight_part = exp(lp - f.l);
    }
    return f;
}

/* L views have dim 1: element (b, r, h, 0). */
#define RS_LINE_AT(name, p) (name##_off + (p).b * name##_sb + (p).r * name##_ss + (p).h * name##_sh)

__kernel void fa_rows_merge_o(__global float *acc_o, RS_VIEW(ao), __global const float *acc_l, RS_VIEW(al),
                              __global const uchar *part_o, int part_dtype, RS_VIEW(po),
                              __global const float *part_l, RS_VIEW(pl), int rows, int heads, int dim,
                              ulong count) {
    for (ulong e = get_global_id(0); e < count; e += get_global_size(0)) {
        const rs_pos p = rs_locate(e, rows, heads, dim);
        const rs_fold f = rs_fold_of(acc_l[RS_LINE_AT(al, p)], part_l[RS_LINE_AT(pl, p)]);
        if (f.kind == RS_KEEP) continue;
        const float part = rs_load(part_o, part_dtype, RS_AT(po, p));
        const long at = RS_AT(ao, p);
        acc_o[at] = f.kind == RS_TAKE ? part : acc_o[at] * f.weight_acc + part * f.weight_part;
    }
}

/* Queued after fa_rows_merge_o, over count = batch * rows * heads rows. */
__kernel void fa_rows_merge_l(__global float *acc_l, RS_VIEW(al), __global const float *part_l, RS_VIEW(pl),
                              int rows, int heads, ulong count) {
    for (ulong e = get_global_id(0); e < count; e += get_global_size(0)) {
        const rs_pos p = rs_locate(e, rows, heads, 1);
        const long at = RS_LINE_AT(al, p);
        const rs_fold f = rs_fold_of(acc_l[at], part_l[RS_LINE_AT(pl, p)]);
        if (f.kind != RS_KEEP) acc_l[at] = f.l;
    }
}
