"""The adapters' branches for sglang 0.5.17 - 0.5.18, on stand-ins shaped like that
release's classes (the default environment has sglang 0.5.23, so none of these
needs the older release installed).  Each branch is chosen by a capability of the
imported classes; these tests give the older shape and check the adapter takes it
as that release's schedulers would."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from backends.sglang_common import SglangCommonRole
from backends.sglang_hooks import ReceiveTap
from harness.role.adapter import Unsupported

ROOT = Path(__file__).resolve().parents[1]


class _Role(SglangCommonRole):
    impl = "stand-in"

    def engine(self) -> str:
        return "real"


def _role(**attrs) -> SglangCommonRole:
    """A Common-backend role without its constructor (which imports sglang)."""
    role = object.__new__(_Role)
    role.senders, role.receivers, role.rooms_seen, role.tp_rank, role.pp_rank = {}, {}, [], 0, 0
    role.missing_points, role.POINTS = {}, {}
    for name, value in attrs.items():
        setattr(role, name, value)
    return role


class _Receiver:
    """Records the release calls a scheduler makes on a Failed receiver."""

    def __init__(self):
        self.calls = []

    def poll(self):
        return 0  # KVPoll.Failed

    def failure_exception(self):
        self.calls.append("failure_exception")
        raise RuntimeError("the recorded reason")

    def clear(self):
        self.calls.append("clear")


class _OldManager:
    """0.5.17's manager shape: no deferred release."""


class _NewManager:
    enable_deferred_decode_kv_release = False

    def __init__(self):
        self.cleared_deferred = []

    def clear_deferred_abort_state(self, room):
        self.cleared_deferred.append(room)


def test_a_failed_decode_room_on_0_5_17_is_released_as_its_decode_py_does():
    receiver = _Receiver()
    role = _role(manager=_OldManager(), receivers={7: receiver})
    role.clear(7)
    assert receiver.calls == ["failure_exception", "clear"]
    assert 7 not in role.receivers


def test_a_failed_decode_room_on_the_current_shape_keeps_its_release():
    receiver, manager = _Receiver(), _NewManager()
    role = _role(manager=manager, receivers={7: receiver})
    role.clear(7)
    assert receiver.calls == ["failure_exception"]  # failure_exception clears it there
    assert manager.cleared_deferred == [7]


def test_a_0_5_17_sender_gets_the_destination_tp_ranks_and_pp_rank():
    made = []

    class OldSender:
        def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank,
                     req_has_disagg_prefill_dp_rank=False):
            made.append((bootstrap_room, dest_tp_ranks, pp_rank))

    class NewSender:
        def __init__(self, mgr, bootstrap_addr, bootstrap_room):
            made.append((bootstrap_room,))

    for cls in (OldSender, NewSender):
        role = _role(manager=object(), conn=SimpleNamespace(Sender=cls), sender_class="Sender")
        role.open_sender(5, "127.0.0.1:1")
    stage = _role(manager=object(), conn=SimpleNamespace(Sender=OldSender), sender_class="Sender", pp_rank=1)
    stage.open_sender(6, "127.0.0.1:1")  # a prefill's second pipeline stage names its own PP rank
    assert made == [(5, [0], 0), (5,), (6, [0], 1)]


def test_a_point_the_release_lacks_is_unsupported_with_its_reason():
    role = _role(missing_points={"decode-control-started": "sglang 0.5.17: NixlKVManager has no ..."})
    with pytest.raises(Unsupported, match="sglang 0.5.17: NixlKVManager has no"):
        role.arm_point("decode-control-started", "pause")


def test_the_receive_tap_shows_each_message_and_passes_everything_through():
    class Socket:
        closed = False

        def __init__(self):
            self.queue = [[b"ABORT_ACK", b"7"], [b"7", b"4", b"0"]]

        def recv_multipart(self, flags=0):
            return self.queue.pop(0)

    seen = []
    tap = ReceiveTap(Socket(), seen.append)
    assert tap.recv_multipart() == [b"ABORT_ACK", b"7"]
    assert tap.recv_multipart(0) == [b"7", b"4", b"0"]
    assert seen == [[b"ABORT_ACK", b"7"], [b"7", b"4", b"0"]]
    assert tap.closed is False


def test_acks_read_from_the_tap_are_recorded_without_a_generation():
    import threading

    role = _role(_acks=[], _acks_lock=threading.Lock())
    role._note_if_ack([b"ABORT_ACK", b"7"])
    role._note_if_ack([b"7", b"4", b"0"])  # a KV status: not an ACK
    (ack,) = role.abort_acks()
    assert (ack["room"], ack["generation"]) == (7, None)


LEGACY_PROGRAM = r"""
import json
from types import SimpleNamespace
from harness.target import gpu_import_shims
from harness.target import role_context
role_context.apply_role_env()
gpu_import_shims.install()
import sglang.srt.disaggregation.common.conn as common
from backends.nixl.adapter import NixlRole

out = {}
# NIXL 0.5.17: no _build_transfer_dst_indices; pairs with build_transfer_entry_pairs
shell = SimpleNamespace(kv_args=SimpleNamespace(kv_layer_ids=[]), pp_size=1)
out["plain"] = NixlRole.plan_one(None, shell, False, 4, 4)
try:
    NixlRole.plan_one(None, SimpleNamespace(kv_args=SimpleNamespace(kv_layer_ids=[]), pp_size=2), False, 2, 4)
except RuntimeError as exc:
    out["pp"] = str(exc)
# Common 0.5.17: no AbortNotification; the ABORT is four frames
if hasattr(common, "AbortNotification"):
    del common.AbortNotification
role = object.__new__(NixlRole)
role.manager, role.receivers = SimpleNamespace(local_ip="127.0.0.1", rank_port=4242), {}
out["abort"] = [f.decode() for f in role.abort_frames(9)]
print(json.dumps(out))
"""


def test_legacy_pairing_and_abort_frames_with_the_installed_sglang_functions():
    done = subprocess.run([sys.executable, "-c", LEGACY_PROGRAM], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["plain"] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert "requires layer ids" in out["pp"]
    assert out["abort"] == ["ABORT", "9", "127.0.0.1", "4242"]
