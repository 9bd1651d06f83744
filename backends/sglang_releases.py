"""The sglang releases the Common-protocol adapters support (backends/sglang_common.py).

Mooncake, NIXL and Mori subclass the same sglang Common classes, so they share one
declared range; it is read by the registry (their ``Implementation.sglang_range``)
without importing sglang or an engine.  A version counts as its release
(harness.target.version.release_of): a checkout of main at ``0.5.24.dev12+g0a1b2c3``, a
``0.5.23.post1`` or a local ``0.5.23+cpu`` build is in ``>= 0.5.22``, never out for its suffix.
"""

from harness.target.version import SglangRange

SGLANG_COMMON_RANGE = SglangRange(
    spans=(((0, 5, 17), (0, 5, 18)), ((0, 5, 22), None)),
    why="0.5.17 - 0.5.18: Common protocol before AbortNotification (matrix run on 0.5.17, three scenarios on 0.5.18); "
        ">= 0.5.22: AbortNotification, handle_abort_ack_message, SpawnRanks (run on 0.5.23); "
        "0.5.19 - 0.5.21 have neither shape",
)

#: what every Common-based backend's roles import, preloaded once by the fork server
COMMON_PRELOAD = ("torch", "zmq", "sglang.srt.disaggregation.common.conn")
