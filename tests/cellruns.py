"""Running cells from tests the way the harness does: execute, then judge from the history."""

from pathlib import Path

from harness import session
from harness.drive.runner import run_cell_isolated
from harness.spec import history as hist
from harness.judge.judge import judge
from harness.judge.load import needs_alone
from harness.spec.scenario import Scenario, get_scenario
from harness.target.sglang import installed_target


def run_cells(impls: list[str], scenarios: list[Scenario], out_dir: Path, *, seed: int = 0, jobs: int = 1,
              fork: bool = True, callbacks=None, **config):
    """harness.session.run_into ``out_dir`` itself (made here) on the installed sglang; the RunResult."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return session.run_into(session.RunConfig(impls=impls, scenarios=scenarios, out_dir=out_dir,
                                              target=installed_target(), seed=seed, jobs=jobs, fork=fork, **config),
                            out_dir, callbacks)


def run_one(impl: str, scenario: str | Scenario, workdir: Path, *, seed: int = 0, **kwargs):
    """One cell through harness.drive.runner.run_cell_isolated, judged (no reference, no expectation).

    A cell worse than PASS only on timing bounds while the machine starved it
    (harness.judge.load.needs_alone: ``make test`` runs two workers per core) runs once
    more, as ``pdconform run`` runs such a cell again alone, and that result is returned (its
    history replaces the first in ``workdir``; the first is printed, so a failing test shows it)."""
    scenario = get_scenario(scenario) if isinstance(scenario, str) else scenario
    cell = run_cell_isolated(impl, scenario, seed, workdir, **kwargs)
    judged = judge(scenario, seed, hist.load(cell.workdir / "history.jsonl"), workdir=str(cell.workdir))
    if not needs_alone(judged):
        return judged
    print(f"{scenario.id} x {impl}: {judged.verdict} while starved ({judged.starved}), only on timing bounds: "
          f"{judged.reason}; run once more")
    cell = run_cell_isolated(impl, scenario, seed, workdir, **kwargs)
    return judge(scenario, seed, hist.load(cell.workdir / "history.jsonl"), workdir=str(cell.workdir))
