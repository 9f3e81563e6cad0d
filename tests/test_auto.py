"""``--encoder auto``: one study over methods and their settings, on synthetic embeddings (no model loads)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from ilge_search import run_study
from ilge_search.record import run_times, study_record, trial_config
from ilge_search.study import StudyOptions
from ilge_search.study.auto import METHOD_PARAM, auto_methods, suggest_auto
from ilge_search.study.identity import default_study_name
from ilge_search.testing import LayerSignal, refuse_model_loads

DATA = dict(max_train=240, max_eval=100)


def _options(synthetic, **more):
    flat = dict(
        n_trials=6,
        final_seeds=1,
        max_epochs=4,
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        threads=1,
        progress=False,
        **DATA,
    )
    return StudyOptions.from_flat(**{**flat, **more})


def _run(synthetic, url, **more):
    synthetic.cache("trec", **DATA)
    with refuse_model_loads():
        (result,) = run_study(synthetic.model, "trec", "auto", storage=url, options=_options(synthetic, **more))
    return result, optuna.load_study(study_name=result.study_name, storage=url)


def test_methods_default_to_every_family_of_the_tasks_kind_and_are_checked():
    sentence = auto_methods(None, tagging=False)
    assert sentence[0] == "last-layer" and sentence[-3:] == ("cayley", "fc", "deepset")  # the cheap starts first
    assert len(sentence) == 8 and "cayley-word" not in sentence
    assert "cayley-word" in auto_methods(None, tagging=True)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        auto_methods(("cayley", "nope"), tagging=False)
    with pytest.raises(ValueError, match="cannot run on a sentence task"):
        auto_methods(("cayley-word",), tagging=False)
    assert default_study_name("m", "t", "auto", methods=sentence) == "m:t:auto"
    assert default_study_name("m", "t", "auto", methods=("fc", "last-layer")) == "m:t:auto:methods-fc+last-layer"


def test_every_methods_start_runs_first_and_a_trials_config_is_rebuilt_from_its_params(synthetic, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    methods = "cayley,deepset,last-layer,mlp-last"
    result, study = _run(synthetic, url, methods=methods, final_seeds=0, ensemble=0)
    assert result.encoder == "auto" and study_record(study).identity.methods == tuple(methods.split(","))
    first = sorted(study.trials, key=lambda t: t.number)[:4]
    assert [t.params[METHOD_PARAM] for t in first] == methods.split(",")
    assert all(t.user_attrs.get("recommended") is True for t in first)  # the method starts
    assert all(t.state.name == "COMPLETE" for t in first)  # never pruned: each method keeps its one trial
    for trial in study.trials:
        method = trial.params[METHOD_PARAM]
        assert all(name == METHOD_PARAM or name.startswith(method + ":") for name in trial.params)
        rebuilt = suggest_auto(trial, methods.split(",")).replace(epochs=4)
        assert rebuilt == trial_config(trial)  # what final evaluation, ensembles and export read


def test_a_known_method_wins_where_only_it_can(synthetic, tmp_path):
    """The label sits in the first layer only: the last-layer probe is at chance, the best-layer probe finds it."""
    import dataclasses

    first_layer = dataclasses.replace(
        synthetic, signal=LayerSignal(layer=0, strength=12.0), cache_dir=tmp_path / "cache"
    )
    first_layer.cache("trec", **DATA)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with refuse_model_loads():
        (result,) = run_study(
            synthetic.model,
            "trec",
            "auto",
            storage=url,
            options=_options(first_layer, methods="last-layer,best-layer", n_trials=4, ensemble=0),
        )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert study.best_trial.params[METHOD_PARAM] == "best-layer"
    assert result.best_config["family"] == "best-layer" and result.test_mean > 0.5


def test_methods_are_part_of_the_identity_and_need_auto(synthetic, tmp_path):
    from ilge_search.study import StudyConflictError

    url = f"sqlite:///{tmp_path / 's.db'}"
    _run(synthetic, url, methods="last-layer,mlp-last", n_trials=2, final_seeds=0, study_name="mine")
    with pytest.raises(StudyConflictError, match="methods"):
        _run(synthetic, url, methods="last-layer", n_trials=1, final_seeds=0, study_name="mine")
    with refuse_model_loads(), pytest.raises(ValueError, match="--methods lists the methods of --encoder auto"):
        run_study(synthetic.model, "trec", "cayley", storage=url, options=_options(synthetic, methods="fc"))


# ----------------------------------------------------------------------------- --time-limit


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _timed_trial(number: int, value: float, seconds: float, **attrs):
    trial = optuna.trial.create_trial(value=value, user_attrs={"seconds": seconds, **attrs})
    trial.number = number
    return trial


def _budget(deadline, clock, *, seeds, ensemble, auto=False, **machine):
    """A classification study's time budget with the registered stages (an auto study's: with its leaderboard)."""
    from ilge_search.record import Identity, StudyRecord
    from ilge_search.study.budget import TimeBudget
    from ilge_search.study.stages import StageCosting, StudyFacts

    identity = Identity(model="m", task="trec", encoder="auto" if auto else "cayley")
    record = StudyRecord.from_attrs("s", {**identity.to_attrs(), "task_kind": "classification"})
    facts = StudyFacts("s", record, StudyOptions.from_flat(final_seeds=seeds, ensemble=ensemble), "classification")
    return TimeBudget(deadline, StageCosting(facts), clock=clock, **machine)


def test_durations_read_as_seconds():
    from ilge_search.study.budget import parse_duration

    assert parse_duration("10m") == 600 and parse_duration("90s") == 90 and parse_duration("1.5h") == 5400
    assert parse_duration(" 45 ") == 45 and parse_duration(30) == 30 and parse_duration(None) is None
    for bad in ("ten minutes", "0", "-5m", "5d"):
        with pytest.raises(ValueError, match="time_limit"):
            parse_duration(bad)
    assert StudyOptions.from_flat(time_limit="2m", n_trials=None).search.time_limit == 120


def test_the_search_stops_when_the_time_left_is_what_the_stages_need():
    from ilge_search.study.budget import SAFETY, STAGE_OVERHEAD_SECONDS

    clock = FakeClock()
    budget = _budget(clock.now + 100, clock, seeds=2, ensemble=3)
    assert budget.reserve([]) == 0 and not budget.should_stop([])  # nothing measured: the first trial runs
    trials = [
        _timed_trial(0, 0.5, 4.0),  # the start
        _timed_trial(1, 0.9, 2.0),
        _timed_trial(2, 0.8, 6.0, layer_scores=[0.1, 0.2]),  # a best-layer trial: the probe's cost
        _timed_trial(3, 0.7, 1.0),
    ]
    # final: 2 seeds x (the best trial 2.0 + the start, whose 4.0 included its process's set-up and counts at
    # most the others' median 2.0); ensemble: 2 seeds x (the next two by value, 6.0 and 1.0, + the probe 6.0)
    final = 2 * (2.0 + 2.0)
    ensemble = 2 * (6.0 + 1.0 + 6.0)
    assert budget.reserve(trials) == pytest.approx((final + ensemble) * SAFETY + STAGE_OVERHEAD_SECONDS)
    reserve = budget.reserve(trials)
    clock.now = budget.deadline - reserve - 1  # a second more than the stages need: a zero-second trial fits
    assert not budget.should_stop(trials)
    clock.now = budget.deadline - reserve + 1
    assert budget.should_stop(trials)
    without = _budget(budget.deadline, clock, seeds=0, ensemble=0)
    assert without.reserve(trials) == 0  # no final seeds: the search may use all of it
    board = _budget(budget.deadline, clock, seeds=2, ensemble=3, auto=True)
    # the leaderboard trains each method's best trial the final evaluation and the ensemble did not (all one
    # family here: none) and its own probe; the ensemble's members it reuses
    probe = 2 * 6.0
    assert board.reserve(trials) == pytest.approx((final + ensemble + probe) * SAFETY + 2 * STAGE_OVERHEAD_SECONDS)


def test_the_stages_cost_the_trials_cpu_time_at_the_share_of_a_core_they_will_get():
    # two workers on two cores, each trial half waiting (another job, the storage): its CPU time is what a
    # retraining alone needs once the workers have stopped, unless other work still keeps the cores busy
    from ilge_search.study.budget import SAFETY, STAGE_OVERHEAD_SECONDS

    clock = FakeClock()
    trials = [_timed_trial(n, 0.5 + n / 10, 4.0, cpu_seconds=2.0) for n in range(4)]

    def budget(load, threads=1):
        machine = dict(workers=2, threads=threads, load=lambda: load, cores=lambda: 2)
        return _budget(clock.now + 100, clock, seeds=2, ensemble=2, **machine)

    # final: 2 seeds x (the best + the start); ensemble: 2 seeds x (one more member + the median as the probe)
    trainings = 2 * 2 + 2 * 2
    assert budget(load=2.0).stage_share() == 1.0  # only this run's two workers: a free core for the stages
    assert budget(load=2.0).reserve(trials) == pytest.approx(trainings * 2.0 * SAFETY + STAGE_OVERHEAD_SECONDS)
    assert budget(load=4.0).stage_share() == pytest.approx(2 / 3)  # two other processes keep running
    assert budget(load=4.0).reserve(trials) == pytest.approx(trainings * 3.0 * SAFETY + STAGE_OVERHEAD_SECONDS)
    # never more than the trials' wall time, and the wall time where CPU time cannot tell (several threads)
    assert budget(load=9.0).reserve(trials) == pytest.approx(trainings * 4.0 * SAFETY + STAGE_OVERHEAD_SECONDS)
    assert budget(load=2.0, threads=2).reserve(trials) == budget(load=9.0).reserve(trials)
    without_cpu = [_timed_trial(n, 0.5 + n / 10, 4.0) for n in range(4)]  # older trials recorded no CPU time
    assert budget(load=2.0).reserve(without_cpu) == budget(load=9.0).reserve(trials)


def test_a_time_limited_auto_run_ends_within_the_limit(synthetic, tmp_path):
    import time

    url = f"sqlite:///{tmp_path / 's.db'}"
    limit = 30.0
    synthetic.cache("trec", **DATA)
    started = time.perf_counter()
    with refuse_model_loads():
        (result,) = run_study(
            synthetic.model,
            "trec",
            "auto",
            storage=url,
            options=_options(synthetic, n_trials=None, time_limit=limit, final_seeds=2),
        )
    took = time.perf_counter() - started
    # the stages' reserve is forecast from the trials' own times: on a machine that other tests load, a stage can run
    # slower than its trials did, so the wall-clock bound allows a quarter over
    assert 0.6 * limit <= took <= 1.25 * limit, took
    assert result.n_complete >= 2 and result.test_mean is not None and result.ensemble is not None
    # the study records the limit, its share of it and where the time went (what reports/auto.md shows)
    (times,) = run_times(optuna.load_study(study_name=result.study_name, storage=url))
    assert times.time_limit == limit and times.limit == pytest.approx(limit)
    assert list(times.stages) == ["final", "ensemble", "leaderboard"] and not times.cap_reached
    assert times.elapsed <= took and times.used == pytest.approx(times.elapsed / limit)


# ----------------------------------------------------------------------------- leaderboard, export


def invoke(*args):
    from click.testing import CliRunner

    from ilge_search.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def leaderboard_study(synthetic, tmp_path_factory):
    """An auto study run from the command line over two ILGE encoders and two baselines, with its leaderboard."""
    folder = tmp_path_factory.mktemp("leaderboard")
    url = f"sqlite:///{folder / 's.db'}"
    synthetic.cache("trec", **DATA)
    with refuse_model_loads():
        result = invoke(
            "run",
            "--model",
            synthetic.model,
            "--task",
            "trec",
            "--encoder",
            "auto",
            "--methods",
            "cayley,deepset,last-layer,mlp-last",
            "--n-trials",
            8,
            "--final-seeds",
            2,
            "--ensemble",
            4,
            "--max-train",
            240,
            "--max-eval",
            100,
            "--max-epochs",
            4,
            "--storage",
            url,
            "--data-dir",
            synthetic.data_dir,
            "--cache-dir",
            synthetic.cache_dir,
            "--device",
            "cpu",
            "--threads",
            1,
            "-q",
        )
    assert result.exit_code == 0, result.output
    (summary,) = optuna.get_all_study_summaries(url)
    return {"url": url, "name": summary.study_name, "output": result.output, "synthetic": synthetic}


def _record(leaderboard_study):
    from ilge_search.record import leaderboard_record

    study = optuna.load_study(study_name=leaderboard_study["name"], storage=leaderboard_study["url"])
    return study, leaderboard_record(study)


def test_run_prints_the_leaderboard_with_a_row_per_method_and_the_ensembles(leaderboard_study):
    study, record = _record(leaderboard_study)
    assert f"leaderboard of {leaderboard_study['name']}" in leaderboard_study["output"]
    kinds = [row.kind for row in record.rows]
    assert kinds[-1] == "reference" and "selected" in kinds and "ensemble" in kinds
    methods = {row.name for row in record.rows if row.kind == "method"}
    complete = {trial_config(t).family for t in study.trials if t.state.name == "COMPLETE"}
    assert methods == complete  # every method with a complete trial has its row
    assert record.seeds == [1000, 1001] and all(len(row.test_scores) == 2 for row in record.rows)


def test_each_difference_is_paired_over_the_same_texts_and_seeds_and_a_tie_contains_zero(leaderboard_study):
    import numpy as np
    from optuna.artifacts import FileSystemArtifactStore, download_artifact

    from ilge_search.study.statistics import BootstrapSettings, paired_bootstrap

    _, record = _record(leaderboard_study)
    reference = record.rows[-1]
    folder = Path(leaderboard_study["url"].removeprefix("sqlite:///")).parent
    store = FileSystemArtifactStore(str(folder / "artifacts"))
    target = folder / "predictions.npz"
    download_artifact(artifact_store=store, file_path=str(target), artifact_id=record.predictions)
    arrays = np.load(target)
    truth = arrays["truth"]
    for index, row in enumerate(record.rows):
        labels = arrays[f"row{index}"]
        assert [float((seed == truth).mean()) for seed in labels] == pytest.approx(row.test_scores)
        if row is reference:
            assert row.difference is None
            continue
        estimate, low, high = row.difference
        assert estimate == pytest.approx(row.test_mean - reference.test_mean)
        assert low <= estimate <= high
        assert (row.verdict == "tie") == (low <= 0 <= high)
        again = paired_bootstrap(truth, labels, arrays[f"row{len(record.rows) - 1}"], "accuracy", BootstrapSettings())
        assert (again.low, again.high) == pytest.approx((low, high))


def test_the_ensemble_without_ilge_members_reweights_the_same_members_predictions(leaderboard_study):
    from ilge_search.study.leaderboard import ilge_member

    study, record = _record(leaderboard_study)
    ensemble, without = record.row("ensemble"), record.row("ensemble-baselines")
    families = {str(t.number): trial_config(t).family for t in study.trials if t.user_attrs.get("config")}
    if without is None:  # every member an ILGE encoder, or none: nothing to take away
        assert len({ilge_member(families[n]) for n in ensemble.members}) == 1
        return
    assert without.members == {n: c for n, c in ensemble.members.items() if not ilge_member(families[n])}
    assert without.members and len(without.members) < len(ensemble.members)


def test_the_paired_interval_covers_a_known_difference():
    import numpy as np

    from ilge_search.study.statistics import paired_bootstrap

    rng = np.random.default_rng(0)
    truth = rng.integers(0, 3, 2000)
    right_first, right_second = rng.random(2000) < 0.8, rng.random(2000) < 0.6  # true difference 0.2
    first = np.where(right_first, truth, (truth + 1) % 3)
    second = np.where(right_second, truth, (truth + 1) % 3)
    interval = paired_bootstrap(truth, first, second, "accuracy")
    assert interval.low < 0.2 < interval.high and interval.verdict == "win"
    assert paired_bootstrap(truth, first, first, "accuracy").verdict == "tie"


def test_leaderboard_command_formats_and_its_refusal(leaderboard_study, tmp_path):
    import json

    url, name = leaderboard_study["url"], leaderboard_study["name"]
    table = invoke("leaderboard", "--storage", url, "--study", name)
    assert table.exit_code == 0 and "best single layer" in table.output and "vs best layer" in table.output
    rows = json.loads(invoke("leaderboard", "--storage", url, "--study", name, "--format", "json").output)
    assert rows[-1]["kind"] == "reference" and {"val", "test_mean", "ci_low", "params"} <= set(rows[0])
    csv = invoke("leaderboard", "--storage", url, "--study", name, "--format", "csv").output
    assert csv.splitlines()[0].startswith("model,kind,val")
    missing = invoke("leaderboard", "--storage", url, "--study", "nope")
    assert missing.exit_code != 0 and "Traceback" not in missing.output


def test_export_of_an_auto_study_writes_the_model_its_validation_chose(leaderboard_study, tmp_path):
    from ilge_search import ILGEClassifier

    _, record = _record(leaderboard_study)
    synthetic = leaderboard_study["synthetic"]
    out = tmp_path / "model"
    url, name = leaderboard_study["url"], leaderboard_study["name"]
    result = invoke("export", "--storage", url, "--study", name, "--out", out, "--cache-dir", synthetic.cache_dir)
    assert result.exit_code == 0, result.output
    ensemble_wins = record.row("ensemble").val_mean > record.row("selected").val_mean
    assert ("exported the ensemble" in result.output) == ensemble_wins and "rule:" in result.output
    clf = ILGEClassifier.load(out, device="cpu", cache_dir=synthetic.cache_dir, base_model=synthetic.model)
    assert (getattr(clf, "n_members_", 1) > 1) == ensemble_wins
    texts = ["what is the capital of peru", "how many legs does a spider have"]  # embedded by the tiny model
    assert len(clf.predict(texts)) == 2


def test_an_auto_study_of_a_tagging_task_searches_the_per_word_methods(tmp_path):
    """A toy tagging task (a tiny local encoder): the auto study's starts include the per-word Cayley encoder,
    its final evaluation tags words, its leaderboard scores token accuracy against the best single-layer probe
    per word (no ensemble rows: tagging studies have none), and its export is the selected trial, saying why."""
    import json

    import numpy as np

    from ilge_search import ILGETagger
    from ilge_search.record import leaderboard_record
    from ilge_search.study.leaderboard import format_table
    from ilge_search.testing.tiny_models import tiny_encoder

    words = ["the", "a", "fox", "dog", "runs", "jumps", ",", "."]
    tags = {"the": "DET", "a": "DET", "fox": "NOUN", "dog": "NOUN", "runs": "VERB", "jumps": "VERB"}
    task = tmp_path / "pos_toy"
    task.mkdir()
    for split, (count, seed) in {"train": (24, 0), "validation": (8, 1), "test": (8, 2)}.items():
        rng = np.random.default_rng(seed)
        rows = [list(rng.choice(words, size=int(rng.integers(2, 7)))) for _ in range(count)]
        lines = [json.dumps({"tokens": r, "tags": [tags.get(w, "PUNCT") for w in r]}) + "\n" for r in rows]
        (task / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 's.db'}"
    options = StudyOptions.from_flat(
        n_trials=2,
        methods="last-layer,cayley-word",
        max_epochs=2,
        final_seeds=1,
        cache_dir=str(tmp_path / "cache"),
        progress=False,
        device="cpu",
    )
    model = str(tiny_encoder(tmp_path / "model"))
    (result,) = run_study(model, str(task), "auto", storage=url, options=options)
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert [t.params[METHOD_PARAM] for t in study.trials] == ["last-layer", "cayley-word"]
    assert result.test_mean is not None
    record = leaderboard_record(study)
    assert record is not None and record.unit == "words" and record.metric == "accuracy"
    assert [row.kind for row in record.rows] == ["method", "method", "selected", "reference"]
    assert {row.name for row in record.rows if row.kind == "method"} == {"last-layer", "cayley-word"}
    selected = record.row("selected")
    assert selected.test_scores == pytest.approx([result.test_mean])  # the final evaluation's model, reused
    assert all(0.0 <= score <= 1.0 for row in record.rows for score in row.test_scores)
    assert record.rows[-1].difference is None and all(row.difference is not None for row in record.rows[:-1])
    assert "paired bootstrap over the same test words" in format_table(record)

    out = tmp_path / "tagger"
    exported = invoke("export", "--storage", url, "--study", result.study_name, "--out", out)
    assert exported.exit_code == 0, exported.output
    assert "no ensemble (tagging studies have none): its selected trial is exported" in exported.output
    tagger = ILGETagger.load(out, device="cpu", cache_dir=str(tmp_path / "cache"), base_model=model)
    assert len(tagger.predict([["the", "fox", "runs"]])[0]) == 3


def test_the_leaderboard_is_a_report_section_and_a_dashboard_note(leaderboard_study):
    from ilge_search.study.stages import LeaderboardStage

    study, record = _record(leaderboard_study)
    part = LeaderboardStage().report_part([study])
    assert part is not None and part.title == "Auto studies: leaderboards" and len(part.rows) == len(record.rows)
    assert LeaderboardStage().report_part([]) is None
    note = "\n".join(LeaderboardStage().note_lines(study, "accuracy"))
    assert "### Leaderboard" in note and "best single layer" in note


def test_no_trial_is_trained_twice_with_a_final_seed_in_one_run(synthetic, tmp_path, monkeypatch):
    """The final evaluation, the ensemble and the leaderboard share what they train: each (trial config, final
    seed) is trained at most once in a run."""
    import json
    from collections import Counter

    from ilge_search import engine
    from ilge_search.study import retraining

    trainings: Counter[tuple[str, int]] = Counter()
    train_alone, train_many = retraining._train_alone, engine.train_many

    def counted(data, config, seed, device):
        trainings[json.dumps(config.to_dict(), sort_keys=True), seed] += 1
        return train_alone(data, config, seed, device)

    def counted_pass(jobs, *args, **kwargs):
        for job in jobs:
            trainings[json.dumps(job.config.to_dict(), sort_keys=True), job.seed] += 1
        return train_many(jobs, *args, **kwargs)

    monkeypatch.setattr(retraining, "_train_alone", counted)
    monkeypatch.setattr(engine, "train_many", counted_pass)
    url = f"sqlite:///{tmp_path / 's.db'}"
    _, study = _run(synthetic, url, methods="cayley,deepset,last-layer,mlp-last", n_trials=8, final_seeds=2, ensemble=4)
    from ilge_search.record import ensemble_record, leaderboard_record

    assert leaderboard_record(study) is not None and ensemble_record(study).ensemble is not None
    final = {(key, seed): n for (key, seed), n in trainings.items() if seed in (1000, 1001)}
    assert final and max(final.values()) == 1, [item for item in final.items() if item[1] > 1]


def test_a_storage_of_auto_studies_has_a_report_with_their_leaderboards(leaderboard_study, tmp_path):
    from ilge_search.report import build_report

    _, record = _record(leaderboard_study)
    name = leaderboard_study["name"]
    result = build_report(leaderboard_study["url"], tmp_path / "report", progress=False)
    markdown = result.files["markdown"].read_text(encoding="utf-8")
    assert "## Auto studies: leaderboards" in markdown and "(1 study)" in markdown
    section = markdown.split("## Auto studies: leaderboards", 1)[1].split("\n## ", 1)[0]
    assert sum(line.startswith(f"| {name} ") for line in section.splitlines()) == len(record.rows)
    assert any(line.startswith(f"{name}: an auto study, not in the tables") for line in result.skipped)
    assert "| study | setting |" not in markdown  # no empty table of the studies the tables show
    assert result.results.empty  # no per-model table: an auto study's method is no column
    html = result.files["html"].read_text(encoding="utf-8")
    assert "Auto studies: leaderboards" in html


def test_a_storage_without_ilge_studies_still_has_no_report(tmp_path):
    from ilge_search.report import build_report

    url = f"sqlite:///{tmp_path / 'other.db'}"
    optuna.create_study(study_name="not-ours", storage=url)
    with pytest.raises(ValueError, match="no ilge-search studies"):
        build_report(url, tmp_path / "report", progress=False)
