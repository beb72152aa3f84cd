"""Shared fixtures: the backends to test on, random inputs, and the NumPy
fp64 attention every result is compared with.

FA_TEST_BACKENDS (default "reference,opencl") lists the backends to run
on; a backend that is missing skips its tests, unless it is also named in
FA_TEST_REQUIRE_BACKENDS, where it fails them (CI requires PoCL's OpenCL)."""
import os

import numpy as np
import pytest

import flashattn

BACKENDS = os.environ.get("FA_TEST_BACKENDS", "reference,opencl").split(",")
REQUIRED = set(filter(None, os.environ.get("FA_TEST_REQUIRE_BACKENDS", "").split(",")))


@pytest.fixture(params=BACKENDS)
def backend(request):
    name = request.param
    available, reason = flashattn.backend_status(name)
    if not available:
        if name in REQUIRED:
            pytest.fail(f"backend {name} is required (FA_TEST_REQUIRE_BACKENDS) but unavailable: {reason}")
        pytest.skip(f"backend {name} unavailable: {reason}")
    return name


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def random(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def visible(seqlen_q, seqlen_k, causal, window):
    """[seqlen_q, seqlen_k] mask of the keys each query sees (bottom-right
    aligned, as the header defines it)."""
    i = np.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    j = np.arange(seqlen_k)[None, :]
    keep = np.ones((seqlen_q, seqlen_k), bool)
    if causal:
        keep &= j <= i
    left, right = window
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def attention_fp64(q, k, v, dout=None, causal=False, window=(-1, -1), scale=None, softcap=0.0, alibi_slopes=None,
                   bias=None):
    """One sequence in fp64: q [sq, hq, d], k, v [sk, hk, d]. Returns (o,
    lse [hq, sq]) and, with dout, (dq, dk, dv) too. A row with every key
    masked gives o = 0 and lse = -inf. The score options as the header
    orders them: softcap, then bias ([hq, sq, sk], broadcastable), then
    ALiBi (alibi_slopes [hq], bottom-right aligned)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    sq, hq, d = q.shape
    sk, hk, _ = k.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    group = hq // hk
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # [sk, hq, d]
    s = np.einsum("qhd,khd->hqk", q, kk) * scale
    cap_grad = 1.0
    if softcap > 0:
        t = np.tanh(s / softcap)
        s, cap_grad = softcap * t, 1.0 - t * t
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    if alibi_slopes is not None:
        dist = np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :])
        s = s - np.asarray(alibi_slopes, np.float64)[:, None, None] * dist[None]
    keep = visible(sq, sk, causal, window)[None]
    s = np.where(keep, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    total = p.sum(-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    o = np.einsum("hqk,khd->qhd", p, vv)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + m_safe[..., 0], -np.inf)
    if dout is None:
        return o, lse
    do = np.asarray(dout, np.float64)
    dp = np.einsum("qhd,khd->hqk", do, vv)
    delta = np.einsum("qhd,qhd->hq", do, o)[..., None]
    ds = p * (dp - delta) * cap_grad
    dq = np.einsum("hqk,khd->qhd", ds, kk) * scale
    dkk = np.einsum("hqk,qhd->khd", ds, q) * scale
    dvv = np.einsum("hqk,qhd->khd", p, do)
    dk = dkk.reshape(sk, hk, group, d).sum(2)
    dv = dvv.reshape(sk, hk, group, d).sum(2)
    return o, lse, dq, dk, dv


def batched_fp64(q, k, v, dout=None, bias=None, **kw):
    """attention_fp64 over a [batch, seq, heads, dim] batch: lse as
    [batch, heads, seq]; bias [batch or 1, heads or 1, seq_q, seq_k]."""
    def bias_of(b):
        return None if bias is None else bias[b if bias.shape[0] > 1 else 0]
    parts = [attention_fp64(q[b], k[b], v[b], None if dout is None else dout[b], bias=bias_of(b), **kw)
             for b in range(q.shape[0])]
    return tuple(np.stack(x) for x in zip(*parts))


def rel_error(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if not np.all(np.isfinite(got[np.isfinite(want)])):
        return np.inf
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def bf16_values(bits):
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)
