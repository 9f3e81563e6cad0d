"""Cases that used to pass in silence: each now says what it does, or is refused in one line.

- ``run --warm-start K`` with fewer trials than members: before, K trials were queued whatever the budget and
  those beyond it waited unseen; now only those the budget runs are queued, and one warning says how many
  were dropped.
- ``portfolio --family cayley --family fc``: before, the last one won; now a repeated ``--family`` is refused.
- ``portfolio --check`` on a matrix with nothing to leave out: before, an empty table; now one line.
- ``run --ensemble 3`` on a study with one complete trial: before, nothing said; now a warning that its ensemble
  is that one trial alone.
- ``portfolio --update-shipped`` from a matrix far thinner than the shipped one: before, it replaced a
  12-problem portfolio with no guard; now refused unless ``--force``, naming both evidences.
"""

from __future__ import annotations

import json
import logging

import optuna
import pytest
from click.testing import CliRunner
from reliability_helpers import one_line_error

from ilge_search.cli import cli
from ilge_search.defaults.portfolio import PortfolioRequest
from ilge_search.encoders.configs import CayleyConfig
from ilge_search.record import portfolio as record_portfolio
from ilge_search.record import warm_start_record
from ilge_search.study import StudyOptions, run_study
from ilge_search.testing import add_matrix_problems, store_matrix

DATA = dict(max_train=240, max_eval=100)
START = CayleyConfig(lr=1e-3, gnn_layers=1, hidden_dim=256).to_dict()  # the built-in defaults (small)
WIDE = CayleyConfig(lr=3e-4, gnn_layers=2, hidden_dim=512).to_dict()
DEEP = CayleyConfig(lr=1e-3, gnn_layers=3, hidden_dim=128, conv_type="gcn").to_dict()
MEMBERS = [
    CayleyConfig(lr=3e-3, gnn_layers=2, hidden_dim=128).to_dict(),
    CayleyConfig(lr=3e-4, gnn_layers=1, hidden_dim=512).to_dict(),
    CayleyConfig(lr=1e-3, gnn_layers=3, hidden_dim=256).to_dict(),
]
PROVENANCE = {"source": "big", "family": "cayley", "bucket": "small", "chosen_on": "validation", "generated": "now"}


@pytest.fixture()
def shipped_path(tmp_path, monkeypatch):
    """The shipped portfolio file, a copy in ``tmp_path`` (the package's own is never written)."""
    path = tmp_path / "portfolio.json"
    monkeypatch.setattr(record_portfolio, "SHIPPED_PORTFOLIO_PATH", path)
    return path


@pytest.fixture()
def builtin_start(tmp_path, monkeypatch):
    from ilge_search import tuning

    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", tmp_path / "no-shipped-defaults.json")
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "no-user-defaults.json"))


def synthetic_options(synthetic, **more) -> StudyOptions:
    folders = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir)
    return StudyOptions.from_flat(
        device="cpu", threads=1, progress=False, seed=0, max_epochs=2, final_seeds=0, **folders, **DATA, **more
    )


def test_warm_start_members_beyond_the_trial_budget_are_not_queued_and_the_run_says_so(
    synthetic, shipped_path, tmp_path, caplog, no_model_loads
):
    record_portfolio.write_shipped_portfolio("cayley", "small", MEMBERS, {**PROVENANCE, "problems": []})
    synthetic.cache("trec", **DATA)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with caplog.at_level(logging.WARNING, logger="ilge_search"):
        (result,) = run_study(
            synthetic.model,
            "trec",
            "cayley",
            storage=url,
            options=synthetic_options(synthetic, n_trials=2, warm_start=3),
        )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE"], states  # nothing left WAITING
    assert len(warm_start_record(study).members) == 1  # what was queued: the budget's one slot after the start
    warned = [r.getMessage() for r in caplog.records if "--warm-start 3" in r.getMessage()]
    assert len(warned) == 1 and "2 member(s) beyond that budget are not enqueued" in warned[0], warned
    assert "--n-trials 4" in warned[0]


def test_a_warm_start_within_the_budget_says_nothing(synthetic, shipped_path, tmp_path, caplog, no_model_loads):
    record_portfolio.write_shipped_portfolio("cayley", "small", MEMBERS[:1], {**PROVENANCE, "problems": []})
    synthetic.cache("trec", **DATA)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with caplog.at_level(logging.WARNING, logger="ilge_search"):
        run_study(
            synthetic.model,
            "trec",
            "cayley",
            storage=url,
            options=synthetic_options(synthetic, n_trials=2, warm_start=1),
        )
    assert not [r for r in caplog.records if "--warm-start" in r.getMessage()]


def test_a_repeated_family_is_refused_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    message = one_line_error(
        CliRunner().invoke(cli, ["portfolio", "--storage", url, "--family", "cayley", "--family", "fc"])
    )
    assert "--family was given 2 times (cayley, fc)" in message and "once per family" in message
    assert not (tmp_path / "s.db").exists()


def test_portfolio_check_with_nothing_to_leave_out_is_one_line(tmp_path, builtin_start, no_model_loads):
    url = f"sqlite:///{tmp_path / 's.db'}"
    add_matrix_problems(url, {("minilm-l6", "trec"): [(START, 0.70), (WIDE, 0.80)]})
    before = (tmp_path / "s.db").read_bytes()
    message = one_line_error(
        CliRunner().invoke(cli, ["portfolio", "--storage", url, "--top-k", "1", "--seeds", "1", "--check"])
    )
    assert "needs problems of two tasks or two models; this matrix has 1 (minilm-l6/trec)" in message
    assert (tmp_path / "s.db").read_bytes() == before  # refused before any cell was claimed


def test_an_explicit_ensemble_on_a_study_of_one_trial_is_explained(synthetic, tmp_path, caplog, no_model_loads):
    synthetic.cache("trec", **DATA)
    url = f"sqlite:///{tmp_path / 's.db'}"
    options = synthetic_options(synthetic, n_trials=1, ensemble=3).replace(final_seeds=1)
    with caplog.at_level(logging.WARNING, logger="ilge_search"):
        run_study(synthetic.model, "trec", "last-layer", storage=url, options=options)
    warned = [r.getMessage() for r in caplog.records if "--ensemble 3" in r.getMessage()]
    assert len(warned) == 1 and "complete trials and it has 1: its ensemble is that trial alone" in warned[0]


def test_the_default_ensemble_stays_silent_on_a_study_of_one_trial(tmp_path):
    from ilge_search.record import Identity, TrialRecord
    from ilge_search.study.stages.ensemble_work import ensemble_size
    from ilge_search.testing.store import FakeTrial, add_study

    url = f"sqlite:///{tmp_path / 's.db'}"
    one = FakeTrial(0.8, record=TrialRecord(config=dict(START)))
    study = add_study(url, Identity(model="minilm-l6", task="trec", encoder="cayley"), trials=[one])
    assert ensemble_size(study, None) == (0, None)
    size, note = ensemble_size(study, 2)
    assert size == 2 and "that trial alone" in note and "--n-trials" in note


def thin_matrix(url: str) -> None:
    """A 2-problem, 1-seed matrix: every cell stored, so --update-shipped has something to write."""

    def score(candidate, problem, seed):
        sources = candidate.sources if candidate is not None else ("marginal",)
        return (0.8, 0.7) if "built-in" not in sources else (0.6, 0.5)

    add_matrix_problems(
        url, {("minilm-l6", t): [(START, 0.70), (c, 0.80)] for t, c in (("trec", WIDE), ("sst2", DEEP))}
    )
    store_matrix(url, PortfolioRequest(top_k=1, seeds=1, size=2), score)


def test_update_shipped_refuses_thinner_evidence_unless_forced(tmp_path, shipped_path, builtin_start, no_model_loads):
    problems = [f"minilm-l6:task{i}:cayley" for i in range(12)]
    big = {
        **PROVENANCE,
        "problems": problems,
        "models": ["minilm-l6", "smollm2-135m"],
        "tasks": [f"t{i}" for i in range(6)],
    }
    record_portfolio.write_shipped_portfolio(
        "cayley", "small", MEMBERS, {**big, "seeds": [1, 2, 3], "max_epochs": None}
    )
    before = shipped_path.read_bytes()
    url = f"sqlite:///{tmp_path / 's.db'}"
    thin_matrix(url)
    args = ["portfolio", "--storage", url, "--top-k", "1", "--seeds", "1", "--size", "2", "--update-shipped"]
    message = one_line_error(CliRunner().invoke(cli, args))
    assert "this matrix (2 problems, 1 model, 2 tasks, 1 seed" in message
    assert "(12 problems, 2 models, 6 tasks, 3 seeds, no epoch cap" in message
    assert "fewer problems, models, tasks, seeds" in message and "--force" in message
    assert shipped_path.read_bytes() == before
    forced = CliRunner().invoke(cli, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    written = json.loads(shipped_path.read_text())["families"]["cayley"]["small"]["provenance"]
    assert len(written["problems"]) == 2 and "train_texts" in written


def test_update_shipped_over_equal_or_thinner_shipped_evidence_needs_no_force(
    tmp_path, shipped_path, builtin_start, no_model_loads
):
    record_portfolio.write_shipped_portfolio("cayley", "small", MEMBERS, {**PROVENANCE, "problems": ["one"]})
    url = f"sqlite:///{tmp_path / 's.db'}"
    thin_matrix(url)
    args = ["portfolio", "--storage", url, "--top-k", "1", "--seeds", "1", "--size", "2", "--update-shipped"]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
