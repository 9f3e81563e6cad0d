"""Layer attributions (`ilge-search explain`): a known answer on synthetic layers, the same through the runner's
studies on the synthetic setup (no model loads), the CLI, the report's heatmap and sentence, and the objective's
name on every study."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ilge_search import CayleyConfig, DeepSetConfig, FCConfig, ScalarMixConfig, run_study
from ilge_search.cli import cli
from ilge_search.engine import train_encoder
from ilge_search.record import study_record
from ilge_search.report.document import slug
from ilge_search.study import StudyOptions
from ilge_search.study.retraining import TrainingSetup
from ilge_search.use.explain import attribute_layers, explain_study, explanation_is_current

# ----------------------------------------------------------------------------- a known answer

INFORMATIVE = 2  # of 6 layers: the only one whose features depend on the label
SMALL_CONFIGS = {
    "cayley": CayleyConfig(hidden_dim=32, gnn_layers=2, epochs=12, lr=3e-3),
    "fc": FCConfig(hidden_dim=32, gnn_layers=2, epochs=12, lr=3e-3),
    "deepset": DeepSetConfig(hidden_dim=32, epochs=12, lr=3e-3),
}


def _layers_with_one_signal(rows: int, seed: int, layers: int = 6, dim: int = 12, classes: int = 3):
    """Gaussian noise on every layer; the class's centre is added to layer INFORMATIVE only."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (rows,), generator=generator)
    features = torch.randn(rows, layers, dim, generator=generator)
    centres = 1.5 * torch.randn(classes, dim, generator=torch.Generator().manual_seed(99))
    features[:, INFORMATIVE] += centres[labels]
    return features, labels


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: these encoders are small, and more threads only contend on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_signal():
    return _layers_with_one_signal(300, seed=0), _layers_with_one_signal(200, seed=1)


@pytest.mark.parametrize("family", ["cayley", "fc", "deepset"])
def test_both_attributions_peak_at_the_only_layer_that_carries_the_label(one_signal, family):
    train, val = one_signal
    model = train_encoder(SMALL_CONFIGS[family], train, val, seed=0).model
    score, drops, grads = attribute_layers(model, train[0], *val)
    assert score > 0.7  # the signal is learnable: 3 classes, chance is 1/3
    assert int(np.argmax(drops)) == INFORMATIVE and int(np.argmax(grads)) == INFORMATIVE
    others = [i for i in range(6) if i != INFORMATIVE]
    # without the informative layer the model falls to about chance; without a noise layer it barely moves
    assert drops[INFORMATIVE] > 0.3 and max(abs(drops[i]) for i in others) < 0.1
    assert grads[INFORMATIVE] > 5 * max(abs(grads[i]) for i in others)


def test_attributions_of_a_similarity_model_peak_at_the_layer_holding_the_topics():
    """Pairs: layer INFORMATIVE of each sentence holds its topic's centre, the gold score is 5 for the same topic
    and 0 otherwise; the other layers are noise."""
    generator = torch.Generator().manual_seed(3)
    centres = 1.5 * torch.randn(4, 12, generator=torch.Generator().manual_seed(99))

    def pairs(rows):
        first = torch.randint(0, 4, (rows,), generator=generator)
        same = torch.rand(rows, generator=generator) < 0.5
        second = torch.where(same, first, (first + torch.randint(1, 4, (rows,), generator=generator)) % 4)
        features = torch.randn(rows, 2, 6, 12, generator=generator)
        features[:, 0, INFORMATIVE] += centres[first]
        features[:, 1, INFORMATIVE] += centres[second]
        return features, 5.0 * same.float()

    train, val = pairs(400), pairs(200)
    model = train_encoder(
        DeepSetConfig(hidden_dim=32, epochs=15, lr=3e-3), train, val, task_kind="similarity", seed=0
    ).model
    score, drops, grads = attribute_layers(model, train[0], *val)
    assert score > 0.3  # Spearman of the cosine against same/different topic
    assert int(np.argmax(drops)) == INFORMATIVE and int(np.argmax(grads)) == INFORMATIVE
    assert drops[INFORMATIVE] > 0.2


def test_ablating_a_scalar_mix_layer_removes_exactly_its_share():
    """A hand-set scalar mix over two layers: putting layer 0 at its mean costs what the arithmetic says."""
    train = (torch.tensor([[[1.0], [0.0]], [[-1.0], [0.0]]] * 10), torch.tensor([1, 0] * 10))
    model = train_encoder(ScalarMixConfig(epochs=20, lr=0.05, dropout=0.0), train, train, seed=0).model
    score, drops, _ = attribute_layers(model, train[0], *train)
    assert score == 1.0
    # layer 0 separates the classes, layer 1 is constant: its training mean equals every value
    assert drops == [pytest.approx(score - 0.5), 0.0]


# ----------------------------------------------------------------------------- studies on the synthetic setup

DATA = dict(max_train=240, max_eval=100)
SMALL = dict(**DATA, max_epochs=3)
CARRIER = 2  # of the tiny model's 5 layers: the one whose cached features carry the label
LAYERS = 5


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def studies(tmp_path_factory, synthetic):
    """TREC on the synthetic setup with the label in layer CARRIER (its own cache): a 1-trial Cayley study with
    2 final seeds, its best-layer sibling (probes) and a mean-layers study without final evaluation."""
    from ilge_search.testing import LayerSignal, refuse_model_loads

    root = tmp_path_factory.mktemp("explain")
    setup = dataclasses.replace(synthetic, cache_dir=root / "cache", signal=LayerSignal(layer=CARRIER))
    setup.cache("trec", **DATA)
    url = f"sqlite:///{root / 'studies.db'}"
    common = dict(data_dir=setup.data_dir, cache_dir=setup.cache_dir, device="cpu", threads=1, progress=False)
    with refuse_model_loads():
        for encoder, final_seeds in (("cayley", 2), ("best-layer", 0), ("mean-layers", 0)):
            options = StudyOptions.from_flat(n_trials=1, final_seeds=final_seeds, **common, **SMALL)
            run_study(setup.model, "trec", encoder, storage=url, options=options)
    names = {encoder: f"{setup.model}:trec:{encoder}:train240:eval100:ep3" for encoder in ("cayley", "best-layer")}
    return {
        "url": url,
        "data_dir": setup.data_dir,
        "cache_dir": setup.cache_dir,
        "model": setup.model,
        "cayley": names["cayley"],
        "probe": names["best-layer"],
        "no-final": f"{setup.model}:trec:mean-layers:train240:eval100:ep3",
    }


def _study(studies, name):
    import optuna

    return optuna.load_study(study_name=name, storage=studies["url"])


def _no_training(monkeypatch):
    from ilge_search import engine

    def refuse(*args, **kwargs):
        raise AssertionError("a model was trained")

    monkeypatch.setattr(engine, "train_encoder", refuse)
    monkeypatch.setattr(engine, "train_many", refuse)  # the seeds trained in one pass


def test_explain_retrains_the_final_seeds_and_stores_the_result(studies, monkeypatch):
    result = explain_study(
        studies["url"],
        studies["cayley"],
        setup=TrainingSetup(studies["data_dir"], studies["cache_dir"], "cpu", threads=1, progress=False),
    )
    study = _study(studies, studies["cayley"])
    attrs = study.user_attrs
    assert result.computed and result.seeds == attrs["final_seeds"] and result.split == "validation"
    # the retrained models are those of the final evaluation: same validation score per seed
    assert result.scores == pytest.approx(attrs["final_val_scores"], abs=1e-12)
    frame = result.frame()
    assert list(frame["layer"]) == list(range(LAYERS)) and frame.notna().all().all()
    probe = _study(studies, studies["probe"]).best_trial.user_attrs["layer_scores"]
    assert result.probe_study == studies["probe"] and list(frame["probe_score"]) == pytest.approx(probe)
    assert np.asarray(result.ablation).shape == (2, LAYERS)
    # the layer that carries the label is the one the models depend on, by both measures
    assert int(np.mean(result.ablation, axis=0).argmax()) == CARRIER
    assert int(np.mean(result.gradient_input, axis=0).argmax()) == CARRIER
    record = study_record(study)
    assert explanation_is_current(record) and record.explain.seeds == attrs["final_seeds"]

    _no_training(monkeypatch)  # a rerun reads the stored result back
    again = explain_study(studies["url"], studies["cayley"], setup=TrainingSetup(progress=False))
    assert not again.computed and again.ablation == result.ablation and again.gradient_input == result.gradient_input

    study.set_user_attr("final_seeds", attrs["final_seeds"][:1])  # the final evaluation changed: stale
    assert not explanation_is_current(study_record(study))
    with pytest.raises(AssertionError, match="a model was trained"):
        explain_study(
            studies["url"],
            studies["cayley"],
            setup=TrainingSetup(studies["data_dir"], studies["cache_dir"], progress=False),
        )
    study.set_user_attr("final_seeds", attrs["final_seeds"])
    assert explanation_is_current(study_record(_study(studies, studies["cayley"])))


def test_explain_cli_writes_csv_and_json(studies, tmp_path, monkeypatch):
    explain_study(
        studies["url"],
        studies["cayley"],
        setup=TrainingSetup(studies["data_dir"], studies["cache_dir"], "cpu", threads=1, progress=False),
    )
    _no_training(monkeypatch)
    result = invoke("explain", "--storage", studies["url"], "--study", studies["cayley"], "--format", "csv", "--quiet")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].split(",")[0] == "layer" and "ablation_drop_mean" in lines[0] and "probe_score" in lines[0]
    assert [line.split(",")[0] for line in lines[1:]] == [str(i) for i in range(LAYERS)]

    out = tmp_path / "explain.json"
    result = invoke(
        "explain", "--storage", studies["url"], "--study", studies["cayley"], "--format", "json", "--out", out
    )
    assert result.exit_code == 0 and f"wrote {LAYERS} layers" in result.output
    data = json.loads(out.read_text())
    assert data["study"] == studies["cayley"] and data["split"] == "validation" and len(data["layers"]) == LAYERS
    assert set(data["layers"][0]) >= {"layer", "ablation_drop_mean", "grad_input_mean", "probe_score"}
    again = invoke("explain", "--storage", studies["url"], "--study", studies["cayley"], "--out", out)
    assert again.exit_code == 1 and "--force" in again.output and json.loads(out.read_text()) == data

    table = invoke("explain", "--storage", studies["url"], "--study", studies["cayley"])
    assert table.exit_code == 0 and "stored on the study" in table.output and "ablation_drop_mean" in table.output


def test_explain_errors_are_one_line_before_any_training(studies, tmp_path, monkeypatch, no_model_loads):
    _no_training(monkeypatch)
    cases = {
        "nope": "no study 'nope'",
        studies["probe"]: "reads a single layer",
        studies["no-final"]: "has no final evaluation",
    }
    for name, message in cases.items():
        result = invoke("explain", "--storage", studies["url"], "--study", name)
        assert result.exit_code == 1 and message in result.output, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    missing = invoke("explain", "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--study", studies["cayley"])
    assert missing.exit_code == 1 and "no study storage" in missing.output


def test_every_study_names_its_objective_by_the_task_metric(studies):
    assert _study(studies, studies["cayley"]).metric_names == ["accuracy"]
    assert _study(studies, studies["no-final"]).metric_names == ["accuracy"]


def test_a_loaded_study_without_a_name_gets_one(tmp_path):
    """Studies made before objectives were named are named when they are next loaded."""
    import optuna

    from ilge_search.record import READY_ATTR
    from ilge_search.storage import open_storage
    from ilge_search.study.data import StudyData
    from ilge_search.study.identity import create_or_load

    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}")
    identity = {
        "model": "m",
        "task": "stsb",
        "encoder": "cayley",
        "shots": None,
        "max_train": None,
        "max_eval": None,
        "max_epochs": None,
        "data_seed": 0,
        "cv": None,
        "label_names": [],
        "data_fingerprints": {"train": "a"},
    }
    old = optuna.create_study(study_name="old", storage=storage.rdb, direction="maximize")
    for key, value in {**identity, READY_ATTR: True}.items():
        old.set_user_attr(key, value)
    assert old.metric_names is None
    data = StudyData(
        task_kind="similarity",
        metric="spearman",
        train=(None, None),
        validation=(None, None),
        test=None,
        num_layers=7,
        hidden_size=384,
        num_classes=None,
        label_names=[],
        split_sizes={},
        cache_keys={},
    )
    study, created = create_or_load(storage, "old", identity, data, tmp_path)
    assert not created and study.metric_names == ["spearman"]
    assert storage.load_study("old").metric_names == ["spearman"]


def test_the_report_draws_the_stored_attributions_and_says_which_layers_carry_the_task(studies, tmp_path):
    from ilge_search import build_report
    from ilge_search.report.attributions import layer_thirds

    result = explain_study(
        studies["url"],
        studies["cayley"],
        setup=TrainingSetup(studies["data_dir"], studies["cache_dir"], "cpu", threads=1, progress=False),
    )
    report = build_report(studies["url"], tmp_path / "report", progress=False)
    figure = f"figures/{slug(studies['model'])}-layer-attribution.png"
    assert figure in report.figures and (tmp_path / "report" / figure).stat().st_size > 5000
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Which layers carry the task" in text and "](#layers)" in text
    drops = np.asarray(result.ablation)
    drop, spread, grad = drops.mean(0), drops.std(0, ddof=1), np.asarray(result.gradient_input).mean(0)
    top = int(drop.argmax())
    assert top == CARRIER and drop[top] > 0  # the layer that carries the label matters
    assert (
        f"trec: ablation layer {top} ({drop[top] * 100:.1f} ± {spread[top] * 100:.1f} points"
        f"{', within the spread over seeds' if drop[top] <= spread[top] else ''}), gradient x input layer "
        f"{int(grad.argmax())}, best probe layer {_study(studies, studies['probe']).best_trial.user_attrs['layer']}"
    ) in text
    positive = np.clip(drop, 0, None)
    shares = "/".join(f"{positive[part].sum() / positive.sum() * 100:.0f}%" for part in layer_thirds(LAYERS))
    assert (
        f"Share of the ablation drop (positive part, mean over 1 task) on the first, middle and last third "
        f"of the {LAYERS} layers (0-1/2-3/4-4): {shares}" in text
    )
    assert layer_thirds(31)[1] == list(range(11, 21)) and layer_thirds(7) == [[0, 1, 2], [3, 4], [5, 6]]
