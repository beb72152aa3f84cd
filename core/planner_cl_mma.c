/* OpenCL plans on matrix units: the tiles kernels_cl/fwd_mma.cl and
 * bwd_mma.cl run, for the layout of the device's matrix instruction
 * (core/mma_layouts.h). planner.c asks this file, for FA_VARIANT_MMA
 * candidates on OpenCL devices, which tiles and micro-tiles are valid, how
 * much local memory they take and which of them a layout prefers (below,
 * fa_cl_mma_preferred); the OpenCL backend asks it for the same geometry to
 * build the kernels.
 *
 * The kernels (kernels_cl/mma_common.h): a work-group of `warps`
 * sub-groups, each owning `strips` strips of m rows of the tile (query
 * rows forward; keys in the dK/dV kernel backward) and holding their
 * accumulators in fragments. Head_dim is padded with zeros to a multiple
 * of the instruction's k and n (d_pad); tiles over head_dim are 16-bit
 * with one 16-byte chunk of padding a row (row stride d_pad + 8).
 *
 * - Forward: Q [br], K [bc], V [bc] tiles; where the three do not fit in
 *   local memory, Q's fragments stay in registers (QREG) and its tile
 *   shares the words of K's and V's. A layout whose accumulators do not
 *   turn into A operands in registers adds P [br][bc + 8].
 * - Backward, dK/dV kernel: K, V [bc], Q, dO [br] tiles, L and D of the
 *   query tile (fp32); dS [br][bc + 8] for the dQ products added with
 *   atomics (not deterministic); P^T and dS^T [bc][br + 8] where A
 *   operands come from memory. Deterministic mode adds a dQ kernel of
 *   dq_warps = br / m sub-groups (one strip of queries each) over key tiles
 *   of bc: Q, dO [br], K, V [bc], and dS [br][bc + 8] where A operands come
 *   from memory. The pass's figure is the larger kernel's.
 *   Two stages (the pipelined dK/dV kernel): Q and dO twice, the next query
 *   tile loading while the current one is computed; where that does not fit
 *   beside V's tile, V's fragments stay in registers (v_regs, as Q's
 *   forward) and its tile is left out. The planner plans one stage
 *   (planner.c); two run where a plan asks for them. NVIDIA's layout also
 *   holds V in registers in one stage where its tile does not fit
 *   (bwd_v_regs): local memory then holds a key tile of 128 at head_dim 128,
 *   or query tiles of 32. Where even then K's tile does not fit, K and V
 *   are packed in the workspace in fragment order and read from there
 *   (k_packed, bwd_k_packed): local memory holds Q, dO, dS, L and D alone.
 *   A step's queries are computed in chunks (q_chunk rows; the kernel's
 *   QC): the whole tile where a lane's scores of it fit the register
 *   budget, else chunks of one k-step (bwd_q_chunk).
 *
 * A micro-tile (tr x tc) is what one work-item holds of the score tile,
 * as for SIMT plans, so that (br / tr) * (bc / tc) is the work-group:
 * per strip c_rows rows, and c_elems / c_rows columns of every n-wide
 * column tile (forward: tr = strips * c_rows, tc = bc * cols / n;
 * backward, keys down: tc = strips * c_rows, tr = br * cols / n). Where a
 * device's matrix units take two layouts (CDNA: MFMA 32x32x8 and
 * 16x16x16), the micro-tile says which: their columns differ.
 *
 * Registers: the fp32 words of fragments a lane holds must stay within the
 * layout's budget: forward O and S (and Q with QREG), backward dK, dV, S^T
 * and dP^T (and P, dS as operands where they stay in registers), the dQ
 * kernel dQ, S and dP. */
#include "planner_cl_mma.h"

#include "desc.h"
#include "fa_internal.h"
#include "plan_data.h"
#include "planner.h"

#define FA_CL_MMA_MAX_WARPS 8
#define FA_CL_MMA_MAX_STRIPS 2
#define FA_CL_MMA_MAX_STAGES 2

int fa_cl_mma_applies(const fa_device_desc *dev, const fa_attention_desc *desc) {
    return dev && desc && fa_mma_layout_of(dev) != FA_MMA_LAYOUT_NONE &&
           (desc->q.dtype == FA_DTYPE_F16 || desc->q.dtype == FA_DTYPE_BF16);
}

static int d_pad_of(const fa_mma_layout_info *L, int d) {
    const int a = L->k > L->n ? L->k : L->n;
    return (d + a - 1) / a * a;
}

/* 16-bit elements of one head_dim-wide tile of `rows` rows. */
static size_t rows_elems(const fa_mma_layout_info *L, int d, int rows) {
    return (size_t)rows * (size_t)(d_pad_of(L, d) + 8);
}

static int is_pow2_upto(int v, int max) { return v >= 1 && v <= max && (v & (v - 1)) == 0; }

/* Forward local memory with and without QREG (bytes). */
static size_t fwd_local(const fa_mma_layout_info *L, int d, int br, int bc, int q_regs) {
    const size_t q = rows_elems(L, d, br), kv = 2 * rows_elems(L, d, bc);
    const size_t main = q_regs ? (q > kv ? q : kv) : q + kv;
    const size_t p = L->c2a_regs ? 0 : (size_t)br * (size_t)(bc + 8);
    return 2 * (main + p);
}

static int fwd_q_regs(const fa_device_desc *dev, const fa_mma_layout_info *L, int d, int br, int bc) {
    return fwd_local(L, d, br, bc, 0) > fa_plan_usable_local_mem(dev);
}

static size_t dkdv_local(const fa_mma_layout_info *L, const fa_attention_desc *desc, int br, int bc, int stages,
                         int v_regs, int k_packed) {
    const int d = desc->head_dim;
    const size_t kv_tiles = k_packed ? 0 : v_regs ? 1 : 2;
    size_t elems = kv_tiles * rows_elems(L, d, bc) + 2 * (size_t)stages * rows_elems(L, d, br);
    if (!desc->deterministic) elems += (size_t)br * (size_t)(bc + 8);
    if (!L->c2a_regs) elems += 2 * (size_t)bc * (size_t)(br + 8);
    return 2 * elems + 4 * 2 * (size_t)br;
}

static size_t dq_local(const fa_mma_layout_info *L, const fa_attention_desc *desc, int br, int bc) {
    const int d = desc->head_dim;
    size_t elems = 2 * rows_elems(L, d, br) + 2 * rows_elems(L, d, bc);
    if (!L->c2a_regs) elems += (size_t)br * (size_t)(bc + 8);
    return 2 * elems;
}

/* The pipelined backward keeps V's fragments in registers where its tile
 * does not fit beside two stages of Q and dO; NVIDIA's in one stage too
 * (its tiles of 48 KiB hold K and V of 128 keys at head_dim 64 beside 16
 * queries, of 64 keys at 128), and at head dimensions up to
 * FA_CL_MMA_NV_BWD_VREG_D always, but with dropout or a score option. The
 * other layouts' backward keeps V's
 * tile in one stage: their compile checks (tests/test_opencl_compile.c)
 * cover the plans they make so.
 *
 * Why always at 64 on NVIDIA: the loads local memory serves bound that
 * backward (Nsight Compute on an H200: L1/shared 88% busy), and V's
 * fragments in registers leave a sub-group only dO's to read for dP^T, for
 * 16 words a lane (163 -> 167 registers, three work-groups a
 * multiprocessor still). On an H200 (fp16, 32 x 64 tiles; two calls,
 * bench/results/h200.md, 2026-11-29): not causal 181.5 -> 187.8 / 187.9
 * TFLOP/s at N 4096, 200.8 -> 211.1 and 199.5 -> 209.5 at 16384; causal
 * within 1% either way (161.7 -> 160.4, 196.4 -> 196.0; 161.8 -> 160.8,
 * 196.2 -> 196.7). Not measured with dropout, whose backward then took 242
 * registers (two work-groups a multiprocessor, not three), nor with the
 * score options, which hold more: they keep V's tile. */
#define FA_CL_MMA_NV_BWD_VREG_D 64
static int bwd_v_regs(const fa_device_desc *dev, const fa_mma_layout_info *L, const fa_attention_desc *desc, int br,
                      int bc, int stages) {
    if (L->family == FA_MMA_LAYOUT_NVIDIA && desc->head_dim <= FA_CL_MMA_NV_BWD_VREG_D && desc->dropout_p == 0.0f &&
        !fa_desc_option_in_use(desc))
        return 1;
    return (stages > 1 || L->family == FA_MMA_LAYOUT_NVIDIA) &&
           dkdv_local(L, desc, br, bc, stages, 0, 0) > fa_plan_usable_local_mem(dev);
}

/* Where even V in registers leaves K's tile no room, K and V leave local
 * memory, and V the registers: a pre-pass packs them once into the
 * workspace in the order of the lanes' fragments
 * (fa_cl_mma_packed_k_bytes), and a step reads the A fragments of S^T and
 * dP^T and the dQ products' B fragments from there (through the cache:
 * every step of the work-group reads the same keys). Local memory is then
 * Q, dO, dS, L and D: on NVIDIA's 48 KiB, 64 queries a step at head_dim
 * 128 where K's tile held 32; the registers V's fragments took hold the
 * loads in flight. The epilogue stages dK and dV through the Q/dO buffers,
 * which must hold the key tile's rows; the deterministic dQ kernel keeps
 * K's and V's tiles anyway (it does not take it). */
static int bwd_k_packed(const fa_device_desc *dev, const fa_mma_layout_info *L, const fa_attention_desc *desc, int br,
                        int bc, int stages, int v_regs) {
    return v_regs && !desc->deterministic && 2L * stages * br >= bc &&
           dkdv_local(L, desc, br, bc, stages, 1, 0) > fa_plan_usable_local_mem(dev);
}

/* fp32 words of fragments a lane of the dK/dV kernel holds for a chunk of
 * qc queries: dK and dV (2 dp columns), S^T and dP^T (2 qc), P and dS as
 * operands where they stay in registers (qc), V's fragments with v_regs. */
static long bwd_words(const fa_mma_layout_info *L, int strips, int dp, int qc, int v_regs) {
    const long per_row = (long)L->m * strips;
    return per_row * (2 * dp + 2 * qc + (L->c2a_regs ? qc : 0)) / L->sub_group +
           (v_regs ? per_row * dp / (2 * L->sub_group) : 0);
}

int fa_cl_mma_bwd_slack = 0;

/* Queries per chunk of a step (the kernel's QC): the whole tile where its
 * fragments fit the layout's register budget, else one k-step (the
 * smallest chunk the products take) where NVIDIA's layout runs it; 0 where
 * neither fits. */
static int bwd_q_chunk(const fa_mma_layout_info *L, int strips, int dp, int br, int v_regs) {
    const long budget = (long)L->bwd_budget + fa_cl_mma_bwd_slack;
    if (bwd_words(L, strips, dp, br, v_regs) <= budget) return br;
    const int side = L->k > L->n ? L->k : L->n;
    if (L->family == FA_MMA_LAYOUT_NVIDIA && br > side && br % side == 0 &&
        bwd_words(L, strips, dp, side, v_regs) <= budget)
        return side;
    return 0;
}

/* NVIDIA's backward with V's fragments in registers, chunked to one k-step
 * by the register model, runs a step of two k-steps whole where its dQ
 * products take two head-dim n-tiles a unit instead of four: the dQ
 * accumulators then leave the scores of the whole step room. On an H200
 * (head_dim 128, 32 x 64, fp16, 16k tokens; bench/results/h200.md,
 * 2026-11-29) +3.6% non-causal and +6.3% causal, 249 and 255 registers
 * without a spill; with four n-tiles a unit the whole step spilled 12
 * bytes. Not with dropout or score options (their temporaries were not
 * compiled at this register count), nor deterministic (no dQ products in
 * the kernel, so nothing to gain the room from). */
#define FA_CL_MMA_NV_BWD_WHOLE_DQ_UNIT 2
static int bwd_whole_step(const fa_mma_layout_info *L, const fa_attention_desc *desc, int dp, int br, int v_regs,
                          int k_packed, int q_chunk) {
    const int side = L->k > L->n ? L->k : L->n;
    return L->family == FA_MMA_LAYOUT_NVIDIA && v_regs && !k_packed && q_chunk < br && br == 2 * side &&
           !desc->deterministic && desc->dropout_p == 0.0f && !fa_desc_option_in_use(desc) &&
           (dp / L->n) % FA_CL_MMA_NV_BWD_WHOLE_DQ_UNIT == 0;
}

/* The forward has one stage: K and V already load during each other's
 * products. */
static int stages_ok(fa_pass pass, int stages) {
    return stages >= 1 && stages <= (pass == FA_PASS_FORWARD ? 1 : FA_CL_MMA_MAX_STAGES);
}

/* A layout's figure for a pass's kernels. */
static size_t layout_local(const fa_device_desc *dev, const fa_mma_layout_info *L, const fa_attention_desc *desc,
                           fa_pass pass, int br, int bc, int stages) {
    if (pass == FA_PASS_FORWARD)
        return fwd_local(L, desc->head_dim, br, bc, fwd_q_regs(dev, L, desc->head_dim, br, bc));
    const int v_regs = bwd_v_regs(dev, L, desc, br, bc, stages);
    const int k_packed = bwd_k_packed(dev, L, desc, br, bc, stages, v_regs);
    size_t kv = dkdv_local(L, desc, br, bc, stages, v_regs && !k_packed, k_packed);
    if (desc->deterministic) {
        size_t q = dq_local(L, desc, br, bc);
        if (q > kv) kv = q;
    }
    return kv;
}

size_t fa_cl_mma_local_mem(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                           int stages) {
    fa_mma_layout ids[FA_MMA_MAX_LAYOUTS];
    const int n = fa_mma_layouts_of(dev, ids);
    if (!desc || br <= 0 || bc <= 0 || !stages_ok(pass, stages)) return 0;
    size_t least = 0;
    for (int i = 0; i < n; i++) {
        const size_t b = layout_local(dev, fa_mma_layout_get(ids[i]), desc, pass, br, bc, stages);
        if (i == 0 || b < least) least = b;
    }
    return least;
}

size_t fa_cl_mma_tile_local_mem(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br,
                                int bc, int tr, int tc, int stages) {
    fa_cl_mma_geometry g;
    return fa_cl_mma_geometry_of(dev, desc, pass, br, bc, tr, tc, stages, &g) ? g.local_mem : 0;
}

/* 32-bit words of one key tile's packed K and V (kernels_cl/bwd_mma.cl,
 * KPACK): K's and V's A fragments of every strip and k-step (S^T, dP^T)
 * and K's B fragments of every k-step and n-tile (dQ), each as a
 * sub-group's lanes hold it. */
static size_t packed_kv_tile_words(const fa_mma_layout_info *L, int bc, int dp) {
    return 2 * (size_t)(bc / L->m) * (size_t)(dp / L->k) * (size_t)L->sub_group * (size_t)L->a_words +
           (size_t)(bc / L->k) * (size_t)(dp / L->n) * (size_t)L->sub_group * (size_t)L->b_words;
}

size_t fa_cl_mma_packed_slot_bytes(const fa_cl_mma_geometry *g, int bc) {
    const fa_mma_layout_info *L = fa_mma_layout_get(g->layout);
    return g->k_packed && L && bc > 0 ? 4 * packed_kv_tile_words(L, bc, g->d_pad) : 0;
}

fa_status fa_cl_mma_packed_k_bytes(const fa_cl_mma_geometry *g, const fa_attention_desc *desc, int bc,
                                   int64_t total_k, size_t *bytes) {
    *bytes = 0;
    if (!g->k_packed) return FA_SUCCESS;
    const size_t slot = fa_cl_mma_packed_slot_bytes(g, bc);
    if (!slot || total_k < 0) return fa_fail(FA_ERR_INTERNAL, "packed K of a tile without a layout");
    /* The slots of the key tiles of every sequence (the kernel's
     * fa_bwd_k_slot): at most total_k / bc + batch + 1. */
    const size_t slots = (size_t)(total_k / bc) + (size_t)desc->batch + 1;
    const size_t factors[] = {(size_t)desc->heads_kv, slots, slot};
    return fa_workspace_bytes("the packed K and V of the backward", factors, 3, bytes);
}

size_t fa_cl_mma_scratch_bytes(fa_mma_layout layout, int warps) {
    const fa_mma_layout_info *L = fa_mma_layout_get(layout);
    if (!L || warps <= 0) return 0;
    /* kernels_cl/mma_generic.h FA_SCR_WORDS. */
    const int mma = (L->m * L->k + L->k * L->n) / 2, shfl = L->sub_group * L->c_rows;
    const int c2a = L->c2a_exchange ? L->sub_group * L->a_words : 0;
    int words = mma > shfl ? mma : shfl;
    if (c2a > words) words = c2a;
    return 4 * (size_t)warps * (size_t)words;
}

/* Divisibility of the products (the tile's sides against the fragments). */
static int layout_tile_ok(const fa_mma_layout_info *L, fa_pass pass, int br, int bc) {
    if (pass == FA_PASS_FORWARD)
        /* S n-tiles and P V k-steps run over the keys. */
        return br % L->m == 0 && bc % L->n == 0 && bc % L->k == 0;
    /* S^T n-tiles and P^T k-steps over the queries; the dQ kernel's strips
     * over them too, its n-tiles and k-steps over the keys. */
    return bc % L->m == 0 && br % L->n == 0 && br % L->k == 0 && br % L->m == 0 && bc % L->n == 0 && bc % L->k == 0;
}

int fa_cl_mma_tile_ok(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc) {
    if (!fa_cl_mma_applies(dev, desc) || br <= 0 || bc <= 0) return 0;
    fa_mma_layout ids[FA_MMA_MAX_LAYOUTS];
    const int n = fa_mma_layouts_of(dev, ids);
    int divisible = 0;
    for (int i = 0; i < n; i++) divisible |= layout_tile_ok(fa_mma_layout_get(ids[i]), pass, br, bc);
    if (!divisible) return 0;
    for (int tr = 1; tr <= 256; tr *= 2)
        for (int tc = 1; tc <= 256; tc *= 2)
            if (fa_cl_mma_geometry_of(dev, desc, pass, br, bc, tr, tc, 1, NULL)) return 1;
    return 0;
}

/* The geometry of a micro-tile in one layout; 0 where it is none of its. */
static int layout_geometry(const fa_device_desc *dev, const fa_attention_desc *desc, fa_mma_layout layout,
                           fa_pass pass, int br, int bc, int tr, int tc, int stages, fa_cl_mma_geometry *g) {
    const fa_mma_layout_info *L = fa_mma_layout_get(layout);
    if (!layout_tile_ok(L, pass, br, bc)) return 0;
    const int fwd = pass == FA_PASS_FORWARD, cols = L->c_elems / L->c_rows, d = desc->head_dim;
    /* Rows a lane holds per strip (down the strips) and columns per n-wide
     * column tile (across). */
    const int down = fwd ? tr : tc, across = fwd ? tc : tr, other = fwd ? bc : br, rows = fwd ? br : bc;
    if (down % L->c_rows || (long)across * L->n != (long)other * cols) return 0;
    const int strips = down / L->c_rows;
    if (!is_pow2_upto(strips, FA_CL_MMA_MAX_STRIPS) || rows % (strips * L->m)) return 0;
    const int warps = rows / (strips * L->m), wgs = warps * L->sub_group;
    if (!is_pow2_upto(warps, FA_CL_MMA_MAX_WARPS) || wgs > dev->max_work_group_size) return 0;
    if (wgs < dev->simd_width || wgs % dev->simd_width) return 0;
    const int dp = d_pad_of(L, d);
    /* fp32 words of fragments per lane: an m x n accumulator is m n / sg of
     * them, an m x k operand m k / (2 sg). */
    const long per_row = (long)L->m * strips; /* rows of the lane's strips, times sg per lane */
    int q_regs = 0, v_regs = 0, k_packed = 0, dq_warps = 0, q_chunk = 0, dq_unit = 0;
    if (fwd) {
        q_regs = fwd_q_regs(dev, L, d, br, bc);
        /* The score options' hook (kernels_cl/common.h, fa_logit2) holds
         * temporaries per score (bias loads, distances, the cap). Where the
         * budget leaves no room for them (RDNA3's WMMA: its forward with
         * every option spilled on gfx1100, clang-16, at 64 and 80 words and
         * held 72, S of 16 keys, in 225 VGPRs; tests/test_opencl_compile.c)
         * S counts twice; the other layouts compile them within theirs. */
        const int hook = layout == FA_MMA_LAYOUT_AMD_WMMA && fa_desc_option_in_use(desc);
        const long s_words = per_row * bc / L->sub_group * (hook ? 2 : 1);
        const long words = per_row * dp / L->sub_group + s_words + (q_regs ? per_row * dp / (2 * L->sub_group) : 0);
        if (words > L->fwd_budget) return 0;
    } else {
        v_regs = bwd_v_regs(dev, L, desc, br, bc, stages);
        k_packed = bwd_k_packed(dev, L, desc, br, bc, stages, v_regs);
        if (k_packed) v_regs = 0;
        q_chunk = bwd_q_chunk(L, strips, dp, br, v_regs);
        if (!q_chunk) return 0;
        if (bwd_whole_step(L, desc, dp, br, v_regs, k_packed, q_chunk)) {
            q_chunk = br;
            dq_unit = FA_CL_MMA_NV_BWD_WHOLE_DQ_UNIT;
        }
        if (desc->deterministic) {
            dq_warps = br / L->m;
            if (!is_pow2_upto(dq_warps, FA_CL_MMA_MAX_WARPS) || dq_warps * L->sub_group > dev->max_work_group_size)
                return 0;
            if ((long)L->m * (dp + 2 * bc) / L->sub_group > L->fwd_budget) return 0;
        }
    }
    if (g) {
        g->layout = layout;
        g->warps = warps;
        g->strips = strips;
        g->q_regs = q_regs;
        g->v_regs = v_regs;
        g->k_packed = k_packed;
        g->q_chunk = q_chunk;
        g->dq_unit = dq_unit;
        g->stages = stages;
        g->d_pad = dp;
        g->dq_warps = dq_warps;
        g->local_mem = layout_local(dev, L, desc, pass, br, bc, stages);
    }
    return 1;
}

int fa_cl_mma_geometry_of(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                          int tr, int tc, int stages, fa_cl_mma_geometry *g) {
    if (!fa_cl_mma_applies(dev, desc) || br <= 0 || bc <= 0 || tr <= 0 || tc <= 0 || !stages_ok(pass, stages))
        return 0;
    fa_mma_layout ids[FA_MMA_MAX_LAYOUTS];
    const int n = fa_mma_layouts_of(dev, ids);
    for (int i = 0; i < n; i++)
        if (layout_geometry(dev, desc, ids[i], pass, br, bc, tr, tc, stages, g)) return 1;
    return 0;
}

/* NVIDIA's forward: work-groups of four sub-groups at most, one 16-row
 * strip each (64 query rows), against 64 keys at most. The planner takes
 * 64 x 64 where it fits (in 48 KiB: head_dim up to 176, Q's fragments in
 * registers above 112), the model's choice among narrower tiles and fewer
 * sub-groups beyond. A lane holds the fragments of the eight-sub-group
 * 128 x 64 tile it replaces there (one strip, 64 keys).
 *
 * Why: on an H100 through NVIDIA's OpenCL (fp16, head_dim 64 and 128,
 * causal and not, N 4096 and 16384; bench/results/h100.md, the sweep of
 * 2026-11-25) the forward's speed followed how many work-groups share a
 * multiprocessor, which its 64 K registers decide. Geometric means over
 * the four shapes: at head_dim 64 the model's pick, 128 x 128 in eight
 * sub-groups (176-214 registers: one work-group), 188 TFLOP/s, 128 x 64 in
 * eight (126: two) 238, 64 x 128 in four (168: three) 238, 64 x 64 in four
 * (121: four) 240; at head_dim 128 the model's 128 x 64 in eight (200-206:
 * one) 210, 128 x 32 in eight (166: still one) 187, 64 x 64 in four (164:
 * three) 263: 0.76-0.82x FlashAttention-2 against 0.60-0.67x. A lone
 * work-group leaves the matrix units idle at every key tile's barriers and
 * softmax; beside others, one's products run while another waits. A
 * work-group of 128 work-items leaves room for a second at any register
 * count a kernel compiles to (255, allocated as 256: 2 x 128 x 256 =
 * 65536), one of 256 only at 128 or fewer, which no tile held at head_dim
 * 128; one strip and 64 keys keep the fragments (and the registers) at the
 * sweep's fastest, without a register cap.
 *
 * The IO model cannot say so: it ranks candidates by the bytes they move
 * before their time, and 64-row tiles read K and V twice as often as
 * 128-row ones (re-reads the L2 serves: the DRAM bytes it predicts are the
 * same), while its time has no term for the work-groups a compute unit
 * holds. Hence a preference of the layout, measured, not of the model. It
 * does not depend on local memory, so more local memory still never plans
 * more bytes (planner.c). */
#define FA_CL_MMA_NV_FWD_WARPS 4
#define FA_CL_MMA_NV_FWD_KEYS 64

/* NVIDIA's backward: V's fragments in registers in work-groups of at most
 * four sub-groups, queries in chunks only there and in tiles of at most 32
 * (the tiles measured), and tiles that keep V's tile whole and within the
 * 176 words they were measured at.
 *
 * On an H200 through NVIDIA's OpenCL (fp16, N 16384, 16k tokens, hidden
 * 2048; bench/results/h200.md, 2026-11-27), at head_dim 128 the 32 x 64
 * tile in four sub-groups with V in registers and its queries in chunks of
 * 16 (240-246 registers, two work-groups a multiprocessor) ran 186 / 183
 * TFLOP/s (causal no / yes) where 16 x 64 with V's tile ran 154 / 144: the
 * same bytes, half the steps. 16 x 128 in eight sub-groups with V in
 * registers, which halves the bytes the IO model counts, ran 169 / 164:
 * one work-group of 252 registers a multiprocessor, whose barriers nothing
 * else fills. At head_dim 64 the 32 x 128 tile in eight (177-212
 * registers) ran 170 / 159 against 16 x 128's 179 / 162 (126-128: two a
 * multiprocessor). The words a lane holds: V's fragments in registers take
 * the layout's budget, 184 (the tiles above compiled without spills); a
 * tile keeping V's tile stays at the 176 words the earlier tiles ran at. */
#define FA_CL_MMA_NV_BWD_VREG_WARPS 4
#define FA_CL_MMA_NV_BWD_CHUNKED_ROWS 32
#define FA_CL_MMA_NV_BWD_TILE_WORDS 176

/* And at head dimensions up to 64 four sub-groups of one strip (64 keys)
 * and at most 32 queries, where the 16 x 128 tile in eight gave way once
 * the tile copies lost their per-copy divisions: on an H100 (2026-11-27,
 * one run, bench/results/h100.md) 32 x 64 ran 198.9 / 188.5 TFLOP/s
 * (causal no / yes, 165 registers), 64 x 64 187.4 / 182.2 (230-238,
 * spilling with dropout), 16 x 128 in eight 185.3 / 170.3. A sub-group
 * holds 16 keys against 32 queries (512 scores, twice 16 x 128's), so a
 * fragment it loads from local memory serves twice the products, for
 * twice the Q and dO reads and dQ reductions a product through the L2. */
#define FA_CL_MMA_NV_BWD_SMALL_D 64
#define FA_CL_MMA_NV_BWD_SMALL_D_ROWS 32
#define FA_CL_MMA_NV_BWD_SMALL_D_WARPS 4

int fa_cl_mma_preferred(const fa_device_desc *dev, const fa_attention_desc *desc, fa_pass pass, int br, int bc,
                        int tr, int tc) {
    fa_cl_mma_geometry g;
    if (!fa_cl_mma_geometry_of(dev, desc, pass, br, bc, tr, tc, 1, &g)) return 1;
    if (g.layout != FA_MMA_LAYOUT_NVIDIA) return 1;
    if (pass == FA_PASS_BACKWARD) {
        if (desc->head_dim <= FA_CL_MMA_NV_BWD_SMALL_D &&
            (g.warps > FA_CL_MMA_NV_BWD_SMALL_D_WARPS || g.strips != 1 || br > FA_CL_MMA_NV_BWD_SMALL_D_ROWS))
            return 0;
        /* K packed in the workspace: on an H200 no faster than the tiles
         * planned here (best +0.4%, most 1-12% slower; fa-cl-mma-sweep
         * forces it, bench/results/h200.md, twelfth session). */
        if (g.k_packed) return 0;
        if (!g.v_regs)
            return g.q_chunk == br &&
                   bwd_words(fa_mma_layout_get(g.layout), g.strips, g.d_pad, br, 0) <= FA_CL_MMA_NV_BWD_TILE_WORDS;
        return g.warps <= FA_CL_MMA_NV_BWD_VREG_WARPS && (g.q_chunk == br || br <= FA_CL_MMA_NV_BWD_CHUNKED_ROWS);
    }
    return g.warps <= FA_CL_MMA_NV_FWD_WARPS && g.strips == 1 && bc <= FA_CL_MMA_NV_FWD_KEYS;
}
