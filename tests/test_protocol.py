"""The paper protocol (issue 15): MTEB's evaluators reproduced and checked against the ``mteb`` package, the
protocol in a study's identity and name, in sweeps, in a real run's stored final scores, and in the report."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import optuna
import pytest
import torch
from announced_skips import module_or_skip

from ilge_search.encoders import baseline_families, config_class_for
from ilge_search.study import StudyOptions, default_study_name, load_sweep
from ilge_search.study.identity import StudyConflictError, check_identity, run_identity
from ilge_search.study.protocol import (
    MTEB_DEFAULT_SAMPLES_PER_LABEL,
    MTEB_N_EXPERIMENTS,
    MTEB_SAMPLES_PER_LABEL,
    MTEB_SEED,
    MTEB_TASK_NAMES,
    MTEB_VERSION,
    PARAMETER_FREE_FAMILIES,
    PaperProtocol,
    cosine_spearman,
    is_parameter_free,
    logistic_readout,
    paper_samples_per_label,
    paper_vectors,
    undersample,
)

MODEL = "minilm-l6"


def blobs(n_train=300, n_test=120, classes=5, dim=16, rare=None, seed=0):
    """Gaussian blobs, float32 as an encoder returns them; ``rare``: (label, count) kept in train."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim))
    y_train = rng.integers(0, classes, n_train)
    if rare is not None:
        label, count = rare
        y_train[np.flatnonzero(y_train == label)[count:]] = (label + 1) % classes
    y_test = rng.integers(0, classes, n_test)
    noise = 1.5
    x_train = (centers[y_train] + noise * rng.normal(size=(n_train, dim))).astype(np.float32)
    x_test = (centers[y_test] + noise * rng.normal(size=(n_test, dim))).astype(np.float32)
    return x_train, y_train, x_test, y_test


# ----------------------------------------------------------------------------- the evaluator, on its own


def test_undersampling_takes_each_label_up_to_the_count_and_reshuffles_per_experiment():
    labels = np.array([0] * 50 + [1] * 30 + [2] * 3)  # label 2 has fewer than 8 examples
    draws = undersample(labels, 8, n_experiments=10, seed=MTEB_SEED)
    assert len(draws) == 10
    for rows in draws:
        counts = np.bincount(labels[rows], minlength=3)
        assert counts.tolist() == [8, 8, 3] and len(set(rows.tolist())) == len(rows)
    assert len({tuple(sorted(rows.tolist())) for rows in draws}) == 10  # every experiment draws anew
    # deterministic, and the same procedure as MTEB: a fresh RandomState(seed) shuffles one list each time
    order = list(range(len(labels)))
    for rows in draws:
        np.random.RandomState(MTEB_SEED).shuffle(order)
        seen, expected = defaultdict(int), []
        for i in order:
            seen[labels[i]] += 1
            if seen[labels[i]] <= 8:
                expected.append(i)
        assert rows.tolist() == expected
    assert all(np.array_equal(a, b) for a, b in zip(draws, undersample(labels, 8), strict=True))


def test_readout_is_deterministic_and_scores_every_evaluation_set_with_the_same_fits():
    x_train, y_train, x_test, y_test = blobs()
    first = logistic_readout((x_train, y_train), {"test": (x_test, y_test), "again": (x_test, y_test)})
    second = logistic_readout((x_train, y_train), {"test": (x_test, y_test)})
    assert len(first["test"]) == MTEB_N_EXPERIMENTS and first["test"] == first["again"] == second["test"]
    assert 0.3 < np.mean(first["test"]) <= 1.0
    more = logistic_readout((x_train, y_train), {"test": (x_test, y_test)}, PaperProtocol(samples_per_label=40))
    assert np.mean(more["test"]) > np.mean(first["test"])  # more examples per label: a better classifier
    with pytest.raises(ValueError, match="at least two labels"):
        logistic_readout((x_train, np.zeros_like(y_train)), {"test": (x_test, y_test)})


def test_task_settings_and_parameter_free_baselines():
    assert paper_samples_per_label("emotion") == 16 == MTEB_SAMPLES_PER_LABEL["emotion"]
    assert paper_samples_per_label("banking77") == paper_samples_per_label("trec") == 8
    assert paper_samples_per_label(None) == MTEB_DEFAULT_SAMPLES_PER_LABEL
    assert paper_samples_per_label("emotion", 4) == 4
    from ilge_search.encoders.aggregator import build_aggregator

    for family in baseline_families():
        config = config_class_for(family)(**({"layer": 2} if family == "best-layer" else {}))
        module = build_aggregator(config, num_layers=4, hidden_in=8)
        assert is_parameter_free(config) == (not any(p.requires_grad for p in module.parameters())), family
        assert is_parameter_free(config) == (family in PARAMETER_FREE_FAMILIES)


def test_vectors_are_the_encoders_representation_or_the_raw_layer():
    from ilge_search.encoders.configs import CayleyConfig, LastLayerConfig, MeanLayersConfig
    from ilge_search.engine import train_encoder

    torch.manual_seed(0)
    x = torch.randn(40, 4, 8).half()
    y = torch.arange(40) % 2
    raw = paper_vectors(x, config=LastLayerConfig())
    assert raw.dtype == np.float32 and np.array_equal(raw, x[:, -1].float().numpy())  # untrained, unstandardised
    assert np.allclose(paper_vectors(x, config=MeanLayersConfig()), x.float().mean(1).numpy())
    model = train_encoder(CayleyConfig(epochs=1), (x, y), (x, y), seed=0).model
    with torch.no_grad():
        assert np.allclose(paper_vectors(x, model=model, batch_size=7), model.embed(x.float()).numpy(), atol=1e-6)
    pairs = torch.randn(10, 2, 4, 8)
    assert paper_vectors(pairs, config=LastLayerConfig()).shape == (10, 2, 8)
    with pytest.raises(ValueError, match="either"):
        paper_vectors(x)


# ----------------------------------------------------------------------------- against mteb's own code


class _LookupEncoder:
    """An MTEB encoder that answers each text ("train 3") with a precomputed vector."""

    def __init__(self, table):
        self.table = table

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
        return np.stack([self.table[text] for batch in inputs for text in batch["text"]])

    def similarity(self, first, second):  # pragma: no cover - not used by these tasks' main scores
        raise NotImplementedError

    def similarity_pairwise(self, first, second):
        from mteb.similarity_functions import pairwise_cos_sim

        return pairwise_cos_sim(first, second)

    @property
    def mteb_model_meta(self):  # pragma: no cover
        return None


def _mteb_classification(task_name, x_train, y_train, x_test, y_test):
    import mteb
    from datasets import Dataset, DatasetDict
    from mteb.timing import TimingStack

    task = mteb.get_task(task_name)
    task.evaluator_model = task.evaluator_model.set_params(random_state=task.seed)  # what evaluate() does
    table = {f"train {i}": v for i, v in enumerate(x_train)} | {f"test {i}": v for i, v in enumerate(x_test)}
    data = DatasetDict(
        {
            "train": Dataset.from_dict(
                {"text": [f"train {i}" for i in range(len(y_train))], "label": y_train.tolist()}
            ),
            "test": Dataset.from_dict({"text": [f"test {i}" for i in range(len(y_test))], "label": y_test.tolist()}),
        }
    )
    return task, task._evaluate_subset(
        _LookupEncoder(table),
        data,
        encode_kwargs={"batch_size": 32},
        hf_split="test",
        hf_subset="default",
        timer=TimingStack(),
    )


@pytest.mark.slow  # mteb's evaluator (datasets, data loaders, five metrics per draw) takes seconds per task
@pytest.mark.parametrize(
    "task_name, ours", [("Banking77Classification", "banking77"), ("EmotionClassification", "emotion")]
)
def test_the_readout_is_mtebs_classification_evaluator(task_name, ours):
    module_or_skip("mteb", "pip install -e '.[dev]'")
    x_train, y_train, x_test, y_test = blobs(rare=(4, 3))  # label 4: 3 training examples, fewer than 8
    task, expected = _mteb_classification(task_name, x_train, y_train, x_test, y_test)
    protocol = PaperProtocol(samples_per_label=paper_samples_per_label(ours))
    assert (task.samples_per_label, task.n_experiments, task.seed) == (
        protocol.samples_per_label,
        protocol.n_experiments,
        protocol.seed,
    )
    assert task.metadata.main_score == "accuracy" and task.metadata.name == MTEB_TASK_NAMES[ours]
    scores = logistic_readout((x_train, y_train), {"test": (x_test, y_test)}, protocol)["test"]
    assert scores == pytest.approx([s["accuracy"] for s in expected["scores_per_experiment"]], abs=1e-12)
    assert np.mean(scores) == pytest.approx(expected["accuracy"], abs=1e-9)


def test_the_similarity_score_is_mtebs_sts_main_score():
    mteb = module_or_skip("mteb", "pip install -e '.[dev]'")
    from datasets import Dataset
    from mteb.timing import TimingStack

    rng = np.random.default_rng(1)
    first, second = rng.normal(size=(2, 80, 12)).astype(np.float32)
    gold = np.round(np.clip(2.5 + 2 * (first * second).sum(1) / 12 + rng.normal(size=80), 0, 5), 1)
    task = mteb.get_task(MTEB_TASK_NAMES["stsb"])
    table = {f"a {i}": v for i, v in enumerate(first)} | {f"b {i}": v for i, v in enumerate(second)}
    data = Dataset.from_dict(
        {"sentence1": [f"a {i}" for i in range(80)], "sentence2": [f"b {i}" for i in range(80)], "score": gold.tolist()}
    )
    expected = task._evaluate_subset(
        _LookupEncoder(table),
        data,
        encode_kwargs={"batch_size": 16},
        hf_split="test",
        hf_subset="default",
        timer=TimingStack(),
    )
    assert task.metadata.main_score == "cosine_spearman"
    assert cosine_spearman(first, second, gold) == pytest.approx(expected["cosine_spearman"], abs=1e-9)


def test_the_mteb_version_and_defaults_followed():
    mteb = module_or_skip("mteb", "pip install -e '.[dev]'")
    from mteb.abstasks.classification import AbsTaskClassification

    assert mteb.__version__ == MTEB_VERSION, "the evaluator follows this mteb release; update MTEB_VERSION"
    assert AbsTaskClassification.samples_per_label == MTEB_DEFAULT_SAMPLES_PER_LABEL
    assert AbsTaskClassification.n_experiments == MTEB_N_EXPERIMENTS
    assert AbsTaskClassification.evaluator_model.get_params()["max_iter"] == 100
    for ours, theirs in MTEB_TASK_NAMES.items():
        task = mteb.get_task(theirs)
        if hasattr(task, "samples_per_label"):
            assert task.samples_per_label == paper_samples_per_label(ours), ours


# ----------------------------------------------------------------------------- identity, names, sweeps


def test_the_protocol_is_part_of_the_study_identity_and_name():
    assert default_study_name(MODEL, "trec", "cayley", max_train=200, protocol="paper") == (
        "minilm-l6:trec:cayley:train200:paper"
    )
    assert default_study_name(MODEL, "emotion", "cayley", protocol="paper", samples_per_label=16) == (
        "minilm-l6:emotion:cayley:paper"
    )  # the task's own count
    assert default_study_name(MODEL, "emotion", "cayley", protocol="paper", samples_per_label=4) == (
        "minilm-l6:emotion:cayley:paper-4-per-label"
    )
    matched = run_identity(MODEL, "emotion", "cayley", StudyOptions()).to_attrs()
    paper = run_identity(MODEL, "emotion", "cayley", StudyOptions.from_flat(protocol="paper")).to_attrs()
    assert (matched["protocol"], matched["samples_per_label"]) == ("matched", None)
    assert (paper["protocol"], paper["samples_per_label"]) == ("paper", 16)
    custom = run_identity(
        MODEL, "emotion", "cayley", StudyOptions.from_flat(protocol="paper"), registered=False
    ).to_attrs()
    assert custom["samples_per_label"] == 8  # a custom task called "emotion" is not MTEB's Emotion
    data_keys = {"label_names": ["a"], "data_fingerprints": {"train": "x"}}
    with pytest.raises(StudyConflictError, match="protocol: stored 'matched', requested 'paper'"):
        check_identity("s", {**matched, **data_keys}, {**paper, **data_keys})
    fewer = run_identity(
        MODEL, "emotion", "cayley", StudyOptions.from_flat(protocol="paper", samples_per_label=4)
    ).to_attrs()
    with pytest.raises(StudyConflictError, match="samples_per_label: stored 16, requested 4"):
        check_identity("s", {**paper, **data_keys}, {**fewer, **data_keys})
    # stored before protocols existed: a matched study, resumable as one and never as a paper study
    legacy = {k: v for k, v in {**matched, **data_keys}.items() if k not in ("protocol", "samples_per_label")}
    assert check_identity("s", legacy, {**matched, **data_keys}) is False
    with pytest.raises(StudyConflictError, match="protocol: stored 'matched', requested 'paper'"):
        check_identity("s", legacy, {**paper, **data_keys})


def test_protocol_options_are_checked_once():
    with pytest.raises(ValueError, match="unknown protocol 'mteb'"):
        StudyOptions.from_flat(protocol="mteb")
    with pytest.raises(ValueError, match="samples_per_label sets the paper protocol's readout"):
        StudyOptions.from_flat(samples_per_label=8)
    with pytest.raises(ValueError, match="samples_per_label must be an integer >= 1"):
        StudyOptions.from_flat(protocol="paper", samples_per_label=0)


def test_the_cli_refuses_samples_per_label_without_the_paper_protocol(tmp_path):
    from click.testing import CliRunner

    from ilge_search.cli import cli

    result = CliRunner().invoke(
        cli,
        ["run", "-m", MODEL, "-t", "trec", "--samples-per-label", "4", "--storage", f"sqlite:///{tmp_path / 's.db'}"],
    )
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "samples_per_label sets the paper protocol's readout" in result.output
    assert not (tmp_path / "s.db").exists()  # refused before anything was created


def test_sweep_grids_take_the_protocol_globally_per_task_and_as_an_override(tmp_path):
    from ilge_search.study.grid import with_protocol
    from ilge_search.study.sweep import plan_sweep

    grid = tmp_path / "grid.toml"
    grid.write_text(
        'models = ["minilm-l6"]\nencoders = ["cayley", "last-layer"]\nprotocol = ["matched", "paper"]\n'
        'max_train = 500\n[trials]\ndefault = 2\n[tasks.trec]\n[tasks.emotion]\nprotocol = "paper"\n'
        "samples_per_label = 4\n"
    )
    sweep = load_sweep(grid)
    names = sorted(e.study_name for e in sweep.entries)
    assert names == [
        "minilm-l6:emotion:cayley:train500:paper-4-per-label",
        "minilm-l6:emotion:last-layer:train500:paper-4-per-label",
        "minilm-l6:trec:cayley:train500",
        "minilm-l6:trec:cayley:train500:paper",
        "minilm-l6:trec:last-layer:train500",
        "minilm-l6:trec:last-layer:train500:paper",
    ]
    assert len({e.group_key() for e in sweep.entries}) == 3  # one run_study call per task and protocol
    only_paper = with_protocol(sweep, "paper")
    assert sorted(e.study_name for e in only_paper.entries) == [
        "minilm-l6:emotion:cayley:train500:paper",
        "minilm-l6:emotion:last-layer:train500:paper",
        "minilm-l6:trec:cayley:train500:paper",
        "minilm-l6:trec:last-layer:train500:paper",
    ]
    with pytest.raises(ValueError, match="no paper study"):
        with_protocol(sweep, "matched", samples_per_label=4)
    frame = plan_sweep(sweep, storage=f"sqlite:///{tmp_path / 'none.db'}")
    assert sorted(frame["protocol"]) == ["matched"] * 2 + ["paper"] * 4
    grid.write_text('models = ["m"]\nprotocol = "mteb"\n[trials]\ndefault = 1\n[tasks.trec]\n')
    with pytest.raises(ValueError, match=r"\[tasks.trec\]: unknown protocol 'mteb'"):
        load_sweep(grid)
    grid.write_text('models = ["m"]\nsamples_per_label = 4\n[trials]\ndefault = 1\n[tasks.trec]\n')
    with pytest.raises(ValueError, match="samples_per_label sets the paper protocol's readout"):
        load_sweep(grid)


# ----------------------------------------------------------------------------- a real run


def _independent_readout(train_x, train_y, test_x, test_y, per_label, experiments=10, seed=42):
    """MTEB's classification evaluator written out again, without ilge_search's code."""
    from sklearn.linear_model import LogisticRegression

    order, scores = list(range(len(train_y))), []
    for _ in range(experiments):
        np.random.RandomState(seed).shuffle(order)
        counts, rows = defaultdict(int), []
        for i in order:
            if counts[int(train_y[i])] < per_label:
                rows.append(i)
                counts[int(train_y[i])] += 1
        fitted = LogisticRegression(max_iter=100, random_state=seed).fit(train_x[rows], train_y[rows])
        scores.append(float((fitted.predict(test_x) == test_y).mean()))
    return float(np.mean(scores)), scores


def test_a_paper_protocol_run_stores_the_mteb_style_scores(tmp_path, synthetic, no_model_loads):
    from ilge_search.study import run_study
    from ilge_search.study.data import load_study_data
    from ilge_search.study.export import StudyExport, load_study_model

    url = f"sqlite:///{tmp_path / 's.db'}"
    small = dict(max_train=240, max_eval=100, max_epochs=2)  # the runner tests' subsets (shared embedding cache)
    synthetic.cache("trec", max_train=240, max_eval=100)  # what the studies read: no model loads
    model, data_dir, cache_dir = synthetic.model, synthetic.data_dir, synthetic.cache_dir
    common_storage = url
    common = dict(
        data_dir=data_dir,
        cache_dir=cache_dir,
        device="cpu",
        progress=False,
        seed=0,
        threads=1,
        final_seeds=2,
        **small,
    )
    results = run_study(
        model,
        "trec",
        ["cayley", "last-layer"],
        storage=common_storage,
        options=StudyOptions.from_flat(n_trials=2, protocol="paper", **common),
    )
    assert [r.study_name for r in results] == [
        f"{model}:trec:{e}:train240:eval100:ep2:paper" for e in ("cayley", "last-layer")
    ]
    assert all(r.protocol == "paper" and r.samples_per_label == 8 for r in results)
    data = load_study_data(synthetic.spec("trec", max_train=240, max_eval=100), with_test=True, progress=False)
    train_y, test_y = data.train[1].numpy(), data.test[1].numpy()

    last = optuna.load_study(study_name=results[1].study_name, storage=url).user_attrs
    assert last["protocol"] == "paper" and last["samples_per_label"] == 8
    record = last["final_protocol"]
    assert (record["protocol"], record["samples_per_label"], record["n_experiments"], record["mteb_version"]) == (
        "paper",
        8,
        10,
        MTEB_VERSION,
    )
    # the last layer is untrained: the raw mean-pooled last layer read out by the few-shot logistic regression
    expected, draws = _independent_readout(
        data.train[0][:, -1].float().numpy(), train_y, data.test[0][:, -1].float().numpy(), test_y, 8
    )
    assert last["final_test_scores"] == pytest.approx([expected, expected], abs=1e-12)
    assert record["test_experiment_scores"] == [pytest.approx(draws, abs=1e-12)] * 2
    assert last["final_test_std"] == 0.0 and last["final_artifacts"] == {} and last["final_val_test_gap"] is None

    # Cayley: trained on the whole training split, then its vectors read out the same way
    cayley_study = optuna.load_study(study_name=results[0].study_name, storage=url)
    cayley = cayley_study.user_attrs
    loaded = load_study_model(url, results[0].study_name, StudyExport(cache_dir=cache_dir, data_dir=data_dir))
    seed = int(cayley["final_artifact_seed"])
    with torch.no_grad():
        embed = lambda x: loaded.model.embed(x.float()).numpy()  # noqa: E731
        expected, _ = _independent_readout(embed(data.train[0]), train_y, embed(data.test[0]), test_y, 8)
    assert cayley["final_test_scores"][cayley["final_seeds"].index(seed)] == pytest.approx(expected, abs=1e-12)
    assert loaded.provenance["protocol"] == "paper" and loaded.provenance["test_score"] is None
    assert cayley["final_val_test_gap"] is None and cayley["final_search_gain"] is not None

    # a matched run on the same storage makes its own studies; an explicit name of a paper study is refused
    matched = run_study(
        model, "trec", "last-layer", storage=common_storage, options=StudyOptions.from_flat(n_trials=1, **common)
    )
    assert matched[0].study_name == f"{model}:trec:last-layer:train240:eval100:ep2"
    assert matched[0].protocol == "matched"
    assert not math.isclose(matched[0].test_mean, expected)
    with pytest.raises(StudyConflictError, match="protocol: stored 'paper', requested 'matched'"):
        run_study(
            model,
            "trec",
            "last-layer",
            storage=common_storage,
            options=StudyOptions.from_flat(n_trials=1, study_name=results[1].study_name, **common),
        )


def test_a_paper_protocol_similarity_study_scores_the_raw_cosine(tmp_path, synthetic, no_model_loads):
    from scipy.stats import spearmanr

    from ilge_search.study import run_study
    from ilge_search.study.data import load_study_data, load_zero_shot_data

    small = dict(max_train=240, max_eval=100, max_epochs=3)
    synthetic.cache("stsb", max_train=240, max_eval=100, zero_shot_tasks=["sick_r"])  # no model loads
    data_dir, cache_dir = synthetic.data_dir, synthetic.cache_dir
    [result] = run_study(
        synthetic.model,
        "stsb",
        "last-layer",
        storage=f"sqlite:///{tmp_path / 's.db'}",
        options=StudyOptions.from_flat(
            n_trials=1,
            final_seeds=1,
            protocol="paper",
            zero_shot_tasks=["sick_r"],
            data_dir=data_dir,
            cache_dir=cache_dir,
            device="cpu",
            progress=False,
            threads=1,
            **small,
        ),
    )
    spec = synthetic.spec("stsb", max_train=240, max_eval=100)
    test = load_study_data(spec, with_test=True, progress=False).test
    sick = load_zero_shot_data(spec, ["sick_r"], progress=False)["sick_r"]

    def raw_cosine_spearman(features, gold):  # the untrained last layer's cosine, written out again
        a, b = features[:, 0, -1].double().numpy(), features[:, 1, -1].double().numpy()
        cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return spearmanr(gold.numpy(), cosine)[0]

    assert result.protocol == "paper" and result.study_name.endswith(":paper")
    assert result.test_scores == pytest.approx([raw_cosine_spearman(*test)], abs=1e-9)
    attrs = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{tmp_path / 's.db'}").user_attrs
    assert attrs["final_zero_shot"]["sick_r"]["scores"] == pytest.approx([raw_cosine_spearman(*sick)], abs=1e-9)


# ----------------------------------------------------------------------------- the report


def _fake(url, task, method, scores, protocol, metric="accuracy", **more):
    name = f"m:{task}:{method}:{protocol}"
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    mean = float(np.mean(scores))
    attrs = {
        "model": "EleutherAI/pythia-410m",
        "task": task,
        "encoder": method,
        "metric": metric,
        "task_kind": "classification",
        "protocol": protocol,
        "samples_per_label": 8 if protocol == "paper" else None,
        "final_test_mean": mean,
        "final_test_std": float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0,
        "final_test_scores": list(scores),
        **more,
    }
    if protocol == "matched":
        del attrs["protocol"], attrs["samples_per_label"]  # stored before protocols existed: matched
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 1e-3},
            distributions={"lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)},
            value=0.5,
        )
    )


def test_the_report_puts_both_protocols_side_by_side(tmp_path):
    from ilge_search.report import build_report

    url = f"sqlite:///{tmp_path / 's.db'}"
    _fake(url, "banking77", "last-layer", [0.90, 0.92], "matched")
    _fake(url, "banking77", "cayley", [0.93, 0.95], "matched")
    _fake(url, "banking77", "last-layer", [0.60, 0.60], "paper")
    _fake(url, "banking77", "cayley", [0.85, 0.87], "paper")
    _fake(url, "trec", "last-layer", [0.80], "matched")  # no paper study: not in the effect table
    result = build_report(url, tmp_path / "out", figures=False, progress=False)

    effect = result.protocol_effect.set_index("task")
    assert list(effect.index) == ["banking77"]
    row = effect.loc["banking77"]
    assert (row["last_matched"], row["last_paper"], row["last_effect"]) == pytest.approx((91.0, 60.0, -31.0))
    assert (row["cayley_matched"], row["cayley_paper"], row["cayley_effect"]) == pytest.approx((94.0, 86.0, -8.0))
    assert (row["gain_matched"], row["gain_paper"]) == pytest.approx((3.0, 26.0))
    assert (row["published_last"], row["published_cayley"]) == (61.17, 89.43)
    text = result.files["markdown"].read_text()
    section = text.split("## Protocol effect\n", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith("| banking77"))
    assert [cell.strip() for cell in line.strip("|").split("|")] == [
        "banking77 (8 per label)",
        "acc. %",
        "91.00",
        "60.00",
        "-31.00",
        "94.00",
        "86.00",
        "-8.00",
        "+3.00",
        "+26.00",
        "61.17",
        "89.43",
    ]
    assert "moves the last layer by -31.00 points" in text and "+26.00 under the paper protocol" in text
    assert (tmp_path / "out" / "protocol_effect.csv").is_file()
    frame = result.results.set_index(["task", "method"])
    assert frame.loc[("banking77", "cayley"), "protocol"] == "matched"
    assert math.isnan(frame.loc[("banking77", "cayley"), "published"])  # matched: never beside the paper
    assert frame.loc[("banking77 [paper protocol]", "cayley"), "published"] == 89.43
    # the summary never averages the protocols together
    summary = result.summary.set_index(["protocol", "method"])
    assert summary.loc[("paper", "cayley"), "mean_gain"] == pytest.approx(26.0)
    assert summary.loc[("matched", "cayley"), "mean_gain"] == pytest.approx(3.0)
    assert summary.loc[("matched", "last-layer"), "tasks"] == 2


def test_a_similarity_row_of_the_effect_table_names_no_examples_per_label(tmp_path):
    """The paper protocol scores similarity by cosine Spearman: no logistic readout, no examples per label."""
    from ilge_search.report import build_report

    url = f"sqlite:///{tmp_path / 's.db'}"
    for method, matched, paper in (("last-layer", 0.80, 0.78), ("cayley", 0.70, 0.72)):
        _fake(url, "stsb", method, [matched], "matched", metric="spearman")
        _fake(url, "stsb", method, [paper], "paper", metric="spearman")
    result = build_report(url, tmp_path / "out", figures=False, progress=False)
    section = result.files["markdown"].read_text().split("## Protocol effect\n", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith("| stsb"))
    assert [cell.strip() for cell in line.strip("|").split("|")][:5] == [
        "stsb",
        "Spearman ×100",
        "80.00",
        "78.00",
        "-2.00",
    ]


def test_recommend_counts_a_search_once_under_either_protocol(tmp_path):
    from optuna.trial import TrialState

    from ilge_search.report.defaults_page import recommend_defaults
    from ilge_search.tuning import suggest_config

    url = f"sqlite:///{tmp_path / 's.db'}"
    grid = [
        {
            "hidden_dim": h,
            "pre_pooling_layers": 1,
            "post_pooling_layers": 1,
            "pooling": "sum",
            "dropout": 0.2,
            "lr": lr,
            "weight_decay": 1e-5,
        }
        for h in (128, 512)
        for lr in (1e-5, 1e-3)
    ]
    for task, protocol in (("trec", "matched"), ("trec", "paper"), ("emotion", "paper")):
        memory = optuna.storages.InMemoryStorage()
        name = f"minilm-l6:{task}:deepset" + (":paper" if protocol == "paper" else "")
        study = optuna.create_study(study_name=name, storage=memory, direction="maximize")
        for key, value in {
            "model": "minilm-l6",
            "task": task,
            "encoder": "deepset",
            "hidden_size": 384,
            "task_kind": "classification",
            "metric": "accuracy",
            "protocol": protocol,
        }.items():
            study.set_user_attr(key, value)
        for params in grid:
            study.enqueue_trial(params)
            trial = study.ask()
            suggest_config(trial, "deepset")
            study.tell(trial, params["hidden_dim"] / 1000 + params["lr"], state=TrialState.COMPLETE)
        optuna.copy_study(from_study_name=name, from_storage=memory, to_storage=url)
    data = recommend_defaults(url, tmp_path / "defaults.json", report_path=None)
    # the trec search under the paper protocol is the trec search: counted once; the emotion one counts
    assert sorted(data["metadata"]["studies"]["deepset/small"]) == [
        "minilm-l6:emotion:deepset:paper",
        "minilm-l6:trec:deepset",
    ]
    assert any(s.startswith("minilm-l6:trec:deepset:paper: the same search") for s in data["metadata"]["skipped"])
