"""KV and aux pools filled with the :mod:`harness.pattern` tags, for any role adapter.

Buffer order follows sglang's ``KVArgs.kv_data_ptrs`` for one pipeline stage
holding every layer: MHA ``[K of each layer..., V of each layer...]``, MLA one
buffer per layer; then one aux buffer.
"""

from __future__ import annotations

from typing import Any

from harness import pattern
from harness.adapter import Layout


def pattern_pools(side: int, layout: Layout) -> tuple[list[tuple[pattern.BufferSpec, Any]], tuple[pattern.BufferSpec, Any]]:
    """(KV buffers, aux buffer) for ``side`` (pattern.PREFILL or pattern.DECODE): each a
    (BufferSpec, ``[pages, page_bytes]`` uint8 tensor) pair."""
    specs = [pattern.BufferSpec(pattern.K, layer) for layer in range(layout.num_layers)]
    if not layout.mla:
        specs += [pattern.BufferSpec(pattern.V, layer) for layer in range(layout.num_layers)]
    kv = [(s, pattern.pattern(side, s.kind, s.layer, layout.num_pages, layout.page_bytes)) for s in specs]
    aux_spec = pattern.BufferSpec(pattern.AUX, 0)
    return kv, (aux_spec, pattern.pattern(side, pattern.AUX, 0, layout.aux_slots, layout.aux_bytes))
