"""Generated KV layouts and their judgement against the layout planning rules (R-LAYOUT-2).

A layout *spec* is a plain dict (it crosses the role socket)::

    {"attention": "MHA" | "MLA", "num_layers": L, "stages": S, "bounds": [0, ..., L],
     "prefill": [start, end, draft_layers], "decode": [start, end, draft_layers]}

The prefill's ``S`` pipeline stages are ``[bounds[i], bounds[i + 1])``; ``prefill`` is the
one whose planning is judged (:func:`stage_role_layouts` gives all of them, for a
multi-stage transfer, with the draft layers on the last stage); the decode holds
either the whole model (one stage) or the same stage; draft KV is on the decode
only, on both or on neither.  Buffers are numbered the way sglang's schedulers
fill ``KVArgs.kv_data_ptrs`` (see :mod:`harness.spec.layout_plan`).

An adapter's ``plan_layouts`` returns, per spec, ``{"pairs": [[src, dst], ...]}``
(the prefill buffer index each decode buffer index receives) or
``{"rejected": reason}`` (the implementation refuses it, visibly).
harness.judge.layout_check compares that with the planning rules (harness.spec.layout_plan) and names the first
difference by buffer identity.
"""

from __future__ import annotations

from harness.spec.layout_plan import LayoutSpec, SideLayout, side_buffers


def layout_specs():
    """A hypothesis strategy of any layout R-LAYOUT-2 covers: MHA/MLA, 1-8 layers in 1-4
    prefill stages, the decode with one stage or the same stages, draft KV on decode only,
    both or neither.  hypothesis is imported here, not with the module: the judge reads this
    module in every ``pdconform`` process and hypothesis costs about 0.2 s to import."""
    from hypothesis import strategies as st

    return st.composite(_draw_layout_spec)()


def _draw_layout_spec(draw) -> dict:
    """One layout spec drawn for :func:`layout_specs`."""
    from hypothesis import strategies as st

    attention = draw(st.sampled_from(["MHA", "MLA"]))
    num_layers = draw(st.integers(1, 8))
    stages = draw(st.integers(1, min(4, num_layers)))
    cuts = sorted(draw(st.lists(st.integers(1, num_layers - 1), min_size=stages - 1, max_size=stages - 1,
                                unique=True))) if stages > 1 else []
    bounds = [0, *cuts, num_layers]
    index = draw(st.integers(0, stages - 1))
    start, end = bounds[index], bounds[index + 1]
    same_stages = draw(st.booleans())
    decode_start, decode_end = (start, end) if same_stages else (0, num_layers)
    draft_mode = draw(st.sampled_from(["neither", "decode-only", "both"]))
    draft = draw(st.integers(1, 2))
    prefill_draft = draft if draft_mode == "both" else 0
    decode_draft = 0 if draft_mode == "neither" else draft
    return {"attention": attention, "num_layers": num_layers, "stages": stages, "bounds": bounds,
            "prefill": [start, end, prefill_draft], "decode": [decode_start, decode_end, decode_draft]}


def to_spec(spec: dict) -> LayoutSpec:
    p, d = spec["prefill"], spec["decode"]
    return LayoutSpec(spec["attention"], spec["num_layers"], SideLayout(*p), SideLayout(*d))


def buffer_counts(spec: dict) -> tuple[int, int]:
    """(prefill, decode) numbers of KV buffers."""
    s = to_spec(spec)
    return len(side_buffers(s.attention, s.prefill)), len(side_buffers(s.attention, s.decode))


def describe(spec: dict) -> str:
    """One line a person can read: ``MHA, 6 layers, prefill stage [2, 4) of 3, decode [0, 6), draft decode-only 1``."""
    p, d = spec["prefill"], spec["decode"]
    draft = ("neither" if not d[2] else f"decode-only {d[2]}" if not p[2] else f"both {p[2]}")
    decode = "the same stage" if (d[0], d[1]) == (p[0], p[1]) and spec["stages"] > 1 else f"[{d[0]}, {d[1]})"
    return (f"{spec['attention']}, {spec['num_layers']} layers, prefill stage [{p[0]}, {p[1]}) of {spec['stages']}, "
            f"decode {decode}, draft KV {draft}")


def single_stage_specs():
    """Layouts with one prefill stage (the ones the role processes can transfer for
    real today: a multi-stage prefill needs one process per stage), with draft KV on
    the decode only or on both."""
    return layout_specs().filter(lambda s: s["stages"] == 1 and s["decode"][2] > 0)


def whole_model_decode(spec: dict) -> bool:
    """The decode holds every main layer (the decode a multi-stage prefill sends to)."""
    return spec["decode"][:2] == [0, spec["num_layers"]]


def multi_stage_specs():
    """Layouts whose prefill has several pipeline stages and whose decode holds the whole
    model, with or without draft KV."""
    return layout_specs().filter(lambda s: s["stages"] > 1 and whole_model_decode(s))


def stage_role_layouts(spec: dict):
    """([Layout of each prefill stage], decode Layout) for a multi-stage spec: stage i holds
    ``[bounds[i], bounds[i + 1])``; the prefill's draft layers are on its last stage, where
    sglang's draft worker runs (3-page-per-room pools, 16 pages)."""
    from dataclasses import replace

    one, decode = role_layouts(spec)
    bounds, draft = spec["bounds"], spec["prefill"][2]
    stages = [replace(one, stage_start=a, stage_end=b, draft_layers=draft if b == bounds[-1] else 0)
              for a, b in zip(bounds, bounds[1:])]
    return stages, decode


def role_layouts(spec: dict):
    """(prefill Layout, decode Layout) for a spec (3-page-per-room pools, 16 pages)."""
    from harness.spec.protocol import Layout

    def side(start_end_draft):
        start, end, draft = start_end_draft
        return Layout(num_layers=spec["num_layers"], mla=spec["attention"] == "MLA", stage_start=start,
                      stage_end=end, draft_layers=draft)

    return side(spec["prefill"]), side(spec["decode"])


def sent_layers(spec: dict) -> tuple[int, ...]:
    """Tag layers whose pages the prefill sends: its stage's layers and its draft layers."""
    from harness.spec.protocol import DRAFT_BASE

    start, end, draft = spec["prefill"]
    return tuple(range(start, end)) + tuple(DRAFT_BASE + d for d in range(draft))


def transfer_steps(spec: dict, prefill: str, decode: str, seed: int, stages: tuple[str, ...] = ()) -> list:
    """One room from creation to Success between ``prefill`` and ``decode``, then the
    byte check for ``spec`` (R-LAYOUT-1/2): the sender is opened before the receiver, as
    OpenRoom does.  ``stages``: the roles of a multi-stage prefill (``prefill`` is stage
    0); every stage opens, is sent and concludes the room, and the decode must get every
    layer."""
    import random

    from harness.spec.protocol import DRAFT_BASE, KVPoll
    from harness.spec.steps import AwaitStatus, InitSender, OpenRoom, OpenSender, RequestKV, SendChunk, VerifyPools

    rng = random.Random(seed)
    room = rng.randrange(1, 2**62)
    src = tuple(sorted(rng.sample(range(16), 3)))
    dst = tuple(rng.sample(range(16), 3))
    aux_src, aux_dst = rng.randrange(4), rng.randrange(4)
    done = (KVPoll.Success, KVPoll.Failed)
    stages = stages or (prefill,)
    layers = sent_layers(spec) if len(stages) == 1 else \
        tuple(range(spec["num_layers"])) + tuple(DRAFT_BASE + d for d in range(spec["prefill"][2]))
    return [*[OpenSender(room, prefill=stage) for stage in stages],
            OpenRoom(room, prefill=stages[0], decode=decode, open_sender=False),
            RequestKV(room, dst, aux_dst, decode=decode),
            *[AwaitStatus(room, stage, (KVPoll.WaitingForInput, KVPoll.Failed)) for stage in stages],
            *[step for stage in stages for step in (InitSender(room, len(src), aux_src, prefill=stage),
                                                    SendChunk(room, src, prefill=stage))],
            *[AwaitStatus(room, stage, done) for stage in stages], AwaitStatus(room, decode, done),
            VerifyPools(tuple(zip(src, dst)), ((aux_src, aux_dst),), decode=decode, sent_layers=layers)]
