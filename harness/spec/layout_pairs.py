"""Layout pairs with each side drawn on its own: what two sglang configs can put on the two
ends of a transfer (R-LAYOUT-2).

harness.spec.layouts draws *matched* pairs (one model, the decode holding the prefill's
stage or the whole model); here every field of the decode is drawn independently of the
prefill's (hypothesis shrinks a field towards the prefill's value, so a shrunk pair differs
in as little as it must): attention kind, model layers, draft KV layers, page size
(tokens), KV heads and bytes per head.  Both sides hold their whole
model (one stage, one role each): only pairs two sglang servers can be started as are drawn.
A decode that holds one pipeline stage of its model runs PP > 1 (the PP size its stage
implies), which needs every stage of that decode started as a PP group; pdconform starts a
decode as one process without PP (``start_decode`` takes no PP), so such a decode would be a
configuration sglang cannot have (the B15 audit: a stage [1, 2) of a 2-layer model started
with PP 1).  sglang refuses a PP > 1 decode in front of a PP-1 prefill anyway, at bootstrap
(``common/conn.py`` ``_resolve_rank_mapping``: decode PP equal to the prefill's or 1).  The
spec's planner (harness.spec.layout_plan.plan_pair) says for each pair where every buffer
must land, or that it must be refused.

A pair *spec* is a plain dict (it goes into the history)::

    {"prefill": SIDE, "decode": SIDE}
    SIDE = {"attention": "MHA" | "MLA", "num_layers": L, "stage": [0, L],
            "draft_layers": D, "page_size": P, "kv_heads": H, "head_bytes": B}

(``stage`` is always the whole model, see above; it stays in the dict so that the history,
:func:`layout` and :func:`describe` keep one shape.)
"""

from __future__ import annotations

from harness.spec.layout_plan import Plan, Rejection, plan_pair
from harness.spec.protocol import DRAFT_BASE, KVPoll, Layout

NUM_PAGES = 16
BOUND_S = 4.0  # each wait of a pair's transfer (seconds): its roles run with the short timeouts of ENV
#: the pair roles' timeouts (seconds): a refused room must fail visibly on both sides within them
ENV = (("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "2"), ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "3"))


def _side_fields(draw, like: dict | None) -> dict:
    """One side's fields; with ``like`` (the prefill's), each field is either the prefill's
    value or any other (so hypothesis shrinks a decode field towards the prefill's)."""
    from hypothesis import strategies as st

    def field(name, strategy):  # a coin per field: the prefill's value (what a shrink falls back to) or any
        return draw(strategy) if like is None or draw(st.booleans()) else like[name]

    attention = field("attention", st.sampled_from(["MHA", "MLA"]))
    num_layers = field("num_layers", st.integers(1, 4))
    heads = 1 if attention == "MLA" else field("kv_heads", st.sampled_from([1, 2]))
    # the whole model on each side: a decode holding one stage would run PP > 1 (module docstring)
    return {"attention": attention, "num_layers": num_layers, "stage": [0, num_layers],
            "draft_layers": field("draft_layers", st.integers(0, 2)),
            "page_size": field("page_size", st.sampled_from([4, 2])), "kv_heads": heads,
            "head_bytes": field("head_bytes", st.sampled_from([32, 64]))}


def pair_specs():
    """A hypothesis strategy of any pair of a whole-model prefill and a whole-model decode whose
    fields are drawn on their own (see the module docstring): two configurations sglang can be
    started with.  hypothesis is imported here, not with the module, which every ``pdconform``
    process reads through the judge (about 0.2 s of import)."""
    from hypothesis import strategies as st

    return st.composite(_draw_pair_spec)()


def _draw_pair_spec(draw) -> dict:
    """One pair spec drawn for :func:`pair_specs`."""
    prefill = _side_fields(draw, None)
    return {"prefill": prefill, "decode": _side_fields(draw, prefill)}


def layout(side: dict) -> Layout:
    """The role Layout of one side: ``NUM_PAGES`` pages of ``page_size`` tokens x heads x bytes."""
    return Layout(num_layers=side["num_layers"], num_pages=NUM_PAGES, page_size=side["page_size"],
                  page_bytes=side["page_size"] * side["kv_heads"] * side["head_bytes"], mla=side["attention"] == "MLA",
                  kv_heads=side["kv_heads"], stage_start=side["stage"][0], stage_end=side["stage"][1],
                  draft_layers=side["draft_layers"])


def expected(spec: dict) -> Plan | Rejection:
    """What the spec says of the pair: where every buffer lands, or why it is refused."""
    return plan_pair(layout(spec["prefill"]), layout(spec["decode"]))


def describe(spec: dict) -> str:
    """One line: ``prefill MHA 3 layers, draft 1, page 4, 2 heads x 32 B -> decode ...``."""
    def side(s: dict) -> str:
        stage = "" if s["stage"] == [0, s["num_layers"]] else f" stage [{s['stage'][0]}, {s['stage'][1]})"
        return (f"{s['attention']} {s['num_layers']} layers{stage}, draft {s['draft_layers']}, page {s['page_size']}, "
                f"{s['kv_heads']} heads x {s['head_bytes']} B")
    return f"prefill {side(spec['prefill'])} -> decode {side(spec['decode'])}"


def unstartable(spec: dict) -> str | None:
    """Why ``spec`` is not a pair two sglang servers can be started as, or None: each side
    must hold its whole model (a stage of it means PP > 1, which a lone role without PP is
    not; see the module docstring)."""
    for name in ("prefill", "decode"):
        side = spec[name]
        if side["stage"] != [0, side["num_layers"]]:
            return (f"the {name} holds stage [{side['stage'][0]}, {side['stage'][1]}) of {side['num_layers']} "
                    "layers, which sglang runs with PP > 1; a lone role without PP cannot be that server")
    return None


def transfer_steps(spec: dict, prefill: str, decode: str, seed: int) -> list:
    """One room between the pair's roles, every wait bounded by BOUND_S and none a must-come
    (a refusal or a hang here is this pair's outcome, not the cell's stall), then the byte
    check: the planned pages land where the spec says, or (refused) no page changes.  After
    the chunk the decode is read before the prefill, so that the time a decode's Failed is
    first seen is close to when it came (the judge holds a refusal to the waiting timeout,
    harness.judge.layout_pairs)."""
    import random

    from harness.spec.steps import AwaitStatus, InitSender, OpenRoom, OpenSender, RequestKV, SendChunk, VerifyPools

    rng = random.Random(seed)
    room = rng.randrange(1, 2**62)
    src, dst = tuple(sorted(rng.sample(range(NUM_PAGES), 3))), tuple(rng.sample(range(NUM_PAGES), 3))
    aux_src, aux_dst = rng.randrange(4), rng.randrange(4)
    done = (KVPoll.Success, KVPoll.Failed)
    p = spec["prefill"]
    served = isinstance(expected(spec), Plan)
    layers = tuple(range(*p["stage"])) + tuple(DRAFT_BASE + d for d in range(p["draft_layers"]))
    check = VerifyPools(tuple(zip(src, dst)), ((aux_src, aux_dst),), decode=decode, sent_layers=layers) if served \
        else VerifyPools((), (), decode=decode, settle_s=0.0)
    return [OpenSender(room, prefill=prefill),
            OpenRoom(room, prefill=prefill, decode=decode, open_sender=False),
            RequestKV(room, dst, aux_dst, decode=decode),
            AwaitStatus(room, prefill, (KVPoll.WaitingForInput, KVPoll.Failed), timeout_s=BOUND_S, must_come=False),
            InitSender(room, len(src), aux_src, prefill=prefill), SendChunk(room, src, prefill=prefill),
            AwaitStatus(room, decode, done, timeout_s=BOUND_S, must_come=False),
            AwaitStatus(room, prefill, done, timeout_s=BOUND_S, must_come=False), check]


def smaller_than(spec: dict):
    """Pairs no bigger than ``spec`` in any field (layers, draft, heads, head bytes, page size),
    the decode's fields still free to equal the prefill's: where a shrink looks for a pair
    that fails the same way."""
    from hypothesis import strategies as st

    def bounded(side: dict, like: dict | None):
        @st.composite
        def draw(d):
            def field(name, options):
                pool = st.sampled_from(sorted(set(options)))
                return d(st.one_of(st.just(like[name]), pool) if like else pool)
            num_layers = field("num_layers", range(1, side["num_layers"] + 1))
            attention = field("attention", ["MHA", side["attention"]])
            out = {"attention": attention, "num_layers": num_layers,
                   "draft_layers": field("draft_layers", range(0, side["draft_layers"] + 1)),
                   "page_size": field("page_size", [side["page_size"], 2]),
                   "kv_heads": 1 if attention == "MLA" else field("kv_heads", range(1, side["kv_heads"] + 1)),
                   "head_bytes": field("head_bytes", [32, side["head_bytes"]])}
            out["stage"] = [0, num_layers]  # whole models only, as pair_specs draws them
            return out
        return draw()

    return bounded(spec["prefill"], None).flatmap(
        lambda prefill: bounded(spec["decode"], prefill).map(lambda decode: {"prefill": prefill, "decode": decode}))
