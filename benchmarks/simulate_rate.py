"""Benchmark: seeded lifecycle runs per minute of the reference simulator.

    .venv/bin/python benchmarks/simulate_rate.py [--seeds N] [--target RUNS_PER_MIN]

Runs N seeds (default 3000) three times, reports the median rate, and exits 1
when it is below the target (default 2000 runs/min, the reference issue's bar).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.reference.simulator import simulate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3000)
    parser.add_argument("--target", type=float, default=2000.0)
    args = parser.parse_args()
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        bad = sum(not simulate(seed).ok for seed in range(args.seeds))
        rates.append(args.seeds / (time.perf_counter() - start) * 60)
        if bad:
            print(f"{bad} runs had violations", file=sys.stderr)
    rate = statistics.median(rates)
    print(f"simulate: {rate:,.0f} runs/min (median of 3 x {args.seeds} seeds; target {args.target:,.0f})")
    return 0 if rate >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
