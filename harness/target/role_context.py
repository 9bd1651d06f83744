"""Prepare sglang's process-global runtime context for one PD role, without a GPU.

sglang's KV managers read their serving, disaggregation and parallel settings
from process globals that a real server sets up while it launches schedulers:
a published ``ServerArgs`` (``sglang.srt.runtime_context``), the parallel rank
placement, the pipeline-parallel group and, for Mooncake, a process-wide
transfer engine.  This module builds exactly that on loopback: no model download
(``model_path="dummy"``), no GPU.  TP is 1, or (``RoleSettings.attn_tp_size``) one
attention-TP rank of a wider server, each rank its own role process: the KV managers
only read their rank and width.  PP is 1, or (``RoleSettings.pp_size``, prefill only)
one pipeline stage of a wider prefill, each stage its own role process joined to the
others by a real torch.distributed (gloo) group, which the prefill managers use
(``PPConsensusStore`` broadcasts its address over it); with PP = 1 no
torch.distributed group is made.

How the context is built drifts between sglang releases, so each supported range
has a :class:`ContextStrategy`; :func:`strategy_for` picks one by version and
raises :class:`UnsupportedSglang` (with the supported ranges) otherwise.

Must be called in a fresh role process after :func:`harness.target.gpu_import_shims.install`
and before any sglang KV manager is built.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from harness.target.version import release_of, sglang_version

LOOPBACK = "127.0.0.1"
BIND_ENV = "PDCONFORM_BIND"  # the address every role listens on (``run --bind``); unset: LOOPBACK


def bind_address() -> str:
    """The IPv4 address this run's roles listen on and advertise: ``$PDCONFORM_BIND`` (set by
    ``run --bind``, harness.session) or :data:`LOOPBACK`."""
    return os.environ.get(BIND_ENV) or LOOPBACK


# Environment that every role process needs before sglang or an engine is imported (an
# implementation's own engine settings are its Implementation.role_env, harness.implementations).
ROLE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # The decode's heartbeat: sglang's minimum interval (2 s) and 2 misses, the same
    # window as the reference's decode, so dead-prefill cells take seconds, not tens.
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}


class UnsupportedSglang(RuntimeError):
    """The installed sglang release has no context strategy here."""


@dataclass(frozen=True)
class RoleSettings:
    """What a role needs to know to build its ServerArgs.

    ``mode`` is ``"prefill"`` or ``"decode"``; ``bootstrap_port`` is the TCP port
    of the prefill's bootstrap server (the decode uses it only as a default);
    ``page_size`` is in tokens.  ``attn_tp_size``/``attn_tp_rank``: this role is
    attention-TP rank ``attn_tp_rank`` of a server with ``attn_tp_size`` ranks
    (``tp_size`` = ``attn_tp_size``, no DP/CP), each rank its own process, with no
    torch.distributed group between them (the KV managers never use one).
    ``pp_size``/``pp_rank``: this role is pipeline stage ``pp_rank`` of ``pp_size``;
    with ``pp_size`` > 1 the stages meet at ``pp_rendezvous`` (``tcp://host:port``, the
    TCP store rank 0 listens on) to form their gloo group.
    ``dp_size``/``dp_rank``: this role is DP engine ``dp_rank`` of ``dp_size`` (one rank each:
    sglang's ``--tp N --dp N --enable-dp-attention``, attention TP 1), with the
    ``load_balance_method`` a PD launch resolves ``auto`` to (arg_groups/serving_hook.py:
    ``follow_bootstrap_room`` on a prefill, ``round_robin`` on a decode).
    ``extra`` is passed to ``ServerArgs`` verbatim.
    """

    mode: str
    backend: str
    bootstrap_port: int
    page_size: int = 4
    attn_tp_size: int = 1
    attn_tp_rank: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    pp_size: int = 1
    pp_rank: int = 0
    pp_rendezvous: str = ""
    dp_size: int = 1
    dp_rank: int = 0


#: seconds the stages of one prefill wait for each other to join their group: well under the
#: driver's bound on a role's start (harness.drive.executors.lifecycle.START_TIMEOUT_S), so a
#: stage that never comes fails the others' start with torch's own error, not a driver timeout
PP_JOIN_TIMEOUT_S = 20.0


class StagePPGroup:
    """Stands for sglang's pipeline-parallel ``GroupCoordinator`` across ``pp_size``
    prefill stages, one role process each: a real gloo process group over a TCP store at
    ``rendezvous`` (``tcp://host:port``, stage 0 the store's server), with the members the
    prefill managers use: ``is_first_rank``, ``is_last_rank``, ``world_size``,
    ``rank_in_group`` and ``broadcast_object`` (``disaggregation/pp_consensus_store.py``).

    Everything listens on the rendezvous host only (the driver gives the cell's
    :func:`bind_address`): stage 0 binds the store's socket itself and hands it over
    (``master_listen_fd``; torch's own store would listen on every interface), and gloo's
    sockets use the loopback interface (``GLOO_SOCKET_IFNAME=lo``, unless already set), so
    the stages of one prefill run on one host.  RuntimeError (torch's) when a stage does not join
    within :data:`PP_JOIN_TIMEOUT_S`; OSError when the port cannot be bound."""

    def __init__(self, pp_size: int, pp_rank: int, rendezvous: str):
        import datetime
        import socket

        import torch.distributed as dist

        host, _, port = rendezvous.removeprefix("tcp://").rpartition(":")
        timeout = datetime.timedelta(seconds=PP_JOIN_TIMEOUT_S)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if pp_rank == 0:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, int(port)))
            listener.listen(pp_size)
            # detached: the store's daemon owns the descriptor for the life of the process (Python
            # closing it at exit, under the daemon's poll, aborts the process)
            store = dist.TCPStore(host, int(port), pp_size, True, timeout, master_listen_fd=listener.detach(),
                                  use_libuv=False)
        else:
            store = dist.TCPStore(host, int(port), pp_size, False, timeout)
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=store, world_size=pp_size, rank=pp_rank, timeout=timeout)
        self.world_size, self.rank_in_group = pp_size, pp_rank
        self.rank, self.ranks = pp_rank, list(range(pp_size))
        self.is_first_rank, self.is_last_rank = pp_rank == 0, pp_rank == pp_size - 1

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` from stage ``src``, on every stage (torch.distributed.broadcast_object_list)."""
        import torch.distributed as dist

        box = [obj if self.rank_in_group == src else None]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def _pp_group(settings: RoleSettings):
    if settings.pp_size == 1:
        return _SingleRankPPGroup()
    if settings.mode != "prefill":
        raise ValueError("only a prefill runs as pipeline stages here (decode PP is not built)")
    return StagePPGroup(settings.pp_size, settings.pp_rank, settings.pp_rendezvous)


class _SingleRankPPGroup:
    """Stands for sglang's pipeline-parallel ``GroupCoordinator`` when PP = 1.

    The managers read ``is_first_rank``, ``is_last_rank``, ``world_size`` and
    ``rank_in_group`` even when pipeline parallelism is off.
    """

    is_first_rank = True
    is_last_rank = True
    world_size = 1
    rank_in_group = 0
    rank = 0
    ranks = [0]


@dataclass(frozen=True)
class ContextStrategy:
    """How one range of sglang releases builds its role context.

    ``min_version``/``max_version`` are release tuples, both ends included;
    ``max_version`` None: no upper end.  A post release belongs to its release
    (``0.5.18.post1`` is within ``max_version=(0, 5, 18)``).  ``prepare`` builds the
    context for one role and returns its ServerArgs.
    """

    name: str
    min_version: tuple[int, ...]
    max_version: tuple[int, ...] | None
    prepare: Callable[[RoleSettings], Any]

    def covers(self, version: str) -> bool:
        """True when ``version`` (a version string such as ``"0.5.17"``) is in range, judged by
        its release (:func:`release_of`: ``"0.5.2rc2"`` is 0.5.2, not 0.5.22); False for a
        version without a release number."""
        try:
            v = release_of(version)
        except ValueError:
            return False
        return v >= self.min_version and (self.max_version is None or v[:len(self.max_version)] <= self.max_version)


def _server_args(settings: RoleSettings):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(
        model_path="dummy",
        device="cpu",
        host=bind_address(),
        disaggregation_mode=settings.mode,
        disaggregation_transfer_backend=settings.backend,
        disaggregation_bootstrap_port=settings.bootstrap_port,
        page_size=settings.page_size,
        tp_size=settings.attn_tp_size * settings.dp_size,
        pp_size=settings.pp_size,
        **_dp_args(settings),
        **{**_staging_args(settings.page_size), **settings.extra},
    )


def _dp_args(settings: RoleSettings) -> dict:
    if settings.dp_size == 1:
        return {}
    return {"dp_size": settings.dp_size, "enable_dp_attention": True,
            "load_balance_method": "follow_bootstrap_room" if settings.mode == "prefill" else "round_robin"}


def _staging_args(page_size: int) -> dict:
    """With staging on (``SGLANG_DISAGG_STAGING_BUFFER``), the chunk size its buffers are
    sized from: sglang derives it from the GPU's memory, which a CPU role has none of (it
    stays None and the manager's constructor fails on it).  64 pages of tokens."""
    return {"chunked_prefill_size": 64 * page_size} if staging_on() else {}


def staging_on() -> bool:
    """Whether this role runs with sglang's staging buffers (``SGLANG_DISAGG_STAGING_BUFFER``
    set true, as sglang's environ reads a bool)."""
    return os.environ.get("SGLANG_DISAGG_STAGING_BUFFER", "").strip().lower() in ("1", "true", "yes", "on")


def _prepare_published_context(settings: RoleSettings):
    """sglang >= 0.5.19: ``runtime_context.publish`` with this rank's placement
    (``SpawnRanks(world_rank=tp_size * pp_rank + attn_tp_rank)``: publish derives
    ``tp_rank``, ``attn_tp_rank`` and ``pp_rank`` from it and the widths of the
    ServerArgs, ``runtime_context.spawn_world_rank``)."""
    from sglang.srt import runtime_context

    server_args = _server_args(settings)
    tp = settings.attn_tp_size * settings.dp_size  # a DP engine's rank in the TP world is its DP rank
    world_rank = tp * settings.pp_rank + settings.attn_tp_size * settings.dp_rank + settings.attn_tp_rank
    runtime_context.publish(
        server_args,
        role="scheduler",
        ranks=runtime_context.SpawnRanks(world_rank=world_rank, dp_rank=None, gpu_id=None),
    )
    runtime_context.get_parallel().override_permanently(pp_group=_pp_group(settings))
    return server_args


# The parallel override that _prepare_parallel_globals enters and never leaves:
# it must outlive the call (the managers read it for the life of the process).
_HELD_OVERRIDE: contextlib.ExitStack | None = None


def _prepare_parallel_globals(settings: RoleSettings):
    """sglang 0.5.17 - 0.5.18: the context a scheduler process builds while it sets up
    model parallelism, for this role's rank only.

    Those releases have no ``SpawnRanks`` and no ``override_permanently``
    (``sglang/srt/runtime_context.py``); their ``CommonKVManager.__init__``
    (``disaggregation/common/conn.py``) reads:

    * the published ServerArgs' config bags (``runtime_context.publish``, no ranks);
    * ``get_parallel().attn_tp_size/attn_tp_rank/attn_cp_size/attn_cp_rank`` and
      (0.5.18) ``attn_dcp_size/attn_dcp_rank``: live getters over
      ``distributed/parallel_state.py``'s groups, which this process never builds, so
      they are pinned with ``ParallelContext.override`` (entered and held for the
      life of the process);
    * ``get_attention_dp_size()/get_attention_dp_rank()`` from
      ``layers/dp_attention.py``'s module globals, set to what
      ``initialize_dp_attention`` computes for this rank
      (``compute_dp_attention_world_info``: no DP attention, so DP size 1, rank 0);
    * ``get_pp_group()`` imported straight from ``sglang.srt.distributed``: the
      ``parallel_state._PP`` slot gets the single-rank stand-in.
    """
    global _HELD_OVERRIDE
    if settings.dp_size > 1:
        raise UnsupportedSglang("DP engines are driven on sglang >= 0.5.19 only (its published runtime context); "
                                "run this topology against a newer sglang")
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers import dp_attention

    server_args = _server_args(settings)
    runtime_context.publish(server_args, role="scheduler")
    attn_tp_rank, attn_tp_size, attn_dp_rank, attn_dp_size = dp_attention.compute_dp_attention_world_info(
        server_args.enable_dp_attention, settings.attn_tp_rank, settings.attn_tp_size, server_args.dp_size,
        server_args.attn_cp_size,
    )
    dp_attention._ATTN_DP_RANK, dp_attention._ATTN_DP_SIZE = attn_dp_rank, attn_dp_size
    pp_group = _pp_group(settings)
    parallel_state._PP = pp_group
    if _HELD_OVERRIDE is not None:  # a second prepare in one process replaces the first
        _HELD_OVERRIDE.close()
    _HELD_OVERRIDE = contextlib.ExitStack()
    _HELD_OVERRIDE.enter_context(runtime_context.get_parallel().override(
        world_size=settings.attn_tp_size, world_rank=settings.attn_tp_rank,
        tp_size=settings.attn_tp_size, tp_rank=settings.attn_tp_rank,
        attn_tp_size=attn_tp_size, attn_tp_rank=attn_tp_rank,
        attn_cp_size=1, attn_cp_rank=0, attn_dp_size=attn_dp_size, attn_dp_rank=attn_dp_rank,
        dcp_enabled=False, dcp_size=1, dcp_rank=0, attn_dcp_size=1, attn_dcp_rank=0,
        pp_size=settings.pp_size, pp_rank=settings.pp_rank, pp_group=pp_group,
    ))
    return server_args


STRATEGIES = [
    ContextStrategy("published-runtime-context", (0, 5, 19), None, _prepare_published_context),
    ContextStrategy("parallel-state-globals", (0, 5, 17), (0, 5, 18), _prepare_parallel_globals),
]


def strategy_for(version: str) -> ContextStrategy:
    """Pick the strategy for ``version``; raise UnsupportedSglang if none covers it."""
    for strategy in STRATEGIES:
        if strategy.covers(version):
            return strategy
    ranges = ", ".join(
        f"{s.name}: >= {'.'.join(map(str, s.min_version))}"
        + (f", <= {'.'.join(map(str, s.max_version))}" if s.max_version else "")
        for s in STRATEGIES
    )
    raise UnsupportedSglang(f"sglang {version} has no role-context strategy (supported: {ranges})")


def apply_role_env() -> None:
    """Set ``ROLE_ENV`` unless already set, and ``SGLANG_HOST_IP`` to :func:`bind_address`
    (otherwise sglang's managers advertise the NIC's address)."""
    for key, value in ROLE_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("SGLANG_HOST_IP", bind_address())


def prepare_role(settings: RoleSettings):
    """Build sglang's process-global context for ``settings.mode``; return the ServerArgs.

    Raises UnsupportedSglang for a release without a strategy, ValueError for a
    mode other than prefill/decode.
    """
    if settings.mode not in ("prefill", "decode"):
        raise ValueError(f"role mode must be 'prefill' or 'decode', got {settings.mode!r}")
    if not 0 <= settings.attn_tp_rank < settings.attn_tp_size:
        raise ValueError(f"attention TP rank {settings.attn_tp_rank} is not a rank of {settings.attn_tp_size}")
    if not 0 <= settings.dp_rank < settings.dp_size:
        raise ValueError(f"DP rank {settings.dp_rank} is not a rank of {settings.dp_size}")
    if not 0 <= settings.pp_rank < settings.pp_size or (settings.pp_size > 1 and not settings.pp_rendezvous):
        raise ValueError(f"PP stage {settings.pp_rank} of {settings.pp_size} needs a rank in range and a rendezvous")
    apply_role_env()
    version = sglang_version()
    if version is None:
        raise UnsupportedSglang("sglang is not installed")
    return strategy_for(version).prepare(settings)
