/* Shared by every attention program (OpenCL C 1.2, no extension needed):
 * storage dtypes, Philox4x32-10 dropout, masks, and the tile geometry that
 * the build options fix.
 *
 * Build options (all set by backends/opencl/cl_attention.c from the plan):
 *   HEAD_DIM BR BC TR TC          tile shape: a work-group holds a BR x BC
 *                                 score tile, each work-item a TR x TC
 *                                 micro-tile of it
 *   DTYPE_F32 | DTYPE_F16 | DTYPE_BF16   storage dtype of Q, K, V, O and grads
 *   CAUSAL WINDOW BLOCK_MASK DROPOUT VARLEN   options present in the plan
 *   SOFTCAP ALIBI BIAS [BIAS_F32] score options present in the plan (below)
 *   FA_STREAM                     the streaming kernels (below) instead of
 *                                 the SIMT ones
 *
 * Indexing conventions: a work-item is (tr, tc) with tc the fastest. Its
 * micro-tile of scores is rows tr * TR + i and columns tc * TC + j, read from
 * transposed local tiles as whole vectors; the output columns (head
 * dimensions) it accumulates are tc + u * NTC, so that neighbouring
 * work-items touch neighbouring words of V and of the outputs. */

#define NTR (BR / TR) /* work-items along the rows of a tile */
#define NTC (BC / TC) /* work-items along the columns of a tile */
#define WG_SIZE (NTR * NTC)
#define D8 (HEAD_DIM / 8)

/* Helpers are static: OpenCL C 1.2 follows C99, where a plain inline
 * definition may leave an undefined symbol when the compiler declines to
 * inline it. */
#define FA_FN static inline

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.69314718055994531f

/* The query tile of a forward work-group. Under the causal mask the last
 * tiles see the most keys: they are started first, so that the light ones
 * fill the end of the grid instead of the heavy ones. */
#ifdef CAUSAL
#define FA_QUERY_TILE() ((int)get_num_groups(0) - 1 - (int)get_group_id(0))
#else
#define FA_QUERY_TILE() ((int)get_group_id(0))
#endif

/* ------------------------------------------------------------------------ */
/* Storage dtypes. Every load widens to fp32; every store rounds to nearest */
/* even. Chunks of 8 elements are one 16- or 32-byte access (offsets and    */
/* strides are multiples of 16 bytes and HEAD_DIM of 8), read as aligned    */
/* 16-byte vectors: vloadn may assume no more than the element's alignment, */
/* and a compiler then splits it into element loads.                        */
/* ------------------------------------------------------------------------ */

#if defined(DTYPE_F32)
typedef float store_t;

FA_FN float8 f32_load8(__global const float *p) {
    const float4 a = *(__global const float4 *)p, b = *(__global const float4 *)(p + 4);
    return (float8)(a, b);
}

FA_FN void f32_store8(__global float *p, float8 v) {
    *(__global float4 *)p = v.lo;
    *(__global float4 *)(p + 4) = v.hi;
}

#define LOAD8(p, i) f32_load8((p) + (i))
#define STORE1(p, i, val) ((p)[i] = (val))
#define STORE8(p, i, val) f32_store8((p) + (i), (val))
#elif defined(DTYPE_F16)
/* half is only used as a pointer type: vload_half/vstore_half need no
 * cl_khr_fp16. */
typedef half store_t;

FA_FN float8 f16_load8(__global const half *p) {
    ushort bits[8];
    vstore8(as_ushort8(*(__global const uint4 *)p), 0, bits);
    return vload_half8(0, (const half *)bits);
}

FA_FN void f16_store8(__global half *p, float8 v) {
    ushort bits[8];
    vstore_half8_rte(v, 0, (half *)bits);
    *(__global uint4 *)p = as_uint4(vload8(0, bits));
}

#define LOAD8(p, i) f16_load8((p) + (i))
#define STORE1(p, i, val) vstore_half_rte((val), 0, (p) + (i))
#define STORE8(p, i, val) f16_store8((p) + (i), (val))
#elif defined(DTYPE_BF16)
typedef ushort store_t;

FA_FN float8 bf16_load8(__global const ushort *p) {
    return as_float8(convert_uint8(as_ushort8(*(__global const uint4 *)p)) << (uint8)16);
}

/* Round to nearest even on the bits; a NaN stays a (quiet) NaN instead of
 * rounding up into the infinity pattern. */
FA_FN ushort bf16_round(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

FA_FN void bf16_store8(__global ushort *p, float8 v) {
    const ushort8 h = (ushort8)(bf16_round(v.s0), bf16_round(v.s1), bf16_round(v.s2), bf16_round(v.s3),
                                bf16_round(v.s4), bf16_round(v.s5), bf16_round(v.s6), bf16_round(v.s7));
    *(__global uint4 *)p = as_uint4(h);
}

#define LOAD8(p, i) bf16_load8((p) + (i))
#define STORE1(p, i, val) ((p)[i] = bf16_round(val))
#define STORE8(p, i, val) bf16_store8((p) + (i), (val))
#else
#error "one of DTYPE_F32, DTYPE_F16, DTYPE_BF16 must be defined"
#endif

/* Scatter the 8 values of a chunk into a transposed local tile: element x of
 * row r goes to dst[x * ld + r]. */
#define STORE8_T(dst, ld, x0, r, val)                                          \
    do {                                                                       \
        (dst)[((x0) + 0) * (ld) + (r)] = (val).s0;                             \
        (dst)[((x0) + 1) * (ld) + (r)] = (val).s1;                             \
        (dst)[((x0) + 2) * (ld) + (r)] = (val).s2;                             \
        (dst)[((x0) + 3) * (ld) + (r)] = (val).s3;                             \
        (dst)[((x0) + 4) * (ld) + (r)] = (val).s4;                             \
        (dst)[((x0) + 5) * (ld) + (r)] = (val).s5;                             \
        (dst)[((x0) + 6) * (ld) + (r)] = (val).s6;                             \
        (dst)[((x0) + 7) * (ld) + (r)] = (val).s7;                             \
    } while (0)

/* Moves of N = 1, 2, 4 or 8 consecutive floats between a local tile and a
 * private array, as one wide access: the local offset is a multiple of N
 * and tiles are declared FA_LOCAL_ALIGN, so the vector is aligned.
 * FA_VLOAD_TR/TC pick the widest form the micro-tile allows. */
#define FA_LOCAL_ALIGN __attribute__((aligned(32)))
#define FA_VLOAD_1(dst, p) ((dst)[0] = *(p))
#define FA_VLOAD_2(dst, p) vstore2(*(__local const float2 *)(p), 0, (dst))
#define FA_VLOAD_4(dst, p) vstore4(*(__local const float4 *)(p), 0, (dst))
#define FA_VLOAD_8(dst, p) vstore8(*(__local const float8 *)(p), 0, (dst))
#define FA_VSTORE_1(src, p) (*(p) = (src)[0])
#define FA_VSTORE_2(src, p) (*(__local float2 *)(p) = vload2(0, (src)))
#define FA_VSTORE_4(src, p) (*(__local float4 *)(p) = vload4(0, (src)))
#define FA_VSTORE_8(src, p) (*(__local float8 *)(p) = vload8(0, (src)))
#define FA_CAT_(a, b) a##b
#define FA_CAT(a, b) FA_CAT_(a, b)
#define FA_VLOAD(n, dst, p) FA_CAT(FA_VLOAD_, n)(dst, p)
#define FA_VSTORE(n, src, p) FA_CAT(FA_VSTORE_, n)(src, p)
/* Other widths (a forced 3 or 6, say) move element by element. */
#define FA_VLOAD_ANY(n, dst, p)                                                \
    do {                                                                       \
        for (int k_ = 0; k_ < (n); k_++) (dst)[k_] = (p)[k_];                  \
    } while (0)
#define FA_VSTORE_ANY(n, src, p)                                               \
    do {                                                                       \
        for (int k_ = 0; k_ < (n); k_++) (p)[k_] = (src)[k_];                  \
    } while (0)
#if TR == 1 || TR == 2 || TR == 4 || TR == 8
#define FA_VLOAD_TR(dst, p) FA_VLOAD(TR, dst, p)
#define FA_VSTORE_TR(src, p) FA_VSTORE(TR, src, p)
#else
#define FA_VLOAD_TR(dst, p) FA_VLOAD_ANY(TR, dst, p)
#define FA_VSTORE_TR(src, p) FA_VSTORE_ANY(TR, src, p)
#endif
#if TC == 1 || TC == 2 || TC == 4 || TC == 8
#define FA_VLOAD_TC(dst, p) FA_VLOAD(TC, dst, p)
#define FA_VSTORE_TC(src, p) FA_VSTORE(TC, src, p)
#else
#define FA_VLOAD_TC(dst, p) FA_VLOAD_ANY(TC, dst, p)
#define FA_VSTORE_TC(src, p) FA_VSTORE_ANY(TC, src, p)
#endif

/* ------------------------------------------------------------------------ */
/* Streaming kernels (FA_STREAM): no tile of Q, K or V over the whole       */
/* head_dim in local memory. Products over head_dim stream both operands    */
/* in chunks of DC dimensions (region A); products over the tile stream     */
/* whole rows of one head_dim-wide operand (region R) beside the tile of    */
/* probabilities or dS (region T). Loads of the next chunk go to registers  */
/* (a "stage" of 8-element units per work-item) before the current chunk is */
/* computed, and are stored to local memory after it. The chunk sizes are   */
/* the planner's (core/planner.c, stream_geom): change both together.       */
/* ------------------------------------------------------------------------ */

#ifdef FA_STREAM
/* FA_GPU (set by the host for GPUs) changes three things that do not
 * change what is computed:
 * - loops whose counter indexes a private array are unrolled whole: an
 *   array indexed at run time lives in slow private memory on a GPU, not in
 *   registers (a CPU compiler gains only compile time from it);
 * - the global loads of the next chunk are issued after the barrier that
 *   publishes the current chunk (FA_LOADS_AFTER), so that they complete
 *   while it is computed rather than before a barrier that may wait for
 *   them. PoCL, which runs the work-items of a group as loops between
 *   barriers, computed wrong results with the loads there (a stage written
 *   after one barrier and stored to local memory after the next), so CPUs
 *   issue them before the barrier (FA_LOADS_BEFORE);
 * - the step loops of a chunk (one dimension of Q K^T, or one key of P V,
 *   per step) are unrolled FA_STEP_UNROLL times, so that the local loads of
 *   later steps issue ahead of the FMAs of this one. On the H200 (NVIDIA's
 *   OpenCL, fp32, d = 128, 128 x 64 tiles, N = 4096) the forward ran 25.5
 *   TFLOP/s with no unrolling, 27.0 as the compiler chose, 27.6 by 4, 30.1
 *   by 8, 30.5 by 16 and 31.0 by 32, the whole chunk there
 *   (bench/results/h200.md). A build option may set another factor. */
#define FA_PRAGMA_(text) _Pragma(#text)
#define FA_PRAGMA(text) FA_PRAGMA_(text)
#ifdef FA_GPU
#define FA_UNROLL _Pragma("unroll")
#define FA_UNROLL_STEPS FA_PRAGMA(unroll FA_STEP_UNROLL)
#define FA_LOADS_BEFORE(stmt) ((void)0)
#define FA_LOADS_AFTER(stmt) stmt
#else
#define FA_UNROLL
#define FA_UNROLL_STEPS
#define FA_LOADS_BEFORE(stmt) stmt
#define FA_LOADS_AFTER(stmt) ((void)0)
#endif
#ifndef FA_STEP_UNROLL
#define FA_STEP_UNROLL 32
#endif
#define FA_MAX(a, b) ((a) > (b) ? (a) : (b))
#define FA_POW2(n) (((n) & ((n) - 1)) == 0)
/* The largest power of two of rows whose head_dim words fit in 2048. */
#if HEAD_DIM <= 8
#define FA_ROW_CAP 256
#elif HEAD_DIM <= 16
#define FA_ROW_CAP 128
#elif HEAD_DIM <= 32
#define FA_ROW_CAP 64
#elif HEAD_DIM <= 64
#define FA_ROW_CAP 32
#elif HEAD_DIM <= 128
#define FA_ROW_CAP 16
#else
#define FA_ROW_CAP 8
#endif
/* Rows per chunk of R for a tile side of n rows: all of them when they are
 * few (or not a power of two), else FA_ROW_CAP, which divides n. */
#define FA_ROWS_OF(n) (((n) * HEAD_DIM <= 2048 || !FA_POW2(n)) ? (n) : FA_ROW_CAP)
/* The tile region, padded so that R starts on a 32-byte boundary. */
#define FA_T_WORDS ((BR * BC + 7) / 8 * 8)

/* Accumulators over head dimensions are spread over n work-items in
 * groups of G consecutive dimensions: group u of work-item w covers
 * dimensions (u * n + w) * G ... + G - 1, so that neighbouring work-items
 * read neighbouring vectors of a row. G is the widest of 4, 2, 1 that tiles
 * HEAD_DIM exactly (the kernels pick it with #if); with G = 1 the last
 * group may run past HEAD_DIM, and those dimensions are read clamped and
 * never stored. */
#define FA_GROUPS_OF(n, g) ((HEAD_DIM + (g) * (n) - 1) / ((g) * (n)))

/* Loads of the next chunk into the stage, and their stores to local memory.
 * A chunk is made of units of 8 consecutive elements of one row; unit s of
 * a work-item (s = 0, 1, ...) is chosen so that, wherever the work-group
 * size allows, all units of a work-item share their row or their column
 * and their addresses differ by constants (few address registers). Rows
 * [0, valid) of a source are read, the rest zero-filled. */

/* dc8 * 8 dimensions from x0 of `rows` rows, units spread row-fastest: the
 * transposed local copy (element x of row r at x * rows + r) is then
 * stored without bank conflicts. */
#define FA_COLS_ITEMS(rows, dc8) (((rows) * (dc8) + WG_SIZE - 1) / WG_SIZE)
#define FA_COLS_UNIT(rows, lid, s, r, xu)                                                  \
    do {                                                                                   \
        if (WG_SIZE % (rows) == 0) {                                                       \
            (r) = (lid) % (rows);                                                          \
            (xu) = (lid) / (rows) + (s) * (WG_SIZE / (rows));                              \
        } else {                                                                           \
            (r) = ((lid) + (s) * WG_SIZE) % (rows);                                        \
            (xu) = ((lid) + (s) * WG_SIZE) / (rows);                                       \
        }                                                                                  \
    } while (0)

FA_FN float8 fa_stream_load_cols(__global const store_t *p, long base, long stride, int rows, int dc8,
                                  int valid, int x0, int lid, int s) {
    int r, xu;
    FA_COLS_UNIT(rows, lid, s, r, xu);
    float8 val = (float8)(0.0f);
    if (xu < dc8 && r < valid) val = LOAD8(p, base + (long)r * stride + x0 + xu * 8);
    return val;
}

FA_FN void fa_stream_store_cols(__local float *dst, int rows, int dc8, int lid, int s, float8 val) {
    int r, xu;
    FA_COLS_UNIT(rows, lid, s, r, xu);
    if (xu < dc8) STORE8_T(dst + xu * 8 * rows, rows, 0, r, val);
}

/* Whole rows (all HEAD_DIM dimensions) of `rows` rows, units spread along
 * the row: the global reads coalesce and the local copy is row-major. */
#define FA_ROWS_ITEMS(rows) (((rows) * D8 + WG_SIZE - 1) / WG_SIZE)
#define FA_ROWS_UNIT(lid, s, r, xu)                                                        \
    do {                                                                                   \
        if (WG_SIZE % D8 == 0) {                                                           \
            (xu) = (lid) % D8;                                                             \
            (r) = (lid) / D8 + (s) * (WG_SIZE / D8);                                       \
        } else {                                                                           \
            (xu) = ((lid) + (s) * WG_SIZE) % D8;                                           \
            (r) = ((lid) + (s) * WG_SIZE) / D8;                                            \
        }                                                                                  \
    } while (0)

FA_FN float8 fa_stream_load_rows(__global const store_t *p, long base, long stride, int rows, int valid, int lid,
                                  int s) {
    int r, xu;
    FA_ROWS_UNIT(lid, s, r, xu);
    float8 val = (float8)(0.0f);
    if (r < rows && r < valid) val = LOAD8(p, base + (long)r * stride + xu * 8);
    return val;
}

FA_FN void fa_stream_store_rows(__local float *dst, int rows, int lid, int s, float8 val) {
    int r, xu;
    FA_ROWS_UNIT(lid, s, r, xu);
    if (r < rows) vstore8(val, 0, dst + r * HEAD_DIM + xu * 8);
}

#endif

#ifdef DQ_ATOMIC
/* Adds v to *p atomically (OpenCL C 1.2 has no float atomics): the
 * hardware's float add through inline PTX on NVIDIA (FA_NV_PTX, set by the
 * host where the device takes NVIDIA's compiler options), else a
 * compare-and-swap loop on the bits. */
FA_FN void fa_atomic_add(volatile __global float *p, float v) {
#ifdef FA_NV_PTX
    __asm__ __volatile__("red.global.add.f32 [%0], %1;" : : "l"(p), "f"(v) : "memory");
#else
    union {
        uint u;
        float f;
    } seen, want;
    seen.f = *p;
    for (;;) {
        want.f = seen.f + v;
        const uint got = atomic_cmpxchg((volatile __global uint *)p, seen.u, want.u);
        if (got == seen.u) break;
        seen.u = got;
    }
#endif
}

/* p[0] += a and p[1] += b, p 8-byte aligned: one vector reduction with
 * FA_RED_V2 (a tuning option for NVIDIA's sm_90 and later, whose PTX 8.1
 * has red.global.add.v2.f32), two adds otherwise. */
FA_FN void fa_atomic_add2(volatile __global float *p, float a, float b) {
#if defined(FA_NV_PTX) && defined(FA_RED_V2)
    __asm__ __volatile__("red.global.add.v2.f32 [%0], {%1, %2};" : : "l"(p), "f"(a), "f"(b) : "memory");
#else
    fa_atomic_add(p, a);
    fa_atomic_add(p + 1, b);
#endif
}
#endif

/* ------------------------------------------------------------------------ */
/* Sequences: where each tensor of one (batch, head) pair starts.           */
/* ------------------------------------------------------------------------ */

/* Element strides of one tensor, packed strides already resolved on the
 * host; long because tensors may exceed 2^31 elements. */
typedef struct fa_layout {
    long offset, stride_batch, stride_seq, stride_head;
} fa_layout;

/* Lengths of sequence b and the token index of its first element: with
 * VARLEN from the cumulative offsets, else b * seqlen. */
typedef struct fa_seq {
    int len_q, len_k;
    long start_q, start_k;
} fa_seq;

FA_FN fa_seq fa_seq_of(int b, int seqlen_q, int seqlen_k, __global const int *cu_q,
                        __global const int *cu_k) {
    fa_seq s;
#ifdef VARLEN
    s.start_q = cu_q[b];
    s.len_q = cu_q[b + 1] - cu_q[b];
    s.start_k = cu_k[b];
    s.len_k = cu_k[b + 1] - cu_k[b];
#else
    s.start_q = (long)b * seqlen_q;
    s.len_q = seqlen_q;
    s.start_k = (long)b * seqlen_k;
    s.len_k = seqlen_k;
#endif
    return s;
}

/* Element index of (sequence b, token t, head h, dim 0). */
FA_FN long fa_row_index(fa_layout l, int b, long start, int t, int h) {
#ifdef VARLEN
    return l.offset + (start + t) * l.stride_seq + (long)h * l.stride_head;
#else
    return l.offset + (long)b * l.stride_batch + (long)t * l.stride_seq + (long)h * l.stride_head;
#endif
}

/* Index of L (and of the backward pass's D) for (b, h, t): [batch, heads,
 * seqlen] packed, or [heads, total_q] with VARLEN. */
FA_FN long fa_lse_index(int b, int h, int t, int heads_q, int seqlen_q, long start_q,
                         long total_q) {
#ifdef VARLEN
    return (long)h * total_q + start_q + t;
#else
    return ((long)b * heads_q + h) * seqlen_q + t;
#endif
}

/* ------------------------------------------------------------------------ */
/* Masks (include/flashattn.h), on positions within one sequence.           */
/*                                                                          */
/* A position is a tile's first row or key (q0, k0: always inside the       */
/* sequence) plus an offset in the tile (r, c). q0 + r may pass INT_MAX on  */
/* the last tile of a sequence near 2^31 tokens, and window bounds take any */
/* int: every test below compares what is left of the sequence, or works   */
/* in 64 bits where it runs once per tile, so that no sum can overflow.     */
/* ------------------------------------------------------------------------ */

typedef struct fa_mask {
    int len_q, len_k;
    int window_left, window_right; /* negative: unlimited */
    int block_q, block_k, block_cols;
} fa_mask;

/* Whether query q0 + r sees key k0 + c. Padding rows and keys (past their
 * sequence) see nothing: their results are never stored, and the block
 * mask has no entries for them. The causal and window masks look at the
 * distance of key j from query i's diagonal i + len_k - len_q,
 * d = (j - i) - (len_k - len_q): visible iff d <= 0 (causal),
 * d <= window_right and d >= -window_left. With i and j inside the
 * sequence, d lies in [1 - len_k, len_q - 1]: no step overflows, whatever
 * the window bounds. */
FA_FN bool fa_visible(const fa_mask *m, __global const uchar *block_mask, int q0, int r, int k0, int c) {
    if (r >= m->len_q - q0 || c >= m->len_k - k0) return false;
    const int i = q0 + r, j = k0 + c;
    (void)i;
    (void)j;
    (void)block_mask;
#if defined(CAUSAL) || defined(WINDOW)
    const int d = (j - i) - (m->len_k - m->len_q);
#endif
#ifdef CAUSAL
    if (d > 0) return false;
#endif
#ifdef WINDOW
    if (m->window_left >= 0 && d < -m->window_left) return false;
    if (m->window_right >= 0 && d > m->window_right) return false;
#endif
#ifdef BLOCK_MASK
    if (!block_mask[(long)(i / m->block_q) * m->block_cols + j / m->block_k]) return false;
#endif
    return true;
}

/* The key range [*lo, *hi) that rows [r0, r1] (inside the sequence) may
 * see under the causal and window masks (the block mask is handled per
 * tile). In 64 bits: r1 + off + window_right + 1 passes INT_MAX. */
FA_FN void fa_key_range(const fa_mask *m, int r0, int r1, int *lo, int *hi) {
    const long off = (long)m->len_k - m->len_q;
    long a = 0, b = m->len_k;
    (void)off;
    (void)r0;
    (void)r1;
#ifdef CAUSAL
    b = min(b, r1 + off + 1);
#endif
#ifdef WINDOW
    if (m->window_right >= 0) b = min(b, r1 + off + m->window_right + 1);
    if (m->window_left >= 0) a = max(a, r0 + off - m->window_left);
#endif
    /* 0 <= a < len_k (r0 < len_q) and b <= len_k: both fit an int. */
    *lo = (int)a;
    *hi = (int)max(a, b);
}

/* The query range [*lo, *hi) that may see keys [c0, c1] (inside the
 * sequence). */
FA_FN void fa_query_range(const fa_mask *m, int c0, int c1, int *lo, int *hi) {
    const long off = (long)m->len_k - m->len_q;
    long a = 0, b = m->len_q;
    (void)off;
    (void)c0;
    (void)c1;
#ifdef CAUSAL
    a = max(a, c0 - off);
#endif
#ifdef WINDOW
    if (m->window_right >= 0) a = max(a, c0 - off - m->window_right);
    if (m->window_left >= 0) b = min(b, c1 - off + m->window_left + 1);
#endif
    /* 0 <= a < len_q (c0 < len_k) and b <= len_q: both fit an int. */
    *lo = (int)a;
    *hi = (int)max(a, b);
}

/* The tiles a range [lo, hi) of rows or keys falls in, for tiles of n:
 * [*t0, *t1), empty for an empty range. No lo + n - 1: hi may be INT_MAX. */
FA_FN void fa_tile_span(int lo, int hi, int n, int *t0, int *t1) {
    *t0 = lo / n;
    *t1 = hi > lo ? (hi - 1) / n + 1 : *t0;
}

/* Tile classes: the host's tile map says, per (query tile, key tile), what
 * the block mask leaves of it (0 nothing, 1 part, 2 all). */
#define FA_TILE_SKIP 0
#define FA_TILE_PARTIAL 1
#define FA_TILE_FULL 2

/* Skipping a tile is part of the loop control (the next tile worth
 * computing), never a branch around barriers in the loop body: every
 * work-item of a group runs the same iterations, and compilers that turn a
 * work-group into loops over work-items (PoCL) see plain loops. */

/* First key tile >= t (and < t_end) the block mask leaves anything of, for
 * the query tile starting at q0. */
FA_FN int fa_next_key_tile(__global const uchar *tile_map, int tile_cols, int q0, int t, int t_end) {
#ifdef BLOCK_MASK
    const long row = (long)(q0 / BR) * tile_cols;
    while (t < t_end && tile_map[row + t] == FA_TILE_SKIP) t++;
#endif
    return t;
}

/* First query tile >= t (and < t_end) the block mask leaves anything of,
 * for the key tile starting at k0. */
FA_FN int fa_next_query_tile(__global const uchar *tile_map, int tile_cols, int k0, int t, int t_end) {
#ifdef BLOCK_MASK
    while (t < t_end && tile_map[(long)t * tile_cols + k0 / BC] == FA_TILE_SKIP) t++;
#endif
    return t;
}

/* Whether every element of the tile [q0, q0 + BR) x [k0, k0 + BC) is
 * visible (FA_TILE_FULL: no per-element test needed) or only some
 * (FA_TILE_PARTIAL). Rows past len_q count only with FA_ROWS_FEED_KEYS:
 * in the dK/dV kernels every row of a tile adds to the keys' sums, and a
 * padding row's zero query times a key holding inf would add NaN; elsewhere
 * they are padding whose results are never stored. */
#define FA_ROWS_STORED 0
#define FA_ROWS_FEED_KEYS 1
FA_FN int fa_tile_class(const fa_mask *m, __global const uchar *tile_map, int tile_cols, int q0, int k0,
                        int rows) {
#ifdef BLOCK_MASK
    if (tile_map[(long)(q0 / BR) * tile_cols + k0 / BC] != FA_TILE_FULL) return FA_TILE_PARTIAL;
#else
    (void)tile_map;
    (void)tile_cols;
#endif
    if (BC > m->len_k - k0) return FA_TILE_PARTIAL;
    if (rows == FA_ROWS_FEED_KEYS && BR > m->len_q - q0) return FA_TILE_PARTIAL;
    const long r1 = (long)q0 + min(BR, m->len_q - q0) - 1, c1 = (long)k0 + BC - 1;
    const long off = (long)m->len_k - m->len_q;
    (void)r1;
    (void)c1;
    (void)off;
#ifdef CAUSAL
    if (c1 > q0 + off) return FA_TILE_PARTIAL;
#endif
#ifdef WINDOW
    if (m->window_right >= 0 && c1 > q0 + off + m->window_right) return FA_TILE_PARTIAL;
    if (m->window_left >= 0 && k0 < r1 + off - m->window_left) return FA_TILE_PARTIAL;
#endif
    return FA_TILE_FULL;
}

/* ------------------------------------------------------------------------ */
/* The end of a row's online softmax (the rules for NaN and infinities are   */
/* above fa_forward in include/flashattn.h).                                 */
/* ------------------------------------------------------------------------ */

/* Whether the masks leave query q0 + r (inside the sequence) any key: its
 * key range under the causal and window masks, then the block mask's
 * blocks over that range. A row's running maximum stays -inf when no key
 * is visible, but also when its visible scores were all NaN (max ignores
 * them) or -inf; values must never make a row look masked, so the masks
 * decide. Called at the end, for rows whose maximum stayed -inf only:
 * nothing is added per element or per tile. */
FA_FN bool fa_row_sees_key(const fa_mask *m, __global const uchar *block_mask, int q0, int r) {
    if (r >= m->len_q - q0) return false; /* padding: never stored */
    const int i = q0 + r;
    int lo, hi;
    fa_key_range(m, i, i, &lo, &hi);
    if (hi <= lo) return false;
#ifdef BLOCK_MASK
    const long row = (long)(i / m->block_q) * m->block_cols;
    for (int c = lo / m->block_k; c <= (hi - 1) / m->block_k; c++)
        if (block_mask[row + c]) return true;
    return false;
#else
    (void)block_mask;
    return true;
#endif
}

/* L of a finished row that sees a key, from m and l = sum of exp2(s - m)
 * (base 2): NaN where a NaN met l, or where the visible scores were all
 * -inf (l = 0: the softmax is 0 / 0, and O, the accumulator over l, is
 * NaN too); else ln of the sum. A key split's partial row (SPLITK builds)
 * keeps -inf for l = 0 instead: no mass, which the merge weighs as nothing
 * and turns into NaN only if no split has any (splitk.cl). */
FA_FN float fa_row_lse(float m, float l) {
#ifndef SPLITK
    if (l == 0.0f) return NAN;
#endif
    return (m + log2(l)) * FA_LN2;
}

/* ------------------------------------------------------------------------ */
/* Score options (include/flashattn.h, "Score options"), each built in only */
/* where the plan has it: SOFTCAP, ALIBI, BIAS (with BIAS_F32 the bias is   */
/* fp32, else in the storage dtype). Without them a kernel's logit is its   */
/* product q.k times scale_log2, as ever. With any of them (FA_SCORE_OPTIONS) */
/* the kernels turn each product into a base-2 logit with fa_logit2 where   */
/* they form scores, before the masks, and the host passes scale_log2 = 1:  */
/* what multiplies scores afterwards (online maxima, P = exp2(s - L)) then  */
/* takes them as they are. In base 2 the header's logit is               */
/*   log2(e) * (softcap * tanh(scale * q.k / softcap) + bias - slope * |d|) */
/* = score_out * tanh(q.k * score_in) + log2(e) * (bias - slope * |d|),    */
/* score_in = scale / softcap and score_out = softcap * log2(e); without    */
/* SOFTCAP score_out * q.k with score_out = scale * log2(e). The backward  */
/* multiplies dS by fa_logit2's cap_grad, 1 - tanh^2; bias and ALiBi add    */
/* nothing to it.                                                           */
/* ------------------------------------------------------------------------ */

#if defined(SOFTCAP) || defined(ALIBI) || defined(BIAS)
#define FA_SCORE_OPTIONS
#endif

/* The bias dtype and one element of it as fp32 (the bias asks no alignment
 * beyond its element's). */
#if defined(BIAS_F32) || defined(DTYPE_F32)
typedef float bias_t;
#define FA_BIAS_LOAD(p, i) ((p)[i])
#elif defined(DTYPE_F16)
typedef half bias_t;
#define FA_BIAS_LOAD(p, i) vload_half((i), (p))
#else
typedef ushort bias_t;
#define FA_BIAS_LOAD(p, i) as_float((uint)(p)[i] << 16)
#endif

/* What fa_logit2 needs of one (sequence, query head). */
typedef struct fa_score {
    float score_in, score_out;
#ifdef ALIBI
    float slope;                 /* the head's slope times log2(e) */
    int diag;                    /* len_k - len_q: bottom-right aligned */
#endif
#ifdef BIAS
    __global const bias_t *bias; /* the head's plane, element (0, 0) */
    long stride_seq;             /* elements between query rows */
    int len_q, len_k;
#endif
} fa_score;

/* The bias is element offset + b * stride_batch + h * stride_head + i *
 * stride_seq + j of its buffer (broadcast dimensions have stride 0). */
FA_FN fa_score fa_score_of(float score_in, float score_out, __global const float *slopes,
                           __global const bias_t *bias, long bias_off, long bias_sb, long bias_sh, long bias_ss,
                           int b, int h, int len_q, int len_k) {
    fa_score sc;
    sc.score_in = score_in;
    sc.score_out = score_out;
#ifdef ALIBI
    sc.slope = slopes[h] * FA_LOG2E;
    sc.diag = len_k - len_q;
#else
    (void)slopes;
#endif
#ifdef BIAS
    sc.bias = bias + (bias_off + (long)b * bias_sb + (long)h * bias_sh);
    sc.stride_seq = bias_ss;
    sc.len_q = len_q;
    sc.len_k = len_k;
#else
    (void)bias;
    (void)bias_off;
    (void)bias_sb;
    (void)bias_sh;
    (void)bias_ss;
    (void)b;
    (void)h;
    (void)len_q;
    (void)len_k;
#endif
    return sc;
}

/* fa_score_of with the kernel arguments of FA_SCORE_PARAMS. */
#define FA_SCORE_SETUP(b_, h_, len_q_, len_k_)                                              \
    fa_score_of(score_in, score_out, alibi_slopes, bias, bias_off, bias_sb, bias_sh, bias_ss, (b_), (h_), \
                (len_q_), (len_k_))

/* The base-2 logit of query i against key j (positions in the sequence)
 * from their product q.k; with SOFTCAP *cap_grad receives 1 - tanh^2 of
 * the capped score (left alone otherwise). Positions are unsigned: a
 * tile's origin plus an offset may pass INT_MAX on a padding row near
 * 2^31 tokens, and wraps harmlessly. Padding positions (past the sequence:
 * masked, or never stored) read no bias. The ALiBi distance
 * |i + len_k - len_q - j| is exact for positions in the sequence. */
FA_FN float fa_logit2(const fa_score *sc, float dot, uint i, uint j, float *cap_grad) {
#ifdef SOFTCAP
    const float t = tanh(dot * sc->score_in);
    float s = sc->score_out * t;
    *cap_grad = fma(-t, t, 1.0f);
#else
    float s = dot * sc->score_out;
    (void)cap_grad;
#endif
#ifdef BIAS
    if (i < (uint)sc->len_q && j < (uint)sc->len_k)
        s = fma(FA_BIAS_LOAD(sc->bias, (long)i * sc->stride_seq + j), FA_LOG2E, s);
#endif
#ifdef ALIBI
    const uint dist = abs((int)(j - i - (uint)sc->diag));
    s = fma(-sc->slope, (float)dist, s);
#endif
    (void)i;
    (void)j;
    return s;
}

/* dS of the capped score times cap_grad; 1 without SOFTCAP. */
#ifdef SOFTCAP
#define FA_CAP_GRAD(g) (g)
#else
#define FA_CAP_GRAD(g) 1.0f
#endif

FA_FN float fa_fwd_logit2(const fa_score *sc, float dot, uint i, uint j) {
    float unused;
    return fa_logit2(sc, dot, i, j, &unused);
}

/* The FMA kernels' hooks: FA_SCORE_DECL declares `sc` for sequence b_ and
 * query head h_ (nothing without options); FA_LOGIT2 is the base-2 logit
 * of the product dot of query q0 + r and key k0 + c (tile origin plus
 * offset), FA_LOGIT2_GRAD the same with fa_logit2's cap_grad (a float *). */
#ifdef FA_SCORE_OPTIONS
#define FA_SCORE_DECL(b_, h_, len_q_, len_k_) const fa_score sc = FA_SCORE_SETUP(b_, h_, len_q_, len_k_)
#define FA_LOGIT2(dot, q0, r, k0, c) fa_fwd_logit2(&sc, (dot), (uint)(q0) + (uint)(r), (uint)(k0) + (uint)(c))
#define FA_LOGIT2_GRAD(dot, q0, r, k0, c, g)                                                \
    fa_logit2(&sc, (dot), (uint)(q0) + (uint)(r), (uint)(k0) + (uint)(c), (g))
#else
#define FA_SCORE_DECL(b_, h_, len_q_, len_k_) (void)0
#define FA_LOGIT2(dot, q0, r, k0, c) ((dot) * scale_log2)
#define FA_LOGIT2_GRAD(dot, q0, r, k0, c, g) ((dot) * scale_log2)
#endif

/* ------------------------------------------------------------------------ */
/* Dropout: Philox4x32-10 exactly as core/philox.h defines it.              */
/* ------------------------------------------------------------------------ */

FA_FN uint4 fa_philox(uint4 c, uint k0, uint k1) {
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint hi0 = mul_hi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        uint hi1 = mul_hi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = (uint4)(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

typedef struct fa_dropout {
    uint key0, key1, offset_lo, threshold;
    float keep_scale; /* 1 / (1 - p) */
    /* The plan's dropout origin (core/plan.h): added to every row and key
     * the counter takes, so a plan of part of a larger problem draws that
     * problem's mask. col0 is a multiple of 4: groups of four stay whole. */
    uint row0, col0;
} fa_dropout;

/* Marks the dropped elements of a local tile by flipping their sign bit
 * (values are probabilities, so >= 0; a dropped 0 becomes -0). Element
 * (r, c) lives at tile[r * rs + c * cs] and stands for query q0 + r, key
 * k0 + c of sequence b, head h. One Philox call covers four neighbouring
 * keys, and the work-group shares the calls: BR * BC / 4 of them per tile
 * whatever the micro-tiling. Barriers are the caller's. */
FA_FN void fa_dropout_mark(__local float *tile, int rs, int cs, const fa_dropout *dp, int b,
                            int h, int heads_q, int q0, int k0) {
    uint bh = (uint)b * (uint)heads_q + (uint)h;
#if BC % 4 == 0
    for (int e = get_local_id(0); e < BR * (BC / 4); e += WG_SIZE) {
        int r = e % BR, g = e / BR;
        uint col = dp->col0 + (uint)k0 + 4u * (uint)g;
        uint4 rnd = fa_philox((uint4)(col >> 2, dp->row0 + (uint)q0 + (uint)r, bh, dp->offset_lo), dp->key0,
                              dp->key1);
        __local float *t = tile + r * rs + 4 * g * cs;
        if (rnd.x < dp->threshold) t[0] = -t[0];
        if (rnd.y < dp->threshold) t[cs] = -t[cs];
        if (rnd.z < dp->threshold) t[2 * cs] = -t[2 * cs];
        if (rnd.w < dp->threshold) t[3 * cs] = -t[3 * cs];
    }
#else
    for (int e = get_local_id(0); e < BR * BC; e += WG_SIZE) {
        int r = e % BR, c = e / BR;
        uint col = dp->col0 + (uint)k0 + (uint)c;
        uint4 rnd = fa_philox((uint4)(col >> 2, dp->row0 + (uint)q0 + (uint)r, bh, dp->offset_lo), dp->key0,
                              dp->key1);
        uint w = (col & 3u) == 0u ? rnd.x : (col & 3u) == 1u ? rnd.y : (col & 3u) == 2u ? rnd.z : rnd.w;
        if (w < dp->threshold) tile[r * rs + c * cs] = -tile[r * rs + c * cs];
    }
#endif
}

/* The score options' arguments, last in every forward and backward kernel's
 * list (every build takes them; a build without an option ignores its
 * arguments): the bias (buffer, offset and strides in elements), the ALiBi
 * slopes (heads_q floats) and fa_score's score_in, score_out. */
#define FA_SCORE_PARAMS                                                                    \
    __global const bias_t *bias, long bias_off, long bias_sb, long bias_sh, long bias_ss,  \
    __global const float *alibi_slopes, float score_in, float score_out

/* ------------------------------------------------------------------------ */
/* The arguments of every forward kernel after its tensors (q, k, v, o, L:  */
/* fwd.cl, fwd_mma.cl), in the order backends/opencl/cl_attention.c sets.  */
/* ------------------------------------------------------------------------ */

#define FA_FWD_PARAMS                                                                      \
    long q_off, long q_sb, long q_ss, long q_sh,                                           \
    long k_off, long k_sb, long k_ss, long k_sh,                                           \
    long v_off, long v_sb, long v_ss, long v_sh,                                           \
    long o_off, long o_sb, long o_ss, long o_sh,                                           \
    int seqlen_q, int seqlen_k, int heads_q, int group, long total_q, float scale_log2,    \
    __global const int *cu_q, __global const int *cu_k,                                    \
    int window_left, int window_right,                                                     \
    __global const uchar *block_mask, int block_q, int block_k, int block_cols,            \
    __global const uchar *tile_map, int tile_cols,                                         \
    uint drop_key0, uint drop_key1, uint drop_offset_lo, uint drop_threshold,              \
    float drop_scale, uint drop_row0, uint drop_col0,                                      \
    int num_splits, __global float *part_o, __global float *part_l, FA_SCORE_PARAMS
