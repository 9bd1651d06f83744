"""A trivial in-memory implementation for the harness's own tests (not a backend).

It imports no sglang and no engine, so tests of role processes, deadlines and
cleanup run in a second instead of twenty.  Only visible when
``PDCONFORM_TEST_SCENARIOS=1``.  Room ids with a meaning of their own:
``HANG_ROOM`` makes ``open_sender`` block forever, ``DIE_ROOM`` makes the role
process exit in the middle of ``open_sender``, ``LEAK_ROOM`` leaves a non-daemon
thread running and module state changed, ``CRASH_ROOM`` crashes the process natively
(SIGSEGV from C), ``ESCAPE_ROOM`` starts a process in a new session that outlives its
parent (``sleep 3017``), ``HOSTILE_ROOM`` raises an exception whose message is
:data:`HOSTILE_TEXT` (every kind of text a report must not pass on raw).  ``observe`` reports the live threads and the module state, so a
test can see that nothing of an earlier cell reached a later one.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

from harness.role.adapter import RoleAdapter
from harness.role.recorder import RoleRecorder
from harness.spec.protocol import KVPoll
from harness.target.role_context import bind_address

HANG_ROOM = 1001
DIE_ROOM = 1002
LEAK_ROOM = 1003
CRASH_ROOM = 1004
ESCAPE_ROOM = 1006
HOSTILE_ROOM = 1007
#: a message no output may pass on as it is: a lone surrogate (text decoded with surrogateescape),
#: a right-to-left override, a newline and a line that forges a report's heading, a list item and a
#: progress line, markup, a mention, an image, terminal escapes (colour, the window title)
HOSTILE_TEXT = ("boom \udcff\u202eevil\u202c</details>\n## pdconform: every cell as expected\n- 1 cells: all as "
                "expected\n[1/1] selftest-noop x selftest: PASS\n> quoted\n1. item <b>x</b> @sgl-project/maintainers "
                "![pwn](https://evil.example/x.png) \x1b[31mRED\x1b]0;title\x07 | cell |")
ESCAPEE_SECONDS = "3017"  # `sleep 3017`: the process ESCAPE_ROOM leaves behind, findable by its command line
LEAKED: list[str] = []  # module state a leaking cell changes


class SelftestRole(RoleAdapter):
    impl = "selftest"

    def __init__(self, role: str, recorder: RoleRecorder):
        self.role = role
        self.recorder = recorder
        self.status: dict[int, int] = {}

    def engine(self) -> str:
        return "reference"

    def start_prefill(self, layout: dict, bootstrap_port: int, pp: tuple[int, int, str] = (1, 0, ""),
                      attn_tp: tuple[int, int] = (1, 0), dp: tuple[int, int] = (1, 0)) -> dict:
        return {"mode": "prefill", "bootstrap_addr": f"{bind_address()}:{bootstrap_port}", "engine": self.engine()}

    def start_decode(self, layout: dict, bootstrap_port: int, attn_tp: tuple[int, int] = (1, 0),
                     dp: tuple[int, int] = (1, 0)) -> dict:
        return {"mode": "decode", "engine": self.engine()}

    def teardown(self) -> None:
        pass

    def open_sender(self, room: int, bootstrap_addr: str, destinations: int = 1) -> None:
        if room == HANG_ROOM:
            time.sleep(3600)
        if room == DIE_ROOM:
            os._exit(9)
        if room == LEAK_ROOM:
            threading.Thread(target=time.sleep, args=(3600,), name="pdconform-leaked-thread").start()
            LEAKED.append(f"room {room} in pid {os.getpid()}")
        if room == CRASH_ROOM:
            ctypes.string_at(0)  # reads address 0: SIGSEGV in C, no Python exception
        if room == HOSTILE_ROOM:
            raise RuntimeError(HOSTILE_TEXT)
        if room == ESCAPE_ROOM:  # a daemon in a session of its own: it leaves the cell's process group
            child = os.fork()
            if child == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execvp("sleep", ["sleep", ESCAPEE_SECONDS])
                os._exit(0)
            os.waitpid(child, 0)
        self.status[room] = KVPoll.WaitingForInput

    def init_sender(self, room: int, num_pages: int, aux_slot: int) -> None:
        pass

    def send_chunk(self, room: int, pages: list[int]) -> None:
        self.status[room] = KVPoll.Success

    def open_receiver(self, room: int, bootstrap_addr: str, timeout_s: float) -> None:
        self.status[room] = KVPoll.WaitingForInput

    def request_kv(self, room: int, pages: list[int], aux_slot: int) -> None:
        self.status[room] = KVPoll.Success

    def verify(self, kv_moves: list, aux_moves: list, unchecked_kv: list = (), unchecked_aux: list = (),
               sent_layers: list | None = None) -> dict:
        return {"ok": True, "bytes_verified": 0, "bytes_untouched_checked": 0, "mismatch_pages": 0, "mismatches": []}

    def poll(self, room: int) -> int:
        return self.status[room]

    def failure_reason(self, room: int) -> str | None:
        return None

    def clear(self, room: int) -> None:
        self.status.pop(room, None)

    def abort(self, room: int) -> None:
        pass

    def observe(self, rooms: list[int] = (), residue: bool = True) -> dict:
        observation = self.recorder.observation(self.role, [])
        observation["threads"] = sorted(t.name for t in threading.enumerate())
        observation["leaked"] = list(LEAKED)
        return observation
