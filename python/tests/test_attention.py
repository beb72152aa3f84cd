"""flash_attn_func, flash_attn_varlen_func and their backward passes on
NumPy arrays, against the NumPy fp64 attention of conftest.py."""
import numpy as np
import pytest

import flashattn
from conftest import attention_fp64, batched_fp64, bf16_bits, bf16_values, random, rel_error

SHAPES = [  # batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window
    (2, 64, 64, 4, 4, 32, False, (-1, -1)),
    (1, 48, 80, 4, 2, 64, True, (-1, -1)),    # GQA, bottom-right causal
    (2, 80, 48, 2, 1, 16, True, (-1, -1)),    # MQA, rows with no key visible
    (1, 64, 64, 2, 2, 40, False, (16, 8)),    # sliding window
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_q{}_k{}_h{}-{}_d{}_c{}_w{}-{}".format(*s[:7], *s[7]))
def test_forward_and_backward_fp32(backend, rng, shape):
    b, sq, sk, hq, hk, d, causal, window = shape
    q, k, v = random(rng, (b, sq, hq, d)), random(rng, (b, sk, hk, d)), random(rng, (b, sk, hk, d))
    dout = random(rng, (b, sq, hq, d))
    out, lse = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, return_softmax_lse=True,
                                         backend=backend)
    o_ref, lse_ref, dq_ref, dk_ref, dv_ref = batched_fp64(q, k, v, dout, causal=causal, window=window)
    assert out.shape == q.shape and out.dtype == np.float32
    assert lse.shape == (b, hq, sq) and lse.dtype == np.float32
    assert rel_error(out, o_ref) < 1e-5
    finite = np.isfinite(lse_ref)
    assert np.array_equal(np.isfinite(lse), finite)  # -inf exactly where no key is visible
    assert np.max(np.abs(lse[finite] - lse_ref[finite])) < 1e-4
    dq, dk, dv = flashattn.flash_attn_backward(dout, q, k, v, out, lse, causal=causal, window_size=window,
                                               backend=backend)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert rel_error(got, want) < 1e-4


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision(backend, rng, dtype):
    shape_q, shape_kv = (2, 64, 4, 64), (2, 96, 2, 64)
    q32, k32, v32 = random(rng, shape_q), random(rng, shape_kv), random(rng, shape_kv)
    if dtype == "fp16":
        q, k, v = (x.astype(np.float16) for x in (q32, k32, v32))
        values, tol = (lambda a: a.astype(np.float32)), 2e-3
    else:
        q, k, v = (bf16_bits(x) for x in (q32, k32, v32))  # NumPy has no bfloat16: its bits as uint16
        values, tol = bf16_values, 2e-2
    out = flashattn.flash_attn_func(q, k, v, causal=True, backend=backend)
    assert out.dtype == q.dtype and out.shape == q.shape
    o_ref, _ = batched_fp64(values(q), values(k), values(v), causal=True)
    assert rel_error(values(out), o_ref) < tol


def test_varlen_forward_and_backward(backend, rng):
    lens_q, lens_k = [5, 33, 17], [40, 33, 64]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    hq, hk, d = 4, 2, 32
    q, k, v = random(rng, (cu_q[-1], hq, d)), random(rng, (cu_k[-1], hk, d)), random(rng, (cu_k[-1], hk, d))
    dout = random(rng, q.shape)
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                                return_softmax_lse=True, backend=backend)
    assert lse.shape == (hq, cu_q[-1])
    dq, dk, dv = flashattn.flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, causal=True,
                                                      backend=backend)
    for i in range(len(lens_q)):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        o_ref, lse_ref, dq_ref, dk_ref, dv_ref = attention_fp64(q[sq], k[sk], v[sk], dout[sq], causal=True)
        assert rel_error(out[sq], o_ref) < 1e-5
        assert np.max(np.abs(lse[:, sq] - lse_ref)) < 1e-4
        for got, want in ((dq[sq], dq_ref), (dk[sk], dk_ref), (dv[sk], dv_ref)):
            assert rel_error(got, want) < 1e-4


def test_strided_inputs_match_packed(backend, rng):
    """A packed QKV tensor sliced per operand, and a [batch, heads, seq,
    dim] tensor transposed: taken with their strides, same results."""
    qkv = random(rng, (2, 64, 3, 4, 32))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    bhsd = random(rng, (2, 4, 64, 32))
    v2 = bhsd.transpose(0, 2, 1, 3)
    dout = random(rng, q.shape)
    for vv in (v, v2):
        packed = [np.ascontiguousarray(x) for x in (q, k, vv)]
        out, lse = flashattn.flash_attn_func(q, k, vv, causal=True, return_softmax_lse=True, backend=backend)
        out_p, lse_p = flashattn.flash_attn_func(*packed, causal=True, return_softmax_lse=True, backend=backend)
        assert rel_error(out, out_p) < 1e-6
        grads = flashattn.flash_attn_backward(dout, q, k, vv, out, lse, causal=True, backend=backend)
        grads_p = flashattn.flash_attn_backward(dout, *packed, out_p, lse_p, causal=True, backend=backend)
        for got, want, x in zip(grads, grads_p, (q, k, vv)):
            assert got.strides == x.strides  # each gradient is laid out as its input
            assert rel_error(got, want) < 1e-5


def test_scale_and_deterministic(backend, rng):
    q, k, v = random(rng, (1, 64, 2, 32)), random(rng, (1, 64, 2, 32)), random(rng, (1, 64, 2, 32))
    first = flashattn.flash_attn_func(q, k, v, softmax_scale=0.3, deterministic=True, backend=backend)
    second = flashattn.flash_attn_func(q, k, v, softmax_scale=0.3, deterministic=True, backend=backend)
    assert np.array_equal(first, second)
    o_ref, _ = batched_fp64(q, k, v, scale=0.3)
    assert rel_error(first, o_ref) < 1e-5


def test_dropout_same_seed_same_mask(backend, rng):
    q, k, v = random(rng, (1, 64, 2, 32)), random(rng, (1, 64, 2, 32)), random(rng, (1, 64, 2, 32))
    a = flashattn.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seed=7, backend=backend)
    b = flashattn.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seed=7, backend=backend)
    c = flashattn.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seed=8, backend=backend)
    no_dropout = flashattn.flash_attn_func(q, k, v, backend=backend)
    # Every backend draws the mask the reference draws.
    ref = flashattn.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seed=7, backend="reference")
    assert rel_error(a, b) < 1e-6 and rel_error(a, ref) < 1e-5
    assert rel_error(a, c) > 1e-2 and rel_error(a, no_dropout) > 1e-2


def test_dropout_seeds_share_one_plan(backend, rng):
    """A training loop's fresh seed per step reuses the plan (the seed is
    set per call, fa_plan_set_dropout_seed), and each call still draws the
    mask of its own seed and offset, forward and backward."""
    q, k, v, dout = (random(rng, (1, 48, 2, 32)) for _ in range(4))
    ctx = flashattn.context(backend, -1)
    first = flashattn.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=1, backend=backend)
    plans = len(ctx._plans)
    for seed in (2, 3):
        opts = dict(dropout_p=0.3, dropout_seed=seed, dropout_offset=seed << 33)
        out, lse = flashattn.flash_attn_func(q, k, v, return_softmax_lse=True, backend=backend, **opts)
        grads = flashattn.flash_attn_backward(dout, q, k, v, out, lse, backend=backend, **opts)
        ref_out = flashattn.flash_attn_func(q, k, v, backend="reference", **opts)
        ref_grads = flashattn.flash_attn_backward(dout, q, k, v, out, lse, backend="reference", **opts)
        assert rel_error(out, ref_out) < 1e-5
        for got, want in zip(grads, ref_grads):
            assert rel_error(got, want) < 1e-5
        assert rel_error(out, first) > 1e-2
    again = flashattn.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=1, backend=backend)
    assert np.array_equal(first, again)
    assert len(ctx._plans) == plans


def test_dropout_backward_needs_the_seed(rng):
    q = random(rng, (1, 16, 1, 32))
    with pytest.raises(ValueError, match="dropout_seed"):
        flashattn.flash_attn_backward(q, q, q, q, q, np.zeros((1, 1, 16), np.float32), dropout_p=0.1)


def test_dlpack_producer(backend, rng):
    """Any object with __dlpack__ (here a wrapper around an array, so the
    NumPy path is not taken) is read without a copy."""

    class Producer:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kwargs):
            return self.a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    q, k, v = random(rng, (1, 32, 2, 32)), random(rng, (1, 32, 2, 32)), random(rng, (1, 32, 2, 32))
    out = flashattn.flash_attn_func(Producer(q), Producer(k), Producer(v), backend=backend)
    assert isinstance(out, np.ndarray)
    assert rel_error(out, batched_fp64(q, k, v)[0]) < 1e-5


def test_library_errors_carry_status_and_message(rng):
    q = random(rng, (1, 16, 2, 32))
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q, q, q, dropout_p=1.5, backend="reference")
    assert e.value.status == flashattn.Status.FA_ERR_BAD_DROPOUT
    assert "dropout" in e.value.message and e.value.function == "fa_plan_create"
    q12 = random(rng, (1, 16, 2, 12))
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q12, q12, q12, backend="reference")
    assert e.value.status == flashattn.Status.FA_ERR_UNSUPPORTED_HEAD_DIM and "head_dim" in e.value.message
    k3 = random(rng, (1, 16, 3, 32))
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q, k3, k3, backend="reference")
    assert e.value.status == flashattn.Status.FA_ERR_HEADS_MISMATCH
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q, q, q, backend="reference", device=99)
    assert e.value.status == flashattn.Status.FA_ERR_DEVICE_NOT_FOUND


def test_score_options_on_the_reference(rng):
    # softcap and alibi_slopes (flash_attn_func's names) reach the
    # descriptor; the reference backend computes them: softcap bends the
    # scaled logit, ALiBi subtracts slope * |i + sk - sq - j|.
    b, sq, sk, h, d = 1, 12, 20, 2, 32
    q, k, v = random(rng, (b, sq, h, d)), random(rng, (b, sk, h, d)), random(rng, (b, sk, h, d))
    slopes = np.array([0.5, 0.25], dtype=np.float32)
    out = flashattn.flash_attn_func(q, k, v, softcap=2.0, alibi_slopes=slopes, backend="reference")
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    for hh in range(h):
        s = q[0, :, hh].astype(np.float64) @ k[0, :, hh].astype(np.float64).T / np.sqrt(d)
        s = 2.0 * np.tanh(s / 2.0) - float(slopes[hh]) * np.abs(i + sk - sq - j)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        want = (p / p.sum(axis=1, keepdims=True)) @ v[0, :, hh].astype(np.float64)
        assert rel_error(out[0, :, hh], want) < 1e-5
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_func(q, q, q, backend="reference", softcap=-1.0)
    assert e.value.status == flashattn.Status.FA_ERR_INVALID_ARGUMENT and "softcap" in e.value.message
    with pytest.raises(ValueError, match="heads_q"):
        flashattn.flash_attn_func(q, q, q, backend="reference", alibi_slopes=np.ones(3, dtype=np.float32))


def test_python_side_argument_errors(rng):
    q = random(rng, (1, 16, 2, 32))
    with pytest.raises(ValueError, match="same shape"):
        flashattn.flash_attn_func(q, q, q[:, :8], backend="reference")
    with pytest.raises(ValueError, match="4 dimensions"):
        flashattn.flash_attn_func(q[0], q[0], q[0], backend="reference")
    with pytest.raises(TypeError, match="float64"):
        flashattn.flash_attn_func(q.astype(np.float64), q, q, backend="reference")
    with pytest.raises(ValueError, match="backend"):
        flashattn.flash_attn_func(q, q, q, backend="metal")


def test_devices_and_version():
    found = flashattn.devices()
    assert any(d.backend == "reference" for d in found)
    assert flashattn.backend_status("reference") == (True, "")
    assert flashattn.__version__.count(".") == 2


def test_layouts_taken_in_place_or_copied(rng):
    """Strided views the library can address are used as they are; a
    head_dim that is not contiguous, or a misaligned start, is copied."""
    from flashattn import _views
    qkv = random(rng, (2, 16, 3, 4, 32))
    q = qkv[:, :, 0]
    assert _views.from_numpy(q, "q").obj is q
    assert _views.from_numpy(q[..., ::2], "q").obj is not q
    flat = random(rng, (2 * 16 * 4 * 32 + 1,))
    misaligned = flat[1:].reshape(2, 16, 4, 32)  # starts 4 bytes into an aligned block
    assert _views.from_numpy(misaligned, "q").obj is not misaligned
    lse = random(rng, (2, 4, 15))
    assert _views.from_numpy(lse, "lse", packed=True).obj is lse
    assert _views.from_numpy(lse.transpose(0, 2, 1).copy().transpose(0, 2, 1), "lse", packed=True).obj is not lse


def test_backward_takes_any_lse_layout(backend, rng):
    q, k, v = random(rng, (1, 15, 2, 32)), random(rng, (1, 15, 2, 32)), random(rng, (1, 15, 2, 32))
    dout = random(rng, q.shape)
    out, lse = flashattn.flash_attn_func(q, k, v, return_softmax_lse=True, backend=backend)
    lse_f = np.asfortranarray(lse)
    a = flashattn.flash_attn_backward(dout, q, k, v, out, lse, backend=backend)
    b = flashattn.flash_attn_backward(dout, q, k, v, out, lse_f, backend=backend)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
