"""Stand-in for ``mori.cpp`` (amd-mori 1.2.4), the pybind11 module ``libmori_pybinds``.

Only the IO part is provided (the names ``mori.cpp`` registers in
``RegisterMoriIo``); the real module's ops/shmem/ccl/umbp bindings are absent.
Names, argument order, enum members and enum values follow the 1.2.4 wheel.
As in the wheel, the members of BackendType, MemoryLocationType, StatusCode and
PeerFailureReason are also module attributes (``py::enum_::export_values``).
"""

from ._engine import IOEngine, IOEngineSession
from ._types import (
    STANDIN_MAX_WAIT_MS,
    BackendConfig,
    BackendType,
    EngineDesc,
    FabricBackendConfig,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    PeerFailureEvent,
    PeerFailureReason,
    PollCqMode,
    RdmaBackendConfig,
    StatusCode,
    TransferStatus,
    XgmiBackendConfig,
    fabric_alloc,
    fabric_free,
    set_log_level,
)
from ._types import EXPORTED_ENUMS as _EXPORTED_ENUMS

for _enum in _EXPORTED_ENUMS:
    for _member in _enum:
        globals()[_member.name] = _member
del _enum, _member
