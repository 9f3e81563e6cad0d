"""Ensembles of a study's trials: greedy selection on synthetic predictions, the mixing model, the record,
and on small synthetic studies `ilge-search ensemble`, `run --ensemble`, `export --ensemble` and `predict`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ilge_search import ILGEClassifier, run_study
from ilge_search.cli import cli
from ilge_search.encoders.configs import CayleyConfig, DeepSetConfig
from ilge_search.engine import build_model, predict_logits
from ilge_search.engine.ensemble import EnsembleModel, greedy_selection, mixed, prediction_score
from ilge_search.record import EnsembleRecord, EnsembleSize, ensemble_record
from ilge_search.study import StudyOptions
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=240, max_eval=100)
SMALL = dict(**DATA, max_epochs=4)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# ----------------------------------------------------------------------------- the numpy core


def _one_hot(labels, num_classes=3):
    return np.eye(num_classes)[np.asarray(labels)]


def _half_sure(targets, sure_rows):
    """Probabilities that are 0.8 right on ``sure_rows`` and, elsewhere, lean (0.4 to 0.35) to a wrong class."""
    out = np.zeros((len(targets), 3))
    for row, label in enumerate(targets):
        wrong, other = (label + 1) % 3, (label + 2) % 3
        out[row, [label, wrong, other]] = (0.8, 0.1, 0.1) if row in sure_rows else (0.35, 0.4, 0.25)
    return out


def test_greedy_finds_the_complementary_pair_no_single_trial_matches():
    targets = np.array([0, 1, 2, 0, 1, 2])
    weak = _one_hot([0, 0, 0, 0, 0, 0])
    first_half = _half_sure(targets, {0, 1, 2})
    second_half = _half_sure(targets, {3, 4, 5})
    confident = _one_hot([0, 1, 2, 1, 2, 0]) * 0.9 + 0.1 / 3  # right on the first half, sure of everything
    candidates = [weak, first_half, second_half, confident]

    def score(mean):
        return prediction_score(mean, targets, "classification", "accuracy")

    assert [score(c) for c in candidates] == [pytest.approx(2 / 6), 0.5, 0.5, 0.5]
    picks = greedy_selection(candidates, score, 2)
    assert picks == [1, 2]  # ties at step one go to the lowest index; the second pick completes it
    assert score(mixed({i: candidates[i] for i in set(picks)}, {1: 1, 2: 1})) == 1.0


def test_an_ensemble_of_one_is_the_best_single_candidate_with_ties_to_the_earliest():
    targets = np.array([0.1, 0.5, 0.9, 0.3])
    candidates = [np.array([0.2, 0.4, 0.8, 0.1]), np.array([0.1, 0.5, 0.9, 0.3]), np.array([0.0, 0.6, 1.0, 0.2])]

    def score(mean):
        return prediction_score(mean, targets, "similarity", "spearman")

    assert greedy_selection(candidates, score, 1) == [1]
    same = [candidates[1], candidates[1].copy()]
    assert greedy_selection(same, score, 3) == [0, 0, 0]  # equal candidates: the earlier one, again and again


def test_greedy_minimises_a_loss_and_refuses_bad_sizes():
    candidates = [np.array([3.0]), np.array([1.0]), np.array([-1.0])]
    picks = greedy_selection(candidates, lambda mean: abs(float(mean[0])), 2, maximize=False)
    assert picks == [1, 2]  # |1| first, then (1 + -1) / 2 = 0
    with pytest.raises(ValueError, match="size >= 1"):
        greedy_selection(candidates, lambda mean: 0.0, 0)


def test_similarity_ensembles_average_the_predicted_scores():
    members = {3: np.array([0.2, 0.8]), 5: np.array([0.6, 0.4])}
    np.testing.assert_allclose(mixed(members, {3: 2, 5: 1}), [(0.4 + 0.6) / 3, (1.6 + 0.4) / 3])


# ----------------------------------------------------------------------------- the mixing model


def _members(task_kind="classification"):
    torch.manual_seed(0)
    kwargs = dict(num_classes=4) if task_kind == "classification" else dict(score_range=(0.0, 5.0))
    return [
        build_model(CayleyConfig(hidden_dim=16), 5, 8, task_kind, **kwargs),
        build_model(DeepSetConfig(hidden_dim=8), 5, 8, task_kind, **kwargs),
    ]


def test_the_ensemble_mixes_probabilities_and_one_member_is_that_member():
    members = _members()
    x = torch.randn(7, 5, 8)
    probs = [torch.softmax(predict_logits(m, x).double(), dim=1) for m in members]
    model = EnsembleModel(members, [2, 1])
    mixed_probs = torch.softmax(predict_logits(model, x).double(), dim=1)
    torch.testing.assert_close(mixed_probs, (2 * probs[0] + probs[1]) / 3, atol=1e-6, rtol=0)
    single = EnsembleModel(members[:1], [1])
    assert torch.equal(predict_logits(single, x), predict_logits(members[0], x))
    assert model.n_members == 2 and "n_members=2" in repr(model)


def test_the_ensemble_mixes_similarity_scores_and_checks_its_members():
    members = _members("similarity")
    pairs = torch.randn(6, 2, 5, 8)
    model = EnsembleModel(members, [1, 1])
    expected = (predict_logits(members[0], pairs) + predict_logits(members[1], pairs)) / 2
    torch.testing.assert_close(predict_logits(model, pairs), expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="one task kind"):
        EnsembleModel([members[0], _members()[0]], [1, 1])
    with pytest.raises(ValueError, match="non-negative"):
        EnsembleModel(members, [1, -1])


def test_the_record_round_trips():
    size = EnsembleSize(
        size=3, members={"0": 2, "4": 1}, val_score=0.8, test_scores=[0.7, 0.75], test_mean=0.725, test_std=0.03
    )
    record = EnsembleRecord(
        size=3,
        picks=[0, 4, 0],
        sizes={"3": size},
        seeds=[1000, 1001],
        max_epochs=4,
        select="best",
        selected_trial=4,
        selected_test_scores=[0.7, 0.7],
    )
    back = EnsembleRecord.from_value(json.loads(json.dumps(record.to_value())))
    assert back == record and back.ensemble == size and back.ensemble.n_members == 2
    assert back.matches(3, [1000, 1001], 4, "best") and not back.matches(3, [1000], 4, "best")
    assert EnsembleRecord.from_value({"size": 3}) is None


# ----------------------------------------------------------------------------- on studies


@pytest.fixture(scope="module")
def ensembled(tmp_path_factory, synthetic):
    """A TREC Cayley study run with --ensemble 3 (4 trials, 2 final seeds), and an STS-B one whose trials'
    validation predictions are dropped, ensembled afterwards by `ilge-search ensemble` (backfill)."""
    folder = tmp_path_factory.mktemp("ensemble")
    url = f"sqlite:///{folder / 'studies.db'}"
    common = dict(
        data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu", threads=1, progress=False, **SMALL
    )
    for task in ("trec", "stsb"):
        synthetic.cache(task, **DATA)
    with refuse_model_loads():
        trec = run_study(
            synthetic.model,
            "trec",
            "cayley",
            storage=url,
            options=StudyOptions.from_flat(n_trials=4, final_seeds=2, ensemble=3, select="best", **common),
        )[0]
        stsb = run_study(  # cross-validated trials keep no validation predictions: the command backfills them
            synthetic.model,
            "stsb",
            "cayley",
            storage=url,
            options=StudyOptions.from_flat(n_trials=3, final_seeds=1, cv=2, ensemble=0, **common),
        )[0]
    return {"url": url, "folder": folder, "trec": trec.study_name, "stsb": stsb.study_name, "synthetic": synthetic}


def _study(url, name):
    import optuna

    return optuna.load_study(study_name=name, storage=url)


@pytest.mark.slow  # the module fixture runs two small studies (about a minute on 2 cores)
def test_run_with_ensemble_stores_the_ensemble_beside_the_selected_trial(ensembled):
    study = _study(ensembled["url"], ensembled["trec"])
    record = ensemble_record(study)
    assert record is not None and record.size == 3 and len(record.picks) == 3
    final = study.user_attrs
    assert record.selected_trial == final["final_trial"]
    assert record.selected_test_scores == final["final_test_scores"]  # the final evaluation's, same seeds
    assert record.seeds == final["final_seeds"] and len(record.best_layer_test_scores) == 2
    ensemble = record.ensemble
    assert ensemble is not None and sum(ensemble.members.values()) == 3
    assert len(ensemble.test_scores) == 2 and all(0.0 <= s <= 1.0 for s in ensemble.test_scores)
    assert ensemble.val_test_gap == pytest.approx(ensemble.val_score - ensemble.test_mean)
    # every trial stored its own validation predictions while it ran: nothing was backfilled
    assert all(t.user_attrs.get("val_predictions") for t in study.trials if t.state.name == "COMPLETE")
    assert "ensemble_val_predictions" not in study.user_attrs


@pytest.mark.slow  # the module fixture runs two small studies (about a minute on 2 cores)
def test_export_and_predict_give_the_mean_of_the_members_probabilities(ensembled, tmp_path):
    synthetic = ensembled["synthetic"]
    out = tmp_path / "ensemble"
    result = invoke(
        "export",
        "--storage",
        ensembled["url"],
        "--study",
        ensembled["trec"],
        "--out",
        out,
        "--ensemble",
        "--cache-dir",
        synthetic.cache_dir,
    )
    assert result.exit_code == 0, result.output
    assert "exported the ensemble" in result.output
    clf = ILGEClassifier.load(out, device="cpu", cache_dir=synthetic.cache_dir, base_model=synthetic.model)
    record = ensemble_record(_study(ensembled["url"], ensembled["trec"]))
    assert clf.n_members_ == record.ensemble.n_members
    x = torch.randn(9, clf.num_layers_, clf.hidden_size_)
    weights = [clf.model_.mix[i].item() for i in range(clf.n_members_)]
    member_probs = [torch.softmax(predict_logits(m, x).double(), dim=1).numpy() for m in clf.model_.members]
    expected = sum(w * p for w, p in zip(weights, member_probs, strict=True))
    np.testing.assert_allclose(clf.predict_proba_embeddings(x), expected, atol=1e-6)
    counts = sorted(record.ensemble.members.values())
    assert sorted(round(w * 3) for w in weights) == counts
    texts = ["how far is the moon", "who wrote hamlet", "what is a ferret"]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    predicted = invoke(
        "--device",
        "cpu",
        "--cache-dir",
        synthetic.cache_dir,
        "predict",
        out,
        "--input",
        source,
        "--out",
        target,
        "--proba",
        "--base-model",
        synthetic.model,
        "--quiet",
    )
    assert predicted.exit_code == 0, predicted.output
    rows = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    probs = clf.predict_proba(texts)  # one extraction per text, whatever the number of members
    assert [row["label"] for row in rows] == [str(label) for label in clf.predict(texts)]
    assert len(rows) == 3 and probs.shape == (3, len(clf.classes_))


@pytest.mark.slow  # the module fixture runs two small studies (about a minute on 2 cores)
def test_the_ensemble_command_backfills_and_scores_sizes(ensembled):
    study = _study(ensembled["url"], ensembled["stsb"])
    synthetic = ensembled["synthetic"]
    with refuse_model_loads():
        result = invoke(
            "ensemble",
            "--storage",
            ensembled["url"],
            "--study",
            ensembled["stsb"],
            "--size",
            "2",
            "--also",
            "1",
            "--data-dir",
            synthetic.data_dir,
            "--cache-dir",
            synthetic.cache_dir,
            "--device",
            "cpu",
            "-q",
        )
    assert result.exit_code == 0, result.output
    assert "ensemble of 1" in result.output and "ensemble of 2" in result.output
    assert "mean of the members' predicted cosine similarities" in result.output
    record = ensemble_record(_study(ensembled["url"], ensembled["stsb"]))
    assert record is not None and set(record.sizes) == {"1", "2"}
    # the ensemble of one is the first pick, the trial with the best validation score on its predictions
    assert record.sizes["1"].members == {str(record.picks[0]): 1}
    backfilled = study.user_attrs["ensemble_val_predictions"]
    complete = [t.number for t in study.trials if t.state.name == "COMPLETE"]
    assert sorted(int(n) for n in backfilled) == complete and {e["seed"] for e in backfilled.values()} == {0}


@pytest.mark.slow  # the module fixture runs two small studies (about a minute on 2 cores)
def test_the_ensemble_command_trains_nothing_when_its_evaluation_is_current(ensembled, monkeypatch):
    args = ["--storage", ensembled["url"], "--study", ensembled["stsb"], "--size", "2", "--also", "1", "-q"]
    synthetic = ensembled["synthetic"]
    data = ["--data-dir", synthetic.data_dir, "--cache-dir", synthetic.cache_dir, "--device", "cpu"]
    first = invoke("ensemble", *args, *data)
    assert first.exit_code == 0, first.output

    def refuse(*_args, **_kwargs):
        raise AssertionError("a current ensemble evaluation was trained again")

    monkeypatch.setattr("ilge_search.cli.ensemble.ensemble_evaluation", refuse)
    monkeypatch.setattr("ilge_search.cli.ensemble.load_training_data", refuse)
    again = invoke("ensemble", *args, *data)
    assert again.exit_code == 0, again.output
    assert again.output == first.output
    with pytest.raises(AssertionError, match="trained again"):  # a size it lacks: not current, so it trains
        invoke("ensemble", *args, "--also", "3", *data)


@pytest.mark.slow  # the module fixture runs two small studies (about a minute on 2 cores)
def test_ensemble_refuses_multi_objective_studies_in_one_line(ensembled):
    from ilge_search.record import Identity
    from ilge_search.testing.store import FakeTrial, add_study

    identity = Identity(model="minilm-l6", task="trec", encoder="cayley", objectives=("score", "params"))
    add_study(ensembled["url"], identity, trials=[FakeTrial([0.8, 1000.0])], study_name="pareto")
    result = invoke("ensemble", "--storage", ensembled["url"], "--study", "pareto", "--size", "3")
    assert result.exit_code != 0 and "multi-objective: ensembles are off" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    missing = invoke("ensemble", "--storage", ensembled["url"], "--study", "nope", "--size", "3")
    assert missing.exit_code != 0 and "no study 'nope'" in missing.output


@pytest.mark.slow  # the module fixture runs two small studies (about a minute on 2 cores)
def test_studies_tables_notes_and_the_report_show_the_ensemble(ensembled, tmp_path):
    from ilge_search.report.ensembles import draw_ensemble_figure, ensemble_frame, ensemble_rows, ensemble_sentences
    from ilge_search.study import format_results, study_result
    from ilge_search.study.notes import write_study_note

    study = _study(ensembled["url"], ensembled["trec"])
    listed = invoke("studies", "--storage", ensembled["url"], "--format", "json")
    rows = {row["study"]: row for row in json.loads(listed.output)}
    stored = ensemble_record(study)
    assert rows[ensembled["trec"]]["ensemble_k"] == 3
    assert rows[ensembled["trec"]]["ensemble_test_mean"] == pytest.approx(stored.ensemble.test_mean)
    table = format_results([study_result(study)])
    assert "ensemble test (picks, vs selected)" in table and f"{stored.ensemble.test_mean:.4f}" in table
    note = write_study_note(study)
    assert "### Ensembles" in note and "| K = 3 |" in note
    frame = ensemble_frame([study])
    assert list(frame["k"]) == [3] and frame["ensemble"].iloc[0] == pytest.approx(stored.ensemble.test_mean * 100)
    header, table_rows = ensemble_rows(frame)
    assert len(table_rows) == 1 and len(table_rows[0]) == len(header)
    assert ensemble_sentences(frame)[0].startswith("K = 3: ensemble minus selected trial")
    assert draw_ensemble_figure(frame, tmp_path / "vs-k.png") and (tmp_path / "vs-k.png").stat().st_size > 0


def test_grids_and_the_command_line_take_an_ensemble_size(tmp_path):
    from ilge_search.study import load_sweep

    grid = tmp_path / "grid.toml"
    grid.write_text(
        'models = ["minilm-l6"]\nencoders = ["cayley"]\nensemble = 3\n[trials]\ndefault = 2\n[tasks.trec]\n',
        encoding="utf-8",
    )
    assert load_sweep(grid).study_options().final.ensemble == 3
    assert StudyOptions().final.ensemble is None  # the default size where a study can have one
    with pytest.raises(ValueError, match="ensemble"):
        StudyOptions.from_flat(ensemble=-1)
    help_text = invoke("run", "--help").output
    assert "--ensemble" in help_text and "greedily" in help_text


def test_the_default_ensemble_goes_where_a_study_can_have_one_and_asked_sizes_say_why_not(tmp_path):
    from ilge_search.record import Identity, TrialRecord
    from ilge_search.study.options import DEFAULT_ENSEMBLE
    from ilge_search.study.stages.ensemble_work import ensemble_size
    from ilge_search.testing.store import FakeTrial, add_study

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    config = CayleyConfig().__dict__

    def trial(*value):
        return FakeTrial(value[0] if len(value) == 1 else list(value), record=TrialRecord(config=dict(config)))

    single = Identity(model="minilm-l6", task="trec", encoder="cayley")
    two = add_study(url, single, trials=[trial(0.7), trial(0.8)], study_name="two")
    one = add_study(url, single, trials=[trial(0.7)], study_name="one")
    pareto = Identity(model="minilm-l6", task="trec", encoder="cayley", objectives=("score", "params"))
    front = add_study(url, pareto, trials=[trial(0.8, 10.0), trial(0.7, 5.0)], study_name="front")
    assert DEFAULT_ENSEMBLE == 5
    assert ensemble_size(two, None) == (5, None) and ensemble_size(two, 3) == (3, None)
    assert ensemble_size(two, 0) == (0, None)
    assert ensemble_size(one, None) == (0, None)
    size, note = ensemble_size(one, 2)  # asked: one trial is enough, and the run says it is no choice
    assert size == 2 and note is not None and "it has 1: its ensemble is that trial alone" in note
    assert ensemble_size(front, None) == (0, None)  # the default is silent where it cannot apply
    size, why_not = ensemble_size(front, 3)
    assert size == 0 and why_not is not None and "multi-objective: ensembles are off" in why_not


def test_an_ensemble_chosen_before_the_study_grew_is_stale(tmp_path):
    import dataclasses

    from ilge_search.record import Identity, TrialRecord, save_ensemble
    from ilge_search.study.stages.ensemble_work import EnsembleRun, ensemble_is_current
    from ilge_search.testing.store import FakeTrial, add_study

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    trials = [FakeTrial(v, record=TrialRecord(config=dict(CayleyConfig().__dict__))) for v in (0.7, 0.8, 0.75)]
    study = add_study(url, Identity(model="minilm-l6", task="trec", encoder="cayley"), trials=trials)
    size = EnsembleSize(size=3, members={"1": 3}, val_score=0.8, test_scores=[0.7], test_mean=0.7, test_std=0.0)
    stored = EnsembleRecord(
        size=3,
        picks=[1, 1, 1],
        sizes={"3": size},
        seeds=[1000],
        max_epochs=4,
        select="best",
        selected_trial=1,
        selected_test_scores=[0.7],
        candidates=[0, 1],
    )
    run = EnsembleRun(size=3, seeds=[1000], max_epochs=4, select="best")
    save_ensemble(study, stored)
    assert not ensemble_is_current(study, run)  # trial 2 came after the selection
    save_ensemble(study, dataclasses.replace(stored, candidates=[0, 1, 2]))
    assert ensemble_is_current(study, run)
    assert not ensemble_is_current(study, dataclasses.replace(run, size=5))
    save_ensemble(study, dataclasses.replace(stored, candidates=None))  # stored before candidates were recorded
    assert ensemble_is_current(study, run)


@pytest.mark.slow  # the module fixture runs two small studies (about a minute on 2 cores)
def test_predictions_whose_artifact_is_gone_are_backfilled_again(ensembled):
    from ilge_search.record import trial_predictions
    from ilge_search.storage import open_storage
    from ilge_search.study.stages.ensemble_work import backfill_predictions
    from ilge_search.study.stored import load_training_data

    synthetic = ensembled["synthetic"]
    study = _study(ensembled["url"], ensembled["trec"])
    opened = open_storage(ensembled["url"])
    stored = trial_predictions(study, [t for t in study.trials if t.state.name == "COMPLETE"])
    number, (artifact, _) = sorted(stored.items())[0]
    (opened.artifact_dir / artifact).unlink()  # a storage copied without its artifact folder
    data = load_training_data(study, data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu")
    with refuse_model_loads():
        made = backfill_predictions(study, data, opened.artifact_store(), seed=0, device="cpu", progress=False)
    assert made == 1
    again = trial_predictions(
        _study(ensembled["url"], ensembled["trec"]), [t for t in study.trials if t.number == number]
    )
    assert again[number][1] == 0 and again[number][0] != artifact  # the trial's own attr stays; the study's wins
