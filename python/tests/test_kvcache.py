"""flash_attn_with_kvcache on NumPy arrays against a NumPy fp64 step written
out here: the append (rotated keys rounded to the cache's dtype), rotary
positions, masks, softcap, ALiBi, paged and contiguous caches, and the
sequences whose lengths or pages break the rules."""
import numpy as np
import pytest

import flashattn
from conftest import random, rel_error


def rotate(x, cos, sin, positions, interleaved):
    """x [n, heads, d] rotated in fp64 at positions [n] (first 2 * cos.shape[1] dims)."""
    x = np.array(x, np.float64)
    half = cos.shape[1]
    c, s = cos[positions][:, None, :].astype(np.float64), sin[positions][:, None, :].astype(np.float64)
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, a * s + b * c
    return x


def step_fp64(q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, causal=False, window=(-1, -1),
              softcap=0.0, alibi=None, interleaved=True):
    """(out, lse, k_cache, v_cache after the append) of one step, in fp64,
    the cache's values rounded to its dtype; NaN rows for invalid sequences."""
    b_, sq, hq, d = q.shape
    hk = k_cache.shape[2]
    paged = table is not None
    page = k_cache.shape[1] if paged else None
    capacity = table.shape[1] * page if paged else k_cache.shape[1]
    sn = 0 if k_new is None else k_new.shape[1]
    kc, vc = k_cache.copy(), v_cache.copy()
    out = np.zeros(q.shape)
    lse = np.zeros((b_, hq, sq))
    offsets = causal or window[0] >= 0 or window[1] >= 0

    def rows(b, t):  # (index into the pool's first two axes) of token t of sequence b
        return (table[b, t // page], t % page) if paged else (b, t)

    for b in range(b_):
        n = int(lens[b])
        last = n + sn - 1
        if cos is not None:
            last = max(last, n + (sq - 1 if offsets else 0))
        ok = 0 <= n and n + sn <= capacity and last < capacity
        if ok and paged:
            used = -(-(n + sn) // page)
            ok = all(0 <= table[b, p] < k_cache.shape[0] for p in range(used))
        if not ok:
            out[b], lse[b] = np.nan, np.nan
            continue
        if sn:
            kn = k_new[b].astype(np.float64)
            if cos is not None:
                kn = rotate(kn, cos, sin, np.arange(n, n + sn), interleaved)
            for t in range(sn):
                kc[rows(b, n + t)] = kn[t].astype(k_cache.dtype)
                vc[rows(b, n + t)] = v_new[b, t]
        lk = n + sn
        keys = np.array([kc[rows(b, t)] for t in range(lk)], np.float64).reshape(lk, hk, d)
        vals = np.array([vc[rows(b, t)] for t in range(lk)], np.float64).reshape(lk, hk, d)
        qb = q[b].astype(np.float64)
        if cos is not None:
            qb = rotate(qb, cos, sin, n + (np.arange(sq) if offsets else np.zeros(sq, int)), interleaved)
            qb = qb.astype(q.dtype).astype(np.float64)
        keys, vals = np.repeat(keys, hq // hk, axis=1), np.repeat(vals, hq // hk, axis=1)
        s = np.einsum("qhd,khd->hqk", qb, keys) / np.sqrt(d)
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        i = np.arange(sq)[:, None] + lk - sq
        j = np.arange(lk)[None, :]
        if alibi is not None:
            s = s - alibi[:, None, None] * np.abs(i - j)[None]
        keep = np.ones((sq, lk), bool)
        if causal:
            keep &= j <= i
        if window[0] >= 0:
            keep &= j >= i - window[0]
        if window[1] >= 0:
            keep &= j <= i + window[1]
        s = np.where(keep[None], s, -np.inf)
        m = np.max(s, -1, keepdims=True) if lk else np.full((hq, sq, 1), -np.inf)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m_safe)
        total = p.sum(-1, keepdims=True)
        p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
        out[b] = np.einsum("hqk,khd->qhd", p, vals)
        with np.errstate(divide="ignore"):
            lse[b] = np.where(total[..., 0] > 0, np.log(total[..., 0]) + m_safe[..., 0], -np.inf)
    return out, lse, kc, vc


def tables(capacity, rotary_dim):
    pos = np.arange(capacity)[:, None]
    freq = 1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    return np.cos(pos * freq).astype(np.float32), np.sin(pos * freq).astype(np.float32)


def paged_cache(rng, batch, capacity, page, hk, d, dtype, spare=2):
    pps = -(-capacity // page)
    pool = batch * pps + spare
    order = rng.permutation(pool).astype(np.int32)
    return (random(rng, (pool, page, hk, d), dtype), random(rng, (pool, page, hk, d), dtype),
            order[:batch * pps].reshape(batch, pps))


CASES = [  # name, page, append, seqlen_q, causal, window, rotary_dim, interleaved, softcap, alibi
    ("contiguous_append1", 0, 1, 1, False, (-1, -1), 0, True, 0.0, False),
    ("paged16_append3_causal_rotary_interleaved", 16, 3, 3, True, (-1, -1), 16, True, 0.0, False),
    ("paged32_noappend_rotary_half_softcap_alibi", 32, 0, 2, False, (-1, -1), 32, False, 5.0, True),
    ("contiguous_window_append2", 0, 2, 2, False, (6, 0), 0, True, 0.0, False),
]


def case_inputs(rng, case, b=3, hq=4, hk=2, d=32, capacity=64):
    """One CASES entry's fp32 inputs: q, the caches (paged: with their block
    table), the appended rows, the cache lengths, rotary tables, slopes."""
    _, page, sn, sq, _, _, rd, _, _, alibi = case
    if page:
        k_cache, v_cache, table = paged_cache(rng, b, capacity, page, hk, d, np.float32)
    else:
        k_cache, v_cache, table = random(rng, (b, capacity, hk, d)), random(rng, (b, capacity, hk, d)), None
    q = random(rng, (b, sq, hq, d))
    k_new = random(rng, (b, sn, hk, d)) if sn else None
    v_new = random(rng, (b, sn, hk, d)) if sn else None
    lens = np.array([0, 17, capacity - max(sn, sq)], np.int32)
    cos, sin = tables(capacity, rd) if rd else (None, None)
    slopes = (0.5 ** np.arange(1, hq + 1)).astype(np.float32) if alibi else None
    return q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, slopes


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_step_fp32(backend, rng, case):
    _, page, sn, sq, causal, window, rd, inter, softcap, alibi = case
    q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, slopes = case_inputs(rng, case)
    want = step_fp64(q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, causal, window, softcap, slopes, inter)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=lens, block_table=table, causal=causal,
                                                 window_size=window, softcap=softcap, alibi_slopes=slopes,
                                                 rotary_interleaved=inter, return_softmax_lse=True,
                                                 backend=backend)
    assert out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], sq)
    assert rel_error(out, want[0]) < 1e-5
    finite = np.isfinite(want[1])
    assert np.array_equal(np.isfinite(lse), finite)
    assert np.max(np.abs(lse[finite] - want[1][finite])) < 1e-4
    # The caches were appended to in place: rotated keys within fp32's
    # rounding of fp64 ones, values and every other element exact.
    assert np.max(np.abs(k_cache - want[2])) < 1e-5
    assert np.array_equal(v_cache, want[3])


def test_step_fp16_paged(backend, rng):
    b, hq, hk, d, capacity, page = 2, 8, 2, 64, 96, 16
    k_cache, v_cache, table = paged_cache(rng, b, capacity, page, hk, d, np.float16)
    q = random(rng, (b, 2, hq, d), np.float16)
    k_new, v_new = random(rng, (b, 2, hk, d), np.float16), random(rng, (b, 2, hk, d), np.float16)
    cos, sin = tables(capacity, 32)
    lens = np.array([40, 93], np.int32)
    want = step_fp64(q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, causal=True, interleaved=False)
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin, lens, table, causal=True,
                                           rotary_interleaved=False, backend=backend)
    assert out.dtype == np.float16
    assert rel_error(out.astype(np.float32), want[0]) < 2e-3
    written = k_cache != want[2]
    # At most a rounding apart where the rotation decides it.
    assert np.max(np.abs(k_cache.astype(np.float32) - want[2].astype(np.float32))[written], initial=0) < 4e-3
    assert np.array_equal(v_cache, want[3])


def test_invalid_sequences_get_nan_and_append_nothing(backend, rng):
    b, hq, hk, d, capacity, page = 3, 2, 1, 16, 64, 16
    k_cache, v_cache, table = paged_cache(rng, b, capacity, page, hk, d, np.float32)
    table[2, 0] = k_cache.shape[0] + 5  # outside the pool
    k0, v0 = k_cache.copy(), v_cache.copy()
    q = random(rng, (b, 1, hq, d))
    k_new, v_new = random(rng, (b, 1, hk, d)), random(rng, (b, 1, hk, d))
    lens = np.array([-1, 10, 3], np.int32)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                                                 block_table=table, return_softmax_lse=True, backend=backend)
    assert np.all(np.isnan(out[0])) and np.all(np.isnan(out[2])) and np.all(np.isnan(lse[[0, 2]]))
    assert np.all(np.isfinite(out[1]))
    changed = np.argwhere(np.any(k_cache != k0, axis=(2, 3)))
    assert [tuple(x) for x in changed] == [(table[1, 0], 10)]  # sequence 1's token 10 only
    assert np.array_equal(np.any(v_cache != v0, axis=(2, 3)), np.any(k_cache != k0, axis=(2, 3)))


def test_argument_errors(rng):
    q = random(rng, (1, 1, 2, 32))
    kc, vc = random(rng, (1, 64, 1, 32)), random(rng, (1, 64, 1, 32))
    with pytest.raises(ValueError, match="k and v"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, k=random(rng, (1, 1, 1, 32)), backend="reference")
    with pytest.raises(ValueError, match="rotary_cos"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, rotary_cos=np.ones((64, 8), np.float32), backend="reference")
    with pytest.raises(ValueError, match="read-only"):
        ro = kc.copy()
        ro.flags.writeable = False
        flashattn.flash_attn_with_kvcache(q, ro, vc, backend="reference")
    pool = random(rng, (4, 24, 1, 32))  # pages of 24 tokens: not a multiple of 16
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_with_kvcache(q, pool, pool.copy(), cache_seqlens=3,
                                          block_table=np.zeros((1, 2), np.int32), backend="reference")
    assert e.value.status == flashattn.Status.FA_ERR_INVALID_ARGUMENT and "page_size" in e.value.message


# PyTorch tensors: the same steps as torch tensors on the CPU must give what
# the NumPy path gives (the same backend, the same kernels), append to the
# caller's cache tensors in place, and return torch tensors.
try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def _torch_step(backend, q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, **kw):
    """(NumPy results, torch results, the NumPy caches, the torch caches) of
    one step from copies of the same NumPy inputs."""
    t = lambda x: None if x is None else torch.from_numpy(np.array(x))
    kc_t, vc_t = t(k_cache), t(v_cache)
    kc_n, vc_n = k_cache.copy(), v_cache.copy()
    lens_t = lens if isinstance(lens, int) else t(lens)
    got_n = flashattn.flash_attn_with_kvcache(q, kc_n, vc_n, k_new, v_new, cos, sin, lens, table,
                                             return_softmax_lse=True, backend=backend, **kw)
    got_t = flashattn.flash_attn_with_kvcache(t(q), kc_t, vc_t, t(k_new), t(v_new), t(cos), t(sin), lens_t, t(table),
                                             return_softmax_lse=True, backend=backend, **kw)
    return got_n, got_t, (kc_n, vc_n), (kc_t, vc_t)


def _assert_same(got_n, got_t, caches_n, caches_t, q_dtype):
    out_t, lse_t = got_t
    assert isinstance(out_t, torch.Tensor) and isinstance(lse_t, torch.Tensor)
    assert out_t.dtype == q_dtype and out_t.device.type == "cpu" and tuple(out_t.shape) == got_n[0].shape
    assert lse_t.dtype == torch.float32 and tuple(lse_t.shape) == got_n[1].shape
    np.testing.assert_array_equal(out_t.float().numpy(), got_n[0].astype(np.float32))
    np.testing.assert_array_equal(lse_t.numpy(), got_n[1])
    for cache_n, cache_t in zip(caches_n, caches_t):  # appended in place, as the NumPy caches
        np.testing.assert_array_equal(cache_t.numpy(), cache_n)


@needs_torch
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_torch_matches_numpy(backend, rng, case):
    _, page, sn, sq, causal, window, rd, inter, softcap, alibi = case
    q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, slopes = case_inputs(rng, case)
    kw = dict(causal=causal, window_size=window, softcap=softcap, rotary_interleaved=inter)
    t = lambda x: None if x is None else torch.from_numpy(x)
    got_n, got_t, caches_n, caches_t = _torch_step(backend, q, k_cache, v_cache, k_new, v_new, lens, table, cos,
                                                   sin, **kw)
    if slopes is not None:  # alibi_slopes as each path takes it
        kc_n, vc_n = k_cache.copy(), v_cache.copy()
        kc_t, vc_t = t(k_cache.copy()), t(v_cache.copy())
        got_n = flashattn.flash_attn_with_kvcache(q, kc_n, vc_n, k_new, v_new, cos, sin, lens, table,
                                                 alibi_slopes=slopes, return_softmax_lse=True, backend=backend, **kw)
        got_t = flashattn.flash_attn_with_kvcache(t(q), kc_t, vc_t, t(k_new), t(v_new), t(cos), t(sin), t(lens),
                                                 t(table), alibi_slopes=t(slopes), return_softmax_lse=True,
                                                 backend=backend, **kw)
        caches_n, caches_t = (kc_n, vc_n), (kc_t, vc_t)
    _assert_same(got_n, got_t, caches_n, caches_t, torch.float32)
    if sn:
        assert not np.array_equal(caches_t[0].numpy(), k_cache)  # the append did write into the torch cache


@needs_torch
def test_torch_fp16_paged_rotary_append(backend, rng):
    b, hq, hk, d, capacity, page = 2, 8, 2, 64, 96, 16
    k_cache, v_cache, table = paged_cache(rng, b, capacity, page, hk, d, np.float16)
    q = random(rng, (b, 2, hq, d), np.float16)
    k_new, v_new = random(rng, (b, 2, hk, d), np.float16), random(rng, (b, 2, hk, d), np.float16)
    cos, sin = tables(capacity, 32)
    lens = np.array([40, 93], np.int32)
    got = _torch_step(backend, q, k_cache, v_cache, k_new, v_new, lens, table, cos, sin, causal=True,
                      rotary_interleaved=False)
    _assert_same(*got, torch.float16)


@needs_torch
def test_torch_scalar_lengths_and_strided_q(backend, rng):
    """cache_seqlens as an int, as a 0-d int32 tensor and None (the whole
    capacity); q a strided view (copied, as flash_attn_func copies it)."""
    b, hq, hk, d, capacity = 2, 4, 2, 32, 48
    k_cache, v_cache = random(rng, (b, capacity, hk, d)), random(rng, (b, capacity, hk, d))
    q = random(rng, (b, 1, hq, d))
    k_new, v_new = random(rng, (b, 1, hk, d)), random(rng, (b, 1, hk, d))
    got = _torch_step(backend, q, k_cache, v_cache, k_new, v_new, 20, None, None, None)
    _assert_same(*got, torch.float32)
    kc, vc = torch.from_numpy(k_cache.copy()), torch.from_numpy(v_cache.copy())
    out = flashattn.flash_attn_with_kvcache(torch.from_numpy(q), kc, vc, torch.from_numpy(k_new),
                                           torch.from_numpy(v_new), cache_seqlens=torch.tensor(20, dtype=torch.int32),
                                           backend=backend)
    np.testing.assert_array_equal(out.numpy(), got[1][0].numpy())
    np.testing.assert_array_equal(kc.numpy(), got[3][0].numpy())
    full_n = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, backend=backend)
    wide = torch.from_numpy(np.concatenate([q, q], axis=3))[..., :d]  # not contiguous
    full_t = flashattn.flash_attn_with_kvcache(wide, torch.from_numpy(k_cache), torch.from_numpy(v_cache),
                                              backend=backend)
    np.testing.assert_array_equal(full_t.numpy(), full_n)


@needs_torch
def test_torch_argument_errors(rng):
    q = torch.randn(1, 1, 2, 32)
    kc, vc = torch.randn(1, 64, 1, 32), torch.randn(1, 64, 1, 32)
    one = torch.randn(1, 1, 1, 32)
    call = lambda *a, **kw: flashattn.flash_attn_with_kvcache(*a, backend="reference", **kw)
    with pytest.raises(TypeError, match="not both"):
        call(q, kc.numpy(), vc)
    with pytest.raises(TypeError, match="not both"):
        call(q.numpy(), kc.numpy(), vc.numpy(), cache_seqlens=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="not both"):
        call(q, kc, vc, alibi_slopes=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="k and v"):
        call(q, kc, vc, k=one)
    with pytest.raises(ValueError, match="rotary_cos"):
        call(q, kc, vc, rotary_cos=torch.ones(64, 8))
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        call(q, kc, vc, cache_seqlens=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(TypeError, match="block_table must be int32"):
        call(q, torch.randn(4, 16, 1, 32), torch.randn(4, 16, 1, 32),
             block_table=torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="block_table must have 2 dimensions"):
        call(q, torch.randn(4, 16, 1, 32), torch.randn(4, 16, 1, 32), block_table=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="rotary_cos must be a floating-point"):
        call(q, kc, vc, rotary_cos=torch.ones(64, 8, dtype=torch.int32), rotary_sin=torch.ones(64, 8))
    with pytest.raises(TypeError, match="k_cache: dtype"):
        call(q, kc.to(torch.float64), vc)
    # A cache is never copied (it is written in place): misaligned, or
    # head_dim not contiguous, is refused.
    with pytest.raises(ValueError, match="k_cache: .*cannot be copied"):
        call(q, torch.randn(1, 64, 1, 33)[..., 1:], vc)
    with pytest.raises(ValueError, match="v_cache: .*cannot be copied"):
        call(q, kc, torch.randn(1, 32, 64, 1).permute(0, 2, 3, 1))
    with pytest.raises(ValueError, match="is on meta"):
        call(q, kc, torch.empty(1, 64, 1, 32, device="meta"))
    with pytest.raises(ValueError, match="cache_seqlens is on meta"):
        call(q, kc, vc, cache_seqlens=torch.zeros(1, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="cache_seqlens must have batch"):
        call(q, kc, vc, cache_seqlens=torch.zeros(3, dtype=torch.int32))
