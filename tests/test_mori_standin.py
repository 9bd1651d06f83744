"""Tests of the pdconform stand-in for amd-mori 1.2.4's IO engine (backends/mori/standin).

Run: ``.venv/bin/python -m pytest -q tests/test_mori_standin.py``
"""

from __future__ import annotations

import ast
import ctypes
import importlib
import importlib.util
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parents[1] / "backends" / "mori" / "standin"
sys.path.insert(0, str(STANDIN))

import mori  # noqa: E402
from mori.cpp import TransferStatus  # noqa: E402
from mori.io import (  # noqa: E402
    BackendType,
    EngineDesc,
    IOEngine,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    PeerFailureReason,
    PollCqMode,
    RdmaBackendConfig,
    StatusCode,
    set_standin_faults,
)

# What sglang 0.5.23's mori/conn.py imports, for when sglang is not installed.
FALLBACK_IMPORTS = {
    "mori.cpp": ["TransferStatus"],
    "mori.io": ["BackendType", "EngineDesc", "IOEngine", "IOEngineConfig", "MemoryDesc",
                "MemoryLocationType", "PollCqMode", "RdmaBackendConfig", "StatusCode"],
}


def test_is_the_standin():
    assert mori.__pdconform_standin__ is True
    assert mori.__version__ == "1.2.4+pdconform-standin"
    assert Path(mori.__file__).resolve().is_relative_to(STANDIN)


# ----------------------------------------------------------------- fixtures


def _standin_threads():
    return [t for t in threading.enumerate() if t.name.startswith("mori-standin")]


@pytest.fixture(autouse=True)
def _no_faults():
    set_standin_faults()
    yield
    set_standin_faults()


@pytest.fixture
def make_engine():
    """Factory for engines with an RDMA backend; closes them and checks nothing leaks."""
    made = []

    def make(key: str) -> IOEngine:
        eng = IOEngine(key, IOEngineConfig(host="127.0.0.1", port=0))
        eng.create_backend(BackendType.RDMA, RdmaBackendConfig(1, -1, -1, PollCqMode.POLLING, False))
        made.append(eng)
        return eng

    yield make
    ports = [e.get_engine_desc().port for e in made]
    for eng in made:
        eng.standin_close()
    deadline = time.monotonic() + 3
    while _standin_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _standin_threads(), f"leaked threads: {_standin_threads()}"
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()


class Buf:
    """A ctypes byte buffer registered with an engine."""

    def __init__(self, engine: IOEngine, size: int, fill: int | bytes = 0):
        init = fill if isinstance(fill, bytes) else bytes([fill]) * size
        self.raw = ctypes.create_string_buffer(init, size)
        self.addr = ctypes.addressof(self.raw)
        self.desc = engine.register_memory(self.addr, size, -1, MemoryLocationType.CPU)

    def bytes(self) -> bytes:
        return self.raw.raw


def _pattern(n: int, seed: int = 7) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


def _connect(src: IOEngine, dst: IOEngine) -> None:
    src.register_remote_engine(EngineDesc.unpack(dst.get_engine_desc().pack()))


# ---------------------------------------------------------------- (1) API


def _conn_py_imports():
    spec = importlib.util.find_spec("sglang")  # locates without importing sglang
    if spec is None or not spec.submodule_search_locations:
        return None, None
    path = Path(list(spec.submodule_search_locations)[0]) / "srt" / "disaggregation" / "mori" / "conn.py"
    if not path.exists():
        return None, None
    tree = ast.parse(path.read_text())
    imports = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mori":
            imports.setdefault(node.module, []).extend(a.name for a in node.names)
    return imports, tree


def test_exposes_everything_conn_py_imports():
    imports, tree = _conn_py_imports()
    if imports is None:
        imports = FALLBACK_IMPORTS
    assert imports, "conn.py imports nothing from mori?"
    bound = {}
    for module, names in imports.items():
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name), f"{module}.{name} missing"
            bound[name] = getattr(mod, name)
    if tree is None:
        return
    # Every attribute conn.py reads off an imported mori name (StatusCode.SUCCESS,
    # EngineDesc.unpack, PollCqMode.POLLING, ...) and every method it calls on
    # self.engine must exist too.
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            assert hasattr(bound[node.value.id], node.attr), f"{node.value.id}.{node.attr} missing"
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "engine" and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"):
            assert hasattr(IOEngine, node.attr), f"IOEngine.{node.attr} missing"
    for method in ("Code", "Message", "InProgress", "Succeeded", "Failed", "Wait", "WaitFor"):
        assert callable(getattr(TransferStatus, method))


def test_enum_values_match_the_wheel():
    assert [(m.name, m.value) for m in StatusCode] == [
        ("SUCCESS", 0), ("INIT", 1), ("IN_PROGRESS", 2), ("ERR_INVALID_ARGS", 11),
        ("ERR_NOT_FOUND", 12), ("ERR_RDMA_OP", 13), ("ERR_BAD_STATE", 14), ("ERR_GPU_OP", 15)]
    assert int(BackendType.RDMA) == 2 and int(MemoryLocationType.GPU) == 2
    assert StatusCode.SUCCESS != 0  # pybind11 enums never equal plain ints
    assert mori.cpp.ERR_RDMA_OP is StatusCode.ERR_RDMA_OP  # export_values()


def test_descriptors_round_trip(make_engine):
    eng = make_engine("rt")
    desc = eng.get_engine_desc()
    assert desc.key == "rt" and desc.port > 0
    assert EngineDesc.unpack(desc.pack()) == desc
    buf = Buf(eng, 64)
    assert MemoryDesc.unpack(buf.desc.pack()) == buf.desc
    assert (buf.desc.engine_key, buf.desc.size, buf.desc.data) == ("rt", 64, buf.addr)
    with pytest.raises(RuntimeError):
        EngineDesc.unpack(b"garbage")
    with pytest.raises(RuntimeError):
        eng.register_memory(buf.addr, 0, -1, MemoryLocationType.CPU)


# ------------------------------------------------------- (2) same process


def test_same_process_write_moves_exact_bytes(make_engine):
    src_eng, dst_eng = make_engine("sp-src"), make_engine("sp-dst")
    _connect(src_eng, dst_eng)
    src = Buf(src_eng, 4096, _pattern(4096))
    dst = Buf(dst_eng, 4096, 0xEE)
    remote = MemoryDesc.unpack(dst.desc.pack())
    uid = src_eng.allocate_transfer_uid()
    statuses = src_eng.batch_write([src.desc], [[0, 1000]], [remote], [[100, 3000]], [[64, 500]], [uid])
    assert len(statuses) == 1
    assert src_eng.wait_all(statuses, timeout_ms=5000) == StatusCode.SUCCESS
    assert statuses[0].Succeeded() and statuses[0].Code() == StatusCode.SUCCESS
    expected = bytearray(b"\xee" * 4096)
    expected[100:164] = _pattern(4096)[0:64]
    expected[3000:3500] = _pattern(4096)[1000:1500]
    assert dst.bytes() == bytes(expected)  # exact bytes, neighbours untouched
    inbound = dst_eng.pop_inbound_transfer_status("sp-src", uid)
    assert inbound is not None and inbound.Succeeded()
    assert dst_eng.pop_inbound_transfer_status("sp-src", uid) is None

    # read back the other way, and a single write()
    back = Buf(src_eng, 64, 0)
    st = src_eng.read(back.desc, 0, remote, 100, 64, src_eng.allocate_transfer_uid())
    assert st.WaitFor(5000) == StatusCode.SUCCESS
    assert back.bytes() == _pattern(4096)[0:64]
    st = src_eng.write(src.desc, 0, remote, 0, 8, src_eng.allocate_transfer_uid())
    st.Wait()
    assert st.Succeeded() and dst.bytes()[:8] == _pattern(4096)[:8]


# ------------------------------------------------------ (3) child process

_CHILD = textwrap.dedent(
    """
    import json, sys, ctypes
    sys.path.insert(0, sys.argv[1])
    from mori.io import *
    msg = json.loads(sys.stdin.read())
    eng = IOEngine("child-writer", IOEngineConfig(host="127.0.0.1", port=0))
    eng.create_backend(BackendType.RDMA, RdmaBackendConfig())
    eng.register_remote_engine(EngineDesc.unpack(bytes.fromhex(msg["engine"])))
    remote = MemoryDesc.unpack(bytes.fromhex(msg["mem"]))
    data = bytes.fromhex(msg["data"])
    buf = ctypes.create_string_buffer(data, len(data))
    local = eng.register_memory(ctypes.addressof(buf), len(data), -1, MemoryLocationType.CPU)
    uid = eng.allocate_transfer_uid()
    sts = eng.batch_write([local], [[0]], [remote], [[msg["offset"]]], [[len(data)]], [uid])
    rc = eng.wait_all(sts, 10000)
    print(json.dumps({"key": "child-writer", "uid": uid, "rc": rc.name, "msg": sts[0].Message()}))
    eng.standin_close()
    """
)


def test_child_process_write_into_parent_memory(make_engine):
    parent = make_engine("parent-target")
    dst = Buf(parent, 8192, 0x11)
    payload = _pattern(3000, seed=3)
    msg = {"engine": parent.get_engine_desc().pack().hex(), "mem": dst.desc.pack().hex(),
           "data": payload.hex(), "offset": 4000}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(STANDIN)], input=json.dumps(msg),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == "SUCCESS", out
    expected = bytearray(b"\x11" * 8192)
    expected[4000:7000] = payload
    assert dst.bytes() == bytes(expected)
    inbound = parent.pop_inbound_transfer_status(out["key"], out["uid"])
    assert inbound is not None and inbound.Succeeded()


# ---------------------------------------------------- (4) bad transfers


def test_out_of_bounds_and_unknown_regions_fail_cleanly(make_engine):
    a, b = make_engine("oob-a"), make_engine("oob-b")
    _connect(a, b)
    src = Buf(a, 256, _pattern(256))
    dst = Buf(b, 256, 0x55)
    uid = a.allocate_transfer_uid

    # initiator-side checks: remote past the end, local past the end, negative offset
    sts = a.batch_write([src.desc] * 3, [[0], [250], [0]], [dst.desc] * 3, [[200], [0], [-1]],
                        [[100], [10], [4]], [uid(), uid(), uid()])
    for st in sts:
        assert st.Failed() and st.Code() == StatusCode.ERR_INVALID_ARGS, st
    # target-side check: a descriptor that lies about its size
    forged_fields = json.loads(dst.desc.pack().split(b"\n", 1)[1])
    forged_fields["size"] = 1 << 20
    forged = MemoryDesc.unpack(dst.desc.pack().split(b"\n", 1)[0] + b"\n" + json.dumps(forged_fields).encode())
    st = a.write(src.desc, 0, forged, 1000, 16, uid())
    assert st.WaitFor(5000) == StatusCode.ERR_INVALID_ARGS and st.Failed(), st.Message()
    # deregistered target region
    b.deregister_memory(dst.desc)
    st = a.write(src.desc, 0, dst.desc, 0, 16, uid())
    assert st.WaitFor(5000) == StatusCode.ERR_NOT_FOUND, st.Message()
    # remote engine never registered
    c = make_engine("oob-c")
    other = Buf(c, 64)
    st = a.write(src.desc, 0, other.desc, 0, 8, uid())
    assert st.Code() == StatusCode.ERR_NOT_FOUND
    assert a.wait_all(sts, 1000) == StatusCode.ERR_INVALID_ARGS
    assert dst.bytes() == b"\x55" * 256  # nothing was written
    # the engine still works
    dst2 = Buf(b, 256, 0)
    st = a.write(src.desc, 0, dst2.desc, 0, 256, uid())
    assert st.WaitFor(5000) == StatusCode.SUCCESS and dst2.bytes() == _pattern(256)


def test_unreachable_peer_fails_with_rdma_error(make_engine):
    a, gone = make_engine("ur-a"), make_engine("ur-gone")
    _connect(a, gone)
    src, dst = Buf(a, 64), Buf(gone, 64)
    gone.standin_close()
    st = a.write(src.desc, 0, dst.desc, 0, 8, a.allocate_transfer_uid())
    assert st.WaitFor(5000) == StatusCode.ERR_RDMA_OP, st.Message()
    event = a.pop_peer_failure()
    assert event is not None and event.reason == PeerFailureReason.PEER_UNREACHABLE
    assert event.remote_engine_key == "ur-gone"


# -------------------------------------------------------- (5) fault knobs


def test_fail_nth_transfer_fails_exactly_that_transfer(make_engine):
    a, b = make_engine("f-a"), make_engine("f-b")
    _connect(a, b)
    src, dst = Buf(a, 300, _pattern(300)), Buf(b, 300, 0)
    set_standin_faults(fail_nth_transfer=2)
    uids = [a.allocate_transfer_uid() for _ in range(3)]
    sts = a.batch_write([src.desc] * 3, [[0], [100], [200]], [dst.desc] * 3, [[0], [100], [200]],
                        [[100], [100], [100]], uids)
    assert a.wait_all(sts, 5000) == StatusCode.ERR_RDMA_OP
    assert [s.Code() for s in sts] == [StatusCode.SUCCESS, StatusCode.ERR_RDMA_OP, StatusCode.SUCCESS]
    got = dst.bytes()
    assert got[0:100] == _pattern(300)[0:100] and got[200:300] == _pattern(300)[200:300]
    assert got[100:200] == b"\x00" * 100
    # the count moved past 2: later transfers succeed
    st = a.write(src.desc, 100, dst.desc, 100, 100, a.allocate_transfer_uid())
    assert st.WaitFor(5000) == StatusCode.SUCCESS


def test_never_complete_and_delay_are_bounded(make_engine):
    a, b = make_engine("n-a"), make_engine("n-b")
    _connect(a, b)
    src, dst = Buf(a, 64, _pattern(64)), Buf(b, 64, 0)
    set_standin_faults(never_complete=True)
    st = a.write(src.desc, 0, dst.desc, 0, 64, a.allocate_transfer_uid())
    t0 = time.monotonic()
    assert st.WaitFor(150) == StatusCode.IN_PROGRESS and st.InProgress()
    assert a.wait_all([st], 100) == StatusCode.IN_PROGRESS
    assert time.monotonic() - t0 < 2
    set_standin_faults(delay_s=0.3)
    st = a.write(src.desc, 0, dst.desc, 0, 64, a.allocate_transfer_uid())
    assert st.InProgress()
    assert st.WaitFor(5000) == StatusCode.SUCCESS and dst.bytes() == _pattern(64)
