"""The deterministic simulator: clean seeds stay clean, a planted bug is found and replayable."""

import subprocess
import sys

from backends.reference.simulator import SimConfig, simulate


def test_seeds_of_the_reference_have_no_violation():
    bad = [r.seed for r in map(simulate, range(300)) if not r.ok]
    assert bad == []


def test_one_seed_replays_exactly():
    a, b = simulate(1234), simulate(1234)
    assert a.trace == b.trace and a.events == b.events
    assert simulate(1235).trace != a.trace


def test_runs_exercise_both_outcomes():
    results = [simulate(s) for s in range(100)]
    assert sum(r.rooms_success for r in results) > 50 and sum(r.rooms_failed for r in results) > 20


def test_planted_bug_is_caught_by_the_simulator():
    config = SimConfig(planted_bug="ack-before-drain")
    failing = [r for r in (simulate(s, config) for s in range(300)) if not r.ok]
    assert failing, "the planted bug must be found within 300 seeds"
    assert any("after the decode released them" in v for v in failing[0].violations)


def test_simulate_cli_prints_rate_and_the_replay_of_a_failing_seed():
    ok = subprocess.run([sys.executable, "-m", "harness.cli", "simulate", "--seeds", "50"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "runs/min" in ok.stdout and "0 with violations" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "harness.cli", "simulate", "--seeds", "300",
                          "--planted-bug", "ack-before-drain"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "VIOLATION" in bad.stdout and "steps that replay it:" in bad.stdout
    assert "replay: pdconform simulate --seeds 1 --seed" in bad.stdout
    usage = subprocess.run([sys.executable, "-m", "harness.cli", "simulate", "--seeds", "0"],
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2


FAULTLESS = dict(drop_p=0.0, dup_p=0.0, write_fail_p=0.0, crash_p=0.0, partition_p=0.0)


def test_without_faults_every_room_succeeds():
    """R-XFER-1 under the simulator: no fault, no ABORT -> every room Success on the decode."""
    config = SimConfig(abort_p=0.0, **FAULTLESS)
    for seed in range(100):
        result = simulate(seed, config)
        assert result.ok and result.rooms_success == config.rooms and result.rooms_failed == 0, (seed, result.violations)


def test_without_faults_every_abort_is_acked():
    config = SimConfig(abort_p=1.0, **FAULTLESS)
    bad = [r.violations for r in (simulate(s, config) for s in range(100)) if not r.ok]
    assert bad == []


def test_a_silent_core_is_caught():
    """Mutations of the reference that the simulator must notice (its checks can fail)."""
    import backends.reference.decode_core as dc
    import backends.reference.prefill_core as pc

    original_hb, original_ack = dc.DecodeCore._on_HeartbeatResult, pc.PrefillCore._ack
    try:
        dc.DecodeCore._on_HeartbeatResult = lambda self, e: []  # heartbeat never fails a room
        crashes = [r for r in (simulate(s, SimConfig(crash_p=1.0, waiting_timeout_s=30.0, horizon_s=60.0))
                               for s in range(30)) if not r.ok]
        assert any("heartbeat window" in v for r in crashes for v in r.violations)
    finally:
        dc.DecodeCore._on_HeartbeatResult = original_hb
    try:
        pc.PrefillCore._ack = lambda self, room, decode, generation: []  # never ACK
        silent = [r for r in (simulate(s, SimConfig(abort_p=1.0, **FAULTLESS)) for s in range(30)) if not r.ok]
        assert any("never got its ABORT_ACK" in v for r in silent for v in r.violations)
    finally:
        pc.PrefillCore._ack = original_ack
