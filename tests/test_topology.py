"""Topologies as data: the named set, sglang's default PP split, each rank's heads and layers,
and ``pdconform list --topologies``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.spec.topology import (GQA, TOPOLOGIES, ModelShape, Side, Topology, TopologyError, default_pp_split,
                                   rank_layout, rank_name, topology)

ROOT = Path(__file__).resolve().parents[1]


# sglang's own functions, called in a fresh interpreter (its modules import GPU packages the
# shims stand in for: harness.target.gpu_import_shims), on the inputs the tests ask about
SGLANG_PROGRAM = """
import json, sys
from harness.target import gpu_import_shims
gpu_import_shims.install()
from sglang.srt.distributed.utils import get_pp_indices
from sglang.srt.disaggregation.common.staging_buffer import compute_head_slice_params
ask = json.loads(sys.stdin.read())
print(json.dumps({"pp": [list(get_pp_indices(*a)) for a in ask["pp"]],
                  "heads": [list(compute_head_slice_params(*a)) for a in ask["heads"]]}))
"""


def _sglang(pp: list, heads: list) -> dict:
    done = subprocess.run([sys.executable, "-c", SGLANG_PROGRAM], input=json.dumps({"pp": pp, "heads": heads}),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_default_pp_split_and_head_slices_are_sglangs():
    """The split sglang computes without SGLANG_PP_LAYER_PARTITION (distributed/utils.py
    get_pp_indices); and for every TP pair of the named set, the heads a prefill rank sends and
    where a decode rank puts them (common/staging_buffer.py compute_head_slice_params) are
    the heads our ranks hold."""
    pp_asks = [(layers, rank, pp) for layers in range(1, 12) for pp in range(1, min(layers, 5) + 1)
               for rank in range(pp)]
    pairs = []
    for t in (t for t in TOPOLOGIES.values() if t.model.attention == "MHA" and t.prefill.tp != t.decode.tp):
        for src in range(t.prefill.tp):
            for dst in range(t.decode.tp):
                s_start, s_count = t.heads_of("prefill", src)
                d_start, d_count = t.heads_of("decode", dst)
                overlap = range(max(s_start, d_start), min(s_start + s_count, d_start + d_count))
                if overlap:
                    pairs.append((t, src, dst, s_start, d_start, overlap))
    got = _sglang(pp_asks, [(t.prefill.tp, t.decode.tp, src, dst, t.model.kv_heads) for t, src, dst, *_ in pairs])
    for (layers, rank, pp), theirs in zip(pp_asks, got["pp"]):
        ours = default_pp_split(layers, pp)
        assert theirs == [sum(ours[:rank]), sum(ours[:rank + 1])], (layers, rank, pp)
    assert len(pairs) >= 8
    for (t, src, dst, s_start, d_start, overlap), (src_off, n, dst_off, _) in zip(pairs, got["heads"]):
        assert (s_start + src_off, d_start + dst_off, n) == (overlap.start, overlap.start, len(overlap)), \
            (t.name, src, dst)


def test_rank_layouts_split_heads_and_layers():
    t = topology("p2-d1")
    r0, r1 = rank_layout(t, "prefill", 0), rank_layout(t, "prefill", 1)
    assert (r0.kv_heads, r0.head_start, r1.head_start, r0.total_kv_heads) == (2, 0, 2, 4)
    assert r0.page_bytes == GQA.page_size * 2 * GQA.head_bytes
    assert rank_layout(t, "decode").kv_heads == 4
    staged = Topology("pp", prefill=Side(pp=2, draft_layers=1), model=ModelShape(num_layers=5))
    assert staged.stages("prefill") == ((0, 2), (2, 5))
    first, last = rank_layout(staged, "prefill", pp_rank=0), rank_layout(staged, "prefill", pp_rank=1)
    assert (list(first.main_layers), first.draft_layers, list(last.main_layers), last.draft_layers) == \
        ([0, 1], 0, [2, 3, 4], 1)


def test_silent_ranks_are_the_prefill_ranks_no_decode_rank_takes_kv_from():
    from dataclasses import asdict

    from harness.spec.history import History, silent_ranks

    def starts(t: Topology) -> list[dict]:
        h = History()
        for side, op in (("prefill", "start_prefill"), ("decode", "start_decode")):
            s = t.side(side)
            for engine, stage, rank in ((e, p, r) for e in range(s.dp) for p in range(s.pp) for r in range(s.tp)):
                role = rank_name(rank_name(rank_name(side, engine, "dp"), stage, "pp"), rank)
                h.record("invoke", op, role, 0, args={"layout": asdict(rank_layout(t, side, rank, stage)),
                                                      "attn_tp": [s.tp, rank]})
        return h.events

    expect = {"p1-d1": set(), "p2-d1": set(), "p1-d4-kv2": set(), "p2-d4-kv2": set(), "p1dp2-d1": set(), "p1pp2-d1": set(),
              "p2-d1-kv1": {"prefill.tp1"}, "p2-d1-mla": {"prefill.tp1"}, "p2-d2-mla": {"prefill.tp1"}}
    assert {name: silent_ranks(starts(topology(name))) for name in expect} == expect


def test_shapes_no_config_produces_are_refused():
    for bad, why in ((Topology("x", prefill=Side(tp=3), model=GQA), "neither divides"),
                     (Topology("x", prefill=Side(pp=4)), "4 stages for 3 layers"),
                     (Topology("x", prefill=Side(pp=2, pp_split=(1, 1))), "not 2 non-empty stages"),
                     (Topology("x", model=ModelShape(attention="MLA", kv_heads=2)), "one latent"),
                     (Topology("x", model=ModelShape(head_bytes=12)), "multiple of 8"),
                     (Topology("x", decode=Side(tp=2, dp=2), model=GQA), "DP 2 engines of TP 2")):
        with pytest.raises(TopologyError, match=why):
            bad.check()
    for t in TOPOLOGIES.values():
        t.check()
    with pytest.raises(KeyError, match="unknown topology 'p9-d9'; known: p1-d1"):
        topology("p9-d9")


def test_the_sets_cover_the_tp_pairs_vllm_sweeps_both_ways():
    default = {t.name for t in TOPOLOGIES.values() if t.default}
    assert {"p1-d1", "p2-d1", "p1-d2", "p1pp2-d1", "p1-d1dp2"} <= default  # the "few shapes that matter"
    assert TOPOLOGIES["p1-d1dp2"].decode.dp == 2 and TOPOLOGIES["p1dp2-d1"].prefill.dp == 2
    pairs = {(t.prefill.tp, t.decode.tp) for t in TOPOLOGIES.values() if t.nightly}
    assert {(1, 1), (2, 1), (4, 2), (4, 4), (1, 2), (2, 4)} <= pairs


def test_list_topologies_json():
    out = subprocess.run([sys.executable, "-m", "harness.cli", "list", "--topologies", "--json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["name"] for r in rows] == list(TOPOLOGIES)
    p2 = next(r for r in rows if r["name"] == "p2-d1")
    assert p2["default"] is True and (p2["prefill"]["tp"], p2["decode"]["tp"]) == (2, 1)
    assert set(p2["prefill"]) == {"tp", "pp", "dp", "stages", "model"}
    assert p2["prefill"]["model"]["kv_heads"] == 4 and p2["prefill"]["model"]["attention"] == "MHA"
