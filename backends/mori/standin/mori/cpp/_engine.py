"""``mori.cpp.IOEngine`` / ``IOEngineSession`` stand-ins with a real TCP data plane.

Each engine owns:

* a listening TCP socket (the configured host/port; port 0 -> ephemeral) and a
  daemon thread accepting peers, plus one daemon thread per inbound connection;
* a daemon worker thread that runs submitted transfers in order, so
  ``BatchWrite``/``BatchRead`` return at once and statuses turn terminal later;
* a table of registered regions (raw address + size, by region id).

A write reads the local bytes with ``ctypes``, sends ``(region id, segments,
bytes)`` to the target engine, which bounds-checks them against its own table
and copies them in with ``ctypes.memmove``; it records an inbound status under
(initiator key, uid).  Engines of the same process skip the socket but run the
same checks.  Reads are the mirror image.  Bad arguments fail the status
(ERR_INVALID_ARGS / ERR_NOT_FOUND / ERR_BAD_STATE); an unreachable peer fails
it with ERR_RDMA_OP and queues a PeerFailureEvent.

Engines stop when their ``IOEngine`` object is destroyed, on
``standin_close()`` (stand-in only), or at interpreter exit.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
import itertools
import json
import os
import queue
import socket
import struct
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from . import _faults
from ._types import (
    BackendConfig,
    BackendType,
    EngineDesc,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    PeerFailureEvent,
    PeerFailureReason,
    StatusCode,
    TransferStatus,
    _as_int,
    _expect,
    wait_statuses,
)

_FRAME = struct.Struct("!4sBIQ")  # magic, op, header bytes, payload bytes
_MAGIC = b"MSI1"
_OP_WRITE, _OP_READ, _OP_REPLY = 1, 2, 3
_MAX_HEADER = 64 << 20
_CONNECT_TIMEOUT_S = 2.0
_IO_TIMEOUT_S = 30.0
_POLL_S = 0.2
_JOIN_S = 2.0
_INBOUND_CAP = 1 << 16  # recorded inbound statuses kept per engine (oldest dropped)
_PEER_FAILURE_CAP = 1024  # as the real PeerFailureTracker::kMaxPending
_DRAIN_CHUNK = 1 << 20

_S = StatusCode

_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_CheckExact = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_CheckExact.restype = ctypes.c_int
_PyCapsule_CheckExact.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _Reject(Exception):
    def __init__(self, code: StatusCode, msg: str) -> None:
        super().__init__(msg)
        self.code, self.msg = code, msg


@dataclasses.dataclass
class _Region:
    addr: int
    size: int
    loc: MemoryLocationType
    device_id: int


@dataclasses.dataclass
class _Op:
    kind: int  # _OP_WRITE or _OP_READ
    status: TransferStatus
    uid: int
    local_id: int
    local_segs: List[Tuple[int, int]]  # (offset, size)
    remote_key: str
    remote_id: int
    remote_segs: List[Tuple[int, int]]
    fault: Optional[str]
    delay_s: float


# Live engines of this process, by key (same-process shortcut and atexit).
_LIVE: Dict[str, "_Runtime"] = {}
_LIVE_LOCK = threading.Lock()


def _check_segments(region: Optional[_Region], segs, what: str) -> None:
    if region is None:
        raise _Reject(_S.ERR_NOT_FOUND, f"{what} region is not registered")
    for off, size in segs:
        if off < 0 or size < 0 or off + size > region.size:
            raise _Reject(_S.ERR_INVALID_ARGS,
                          f"{what} segment [{off}, {off + size}) is outside the region of {region.size} bytes")


def _recv_exact(sock: socket.socket, n: int, stop: Optional[threading.Event], idle_ok: bool = False):
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        try:
            got = sock.recv_into(view[pos:], n - pos)
        except socket.timeout:
            if stop is None or stop.is_set():
                raise
            continue
        if got == 0:
            if pos == 0 and idle_ok:
                return None
            raise ConnectionError("connection closed mid-message")
        pos += got
    return buf


def _drain(sock: socket.socket, n: int, stop: threading.Event) -> None:
    while n > 0:
        step = min(n, _DRAIN_CHUNK)
        _recv_exact(sock, step, stop)
        n -= step


def _send_frame(sock: socket.socket, op: int, header: dict, payload=b"") -> None:
    hdr = json.dumps(header).encode()
    sock.sendall(_FRAME.pack(_MAGIC, op, len(hdr), len(payload)) + hdr)
    if payload:
        sock.sendall(payload)


def _recv_frame_head(sock: socket.socket, stop: Optional[threading.Event], idle_ok: bool = False):
    raw = _recv_exact(sock, _FRAME.size, stop, idle_ok)
    if raw is None:
        return None
    magic, op, hlen, plen = _FRAME.unpack(raw)
    if magic != _MAGIC or hlen > _MAX_HEADER:
        raise ConnectionError("protocol error: bad frame")
    header = json.loads(bytes(_recv_exact(sock, hlen, stop)))
    return op, header, plen


def _local_peer(key: str) -> Optional["_Runtime"]:
    rt = _LIVE.get(key)
    if rt is not None and rt.pid == os.getpid() and not rt.stop.is_set():
        return rt
    return None


class _Runtime:
    """Sockets, threads and tables of one engine.  Holds no reference to the
    ``IOEngine`` object, so that object's destruction can stop it."""

    def __init__(self, key: str, config: IOEngineConfig) -> None:
        self.key = key
        self.pid = os.getpid()
        self.stop = threading.Event()
        self._closed = False
        self._lock = threading.RLock()
        self._regions: Dict[int, _Region] = {}
        self._region_ids = itertools.count(1)
        self._uids = itertools.count(1)
        self._remotes: Dict[str, EngineDesc] = {}
        self._backends: Dict[BackendType, BackendConfig] = {}
        self._inbound: "collections.OrderedDict[Tuple[str, int], Tuple[StatusCode, str]]" = collections.OrderedDict()
        self._failures: "collections.deque[PeerFailureEvent]" = collections.deque()
        self._jobs: "queue.Queue[Optional[List[_Op]]]" = queue.Queue()
        self._out: Dict[str, socket.socket] = {}  # worker's pooled connections, by peer key
        self._conns: Dict[socket.socket, threading.Thread] = {}

        self.host = config.host or "127.0.0.1"
        with _LIVE_LOCK:
            if _local_peer(key) is not None:
                raise RuntimeError(f"IOEngine: an engine with key {key!r} already runs in this process")
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((self.host, config.port))
                listener.listen(64)
                listener.settimeout(_POLL_S)
            except OSError as exc:
                listener.close()
                raise RuntimeError(f"IOEngine {key!r}: cannot listen on {self.host}:{config.port}: {exc}") from None
            self._listener = listener
            self.port = listener.getsockname()[1]
            _LIVE[key] = self
        self._server = threading.Thread(target=self._serve, name=f"mori-standin-server[{key}]", daemon=True)
        self._worker = threading.Thread(target=self._work, name=f"mori-standin-worker[{key}]", daemon=True)
        self._server.start()
        self._worker.start()

    # ------------------------------------------------------------ control plane

    def desc(self) -> EngineDesc:
        hostname = socket.gethostname()
        return EngineDesc._make(self.key, hostname, hostname, self.host, self.port, self.pid)

    def create_backend(self, btype, config) -> None:
        _expect("type", btype, BackendType)
        _expect("config", config, BackendConfig)
        if btype is BackendType.Unknown:
            raise RuntimeError("CreateBackend: BackendType.Unknown is not a backend")
        with self._lock:
            self._backends[btype] = config

    def remove_backend(self, btype) -> None:
        _expect("type", btype, BackendType)
        with self._lock:
            self._backends.pop(btype, None)

    def register_remote(self, desc) -> None:
        _expect("engine_desc", desc, EngineDesc)
        with self._lock:
            self._remotes[desc.key] = desc

    def deregister_remote(self, desc) -> None:
        _expect("engine_desc", desc, EngineDesc)
        with self._lock:
            self._remotes.pop(desc.key, None)

    def register_memory(self, data, size, device_id, loc) -> MemoryDesc:
        if isinstance(data, int):
            ptr = data
        elif _PyCapsule_CheckExact(data, None):
            ptr = _PyCapsule_GetPointer(data, None) or 0
        else:
            raise TypeError(f"RegisterMemory: data must be a capsule or an int address, got {type(data).__name__}")
        size = _as_int("size", size)
        device_id = _as_int("device_id", device_id)
        _expect("loc", loc, MemoryLocationType)
        if ptr <= 0:
            raise RuntimeError("RegisterMemory: null address")
        if size <= 0:
            raise RuntimeError(f"RegisterMemory: size must be > 0 bytes, got {size}")
        with self._lock:
            rid = next(self._region_ids)
            self._regions[rid] = _Region(ptr, size, loc, device_id)
        return MemoryDesc._make(self.key, rid, device_id, ptr, size, loc)

    def deregister_memory(self, desc) -> None:
        _expect("mem_desc", desc, MemoryDesc)
        if desc.engine_key != self.key:
            return
        with self._lock:
            region = self._regions.get(desc.id)
            if region is not None and region.addr == desc.data:
                del self._regions[desc.id]

    def allocate_uid(self) -> int:
        with self._lock:
            return next(self._uids)

    def pop_inbound(self, remote_key: str, uid: int, status: TransferStatus) -> bool:
        _expect("remote_key", remote_key, str)
        uid = _as_int("transfer_uid", uid)
        _expect("status", status, TransferStatus)
        with self._lock:
            got = self._inbound.pop((remote_key, uid), None)
        if got is None:
            return False
        status.Update(*got)
        return True

    def pop_failure(self) -> Optional[PeerFailureEvent]:
        with self._lock:
            return self._failures.popleft() if self._failures else None

    def _record_failure(self, remote_key: str, detail: str) -> None:
        with self._lock:
            if len(self._failures) < _PEER_FAILURE_CAP:
                self._failures.append(PeerFailureEvent._make(remote_key, PeerFailureReason.PEER_UNREACHABLE, detail))

    def _record_inbound(self, src_key: str, uid: int, code: StatusCode, msg: str) -> None:
        with self._lock:
            self._inbound[(src_key, uid)] = (code, msg)
            while len(self._inbound) > _INBOUND_CAP:
                self._inbound.popitem(last=False)

    # ---------------------------------------------------------------- submission

    def submit(self, kind: int, local_descs, local_offsets, remote_descs, remote_offsets,
               sizes, statuses, uids) -> None:
        """Check the arguments, fail bad transfers at once, queue the rest."""
        args = [list(x) for x in (local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, uids)]
        local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, uids = args
        for st in statuses:
            _expect("status", st, TransferStatus)
        for d in local_descs + remote_descs:
            _expect("mem_desc", d, MemoryDesc)
        try:
            uids = [_as_int("transfer_uid", u) for u in uids]
            local_offsets = [[_as_int("local offset", v) for v in row] for row in local_offsets]
            remote_offsets = [[_as_int("remote offset", v) for v in row] for row in remote_offsets]
            sizes = [[_as_int("size", v) for v in row] for row in sizes]
        except TypeError as exc:
            raise TypeError(f"incompatible transfer arguments: {exc}") from None

        n = len(statuses)
        if not all(len(x) == n for x in (local_descs, local_offsets, remote_descs, remote_offsets, sizes, uids)):
            for st in statuses:
                st.Update(_S.ERR_INVALID_ARGS, "batch argument lists differ in length")
            return
        if self.stop.is_set():
            for st in statuses:
                st.Update(_S.ERR_BAD_STATE, f"engine {self.key!r} is shut down")
            return
        with self._lock:
            has_backend = bool(self._backends)
        if not has_backend:
            for st in statuses:
                st.Update(_S.ERR_BAD_STATE, "no backend: call create_backend first")
            return

        faults, group_fails = _faults.next_group()
        ops: List[_Op] = []
        for i in range(n):
            try:
                op = self._check(kind, local_descs[i], local_offsets[i], remote_descs[i],
                                 remote_offsets[i], sizes[i], statuses[i], uids[i])
            except _Reject as rej:
                statuses[i].Update(rej.code, rej.msg)
                continue
            op.fault = _faults.next_transfer(faults, group_fails)
            op.delay_s = float(faults.delay_s)
            statuses[i].Update(_S.IN_PROGRESS, "")
            ops.append(op)
        if ops:
            self._jobs.put(ops)
            if self.stop.is_set():
                self._fail_queued()

    def _check(self, kind, ldesc: MemoryDesc, loffs, rdesc: MemoryDesc, roffs, sizes, status, uid) -> _Op:
        if not (len(loffs) == len(roffs) == len(sizes)):
            raise _Reject(_S.ERR_INVALID_ARGS, "offset and size lists differ in length")
        if ldesc.engine_key != self.key:
            raise _Reject(_S.ERR_INVALID_ARGS,
                          f"local MemoryDesc belongs to engine {ldesc.engine_key!r}, not {self.key!r}")
        with self._lock:
            region = self._regions.get(ldesc.id)
            if region is not None and region.addr != ldesc.data:
                region = None
            known = rdesc.engine_key == self.key or rdesc.engine_key in self._remotes
        lsegs = list(zip(loffs, sizes))
        rsegs = list(zip(roffs, sizes))
        _check_segments(region, lsegs, "local")
        if not known:
            raise _Reject(_S.ERR_NOT_FOUND, f"remote engine {rdesc.engine_key!r} is not registered")
        _check_segments(_Region(rdesc.data, rdesc.size, rdesc.loc, rdesc.device_id), rsegs, "remote")
        return _Op(kind, status, uid, ldesc.id, lsegs, rdesc.engine_key, rdesc.id, rsegs, None, 0.0)

    # -------------------------------------------------------------------- worker

    def _work(self) -> None:
        while True:
            try:
                ops = self._jobs.get(timeout=_POLL_S)
            except queue.Empty:
                if self.stop.is_set():
                    break
                continue
            if ops is None:
                break
            for op in ops:
                self._run(op)
        self._fail_queued()

    def _run(self, op: _Op) -> None:
        if op.fault == _faults.SLOW:  # stand-in fault slow_nth_transfer: later, off this thread
            op.fault = None
            timer = threading.Timer(_faults.get_standin_faults().slow_s, self._run, (op,))
            timer.daemon = True
            timer.start()
            return
        if op.delay_s > 0 and self.stop.wait(op.delay_s):
            op.status.Update(_S.ERR_BAD_STATE, f"engine {self.key!r} shut down before the transfer ran")
            return
        if op.fault == _faults.NEVER:
            return  # stays IN_PROGRESS: stand-in fault never_complete
        if op.fault == _faults.FAIL:
            op.status.Update(_S.ERR_RDMA_OP, "pdconform stand-in injected fault (fail_nth_transfer / fail_group)")
            return
        if self.stop.is_set():
            op.status.Update(_S.ERR_BAD_STATE, f"engine {self.key!r} is shut down")
            return
        try:
            if op.kind == _OP_WRITE:
                code, msg = self._do_write(op)
            else:
                code, msg = self._do_read(op)
        except _Reject as rej:
            code, msg = rej.code, rej.msg
        except Exception as exc:  # never let the worker die
            code, msg = _S.ERR_BAD_STATE, f"stand-in internal error: {exc!r}"
        op.status.Update(code, msg)

    def _gather(self, region_id: int, segs) -> bytearray:
        total = sum(size for _, size in segs)
        out = bytearray(total)
        if total == 0:
            return out
        base = ctypes.addressof((ctypes.c_char * total).from_buffer(out))
        with self._lock:
            region = self._regions.get(region_id)
            _check_segments(region, segs, "source")
            pos = 0
            for off, size in segs:
                ctypes.memmove(base + pos, region.addr + off, size)
                pos += size
        return out

    def _scatter(self, region_id: int, segs, payload: bytearray) -> None:
        total = sum(size for _, size in segs)
        if total != len(payload):
            raise _Reject(_S.ERR_INVALID_ARGS, f"payload has {len(payload)} bytes, segments need {total}")
        if total == 0:
            with self._lock:
                _check_segments(self._regions.get(region_id), segs, "destination")
            return
        base = ctypes.addressof((ctypes.c_char * total).from_buffer(payload))
        with self._lock:
            region = self._regions.get(region_id)
            _check_segments(region, segs, "destination")
            pos = 0
            for off, size in segs:
                ctypes.memmove(region.addr + off, base + pos, size)
                pos += size

    def _do_write(self, op: _Op) -> Tuple[StatusCode, str]:
        payload = self._gather(op.local_id, op.local_segs)
        peer = self._same_process_peer(op.remote_key)
        if peer is not None:
            return peer.apply_write(self.key, op.uid, op.remote_id, op.remote_segs, payload)
        header = {"src": self.key, "uid": op.uid, "region": op.remote_id, "segs": op.remote_segs}
        code, msg, _ = self._rpc(op.remote_key, _OP_WRITE, header, payload)
        return code, msg

    def _do_read(self, op: _Op) -> Tuple[StatusCode, str]:
        peer = self._same_process_peer(op.remote_key)
        if peer is not None:
            code, msg, data = peer.serve_read(self.key, op.uid, op.remote_id, op.remote_segs)
        else:
            header = {"src": self.key, "uid": op.uid, "region": op.remote_id, "segs": op.remote_segs}
            code, msg, data = self._rpc(op.remote_key, _OP_READ, header, b"")
        if code is not _S.SUCCESS:
            return code, msg
        self._scatter(op.local_id, op.local_segs, data)
        return _S.SUCCESS, ""

    def _same_process_peer(self, key: str) -> Optional["_Runtime"]:
        if key == self.key:
            return self
        with self._lock:
            desc = self._remotes.get(key)
        if desc is None or desc.pid != self.pid:
            return None
        return _local_peer(key)

    def _rpc(self, remote_key: str, op: int, header: dict, payload) -> Tuple[StatusCode, str, bytearray]:
        with self._lock:
            desc = self._remotes.get(remote_key)
        if desc is None:
            return _S.ERR_NOT_FOUND, f"remote engine {remote_key!r} is not registered", bytearray()
        where = f"{desc.host}:{desc.port}"
        for attempt in (0, 1):
            with self._lock:
                sock = self._out.get(remote_key)
            fresh = sock is None
            if fresh:
                try:
                    sock = socket.create_connection((desc.host, desc.port), timeout=_CONNECT_TIMEOUT_S)
                    sock.settimeout(_IO_TIMEOUT_S)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError as exc:
                    detail = f"peer engine {remote_key!r} at {where} unreachable: {exc}"
                    if not self.stop.is_set():
                        self._record_failure(remote_key, detail)
                    return _S.ERR_RDMA_OP, detail, bytearray()
                with self._lock:
                    if self.stop.is_set():
                        sock.close()
                        return _S.ERR_BAD_STATE, f"engine {self.key!r} is shut down", bytearray()
                    self._out[remote_key] = sock
            try:
                _send_frame(sock, op, header, payload)
                head = _recv_frame_head(sock, None)
                if head is None or head[0] != _OP_REPLY:
                    raise ConnectionError("protocol error: expected a reply")
                _, reply, plen = head
                data = _recv_exact(sock, plen, None)
                return _S(reply["code"]), str(reply.get("msg", "")), data
            except (OSError, ValueError, KeyError) as exc:
                with self._lock:
                    self._out.pop(remote_key, None)
                try:
                    sock.close()
                except OSError:
                    pass
                if fresh or attempt == 1 or self.stop.is_set():
                    detail = f"transfer to peer engine {remote_key!r} at {where} failed: {exc!r}"
                    if not self.stop.is_set():
                        self._record_failure(remote_key, detail)
                    return _S.ERR_RDMA_OP, detail, bytearray()
                # A pooled connection went stale: retry once on a fresh one.
        raise AssertionError("unreachable")

    # -------------------------------------------------------------------- target

    def apply_write(self, src_key: str, uid: int, region_id: int, segs, payload: bytearray) -> Tuple[StatusCode, str]:
        """Target side of a write: bounds-check, copy in, record the inbound status."""
        if self.stop.is_set():
            return _S.ERR_RDMA_OP, f"target engine {self.key!r} is shut down"
        try:
            self._scatter(region_id, segs, payload)
            code, msg = _S.SUCCESS, ""
        except _Reject as rej:
            code, msg = rej.code, f"target engine {self.key!r}: {rej.msg}"
        self._record_inbound(src_key, uid, code, msg)
        return code, msg

    def serve_read(self, src_key: str, uid: int, region_id: int, segs) -> Tuple[StatusCode, str, bytearray]:
        """Target side of a read: bounds-check and copy out."""
        if self.stop.is_set():
            return _S.ERR_RDMA_OP, f"target engine {self.key!r} is shut down", bytearray()
        try:
            data = self._gather(region_id, segs)
            code, msg = _S.SUCCESS, ""
        except _Reject as rej:
            data, code, msg = bytearray(), rej.code, f"target engine {self.key!r}: {rej.msg}"
        self._record_inbound(src_key, uid, code, msg)
        return code, msg, data

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            conn.settimeout(_POLL_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True,
                                 name=f"mori-standin-conn[{self.key}]")
            with self._lock:
                if self.stop.is_set():
                    conn.close()
                    break
                self._conns[conn] = t
            t.start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            while not self.stop.is_set():
                head = _recv_frame_head(conn, self.stop, idle_ok=True)
                if head is None:
                    break
                op, header, plen = head
                segs = [(int(o), int(s)) for o, s in header["segs"]]
                src, uid, region_id = str(header["src"]), int(header["uid"]), int(header["region"])
                if op == _OP_WRITE:
                    with self._lock:
                        region = self._regions.get(region_id)
                    try:
                        _check_segments(region, segs, "destination")
                        if plen != sum(s for _, s in segs):
                            raise _Reject(_S.ERR_INVALID_ARGS, "payload length does not match the segments")
                    except _Reject as rej:
                        _drain(conn, plen, self.stop)
                        code, msg = rej.code, f"target engine {self.key!r}: {rej.msg}"
                        self._record_inbound(src, uid, code, msg)
                    else:
                        payload = _recv_exact(conn, plen, self.stop)
                        code, msg = self.apply_write(src, uid, region_id, segs, payload)
                    _send_frame(conn, _OP_REPLY, {"code": code.value, "msg": msg})
                elif op == _OP_READ:
                    _drain(conn, plen, self.stop)
                    code, msg, data = self.serve_read(src, uid, region_id, segs)
                    _send_frame(conn, _OP_REPLY, {"code": code.value, "msg": msg}, data)
                else:
                    break
        except (OSError, ValueError, KeyError, TypeError):
            pass  # peer went away or spoke nonsense: drop the connection
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            try:
                conn.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ shutdown

    def _fail_queued(self) -> None:
        while True:
            try:
                ops = self._jobs.get_nowait()
            except queue.Empty:
                return
            for op in ops or ():
                if op.status.InProgress() and op.fault != _faults.NEVER:
                    op.status.Update(_S.ERR_BAD_STATE, f"engine {self.key!r} shut down before the transfer ran")

    def shutdown(self) -> None:
        """Stop threads, close sockets, fail queued transfers (ERR_BAD_STATE).  Idempotent, bounded."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop.set()
        with _LIVE_LOCK:
            if _LIVE.get(self.key) is self:
                del _LIVE[self.key]
        try:
            self._listener.close()
        except OSError:
            pass
        self._jobs.put(None)
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            outs = list(self._out.values())
        for sock in outs:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        me = threading.current_thread()
        for t in [self._server, self._worker] + [t for _, t in conns]:
            if t is not me and t.is_alive():
                t.join(_JOIN_S)
        with self._lock:
            outs = list(self._out.values())
            self._out.clear()
        for sock in outs:
            try:
                sock.close()
            except OSError:
                pass
        self._fail_queued()

    @property
    def closed(self) -> bool:
        return self._closed


@atexit.register
def _shutdown_all() -> None:
    with _LIVE_LOCK:
        live = [rt for rt in _LIVE.values() if rt.pid == os.getpid()]
    for rt in live:
        rt.shutdown()


def _seq(name: str, value) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not hasattr(value, "__iter__"):
        raise TypeError(f"{name}: expected a sequence, got {type(value).__name__}")
    return list(value)


class IOEngineSession:
    """Mirrors ``mori.cpp.IOEngineSession``: transfers between one fixed pair of regions.

    Methods: ``AllocateTransferUniqueId() -> int``;
    ``Read/Write(local_offset, remote_offset, size, status, transfer_uid)``;
    ``BatchRead/BatchWrite(local_offsets, remote_offsets, sizes, status,
    transfer_uid)`` (one status for the whole batch); ``Alive() -> bool``.
    Offsets and sizes are in bytes.  Results arrive in ``status`` as for
    ``IOEngine``.  Obtained from ``IOEngine.CreateSession``; no public constructor.
    """

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError("mori.cpp.IOEngineSession: No constructor defined!")

    @classmethod
    def _make(cls, rt: _Runtime, local: MemoryDesc, remote: MemoryDesc) -> "IOEngineSession":
        self = object.__new__(cls)
        self._rt, self._local, self._remote = rt, local, remote
        return self

    def AllocateTransferUniqueId(self) -> int:
        return self._rt.allocate_uid()

    def Read(self, local_offset: int, remote_offset: int, size: int, status: TransferStatus, transfer_uid: int) -> None:
        self._rt.submit(_OP_READ, [self._local], [[local_offset]], [self._remote], [[remote_offset]],
                        [[size]], [status], [transfer_uid])

    def Write(self, local_offset: int, remote_offset: int, size: int, status: TransferStatus, transfer_uid: int) -> None:
        self._rt.submit(_OP_WRITE, [self._local], [[local_offset]], [self._remote], [[remote_offset]],
                        [[size]], [status], [transfer_uid])

    def BatchRead(self, local_offsets, remote_offsets, sizes, status: TransferStatus, transfer_uid: int) -> None:
        self._rt.submit(_OP_READ, [self._local], [_seq("local_offsets", local_offsets)], [self._remote],
                        [_seq("remote_offsets", remote_offsets)], [_seq("sizes", sizes)], [status], [transfer_uid])

    def BatchWrite(self, local_offsets, remote_offsets, sizes, status: TransferStatus, transfer_uid: int) -> None:
        self._rt.submit(_OP_WRITE, [self._local], [_seq("local_offsets", local_offsets)], [self._remote],
                        [_seq("remote_offsets", remote_offsets)], [_seq("sizes", sizes)], [status], [transfer_uid])

    def Alive(self) -> bool:
        return not self._rt.stop.is_set()


class IOEngine:
    """Mirrors ``mori.cpp.IOEngine(key: str, config: IOEngineConfig)`` (CamelCase binding).

    Construction binds the data-plane socket and starts the engine's daemon
    threads; destroying the object (or interpreter exit) stops them, as the
    real C++ destructor does.  Methods, in the wheel's argument order:

    * ``GetEngineDesc() -> EngineDesc``
    * ``CreateBackend(type, config)``, ``RemoveBackend(type)``
    * ``RegisterRemoteEngine(desc)``, ``DeregisterRemoteEngine(desc)``
    * ``RegisterMemory(data, size, device_id, loc) -> MemoryDesc`` (``data``: a
      PyCapsule holding the address, or an int address; ``size`` in bytes)
    * ``DeregisterMemory(desc)``, ``AllocateTransferUniqueId() -> int``
    * ``Read/Write(local_desc, local_offset, remote_desc, remote_offset, size,
      status, transfer_uid)``
    * ``BatchRead/BatchWrite(local_descs, local_offsets, remote_descs,
      remote_offsets, sizes, statuses, transfer_uids)`` -- lists with one entry
      per transfer; offsets/sizes are lists of byte counts per transfer
    * ``CreateSession(local_desc, remote_desc) -> IOEngineSession | None``
    * ``PopPeerFailure() -> PeerFailureEvent | None``
    * ``PopInboundTransferStatus(remote_key, transfer_uid, status) -> bool``
    * ``WaitAll(statuses, timeout_ms=-1) -> StatusCode``

    Errors: wrong argument types raise TypeError; a bad registration raises
    RuntimeError; transfer problems never raise but fail the status.
    """

    def __init__(self, key: str, config: IOEngineConfig) -> None:
        _expect("key", key, str)
        _expect("config", config, IOEngineConfig)
        self._rt = _Runtime(key, config)

    def __del__(self) -> None:
        rt = getattr(self, "_rt", None)
        if rt is not None:
            try:
                rt.shutdown()
            except Exception:
                pass

    def GetEngineDesc(self) -> EngineDesc:
        return self._rt.desc()

    def CreateBackend(self, type: BackendType, config: BackendConfig) -> None:
        self._rt.create_backend(type, config)

    def RemoveBackend(self, type: BackendType) -> None:
        self._rt.remove_backend(type)

    def RegisterRemoteEngine(self, engine_desc: EngineDesc) -> None:
        self._rt.register_remote(engine_desc)

    def DeregisterRemoteEngine(self, engine_desc: EngineDesc) -> None:
        self._rt.deregister_remote(engine_desc)

    def RegisterMemory(self, data, size: int, device_id: int, loc: MemoryLocationType) -> MemoryDesc:
        return self._rt.register_memory(data, size, device_id, loc)

    def DeregisterMemory(self, mem_desc: MemoryDesc) -> None:
        self._rt.deregister_memory(mem_desc)

    def AllocateTransferUniqueId(self) -> int:
        return self._rt.allocate_uid()

    def Read(self, local_desc, local_offset, remote_desc, remote_offset, size, status, transfer_uid) -> None:
        self._rt.submit(_OP_READ, [local_desc], [[local_offset]], [remote_desc], [[remote_offset]],
                        [[size]], [status], [transfer_uid])

    def Write(self, local_desc, local_offset, remote_desc, remote_offset, size, status, transfer_uid) -> None:
        self._rt.submit(_OP_WRITE, [local_desc], [[local_offset]], [remote_desc], [[remote_offset]],
                        [[size]], [status], [transfer_uid])

    def _batch(self, kind, local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, uids):
        self._rt.submit(
            kind, _seq("local_descs", local_descs),
            [_seq("local_offsets[i]", r) for r in _seq("local_offsets", local_offsets)],
            _seq("remote_descs", remote_descs),
            [_seq("remote_offsets[i]", r) for r in _seq("remote_offsets", remote_offsets)],
            [_seq("sizes[i]", r) for r in _seq("sizes", sizes)],
            _seq("statuses", statuses), _seq("transfer_uids", uids),
        )

    def BatchRead(self, local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, transfer_uids) -> None:
        self._batch(_OP_READ, local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, transfer_uids)

    def BatchWrite(self, local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, transfer_uids) -> None:
        self._batch(_OP_WRITE, local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, transfer_uids)

    def CreateSession(self, local_desc: MemoryDesc, remote_desc: MemoryDesc) -> Optional[IOEngineSession]:
        _expect("local_desc", local_desc, MemoryDesc)
        _expect("remote_desc", remote_desc, MemoryDesc)
        rt = self._rt
        with rt._lock:
            local_ok = local_desc.engine_key == rt.key and local_desc.id in rt._regions
            remote_ok = remote_desc.engine_key == rt.key or remote_desc.engine_key in rt._remotes
        if not (local_ok and remote_ok) or rt.stop.is_set():
            return None
        return IOEngineSession._make(rt, local_desc, remote_desc)

    def PopPeerFailure(self) -> Optional[PeerFailureEvent]:
        return self._rt.pop_failure()

    def PopInboundTransferStatus(self, remote_key: str, transfer_uid: int, status: TransferStatus) -> bool:
        return self._rt.pop_inbound(remote_key, transfer_uid, status)

    def WaitAll(self, statuses, timeout_ms: int = -1) -> StatusCode:
        """Wait until no status is IN_PROGRESS or ``timeout_ms`` ms pass (-1: the stand-in cap).

        Returns the code of the first failed status if any failed, else
        IN_PROGRESS if one is still running, else SUCCESS.
        """
        return wait_statuses(_seq("statuses", statuses), timeout_ms)

    def standin_close(self) -> None:
        """STAND-IN ONLY (the real engine stops in its destructor): stop now.

        Closes the sockets, joins the threads (bounded) and fails transfers
        still queued with ERR_BAD_STATE.  Idempotent; later transfers fail
        with ERR_BAD_STATE.
        """
        self._rt.shutdown()

    @property
    def standin_closed(self) -> bool:
        """STAND-IN ONLY: whether ``standin_close`` (or destruction) has run."""
        return self._rt.closed
