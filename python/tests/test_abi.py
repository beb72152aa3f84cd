"""The ctypes declarations against the C header: every structure's size
and field offsets as the C compiler lays them out, every declared
function's parameters and result (how many, which are pointers, which are
floating point, their sizes), and the status codes' names and values. A
mismatch would corrupt memory silently, so this runs wherever the source
tree and a C compiler are present."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

from flashattn import Status, _lib

HEADER_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "include")
STRUCTS = {"fa_tensor_desc": _lib.TensorDesc, "fa_attention_desc": _lib.AttentionDesc,
           "fa_device_desc": _lib.DeviceDesc, "fa_device_info": _lib.DeviceInfo, "fa_transport": _lib.Transport,
           "fa_kvcache_args": _lib.KvcacheArgs}


def _header():
    path = os.path.join(HEADER_DIR, "flashattn.h")
    if not os.path.exists(path):
        pytest.skip("include/flashattn.h is not here (tests run outside the source tree)")
    return path


def _compiler():
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        pytest.skip(f"no C compiler ({cc})")
    return cc


def _run_c(tmp_path, body):
    """Compiles and runs a main() of body's lines against the header; its
    output as integers."""
    lines = ["#include <flashattn.h>", "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    lines += body + ["    return 0;", "}"]
    src, exe = tmp_path / "probe.c", tmp_path / "probe"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([_compiler(), "-std=c11", "-I", HEADER_DIR, str(src), "-o", str(exe)], check=True)
    return [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]


def test_structures_match_the_header(tmp_path):
    _header()
    _compiler()
    lines = []
    expected = []
    for c_name, py in STRUCTS.items():
        lines.append(f'    printf("%zu\\n", sizeof({c_name}));')
        expected.append(ctypes.sizeof(py))
        for field, _ in py._fields_:
            lines.append(f'    printf("%zu\\n", offsetof({c_name}, {field}));')
            expected.append(getattr(py, field).offset)
    assert _run_c(tmp_path, lines) == expected


def _c_prototypes(text):
    """{name: (result type, [parameter types])} of the header's FA_API
    functions, parameter names dropped ("const fa_transport *", "int64_t")."""
    found = {}
    for ret, name, params in re.findall(r"^FA_API\s+([^(]*?)\b(fa_\w+)\(([^)]*)\);", text, re.M | re.S):
        types = []
        for p in (" ".join(x.split()) for x in params.split(",")):
            if p in ("", "void"):
                continue
            words = re.match(r"^(.*?)\s*\b(\w+)$", p)
            types.append(words.group(1) if words and words.group(1) not in ("", "const", "struct") else p)
        found[name] = (" ".join(ret.split()), types)
    return found


def _is_ctypes_pointer(t):
    return issubclass(t, (ctypes.c_void_p, ctypes.c_char_p, ctypes._Pointer, ctypes._CFuncPtr))


def test_function_prototypes_match_the_header(tmp_path):
    """Each function ctypes declares has the header's number of
    parameters; a parameter (and a result) is a pointer (a `*` or a handle
    typedef) exactly where ctypes says so, floating point exactly where
    ctypes says so, and otherwise of the C type's size (sizeof, by the
    compiler)."""
    text = open(_header()).read()
    _compiler()
    handles = set(re.findall(r"typedef struct \w+ \*(\w+);", text))
    prototypes = _c_prototypes(text)
    sized, expected = [], []
    for name, (restype, argtypes) in _lib._PROTOTYPES.items():
        ret, params = prototypes[name]
        assert len(params) == len(argtypes), f"{name}: {len(params)} parameters in the header, {len(argtypes)} declared"
        pairs = [(f"{name} parameter {i}", c, t) for i, (c, t) in enumerate(zip(params, argtypes))]
        if ret == "void":
            assert restype is None, f"{name} returns void"
        else:
            pairs.append((f"{name} result", ret, restype))
        for what, c_type, py_type in pairs:
            pointer = "*" in c_type or c_type.replace("const ", "") in handles
            assert pointer == _is_ctypes_pointer(py_type), f"{what}: {c_type} against {py_type.__name__}"
            if pointer:
                continue
            floating = c_type in ("float", "double")
            assert floating == (py_type in (ctypes.c_float, ctypes.c_double)), f"{what}: {c_type} against {py_type}"
            sized.append(f'    printf("%zu\\n", sizeof({c_type})); /* {what} */')
            expected.append((what, c_type, ctypes.sizeof(py_type)))
    got = _run_c(tmp_path, sized)
    mismatched = [(what, c_type, size, want) for (what, c_type, want), size in zip(expected, got) if size != want]
    assert not mismatched


def test_status_codes_match_the_header():
    text = open(_header()).read()
    body = re.search(r"typedef enum fa_status \{(.*?)\} fa_status;", text, re.S).group(1)
    names = re.findall(r"^\s*(FA_[A-Z_]+)", body, re.M)
    names.remove("FA_STATUS_COUNT")
    assert [s.name for s in Status] == names
    assert [s.value for s in Status] == list(range(len(names)))


def test_every_declared_function_is_in_the_library():
    """The functions ctypes declares exist in the loaded library with the
    header's names (a renamed C function fails here, not at a call)."""
    text = open(_header()).read()
    declared = set(re.findall(r"^FA_API [^(]*?\b(fa_\w+)\(", text, re.M))
    assert set(_lib._PROTOTYPES) <= declared


def test_library_override_must_load(tmp_path):
    """FLASHATTN_LIBRARY names the library to use: a wrong path is an
    ImportError that says so, never a silent fallback to another copy."""
    env = dict(os.environ, FLASHATTN_LIBRARY=str(tmp_path / "missing.so"))
    r = subprocess.run([sys.executable, "-c", "import flashattn"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "FLASHATTN_LIBRARY" in r.stderr and "missing.so" in r.stderr
