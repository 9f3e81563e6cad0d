"""The encoder registry: a family defined here, outside the package, registers itself and then runs through
a study, its final evaluation, the ensemble, export (`ILGEClassifier.from_study`), predict and the report
with no edit to the library; the built-in families read their module, search space and start from it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import optuna
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ilge_search import ILGEClassifier, build_aggregator, run_study
from ilge_search.cli import cli
from ilge_search.encoders import (
    EncoderSpec,
    Picker,
    all_families,
    baseline_families,
    builtin_start,
    config_classes,
    config_from_dict,
    encoder_families,
    encoder_spec,
    register_encoder,
    unregister_encoder,
)
from ilge_search.encoders.configs import EncoderConfig
from ilge_search.nn import LayerEncoder
from ilge_search.record import ensemble_record, study_record
from ilge_search.report import build_report, method_labels, methods
from ilge_search.study import StudyOptions
from ilge_search.study.auto import METHOD_PARAM, auto_methods, suggest_auto
from ilge_search.study.data import DataSpec, load_task_data
from ilge_search.study.identity import resolve_encoders
from ilge_search.testing import LayerEncoderContract, refuse_model_loads
from ilge_search.tuning import recommended_config, suggest_config

DATA = dict(max_train=240, max_eval=100)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@dataclass
class ToyConfig(EncoderConfig):
    """The mean over layers, then one linear map."""

    family: ClassVar[str] = "toy-mean"
    hidden_dim: int = 16


class ToyEncoder(LayerEncoder):
    def __init__(self, num_layers: int, hidden_in: int, hidden_dim: int, dropout: float) -> None:
        super().__init__(num_layers, hidden_in)
        self.linear = nn.Linear(hidden_in, hidden_dim)
        self.dropout = dropout
        self.out_dim = hidden_dim
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.linear.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.linear(x.mean(dim=1)), self.dropout, self.training)

    def __repr__(self) -> str:  # the contract asks for one line
        return f"ToyEncoder(num_layers={self.num_layers}, hidden_in={self.hidden_in}, out_dim={self.out_dim})"


def _build_toy(config: ToyConfig, num_layers: int, hidden_in: int) -> ToyEncoder:
    return ToyEncoder(num_layers, hidden_in, config.hidden_dim, config.dropout)


def _search_toy(pick: Picker) -> None:
    pick.categorical("hidden_dim", [8, 16])


TOY = EncoderSpec(
    "toy-mean",
    ToyConfig,
    _build_toy,
    search=_search_toy,
    start={"small": {"lr": 3e-3}, "large": {"lr": 1e-4}},
    label="Toy mean",
    kinds=("sentence",),
)


@pytest.fixture
def toy():
    register_encoder(TOY)
    try:
        yield TOY
    finally:
        unregister_encoder(TOY.name)


def test_a_registered_family_is_known_everywhere_and_gone_after(toy):
    assert "toy-mean" in encoder_families() and "toy-mean" in all_families() and "toy-mean" not in baseline_families()
    assert config_classes()["toy-mean"] is ToyConfig
    assert config_from_dict({"family": "toy-mean", "hidden_dim": 8}) == ToyConfig(hidden_dim=8)
    assert methods()[-1] == "toy-mean" and method_labels()["toy-mean"] == "Toy mean"
    assert recommended_config("toy-mean").lr == pytest.approx(3e-3)
    assert builtin_start("toy-mean", "small") == {"lr": 3e-3}
    assert resolve_encoders("toy-mean") == ["toy-mean"]
    trial = optuna.create_study().ask()
    config = suggest_config(trial, "toy-mean")
    assert isinstance(config, ToyConfig) and set(trial.params) == {"hidden_dim", "lr", "weight_decay"}
    assert build_aggregator(config, 4, 6)(torch.randn(3, 4, 6)).shape == (3, config.hidden_dim)
    unregister_encoder("toy-mean")
    assert "toy-mean" not in encoder_families() and "toy-mean" not in config_classes() and "toy-mean" not in methods()
    with pytest.raises(ValueError, match="unknown"):
        resolve_encoders("toy-mean")


class TestToyContract(LayerEncoderContract):
    """The toy family passes the contract every shipped encoder passes."""

    @pytest.fixture(autouse=True)
    def _registered(self, toy):
        yield

    def make_config(self) -> ToyConfig:
        return ToyConfig(hidden_dim=8, dropout=0.2)


def test_a_toy_family_runs_in_an_auto_study(toy, synthetic, tmp_path):
    assert "toy-mean" in auto_methods(None, tagging=False) and "toy-mean" not in auto_methods(None, tagging=True)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    synthetic.cache("trec", **DATA)
    common = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu", threads=1, progress=False)
    flat = dict(n_trials=3, final_seeds=1, ensemble=0, max_epochs=3, methods="last-layer,toy-mean", **DATA, **common)
    with refuse_model_loads():
        (result,) = run_study(synthetic.model, "trec", "auto", storage=url, options=StudyOptions.from_flat(**flat))
    study = optuna.load_study(study_name=result.study_name, storage=url)
    toy_trials = [t for t in study.trials if t.params[METHOD_PARAM] == "toy-mean"]
    assert toy_trials and all(t.state.name == "COMPLETE" for t in toy_trials)
    assert isinstance(suggest_auto(toy_trials[0], ("last-layer", "toy-mean")), ToyConfig)
    record = study_record(study)
    assert record.identity is not None and record.identity.methods == ("last-layer", "toy-mean")
    assert record.final is not None and len(record.final.test_scores) == 1


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        register_encoder(EncoderSpec("cayley", encoder_spec("cayley").config_class, _build_toy))
    with pytest.raises(ValueError, match="must agree"):
        EncoderSpec("other-name", ToyConfig, _build_toy)


def test_the_builtin_families_read_the_registry():
    assert encoder_families() == ("cayley", "fc", "deepset")
    assert methods() == ("last-layer", "best-layer", "mean-layers", "scalar-mix", "mlp-last", "deepset", "fc", "cayley")
    assert all(encoder_spec(name).config_class is cls for name, cls in config_classes().items())


@pytest.mark.slow  # one small study, its ensemble, export, predict and the report (under a minute on 2 cores)
def test_a_toy_family_runs_through_study_ensemble_export_predict_and_report(toy, synthetic, tmp_path):
    from ilge_search.testing import cache_text_embeddings

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    synthetic.cache("trec", **DATA)
    common = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu", threads=1, progress=False)
    options = StudyOptions.from_flat(n_trials=3, final_seeds=2, ensemble=2, max_epochs=4, **DATA, **common)
    with refuse_model_loads():
        study = run_study(synthetic.model, "trec", "toy-mean", storage=url, options=options)[0]
    record = study_record(optuna.load_study(study_name=study.study_name, storage=url))
    assert record.identity is not None and record.identity.encoder == "toy-mean"
    assert record.final is not None and len(record.final.test_scores) == 2
    ensembled = ensemble_record(optuna.load_study(study_name=study.study_name, storage=url))
    assert ensembled is not None and ensembled.ensemble is not None

    data = load_task_data(DataSpec(model=synthetic.model, task="trec", data_dir=str(synthetic.data_dir), **DATA))
    texts = data.splits["test"].flat_texts()[:5]  # cached as texts: predict finds the rows the study scored
    cache_text_embeddings(synthetic.model, texts, [data], cache_dir=synthetic.cache_dir)
    folder = tmp_path / "toy-model"
    with refuse_model_loads():
        clf = ILGEClassifier.from_study(url, study.study_name, device="cpu", cache_dir=synthetic.cache_dir)
        exported = invoke(
            "--cache-dir",
            synthetic.cache_dir,
            "--data-dir",
            synthetic.data_dir,
            "--device",
            "cpu",
            "export",
            "--storage",
            url,
            "--study",
            study.study_name,
            "--out",
            folder,
        )
        assert exported.exit_code == 0, exported.output
        source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        predicted = invoke(
            "--cache-dir",
            synthetic.cache_dir,
            "--device",
            "cpu",
            "predict",
            folder,
            "--input",
            source,
            "--out",
            out,
            "--proba",
            "--base-model",
            synthetic.model,
            "--quiet",
        )
        assert predicted.exit_code == 0, predicted.output
    assert isinstance(clf.config_, ToyConfig)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row["label"] for row in rows] == list(clf.predict(texts))

    report = build_report(url, tmp_path / "report", figures=False, progress=False)
    assert "toy-mean" in report.tables[synthetic.model].columns
    assert not np.isnan(report.tables[synthetic.model].loc["trec", "toy-mean"])
