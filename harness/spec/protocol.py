"""The protocol's own vocabulary: KVPoll statuses and one side's KV pool layout.

Spelled out here so that nothing on the driver side imports sglang.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any

#: the name of pdconform's own implementation of the protocol (backends/reference): the oracle
#: every other implementation's history is diffed against (harness.judge.divergence)
REFERENCE = "reference"


class KVPoll(IntEnum):
    """A room's status on one side, with sglang's names and values
    (``sglang/srt/disaggregation/base/conn.py``, ``KVPoll``): Bootstrapping ->
    WaitingForInput -> Transferring -> Success | Failed (docs/protocol.md, R-TERM-1)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


#: draft-model KV layer d is numbered DRAFT_BASE + d (a band above any model's layers, as
#: sglang's build_kv_layer_ids does), so a draft page can never pass for a main-layer page
DRAFT_BASE = 2048


def layer_name(layer: int) -> str:
    """``layer 3`` or, for the draft band, ``draft layer 0``."""
    return f"draft layer {layer - DRAFT_BASE}" if layer >= DRAFT_BASE else f"layer {layer}"


#: the statuses a room stays in until ``clear()`` (R-TERM-1)
TERMINAL = (KVPoll.Success, KVPoll.Failed)


def kvpoll_name(value: int | None) -> str:
    """The name of a KVPoll value (``"None"`` for no status, the number for one sglang does not define)."""
    if value is None:
        return "None"
    try:
        return KVPoll(value).name
    except ValueError:
        return str(value)


@dataclass(frozen=True)
class Layout:
    """KV pool layout of one side.

    ``num_layers`` model layers (this side holds all of them for PP = 1);
    ``num_pages`` pages per buffer; ``page_size`` tokens per page;
    ``page_bytes`` bytes per page per buffer (multiple of 8); ``aux_slots`` aux
    slots of ``aux_bytes`` bytes each; ``mla`` selects one KV buffer per layer
    (MLA) instead of separate K and V buffers (MHA).  ``stage_start``/``stage_end``:
    the pipeline stage this side holds (``stage_end`` None: to the last layer);
    ``draft_layers``: draft-model KV layers appended after the main ones, as
    sglang's schedulers append them to ``KVArgs.kv_data_ptrs``.  ``kv_heads``: the KV heads
    this rank holds, global heads ``head_start`` .. ``head_start + kv_heads - 1`` of the
    model's ``total_kv_heads`` (0: the rank holds them all); a page is ``page_size`` tokens,
    each its heads one after another (harness.spec.topology.rank_layout).
    """

    num_layers: int = 3
    num_pages: int = 16
    page_size: int = 4
    page_bytes: int = 256
    aux_slots: int = 4
    aux_bytes: int = 64
    mla: bool = False
    kv_heads: int = 1
    stage_start: int = 0
    stage_end: int | None = None
    draft_layers: int = 0
    total_kv_heads: int = 0
    head_start: int = 0

    @property
    def main_layers(self) -> range:
        """The model layers of this side's stage."""
        return range(self.stage_start, self.num_layers if self.stage_end is None else self.stage_end)

    @property
    def model_kv_heads(self) -> int:
        """The model's KV heads, all ranks together."""
        return self.total_kv_heads or self.kv_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
