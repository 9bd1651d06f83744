"""Value types of ``mori.cpp`` (amd-mori 1.2.4 ``libmori_pybinds``), stand-in versions.

Every enum below carries the member names *and integer values* that the real
wheel registers in ``mori::RegisterMoriIo`` (read from the compiled binding).
Enums behave like pybind11 ``py::enum_`` types: ``.name``, ``.value``,
``int(member)``, and they never compare equal to plain ints.
"""

from __future__ import annotations

import enum
import json
import operator
import threading
import time
from typing import Optional

# Longest time (ms) any wait without its own bound may block: ``Wait()``,
# ``WaitFor(-1)`` and ``WaitAll(..., -1)``.  STAND-IN ONLY: the real engine can
# wait forever; the stand-in never does.  After the cap the status is returned
# as it is (possibly still IN_PROGRESS).
STANDIN_MAX_WAIT_MS = 60_000


class _BoundEnum(enum.Enum):
    """Enum with pybind11 ``py::enum_`` behaviour (``int()``, ``index()``, no int equality)."""

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value


class BackendType(_BoundEnum):
    """Mirrors ``mori.cpp.BackendType`` (1.2.4): Unknown=0, XGMI=1, RDMA=2, TCP=3, FABRIC=4.

    The stand-in moves bytes over one TCP data plane whatever backend is chosen.
    """

    Unknown = 0
    XGMI = 1
    RDMA = 2
    TCP = 3
    FABRIC = 4


class MemoryLocationType(_BoundEnum):
    """Mirrors ``mori.cpp.MemoryLocationType``: Unknown=0, CPU=1, GPU=2.

    The stand-in treats every registered address as host memory, whatever the
    location says (on a CPU machine "GPU" buffers are host buffers).
    """

    Unknown = 0
    CPU = 1
    GPU = 2


class StatusCode(_BoundEnum):
    """Mirrors ``mori.cpp.StatusCode``.

    SUCCESS=0, INIT=1, IN_PROGRESS=2; errors start above 10:
    ERR_INVALID_ARGS=11, ERR_NOT_FOUND=12, ERR_RDMA_OP=13, ERR_BAD_STATE=14,
    ERR_GPU_OP=15.  ``TransferStatus.Failed()`` is true for any error code.
    """

    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_RDMA_OP = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15


_ERR_BEGIN = 10  # every code above this is a failure


class PollCqMode(_BoundEnum):
    """Mirrors ``mori.cpp.PollCqMode``: POLLING=0, EVENT=1 (accepted, no effect in the stand-in)."""

    POLLING = 0
    EVENT = 1


class PeerFailureReason(_BoundEnum):
    """Mirrors ``mori.cpp.PeerFailureReason`` (1.2.4 member set and values).

    The stand-in only raises PEER_UNREACHABLE (TCP connect/send/receive to the
    peer engine failed); the LOCAL_* reasons describe RDMA hardware events.
    """

    UNKNOWN = 0
    PEER_UNREACHABLE = 1
    LOCAL_QP_ERROR = 2
    LOCAL_PORT_DOWN = 3
    LOCAL_DEVICE_FATAL = 4
    LOCAL_CQ_ERROR = 5


# Names that ``py::enum_(...).export_values()`` puts at module level in the real
# ``mori.cpp`` (BackendType, MemoryLocationType, StatusCode, PeerFailureReason;
# PollCqMode is not exported).  Later registrations win on clashes, as in pybind.
EXPORTED_ENUMS = (BackendType, MemoryLocationType, StatusCode, PeerFailureReason)


def _as_int(name: str, value) -> int:
    if isinstance(value, _BoundEnum):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None


def _expect(name: str, value, cls):
    if not isinstance(value, cls):
        raise TypeError(f"{name}: expected {cls.__name__}, got {type(value).__name__}")
    return value


def set_log_level(level: str) -> None:
    """Mirrors ``mori.cpp.set_log_level(level: str)``; the stand-in only records it."""
    global _log_level
    _log_level = _expect("level", level, str)


_log_level = "info"


# --------------------------------------------------------------------------- configs


class BackendConfig:
    """Mirrors ``mori.cpp.BackendConfig`` (abstract base of the backend configs)."""


class RdmaBackendConfig(BackendConfig):
    """Mirrors ``mori.cpp.RdmaBackendConfig``.

    Constructor, in the wheel's order and with its defaults: ``qp_per_transfer=1,
    post_batch_size=-1, num_worker_threads=-1, poll_cq_mode=PollCqMode.POLLING,
    enable_notification=True, notif_per_qp=1024, enable_transfer_chunking=False,
    chunk_bytes=65536, max_chunks_per_transfer=64, num_nics_per_transfer=1``.
    Read-write attributes: those plus ``max_send_wr``, ``max_cqe_num``,
    ``max_msg_sge`` (defaults not visible in the wheel; the stand-in uses 0).
    All values are accepted and stored; none changes stand-in behaviour.
    """

    def __init__(
        self,
        qp_per_transfer: int = 1,
        post_batch_size: int = -1,
        num_worker_threads: int = -1,
        poll_cq_mode: PollCqMode = PollCqMode.POLLING,
        enable_notification: bool = True,
        notif_per_qp: int = 1024,
        enable_transfer_chunking: bool = False,
        chunk_bytes: int = 65536,
        max_chunks_per_transfer: int = 64,
        num_nics_per_transfer: int = 1,
    ) -> None:
        self.qp_per_transfer = _as_int("qp_per_transfer", qp_per_transfer)
        self.post_batch_size = _as_int("post_batch_size", post_batch_size)
        self.num_worker_threads = _as_int("num_worker_threads", num_worker_threads)
        self.poll_cq_mode = _expect("poll_cq_mode", poll_cq_mode, PollCqMode)
        self.enable_notification = bool(enable_notification)
        self.notif_per_qp = _as_int("notif_per_qp", notif_per_qp)
        self.enable_transfer_chunking = bool(enable_transfer_chunking)
        self.chunk_bytes = _as_int("chunk_bytes", chunk_bytes)
        self.max_chunks_per_transfer = _as_int("max_chunks_per_transfer", max_chunks_per_transfer)
        self.num_nics_per_transfer = _as_int("num_nics_per_transfer", num_nics_per_transfer)
        self.max_send_wr = 0
        self.max_cqe_num = 0
        self.max_msg_sge = 0


class XgmiBackendConfig(BackendConfig):
    """Mirrors ``mori.cpp.XgmiBackendConfig(num_streams=64, num_events=64)``; stored only."""

    def __init__(self, num_streams: int = 64, num_events: int = 64) -> None:
        self.num_streams = _as_int("num_streams", num_streams)
        self.num_events = _as_int("num_events", num_events)


class FabricBackendConfig(BackendConfig):
    """Mirrors ``mori.cpp.FabricBackendConfig`` (read-write ``num_streams``, ``num_events``).

    The wheel's constructor arguments are not visible; the stand-in takes the
    XGMI defaults (64, 64).  Stored only.
    """

    def __init__(self, num_streams: int = 64, num_events: int = 64) -> None:
        self.num_streams = _as_int("num_streams", num_streams)
        self.num_events = _as_int("num_events", num_events)


def fabric_alloc(size: int, device: int) -> int:
    """Mirrors ``mori.cpp.fabric_alloc(size, device) -> int``; unavailable in the stand-in.

    Raises:
        RuntimeError: always (no GPU fabric memory on a stand-in machine).
    """
    raise RuntimeError("fabric_alloc: FABRIC memory is not available in the pdconform mori stand-in")


def fabric_free(ptr: int) -> None:
    """Mirrors ``mori.cpp.fabric_free(ptr)``; unavailable in the stand-in.

    Raises:
        RuntimeError: always.
    """
    raise RuntimeError("fabric_free: FABRIC memory is not available in the pdconform mori stand-in")


class IOEngineConfig:
    """Mirrors ``mori.cpp.IOEngineConfig(host: str = "", port: int = 0)``.

    ``host`` is the address the engine's data plane binds and advertises (empty:
    127.0.0.1 in the stand-in); ``port`` 0 binds an ephemeral port, whose real
    value ``get_engine_desc().port`` reports.
    """

    def __init__(self, host: str = "", port: int = 0) -> None:
        self.host = _expect("host", host, str)
        port = _as_int("port", port)
        if not 0 <= port <= 0xFFFF:
            raise TypeError(f"port: {port} does not fit uint16")
        self.port = port


# ----------------------------------------------------------------- descriptors

_PACK_MAGIC = b"pdconform-mori-standin/1\n"


def _pack(kind: str, fields: dict) -> bytes:
    return _PACK_MAGIC + json.dumps({"kind": kind, **fields}, sort_keys=True).encode()


def _unpack(kind: str, blob) -> dict:
    if not isinstance(blob, bytes):
        raise TypeError(f"{kind}.unpack: expected bytes, got {type(blob).__name__}")
    if not blob.startswith(_PACK_MAGIC):
        raise RuntimeError(f"{kind}.unpack: not a packed pdconform-stand-in {kind}")
    try:
        fields = json.loads(blob[len(_PACK_MAGIC):])
    except ValueError as exc:
        raise RuntimeError(f"{kind}.unpack: malformed blob: {exc}") from None
    if not isinstance(fields, dict) or fields.pop("kind", None) != kind:
        raise RuntimeError(f"{kind}.unpack: blob holds another kind of descriptor")
    return fields


class EngineDesc:
    """Mirrors ``mori.cpp.EngineDesc``: how to reach an IOEngine.

    Read-only attributes ``key`` (str), ``node_id`` (str), ``hostname`` (str),
    ``host`` (str), ``port`` (int, > 0 for a live engine), ``pid`` (int);
    ``==``; ``pack() -> bytes`` and ``EngineDesc.unpack(bytes)``.  Like the
    real class it has no public constructor (get one from
    ``IOEngine.get_engine_desc()`` or ``unpack``).  The packed bytes are a
    stand-in format, not the real msgpack layout.

    Raises (``unpack``): TypeError for non-bytes, RuntimeError for a blob that is
    not a packed stand-in EngineDesc.
    """

    __slots__ = ("_key", "_node_id", "_hostname", "_host", "_port", "_pid")
    __hash__ = None  # type: ignore[assignment]  # pybind: __eq__ without __hash__

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError("mori.cpp.EngineDesc: No constructor defined!")

    @classmethod
    def _make(cls, key: str, node_id: str, hostname: str, host: str, port: int, pid: int) -> "EngineDesc":
        self = object.__new__(cls)
        self._key, self._node_id, self._hostname = str(key), str(node_id), str(hostname)
        self._host, self._port, self._pid = str(host), int(port), int(pid)
        return self

    key = property(lambda self: self._key)
    node_id = property(lambda self: self._node_id)
    hostname = property(lambda self: self._hostname)
    host = property(lambda self: self._host)
    port = property(lambda self: self._port)
    pid = property(lambda self: self._pid)

    def _fields(self) -> dict:
        return {s[1:]: getattr(self, s) for s in self.__slots__}

    def __eq__(self, other) -> bool:
        return isinstance(other, EngineDesc) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return f"<EngineDesc key={self._key!r} host={self._host!r} port={self._port} pid={self._pid}>"

    def pack(self) -> bytes:
        """Serialize to bytes (stand-in format) for the peer's ``EngineDesc.unpack``."""
        return _pack("EngineDesc", self._fields())

    @staticmethod
    def unpack(blob: bytes) -> "EngineDesc":
        """Rebuild an EngineDesc from ``pack()`` output."""
        f = _unpack("EngineDesc", blob)
        try:
            return EngineDesc._make(f["key"], f["node_id"], f["hostname"], f["host"], f["port"], f["pid"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RuntimeError(f"EngineDesc.unpack: malformed blob: {exc!r}") from None


class MemoryDesc:
    """Mirrors ``mori.cpp.MemoryDesc``: one region registered with an IOEngine.

    Read-only attributes: ``engine_key`` (owning engine), ``id`` (region id,
    unique within that engine), ``device_id``, ``device_bus_id`` (str, "" in the
    stand-in), ``numa_node`` (-1), ``data`` (base address), ``size`` (bytes),
    ``loc`` (MemoryLocationType), ``ipc_handle`` (bytes, empty).  ``==``;
    ``pack() -> bytes`` / ``MemoryDesc.unpack(bytes)``.  ``MemoryDesc()``
    builds an empty descriptor (as the real default constructor does); the
    engine only accepts descriptors it issued (``register_memory``).

    Raises (``unpack``): TypeError for non-bytes, RuntimeError for a bad blob.
    """

    __slots__ = ("_engine_key", "_id", "_device_id", "_device_bus_id", "_numa_node",
                 "_data", "_size", "_loc", "_ipc_handle")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self) -> None:
        self._engine_key, self._id, self._device_id = "", 0, -1
        self._device_bus_id, self._numa_node = "", -1
        self._data, self._size = 0, 0
        self._loc, self._ipc_handle = MemoryLocationType.Unknown, b""

    @classmethod
    def _make(cls, engine_key: str, id: int, device_id: int, data: int, size: int,
              loc: MemoryLocationType, device_bus_id: str = "", numa_node: int = -1,
              ipc_handle: bytes = b"") -> "MemoryDesc":
        self = cls()
        self._engine_key, self._id, self._device_id = str(engine_key), int(id), int(device_id)
        self._data, self._size, self._loc = int(data), int(size), MemoryLocationType(loc)
        self._device_bus_id, self._numa_node, self._ipc_handle = str(device_bus_id), int(numa_node), bytes(ipc_handle)
        return self

    engine_key = property(lambda self: self._engine_key)
    id = property(lambda self: self._id)
    device_id = property(lambda self: self._device_id)
    device_bus_id = property(lambda self: self._device_bus_id)
    numa_node = property(lambda self: self._numa_node)
    data = property(lambda self: self._data)
    size = property(lambda self: self._size)
    loc = property(lambda self: self._loc)
    ipc_handle = property(lambda self: self._ipc_handle)

    def _fields(self) -> dict:
        return {
            "engine_key": self._engine_key, "id": self._id, "device_id": self._device_id,
            "device_bus_id": self._device_bus_id, "numa_node": self._numa_node,
            "data": self._data, "size": self._size, "loc": self._loc.value,
            "ipc_handle": self._ipc_handle.hex(),
        }

    def __eq__(self, other) -> bool:
        return isinstance(other, MemoryDesc) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return (f"<MemoryDesc engine_key={self._engine_key!r} id={self._id} "
                f"data=0x{self._data:x} size={self._size} loc={self._loc.name}>")

    def pack(self) -> bytes:
        """Serialize to bytes (stand-in format) for the peer's ``MemoryDesc.unpack``."""
        return _pack("MemoryDesc", self._fields())

    @staticmethod
    def unpack(blob: bytes) -> "MemoryDesc":
        """Rebuild a MemoryDesc from ``pack()`` output."""
        f = _unpack("MemoryDesc", blob)
        try:
            return MemoryDesc._make(
                f["engine_key"], f["id"], f["device_id"], f["data"], f["size"],
                MemoryLocationType(f["loc"]), f["device_bus_id"], f["numa_node"],
                bytes.fromhex(f["ipc_handle"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RuntimeError(f"MemoryDesc.unpack: malformed blob: {exc!r}") from None


# ------------------------------------------------------------------ statuses


class TransferStatus:
    """Mirrors ``mori.cpp.TransferStatus``: the fate of one transfer (one uid).

    Methods (CamelCase, as in the wheel): ``Code() -> StatusCode``,
    ``Message() -> str``, ``Update(code, message)``, ``Init()``,
    ``InProgress()``, ``Succeeded()``, ``Failed()`` (all ``-> bool``),
    ``SetCode(code)``, ``SetMessage(message)``, ``Wait() -> None`` (blocks while
    IN_PROGRESS) and ``WaitFor(timeout_ms=-1) -> StatusCode`` (blocks at most
    ``timeout_ms`` milliseconds, then returns the current code).

    A new status is INIT.  The engine sets IN_PROGRESS when it accepts a
    transfer and a terminal code (SUCCESS or ERR_*) when it ends, from its
    background thread.  Stand-in bound: ``Wait()`` and negative timeouts block
    at most ``STANDIN_MAX_WAIT_MS``.  Thread-safe.
    """

    __slots__ = ("_lock", "_done", "_code", "_msg", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()  # set while the code is not IN_PROGRESS
        self._done.set()
        self._code = StatusCode.INIT
        self._msg = ""

    def __repr__(self) -> str:
        return f"<TransferStatus {self._code.name} {self._msg!r}>"

    def Code(self) -> StatusCode:
        return self._code

    def Message(self) -> str:
        return self._msg

    def _set(self, code: StatusCode, message: Optional[str]) -> None:
        with self._lock:
            self._code = code
            if message is not None:
                self._msg = message
            if code is StatusCode.IN_PROGRESS:
                self._done.clear()
            else:
                self._done.set()

    def Update(self, code: StatusCode, message: str) -> None:
        self._set(_expect("code", code, StatusCode), _expect("message", message, str))

    def Init(self) -> bool:
        return self._code is StatusCode.INIT

    def InProgress(self) -> bool:
        return self._code is StatusCode.IN_PROGRESS

    def Succeeded(self) -> bool:
        return self._code is StatusCode.SUCCESS

    def Failed(self) -> bool:
        return self._code.value > _ERR_BEGIN

    def SetCode(self, code: StatusCode) -> None:
        self._set(_expect("code", code, StatusCode), None)

    def SetMessage(self, message: str) -> None:
        with self._lock:
            self._msg = _expect("message", message, str)

    def _wait_s(self, timeout_s: float) -> bool:
        return self._done.wait(max(0.0, timeout_s))

    def Wait(self) -> None:
        self._wait_s(STANDIN_MAX_WAIT_MS / 1000.0)

    def WaitFor(self, timeout_ms: int = -1) -> StatusCode:
        timeout_ms = _as_int("timeout_ms", timeout_ms)
        if timeout_ms < 0:
            timeout_ms = STANDIN_MAX_WAIT_MS
        self._wait_s(timeout_ms / 1000.0)
        return self._code


def wait_statuses(statuses, timeout_ms: int) -> StatusCode:
    """Shared body of ``WaitAll``: see ``IOEngine.WaitAll``."""
    timeout_ms = _as_int("timeout_ms", timeout_ms)
    statuses = list(statuses)
    for st in statuses:
        _expect("statuses[i]", st, TransferStatus)
    if timeout_ms < 0:
        timeout_ms = STANDIN_MAX_WAIT_MS
    deadline = time.monotonic() + timeout_ms / 1000.0
    for st in statuses:
        st._wait_s(deadline - time.monotonic())
    for st in statuses:
        if st.Failed():
            return st.Code()
    if any(st.InProgress() for st in statuses):
        return StatusCode.IN_PROGRESS
    return StatusCode.SUCCESS


class PeerFailureEvent:
    """Mirrors ``mori.cpp.PeerFailureEvent`` (returned by ``pop_peer_failure``).

    Read-only attributes: ``remote_engine_key`` (str), ``reason``
    (PeerFailureReason), ``qp_num`` (int, 0 in the stand-in), ``port_num``
    (int, 0), ``device_name`` (str, "tcp" in the stand-in), ``detail`` (str).
    """

    __slots__ = ("_remote_engine_key", "_reason", "_qp_num", "_port_num", "_device_name", "_detail")

    def __init__(self) -> None:
        self._remote_engine_key, self._reason = "", PeerFailureReason.UNKNOWN
        self._qp_num, self._port_num, self._device_name, self._detail = 0, 0, "", ""

    @classmethod
    def _make(cls, remote_engine_key: str, reason: PeerFailureReason, detail: str) -> "PeerFailureEvent":
        self = cls()
        self._remote_engine_key, self._reason = remote_engine_key, reason
        self._device_name, self._detail = "tcp", detail
        return self

    remote_engine_key = property(lambda self: self._remote_engine_key)
    reason = property(lambda self: self._reason)
    qp_num = property(lambda self: self._qp_num)
    port_num = property(lambda self: self._port_num)
    device_name = property(lambda self: self._device_name)
    detail = property(lambda self: self._detail)

    def __repr__(self) -> str:
        return f"<PeerFailureEvent {self._remote_engine_key!r} {self._reason.name}: {self._detail}>"
