"""Explore against every planted-bug mutant of the catalogue: does it find each one unaided?

``python -m harness.explore.sweep [--budget 45] [--out DIR]`` runs ``explore`` on each
mutant (harness.implementations.mutants_of; ``PDCONFORM_MUTANTS=1`` is set here) until its
first failure is shrunk or the budget per mutant is spent, on the topology that holds the
bug (:data:`SHAPE`; p1-d1 for the rest), and writes ``sweep.json`` and ``sweep.md``: per
mutant the requirement it breaks, whether a failure was found, whether that failure cites
the mutant's requirement, the seconds to the first failure and the programs run.
docs/explore.md quotes its figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from harness.judge.results import write_atomic

#: mutants whose bug lives only in a deployment shape: explored on that shape
SHAPE = {"dp-engine-zero": "p1dp2-d1", "head-slice-at-zero": "p2-d1", "stage-start-ignored": "p1pp2-d1",
         "failure-to-one-destination": "p1-d2", "reason-dropped-for-one-rank": "p1-d2"}


def sweep(budget_s: float, out: Path, only: list[str] | None = None) -> list[dict]:
    """Explore each mutant for at most ``budget_s`` seconds (see the module docstring); the rows."""
    from harness.explore.session import Explorer
    from harness.implementations import implementation, list_mutants, mutants_of
    from harness.target.sglang import installed_target

    list_mutants()
    rows = []
    chosen = [m for m in mutants_of(implementation("reference")) if not only or m.planted["id"] in only]
    with Explorer(installed_target(), out / "programs", out / "found") as explorer:
        explorer.start([m.name for m in chosen])
        for mutant in chosen:
            mid = mutant.planted["id"]
            start = time.monotonic()
            report = explorer.explore(mutant.name, budget_s, SHAPE.get(mid, "p1-d1"), max_failures=1)
            failure = next(iter(report.failures.values()), None)
            rows.append({"mutant": mid, "requirement": mutant.planted["requirement"], "topology": SHAPE.get(mid, "p1-d1"),
                         "found": failure is not None,
                         "cites": bool(failure) and failure.signature["requirement"] == mutant.planted["requirement"],
                         "check": failure.signature["check"] if failure else "",
                         "failed_requirement": failure.signature["requirement"] if failure else "",
                         "first_after_s": round(failure.first_after_s, 1) if failure else None,
                         "programs": report.programs, "seconds": round(time.monotonic() - start, 1),
                         "steps_shrunk": len(failure.program.steps) if failure else None,
                         "shrink_s": round(failure.shrink_s, 1) if failure else None})
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "sweep.json", json.dumps(rows, indent=1).encode())
    write_atomic(out / "sweep.md", markdown(rows, budget_s).encode())
    return rows


def markdown(rows: list[dict], budget_s: float) -> str:
    """The sweep as a Markdown table, with the count found unaided."""
    found = sum(r["found"] for r in rows)
    cites = sum(r["cites"] for r in rows)
    lines = [f"{found} of {len(rows)} mutants found within {budget_s:.0f} s each ({cites} by a check citing the "
             "mutant's own requirement)", "",
             "| mutant | breaks | shape | found by | first failure after | programs | shrunk to steps |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        by = f"{r['check']} ({r['failed_requirement']})" if r["found"] else "not found"
        first = f"{r['first_after_s']} s" if r["found"] else ""
        lines.append(f"| {r['mutant']} | {r['requirement']} | {r['topology']} | {by} | {first} | {r['programs']} | "
                     f"{r['steps_shrunk'] or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.explore.sweep")
    parser.add_argument("--budget", type=float, default=45.0, help="seconds per mutant")
    parser.add_argument("--out", type=Path, default=Path("reports/out/explore-sweep"))
    parser.add_argument("--mutant", action="append", help="only this mutant id (repeatable)")
    args = parser.parse_args(argv)
    rows = sweep(args.budget, args.out, args.mutant)
    print(markdown(rows, args.budget))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
