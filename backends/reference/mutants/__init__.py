"""Planted bugs: mutants of the reference implementation, to prove the suite judges every requirement.

Mutation testing of the scenarios (as PIT or mutmut mutate code to test unit tests): each
:class:`Mutant` is the reference with one protocol bug of the kind real backends have had,
and names the requirement of docs/protocol.md it breaks.  ``pdconform mutants``
(harness.mutants) runs the matrix's scenarios against each one as its own implementation
(``mutant.<id>``); a mutant is *caught* when a cell fails a check citing its requirement.
A mutant that survives is a hole in the suite, closed with a check, never by changing the
mutant.

A mutant is applied inside its role process only (the role's environment names it in
:data:`MUTANT_ENV`; :func:`apply_from_env`, called when the reference adapter is built),
by replacing one method of the reference's classes with a broken one; the reference's
own source carries no switch for it (``ack-before-drain`` turns on the prefill core's
test-only ``planted_bug`` of the same name, which the core's own tests use).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from backends.reference.mutants import blind, liveness, transfer
from backends.reference.mutants._base import PlantedLoopDeath

from harness.implementations import MUTANT_ENV, mutants_listed  # what the registry sets


@dataclass(frozen=True)
class Mutant:
    """One planted bug: ``id`` (the implementation is ``mutant.<id>``), the
    ``requirement`` of docs/protocol.md it breaks, what it does (``bug``), where a real
    backend had a bug of its kind (``like``), and ``apply``, which patches the reference
    classes in the calling process."""

    id: str
    requirement: str
    bug: str
    like: str
    apply: Callable[[], None]
    across_hosts: str = ""  # why only a run across hosts can catch it (`pdconform mutants` on one host skips it)
    # the blind set it belongs to (written by someone who had not read the checks: backends/reference/mutants/
    # blind.py, docs/mutants.md), "" for the catalogue written beside the checks
    blind: str = ""


MUTANTS: tuple[Mutant, ...] = (
    Mutant("no-success-status", "R-XFER-1", "the prefill never tells the decode its room succeeded",
           "a status message dropped on the way to the decode", transfer._no_success_status),
    Mutant("last-chunk-missed", "R-XFER-1", "the last chunk is not recognised as last (off by one), so the room "
           "never concludes", "a chunk's is_last computed from the wrong index", transfer._last_chunk_missed),
    Mutant("success-before-aux", "R-XFER-2", "Success is reported without waiting for the aux write",
           "docs/sglang-bugs.md B12 (Mori: aux and status on two connections)", transfer._success_before_aux),
    Mutant("aux-slot-off-by-one", "R-LAYOUT-1", "the aux data lands in the slot after the decode's",
           "an aux index taken from the wrong list", transfer._aux_slot_off_by_one),
    Mutant("chunk-offset-restarts", "R-LAYOUT-1", "every chunk is written from the room's first destination page",
           "a chunk's destination slice not advanced by the pages already sent", transfer._chunk_offset_restarts),
    Mutant("destinations-sorted", "R-LAYOUT-1", "pages go to the decode's pages in sorted order, not the order "
           "it listed", "destination pages grouped into contiguous runs after sorting", transfer._destinations_sorted),
    Mutant("draft-v-offset", "R-LAYOUT-2", "draft V buffers are found with the main layer count instead of the "
           "draft's", "PR #35281 (Mori's draft-KV V offset)", transfer._draft_v_offset),
    Mutant("stage-start-ignored", "R-LAYOUT-2", "a prefill PP stage's layers are written at their index within "
           "the stage", "PR #35281 (Mori's index-based copy across PP stages)", transfer._stage_start_ignored),
    Mutant("head-slice-at-zero", "R-LAYOUT-1", "a prefill TP rank's KV heads land from the decode rank's first "
           "head, not at their own", "a head offset taken within the source rank instead of the destination "
           "(common/staging_buffer.py compute_head_slice_params)", transfer._head_slice_at_zero),
    Mutant("dp-engine-zero", "R-DP-1", "the decode takes every room from prefill DP engine 0, not engine room mod "
           "DP", "a prefill DP rank resolved without the bootstrap room (decode.py _resolve_prefill_dp_rank)",
           transfer._dp_engine_zero),
    Mutant("failed-raised-to-success", "R-TERM-1", "a Failed room becomes Success when a Success arrives later "
           "(status merged with max)", "common/conn.py update_status merges statuses with max()",
           transfer._failed_raised_to_success),
    Mutant("bootstrap-deadline-reset", "R-TIMEOUT-1", "the bootstrap deadline restarts on every tick, so an "
           "orphan sender never fails", "PR #34692 (NIXL had no prefill bootstrap timeout)",
           transfer._bootstrap_deadline_reset),
    Mutant("bootstrap-deadline-any-state", "R-TIMEOUT-1", "the bootstrap deadline also fails rooms that "
           "registered and are waiting or transferring", "a deadline checked without the room's state",
           transfer._bootstrap_deadline_any_state),
    Mutant("waiting-deadline-reset", "R-TIMEOUT-2", "the decode's waiting deadline restarts on every tick",
           "a waiting timeout measured from the last poll", transfer._waiting_deadline_reset),
    Mutant("stuck-write-waited-forever", "R-TIMEOUT-3", "a write the engine never completes is waited for "
           "forever", "NIXL _await_handles polls with no deadline", transfer._stuck_write_waited_forever),
    Mutant("old-generation-ack-applied", "R-REUSE-1", "the decode applies an ABORT_ACK of an older room "
           "lifecycle to the new one, and fails it", "ACKs matched by room only (before PRs #35049, #35360)",
           transfer._old_generation_ack_applied),
    Mutant("old-generation-status-applied", "R-REUSE-1", "the decode applies a STATUS of an older room "
           "lifecycle to the new one (a late Success hands the request pages nothing was written to)",
           "Common's status message names no lifecycle (docs/sglang-bugs.md B13)",
           transfer._old_generation_status_applied),
    Mutant("old-generation-abort-applied", "R-REUSE-1", "the prefill fails a reused room on a late ABORT of "
           "an older lifecycle", "ABORTs matched by room only (docs/sglang-bugs.md B13)",
           transfer._old_generation_abort_applied),
    Mutant("status-kept-across-clear", "R-REUSE-1", "the prefill's status map keeps a Failed room's entry "
           "after clear, so the reused room starts Failed", "request_status not popped in clear",
           transfer._status_kept_across_clear),
    Mutant("failed-room-kept", "R-RESIDUE-1", "the prefill keeps a failed room after clear",
           "PR #35281 (stale _staging_outstanding), failure records never removed", transfer._failed_room_kept),
    Mutant("failure-record-in-substate", "R-RESIDUE-1", "the prefill records each failure in a helper object "
           "keyed (room, decode) and never removes it", "PR #35281 (stale _staging_outstanding in the staging "
           "context)", transfer._failure_record_in_substate),
    Mutant("decode-failed-room-kept", "R-RESIDUE-1", "the decode keeps a failed room after clear",
           "a request_status entry never popped", transfer._decode_room_kept),
    Mutant("loop-dies-on-short-frame", "R-LIVE-1", "a control frame with too few fields kills the control "
           "thread", "RFC #33861, docs/sglang-bugs.md B2", liveness._loop_dies_on_short_frame),
    Mutant("worker-exits-when-idle", "R-LIVE-2", "the transfer worker thread ends once its queue is empty",
           "a worker loop that returns instead of waiting", liveness._worker_exits_when_idle),
    Mutant("watermark-before-staging-fatal", "R-LIVE-3", "a WATERMARK before the prefill finished starting "
           "kills its control thread", "PR #35281 review (Mooncake _staging_ctx assigned after the control "
           "thread starts)", liveness._watermark_before_staging_fatal),
    Mutant("staging-ctx-after-thread-start", "R-LIVE-3", "with staging on, the staging context is assigned "
           "after the control thread starts: a WATERMARK in that window kills the thread",
           "PR #35281 review (Mooncake _staging_ctx)", liveness._staging_ctx_after_thread_start),
    Mutant("state-after-thread-start", "R-LIVE-4", "the prefill's control thread reads state assigned after it "
           "started: any frame in that window kills it", "PR #35281 (Mooncake session fields moved before "
           "start_prefill_thread)", liveness._state_after_thread_start),
    Mutant("stale-chunk-raises-logged", "R-STALE-1", "a chunk for a cleared room raises in the transfer worker, "
           "which catches it and logs it at WARNING", "PR #35281 (NIXL transfer_worker assert on "
           "transfer_infos)", liveness._stale_chunk_raises_logged),
    Mutant("stale-chunk-written", "R-STALE-1", "a chunk for a cleared room is still written into the decode's "
           "pages", "PR #35281 (Mori _run_chunk)", liveness._stale_chunk_written),
    Mutant("no-heartbeat-checker", "R-HB-1", "the decode never probes its prefills' health",
           "RFC #33861 (Mori's decode never started the heartbeat checker)", liveness._no_heartbeat_checker),
    Mutant("heartbeat-fails-every-prefill", "R-HB-1", "a dead prefill fails rooms bound to other prefills too",
           "node failure handled for every connection", liveness._heartbeat_fails_every_prefill),
    Mutant("stale-connection-pool", "R-RESTART-1", "the decode keeps the control endpoint it first learnt for a "
           "bootstrap address", "common/conn.py connection_pool, purged only on node failure",
           liveness._stale_connection_pool),
    Mutant("partitioned-write-waited-forever", "R-NET-1", "a write to a decode the network no longer reaches is "
           "waited for forever", "B17: all three backends' prefills under a partition",
           transfer._stuck_write_waited_forever,
           across_hosts="network-partition needs prefill and decode on two hosts (tests/test_hosts.py catches it)"),
    Mutant("dead-decode-write-waited-forever", "R-PEER-1", "a write to a decode whose process died is waited for "
           "forever", "NIXL _await_handles polls with no deadline; sglang's prefill has no heartbeat to its decodes",
           transfer._dead_decode_write_waited_forever),
    Mutant("health-probe-impatient", "R-NET-2", "the decode gives a prefill's health endpoint 0.1 s to answer, so "
           "a slow link fails its rooms", "a heartbeat timeout tuned on loopback", liveness._health_probe_impatient,
           across_hosts="network-delay needs two hosts (netem, or NFQUEUE where the kernel lacks it)"),
    Mutant("abort-not-held-malformed", "R-ABORT-1", "an ABORT for a room the prefill does not hold is logged as "
           "malformed and nothing is remembered of it", "RFC #33861 (Mori dropped unguarded ABORT as malformed)",
           liveness._abort_not_held_malformed),
    Mutant("abort-ignored-while-transferring", "R-ABORT-1", "an ABORT that arrives while the room transfers is "
           "ignored", "ABORT handled only before the transfer starts", liveness._abort_ignored_while_transferring),
    Mutant("ack-before-drain", "R-ABORT-2", "ABORT_ACK is sent at once, with writes still in flight",
           "PRs #35049, #35360 (deferred release)", liveness._ack_before_drain),
    Mutant("ack-withheld-after-failed-write", "R-ABORT-3", "a room whose write failed never counts as drained, "
           "so its ABORT_ACK is never sent", "docs/sglang-bugs.md B11 (Mooncake and Mori: poisoned rooms)",
           liveness._ack_withheld_after_failed_write),
    Mutant("ack-twice", "R-ABORT-2", "ABORT_ACK is sent twice for one generation",
           "an ACK sent both by the ABORT handler and the drain", liveness._ack_twice),
    Mutant("failure-to-one-destination", "R-FANOUT-1", "a failure is told to the first decode rank only",
           "common/conn.py _room_notify_targets", liveness._failure_to_one_destination),
    Mutant("reason-dropped-for-one-rank", "R-REASON-1", "the failure reason reaches the first decode rank only",
           "common/conn.py record_failure", liveness._reason_dropped_for_one_rank),
    Mutant("waiting-deadline-follows-heartbeat", "R-LOSS-1", "each answered health probe of a room's prefill "
           "pushes the room's waiting deadline out, so a room whose status was lost waits as long as its prefill "
           "lives", "liveness taken for progress; sglang #29978 (a lost message hung a transfer for ever)",
           liveness._waiting_deadline_follows_heartbeat),
    Mutant("status-split-under-load", "R-LOAD-1", "once a side has sent statuses for more than 32 rooms, each STATUS "
           "leaves as two messages (a frame boundary lost)", "sglang #29984 (frames of two threads interleaved on one "
           "socket)", liveness._status_split_under_load),
    Mutant("unscheduled-registration-kept", "R-RESIDUE-2", "a registration for a room the prefill never opened "
           "is kept for good, past its bootstrap timeout and the decode's ABORT",
           "docs/sglang-bugs.md B22 (transfer_infos popped only by a sender's clear)",
           liveness._unscheduled_registration_kept),
)

# the blind sets (docs/mutants.md: scored as written, before any check was changed for them)
MUTANTS += tuple(Mutant(**spec) for spec in blind.SPECS)

BY_ID = {m.id: m for m in MUTANTS}


def apply_from_env() -> str | None:
    """Apply the mutant :data:`MUTANT_ENV` names, once per process, in a role of a mutant
    run only (``PDCONFORM_MUTANTS=1`` too: harness.implementations.load_role_adapter sets
    the id for ``mutant.<id>`` roles and removes it for every other); its id, or None.
    KeyError names an unknown id; RuntimeError when another mutant was applied already
    (patches are never undone, so two would stack)."""
    name = os.environ.get(MUTANT_ENV)
    if not name or not mutants_listed():
        return None
    if _applied:
        if _applied[0] == name:
            return name
        raise RuntimeError(f"mutant {name!r} asked for in a process that runs mutant {_applied[0]!r} already")
    if name not in BY_ID:
        raise KeyError(f"unknown mutant {name!r} (known: {', '.join(BY_ID)})")
    from backends.reference import adapter

    transfer.ra = liveness.ra = adapter
    BY_ID[name].apply()
    _applied.append(name)
    return name


_applied: list[str] = []


__all__ = ["BY_ID", "MUTANTS", "MUTANT_ENV", "Mutant", "PlantedLoopDeath", "apply_from_env"]
