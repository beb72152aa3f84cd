"""Loading libflashattn and declaring its C API for ctypes.

The library is looked up in this order: the file FLASHATTN_LIBRARY names
(a system install, or a build tree), the copy bundled in this package by
``pip install``, then the system's search path. The structures below mirror
include/flashattn.h field for field; tests/test_abi.py compares their
offsets with the C compiler's.
"""
import ctypes
import ctypes.util
import enum
import os
import sys

__all__ = ["FlashAttnError", "Status", "lib", "library_path", "check", "call"]

Status = enum.IntEnum("Status", [(name, value) for value, name in enumerate([
    "FA_SUCCESS", "FA_ERR_NULL_POINTER", "FA_ERR_INVALID_SIZE", "FA_ERR_UNSUPPORTED_HEAD_DIM",
    "FA_ERR_HEADS_MISMATCH", "FA_ERR_BAD_STRIDE", "FA_ERR_OUT_OF_BOUNDS", "FA_ERR_MISALIGNED",
    "FA_ERR_FOREIGN_BUFFER", "FA_ERR_DTYPE_MISMATCH", "FA_ERR_BAD_DROPOUT", "FA_ERR_BAD_MASK",
    "FA_ERR_BAD_SCALE", "FA_ERR_BAD_SEQLENS", "FA_ERR_INVALID_ARGUMENT", "FA_ERR_BACKEND_UNAVAILABLE",
    "FA_ERR_DEVICE_NOT_FOUND", "FA_ERR_OUT_OF_MEMORY", "FA_ERR_COMPILE", "FA_ERR_LAUNCH",
    "FA_ERR_UNSUPPORTED", "FA_ERR_IO", "FA_ERR_INTERNAL"])])
Status.__doc__ = "fa_status: the header's status codes, same names and values."

# fa_backend, fa_dtype, fa_algorithm: the header's enumerators.
BACKENDS = {"any": -1, "reference": 0, "opencl": 1, "cuda": 2, "hip": 3}
BACKEND_NAMES = {v: k for k, v in BACKENDS.items()}
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_FP8_E4M3 = 0, 1, 2, 3
ALGORITHMS = {"fused": 0, "standard": 1}


class FlashAttnError(RuntimeError):
    """A call into libflashattn failed.

    ``status`` is the fa_status code as a Status (``status.name`` e.g.
    "FA_ERR_BAD_DROPOUT"), ``description`` what fa_status_string says of it,
    ``message`` the library's details (fa_last_error: the field concerned, a
    compiler log, the runtime's message) and ``function`` the C function
    that failed.
    """

    def __init__(self, status, description, message, function):
        try:
            self.status = Status(status)
        except ValueError:  # a code newer than this module
            self.status = status
        self.description = description
        self.message = message
        self.function = function
        name = getattr(self.status, "name", str(status))
        super().__init__(f"{function}: {name} ({description}): {message}")


class TensorDesc(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("offset", ctypes.c_int64), ("stride_batch", ctypes.c_int64),
                ("stride_seq", ctypes.c_int64), ("stride_head", ctypes.c_int64)]


class AttentionDesc(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int), ("seqlen_q", ctypes.c_int), ("seqlen_k", ctypes.c_int),
        ("heads_q", ctypes.c_int), ("heads_kv", ctypes.c_int), ("head_dim", ctypes.c_int),
        ("q", TensorDesc), ("k", TensorDesc), ("v", TensorDesc), ("o", TensorDesc),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int), ("window_left", ctypes.c_int), ("window_right", ctypes.c_int),
        ("block_mask", ctypes.POINTER(ctypes.c_uint8)), ("block_mask_bytes", ctypes.c_size_t),
        ("block_q", ctypes.c_int), ("block_k", ctypes.c_int),
        ("dropout_p", ctypes.c_float), ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64),
        ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)), ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
        ("algorithm", ctypes.c_int), ("deterministic", ctypes.c_int), ("allow_tf32", ctypes.c_int),
        ("softcap", ctypes.c_float), ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
        ("bias", TensorDesc), ("bias_batch", ctypes.c_int), ("bias_heads", ctypes.c_int),
        ("kv_cache", ctypes.c_int), ("page_size", ctypes.c_int), ("num_pages", ctypes.c_int),
        ("seqlen_new", ctypes.c_int), ("k_new", TensorDesc), ("v_new", TensorDesc),
        ("rotary_dim", ctypes.c_int), ("rotary_interleaved", ctypes.c_int),
        ("descale_q", ctypes.c_float), ("descale_k", ctypes.c_float), ("descale_v", ctypes.c_float),
    ]


class KvcacheArgs(ctypes.Structure):
    """fa_kvcache_args: the buffers of one KV-cache step (NULL where the
    descriptor does not ask for one)."""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "q", "k_cache", "v_cache", "o", "lse", "cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos",
        "rotary_sin")]


class DeviceDesc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 128), ("vendor", ctypes.c_char * 64), ("arch", ctypes.c_char * 32),
        ("backend", ctypes.c_int), ("type", ctypes.c_int), ("local_mem_bytes", ctypes.c_size_t),
        ("max_work_group_size", ctypes.c_int), ("simd_width", ctypes.c_int), ("compute_units", ctypes.c_int),
        ("clock_mhz", ctypes.c_int), ("bandwidth_gbs", ctypes.c_double), ("bandwidth_measured", ctypes.c_int),
        ("global_mem_bytes", ctypes.c_size_t), ("fp32_flops_per_clock_cu", ctypes.c_double),
        ("matrix_flops_per_clock_cu", ctypes.c_double), ("matrix_m", ctypes.c_int), ("matrix_n", ctypes.c_int),
        ("matrix_k", ctypes.c_int), ("l2_cache_bytes", ctypes.c_size_t),
    ]


class DeviceInfo(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("index", ctypes.c_int), ("driver_version", ctypes.c_char * 64),
                ("desc", DeviceDesc)]


_P = ctypes.c_void_p
_STATUS = ctypes.c_int

# fa_transport: the callbacks a transport gives the library (ctypes
# function types; an instance must outlive every fa_comm made from it).
TRANSPORT_START = ctypes.CFUNCTYPE(_STATUS, _P, _P, _P, ctypes.c_size_t, ctypes.c_int, _P, ctypes.c_size_t,
                                   ctypes.c_int, ctypes.POINTER(_P))
TRANSPORT_WAIT = ctypes.CFUNCTYPE(_STATUS, _P, _P, _P)
TRANSPORT_AGREE = ctypes.CFUNCTYPE(_STATUS, _P, ctypes.POINTER(ctypes.c_int64), ctypes.c_int)
TRANSPORT_RELEASE = ctypes.CFUNCTYPE(None, _P)


class Transport(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("world", ctypes.c_int), ("device_memory", ctypes.c_int), ("impl", _P),
                ("start", TRANSPORT_START), ("wait", TRANSPORT_WAIT), ("agree", TRANSPORT_AGREE),
                ("release", TRANSPORT_RELEASE)]


# fa_cp_layout
CP_LAYOUTS = {"contiguous": 0, "zigzag": 1}
# name: (result type, argument types)
_PROTOTYPES = {
    "fa_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_last_error": (ctypes.c_char_p, []),
    "fa_version": (ctypes.c_char_p, [ctypes.POINTER(ctypes.c_int)] * 3),
    "fa_backend_name": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_backend_get_status": (_STATUS, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
    "fa_device_count": (_STATUS, [ctypes.POINTER(ctypes.c_int)]),
    "fa_device_get_info": (_STATUS, [ctypes.c_int, ctypes.POINTER(DeviceInfo)]),
    "fa_context_create": (_STATUS, [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_P)]),
    "fa_context_get_info": (_STATUS, [_P, ctypes.POINTER(DeviceInfo)]),
    "fa_context_synchronize": (_STATUS, [_P]),
    "fa_context_get_native": (_STATUS, [_P, ctypes.POINTER(_P), ctypes.POINTER(_P)]),
    "fa_context_set_native_queue": (_STATUS, [_P, _P]),
    "fa_context_destroy": (_STATUS, [_P]),
    "fa_buffer_alloc": (_STATUS, [_P, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "fa_buffer_wrap": (_STATUS, [_P, _P, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "fa_buffer_upload": (_STATUS, [_P, ctypes.c_size_t, _P, ctypes.c_size_t]),
    "fa_buffer_download": (_STATUS, [_P, ctypes.c_size_t, _P, ctypes.c_size_t]),
    "fa_buffer_free": (_STATUS, [_P]),
    "fa_attention_desc_init": (None, [ctypes.POINTER(AttentionDesc)]),
    "fa_plan_create": (_STATUS, [_P, ctypes.POINTER(AttentionDesc), ctypes.POINTER(_P)]),
    "fa_plan_destroy": (_STATUS, [_P]),
    "fa_plan_set_dropout_seed": (_STATUS, [_P, ctypes.c_uint64, ctypes.c_uint64]),
    "fa_plan_set_descale": (_STATUS, [_P, ctypes.c_float, ctypes.c_float, ctypes.c_float]),
    "fa_plan_last_time_ms": (_STATUS, [_P, ctypes.POINTER(ctypes.c_double)]),
    "fa_forward": (_STATUS, [_P] * 6),
    "fa_backward": (_STATUS, [_P] * 10),
    "fa_forward_kvcache": (_STATUS, [_P, ctypes.POINTER(KvcacheArgs)]),
    "fa_cp_part": (_STATUS, [ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int]
                   + [ctypes.POINTER(ctypes.c_int64)] * 3),
    "fa_cp_scatter": (_STATUS, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_size_t, _P, _P]),
    "fa_cp_gather": (_STATUS, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_size_t, _P, _P]),
    "fa_comm_create": (_STATUS, [ctypes.POINTER(Transport), ctypes.POINTER(_P)]),
    "fa_comm_create_nccl": (_STATUS, [_P, _P, ctypes.POINTER(_P)]),
    "fa_comm_get_rank": (_STATUS, [_P, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "fa_comm_destroy": (_STATUS, [_P]),
    "fa_dist_plan_create": (_STATUS, [_P, _P, ctypes.POINTER(AttentionDesc), ctypes.c_int, ctypes.POINTER(_P)]),
    "fa_dist_forward": (_STATUS, [_P] * 6),
    "fa_dist_backward": (_STATUS, [_P] * 10),
    "fa_dist_plan_format": (ctypes.c_size_t, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "fa_dist_plan_destroy": (_STATUS, [_P]),
}


def _candidates():
    named = os.environ.get("FLASHATTN_LIBRARY")
    if named:
        return [named]  # asked for this file: no silent fallback to another
    here = os.path.dirname(os.path.abspath(__file__))
    names = {"win32": ["flashattn.dll"], "darwin": ["libflashattn.dylib"]}.get(sys.platform, ["libflashattn.so"])
    found = [os.path.join(here, n) for n in names if os.path.exists(os.path.join(here, n))]
    system = ctypes.util.find_library("flashattn")
    return found + ([system] if system else []) + ["libflashattn.so.0"]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("cannot load libflashattn (set FLASHATTN_LIBRARY to its path): " + "; ".join(errors))


lib, library_path = _load()
for _name, (_restype, _argtypes) in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes


def check(status, function):
    """Raises FlashAttnError for a failed call (status != FA_SUCCESS)."""
    if status != Status.FA_SUCCESS:
        raise FlashAttnError(status, lib.fa_status_string(status).decode(), lib.fa_last_error().decode(),
                             function)


def call(name, *args):
    """Calls the C function name and raises FlashAttnError when it fails."""
    check(getattr(lib, name)(*args), name)
