"""``portfolio`` processes that die or run side by side on one storage.

- A killed process's claim was failed by the next run *and re-queued*: a WAITING copy that nothing ever runs
  (the matrix's cells are claimed RUNNING, never asked for), so no rerun removed it. Now a rerun fails the
  claim without queueing anything, and fails a WAITING copy an earlier version left.
- Two processes on one storage: the one that ended first printed and saved a choice from an incomplete
  matrix, and the right one survived only if the other ended last. Now a process chooses and saves only from
  a whole matrix, so both orders end with the same saved choice: the one a single run makes.

The interleavings are simulated deterministically: "the other process" is a claim stamped by a process that
is alive (this one) or gone (a child that exited), then finished in the order the test picks.
"""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.defaults.portfolio import PortfolioRequest, build_matrix, portfolio_study
from ilge_search.defaults.transfer import portfolio
from ilge_search.encoders.configs import CayleyConfig
from ilge_search.record import WORKER_ATTR, CellScores, claim_cell, finish_cell, stored_portfolio_choice, worker_stamp
from ilge_search.storage import open_storage
from ilge_search.testing import add_matrix_problems, store_matrix

START = CayleyConfig(lr=1e-3, gnn_layers=1, hidden_dim=256).to_dict()  # the built-in defaults (small)
TRIALS = {
    "trec": CayleyConfig(lr=3e-4, gnn_layers=2, hidden_dim=512).to_dict(),
    "sst2": CayleyConfig(lr=1e-3, gnn_layers=3, hidden_dim=128, conv_type="gcn").to_dict(),
}
REQUEST = PortfolioRequest(top_k=1, seeds=1, size=2)


def score(candidate, problem, seed):
    """trec's trial best everywhere, then the built-in defaults; the rest behind."""
    sources = candidate.sources if candidate is not None else ("marginal",)
    if any(s.startswith("minilm-l6:trec:") for s in sources):
        return 0.90, 0.80
    if "built-in" in sources:
        return 0.80, 0.75
    return 0.50, 0.45


@pytest.fixture()
def problems_url(tmp_path, monkeypatch):
    from ilge_search import tuning

    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", tmp_path / "no-shipped-defaults.json")
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "no-user-defaults.json"))
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    add_matrix_problems(url, {("minilm-l6", task): [(START, 0.70), (config, 0.80)] for task, config in TRIALS.items()})
    return url


def states(url: str) -> list[str]:
    study = portfolio_study(open_storage(url, must_exist=True), "cayley", "small", create=False)
    return sorted(t.state.name for t in study.trials)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def stamp_of(pid: int):
    def stamp(number: int):
        return WORKER_ATTR, {**worker_stamp(number), "pid": pid}

    return stamp


def store_all_but_trec_trial(url: str):
    """Every cell stored except the one of trec's trial on trec (the cell that decides the choice); that cell's
    planned form, to claim as "the other process"."""
    _, result, cells = build_matrix(url, REQUEST)
    decisive = next(
        c
        for c in cells
        if result.problems[c.problem].task == "trec"
        and any(s.startswith("minilm-l6:trec:") for s in result.candidates[c.candidate].sources)
    )
    storage = open_storage(url)
    study = portfolio_study(storage, "cayley", "small", create=True)
    for cell in cells:
        if cell.key.digest == decisive.key.digest:
            continue
        validation, test = score(result.candidates[cell.candidate], result.problems[cell.problem], cell.key.seed)
        trial_id = claim_cell(storage, study, cell.key, stamp_of(worker_stamp(0)["pid"]))
        finish_cell(storage, trial_id, CellScores(validation=validation, test=test))
    return storage, study, decisive


def add_trial(storage, study, state, user_attrs) -> int:
    template = optuna.trial.create_trial(state=getattr(optuna.trial.TrialState, state), user_attrs=user_attrs)
    return int(storage.rdb.create_new_trial(study._study_id, template_trial=template))


def test_a_rerun_after_a_killed_portfolio_leaves_nothing_queued(problems_url):
    """A complete matrix, plus the claim of a process that was killed mid-cell and the queued copy the base's
    repair made of such a claim: a rerun fails both, queues nothing, and keeps the matrix and its choice."""
    first = store_matrix(problems_url, REQUEST, score)
    storage = open_storage(problems_url)
    study = portfolio_study(storage, "cayley", "small", create=True)
    cell = {"portfolio_cell": "0" * 20}
    killed = add_trial(storage, study, "RUNNING", cell)
    number = storage.rdb.get_trial_number_from_id(killed)
    storage.rdb.set_trial_user_attr(killed, WORKER_ATTR, {**worker_stamp(number), "pid": dead_pid()})
    add_trial(storage, study, "WAITING", cell)
    assert {"RUNNING", "WAITING"} <= set(states(problems_url))

    again = portfolio(problems_url, REQUEST)
    assert not {"RUNNING", "WAITING"} & set(states(problems_url)), states(problems_url)
    assert again.default == first.default and again.portfolio == first.portfolio
    portfolio(problems_url, REQUEST)  # a third run finds nothing to repair and queues nothing
    assert "WAITING" not in states(problems_url)


def test_a_dead_claim_is_freed_without_a_queued_copy(problems_url):
    """The repair itself (what a run with cells to train does first): the claim is FAIL, nothing WAITING."""
    from ilge_search.defaults.portfolio import release_dead_claims

    storage, study, decisive = store_all_but_trec_trial(problems_url)
    claim_cell(storage, study, decisive.key, stamp_of(dead_pid()))
    release_dead_claims(storage, study)
    assert "RUNNING" not in states(problems_url) and "WAITING" not in states(problems_url)


def test_a_process_that_ends_while_another_trains_saves_no_choice_and_says_so(problems_url):
    storage, study, decisive = store_all_but_trec_trial(problems_url)
    trial_id = claim_cell(storage, study, decisive.key, stamp_of(worker_stamp(0)["pid"]))  # alive: this process
    shown = CliRunner().invoke(
        cli, ["portfolio", "--storage", problems_url, "--top-k", "1", "--seeds", "1", "--size", "2"]
    )
    assert shown.exit_code == 0, shown.output
    assert "no default or portfolio chosen or saved: 1 cells of the matrix are missing, 1 of them being trained" in (
        " ".join(shown.output.split())
    )
    assert stored_portfolio_choice(portfolio_study(storage, "cayley", "small", create=False)) is None
    finish_cell(storage, trial_id, CellScores(validation=0.90, test=0.80))


@pytest.mark.parametrize("last", ["the other process", "this process"])
def test_two_processes_end_with_the_same_saved_choice_whoever_ends_last(problems_url, tmp_path, last):
    import shutil

    reference_db = tmp_path / "reference.db"
    shutil.copyfile(problems_url.removeprefix("sqlite:///"), reference_db)
    reference = store_matrix(f"sqlite:///{reference_db}", REQUEST, score)  # one process, whole matrix
    expected = stored_portfolio_choice(
        portfolio_study(open_storage(f"sqlite:///{reference_db}"), "cayley", "small", False)
    )

    storage, study, decisive = store_all_but_trec_trial(problems_url)
    trial_id = claim_cell(storage, study, decisive.key, stamp_of(worker_stamp(0)["pid"]))
    if last == "the other process":  # this one ends first, the other finishes its cell and chooses
        mine = portfolio(problems_url, REQUEST)
        assert mine.default is None
        finish_cell(storage, trial_id, CellScores(validation=0.90, test=0.80))
        theirs = portfolio(problems_url, REQUEST)
    else:  # the other finishes its cell and chooses first, this one ends after it
        finish_cell(storage, trial_id, CellScores(validation=0.90, test=0.80))
        theirs = portfolio(problems_url, REQUEST)
        mine = portfolio(problems_url, REQUEST)
        assert mine.default == theirs.default
    assert theirs.default == reference.default and theirs.portfolio == reference.portfolio
    saved = stored_portfolio_choice(portfolio_study(storage, "cayley", "small", create=False))
    assert saved is not None and saved["default"] == expected["default"]
    assert saved["portfolio"] == expected["portfolio"] and saved["warm_start"] == expected["warm_start"]
