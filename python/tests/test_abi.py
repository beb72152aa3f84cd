"""The ctypes declarations against the C header: every structure's size
and field offsets as the C compiler lays them out, and the status codes'
names and values. A mismatch would corrupt memory silently, so this runs
wherever the source tree and a C compiler are present."""
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
           "fa_device_desc": _lib.DeviceDesc, "fa_device_info": _lib.DeviceInfo}


def _header():
    path = os.path.join(HEADER_DIR, "flashattn.h")
    if not os.path.exists(path):
        pytest.skip("include/flashattn.h is not here (tests run outside the source tree)")
    return path


def test_structures_match_the_header(tmp_path):
    _header()
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        pytest.skip(f"no C compiler ({cc})")
    lines = ["#include <flashattn.h>", "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    expected = []
    for c_name, py in STRUCTS.items():
        lines.append(f'    printf("%zu\\n", sizeof({c_name}));')
        expected.append(ctypes.sizeof(py))
        for field, _ in py._fields_:
            lines.append(f'    printf("%zu\\n", offsetof({c_name}, {field}));')
            expected.append(getattr(py, field).offset)
    lines += ["    return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-I", HEADER_DIR, str(src), "-o", str(exe)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == expected


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
