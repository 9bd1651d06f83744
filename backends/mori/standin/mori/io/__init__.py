"""Stand-in for ``mori.io`` (amd-mori 1.2.4): the IO engine API sglang's mori backend uses.

Re-exports, as the real ``mori/io/__init__.py`` does, the wrapper classes of
``engine.py`` and the ``mori.cpp`` types (IOEngineConfig, StatusCode,
BackendType, EngineDesc, MemoryDesc, MemoryLocationType, PeerFailureEvent,
PeerFailureReason, PollCqMode, RdmaBackendConfig, XgmiBackendConfig,
FabricBackendConfig, fabric_alloc, fabric_free, set_log_level).  The real
module's GPU fabric allocator helpers (fabric_torch_allocator, ...) are absent.

STAND-IN ONLY additions: ``StandinFaults``, ``set_standin_faults``,
``get_standin_faults``, ``standin_fault_log`` (fault injection, see ``mori.cpp._faults``).
"""

from .engine import *  # noqa: F401,F403  (IOEngine, IOEngineSession, TORCH_DEVICE_TYPE_MAP)
from .engine import IOEngine, IOEngineSession  # noqa: F401
from mori.cpp import (  # noqa: F401
    IOEngineConfig,
    StatusCode,
    BackendType,
    EngineDesc,
    MemoryDesc,
    MemoryLocationType,
    PeerFailureEvent,
    PeerFailureReason,
    PollCqMode,
    RdmaBackendConfig,
    XgmiBackendConfig,
    FabricBackendConfig,
    fabric_alloc,
    fabric_free,
    set_log_level,
)

# ---- STAND-IN ONLY: not part of amd-mori -----------------------------------
from mori.cpp._faults import StandinFaults, get_standin_faults, set_standin_faults, standin_fault_log  # noqa: F401
