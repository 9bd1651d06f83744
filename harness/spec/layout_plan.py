"""The layout planning rules (R-LAYOUT-2): which prefill buffer goes to which decode buffer.

Pure and declarative (requirement R-LAYOUT-2 in docs/protocol.md).  A side's
KV buffers are listed the way sglang's schedulers fill ``KVArgs.kv_data_ptrs``
(``disaggregation/prefill.py`` and ``decode.py``):

* MHA: ``[K of each main layer..., V of each main layer..., K of each draft layer..., V of each draft layer...]``
* MLA: ``[KV of each main layer..., KV of each draft layer...]``

where the main layers are the side's pipeline stage ``[start_layer, end_layer)``.
Buffers are matched by *identity* (kind, layer, draft or not), never by
position, so a pipeline stage or draft layers shifting the positions cannot
make the planner pair the wrong layers.  A layout the planner cannot serve is a
:class:`Rejection` with the reason, never a partial plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

Attention = Literal["MHA", "MLA"]


@dataclass(frozen=True)
class SideLayout:
    """One side's share of the model: main layers ``[start_layer, end_layer)`` (its PP
    stage) and ``draft_layers`` draft-model KV layers (0 for none)."""

    start_layer: int
    end_layer: int
    draft_layers: int = 0

    @property
    def main_layers(self) -> range:
        return range(self.start_layer, self.end_layer)


@dataclass(frozen=True)
class LayoutSpec:
    """A PD pair's layout: attention kind, the model's main layer count, each side's
    stage and draft layers, page size (tokens) and KV heads per rank."""

    attention: Attention
    num_layers: int
    prefill: SideLayout
    decode: SideLayout
    page_size: int = 4
    kv_heads: int = 1


@dataclass(frozen=True, order=True)
class BufferId:
    """What a buffer holds: ``kind`` K, V or KV (MLA), model ``layer`` (or draft
    layer index when ``draft``)."""

    draft: bool
    layer: int
    kind: str

    def describe(self) -> str:
        return f"{'draft ' if self.draft else ''}layer {self.layer} {self.kind}"


@dataclass(frozen=True)
class BufferPair:
    """Copy prefill buffer ``src`` (index into the prefill's list) into decode buffer ``dst``."""

    src: int
    dst: int
    buffer: BufferId


@dataclass(frozen=True)
class Plan:
    pairs: tuple[BufferPair, ...]


@dataclass(frozen=True)
class Rejection:
    reason: str


def side_buffers(attention: Attention, side: SideLayout) -> list[BufferId]:
    """The side's KV buffers in ``KVArgs.kv_data_ptrs`` order (see module docstring)."""
    main = list(side.main_layers)
    draft = list(range(side.draft_layers))
    if attention == "MLA":
        return [BufferId(False, layer, "KV") for layer in main] + [BufferId(True, d, "KV") for d in draft]
    return (
        [BufferId(False, layer, "K") for layer in main]
        + [BufferId(False, layer, "V") for layer in main]
        + [BufferId(True, d, "K") for d in draft]
        + [BufferId(True, d, "V") for d in draft]
    )


def validate(spec: LayoutSpec) -> str | None:
    """Why ``spec`` is not a layout at all (bad ranges, counts), or None."""
    if spec.attention not in ("MHA", "MLA"):
        return f"unknown attention kind {spec.attention!r} (MHA or MLA)"
    if spec.num_layers <= 0:
        return f"num_layers must be positive, got {spec.num_layers}"
    for name, side in (("prefill", spec.prefill), ("decode", spec.decode)):
        if not 0 <= side.start_layer < side.end_layer <= spec.num_layers:
            return (f"{name} stage [{side.start_layer}, {side.end_layer}) is not a non-empty range "
                    f"inside the model's {spec.num_layers} layers")
        if side.draft_layers < 0:
            return f"{name} draft_layers must be >= 0, got {side.draft_layers}"
    if spec.page_size <= 0 or spec.kv_heads <= 0:
        return "page_size and kv_heads must be positive"
    return None


def plan(spec: LayoutSpec) -> Union[Plan, Rejection]:
    """Pair every prefill buffer with the decode buffer of the same identity.

    Rejected (with the reason) when: the spec is invalid; the decode's stage does
    not hold every main layer of the prefill's stage; the prefill sends draft KV
    that the decode has no buffers for, or the two sides' draft layer counts
    differ.  Decode draft buffers with no prefill counterpart stay untouched
    (the decode computes its own draft KV).
    """
    problem = validate(spec)
    if problem:
        return Rejection(problem)
    src = side_buffers(spec.attention, spec.prefill)
    dst = side_buffers(spec.attention, spec.decode)
    missing = [layer for layer in spec.prefill.main_layers if layer not in spec.decode.main_layers]
    if missing:
        return Rejection(
            f"decode stage [{spec.decode.start_layer}, {spec.decode.end_layer}) does not hold prefill "
            f"layers {missing[0]}..{missing[-1]} of stage [{spec.prefill.start_layer}, {spec.prefill.end_layer})"
        )
    if spec.prefill.draft_layers and spec.decode.draft_layers != spec.prefill.draft_layers:
        return Rejection(
            f"prefill sends {spec.prefill.draft_layers} draft KV layer(s) but the decode has "
            f"{spec.decode.draft_layers}"
        )
    where = {buffer: index for index, buffer in enumerate(dst)}
    pairs = tuple(BufferPair(i, where[buffer], buffer) for i, buffer in enumerate(src))
    return Plan(pairs)


def plan_pair(prefill, decode) -> Union[Plan, Rejection]:
    """The buffer pairs a decode rank of layout ``decode`` receives from a prefill rank of
    layout ``prefill`` (harness.spec.protocol.Layout each, drawn on their own), or why the
    pair cannot be served (R-LAYOUT-2): a different attention kind, model layer count, page
    geometry, aux size or head size, then :func:`plan` by buffer identity (stages, draft KV)."""
    def head_bytes(layout) -> int:  # of one KV head of one token
        return layout.page_bytes // (layout.page_size * layout.kv_heads)

    for name, get in (("mla", lambda x: x.mla), ("num_layers", lambda x: x.num_layers),
                      ("page_size", lambda x: x.page_size), ("aux_bytes", lambda x: x.aux_bytes),
                      ("total_kv_heads", lambda x: x.model_kv_heads), ("head_bytes", head_bytes)):
        if get(prefill) != get(decode):
            return Rejection(f"prefill {name}={get(prefill)} but decode {name}={get(decode)}")

    def side(layout) -> SideLayout:
        return SideLayout(layout.main_layers.start, layout.main_layers.stop, layout.draft_layers)

    return plan(LayoutSpec("MLA" if decode.mla else "MHA", decode.num_layers, side(prefill), side(decode),
                           decode.page_size, decode.kv_heads))
