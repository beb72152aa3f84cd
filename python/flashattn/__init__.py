"""flashattn: exact, fused attention (FlashAttention) on OpenCL, CUDA, HIP
and the CPU, from Python, through the C library libflashattn (ctypes).

    import flashattn
    out = flashattn.flash_attn_func(q, k, v, causal=True)

q, k, v: NumPy arrays, CPU DLPack producers or PyTorch tensors (CPU or CUDA;
with autograd), [batch, seqlen, heads, head_dim], float32, float16 or
bfloat16 (as uint16 bit patterns or ml_dtypes.bfloat16 in NumPy).
"""
from ._lib import FlashAttnError, Status, lib, library_path
from ._context import Context, Device, backend_status, context, devices
from ._api import (flash_attn_backward, flash_attn_func, flash_attn_varlen_backward,
                   flash_attn_varlen_func)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_backward", "flash_attn_varlen_backward",
           "FlashAttnError", "Status", "devices", "backend_status", "context", "Context", "Device",
           "library_path", "__version__"]

__version__ = lib.fa_version(None, None, None).decode()
