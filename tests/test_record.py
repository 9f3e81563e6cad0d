"""The study record: every record through user attrs and back, older studies upgraded, newer ones refused,
final evaluations kept per selection rule (no LLM: hand-made studies and synthetic layer embeddings)."""

from __future__ import annotations

import dataclasses

import numpy as np
import optuna
import pytest
import torch
from click.testing import CliRunner
from optuna.trial import create_trial

from ilge_search.cli import cli
from ilge_search.encoders.configs import MLPLastConfig
from ilge_search.record import (
    READY_ATTR,
    RECORD_VERSION,
    VERSION_ATTR,
    DataRecord,
    ExplainRecord,
    FinalRecord,
    FrontMember,
    Identity,
    LotoRecord,
    LotoScores,
    TrialRecord,
    ZeroShotScores,
    enqueue_start_trial,
    mark_ready,
    save_explain,
    save_final,
    save_identity,
    save_loto,
    save_trial,
    study_record,
    trial_record,
    upgrade_attrs,
)
from ilge_search.study.data import StudyData
from ilge_search.study.final import FinalSettings, final_evaluation, final_is_current

optuna.logging.set_verbosity(optuna.logging.WARNING)

IDENTITY = Identity(
    model="minilm-l6",
    task="trec",
    encoder="cayley",
    max_train=500,
    max_epochs=10,
    cv=5,
    objectives=("score", "params"),
    protocol="paper",
    samples_per_label=8,
)
DATA = DataRecord(
    task_kind="classification",
    metric="accuracy",
    num_layers=7,
    hidden_size=384,
    num_classes=6,
    label_names=["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"],
    split_sizes={"train": 500, "validation": 400, "test": 500},
    cache_keys={"train": "k1", "validation": "k2", "test": "k3"},
    data_fingerprints={"train": "f1", "validation": "f2", "test": "f3"},
    model_revision="sha256:1234",
    artifact_dir="/tmp/artifacts",
    ilge_search_version="0.9.0",
)
MEMBER = FrontMember(
    trial=3,
    config={"family": "cayley", "hidden_dim": 64},
    values={"score": 0.81, "params": 1200.0},
    params=1200,
    latency_ms=2.5,
    val_score=0.81,
    test_mean=0.79,
    test_std=0.01,
    test_scores=[0.78, 0.8],
    val_scores=[0.8, 0.82],
    artifacts={"weights": "w-3", "config": "c-3"},
    artifact_seed=1001,
)
FINAL = FinalRecord(
    select="front",
    trial=3,
    config={"family": "cayley", "hidden_dim": 64},
    seeds=[1000, 1001],
    test_scores=[0.78, 0.8],
    test_mean=0.79,
    test_std=0.01,
    val_scores=[0.8, 0.82],
    max_epochs=10,
    artifacts={"weights": "w-3", "config": "c-3"},
    artifact_seed=1001,
    selected_value=0.81,
    start_trial=0,
    start_test_mean=0.75,
    start_test_scores=[0.74, 0.76],
    search_gain=0.04,
    protocol={"protocol": "paper", "samples_per_label": 8},
    zero_shot={"sts12": ZeroShotScores(mean=0.5, std=0.1, scores=[0.4, 0.6])},
    front=[MEMBER],
    front_k=5,
    front_size=4,
)
EXPLAIN = ExplainRecord(
    split="validation",
    metric="accuracy",
    seeds=[1000],
    scores=[0.8],
    ablation=[[0.1, 0.2, 0.0]],
    gradient_input=[[0.01, -0.02, 0.03]],
    source={"final_trial": 3, "final_seeds": [1000]},
    seconds=1.5,
)
LOTO = LotoRecord(
    key={"task": "trec", "seeds": [1000]},
    builtin=LotoScores(config={"family": "cayley"}, test_scores=[0.7], val_scores=[0.72]),
    regenerated=LotoScores(config={"family": "cayley", "lr": 0.01}, test_scores=[0.74], val_scores=[0.75]),
    regenerated_from=["emotion", "sst2"],
    ilge_search_version="0.9.0",
)


# ----------------------------------------------------------------------------- round trips


def test_every_record_reads_back_what_it_wrote():
    assert Identity.from_attrs(upgrade_attrs(IDENTITY.to_attrs())) == IDENTITY
    assert DataRecord.from_attrs(DATA.to_attrs()) == DATA
    assert FrontMember.from_attrs(MEMBER.to_attrs()) == MEMBER
    assert FinalRecord.from_attrs(FINAL.to_attrs()) == FINAL
    assert ExplainRecord.from_attrs(EXPLAIN.to_attrs()) == EXPLAIN
    assert LotoRecord.from_value(LOTO.to_value()) == LOTO
    # the front is kept once, on the study: a rule's entry holds the evaluation without it
    assert FinalRecord.from_attrs(FINAL.rule_attrs()) == dataclasses.replace(
        FINAL, front=[], front_k=None, front_size=None
    )


def test_run_times_read_back_append_and_a_study_without_them_reads_as_not_recorded():
    from ilge_search.record import KEPT_RUNS, RunTimes, run_times, save_run_times

    entry = RunTimes(
        started=1_000.0,
        before_search=4.0,
        search=50.0,
        elapsed=80.0,
        stages={"final": 10.0, "ensemble": 6.0, "leaderboard": 8.0},
        time_limit=100.0,
        limit=100.0,
        trials_before=0,
        trials_after=9,
        trial_cap=200,
        workers=2,
        threads=1,
    )
    assert RunTimes.from_value(entry.to_value()) == entry and entry.to_value()["version"] == RunTimes.VERSION
    assert entry.used == 0.8 and entry.trials_added == 9 and not entry.cap_reached
    assert entry.stage("ensemble") == 6.0 and entry.stage("toy") is None
    assert RunTimes.from_value({"started": 1.0}) is None and RunTimes.from_value("no") is None
    study = optuna.create_study()
    assert run_times(study) == []  # stored before run times were recorded: nothing measured
    study.set_user_attr(RunTimes.ATTR, [{"broken": True}])
    assert run_times(study) == []
    for number in range(KEPT_RUNS + 3):
        save_run_times(study, dataclasses.replace(entry, started=float(number)))
    kept = run_times(study)
    assert len(kept) == KEPT_RUNS and kept[-1].started == KEPT_RUNS + 2  # the newest, oldest first


def test_a_tagging_final_keeps_its_test_macro_f1_and_an_older_one_reads_as_not_measured():
    tagging = dataclasses.replace(
        FINAL, front=[], front_k=None, front_size=None, test_macro_f1=[0.61, 0.65], test_macro_f1_mean=0.63
    )
    attrs = tagging.to_attrs()
    assert attrs["final_test_macro_f1"] == [0.61, 0.65] and attrs["final_test_macro_f1_mean"] == 0.63
    assert FinalRecord.from_attrs(attrs) == FinalRecord.from_attrs(tagging.rule_attrs()) == tagging
    older = {key: value for key, value in attrs.items() if "macro_f1" not in key}  # stored before it was recorded
    read = FinalRecord.from_attrs(older)
    assert read is not None and read.test_macro_f1 is None and read.test_macro_f1_mean is None


def test_the_attrs_keep_their_flat_historical_names():
    attrs = {**IDENTITY.to_attrs(), **DATA.to_attrs(), **FINAL.to_attrs()}
    assert attrs["objectives"] == ["score", "params"]  # a list, as JSON keeps it
    assert attrs["final_test_mean"] == 0.79 and attrs["final_select"] == "front"
    assert attrs["final_front"][0]["trial"] == 3 and attrs["final_zero_shot"]["sts12"]["mean"] == 0.5
    assert TrialRecord.attr_name("params") == "num_trainable_params"
    with pytest.raises(KeyError, match="no field 'size'"):
        TrialRecord.attr_name("size")


def test_a_study_and_its_trials_read_back_what_was_saved():
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    save_identity(study, IDENTITY, DATA)
    save_final(study, FINAL, keep_by_rule=False)
    save_explain(study, EXPLAIN)
    save_loto(study, {"abc": LOTO})
    enqueue_start_trial(study, {"hidden_dim": 64})
    mark_ready(study)

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        trial.suggest_int("hidden_dim", 8, 512)
        save_trial(trial, config={"family": "cayley", "hidden_dim": 64}, params=1200, val_metric=0.81)
        save_trial(trial, epochs_run=4, best_epoch=3, seconds=1.25, fold_scores=[0.8, 0.82], latency_ms=2.5)
        return 0.81, 1200.0

    study.optimize(objective, n_trials=1)
    record = study_record(study)
    assert (record.name, record.identity, record.data) == ("s", IDENTITY, DATA)
    assert (record.final, record.by_rule, record.explain, record.loto) == (FINAL, {}, EXPLAIN, {"abc": LOTO})
    assert record.ready and record.version == RECORD_VERSION and record.is_ours and record.has_data
    assert record.objectives == ("score", "params") and record.select == "front" and record.maximize
    assert trial_record(study.trials[0]) == TrialRecord(
        config={"family": "cayley", "hidden_dim": 64},
        val_metric=0.81,
        params=1200,
        latency_ms=2.5,
        epochs_run=4,
        best_epoch=3,
        seconds=1.25,
        fold_scores=[0.8, 0.82],
        recommended=True,
    )
    # a study summary and a frozen study read the same
    (summary,) = optuna.get_all_study_summaries(study._storage)
    assert study_record(summary) == record


def test_a_study_ilge_search_did_not_create_has_no_identity():
    record = study_record(optuna.create_study(study_name="foreign"))
    assert (record.identity, record.data, record.final, record.is_ours, record.has_data) == (
        None,
        None,
        None,
        False,
        False,
    )
    assert record.objectives == ("score",) and record.maximize
    # a hand-made study with some of the keys: what it stores is read, the rest has its default meaning
    study = optuna.create_study(study_name="partial")
    study.set_user_attr("cv", 3)
    study.set_user_attr("metric", "spearman")
    partial = study_record(study)
    assert partial.identity is not None and partial.identity.cv == 3 and not partial.is_ours
    assert partial.data is not None and partial.data.metric == "spearman"


# ----------------------------------------------------------------------------- format versions


def _version_1_attrs() -> dict:
    """A study as ilge-search stored it before the record existed: no version, objectives, protocol or rule."""
    attrs = {key: value for key, value in IDENTITY.to_attrs().items() if key not in ("objectives", "protocol")}
    attrs.update(samples_per_label=None, **DATA.to_attrs(), **{READY_ATTR: True})
    final = FinalRecord(
        select="best", trial=2, config={"family": "fc"}, seeds=[7], test_scores=[0.7], test_mean=0.7, test_std=0.0
    )
    attrs.update({key: value for key, value in final.to_attrs().items() if key != "final_select"})
    return attrs


def test_a_version_1_study_is_read_as_what_its_absent_keys_meant():
    attrs = _version_1_attrs()
    upgraded = upgrade_attrs(attrs)
    assert upgraded["objectives"] == ["score"] and upgraded["protocol"] == "matched"
    assert upgraded["final_select"] == "best" and upgraded[VERSION_ATTR] == RECORD_VERSION
    assert "objectives" not in attrs  # the stored attrs are left as they are

    study = optuna.create_study(study_name="old")
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    record = study_record(study)
    assert record.version == 1 and record.ready
    assert record.identity.objectives == ("score",) and record.identity.protocol == "matched"
    assert record.final.select == "best" and record.select == "best" and record.final.trial == 2
    # what its trials search equals the same study stored today with the defaults written out
    today = dataclasses.replace(record.identity, objectives=("score",), protocol="matched")
    assert record.identity.search_key() == Identity.from_attrs(upgrade_attrs(today.to_attrs())).search_key()
    assert not record.identity.differences(today)


def test_a_study_stored_by_a_newer_format_is_refused_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="future", storage=url)
    for key, value in {**IDENTITY.to_attrs(), **DATA.to_attrs(), VERSION_ATTR: RECORD_VERSION + 1}.items():
        study.set_user_attr(key, value)
    with pytest.raises(ValueError, match=r"record format 3, this one reads up to 2\); upgrade ilge-search"):
        study_record(study)
    result = CliRunner().invoke(cli, ["studies", "--storage", url])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "Error: this study was stored by a newer ilge-search (record format 3, this one reads up to 2); "
        "upgrade ilge-search to read it"
    ]


# ----------------------------------------------------------------------------- a final evaluation per rule

LAYERS, DIM, CLASSES = 3, 8, 3


def _synthetic(n: int, seed: int) -> tuple:
    centres = np.random.default_rng(7).normal(size=(CLASSES, LAYERS, DIM))
    labels = np.arange(n) % CLASSES
    features = centres[labels] + np.random.default_rng(seed).normal(size=(n, LAYERS, DIM))
    return torch.tensor(features, dtype=torch.float32), torch.tensor(labels)


def _evaluated_study() -> tuple[optuna.Study, StudyData]:
    """Three complete trials: the start (0), the best score (1) and, inside its noise band, the smallest (2)."""
    data = StudyData(
        task_kind="classification",
        metric="accuracy",
        train=_synthetic(60, 0),
        validation=_synthetic(30, 1),
        test=_synthetic(30, 2),
        num_layers=LAYERS,
        hidden_size=DIM,
        num_classes=CLASSES,
        label_names=["a", "b", "c"],
        split_sizes={"train": 60, "validation": 30, "test": 30},
        cache_keys={},
    )
    study = optuna.create_study(study_name="rules", direction="maximize")
    save_identity(
        study,
        Identity(model="m", task="t", encoder="mlp-last", max_epochs=3),
        DataRecord(task_kind="classification", metric="accuracy", split_sizes=data.split_sizes),
    )
    for value, hidden, recommended in ((0.80, 64, True), (0.85, 128, False), (0.83, 16, False)):
        config = MLPLastConfig(hidden_dim=hidden, epochs=3).to_dict()
        attrs = {"config": config, "num_trainable_params": hidden * 100, "recommended": recommended}
        study.add_trial(create_trial(value=value, params={}, distributions={}, user_attrs=attrs))
    return study, data


def test_each_rule_keeps_its_final_evaluation_and_switching_back_restores_it_without_training(monkeypatch):
    import ilge_search.study.final as final_module

    study, data = _evaluated_study()
    trained = []
    retrain = final_module._retrain

    def counting(config, run, *, label, zero_shot):
        trained.append(label)
        return retrain(config, run, label=label, zero_shot=zero_shot)

    monkeypatch.setattr(final_module, "_retrain", counting)
    common = dict(encoder="mlp-last", seeds=[1000, 1001], device="cpu", max_epochs=3, progress=False)

    final_evaluation(study, data, FinalSettings(select="best", **common))
    best = study_record(study).final
    assert (best.select, best.trial, best.start_trial) == ("best", 1, 0)
    assert trained == ["mlp-last", "mlp-last start"]
    assert best.search_gain == pytest.approx(best.test_mean - best.start_test_mean)
    assert best.test_macro_f1 is None and best.test_macro_f1_mean is None  # recorded for tagging studies only

    final_evaluation(study, data, FinalSettings(select="one-se", **common))
    record = study_record(study)
    assert (record.final.select, record.final.trial) == ("one-se", 2)
    assert trained[2:] == ["mlp-last"]  # the start's scores come from the best rule's record
    assert record.final.start_test_scores == best.start_test_scores
    assert set(record.by_rule) == {"best", "one-se"} and record.by_rule["best"] == best
    assert final_is_current(study, [1000, 1001], 3, "one-se") and not final_is_current(study, [1000, 1001], 3, "best")

    final_evaluation(study, data, FinalSettings(select="best", **common))
    assert len(trained) == 3  # restored, not retrained
    restored = study_record(study)
    assert restored.final == best and restored.by_rule["one-se"] == record.final
    assert final_is_current(study, [1000, 1001], 3, "best")
    # other seeds are another evaluation
    assert not final_is_current(study, [1000], 3, "best")
