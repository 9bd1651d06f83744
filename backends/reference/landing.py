"""Where the reference decode lands a prefill rank's WRITE: the plan's buffers, and with
attention TP the KV heads both ranks hold (R-LAYOUT-1, R-LAYOUT-2).

Pure functions over the decode's pools (``[(BufferSpec, [pages, page_bytes] uint8 tensor)]``,
harness.role.pools) and layouts (harness.spec.protocol.Layout); the adapter calls them on
its control thread.
"""

from __future__ import annotations

from typing import Any

from harness.role import pattern
from harness.spec.layout_plan import Plan, Rejection, plan_pair
from harness.spec.protocol import Layout


def chosen_ranks(ranks: list[dict], mine: Layout) -> list[dict]:
    """Of a prefill's registered ranks (``{"pp_rank", "tp_rank", "endpoint", "layout"}``),
    those a decode rank of layout ``mine`` takes KV from: per pipeline stage, for each KV head
    it holds, the lowest TP rank holding it (harness.spec.topology.sources); a stage whose
    layouts cannot be read keeps its ranks (their plans reject them, visibly)."""
    from harness.spec.topology import sources

    chosen = []
    for pp_rank in sorted({r.get("pp_rank", 0) for r in ranks}):
        stage = [r for r in ranks if r.get("pp_rank", 0) == pp_rank]
        try:
            layouts = [Layout(**r["layout"]) for r in stage]
        except TypeError:
            chosen += stage
            continue
        chosen += [stage[i] for i in sources(layouts, mine)] or stage[:1]
    return chosen


def apply_write(buffers: list[tuple[pattern.BufferSpec, Any]], mine: Layout, plan: Plan | None,
                source: Layout | None, aux: bool, dst: tuple[int, ...], payload: bytes) -> tuple[bool, str]:
    """Land one WRITE of ``len(dst)`` pages of every planned buffer (``plan``'s order; aux:
    the aux buffer) from a prefill rank of layout ``source``: whole pages when it holds this
    rank's KV heads, else each token's shared heads.  (ok, why not)."""
    import torch

    targets = [(s, t) for s, t in buffers if (s.kind == pattern.AUX) == aux]
    if plan is not None:
        kv = [b for b in buffers if b[0].kind != pattern.AUX]
        targets = [kv[p.dst] for p in plan.pairs]
    row = targets[0][1].shape[1] if targets else 0
    sliced = source is not None and (source.head_start, source.kv_heads) != (mine.head_start, mine.kv_heads)
    if sliced:
        row = source.page_bytes  # a prefill rank of other KV heads: its pages hold its heads' bytes
    if len(payload) != row * len(dst) * len(targets):
        return False, f"payload of {len(payload)} bytes does not fit {len(dst)} pages x {len(targets)} buffers"
    if any(not 0 <= d < t.shape[0] for d in dst for _, t in targets):
        return False, f"destination {dst} outside the pool"
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(len(targets), len(dst), row)
    for i, (_, tensor) in enumerate(targets):
        if sliced:
            land_heads(tensor, list(dst), data[i], mine, source)
        else:
            tensor[list(dst)] = data[i].to(tensor.device)
    return True, ""


def shared_heads(tensor, pages, mine: Layout, source: Layout):
    """The KV heads ``mine`` and ``source`` both hold, global ``[first, last)``, with
    ``tensor`` (a pool of ``mine``) viewed as ``[pages, tokens, heads, bytes]`` and the slice of
    those heads of ``pages`` (a ``[n, page_bytes]`` payload of ``source``'s heads);
    None when they hold none in common."""
    size = mine.page_size
    head = mine.page_bytes // (size * mine.kv_heads)
    first = max(mine.head_start, source.head_start)
    last = min(mine.head_start + mine.kv_heads, source.head_start + source.kv_heads)
    if first >= last:
        return None
    src = pages.view(pages.shape[0], size, source.kv_heads, head)
    return (first, last, tensor.view(tensor.shape[0], size, mine.kv_heads, head),
            src[:, :, first - source.head_start:last - source.head_start])


def land_heads(tensor, dst: list[int], pages, mine: Layout, source: Layout) -> None:
    """Write the KV heads ``mine`` and ``source`` both hold: each token's slice of a
    ``[len(dst), page_bytes]`` payload of ``source``'s heads into the same heads of ``tensor``'s
    pages ``dst``."""
    shared = shared_heads(tensor, pages, mine, source)
    if shared is not None:
        first, last, view, src = shared
        view[dst, :, first - mine.head_start:last - mine.head_start] = src.to(view.device)


def layout_plan(prefill: Layout, mine: Layout) -> Plan | Rejection:
    """The plan of a decode of layout ``mine`` for a prefill rank of layout ``prefill``, or its
    rejection: the spec's rule, harness.spec.layout_plan.plan_pair (R-LAYOUT-2)."""
    return plan_pair(prefill, mine)
