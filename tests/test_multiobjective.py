"""Multi-objective studies (issue 16): objectives, the Pareto front, the final front, identity, sweeps, reports.

Everything here runs on small synthetic features or hand-made trials (no model loads); the real run on
minilm-l6 is in ``tests/test_cli_run.py``.
"""

from __future__ import annotations

import json
import statistics
import wsgiref.util

import numpy as np
import optuna
import pytest
import torch
from click.testing import CliRunner
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from ilge_search.cli import cli
from ilge_search.record import FrontMember, Identity, TrialRecord
from ilge_search.study import StudyOptions, default_study_name, load_sweep
from ilge_search.study.data import StudyData
from ilge_search.study.final import FinalSettings, final_evaluation, final_is_current
from ilge_search.study.identity import StudyConflictError, check_identity, run_identity
from ilge_search.study.objectives import (
    FLOPS_REFUSAL,
    best_score_trial,
    check_objectives,
    measure_latency,
    objective_values,
    pareto_front,
)
from ilge_search.study.selection import front_trials, select_trial, study_front
from ilge_search.study.trial import TrialObjective, recommended_params
from ilge_search.testing import FakeTrial, add_study, final_record

optuna.logging.set_verbosity(optuna.logging.WARNING)

LAYERS, DIM, CLASSES = 3, 8, 3
SIZE = IntDistribution(1, 10_000_000)


def synthetic(n: int, seed: int) -> tuple:
    centres = np.random.default_rng(7).normal(size=(CLASSES, LAYERS, DIM)) * 0.6
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % CLASSES
    features = centres[labels] + rng.normal(size=(n, LAYERS, DIM))
    return torch.tensor(features, dtype=torch.float16), torch.tensor(labels)


def study_data() -> StudyData:
    return StudyData(
        task_kind="classification",
        metric="accuracy",
        train=synthetic(90, 0),
        validation=synthetic(60, 1),
        test=synthetic(60, 2),
        num_layers=LAYERS,
        hidden_size=DIM,
        num_classes=CLASSES,
        label_names=["a", "b", "c"],
        split_sizes={"train": 90, "validation": 60, "test": 60},
        cache_keys={},
    )


def new_study(objectives=("score", "params"), storage=None, name=None, encoder="mlp-last"):
    directions = ["maximize"] + ["minimize"] * (len(objectives) - 1)
    study = optuna.create_study(
        directions=directions, storage=storage, study_name=name, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    for key, value in {
        "objectives": list(objectives),
        "data_seed": 0,
        "metric": "accuracy",
        "direction": "maximize",
        "encoder": encoder,
        "split_sizes": {"train": 90, "validation": 60, "test": 60},
    }.items():
        study.set_user_attr(key, value)
    return study


def add_trial(study, score, params, number_attrs=None):
    """A complete hand-made trial with a known (score, params); its params are its own size, so it can be
    told apart."""
    attrs = {"num_trainable_params": params, "config": {"family": "mlp-last"}, **(number_attrs or {})}
    values = [score, params] if len(study.directions) > 1 else None
    study.add_trial(
        create_trial(
            params={"size": params},
            distributions={"size": SIZE},
            values=values,
            value=None if values else score,
            user_attrs=attrs,
        )
    )


# ----------------------------------------------------------------------------- objectives and the front


def test_objectives_are_checked_ordered_and_flops_is_refused_with_the_reason():
    assert check_objectives(None) == ("score",)
    assert check_objectives(["params", "score", "params"]) == ("score", "params")
    assert check_objectives(("latency", "Score", "params")) == ("score", "params", "latency")
    with pytest.raises(ValueError, match="must include 'score'"):
        check_objectives(["params"])
    with pytest.raises(ValueError, match="unknown objective 'size'"):
        check_objectives(["score", "size"])
    with pytest.raises(ValueError) as error:
        check_objectives(["score", "flops"])
    assert str(error.value) == FLOPS_REFUSAL and "sparse" in FLOPS_REFUSAL
    options = StudyOptions.from_flat(objectives=["score", "params"], n_trials=1)
    assert options.search.objectives == ("score", "params") and options.search.multi_objective
    assert (
        options.search.effective_pruner == "none"
        and StudyOptions.from_flat(n_trials=1).search.effective_pruner == "median"
    )
    with pytest.raises(ValueError, match="final_front must be an integer >= 1"):
        StudyOptions.from_flat(objectives=["score", "params"], final_front=0, n_trials=1)


def test_a_known_front_is_found_ordered_by_score_and_matches_optunas():
    study = new_study()
    # (score, params): F, A, B, D are the front; C is beaten by B, G by D; E repeats B and is left out
    points = {
        "A": (0.90, 1000),
        "B": (0.85, 100),
        "C": (0.80, 500),
        "D": (0.60, 10),
        "E": (0.85, 100),
        "F": (0.95, 5000),
        "G": (0.50, 10),
    }
    for score, params in points.values():
        add_trial(study, score, params)
    names = {t.number: name for t, name in zip(study.trials, points, strict=True)}
    front = study_front(study)
    assert [names[t.number] for t in front] == ["F", "A", "B", "D"]
    # Optuna's own front holds the same points (it keeps both copies of B)
    assert {names[t.number] for t in study.best_trials} == {"F", "A", "B", "D", "E"}
    # K spread evenly along the front, both ends kept
    assert [names[t.number] for t in front_trials(front, 3)] == ["F", "B", "D"]
    assert [names[t.number] for t in front_trials(front, 2)] == ["F", "D"]
    assert [names[t.number] for t in front_trials(front, 1)] == ["F"]
    assert front_trials(front, 9) == front
    assert names[best_score_trial(study).number] == "F" and names[select_trial(study, "best").number] == "F"


def test_a_single_objective_study_can_be_placed_on_a_score_vs_params_front():
    study = optuna.create_study(direction="maximize")
    for score, params in [(0.7, 50), (0.8, 40), (0.9, 400)]:
        add_trial(study, score, params)
    front = pareto_front(study.trials, ["maximize", "minimize"], ("score", "params"))
    assert [objective_values(t, ("score", "params")) for t in front] == [(0.9, 400.0), (0.8, 40.0)]


def test_latency_is_per_thousand_samples_of_a_forward_pass():
    calls = []

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            calls.append(x.shape[0])
            return x.sum(dim=(1, 2)) * self.weight

    features = torch.zeros(300, LAYERS, DIM, dtype=torch.float16)
    latency = measure_latency(Counting(), features, batch_size=128, repeats=3)
    assert latency > 0
    assert calls == [128, 128, 44] * 4  # one warm-up pass, then three timed ones, in batches
    calls.clear()
    measure_latency(Counting(), torch.zeros(2500, LAYERS, DIM), batch_size=1000, repeats=1)
    assert calls == [1000] * 2  # at most 1,000 samples are timed


# ----------------------------------------------------------------------------- trials and the final front


def test_a_multi_objective_trial_returns_score_and_params_and_reports_no_intermediate_value():
    data = study_data()
    study = new_study()
    study.enqueue_trial(recommended_params("mlp-last", DIM), user_attrs={"recommended": True})
    objective = TrialObjective("mlp-last", data, seed=0, device="cpu", max_epochs=3)
    study.optimize(objective, n_trials=3)
    for trial in study.trials:
        assert trial.state == TrialState.COMPLETE
        assert trial.values == [trial.user_attrs["val_metric"], trial.user_attrs["num_trainable_params"]]
        assert trial.user_attrs["latency_ms"] > 0 and trial.intermediate_values == {}
    single = optuna.create_study(direction="maximize")
    single.optimize(TrialObjective("mlp-last", data, seed=0, device="cpu", max_epochs=3), n_trials=1)
    [trial] = single.trials
    assert trial.value == trial.user_attrs["val_metric"] and trial.user_attrs["latency_ms"] > 0
    assert sorted(trial.intermediate_values) == [1, 2, 3]  # single-objective trials still feed the pruner


def test_the_final_front_retrains_each_front_trial_and_reuses_what_it_has(monkeypatch):
    import ilge_search.engine as engine

    data = study_data()
    study = new_study()
    study.enqueue_trial(recommended_params("mlp-last", DIM), user_attrs={"recommended": True})
    study.optimize(TrialObjective("mlp-last", data, seed=0, device="cpu", max_epochs=3), n_trials=6)
    front = study_front(study)
    assert len(front) >= 2
    trainings = []
    real = engine.train_encoder
    monkeypatch.setattr(engine, "train_encoder", lambda *a, **k: trainings.append(k["seed"]) or real(*a, **k))
    real_many = engine.train_many  # the seeds trained in one pass
    monkeypatch.setattr(
        engine, "train_many", lambda jobs, *a, **k: trainings.extend(j.seed for j in jobs) or real_many(jobs, *a, **k)
    )
    seeds = [1000, 1001]
    final_evaluation(study, data, FinalSettings(encoder="mlp-last", seeds=seeds, device="cpu", max_epochs=3, front=2))
    attrs = study.user_attrs
    records = attrs["final_front"]
    chosen = front_trials(front, 2)
    assert [r["trial"] for r in records] == [t.number for t in chosen]
    assert attrs["final_front_k"] == 2 and attrs["final_front_size"] == len(front)
    for record, trial in zip(records, chosen, strict=True):
        assert record["params"] == trial.user_attrs["num_trainable_params"] == record["values"]["params"]
        assert record["val_score"] == trial.values[0] and len(record["test_scores"]) == 2
        assert record["test_mean"] == pytest.approx(np.mean(record["test_scores"]))
        assert record["config"] == trial.user_attrs["config"]
    # the top-level attrs are the best-score front trial's, so every single-objective table reads them
    top = records[0]
    assert attrs["final_select"] == "front" and attrs["final_trial"] == top["trial"] == front[0].number
    assert attrs["final_test_scores"] == top["test_scores"] and attrs["final_seeds"] == seeds
    start_retrained = 0 if any(t.user_attrs.get("recommended") for t in chosen) else 2
    assert len(trainings) == 2 * len(chosen) + start_retrained
    assert final_is_current(study, seeds, 3, final_front=2)
    assert final_is_current(study, seeds, 3, final_front=3) == (front_trials(front, 3) == chosen)
    assert not final_is_current(study, [1000], 3, final_front=2)
    # a larger K retrains only the trials it adds
    trainings.clear()
    final_evaluation(study, data, FinalSettings(encoder="mlp-last", seeds=seeds, device="cpu", max_epochs=3, front=3))
    added = len(front_trials(front, 3)) - len([t for t in front_trials(front, 3) if t in chosen])
    assert len(trainings) == 2 * added
    assert final_is_current(study, seeds, 3, final_front=3)


# ----------------------------------------------------------------------------- identity, names, sweeps, CLI


def test_objectives_are_part_of_the_study_identity_and_name():
    assert default_study_name("minilm-l6", "trec", "cayley", max_train=500) == "minilm-l6:trec:cayley:train500"
    assert default_study_name("minilm-l6", "trec", "cayley", max_train=500, cv=5, objectives=("score", "params")) == (
        "minilm-l6:trec:cayley:train500:cv5:obj-params"
    )
    assert default_study_name("m", "t", "fc", objectives=("score", "params", "latency")) == "m:t:fc:obj-params-latency"
    single = run_identity("m", "t", "fc", StudyOptions.from_flat(n_trials=1)).to_attrs()
    multi = run_identity("m", "t", "fc", StudyOptions.from_flat(n_trials=1, objectives=["score", "params"])).to_attrs()
    stored_before = {key: value for key, value in single.items() if key != "objectives"}  # an older study
    stored_before.update(model="m", cache_keys={"train": "k"})
    assert check_identity("s", stored_before, single, cache_keys={"train": "k"}) is True  # legacy, adopted
    with pytest.raises(StudyConflictError, match=r"objectives: stored \['score'\], requested \['score', 'params'\]"):
        check_identity("s", stored_before, multi, cache_keys={"train": "k"})


def test_sweep_grids_take_objectives_per_grid_task_and_encoder(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(
        'models = ["minilm-l6"]\nencoders = ["cayley", "last-layer"]\nfinal_front = 3\n'
        'objectives = {default = ["score", "params"], last-layer = ["score"]}\n'
        '[trials]\ndefault = 4\n[tasks.trec]\n[tasks.emotion]\nobjectives = ["score", "latency"]\n'
    )
    sweep = load_sweep(grid)
    found = {(e.task, e.encoder): (e.objectives, e.study_name) for e in sweep.entries}
    assert found[("trec", "cayley")] == (("score", "params"), "minilm-l6:trec:cayley:obj-params")
    assert found[("trec", "last-layer")] == (("score",), "minilm-l6:trec:last-layer")
    assert found[("emotion", "last-layer")][0] == ("score", "latency")
    assert sweep.study_options().final.front == 3
    assert len({e.group_key() for e in sweep.entries}) == 3  # trec's two objective sets run apart
    grid.write_text('models = ["minilm-l6"]\nobjectives = ["score", "flops"]\n[trials]\ndefault = 1\n[tasks.trec]\n')
    with pytest.raises(ValueError, match=f"{grid}: the objective 'flops' is not available"):
        load_sweep(grid)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--objective", "score", "--objective", "flops"], "the objective 'flops' is not available"),
        (["--objective", "params"], "the objectives must include 'score'"),
        (["--objective", "score", "--objective", "params", "--select", "best"], "retrains its Pareto front"),
        (["--final-front", "3"], "--final-front is for studies with several objectives"),
    ],
)
def test_bad_objective_options_are_one_line_before_anything_loads(tmp_path, args, message):
    result = CliRunner().invoke(
        cli, ["run", "--model", "no-such-model", "--task", "trec", "--storage", f"sqlite:///{tmp_path / 's.db'}", *args]
    )
    assert result.exit_code in (1, 2) and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "s.db").exists()


# ----------------------------------------------------------------------------- dashboard and report


def _get(app, path):
    environ = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ["PATH_INFO"] = path
    status = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], body


def _front_member(trial, params, latency, val, scores, std):
    return FrontMember(
        trial=trial,
        config={},
        values={"accuracy": val, "params": float(params)},
        params=params,
        latency_ms=latency,
        val_score=val,
        test_mean=statistics.fmean(scores),
        test_std=std,
        test_scores=scores,
        val_scores=[val] * len(scores),
        artifacts={},
        artifact_seed=None,
    )


def _stored_front_study(url):
    """A multi-objective study as the runner leaves it (the fake study store): its record, four trials, a final
    front of two of its three front trials."""
    trials = [
        FakeTrial([score, params], params={"size": params}, record=TrialRecord(params=params, latency_ms=params / 1e4))
        for score, params in [(0.80, 300_000), (0.84, 900_000), (0.70, 20_000), (0.60, 400_000)]
    ]
    front = [
        _front_member(1, 900_000, 90.0, 0.84, [0.81, 0.83], 0.01),
        _front_member(2, 20_000, 2.0, 0.70, [0.64, 0.68], 0.02),
    ]
    final = final_record([0.81, 0.83], trial=1, select="front", front=front, front_k=2, front_size=3, test_std=0.01)
    identity = Identity(model="minilm-l6", task="trec", encoder="cayley", objectives=("score", "params"))
    return add_study(url, identity, trials=trials, final=final)


def test_the_dashboard_serves_a_multi_objective_study_with_its_directions_names_and_front(tmp_path):
    from ilge_search.report.dashboard import make_dashboard_app
    from ilge_search.study.notes import write_notes

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = _stored_front_study(url)
    write_notes(study)
    app = make_dashboard_app(url, artifact_dir=tmp_path / "artifacts")
    status, body = _get(app, "/api/studies")
    assert status.startswith("200")
    [summary] = json.loads(body)["study_summaries"]
    assert summary["directions"] == ["maximize", "minimize"]
    status, body = _get(app, f"/api/studies/{summary['study_id']}")
    detail = json.loads(body)
    assert detail["directions"] == ["maximize", "minimize"] and detail["objective_names"] == ["accuracy", "params"]
    assert sorted(t["number"] for t in detail["best_trials"]) == [0, 1, 2]  # the Pareto front it draws
    assert "### Final front (2 of 3 Pareto-front trials retrained)" in detail["note"]["body"]
    assert "Best validation accuracy: **0.8400** (trial 1)" in detail["note"]["body"]
    # the page draws its Pareto-front plot in the browser from these directions, names and trials' values
    assert {t["number"]: t["values"] for t in detail["trials"]}[2] == [0.70, 20_000]


def test_the_report_draws_fronts_only_for_storages_with_multi_objective_studies(tmp_path):
    from ilge_search.report import build_report

    url = f"sqlite:///{tmp_path / 's.db'}"
    baseline = Identity(model="minilm-l6", task="trec", encoder="last-layer")
    last = FakeTrial(0.74, params={"size": 2_310}, record=TrialRecord(params=2_310))
    add_study(url, baseline, trials=[last], final=final_record([0.75, 0.75]))
    plain = build_report(url, tmp_path / "plain", progress=False)
    assert "Pareto" not in plain.files["markdown"].read_text() and not any("pareto" in f for f in plain.figures)

    _stored_front_study(url)
    result = build_report(url, tmp_path / "out", progress=False)
    text = result.files["markdown"].read_text()
    assert "figures/minilm-l6-trec-pareto.png" in result.figures
    assert (tmp_path / "out" / "figures" / "minilm-l6-trec-pareto.png").stat().st_size > 10_000
    part = text.split("## Pareto fronts: score vs size\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("| minilm-l6") or line.startswith("| *minilm")]
    assert rows == [
        "| minilm-l6 | trec | Cayley | 1 | 900,000 | 90.0 | 84.00 | 82.00 ± 1.00 |",
        "| minilm-l6 | trec | Cayley | 2 | 20,000 | 2.0 | 70.00 | 66.00 ± 2.00 |",
        "| *minilm-l6* | *trec* | *Last layer (baseline)* | *0* | *2,310* | *—* | *74.00* | *75.00 ± 0.00* |",
    ]
    assert (
        "the smallest, trial 2, 20,000 (45x fewer) and 66.00 ± 2.00 (16.00 points lower); for reference, "
        "last layer 75.00 ± 0.00 with 2,310 parameters"
    ) in part
    assert "3 of 4 complete trials on the score-vs-parameters front" in part
