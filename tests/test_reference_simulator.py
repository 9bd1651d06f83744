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
