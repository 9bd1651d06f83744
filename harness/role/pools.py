"""KV and aux pools filled with the :mod:`harness.role.pattern` tags, for any role adapter.

Buffer order follows sglang's ``KVArgs.kv_data_ptrs`` for the side's pipeline
stage: MHA ``[K of each layer..., V of each layer..., draft K..., draft V...]``,
MLA ``[KV of each layer..., draft KV...]`` (draft layer d tagged as layer
``DRAFT_BASE + d``); then one aux buffer.
"""

from __future__ import annotations

from typing import Any

from harness.role import pattern
from harness.spec.protocol import DRAFT_BASE, Layout


def pattern_pools(side: int, layout: Layout) -> tuple[list[tuple[pattern.BufferSpec, Any]], tuple[pattern.BufferSpec, Any]]:
    """(KV buffers, aux buffer) for ``side`` (pattern.PREFILL or pattern.DECODE): each a
    (BufferSpec, ``[pages, page_bytes]`` uint8 tensor) pair."""
    main = list(layout.main_layers)
    draft = [DRAFT_BASE + d for d in range(layout.draft_layers)]
    kinds = (pattern.K,) if layout.mla else (pattern.K, pattern.V)
    heads = pattern.Heads.of(layout)  # the KV heads this rank holds (None: all of them)
    specs = [pattern.BufferSpec(kind, layer, heads) for kind in kinds for layer in main]
    specs += [pattern.BufferSpec(kind, layer, heads) for kind in kinds for layer in draft]
    kv = [(s, pattern.pattern(side, s.kind, s.layer, layout.num_pages, layout.page_bytes, s.heads)) for s in specs]
    aux_spec = pattern.BufferSpec(pattern.AUX, 0)
    return kv, (aux_spec, pattern.pattern(side, pattern.AUX, 0, layout.aux_slots, layout.aux_bytes))
