"""The closed step vocabulary that scenarios are written in.

A scenario is a list of these frozen dataclasses; the cell (harness.drive.cell) executes
each through its executor (harness.drive.executors) against role processes and records every invocation and completion in the
history.  Steps name roles (``"prefill"``, ``"decode"``, or more for scenarios
with several prefills) and bootstrap rooms; they never import a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.spec.protocol import Layout


@dataclass(frozen=True)
class ArmPoint:
    """Nemesis: arm interleaving ``point`` in ``role`` (see :mod:`harness.role.faults`).

    ``action`` ``"pause"`` holds the thread that reaches the point until
    :class:`ReleasePoint` (at most ``hold_s`` seconds); ``"inject"`` pushes ``frames``
    into the role's own control socket there and holds the thread ``hold_s``
    seconds.  A point the adapter cannot reach makes the cell UNSUPPORTED.
    """

    role: str
    point: str
    action: str = "pause"
    frames: tuple[tuple[bytes, ...], ...] = ()
    hold_s: float = 20.0


@dataclass(frozen=True)
class AwaitPoint:
    """Wait until a thread of ``role`` is paused at ``point`` (or ``timeout_s`` passes)."""

    role: str
    point: str
    timeout_s: float = 10.0


@dataclass(frozen=True)
class ReleasePoint:
    """Let the thread paused at ``point`` in ``role`` go on."""

    role: str
    point: str


@dataclass(frozen=True)
class EngineFaults:
    """Nemesis: from now on ``role``'s transfer engine fails its ``fail_nth`` transfer,
    delays each by ``delay_s`` seconds, never completes any (``never_complete``), or
    fails every transfer of its ``fail_group``-th batch; each room's aux data
    reaches the decode ``aux_delay_s`` seconds late, on whatever path the backend
    sends it; its ``slow_nth`` transfer completes ``slow_s`` seconds late while later
    ones go on (completion out of issue order) (:class:`harness.role.faults.EngineFaultPlan`).
    ``rank``: only that process of the role (an index into its TP ranks, PP stages or DP
    engines, as ``list`` indexes: -1 the last; rank 0 is the role itself), so one PP stage
    or TP rank lags while the others complete; None: every process of the role.  ``error``:
    how a failed transfer surfaces, in the engine's own terms (``post-error``,
    ``remote-disconnect``; EngineFaultPlan.error); "" the engine's plain failure."""

    role: str
    fail_nth: int | None = None
    delay_s: float = 0.0
    never_complete: bool = False
    fail_group: int | None = None
    aux_delay_s: float = 0.0
    slow_nth: int | None = None
    slow_s: float = 0.0
    rank: int | None = None
    error: str = ""


@dataclass(frozen=True)
class LoseMessages:
    """Nemesis: from now on ``role`` (every process of it) loses the ``nth`` control message of
    ``kind`` it sends (1-based, counted from this step), and ``count`` of them from there (0:
    every later one); with ``room``, only messages of that bootstrap room count.  Kinds:
    harness.role.message_loss.KINDS (``registration``, ``status``, ``abort``, ``abort_ack``,
    ``aux_data``, ``watermark``, ``staging_rsp`` ...).  ``kind`` None heals.  A kind the
    implementation does not send as a control message makes the cell UNSUPPORTED (R-LOSS-1)."""

    role: str
    kind: str | None
    room: int | None = None
    nth: int = 1
    count: int = 1


@dataclass(frozen=True)
class StartRoles:
    """Launch one process per role (concurrently), then start each role's manager.

    ``prefills`` get a bootstrap server each; ``decodes`` a decode manager.
    Every role uses ``layout``.  Seconds: ``ready_timeout_s`` for a process to
    import sglang and serve commands.  ``arm``: interleaving points armed in a
    role after its process is up and before its manager starts (for points in
    the manager's constructor).
    """

    prefills: tuple[str, ...] = ("prefill",)
    decodes: tuple[str, ...] = ("decode",)
    layout: Layout = field(default_factory=Layout)
    ready_timeout_s: float = 90.0
    arm: tuple[ArmPoint, ...] = ()
    decode_layout: Layout | None = None  # the decodes' layout when it differs from the prefills'
    #: environment for every role process of this step, as (name, value) pairs, e.g. a
    #: short ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (the reference reads the same knobs)
    env: tuple[tuple[str, str], ...] = ()
    #: the decodes' attention TP (the prefills' is 1): with 2, ``decodes`` are the ranks
    #: 0, 1 (0, 1, ... again for more decodes) of decodes whose attention TP is 2
    decode_attn_tp: int = 1
    #: when given, ``prefills`` are the pipeline stages of ONE prefill, in stage order,
    #: stage i holding ``prefill_stages[i]`` (its ``stage_start``/``stage_end``), each its
    #: own role process: one bootstrap port (stage 0 serves it), one rendezvous for their
    #: PP group, every stage's bootstrap address that of stage 0
    prefill_stages: tuple[Layout, ...] = ()
    #: attention TP ranks of every prefill and of every decode (harness.spec.topology): with
    #: more than one, each role of ``prefills``/``decodes`` is a group of rank processes
    #: (rank 0 named as the role, rank r ``ROLE.tp<r>``) that the steps naming the role drive
    #: together, as a server's TP ranks run the same scheduler steps; each rank holds its
    #: share of ``kv_heads`` KV heads (0: the layout's own) of ``head_bytes`` bytes per token
    tp_ranks: tuple[int, int] = (1, 1)
    kv_heads: int = 0
    head_bytes: int = 0
    #: pipeline stages of every prefill (harness.spec.topology): with more than one, each role
    #: of ``prefills`` is a group of stage processes (stage 0 named as the role, stage s
    #: ``ROLE.pp<s>``) holding sglang's default layer split, driven together like TP ranks
    pp_stages: int = 1
    #: DP engines of every prefill and of every decode (harness.spec.topology): with more than
    #: one, each role is a group of engine processes (engine 0 named as the role, engine k
    #: ``ROLE.dp<k>``), each its own manager and pools; a step naming a room goes to the
    #: engine ``room mod DP`` (R-DP-1), any other to every engine
    dp_ranks: tuple[int, int] = (1, 1)

    def __post_init__(self):
        if min(self.tp_ranks) < 1:
            raise ValueError(f"StartRoles tp_ranks {self.tp_ranks}: at least one rank each side")
        if (max(self.tp_ranks) > 1 or self.pp_stages > 1) and (self.prefill_stages or self.decode_attn_tp > 1):
            raise ValueError("StartRoles: TP or PP groups do not combine with prefill_stages or decode_attn_tp yet")
        if self.pp_stages > 1 and self.tp_ranks[0] > 1:
            raise ValueError("StartRoles: a prefill of several TP ranks and several PP stages is not built yet")
        if min(self.dp_ranks) < 1:
            raise ValueError(f"StartRoles dp_ranks {self.dp_ranks}: at least one engine each side")
        if max(self.dp_ranks) > 1 and (max(self.tp_ranks) > 1 or self.pp_stages > 1 or self.prefill_stages
                                       or self.decode_attn_tp > 1):
            raise ValueError("StartRoles: DP engines of several ranks each are not built yet")


# Default bound (seconds) of a step that a conforming implementation completes in well
# under a second (a status change, a room opening): generous for two busy cores with
# roles forked ready, and the time a broken implementation costs per stuck step.
STEP_TIMEOUT_S = 6.0

# Fail fast: when an AwaitStatus whose status must come (``must_come``) runs out without
# it, the cell already fails at that step (the room is stuck: a dead control thread, a
# stale port), and every later AwaitStatus of the cell would
# wait out its own bound for the same reason.  From then on each of them waits at most
# this long (seconds); the history records the cut and the checks' details say so.
# ``pdconform run --full-waits`` keeps every bound (to study a failing cell's later steps).
STALL_CUT_S = 1.0


@dataclass(frozen=True)
class OpenRoom:
    """Create the prefill sender, then the decode receiver, for ``room`` (the decode's
    only, with ``open_sender`` False: a room the prefill never serves).  ``timeout_s``:
    see :data:`STEP_TIMEOUT_S`."""

    room: int
    prefill: str = "prefill"
    decode: str = "decode"
    timeout_s: float = STEP_TIMEOUT_S
    open_sender: bool = True


@dataclass(frozen=True)
class OpenSender:
    """Create only the prefill sender for ``room``, for ``destinations`` decode ranks
    (with 1 and no :class:`OpenRoom` with ``open_sender=False`` after it: a sender
    whose decode never registers)."""

    room: int
    prefill: str = "prefill"
    destinations: int = 1


@dataclass(frozen=True)
class RequireFact:
    """End the cell UNSUPPORTED with ``reason`` unless ``role`` reported a true
    ``fact`` when its manager started (e.g. ``deferred_release``)."""

    role: str
    fact: str
    reason: str


@dataclass(frozen=True)
class RestartRole:
    """Nemesis: replace prefill ``role`` by a new process behind the same bootstrap
    port.  The new process is launched (and has imported everything) before the old
    one is SIGKILLed, so the gap is the new manager's start-up only; its control
    ports are whatever the new manager binds.  ``env`` as for :class:`StartRoles`
    (None: the environment the role was started with).  A replacement that does not
    come up ends the cell with the old process left running."""

    role: str
    ready_timeout_s: float = 90.0
    env: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class InjectAbort:
    """Nemesis: push the plain Common ABORT for ``room`` (no backend guard frame), as
    ``decode``'s implementation builds it (``abort_frames``), into ``prefill``'s
    control socket.  ``known`` False: the decode has no receiver for ``room``
    (an ABORT for a room nobody holds)."""

    room: int
    prefill: str = "prefill"
    decode: str = "decode"
    known: bool = True


@dataclass(frozen=True)
class RequestKV:
    """Decode: init the receiver and send destination ``pages`` and ``aux_slot``."""

    room: int
    pages: tuple[int, ...]
    aux_slot: int
    decode: str = "decode"


@dataclass(frozen=True)
class AwaitStatus:
    """Poll ``role``'s room until its KVPoll is in ``statuses`` or ``timeout_s`` passes.

    The history records the last status seen, the statuses seen on the way and whether
    one of ``statuses`` was reached.  ``label`` names this poll for the checks
    (:func:`harness.judge.checks.status_at`); labels are unique within a scenario.
    ``must_come``: a conforming implementation reaches ``statuses`` within the bound
    (default, with the default bound :data:`STEP_TIMEOUT_S`); when it does not, the cell
    already fails here and its later waits are cut (:data:`STALL_CUT_S`).  False: a
    probe, which may run out in a conforming cell (give it a short bound).
    """

    room: int
    role: str
    statuses: tuple[int, ...]
    timeout_s: float = STEP_TIMEOUT_S
    label: str = ""
    must_come: bool = True


@dataclass(frozen=True)
class InitSender:
    """Prefill: tell the sender the request's page count and aux slot."""

    room: int
    num_pages: int
    aux_slot: int
    prefill: str = "prefill"


@dataclass(frozen=True)
class SendChunk:
    """Prefill: send one chunk of source ``pages``."""

    room: int
    pages: tuple[int, ...]
    prefill: str = "prefill"


VERIFY_RETRY_S = 0.05  # between two checks of a VerifyPools that is still settling


@dataclass(frozen=True)
class VerifyPools:
    """Decode: check every byte of its pools against (src, dst) page and aux-slot pairs.

    ``settle_s``: while bytes are still wrong, check again every VERIFY_RETRY_S seconds
    for up to that long (the last check is judged).  A verification that stands for
    R-LAYOUT-1 (where the bytes land) settles, so bytes that land late but right do not
    fail it; whether they had landed by the Success poll is R-XFER-2's own check, with
    ``settle_s=0`` (scenario slow-aux makes that race certain instead of left to load).
    A wrong byte stays wrong: the bound only delays a FAIL."""

    kv_moves: tuple[tuple[int, int], ...]
    aux_moves: tuple[tuple[int, int], ...]
    decode: str = "decode"
    unchecked_kv: tuple[int, ...] = ()  # destination pages a cut-short transfer may have written
    unchecked_aux: tuple[int, ...] = ()
    sent_layers: tuple[int, ...] | None = None  # layers the prefill sends (None: every layer)
    settle_s: float = 2.0
    label: str = ""  # names this verification in the history (a program's lifecycle, harness.explore)


@dataclass(frozen=True)
class KillRole:
    """Nemesis: SIGKILL the role's process (a real death: no cleanup runs)."""

    role: str


#: the paths a NetworkFault can be on (harness.hosts.linkfault says which packets each picks)
NETWORK_PATHS = ("all", "bootstrap", "control", "data")


@dataclass(frozen=True)
class NetworkFault:
    """Nemesis: from now on the network between the hosts of roles ``a`` and ``b`` delays
    each packet ``delay_ms`` (+/- ``jitter_ms``), loses ``loss_pct`` percent, duplicates
    ``duplicate_pct``, reorders ``reorder_pct`` (with a delay), and carries at most
    ``rate_kbit`` (0: no limit); ``partition`` drops every packet.  Only on ``path``:
    ``all``, ``bootstrap`` (the prefill's bootstrap port: bootstrap queries and heartbeat
    probes), ``control`` (the managers' ZMQ control ports) or ``data`` (every other packet:
    the transfer engine's); harness.hosts.linkfault says which tool does what.  Both ways,
    or only from ``a`` to ``b`` (``both_ways=False``).  Every other flow (the harness's own
    calls, other hosts) is untouched.  A step with nothing set heals the link.  Needs
    roles on several hosts (``run --hosts``; harness.hosts.agent applies it): the cell is
    UNSUPPORTED otherwise, and on a host that lacks the tool or kernel part the fault
    needs (nftables for one path or a loss; for delay and the like netem, or an iptables NFQUEUE
    rule and a reader where the kernel has no netem: harness.hosts.nfqueue)."""

    a: str
    b: str
    partition: bool = False
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    duplicate_pct: float = 0.0
    reorder_pct: float = 0.0
    rate_kbit: int = 0
    both_ways: bool = True
    path: str = "all"


@dataclass(frozen=True)
class FreezeRole:
    """Nemesis: SIGSTOP the role's process (its sockets stay open, nothing answers)."""

    role: str


@dataclass(frozen=True)
class ThawRole:
    """Nemesis: SIGCONT a frozen role."""

    role: str


@dataclass(frozen=True)
class InjectFrames:
    """Nemesis: push multipart ``frames`` (each a tuple of bytes) to the role's control
    socket (the manager's ``rank_port``), as any peer could."""

    role: str
    frames: tuple[tuple[bytes, ...], ...]


@dataclass(frozen=True)
class CaptureFrames:
    """Nemesis, first half of a late message: have ``role``'s implementation build the
    message it sends for ``room``'s current lifecycle, and keep it under ``label``:
    ``kind`` ``"abort"`` (a decode's ABORT, ``abort_frames``) or ``"status"`` (a prefill's
    STATUS with KVPoll ``status``, ``status_frames``).  Nothing is sent."""

    label: str
    role: str
    room: int
    kind: str = "abort"
    status: int | None = None

    def __post_init__(self):
        if self.kind not in ("abort", "status"):
            raise ValueError(f"CaptureFrames kind {self.kind!r}: abort or status")
        if (self.kind == "status") != (self.status is not None):
            raise ValueError("CaptureFrames: a status capture needs its KVPoll status, an abort capture none")


@dataclass(frozen=True)
class InjectCaptured:
    """Nemesis, second half: push the message captured under ``label`` into ``role``'s
    control socket, now (a message of an ended lifecycle arriving late, R-REUSE-1)."""

    label: str
    role: str


@dataclass(frozen=True)
class Sleep:
    """Wait in the driver (seconds).  Also how tests build a cell that hangs."""

    seconds: float


@dataclass(frozen=True)
class Observe:
    """Wait ``settle_s`` seconds, then record an observation of each of ``roles``
    (loops, dead threads, logs) mid-cell, e.g. after a batch of injected frames."""

    roles: tuple[str, ...]
    settle_s: float = 0.2
    label: str = ""


@dataclass(frozen=True)
class PlanLayouts:
    """Ask ``role``'s implementation to plan ``count`` generated layouts
    (:mod:`harness.spec.layouts`, drawn from ``seed``); every layout it plans differently
    from the planning rules (harness.spec.layout_plan) is shrunk (one per kind of difference, at most
    ``max_shrinks``) by asking it again about smaller layouts."""

    role: str = "prefill"
    count: int = 200
    seed: int = 0
    max_shrinks: int = 6


@dataclass(frozen=True)
class TransferLayouts:
    """Real transfers for generated layouts: ``count`` single-stage layouts drawn from the
    layout strategy with ``seed``, plus up to three layouts the last :class:`PlanLayouts`
    shrunk that have one prefill stage; and ``multi_stage`` layouts whose prefill has
    several pipeline stages and whose decode holds the whole model, plus up to two such
    shrunk layouts.  Each gets its own roles (``prefill-L<i>``/``decode-L<i>``; a
    multi-stage prefill one role per stage, ``prefill-L<i>-pp<k>``) with those layouts,
    one room, and a byte check in which the decode's own draft layers must stay untouched."""

    count: int = 2
    seed: int = 0
    multi_stage: int = 2


@dataclass(frozen=True)
class TransferPairs:
    """Real transfers between ``count`` layout pairs whose sides are drawn on their own
    (harness.spec.layout_pairs, seed ``seed``), each on roles of its own
    (``prefill-P<i>``/``decode-P<i>``), each judged against the spec's planner; then for up to
    ``max_shrinks`` ways a pair went wrong, up to ``shrink_examples`` more transfers looking for
    the smallest pair that goes wrong the same way (harness.drive.executors.layout_pairs)."""

    count: int = 8
    seed: int = 0
    max_shrinks: int = 2
    shrink_examples: int = 3


@dataclass(frozen=True)
class Clear:
    """Clear ``room`` on ``role`` (the scheduler releasing the request)."""

    room: int
    role: str


@dataclass(frozen=True)
class Abort:
    """Abort ``room`` on ``role`` (the scheduler's AbortReq)."""

    room: int
    role: str


Step = (StartRoles | OpenRoom | OpenSender | RequestKV | AwaitStatus | InitSender | SendChunk | VerifyPools
        | KillRole | RestartRole | InjectAbort | RequireFact
        | FreezeRole | ThawRole | NetworkFault | InjectFrames | CaptureFrames | InjectCaptured | Sleep | ArmPoint | AwaitPoint
        | ReleasePoint | EngineFaults | LoseMessages
        | Clear | Abort | Observe | PlanLayouts | TransferLayouts | TransferPairs)
