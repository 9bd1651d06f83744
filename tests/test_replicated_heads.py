"""Models of fewer KV heads than a side's TP ranks (issue 38 item 1, sglang #39660): every head
is held whole by several consecutive ranks, as sglang shards it, and every holder's bytes are
checked against the prefill's head, so a replica rank that took another head is named; and an
MLA topology runs MLA pools and managers on every rank, on both sides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from harness.role import pattern as p
from harness.role.pools import pattern_pools
from harness.spec.protocol import Layout
from harness.spec.scenario import get_scenario
from harness.spec.steps import StartRoles
from harness.spec.topology import TOPOLOGIES, apply, rank_heads, rank_layout, topology

ROOT = Path(__file__).resolve().parents[1]

# sglang's own per-rank head count (ModelConfig.get_num_kv_heads) for (total heads, TP) pairs, on a
# config whose total is given (the rest of ModelConfig needs a model on disk)
SGLANG_PROGRAM = """
import json, sys
from harness.target import gpu_import_shims
gpu_import_shims.install()
from sglang.srt.configs.model_config import ModelConfig
out = []
for total, tp in json.loads(sys.stdin.read()):
    config = ModelConfig.__new__(ModelConfig)
    config.is_draft_model = False
    config.get_total_num_kv_heads = lambda total=total: total
    out.append(config.get_num_kv_heads(tp))
print(json.dumps(out))
"""


def test_each_ranks_head_count_is_sglangs_and_heads_are_replicated_on_consecutive_ranks():
    asks = [(total, tp) for total in (1, 2, 4, 8) for tp in (1, 2, 4, 8)]
    done = subprocess.run([sys.executable, "-c", SGLANG_PROGRAM], input=json.dumps(asks), capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    for (total, tp), theirs in zip(asks, json.loads(done.stdout)):
        assert {rank_heads(total, tp, r, False)[1] for r in range(tp)} == {theirs}, (total, tp)
    # 2 heads on 4 ranks: QKVParallelLinear's tp_rank // num_kv_head_replicas, not tp_rank % heads
    assert [rank_heads(2, 4, r, False) for r in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert [rank_heads(1, 2, r, False) for r in range(2)] == [(0, 1), (0, 1)]
    assert [rank_heads(1, 4, r, True) for r in range(4)] == [(0, 1)] * 4  # MLA: the latent head, whole


def test_the_named_sets_hold_replicated_heads_and_mla_on_both_sides():
    replicated = [t for t in TOPOLOGIES.values() if t.model.attention == "MHA"
                  and max(t.prefill.tp, t.decode.tp) > t.model.kv_heads]
    assert {t.name for t in replicated if t.decode.tp > t.model.kv_heads} >= {"p1-d4-kv2", "p2-d4-kv2", "p1-d2-kv1"}
    assert any(t.prefill.tp > t.model.kv_heads for t in replicated)  # the gather direction too: p2-d1-kv1
    assert all(t.nightly for t in replicated)
    # the default set's one: the smallest shape where a modulo map (rank % heads) and sglang's
    # (rank // replicas) differ, so #39660's wrong heads show there
    (default,) = [t for t in replicated if t.default]
    assert default.name == "p1-d4-kv2"
    assert [rank_layout(default, "decode", r).head_start for r in range(4)] != [r % 2 for r in range(4)]
    mla = TOPOLOGIES["p2-d2-mla"]
    assert (mla.prefill.tp, mla.decode.tp, mla.model.attention, mla.nightly) == (2, 2, "MLA", True)


def test_replica_ranks_layouts_name_the_head_they_hold():
    t = topology("p1-d4-kv2")
    decode = [rank_layout(t, "decode", r) for r in range(4)]
    assert [(d.head_start, d.kv_heads, d.total_kv_heads) for d in decode] == [(0, 1, 2), (0, 1, 2), (1, 1, 2),
                                                                             (1, 1, 2)]
    assert {d.page_bytes for d in decode} == {t.model.page_size * t.model.head_bytes}
    prefill = rank_layout(t, "prefill")
    assert (prefill.head_start, prefill.kv_heads, prefill.model_kv_heads) == (0, 2, 2)


def test_an_mla_topology_runs_mla_layouts_on_every_rank():
    """The model's MLA reaches the roles (before, an MHA scenario on p2-d1-mla ran MHA pools of
    one replicated head and MHA managers)."""
    for name in ("p2-d1-mla", "p2-d2-mla"):
        (start,) = [s for s in get_scenario(f"happy-path@{name}").steps(0) if isinstance(s, StartRoles)]
        assert start.layout.mla and start.tp_ranks == (TOPOLOGIES[name].prefill.tp, TOPOLOGIES[name].decode.tp)
    # an MHA topology leaves a scenario's MLA layout MLA, and its MHA layout MHA
    mla_start = StartRoles(layout=Layout(mla=True))
    (kept,) = apply([mla_start], topology("p1-d2"))
    assert kept.layout.mla
    (mha,) = apply([StartRoles()], topology("p1-d4-kv2"))
    assert not mha.layout.mla and mha.kv_heads == 2


# ---- the bytes of a replicated head, checked on every rank that holds it ------------------------

def _land(prefill_kv, decode_kv, source_head: int, head_bytes: int, page_size: int, moves) -> None:
    """A scatter transfer into one decode rank of one head per token: ``source_head`` of each
    token of each moved prefill page (the prefill holds every head) into the rank's page."""
    for (_, src), (_, dst) in zip(prefill_kv, decode_kv):
        per_token = src.shape[1] // page_size
        for s, d in moves:
            for token in range(page_size):
                at = token * per_token + source_head * head_bytes
                dst[d, token * head_bytes:(token + 1) * head_bytes] = src[s, at:at + head_bytes]


def _transfer(t, source_head_of, moves):
    """Every decode rank's pools of ``t`` (prefill TP 1) after each took ``source_head_of(rank)``."""
    prefill_kv, _ = pattern_pools(p.PREFILL, rank_layout(t, "prefill"))
    ranks = []
    for r in range(t.decode.tp):
        layout = rank_layout(t, "decode", r)
        kv, _ = pattern_pools(p.DECODE, layout)
        _land(prefill_kv, kv, source_head_of(r), t.model.head_bytes, t.model.page_size, moves)
        ranks.append(kv)
    return ranks


MOVES = [(3, 5), (8, 1)]


def test_every_replica_rank_that_took_its_head_verifies():
    t = topology("p1-d4-kv2")
    for r, kv in enumerate(_transfer(t, lambda r: rank_layout(t, "decode", r).head_start, MOVES)):
        report = p.verify_pools(kv, MOVES, [])
        assert report.ok, (r, report.to_dict())
        assert report.bytes_verified == len(kv) * len(MOVES) * t.model.page_size * t.model.head_bytes


def test_a_replica_rank_holding_the_other_head_is_caught_and_named():
    """The map sglang #39660 fixed for Mori (decode rank -> head by rank % heads): ranks 0 and 3
    still get their own head, ranks 1 and 2 the other one; each is caught on its own rank, the
    mismatch naming the head it expected and the head it found."""
    t = topology("p1-d4-kv2")
    ranks = _transfer(t, lambda r: r % t.model.kv_heads, MOVES)
    verdicts = [p.verify_pools(kv, MOVES, []) for kv in ranks]
    assert [v.ok for v in verdicts] == [True, False, False, True]
    first = verdicts[1].mismatches[0].describe()
    assert first == ("decode layer 0 K page 1: expected prefill layer 0 K page 8 token 0 head 0, found prefill layer 0 "
                     "K page 8 token 0 head 1 (8 bad 8-byte words from word 0)")
    assert "expected prefill layer 0 K page 8 token 0 head 1, found prefill layer 0 K page 8 token 0 head 0" in \
        verdicts[2].mismatches[0].describe()
    assert verdicts[1].mismatch_pages == len(ranks[1]) * len(MOVES)  # every K/V page of every layer


def test_one_wrong_token_of_a_replicated_head_on_one_holder_is_caught():
    """The two holders of head 1 (ranks 2 and 3) are checked separately: rank 3 right, rank 2
    with one token of head 0 planted in head 1's place fails alone, on that page."""
    t = topology("p1-d4-kv2")
    ranks = _transfer(t, lambda r: rank_layout(t, "decode", r).head_start, MOVES)
    prefill_kv, _ = pattern_pools(p.PREFILL, rank_layout(t, "prefill"))
    _, v_layer2 = ranks[2][-1]
    hb = t.model.head_bytes
    v_layer2[1, 2 * hb:3 * hb] = prefill_kv[-1][1][8, (2 * 2 + 0) * hb:(2 * 2 + 1) * hb]  # token 2 of head 0
    reports = [p.verify_pools(kv, MOVES, []) for kv in ranks]
    assert [r.ok for r in reports] == [True, True, False, True]
    (m,) = reports[2].mismatches
    assert m.describe() == ("decode layer 2 V page 1: expected prefill layer 2 V page 8 token 2 head 1, found "
                            "prefill layer 2 V page 8 token 2 head 0 (2 bad 8-byte words from word 4)")


def test_one_kv_head_on_two_decode_ranks_whole_pages_on_both():
    """One KV head: both decode ranks hold it whole, so each must equal the prefill's page."""
    t = topology("p1-d2-kv1")
    ranks = _transfer(t, lambda r: 0, MOVES)
    assert all(p.verify_pools(kv, MOVES, []).ok for kv in ranks)
    _, k0 = ranks[1][0]
    k0[5] = torch.roll(k0[5], 8)  # rank 1's page shifted by one word
    assert [p.verify_pools(kv, MOVES, []).ok for kv in ranks] == [True, False]
