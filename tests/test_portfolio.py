"""The cross-task matrix on a tiny storage of real studies (Cayley on stsb and trec, synthetic setup, no model
loads): candidates, stored cells, resume, exclusions, work sharing, the JSON shape and the left-out checks."""

from __future__ import annotations

import json
import os
import shutil

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.defaults.portfolio import BUILTIN, MARGINAL, PortfolioRequest, TrainingSetup, build_matrix
from ilge_search.defaults.transfer import portfolio
from ilge_search.record import WORKER_ATTR, CellKey, claim_cell, portfolio_study_name, stored_cells, worker_stamp
from ilge_search.storage import open_storage
from ilge_search.study import StudyOptions

DATA = dict(max_train=240, max_eval=100)
TASKS = ("stsb", "trec")
REQUEST = PortfolioRequest(top_k=1, seeds=1, size=2)


@pytest.fixture(scope="module")
def studies(tmp_path_factory, synthetic):
    from ilge_search.study import run_study
    from ilge_search.testing import refuse_model_loads

    url = f"sqlite:///{tmp_path_factory.mktemp('portfolio') / 'studies.db'}"
    folders = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir)
    options = StudyOptions.from_flat(
        device="cpu", threads=1, progress=False, seed=0, max_epochs=2, n_trials=3, final_seeds=0, **folders, **DATA
    )
    for task in TASKS:
        synthetic.cache(task, **DATA)
        with refuse_model_loads():
            run_study(synthetic.model, task, "cayley", storage=url, options=options)
    return url


def copy_of(url: str, tmp_path) -> str:
    target = tmp_path / "copy.db"
    shutil.copyfile(url.removeprefix("sqlite:///"), target)
    return f"sqlite:///{target}"


def setup_of(synthetic) -> TrainingSetup:
    return TrainingSetup(synthetic.data_dir, synthetic.cache_dir, "cpu", threads=1, progress=False)


@pytest.fixture(scope="module")
def built(studies, synthetic, tmp_path_factory):
    """One matrix with its left-out checks, on a copy (the studies fixture stays clean)."""
    from ilge_search.testing import refuse_model_loads

    url = copy_of(studies, tmp_path_factory.mktemp("portfolio-run"))
    with refuse_model_loads():
        result = portfolio(url, REQUEST, setup_of(synthetic), check=True)
    return url, result


def test_candidates_are_builtin_marginal_and_each_problems_top_trials(studies):
    _, result, cells = build_matrix(studies, REQUEST)
    assert [p.task for p in result.problems] == list(TASKS)
    names = [c.name for c in result.candidates]
    assert names[0] == BUILTIN
    sources = {s for c in result.candidates for s in c.sources}
    # each problem's best complete trial is a candidate (merged with an equal one, if any)
    for problem in result.problems:
        assert f"{problem.study}#{problem.ranked[0][0]}" in sources
    assert MARGINAL in sources
    assert len({json.dumps(c.config, sort_keys=True) for c in result.candidates}) == len(result.candidates)
    assert result.planned == len(cells) == len(result.candidates) * len(result.problems) * REQUEST.seeds
    assert result.matrix.missing == len(cells)  # nothing trained yet


def test_the_matrix_is_trained_stored_and_chosen_from_on_validation(built, synthetic, no_model_loads):
    from ilge_search.engine import train_encoder
    from ilge_search.study.stored import load_training_data

    url, result = built
    assert result.matrix.missing == 0 and result.trained >= result.planned - 2  # equal cells trained once
    assert not (result.matrix.validation != result.matrix.validation).any()  # no NaN
    assert result.default == result.portfolio[0]
    assert 1 <= len(result.portfolio) <= 2 and result.values == sorted(result.values)
    # a stored cell holds what the engine gives for that config, data and seed
    opened = open_storage(url, must_exist=True)
    p = 0
    builtin = next(i for i, c in enumerate(result.candidates) if c.name == BUILTIN)
    from ilge_search.defaults.portfolio import cell_config

    config = cell_config("cayley", result.candidates[builtin].config, result.problems[p], None)
    assert config.epochs == 2  # capped at the study's max_epochs
    data = load_training_data(
        opened.load_study(result.problems[p].study), data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir
    )
    again = train_encoder(config, data.train, data.validation, task_kind=data.task_kind, seed=1000, device="cpu")
    assert result.matrix.validation[builtin, p] == pytest.approx(again.best_val_metric, abs=1e-6)
    # the choice is stored for run --warm-start
    from ilge_search.record import stored_portfolio_choice

    choice = stored_portfolio_choice(opened.load_study(portfolio_study_name("cayley", "small")))
    assert choice["portfolio"] == [result.candidates[i].config for i in result.portfolio]


def test_a_rerun_trains_nothing(built, synthetic, monkeypatch):
    import ilge_search.engine as engine

    def refuse(*args, **kwargs):
        raise AssertionError("a stored cell was trained again")

    monkeypatch.setattr(engine, "train_encoder", refuse)
    monkeypatch.setattr(engine, "train_many", refuse)  # the seeds trained in one pass
    url, first = built
    again = portfolio(url, REQUEST, setup_of(synthetic), check=True)
    assert again.trained == 0
    assert (again.matrix.validation == first.matrix.validation).all()
    assert again.portfolio == first.portfolio


def test_the_left_out_checks_choose_without_the_held_out_task(built):
    _, result = built
    rows = result.held_out.rows
    assert sorted((r["fold"], r["held_out"]) for r in rows) == [("task", "stsb"), ("task", "trec")]
    for row in rows:
        held = next(p.study for p in result.problems if p.task == row["held_out"])
        chosen = [c for c in result.candidates if c.name in (row["default_candidate"], *row["portfolio"])]
        # nothing that came only from the held-out problem's own trials is chosen
        assert all(c.name == BUILTIN or any(not s.startswith(held) for s in c.sources) for c in chosen)
        assert row["unit"] == ("acc. %" if row["task"] == "trec" else "Spearman ×100")
        assert row["portfolio_default_diff"] == pytest.approx(row["portfolio_default"] - row["builtin"])
        assert row["marginal"] == row["marginal"]  # its cells were trained: not NaN
    assert set(result.held_out.verdicts) == {("task", m) for m in ("marginal", "portfolio_default", "portfolio_best")}


def test_dry_run_creates_nothing_and_exclusions_exclude(studies, synthetic, tmp_path):
    url = copy_of(studies, tmp_path)
    dry = portfolio(url, REQUEST, setup_of(synthetic), dry_run=True)
    assert dry.trained == 0 and dry.estimated_seconds > 0 and dry.default is None
    assert portfolio_study_name("cayley", "small") not in [s.study_name for s in optuna.get_all_study_summaries(url)]
    _, only_stsb, _ = build_matrix(url, PortfolioRequest(top_k=1, seeds=1, exclude_tasks=("trec",)))
    assert [p.task for p in only_stsb.problems] == ["stsb"]
    assert not any("trec" in s for c in only_stsb.candidates for s in c.sources)
    runner = CliRunner()
    bad = runner.invoke(cli, ["portfolio", "--storage", url, "--exclude-task", "sst2", "--dry-run"])
    assert bad.exit_code != 0 and "--exclude-task sst2: no cayley (small) problem of that task" in bad.output
    assert "Traceback" not in bad.output
    shown = runner.invoke(cli, ["portfolio", "--storage", url, "--top-k", "1", "--seeds", "2", "--dry-run"])
    assert shown.exit_code == 0, shown.output
    assert (
        f"2 problems x {len(dry.candidates)} candidates x 2 seeds" in shown.output
        and "nothing was created" in shown.output
    )


def test_a_cell_claimed_by_a_live_process_is_not_trained_twice(studies, synthetic, tmp_path):
    url = copy_of(studies, tmp_path)
    _, result, cells = build_matrix(url, REQUEST)
    opened = open_storage(url)
    study = optuna.create_study(study_name=portfolio_study_name("cayley", "small"), storage=opened.rdb)

    def stamp(number):
        return WORKER_ATTR, worker_stamp(number)

    key: CellKey = cells[0].key
    assert claim_cell(opened, study, key, stamp) is not None  # this (live) process holds it
    assert claim_cell(opened, study, key, stamp) is None  # a second claim loses and is abandoned
    from ilge_search.defaults.portfolio import train_cells

    trained, left = train_cells(url, REQUEST, cells[:2], result.problems, setup_of(synthetic))
    assert (trained, left) == (1, 1)
    done, running = stored_cells(study)
    assert cells[1].key.digest in done and running == {key.digest}


def test_the_seeds_of_a_config_on_a_problem_train_together(studies, synthetic, tmp_path, monkeypatch):
    # each (problem, config) group of cells is one train_seeds call, so its seeds can share a pass
    from ilge_search.defaults import portfolio as module

    request = PortfolioRequest(top_k=1, seeds=3, size=2)
    url = copy_of(studies, tmp_path)
    _, result, cells = build_matrix(url, request)
    calls = []
    original = module.train_seeds

    def counted(data, config, seeds, **kwargs):
        calls.append(list(seeds))
        return original(data, config, seeds, batched=True, **kwargs)

    monkeypatch.setattr(module, "train_seeds", counted)
    group = [cell for cell in cells if (cell.problem, cell.candidate) == (cells[0].problem, cells[0].candidate)]
    assert [cell.key.seed for cell in group] == request.seed_list
    trained, left = module.train_cells(url, request, group, result.problems, setup_of(synthetic))
    assert (trained, left) == (3, 0) and calls == [request.seed_list]
    study = optuna.load_study(study_name=portfolio_study_name("cayley", "small"), storage=url)
    done, _ = stored_cells(study)
    data = setup_of(synthetic).load_data(
        open_storage(url).existing_study(result.problems[group[0].problem].study), with_test=True
    )
    for cell in group:  # the one-at-a-time model of each seed scores what the pass stored
        [alone] = original(data, cell.config, [cell.key.seed], batched=False, device="cpu")
        assert done[cell.key.digest].scores.validation == pytest.approx(alone.val_score, abs=1e-5)


def test_json_shape(built, synthetic):
    url, result = built
    out = CliRunner().invoke(
        cli,
        [
            "portfolio",
            "--storage",
            url,
            "--top-k",
            "1",
            "--seeds",
            "1",
            "--size",
            "2",
            "--format",
            "json",
            "--quiet",
            "--data-dir",
            str(synthetic.data_dir),
            "--cache-dir",
            str(synthetic.cache_dir),
            "--device",
            "cpu",
        ],
        env={**os.environ},
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert {"problems", "candidates", "scores", "default", "portfolio"} <= set(data)
    assert len(data["scores"]) == len(data["candidates"]) and all(
        len(r) == len(data["problems"]) for r in data["scores"]
    )
    assert data["default"]["candidate"] == data["portfolio"][0]["candidate"]
    assert data["scores"][0][0] == pytest.approx(result.matrix.validation[0, 0], abs=1e-6)


def test_warm_start_enqueues_exactly_the_portfolio_after_the_start(
    studies, synthetic, tmp_path, no_model_loads, monkeypatch
):
    from ilge_search.encoders.configs import CayleyConfig
    from ilge_search.record import portfolio as record_portfolio
    from ilge_search.record import save_portfolio_choice, study_record, trial_record
    from ilge_search.study import run_study
    from ilge_search.study.trial import config_params, recommended_params

    monkeypatch.setattr(record_portfolio, "SHIPPED_PORTFOLIO_PATH", tmp_path / "none-shipped.json")
    url = copy_of(studies, tmp_path)
    folders = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir)
    options = StudyOptions.from_flat(
        device="cpu", threads=1, progress=False, seed=0, max_epochs=2, n_trials=4, final_seeds=0, **folders, **DATA
    )
    # no portfolio in the storage and none shipped for this bucket: one clear line, nothing created
    before = {s.study_name for s in optuna.get_all_study_summaries(url)}
    with pytest.raises(ValueError, match=r"--warm-start 2: .* run `ilge-search portfolio"):
        run_study(synthetic.model, "trec", "cayley", storage=url, options=options.replace(warm_start=2))
    assert {s.study_name for s in optuna.get_all_study_summaries(url)} == before
    # none stored, one shipped: the shipped members (the storage's, below, win over them)
    shipped = [CayleyConfig(lr=3e-4, gnn_layers=2, hidden_dim=256, pooling="sum").to_dict()]
    provenance = {"source": "test", "family": "cayley", "bucket": "small", "problems": [], "chosen_on": "validation"}
    record_portfolio.write_shipped_portfolio("cayley", "small", shipped, {**provenance, "generated": "now"})
    (from_package,) = run_study(
        synthetic.model, "trec", "cayley", storage=url, options=options.replace(warm_start=1, n_trials=2)
    )
    package_trials = optuna.load_study(study_name=from_package.study_name, storage=url).trials
    assert sorted(package_trials, key=lambda t: t.number)[1].params == config_params("cayley", shipped[0])
    # a stored portfolio: the start configuration first, then the members that differ from it, in order
    members = [
        CayleyConfig(lr=3e-3, gnn_layers=2, hidden_dim=128).to_dict(),
        CayleyConfig(lr=3e-4, gnn_layers=1, hidden_dim=512).to_dict(),
        CayleyConfig(lr=1e-3, gnn_layers=3, hidden_dim=256).to_dict(),
    ]
    opened = open_storage(url)
    study = optuna.create_study(study_name=portfolio_study_name("cayley", "small"), storage=opened.rdb)
    save_portfolio_choice(study, {"portfolio": members})
    (result,) = run_study(synthetic.model, "trec", "cayley", storage=url, options=options.replace(warm_start=2))
    assert result.study_name.endswith(":warm2")
    warm = optuna.load_study(study_name=result.study_name, storage=url)
    trials = sorted(warm.trials, key=lambda t: t.number)
    hidden = study_record(warm).data.hidden_size
    assert trial_record(trials[0]).recommended
    assert trials[0].params == recommended_params("cayley", hidden, model=synthetic.model)
    assert [t.params for t in trials[1:3]] == [config_params("cayley", m) for m in members[:2]]
    assert [t.user_attrs["warm_start_member"] for t in trials[1:3]] == [0, 1]
    assert "warm_start_member" not in trials[3].user_attrs  # the sampler's
    # the study records what it enqueued and where from, and its dashboard note says so
    from ilge_search.record import warm_start_record
    from ilge_search.study.notes import write_study_note

    record = warm_start_record(warm)
    assert [m.params for m in record.members] == [t.params for t in trials[1:3]]
    assert record.origin == f"the portfolio stored in {url}" and record.left_out_task is None
    note = write_study_note(warm)
    assert "Warm start: 2 warm-start members (member 0, member 1) from the portfolio stored in" in note
    assert warm_start_record(optuna.load_study(study_name=from_package.study_name, storage=url)).origin == (
        "the portfolio shipped with ilge-search"
    )


def test_recommend_portfolio_writes_the_default_and_ships_only_a_winner(built, studies, tmp_path, monkeypatch):
    from ilge_search import tuning
    from ilge_search.defaults.transfer import shipping_verdict, stored_portfolio, trained_setting
    from ilge_search.report.defaults_page import recommend_defaults
    from ilge_search.study.trial import config_params

    url, result = built
    again = stored_portfolio(url, "cayley", "small")  # read back, nothing trained
    assert again.default == result.default and again.held_out.rows == result.held_out.rows
    default = config_params("cayley", result.candidates[result.default].config)
    data = recommend_defaults(url, tmp_path / "mine.json", None, families=["cayley"], method="portfolio")
    assert data["families"]["cayley"]["small"] == default and data["metadata"]["method"] == "portfolio"
    shipped = tmp_path / "shipped.json"
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", shipped)
    data = recommend_defaults(url, None, None, families=["cayley"], method="portfolio", update_shipped=True)
    wins, why = shipping_verdict(result.held_out, setting=trained_setting(result, default))
    assert data["metadata"]["shipping"]["cayley/small"] == why
    assert ("cayley" in json.loads(shipped.read_text())["families"]) == wins
    with pytest.raises(ValueError, match=r"no complete portfolio of cayley \(small\) .* --check` first"):
        recommend_defaults(studies, tmp_path / "none.json", None, families=["cayley"], method="portfolio")


def test_the_matrix_is_drawn_and_the_left_out_rows_tabled(built, tmp_path):
    from ilge_search.report.portfolio import draw_matrix, held_out_table, verdict_lines

    _, result = built
    path = draw_matrix(result, tmp_path / "figures" / "matrix.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = held_out_table(result.held_out).splitlines()
    assert len(table) == 2 + len(result.held_out.rows)
    first = result.held_out.rows[0]
    assert f"| {first['builtin']:.2f} |" in table[2] and f"{first['portfolio_default_diff']:+.2f}" in table[2]
    lines = verdict_lines(result.held_out)
    assert len(lines) == 3 and all(line.startswith("leave one task out") for line in lines)
