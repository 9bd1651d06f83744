"""KV and aux pools filled with the :mod:`harness.role.pattern` tags, for any role adapter.

Buffer order follows sglang's ``KVArgs.kv_data_ptrs`` for the side's pipeline
stage: MHA ``[K of each layer..., V of each layer..., draft K..., draft V...]``,
MLA ``[KV of each layer..., draft KV...]`` (draft layer d tagged as layer
``DRAFT_BASE + d``); then one aux buffer.
"""

from __future__ import annotations

import os
from typing import Any

from harness.role import pattern
from harness.role.pool_device import pool_device
from harness.spec.protocol import DRAFT_BASE, Layout

# Test-only planted state (tests/test_pair.py): refill() leaves the pools as the last program
# left them, the reuse leak the alone-vs-pair comparison exists to catch.
PLANT_STALE_POOLS_ENV = "PDCONFORM_TEST_PLANT_STALE_POOLS"


def pattern_pools(side: int, layout: Layout) -> tuple[list[tuple[pattern.BufferSpec, Any]], tuple[pattern.BufferSpec, Any]]:
    """(KV buffers, aux buffer) for ``side`` (pattern.PREFILL or pattern.DECODE): each a
    (BufferSpec, ``[pages, page_bytes]`` uint8 tensor) pair, on :func:`pool_device`."""
    main = list(layout.main_layers)
    draft = [DRAFT_BASE + d for d in range(layout.draft_layers)]
    kinds = (pattern.K,) if layout.mla else (pattern.K, pattern.V)
    heads = pattern.Heads.of(layout)  # the KV heads this rank holds (None: all of them)
    specs = [pattern.BufferSpec(kind, layer, heads) for kind in kinds for layer in main]
    specs += [pattern.BufferSpec(kind, layer, heads) for kind in kinds for layer in draft]
    device = pool_device()
    kv = [(s, pattern.pattern(side, s.kind, s.layer, layout.num_pages, layout.page_bytes, s.heads).to(device))
          for s in specs]
    aux_spec = pattern.BufferSpec(pattern.AUX, 0)
    return kv, (aux_spec, pattern.pattern(side, pattern.AUX, 0, layout.aux_slots, layout.aux_bytes).to(device))


def refill(buffers: list[tuple[pattern.BufferSpec, Any]], side: int, layout: Layout) -> int:
    """Write ``side``'s pattern into ``buffers`` again, in place (the tensors keep their memory,
    so a transfer engine's registrations stay valid): what :func:`pattern_pools` gave ``buffers``
    at the start, for a long-lived role starting its next program (harness.drive.pair).  The
    number of buffers refilled; ValueError when ``buffers`` are not this layout's.  With
    :data:`PLANT_STALE_POOLS_ENV` set (a planted bug, for tests) nothing is written: 0."""
    if os.environ.get(PLANT_STALE_POOLS_ENV):
        return 0
    kv, aux = pattern_pools(side, layout)
    fresh = kv + [aux]
    if [spec for spec, _ in fresh] != [spec for spec, _ in buffers]:
        raise ValueError("these buffers are not the pools of this side and layout")
    for (_, tensor), (_, values) in zip(buffers, fresh):
        tensor.copy_(values.to(tensor.device))
    return len(fresh)
