"""Which LLM layers a study's final model uses: one importance per layer (``ilge-search explain``).

:func:`explain_study` retrains the final configuration once per final seed on the study's cached data and measures on
the **validation** split (never test) each layer's ablation drop (the score lost with the layer's input at its training
mean) and its signed gradient x input of the gold evidence, next to the per-layer probe score of the study's best-layer
sibling; a tagging study is measured over its validation words (:func:`attribute_word_layers`). What the two measures
mean and how to read them: ``docs/guide.md``. The result is stored on the study
(:class:`~ilge_search.record.ExplainRecord`) and recomputed only when its final evaluation changed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ..encoders import config_from_dict
from ..engine import METRICS, FeatureStandardizer, evaluate
from ..engine.metrics import class_metrics
from ..engine.tokens import EVAL_BATCH_NODES, as_word_set, sentence_batches
from ..progress import BarSpec
from ..record import ExplainRecord, FinalRecord, Identity, StudyRecord, save_explain, study_record, trial_record
from ..record.fields import Attrs, known_fields
from ..storage import Storage, open_storage
from ..study.retraining import TrainingSetup, train_seeds
from ..study.stored import load_run_study

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    import torch

__all__ = [
    "EXPLAIN_SPLIT",
    "EXPLAIN_FORMATS",
    "LayerAttribution",
    "attribute_layers",
    "attribute_word_layers",
    "explain_study",
    "explanation_is_current",
    "stored_explanation",
    "format_explanation",
]

EXPLAIN_SPLIT = "validation"
EXPLAIN_FORMATS = ("table", "csv", "json")
EXPLAIN_VERSION = 1  # bump when the measures change: stored results of another version are recomputed
SINGLE_LAYER_ENCODERS = ("last-layer", "best-layer", "mlp-last")  # read one layer: nothing to attribute
PROBE_ENCODER = "best-layer"


@dataclass
class LayerAttribution:
    """Per-layer importances of one study's final model.

    Attributes:
        study, model, task, encoder, metric: what was explained.
        split: the split the measures use (always ``"validation"``).
        seeds: the final seeds, one retrained model each.
        scores: each seed's validation score without ablation.
        ablation: ``[seed][layer]`` drop of the validation score with the layer at its training mean.
        gradient_input: ``[seed][layer]`` signed gradient x (input - training mean) of the gold evidence,
            summed over the layer's features, mean over validation examples.
        probe_scores: the validation score of a linear probe on each layer (best-layer sibling study), or ``None``.
        probe_study: the study the probe scores come from.
        computed: whether this call computed it (``False``: read back from the study).
        seconds: how long the computation took when it ran.
    """

    study: str
    model: str
    task: str
    encoder: str
    metric: str
    split: str
    seeds: list[int]
    scores: list[float]
    ablation: list[list[float]]
    gradient_input: list[list[float]]
    probe_scores: list[float] | None = None
    probe_study: str | None = None
    computed: bool = False
    seconds: float = 0.0
    source: Attrs = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return len(self.ablation[0]) if self.ablation else 0

    def frame(self) -> pd.DataFrame:
        """One row per layer: ``layer``, ablation and gradient x input mean/std over seeds, ``probe_score``."""

        ablation, grads = np.asarray(self.ablation, dtype=float), np.asarray(self.gradient_input, dtype=float)
        ddof = 1 if len(self.seeds) > 1 else 0
        probe = self.probe_scores if self.probe_scores and len(self.probe_scores) == self.num_layers else None
        return pd.DataFrame(
            {
                "layer": np.arange(self.num_layers),
                "ablation_drop_mean": ablation.mean(0),
                "ablation_drop_std": ablation.std(0, ddof=ddof),
                "grad_input_mean": grads.mean(0),
                "grad_input_std": grads.std(0, ddof=ddof),
                "probe_score": probe if probe is not None else [math.nan] * self.num_layers,
            }
        )

    def record(self) -> ExplainRecord:
        """What is stored on the study."""
        stored = known_fields(ExplainRecord, dataclasses.asdict(self))
        return ExplainRecord(**{**stored, "seconds": round(self.seconds, 2), "version": EXPLAIN_VERSION})


def _mean_features(features: torch.Tensor) -> torch.Tensor:
    """Training mean per (layer, dimension), ``(L, D)`` float32; pairs count both sentences."""

    num_layers, hidden = features.shape[-2], features.shape[-1]
    return FeatureStandardizer(num_layers, hidden).fit(features).mean


def _gold_evidence(model: Any, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per example (per word of a tagger's ``(B, T, C)`` block), what gradient x input attributes: the gold class's
    logit minus the mean logit (classification, tagging), minus the squared error of the cosine (similarity)."""
    if model.task_kind != "similarity":
        # the logit, not the log-probability: a confident example's log-probability has a vanishing gradient,
        # so the misclassified examples would dominate; centred, since adding a constant to every logit changes nothing
        return outputs.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1) - outputs.mean(-1)
    return -(outputs - model.normalise_scores(labels.float())).square()


def attribute_layers(
    model: Any, train_features: Any, features: Any, labels: Any, *, metric: str | None = None, batch_size: int = 256
) -> tuple[float, list[float], list[float]]:
    """Layer ablation and gradient x input of a trained :class:`~ilge_search.engine.ILGEModel` on one labelled set.

    Args:
        model: a model from :func:`~ilge_search.engine.train_encoder`.
        train_features: its training features ``(N, L, D)`` (pairs ``(N, 2, L, D)``): the ablation baseline is
            their mean per layer and dimension.
        features, labels: the set to measure on (a study uses its validation split).
        metric: the score ablation drops (default: ``accuracy`` / ``spearman``).

    Returns:
        ``(score, drops, grad_input)``: the score without ablation, then per layer the score minus the score
        with the layer at its training mean, and the signed gradient x (input - training mean) of the gold
        evidence (centred gold logit; similarity: minus the squared error) summed over the layer's features and
        averaged over examples.
    """

    if model.task_kind == "tagging":
        return attribute_word_layers(model, train_features, features, labels, metric=metric)
    metric = metric or METRICS[model.task_kind][0]
    device = next(model.parameters()).device
    baseline = _mean_features(torch.as_tensor(train_features))
    features = torch.as_tensor(features)
    labels = torch.as_tensor(labels)
    score = float(evaluate(model, features, labels)[metric])
    ablated = features.to(torch.float32, copy=True)
    drops: list[float] = []
    for layer in range(ablated.shape[-2]):
        kept = ablated[..., layer, :].clone()
        ablated[..., layer, :] = baseline[layer]
        drops.append(score - float(evaluate(model, ablated, labels)[metric]))
        ablated[..., layer, :] = kept
    del ablated

    was_training = model.training
    model.eval()
    baseline = baseline.to(device)
    totals = torch.zeros(features.shape[-2], dtype=torch.float64)
    try:
        for start in range(0, features.shape[0], batch_size):
            x = features[start : start + batch_size].to(device=device, dtype=torch.float32).requires_grad_(True)
            gain = _gold_evidence(model, model(x), labels[start : start + batch_size].to(device)).sum()
            (grad,) = torch.autograd.grad(gain, x)
            per_layer = (grad * (x.detach() - baseline)).sum(-1)  # (B, L) or (B, 2, L)
            totals += per_layer.reshape(-1, per_layer.shape[-1]).sum(0).double().cpu()
    finally:
        model.train(was_training)
    return score, drops, (totals / features.shape[0]).tolist()


def attribute_word_layers(
    model: Any, train_words: Any, words: Any, labels: Any, *, metric: str | None = None
) -> tuple[float, list[float], list[float]]:
    """:func:`attribute_layers` for a :class:`~ilge_search.engine.TaggerModel`, over the word rows of a tagging set.

    ``train_words`` and ``words`` are word cache entries or ``(word features (W, L, D), sentence offsets)``; ``labels``
    one tag id per word. The ablation puts a layer of every word at its training mean (a sentence's graph sees all its
    words ablated at once); gradient x input is the centred gold logit of each word, averaged over words. The set is
    read one batch of equal-length sentences at a time, so a memory-mapped entry is never copied whole.
    """

    metric = metric or "accuracy"
    baseline = _mean_features(as_word_set(train_words, None, "train").features)
    checked = as_word_set(words, labels, EXPLAIN_SPLIT)
    assert checked.labels is not None
    device = next(model.parameters()).device
    baseline = baseline.to(device)
    num_layers = int(checked.features.shape[1])
    # row 0: the model as trained; row 1 + l: layer l at its training mean
    logits = torch.empty(num_layers + 1, checked.num_words, int(model.head.out_features))
    totals = torch.zeros(num_layers, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for sentences in sentence_batches(checked.lengths, checked.num_words, EVAL_BATCH_NODES, num_layers):
            block, rows = checked.gather(sentences)
            at = torch.from_numpy(rows)
            x = block.to(device=device, dtype=torch.float32)
            with torch.no_grad():
                for layer in range(num_layers):
                    ablated = x.clone()
                    ablated[..., layer, :] = baseline[layer]
                    logits[layer + 1, at] = model(ablated).reshape(len(rows), -1).float().cpu()
            x.requires_grad_(True)
            out = model(x)
            logits[0, at] = out.detach().reshape(len(rows), -1).float().cpu()
            gold = checked.labels[at].to(device).view(out.shape[:2])
            (grad,) = torch.autograd.grad(_gold_evidence(model, out, gold).sum(), x)
            totals += (grad * (x.detach() - baseline)).sum(-1).reshape(-1, num_layers).sum(0).double().cpu()
    finally:
        model.train(was_training)
    score = float(class_metrics(logits[0], checked.labels)[metric])
    drops = [score - float(class_metrics(logits[1 + layer], checked.labels)[metric]) for layer in range(num_layers)]
    return score, drops, (totals / checked.num_words).tolist()


# ----------------------------------------------------------------------------- studies


@dataclass(frozen=True)
class _Explained:
    """A study checked for explaining: made by ilge-search (``identity``), with a ``final`` evaluation."""

    study: optuna.Study
    record: StudyRecord
    identity: Identity
    final: FinalRecord


def _load_study(storage: Storage, study_name: str) -> _Explained:
    """The study, checked before any training: made by ilge-search, with a final evaluation, over several layers."""
    study = load_run_study(storage, study_name, purpose="explained")
    record = study_record(study)
    encoder = record.identity.encoder if record.identity else None
    if encoder in SINGLE_LAYER_ENCODERS:
        raise ValueError(
            f"study {study_name!r} uses the {encoder} baseline, which reads a single layer: there are "
            "no layer inputs to attribute; explain a cayley, fc, deepset, mean-layers or scalar-mix study"
        )
    if record.identity is None or record.final is None or not record.final.config or not record.final.seeds:
        raise ValueError(
            f"study {study_name!r} has no final evaluation; run it with --final-seeds (e.g. "
            "`ilge-search run ... --n-trials 0 --final-seeds 3` with the study's other options) first"
        )
    return _Explained(study, record, record.identity, record.final)


def _source(record: StudyRecord) -> Attrs:
    """What the attribution depends on: the final evaluation and the data it trained on."""
    final = record.final
    keys = record.data.cache_keys if record.data else {}
    return {
        "version": EXPLAIN_VERSION,
        "split": EXPLAIN_SPLIT,
        "final_trial": final.trial if final else None,
        "final_seeds": list(final.seeds) if final else [],
        "final_config": final.config if final else None,
        "final_max_epochs": final.max_epochs if final else None,
        "cache_keys": {split: keys.get(split) for split in ("train", "validation")},
    }


def explanation_is_current(record: StudyRecord) -> bool:
    """Whether a study's stored explanation was computed from its present final evaluation."""
    if record.explain is None:
        return False
    # through JSON: tuples, ints and floats compare as they were stored
    return json.loads(json.dumps(record.explain.source)) == json.loads(json.dumps(_source(record)))


def stored_explanation(
    record: StudyRecord, probe_scores: list[float] | None = None, probe_study: str | None = None
) -> LayerAttribution | None:
    """The attribution stored on a study when it is current, else ``None``."""
    stored = record.explain
    if stored is None or record.identity is None or not explanation_is_current(record):
        return None
    return LayerAttribution(
        study=record.name,
        model=str(record.identity.model),
        task=str(record.identity.task),
        encoder=str(record.identity.encoder),
        metric=str(stored.metric),
        split=stored.split,
        seeds=list(stored.seeds),
        scores=list(stored.scores),
        ablation=[list(row) for row in stored.ablation],
        gradient_input=[list(row) for row in stored.gradient_input],
        probe_scores=probe_scores,
        probe_study=probe_study,
        seconds=float(stored.seconds),
        source=dict(stored.source),
    )


def _probe(storage: Storage, record: StudyRecord) -> tuple[list[float] | None, str | None]:
    """The per-layer probe scores of the best-layer study with the same model, task and data options."""
    if record.identity is None:
        return None, None
    # the probe scores are trial scores: the same under either protocol
    wanted = record.identity.search_key(without=("encoder",))
    fingerprints = record.data.data_fingerprints if record.data else None
    for summary in storage.study_summaries():
        other = study_record(summary)
        if other.identity is None or other.identity.encoder != PROBE_ENCODER or summary.best_trial is None:
            continue
        if other.identity.search_key(without=("encoder",)) != wanted:
            continue
        theirs = other.data.data_fingerprints if other.data else None
        if theirs and fingerprints and theirs != fingerprints:
            continue
        scores = trial_record(summary.best_trial).layer_scores
        if scores:
            return [float(s) for s in scores], summary.study_name
    return None, None


def _measure(target: _Explained, setup: TrainingSetup) -> tuple[str, list[float], list[list[float]], list[list[float]]]:
    """The final configuration retrained once per final seed, each model measured on validation: the metric,
    then per seed the score, the layer ablation drops and gradient x input."""

    scores: list[float] = []
    ablation: list[list[float]] = []
    grads: list[list[float]] = []
    with setup.torch_threads():
        data = setup.load_data(target.study, with_test=False, progress=setup.progress)
        seeds = [int(seed) for seed in target.final.seeds]
        bar = BarSpec(f"explain {target.identity.encoder} ({len(seeds)} seeds)", unit="seed", enabled=setup.progress)
        for trained in train_seeds(data, config_from_dict(target.final.config), seeds, device=setup.device, bar=bar):
            score, drops, grad_input = attribute_layers(
                trained.model, data.train[0], *data.validation, metric=data.metric
            )
            scores.append(score)
            ablation.append(drops)
            grads.append(grad_input)
    return data.metric, scores, ablation, grads


def explain_study(
    storage: str | Storage | None, study_name: str, *, recompute: bool = False, setup: TrainingSetup | None = None
) -> LayerAttribution:
    """Per-layer importances of a study's final model (see the module docstring for the measures).

    Args:
        storage: the study's storage URL (or an opened :class:`~ilge_search.storage.Storage`); it is written to (the
            result is stored on the study).
        study_name: a study with a final evaluation, of an encoder over several layers.
        recompute: compute again even when the stored result is current.
        setup: where the task data (a custom task's ``task_path``, when it moved since the study ran) and the embedding
            cache are, the training device, torch's CPU threads while training (restored afterwards) and whether
            progress bars count seeds and layers (default: :class:`~ilge_search.study.data.TrainingSetup`'s).

    Raises:
        ValueError: unknown study, no final evaluation, a single-layer baseline, or data that differ from the
            study's; all before any training.
    """
    setup = setup or TrainingSetup()
    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    target = _load_study(opened, study_name)
    probe_scores, probe_study = _probe(opened, target.record)
    if not recompute:
        stored = stored_explanation(target.record, probe_scores, probe_study)
        if stored is not None:
            return stored

    started = time.perf_counter()
    metric, scores, ablation, grads = _measure(target, setup)
    result = LayerAttribution(
        study=target.study.study_name,
        model=str(target.identity.model),
        task=str(target.identity.task),
        encoder=str(target.identity.encoder),
        metric=metric,
        split=EXPLAIN_SPLIT,
        seeds=[int(seed) for seed in target.final.seeds],
        scores=scores,
        ablation=ablation,
        gradient_input=grads,
        probe_scores=probe_scores,
        probe_study=probe_study,
        computed=True,
        seconds=time.perf_counter() - started,
        source=_source(target.record),
    )
    save_explain(target.study, result.record())
    return result


def _spread(values: Sequence[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} +- {std:.4f}"


def format_explanation(result: LayerAttribution, fmt: str = "table") -> str:
    """The attribution as a table (a header, then one row per layer), CSV (header with ``layer``) or JSON."""
    if fmt not in EXPLAIN_FORMATS:
        raise ValueError(f"format must be one of {list(EXPLAIN_FORMATS)}, got {fmt!r}")
    frame = result.frame()
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        meta = {
            key: getattr(result, key)
            for key in ("study", "model", "task", "encoder", "metric", "split", "seeds", "scores", "probe_study")
        }
        meta["layers"] = json.loads(frame.to_json(orient="records"))
        return json.dumps(meta, indent=1) + "\n"
    source = "computed now" if result.computed else "stored on the study"
    evidence = "minus the squared error" if result.metric in ("spearman", "pearson") else "the gold logit (centred)"
    lines = [
        f"study {result.study}: {result.encoder} on {result.model} / {result.task}, {result.split} {result.metric} "
        f"{_spread(result.scores)} over seeds {result.seeds} ({source})",
        f"ablation_drop: {result.metric} lost with the layer at its training mean; grad_input: signed gradient x "
        f"(input - training mean) of {evidence}, summed over the layer; probe_score: a linear probe on "
        "the layer" + (f" (study {result.probe_study})" if result.probe_study else " (no best-layer study)"),
        frame.to_string(index=False, float_format=lambda v: f"{v:.4f}", na_rep="-"),
    ]
    return "\n".join(lines) + "\n"
