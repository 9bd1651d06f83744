"""How each step of the vocabulary (harness.spec.steps) is executed: one function per step type.

:data:`EXECUTORS` maps a step's type to ``fn(driver, step)``, where ``driver`` is the
cell's :class:`harness.drive.cell.CellDriver`; :func:`execute` looks a step up there.
A step type without an executor is a harness bug, caught by
tests/test_architecture.py (every member of ``harness.spec.steps.Step`` has one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from harness.drive.executors import layout_pairs, layouts, lifecycle, nemesis
from harness.spec import steps as s

if TYPE_CHECKING:
    from harness.drive.cell import CellDriver

EXECUTORS: dict[type, Callable[[Any, Any], None]] = {
    s.StartRoles: lifecycle.start_roles,
    s.OpenRoom: lifecycle.open_room,
    s.OpenSender: lifecycle.open_sender,
    s.RequestKV: lifecycle.request_kv,
    s.InitSender: lifecycle.init_sender,
    s.SendChunk: lifecycle.send_chunk,
    s.AwaitStatus: lifecycle.await_status,
    s.VerifyPools: lifecycle.verify_pools,
    s.Clear: lifecycle.clear,
    s.Abort: lifecycle.abort,
    s.RequireFact: lifecycle.require_fact,
    s.Sleep: lifecycle.sleep,
    s.Observe: lifecycle.observe,
    s.KillRole: nemesis.kill_role,
    s.FreezeRole: nemesis.freeze_role,
    s.ThawRole: nemesis.thaw_role,
    s.NetworkFault: nemesis.network_fault,
    s.InjectFrames: nemesis.inject_frames,
    s.InjectAbort: nemesis.inject_abort,
    s.CaptureFrames: nemesis.capture_frames,
    s.InjectCaptured: nemesis.inject_captured,
    s.RestartRole: nemesis.restart_role,
    s.ArmPoint: nemesis.arm_point,
    s.AwaitPoint: nemesis.await_point,
    s.ReleasePoint: nemesis.release_point,
    s.EngineFaults: nemesis.engine_faults,
    s.LoseMessages: nemesis.lose_messages,
    s.PlanLayouts: layouts.plan_layouts,
    s.TransferLayouts: layouts.transfer_layouts,
    s.TransferPairs: layout_pairs.transfer_pairs,
}


def execute(driver: "CellDriver", step: s.Step) -> None:
    """Run ``step`` on ``driver``'s roles; KeyError naming the type when no executor exists."""
    try:
        fn = EXECUTORS[type(step)]
    except KeyError:
        raise KeyError(f"no executor for step type {type(step).__name__} (harness.drive.executors)") from None
    fn(driver, step)
