"""What one ``pdconform explore`` run found (harness.explore.session): per implementation an
:class:`ImplReport` of programs, rates and distinct :class:`Failure`s, each known by its
signature (:func:`signature_of`), the implementation's findings apart from the *oracle
failures*: programs the reference (pdconform's oracle, backends/reference) fails, which are
pdconform's own bugs (docs/explore.md, "Oracle failures").  The command's exit code follows
from them (:func:`exit_code`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.explore.program_model import Program
from harness.judge.results import CellResult


@dataclass
class Failure:
    """One distinct failure: its ``signature``, how many programs showed it, the smallest
    program, its found file, the seconds from the start of exploring to the first one, and
    its shrinking: seconds from the first failing program to the smallest one written out,
    and the cells run meanwhile (at most harness.explore.session.SHRINK_RUNS, for about
    ``Explorer.shrink_s``: SHRINK_S unless changed)."""

    signature: dict
    count: int
    program: Program
    path: Path | None = None
    first_after_s: float = 0.0
    shrink_s: float = 0.0
    shrink_runs: int = 0
    flaky: bool = False
    known: bool = False  # a corpus program still showing it: not looked for, not written again
    first: Program | None = None  # the first program that showed it (``program`` is the smallest)
    #: the reference failed: an oracle failure (pdconform's bug), not the explored implementation's finding
    oracle: bool = False
    #: an oracle failure seen beside another implementation's run of the program: that implementation
    #: and the check it failed ("IMPL's CHECK (REQ)"), and whether the reference failed the same check
    #: twice, so the implementation's failure was disputed (not counted as a finding)
    beside: str = ""
    disputes: bool = False


@dataclass
class ImplReport:
    """What explore did on one implementation: corpus replays (found file -> PASS or the
    signature it still fails with), programs and steps run, seconds, distinct failures, and the
    failures a long-lived pair showed that a fresh cell did not (``pair_only``)."""

    impl: str
    of_oracle: bool = False  # ``impl`` is the oracle (the reference): its every failure is an oracle failure
    topology: str = "p1-d1"  # the shape its programs ran on
    corpus: dict[str, str] = field(default_factory=dict)
    programs: int = 0
    steps: int = 0
    seconds: float = 0.0
    failures: dict[str, Failure] = field(default_factory=dict)
    #: programs that failed on a long-lived pair but not in a fresh cell: (signature key, program)
    pair_only: list[tuple[str, Program]] = field(default_factory=list)
    #: failures the reference showed too on the same program, by the same check, twice in a row (not
    #: findings): (signature key, the reference's, program)
    disputed: list[tuple[str, str, Program]] = field(default_factory=list)
    #: oracle failures on the programs of another implementation: the reference's signature key -> failure
    oracle: dict[str, Failure] = field(default_factory=dict)

    corpus_s: float = 0.0  # of ``seconds``: replaying the corpus
    shrinking_s: float = 0.0  # of ``seconds``: the cells that confirmed and shrank failures
    shrink_programs: int = 0  # of ``programs``: those cells

    @property
    def findings(self) -> list[Failure]:
        """The implementation's own failures (its corpus's known ones too), none of them the oracle's."""
        return [f for f in self.failures.values() if not f.oracle]

    @property
    def oracle_failures(self) -> list[Failure]:
        """Every program the reference failed: beside this implementation's runs, or, when this
        implementation is the reference, its own failures."""
        return [f for f in self.failures.values() if f.oracle] + list(self.oracle.values())

    def stale_corpus(self) -> list[str]:
        """The corpus's found files that still fail (or cannot be read) now."""
        return [name for name, sig in self.corpus.items() if sig not in ("PASS", "WARN", "UNSUPPORTED")]

    @property
    def rate_per_min(self) -> float:
        return 60.0 * self.programs / self.seconds if self.seconds else 0.0

    @property
    def exploring_rate_per_min(self) -> float:
        """Generated programs a minute while exploring: without the corpus replay and the cells
        that confirmed or shrank a failure (bench's rate goal; a sample that finds a bug early
        would otherwise measure its shrinking)."""
        seconds = self.seconds - self.corpus_s - self.shrinking_s
        return 60.0 * (self.programs - self.shrink_programs) / seconds if seconds > 0 else 0.0


def signature_of(cell: CellResult, impl: str) -> dict | None:
    """The failure a judged cell shows (None: PASS, WARN or UNSUPPORTED): the requirement and
    name of the check that made it fail (the first failed MUST check; for ERROR the first
    check that could not tell; else none: the verdict), the implementation, and the first
    line of the reason when the cell ended in an exception."""
    if cell.verdict in ("PASS", "WARN", "UNSUPPORTED"):
        return None
    failing = next((ch for ch in cell.checks if ch["ok"] is False and ch["level"] == "MUST"), None) \
        if cell.verdict == "FAIL" else next((ch for ch in cell.checks if ch["ok"] is None and not ch["unsupported"]),
                                            None)
    # an exception's first line, without numbers (step numbers, room ids, seconds): the same
    # crash in a shorter program must keep its signature while it shrinks
    first = ((cell.reason or "").splitlines() or [""])[0] if cell.verdict == "ERROR" else ""
    frame = re.sub(r"\d+(\.\d+)?", "N", first)[:120]
    return {"requirement": failing["requirement"] if failing else "", "check": failing["name"] if failing else
            str(cell.verdict), "impl": impl, "frame": frame}


def signature_key(signature: dict) -> str:
    """A signature as one string: the key distinct failures are counted under."""
    return "|".join(signature[k] for k in ("requirement", "check", "impl", "frame"))


def same_check(one: dict, other: dict) -> bool:
    """Whether two signatures (of any implementations) name the same failed check: its name and
    requirement.  Only then does the reference's failure dispute an implementation's."""
    return (one["requirement"], one["check"]) == (other["requirement"], other["check"])


EXIT_FOUND = 1  # an implementation's failure was found, or a program of its corpus still fails
EXIT_ORACLE = 3  # only oracle failures: the reference failed a program (pdconform's bug)


def exit_code(reports: list[ImplReport]) -> int:
    """``pdconform explore``'s exit code for ``reports``: :data:`EXIT_FOUND` when an implementation
    other than the oracle has a finding or a corpus program still failing (it takes precedence);
    else :data:`EXIT_ORACLE` when anything showed an oracle failure (the oracle's own corpus
    still failing included); else 0."""
    if any(r.findings or r.stale_corpus() for r in reports if not r.of_oracle):
        return EXIT_FOUND
    if any(r.oracle_failures or r.stale_corpus() for r in reports):
        return EXIT_ORACLE
    return 0
