"""Deployment shapes as data: how many ranks each side runs and what model they serve.

A :class:`Topology` names a prefill :class:`Side` and a decode :class:`Side`, each with
its attention TP size, its PP stages (sglang's default layer split, or an explicit one)
and its DP size, and the :class:`ModelShape` both serve (MHA or MLA, layers, KV heads,
bytes per head per token, page size, dtype) with each side's draft KV layers.  From it
come each rank's pool :class:`~harness.spec.protocol.Layout`: the layers of its PP
stage and the KV heads of its TP rank (:func:`rank_layout`), so the byte check knows
which heads and layers every rank owns (harness.role.pattern).

The named topologies (:data:`TOPOLOGIES`): ``p1-d1`` is the shape every scenario was
written for (one rank each side); the default set (``default=True``) is what ``make
matrix`` adds to it; the wide set (``nightly=True``) sweeps the TP pairs vLLM's connector
tests sweep, in both directions, shapes where a side has more TP ranks than the model has KV
heads (each head then held whole by several consecutive ranks: :func:`rank_heads`), and MLA.
Names read ``p<tp>[pp<n>][dp<n>]-d<tp>[dp<n>][-<model>]``: a TP shape serves :data:`GQA` (4 KV
heads) unless the suffix names another model, ``-kv<n>`` an MHA model of ``n`` KV heads,
``-mla`` :data:`MLA` (a shape of TP 1 on both sides serves one KV head and names none).

DP engines route rooms the way sglang does: a room is served by prefill DP rank ``room mod
DP`` (``follow_bootstrap_room``, what a PD prefill resolves ``load_balance_method=auto`` to)
and the harness routes it to decode DP rank ``room mod DP`` (R-DP-1, docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from harness.spec.protocol import Layout

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float32": 4}


class TopologyError(ValueError):
    """A topology that no sglang config produces (the message says why)."""


@dataclass(frozen=True)
class ModelShape:
    """What both sides serve.  ``kv_heads``: the model's KV heads (all TP ranks together;
    MLA has one latent "head" every rank holds whole); ``head_bytes``: bytes of one head
    of one token in one K or V buffer (head_dim x dtype size); ``page_size``: tokens per
    page; ``num_layers``: main model layers."""

    attention: Literal["MHA", "MLA"] = "MHA"
    num_layers: int = 3
    kv_heads: int = 1
    head_bytes: int = 64
    page_size: int = 4
    dtype: str = "bfloat16"

    def check(self) -> None:
        """TopologyError when no model has this shape."""
        if self.attention not in ("MHA", "MLA"):
            raise TopologyError(f"attention {self.attention!r}: MHA or MLA")
        if min(self.num_layers, self.kv_heads, self.head_bytes, self.page_size) <= 0:
            raise TopologyError("layers, KV heads, head bytes and page size must be positive")
        if self.dtype not in DTYPE_BYTES or self.head_bytes % DTYPE_BYTES[self.dtype]:
            raise TopologyError(f"dtype {self.dtype!r} with {self.head_bytes} bytes per head")
        if self.head_bytes % 8:
            raise TopologyError(f"{self.head_bytes} bytes per head: the byte pattern needs a multiple of 8")
        if self.attention == "MLA" and self.kv_heads != 1:
            raise TopologyError("MLA keeps one latent KV head per token (kv_heads 1)")


@dataclass(frozen=True)
class Side:
    """One side's parallelism: attention ``tp`` ranks, ``pp`` pipeline stages (their layer
    counts in ``pp_split``, or sglang's default split when empty), ``dp`` data-parallel
    engines, and ``draft_layers`` of draft-model KV (on the last stage)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    pp_split: tuple[int, ...] = ()
    draft_layers: int = 0

    @property
    def ranks(self) -> int:
        """Role processes this side runs: one per (DP engine, PP stage, TP rank)."""
        return self.tp * self.pp * self.dp


def default_pp_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage as sglang splits them without ``SGLANG_PP_LAYER_PARTITION``: evenly,
    the last ``num_layers % pp`` stages one more (``distributed/utils.py`` get_pp_indices)."""
    base, remainder = divmod(num_layers, pp)
    return tuple(base + (1 if rank >= pp - remainder else 0) for rank in range(pp))


@dataclass(frozen=True)
class Topology:
    """A named PD deployment shape; ``default``: in ``make matrix``'s set; ``nightly``: in the
    wide set.  TopologyError (from :meth:`check`) when no sglang config produces it."""

    name: str
    prefill: Side = field(default_factory=Side)
    decode: Side = field(default_factory=Side)
    model: ModelShape = field(default_factory=ModelShape)
    default: bool = False
    nightly: bool = False
    about: str = ""

    def stages(self, side: str) -> tuple[tuple[int, int], ...]:
        """Each PP stage's ``[start, end)`` layers on ``side`` ("prefill" or "decode")."""
        s = self.side(side)
        split = s.pp_split or default_pp_split(self.model.num_layers, s.pp)
        bounds = [0]
        for n in split:
            bounds.append(bounds[-1] + n)
        return tuple(zip(bounds, bounds[1:]))

    def side(self, name: str) -> Side:
        if name not in ("prefill", "decode"):
            raise ValueError(f"side {name!r}: prefill or decode")
        return self.prefill if name == "prefill" else self.decode

    def check(self) -> None:
        """TopologyError naming what no sglang config allows."""
        self.model.check()
        for name in ("prefill", "decode"):
            s = self.side(name)
            if min(s.tp, s.pp, s.dp) < 1 or s.draft_layers < 0:
                raise TopologyError(f"{self.name}: {name} tp, pp, dp must be >= 1 and draft layers >= 0")
            if s.pp > self.model.num_layers:
                raise TopologyError(f"{self.name}: {name} has {s.pp} stages for {self.model.num_layers} layers")
            if s.pp_split and (len(s.pp_split) != s.pp or sum(s.pp_split) != self.model.num_layers
                               or min(s.pp_split) < 1):
                raise TopologyError(f"{self.name}: {name} split {s.pp_split} is not {s.pp} non-empty stages "
                                    f"of {self.model.num_layers} layers")
            if s.dp > 1 and (s.tp > 1 or s.pp > 1):
                raise TopologyError(f"{self.name}: {name} DP {s.dp} engines of TP {s.tp} x PP {s.pp} ranks each "
                                    "is not built yet (a DP engine is one rank)")
            heads = self.model.kv_heads
            if self.model.attention == "MHA" and heads % s.tp and s.tp % heads:
                raise TopologyError(f"{self.name}: {name} TP {s.tp} neither divides nor is a multiple of "
                                    f"{heads} KV heads")

    def heads_of(self, side: str, tp_rank: int) -> tuple[int, int]:
        """(first global KV head, heads) TP rank ``tp_rank`` of ``side`` holds (:func:`rank_heads`)."""
        return rank_heads(self.model.kv_heads, self.side(side).tp, tp_rank, self.model.attention == "MLA")

    def to_dict(self) -> dict:
        """The JSON ``pdconform list --topologies --json`` prints for this topology."""
        model = asdict(self.model)
        out = {"name": self.name, "default": self.default, "nightly": self.nightly, "about": self.about}
        for name in ("prefill", "decode"):
            s = self.side(name)
            out[name] = {"tp": s.tp, "pp": s.pp, "dp": s.dp,
                         "stages": [list(b) for b in self.stages(name)],
                         "model": {**model, "draft_layers": s.draft_layers}}
        return out


def rank_layout(topology: Topology, side: str, tp_rank: int = 0, pp_rank: int = 0, num_pages: int = 16) -> Layout:
    """The pool layout of one rank: its PP stage's layers (:func:`stage_layouts`, or the side's
    explicit split), its TP rank's KV heads (:func:`group_layouts`), pages of ``page_size``
    tokens x its heads x ``head_bytes``; the side's draft layers on its last stage."""
    s, model = topology.side(side), topology.model
    whole = Layout(num_layers=model.num_layers, num_pages=num_pages, page_size=model.page_size,
                   page_bytes=model.page_size * model.kv_heads * model.head_bytes, mla=model.attention == "MLA",
                   kv_heads=model.kv_heads, draft_layers=s.draft_layers)
    rank = group_layouts(whole, s.tp)[tp_rank]
    start, end = topology.stages(side)[pp_rank]
    return replace(rank, stage_start=start, stage_end=end, draft_layers=s.draft_layers if pp_rank == s.pp - 1 else 0)


def _named(name: str, p: Side, d: Side, model: ModelShape = ModelShape(), **kw) -> Topology:
    return Topology(name=name, prefill=p, decode=d, model=model, **kw)


GQA = ModelShape(attention="MHA", num_layers=3, kv_heads=4, head_bytes=16, page_size=4)
#: GQA models of fewer KV heads than a side's TP ranks: each head replicated on several ranks
KV2 = replace(GQA, kv_heads=2)
KV1 = replace(GQA, kv_heads=1)
MLA = ModelShape(attention="MLA", num_layers=3, kv_heads=1, head_bytes=64, page_size=4)

#: every named topology, by name
TOPOLOGIES: dict[str, Topology] = {t.name: t for t in (
    _named("p1-d1", Side(), Side(), default=True, nightly=True,
           about="one rank each side: the shape every scenario was written for"),
    _named("p2-d1", Side(tp=2), Side(), GQA, default=True, nightly=True,
           about="prefill TP 2 into decode TP 1: each prefill rank writes its half of the KV heads"),
    _named("p1-d2", Side(), Side(tp=2), GQA, default=True, nightly=True,
           about="prefill TP 1 into decode TP 2: each decode rank takes its half of the KV heads"),
    _named("p1pp2-d1", Side(pp=2), Side(), default=True, nightly=True,
           about="a prefill of 2 pipeline stages (sglang's default split), one role each, into a whole-model decode"),
    _named("p1-d1dp2", Side(), Side(dp=2), default=True, nightly=True,
           about="two decode DP engines: each room goes to one of them (room mod 2), each its own pools"),
    _named("p1dp2-d1", Side(dp=2), Side(), nightly=True,
           about="two prefill DP engines behind one bootstrap server: a room is served by prefill DP rank "
                 "room mod 2 (follow_bootstrap_room), which the decode must ask for"),
    _named("p4-d2", Side(tp=4), Side(tp=2), GQA, nightly=True, about="TP 4 into TP 2"),
    _named("p2-d4", Side(tp=2), Side(tp=4), GQA, nightly=True, about="TP 2 into TP 4 (decode first)"),
    _named("p4-d4", Side(tp=4), Side(tp=4), GQA, nightly=True, about="TP 4 into TP 4"),
    _named("p1-d4-kv2", Side(), Side(tp=4), KV2, default=True, nightly=True,
           about="2 KV heads into decode TP 4: each head replicated on two consecutive decode ranks "
                 "(ranks 0-1 head 0, 2-3 head 1), every holder checked against the prefill's head"),
    _named("p2-d4-kv2", Side(tp=2), Side(tp=4), KV2, nightly=True,
           about="2 KV heads, prefill TP 2 (one head each) into decode TP 4 (each head on two decode ranks)"),
    _named("p1-d2-kv1", Side(), Side(tp=2), KV1, nightly=True,
           about="1 KV head into decode TP 2: both decode ranks hold it whole"),
    _named("p2-d1-kv1", Side(tp=2), Side(), KV1, nightly=True,
           about="1 KV head on both prefill TP ranks into decode TP 1 (sglang's decode takes it from both, "
                 "the reference from the lowest)"),
    _named("p2-d1-mla", Side(tp=2), Side(), MLA, nightly=True,
           about="MLA, prefill TP 2 into decode TP 1: every rank holds the whole latent KV"),
    _named("p2-d2-mla", Side(tp=2), Side(tp=2), MLA, nightly=True,
           about="MLA, TP 2 into TP 2: every rank holds the whole latent KV; sglang's decode rank r "
                 "takes it from prefill rank r"),
)}


def topology(name: str) -> Topology:
    """The named topology; KeyError naming the known ones."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise KeyError(f"unknown topology {name!r}; known: {', '.join(TOPOLOGIES)}") from None


def default_set() -> list[Topology]:
    return [t for t in TOPOLOGIES.values() if t.default]


def with_model(t: Topology, **changes) -> Topology:
    """``t`` with its model shape changed (a test's or a generator's variant)."""
    return replace(t, model=replace(t.model, **changes))


# ---- ranks of a started role -------------------------------------------------------------------

def rank_heads(total: int, tp: int, tp_rank: int, mla: bool) -> tuple[int, int]:
    """(first global KV head, heads) attention TP rank ``tp_rank`` of ``tp`` holds of ``total``
    KV heads, as sglang shards them: each rank holds ``max(1, total // tp)`` heads
    (``ModelConfig.get_num_kv_heads``, sglang/srt/configs/model_config.py), so with at least
    as many heads as ranks an even share, rank r from head ``r * share``; with more ranks than
    heads every head is replicated on ``tp // total`` consecutive ranks and rank r holds head
    ``r // (tp // total)`` (``QKVParallelLinear``'s ``tp_rank // num_kv_head_replicas``,
    sglang/srt/layers/linear.py; the disaggregation backends slice by the same map,
    ``compute_head_slice_params`` in sglang/srt/disaggregation/common/staging_buffer.py).
    MLA: the one latent head, whole on every rank.  A replicated head's bytes are the same on
    every rank that holds it, so each holder's pool is checked against the same source bytes
    (harness.role.pattern)."""
    if mla:
        return 0, 1
    if tp <= total:
        share = total // tp
        return tp_rank * share, share
    return tp_rank // (tp // total), 1


def rank_name(role: str, tp_rank: int, kind: str = "tp") -> str:
    """The role process of attention TP rank ``tp_rank`` (``kind`` "pp": of PP stage ``tp_rank``;
    "dp": of DP engine ``tp_rank``) of ``role``: rank 0 is the role itself."""
    return role if tp_rank == 0 else f"{role}.{kind}{tp_rank}"


def stage_layouts(layout: Layout, pp: int) -> list[Layout]:
    """Each of ``pp`` pipeline stages' layout of a prefill whose scenario layout is ``layout``:
    sglang's default layer split (:func:`default_pp_split`), the draft layers on the last stage."""
    split, start, out = default_pp_split(layout.num_layers, pp), 0, []
    for s, n in enumerate(split):
        out.append(replace(layout, stage_start=start, stage_end=start + n,
                           draft_layers=layout.draft_layers if s == pp - 1 else 0))
        start += n
    return out


def group_layouts(layout: Layout, tp: int, kv_heads: int = 0, head_bytes: int = 0) -> list[Layout]:
    """Each of ``tp`` ranks' layout for a role whose scenario gave ``layout``: the same layers,
    stage, pages and aux; of the model's ``kv_heads`` KV heads (0: the layout's) of
    ``head_bytes`` bytes per token (0: the layout's), the rank's share (:func:`rank_heads`)."""
    total = kv_heads or layout.model_kv_heads
    per_head = head_bytes or layout.page_bytes // (layout.page_size * layout.kv_heads)
    out = []
    for r in range(tp):
        start, count = rank_heads(total, tp, r, layout.mla)
        out.append(replace(layout, kv_heads=count, total_kv_heads=1 if layout.mla else total, head_start=start,
                           page_bytes=layout.page_size * count * per_head))
    return out


def sources(prefill_ranks: list[Layout], decode: Layout) -> list[int]:
    """Which prefill TP ranks a decode rank takes its KV from (indices into ``prefill_ranks``,
    one PP stage's ranks): for each KV head the decode rank holds, the lowest rank holding it,
    so every head comes from exactly one rank (MLA: rank 0, every rank holds the whole latent)."""
    chosen: list[int] = []
    for head in range(decode.head_start, decode.head_start + decode.kv_heads):
        rank = next((i for i, p in enumerate(prefill_ranks) if p.head_start <= head < p.head_start + p.kv_heads), None)
        if rank is not None and rank not in chosen:
            chosen.append(rank)
    return sorted(chosen)


def apply(steps: list, t: Topology) -> list:
    """``steps`` run on topology ``t``: its StartRoles start every prefill and decode as a
    group of ``t``'s TP ranks, of ``t``'s KV heads, its prefill PP stages and each side's DP
    engines.  An MLA model makes the scenario's layouts MLA (one KV buffer per layer, one
    latent head on every rank; the managers are started as MLA backends); an MLA scenario
    layout stays MLA on any topology.  ``p1-d1`` changes nothing."""
    from harness.spec.steps import StartRoles

    mla = t.model.attention == "MLA"
    if (t.prefill.tp, t.decode.tp, t.prefill.pp, t.prefill.dp, t.decode.dp) == (1, 1, 1, 1, 1) and not mla:
        return list(steps)
    heads = {"kv_heads": t.model.kv_heads, "head_bytes": t.model.head_bytes} if max(t.prefill.tp, t.decode.tp) > 1 else {}

    def model_layout(layout: Layout | None) -> Layout | None:
        return replace(layout, mla=True) if mla and layout is not None else layout

    return [replace(step, tp_ranks=(t.prefill.tp, t.decode.tp), pp_stages=t.prefill.pp,
                    dp_ranks=(t.prefill.dp, t.decode.dp), layout=model_layout(step.layout),
                    decode_layout=model_layout(step.decode_layout), **heads)
            if isinstance(step, StartRoles) else step for step in steps]


TOPOLOGY_SEP = "@"  # a scenario run on another topology than p1-d1 is SCENARIO@TOPOLOGY


def on_topology(scenario, t: Topology):
    """``scenario`` (harness.spec.scenario.Scenario) run on ``t``: the same checks, its steps
    through :func:`apply`, its id ``SCENARIO@TOPOLOGY`` (the scenario itself for ``p1-d1``)."""
    if t.name == "p1-d1":
        return scenario
    base_steps = scenario.steps
    return replace(scenario, id=f"{scenario.id}{TOPOLOGY_SEP}{t.name}", title=f"{scenario.title} [{t.name}]",
                   steps=lambda seed: apply(base_steps(seed), t))
