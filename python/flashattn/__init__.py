"""flashattn: exact, fused attention (FlashAttention) on OpenCL, CUDA, HIP
and the CPU, from Python, through the C library libflashattn (ctypes).

    import flashattn
    out = flashattn.flash_attn_func(q, k, v, causal=True)

q, k, v: NumPy arrays, CPU DLPack producers or PyTorch tensors (CPU or CUDA;
with autograd), [batch, seqlen, heads, head_dim], float32, float16 or
bfloat16 (as uint16 bit patterns or ml_dtypes.bfloat16 in NumPy).

    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens)

runs a decoding step against a KV cache (appending k_new and v_new in place).

    out = flashattn.ring_attention(q_local, k_local, v_local, group, causal=True)

runs one attention over the tokens of every rank of a torch.distributed
process group (or of any flashattn.Transport), K and V travelling around
the ring.
"""
from ._lib import FlashAttnError, Status, lib, library_path
from ._context import Context, Device, backend_status, context, devices
from ._api import (flash_attn_backward, flash_attn_func, flash_attn_varlen_backward,
                   flash_attn_varlen_func)
from ._kvcache import flash_attn_with_kvcache
from ._ring import (Communicator, ThreadTransport, TorchTransport, Transport, cp_shard, cp_unshard,
                    ring_attention, ring_attention_backward)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_backward", "flash_attn_varlen_backward",
           "flash_attn_with_kvcache",
           "FlashAttnError", "Status", "devices", "backend_status", "context", "Context", "Device",
           "library_path", "ring_attention", "ring_attention_backward", "cp_shard", "cp_unshard", "Communicator",
           "Transport", "ThreadTransport", "TorchTransport", "__version__"]

__version__ = lib.fa_version(None, None, None).decode()
