"""Oracle failures (docs/explore.md, "Oracle failures"): the reference is pdconform's oracle, so a
program it fails is pdconform's own bug, never an explored implementation's.

:class:`OracleDiff` is the part of :class:`harness.explore.session.Explorer` that runs an
implementation's failing program on the oracle before the failure counts, records every
failure of the oracle as an oracle failure (``ImplReport.oracle``; a found file of the oracle
in :data:`ORACLE_DIR` of the found folder), and decides whether the implementation's failure is
*disputed*: only when the oracle fails the same check twice in a row.
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.explore.found import write_found
from harness.explore.outcome import Failure, ImplReport, same_check, signature_key, signature_of
from harness.explore.program_model import Program
from harness.judge.results import write_atomic
from harness.spec.protocol import REFERENCE

ORACLE_DIR = "oracle"  # the found folder's subfolder for oracle failures' programs (no backend's corpus)


class OracleDiff:
    """Mixed into :class:`harness.explore.session.Explorer` (which provides ``run_program``,
    ``found_dir``, ``out_dir``, ``note`` and ``_lock``): the reference beside each failure."""

    def _oracle_init(self, seed: int) -> None:
        # the implementation a failure is diffed against, whose own failures are oracle failures
        # (a test names a mutant of the reference here, to plant a bug in the oracle)
        self.oracle = REFERENCE
        self._round_seed = seed  # the running round's seed (recorded in the found files it writes)
        self._oracle_runs = 0  # cells run on the oracle beside a failure: each gets a folder of its own

    def oracle_dir(self) -> Path:
        """Where oracle failures' programs are written: :data:`ORACLE_DIR` in the found folder."""
        return self.found_dir / ORACLE_DIR

    def _reference_fails_too(self, program: Program, impl: str, report: ImplReport, sig: dict,
                             start: float | None = None) -> bool:
        """Before ``impl``'s failure ``sig`` counts, the same program on the reference (the spec fixes
        its outcome), alone.  Every failure of the reference is an oracle failure, recorded
        (:meth:`_oracle_failure`), never dropped.  ``sig`` is *disputed* (True: not ``impl``'s
        finding, kept as ``OUT/IMPL/disputed-N.json``, not shrunk or written as found) only when
        the reference fails the same check (:func:`same_check`) on a second run too, so a race the
        reference lost once does not hide a finding.  Exploring the reference itself there is
        nothing to diff: its failure is the oracle failure (False).  docs/explore.md, "Oracle failures"."""
        if impl == self.oracle:
            return False
        runs = [self._oracle_run(program)]
        if runs[0] is not None and same_check(runs[0], sig):
            runs.append(self._oracle_run(program))  # a disputing failure must show again
        for ref in {signature_key(ref): ref for ref in runs if ref is not None}.values():
            self._oracle_failure(program, impl, report, ref, sig, start)  # each distinct one once
        disputed = all(ref is not None and same_check(ref, sig) for ref in runs)
        if disputed:
            report.disputed.append((signature_key(sig), signature_key(runs[0]), program))
            kept = self.out_dir / impl / f"disputed-{len(report.disputed)}.json"
            write_atomic(kept, program.to_json().encode())
            for ref in runs:
                report.oracle[signature_key(ref)].disputes = True
            self.note(f"{impl}: a program failed ({signature_key(sig)}), and the reference fails it the same way "
                      f"twice ({signature_key(runs[0])}): an oracle failure, not counted as {impl}'s finding ({kept})")
        elif any(runs):
            self.note(f"{impl}: a program failed ({signature_key(sig)}), and the reference failed it too "
                      f"({', '.join(signature_key(r) if r else 'PASS' for r in runs)}): an oracle failure; not by "
                      f"the same check every time, so {impl}'s failure counts")
        return disputed

    def _oracle_run(self, program: Program) -> dict | None:
        """Run ``program`` on the oracle alone (a fresh cell, in a folder of its own); its failure's signature."""
        with self._lock:
            self._oracle_runs += 1
            n = self._oracle_runs
        return signature_of(self.run_program(program, self.oracle, f"reference-diff-{n}", alone=True), self.oracle)

    def _oracle_failure(self, program: Program, impl: str, report: ImplReport, ref: dict, beside: dict,
                        start: float | None) -> None:
        """Record the oracle's failure ``ref`` of ``program``, which ``impl`` ran and failed with
        ``beside``: counted under its signature in ``report.oracle``; a new one is written as a
        found file of the oracle into :meth:`oracle_dir` (not shrunk: the program as ``impl`` ran it)."""
        key = signature_key(ref)
        failure = report.oracle.get(key)
        if failure is not None:
            failure.count += 1
            return
        failure = report.oracle[key] = Failure(
            ref, 1, program, first_after_s=time.monotonic() - start if start is not None else 0.0, first=program,
            oracle=True, beside=f"{impl}'s {beside['check']} ({beside['requirement']})")
        written = next((f.path for f in report.oracle.values() if f.path and f.program == program), None)
        if written is not None:  # the program failed the oracle another way on another run: one file is enough
            failure.path = written
            return
        try:
            failure.path = write_found(program, self.oracle, ref, self.oracle_dir(),
                                       {"seed": self._round_seed, "while_exploring": impl,
                                        "beside": signature_key(beside)})
        except OSError as exc:  # the failure stays in the report; its program could not be kept
            self.note(f"could not write the oracle failure's program into {self.oracle_dir()}: {exc}")


__all__ = ["ORACLE_DIR", "OracleDiff"]
