"""The final evaluation: the selected trial's config retrained per seed and scored on test once.

Which trial is retrained is the selection rule's choice (``--select``,
:mod:`~ilge_search.study.selection`). Stored as study user attrs:
``final_test_mean``, ``final_test_std``, ``final_test_scores``,
``final_val_scores``, ``final_seeds``, ``final_trial``, ``final_config``,
``final_max_epochs``, ``final_artifacts`` (the weights of the best seed by
validation and a JSON with its config, uploaded to the artifact store),
``final_artifact_seed`` and, for similarity studies scored on other STS tasks,
``final_zero_shot``; and, for the selection:

- ``final_select``: the rule (``best`` or ``one-se``);
- ``final_selected_value``: the selected trial's objective (its validation
  score, or its mean over folds with ``--cv``), and ``final_val_test_gap``:
  that value minus ``final_test_mean`` (positive: test is below what
  validation promised);
- ``final_start_trial``, ``final_start_test_mean``, ``final_start_test_scores``:
  the recommended starting configuration (the enqueued trial 0) retrained with
  the same seeds, and ``final_search_gain``: the selected trial's test mean
  minus the start's (in the direction of improvement; negative: the search did
  worse than no search). When the selected trial is the start, its scores are reused;
- ``final_by_rule``: ``{rule: {...the attrs above...}}``, so that both rules'
  results stay side by side on one study, and switching back to a rule whose
  evaluation is still current costs no training.

Studies evaluated before selection rules existed have no ``final_select``:
they were evaluated under ``best``.

A multi-objective study (:mod:`~ilge_search.objectives`) retrains its **final
front** instead: up to ``final_front`` trials of its Pareto front, spread evenly
along it (:func:`~ilge_search.study.selection.front_trials`), each with the
final seeds. ``final_front`` is one record per retrained trial, best validation
score first: ``trial``, ``config``, ``values`` (objective -> the trial's value),
``params``, ``latency_ms``, ``val_score`` (its objective score), ``test_mean``,
``test_std``, ``test_scores``, ``val_scores``, ``artifacts`` (the best seed's
weights and config, by validation) and ``artifact_seed``;
``final_front_k`` is the K asked for and ``final_front_size`` the front's size
then. The top-level ``final_*`` attrs are those of the front's best-score trial
(``final_select = "front"``), with the start configuration's scores and the
search gain as above, so every table of single-objective studies reads it too.
A front trial already retrained with the same seeds and epoch cap is reused.
The study's protocol (its ``protocol`` attr, :mod:`ilge_search.protocol`)
decides how each final model is scored; ``final_protocol`` records it. Under
``matched`` (and for every study stored before protocols existed) the trained
model's own head is scored on test. Under ``paper`` each seed's model is
trained exactly as under ``matched`` and then read out as MTEB would: its
vectors scored by logistic regressions fitted on ``samples_per_label``
examples per label (``n_experiments`` draws; ``final_test_scores`` holds each
seed's mean over the draws, ``final_protocol["test_experiment_scores"]`` the
draws), or by the cosine Spearman of the vectors for similarity tasks. A
parameter-free baseline (last layer, best layer, mean of layers) is not
trained at all under ``paper``: its raw layer readout is scored, the same for
every seed, and no weights are uploaded. ``final_val_scores`` is then the same
readout on validation, and ``final_val_test_gap`` is ``None``: the trials'
objective is a matched score (trials are the same under both protocols), so
its difference to a paper-protocol test score would measure the protocol, not
the selection.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from .._version import __version__
from ..configs import config_from_dict
from ..objectives import LATENCY_ATTR, PARAMS_ATTR, is_multi_objective, objective_values, score_of, study_objectives
from ..protocol import PaperProtocol, cosine_spearman, is_parameter_free, logistic_readout, paper_vectors
from ..storage import StorageError, count_trials
from .selection import (
    DEFAULT_FINAL_FRONT,
    DEFAULT_SELECT,
    FRONT_RULE,
    front_trials,
    select_trial,
    start_trial,
    study_front,
)

if TYPE_CHECKING:  # pragma: no cover
    from .data import StudyData

__all__ = ["final_is_current", "final_evaluation", "LEGACY_SELECT"]

LEGACY_SELECT = "best"  # the rule of final evaluations stored without final_select
_RULE_KEYS = (
    "final_test_mean",
    "final_test_std",
    "final_test_scores",
    "final_val_scores",
    "final_seeds",
    "final_trial",
    "final_config",
    "final_artifacts",
    "final_artifact_seed",
    "final_zero_shot",
    "final_max_epochs",
    "final_select",
    "final_selected_value",
    "final_val_test_gap",
    "final_start_trial",
    "final_start_test_mean",
    "final_start_test_scores",
    "final_search_gain",
    "final_protocol",
)


def _matches(record: Mapping[str, Any], trial: int, seeds: List[int], max_epochs: Optional[int]) -> bool:
    return (
        record.get("final_trial") == trial
        and record.get("final_seeds") == list(seeds)
        and record.get("final_max_epochs") == max_epochs
        and "final_test_mean" in record
    )


def final_is_current(
    study: Any,
    seeds: List[int],
    max_epochs: Optional[int],
    select: str = DEFAULT_SELECT,
    final_front: int = DEFAULT_FINAL_FRONT,
) -> bool:
    """Whether ``study``'s stored final scores are those a final evaluation would produce now.

    True when the study has a complete trial and its final evaluation exists
    (``final_test_mean``) under the rule ``select``, for the trial that rule
    selects now, with the same seed list and the same ``max_epochs``. For a
    multi-objective study: its final front holds the trials
    :func:`~ilge_search.study.selection.front_trials` picks now out of
    ``final_front``, with those seeds and that epoch cap (``select`` does not
    apply). The runner and sweeps both ask this.
    """
    if not count_trials(study, ("COMPLETE",)):
        return False
    attrs = study.user_attrs
    if is_multi_objective(study):
        wanted = [t.number for t in front_trials(study_front(study), final_front)]
        records = attrs.get("final_front") or []
        return (
            attrs.get("final_select") == FRONT_RULE
            and [r.get("trial") for r in records] == wanted
            and attrs.get("final_seeds") == list(seeds)
            and attrs.get("final_max_epochs") == max_epochs
            and "final_test_mean" in attrs
        )
    if attrs.get("final_select", LEGACY_SELECT) != select:
        return False
    return _matches(attrs, select_trial(study, select).number, seeds, max_epochs)


def _upload_artifacts(
    study: Any,
    data: "StudyData",
    config: Any,
    model: Any,
    *,
    seed: int,
    val_metric: float,
    trial: int,
    artifact_store: Any,
) -> Dict[str, str]:
    """Upload the weights (safetensors) and a JSON of config, labels and provenance; their artifact ids."""
    import torch
    from optuna.artifacts import upload_artifact
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="ilge-final-") as tmp:
        weights_path = Path(tmp, "model.safetensors")
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(weights_path))
        meta_path = Path(tmp, "config.json")
        meta_path.write_text(
            json.dumps(
                {
                    "config": config.to_dict(),
                    "model": study.user_attrs.get("model"),
                    "task": study.user_attrs.get("task"),
                    "task_kind": data.task_kind,
                    "metric": data.metric,
                    "num_layers": data.num_layers,
                    "hidden_size": data.hidden_size,
                    "num_classes": data.num_classes,
                    "label_names": data.label_names,
                    "score_range": getattr(model, "score_range", None),
                    "seed": seed,
                    "val_metric": val_metric,
                    "trial": trial,
                    "ilge_search_version": __version__,
                    "torch_version": torch.__version__,
                },
                indent=2,
            )
        )
        return {
            "weights": upload_artifact(
                study_or_trial=study, file_path=str(weights_path), artifact_store=artifact_store
            ),
            "config": upload_artifact(
                study_or_trial=study,
                file_path=str(meta_path),
                artifact_store=artifact_store,
                mimetype="application/json",
            ),
        }


@dataclass
class _Scores:
    """What a final evaluation measured: per seed, and the best seed's model by validation."""

    test: List[float] = field(default_factory=list)
    validation: List[float] = field(default_factory=list)
    zero_shot: Dict[str, List[float]] = field(default_factory=dict)
    experiments: List[List[float]] = field(default_factory=list)  # paper protocol: each seed's draws on test
    best: Tuple[Any, Any, float] = (None, None, -math.inf)  # (model, seed, validation score)


def _paper_readout(
    data: "StudyData",
    zero_shot: Mapping[str, Tuple[Any, Any]],
    readout: PaperProtocol,
    *,
    model: Any = None,
    config: Any = None,
) -> Tuple[float, float, Dict[str, float], List[float]]:
    """(test score, validation score, zero-shot scores, test score of each draw) of one final model, or of
    a parameter-free baseline's ``config`` untrained, under the paper protocol."""
    import numpy as np

    def vectors(features: Any) -> Any:
        return paper_vectors(features, model=model, config=config)

    zero = {
        name: cosine_spearman(*vectors(features).transpose(1, 0, 2), labels)
        for name, (features, labels) in zero_shot.items()
    }
    if data.task_kind == "similarity":
        test, validation = (
            cosine_spearman(*vectors(split[0]).transpose(1, 0, 2), split[1]) for split in (data.test, data.validation)
        )
        return test, validation, zero, []
    scores = logistic_readout(
        (vectors(data.train[0]), np.asarray(data.train[1])),
        {
            "test": (vectors(data.test[0]), np.asarray(data.test[1])),
            "validation": (vectors(data.validation[0]), np.asarray(data.validation[1])),
        },
        readout,
    )
    return statistics.fmean(scores["test"]), statistics.fmean(scores["validation"]), zero, scores["test"]


def _retrain(
    config: Any,
    data: "StudyData",
    seeds: List[int],
    device: str,
    zero_shot: Mapping[str, Tuple[Any, Any]],
    encoder: str,
    show_progress: bool,
    readout: Optional[PaperProtocol] = None,
) -> _Scores:
    """Train ``config`` once per seed and score it on test (its head, or the paper protocol's ``readout``)."""
    from tqdm.auto import tqdm

    from ..engine import evaluate, train_encoder

    out = _Scores(zero_shot={name: [] for name in zero_shot})
    untrained = None
    if readout is not None and is_parameter_free(config):  # the paper scores the raw readout: nothing to train
        untrained = _paper_readout(data, zero_shot, readout, config=config)
    for seed in tqdm(seeds, desc=f"final {encoder} ({len(seeds)} seeds)", disable=not show_progress, leave=False):
        if untrained is not None:
            test, validation, zero, draws = untrained
        else:
            result = train_encoder(
                config,
                data.train,
                data.validation,
                task_kind=data.task_kind,
                num_classes=data.num_classes,
                seed=seed,
                device=device,
            )
            if result.best_val_metric > out.best[2]:  # the artifact is the best seed by validation, never by test
                out.best = (result.model, seed, float(result.best_val_metric))
            if readout is not None:
                test, validation, zero, draws = _paper_readout(data, zero_shot, readout, model=result.model)
            else:
                test = float(evaluate(result.model, *data.test, task_kind=data.task_kind)[data.metric])
                validation, draws = float(result.best_val_metric), []
                zero = {
                    name: float(evaluate(result.model, features, labels, "similarity")["spearman"])
                    for name, (features, labels) in zero_shot.items()
                }
        out.test.append(float(test))
        out.validation.append(float(validation))
        out.experiments.append(list(draws))
        for name, value in zero.items():
            out.zero_shot[name].append(float(value))
    return out


def _start_scores(
    study: Any,
    data: "StudyData",
    selected: Any,
    test_scores: List[float],
    seeds: List[int],
    device: str,
    max_epochs: Optional[int],
    encoder: str,
    show_progress: bool,
    readout: Optional[PaperProtocol],
) -> Tuple[Optional[int], Optional[List[float]]]:
    """The starting configuration's test scores with ``seeds``: the selected trial's own when it is the start,
    else those stored by an earlier evaluation with the same seeds and epoch cap, else retrained."""
    start = start_trial(study)
    if start is None:
        return None, None
    if start.number == selected.number:
        return start.number, list(test_scores)
    attrs = study.user_attrs
    for record in [attrs, *(attrs.get("final_by_rule") or {}).values()]:
        if (
            record.get("final_start_trial") == start.number
            and record.get("final_seeds") == list(seeds)
            and record.get("final_max_epochs") == max_epochs
            and record.get("final_start_test_scores")
        ):
            return start.number, list(record["final_start_test_scores"])
    config = config_from_dict(start.user_attrs["config"])
    return start.number, _retrain(config, data, seeds, device, {}, f"{encoder} start", show_progress, readout).test


def _upload_best(
    study: Any, data: "StudyData", config: Any, best: Tuple[Any, Any, float], trial: int, artifact_store: Any
) -> Dict[str, str]:
    """Upload the best seed's weights; a full or read-only artifact folder is one clear error."""
    model, seed, val_metric = best
    if artifact_store is None or model is None:  # nothing to upload: no store, or nothing trained (paper baselines)
        return {}
    try:
        return _upload_artifacts(
            study, data, config, model, seed=seed, val_metric=val_metric, trial=trial, artifact_store=artifact_store
        )
    except OSError as exc:  # a full or read-only artifact folder: nothing of the final evaluation is stored
        raise StorageError(
            f"cannot store the best weights in the artifact store ({exc.strerror or exc}); "
            "free space there or pass another --artifact-dir, then rerun with --n-trials 0 "
            "to redo the final evaluation"
        ) from exc


def _std(scores: List[float]) -> float:
    return statistics.stdev(scores) if len(scores) > 1 else 0.0


def _zero_shot_record(zero_shot_scores: Mapping[str, List[float]]) -> Dict[str, Any]:
    return {
        name: {"mean": statistics.fmean(scores), "std": _std(scores), "scores": scores}
        for name, scores in zero_shot_scores.items()
    }


def _front_record(
    trial: Any,
    objectives: Tuple[str, ...],
    test_scores: List[float],
    val_scores: List[float],
    artifacts: Dict[str, str],
    artifact_seed: Any,
) -> Dict[str, Any]:
    values = objective_values(trial, objectives) or ()
    return {
        "trial": trial.number,
        "config": dict(trial.user_attrs["config"]),
        "values": dict(zip(objectives, values, strict=False)),
        "params": trial.user_attrs.get(PARAMS_ATTR),
        "latency_ms": trial.user_attrs.get(LATENCY_ATTR),
        "val_score": score_of(trial),
        "test_mean": statistics.fmean(test_scores),
        "test_std": _std(test_scores),
        "test_scores": test_scores,
        "val_scores": val_scores,
        "artifacts": artifacts,
        "artifact_seed": artifact_seed,
    }


def _front_evaluation(
    study: Any,
    data: "StudyData",
    *,
    encoder: str,
    seeds: List[int],
    device: str,
    max_epochs: Optional[int],
    final_front: int,
    artifact_store: Any,
    zero_shot: Mapping[str, Tuple[Any, Any]],
    show_progress: bool,
) -> None:
    """A multi-objective study's final evaluation: each trial of its final front retrained per seed."""
    front = study_front(study)
    chosen = front_trials(front, final_front)
    attrs = study.user_attrs
    objectives = study_objectives(attrs)
    readout = PaperProtocol.from_attrs(attrs)
    kept = {}  # records of an earlier evaluation with the same seeds and epoch cap: the same scores again
    if attrs.get("final_seeds") == list(seeds) and attrs.get("final_max_epochs") == max_epochs:
        kept = {r["trial"]: r for r in attrs.get("final_front") or [] if r.get("artifacts") or artifact_store is None}
    records: List[Dict[str, Any]] = []
    top_zero_shot: Dict[str, List[float]] = {}
    for index, trial in enumerate(chosen):
        wants_zero_shot = index == 0 and bool(zero_shot)
        if trial.number in kept and not wants_zero_shot:
            records.append(kept[trial.number])
            continue
        config = config_from_dict(trial.user_attrs["config"])
        scores = _retrain(
            config,
            data,
            seeds,
            device,
            zero_shot if index == 0 else {},
            f"{encoder} front trial {trial.number}",
            show_progress,
            readout,
        )
        test_scores, val_scores, zero_shot_scores, best = scores.test, scores.validation, scores.zero_shot, scores.best
        if index == 0:
            top_zero_shot = zero_shot_scores
        artifacts = _upload_best(study, data, config, best, trial.number, artifact_store)
        records.append(_front_record(trial, objectives, test_scores, val_scores, artifacts, best[1]))
    top, top_trial = records[0], chosen[0]
    start_number, start_scores = _start_scores(
        study, data, top_trial, top["test_scores"], seeds, device, max_epochs, encoder, show_progress, readout
    )
    sign = -1.0 if attrs.get("direction") == "minimize" else 1.0
    start_mean = None if start_scores is None else statistics.fmean(start_scores)
    record: Dict[str, Any] = {
        "final_test_mean": top["test_mean"],
        "final_test_std": top["test_std"],
        "final_test_scores": top["test_scores"],
        "final_val_scores": top["val_scores"],
        "final_seeds": list(seeds),
        "final_trial": top["trial"],
        "final_config": top["config"],
        "final_artifacts": top["artifacts"],
        "final_artifact_seed": top["artifact_seed"],
        "final_select": FRONT_RULE,
        "final_selected_value": top["val_score"],
        "final_val_test_gap": None if readout is not None else sign * (top["val_score"] - top["test_mean"]),
        "final_start_trial": start_number,
        "final_start_test_mean": start_mean,
        "final_start_test_scores": start_scores,
        "final_search_gain": None if start_mean is None else sign * (top["test_mean"] - start_mean),
        "final_max_epochs": max_epochs,
        "final_front": records,
        "final_front_k": final_front,
        "final_front_size": len(front),
        "final_protocol": {"protocol": "matched"} if readout is None else readout.record(),
    }
    if top_zero_shot:
        record["final_zero_shot"] = _zero_shot_record(top_zero_shot)
    elif "final_zero_shot" in attrs and not zero_shot:
        record["final_zero_shot"] = {}
    for key, value in record.items():
        study.set_user_attr(key, value)


def final_evaluation(
    study: Any,
    data: "StudyData",
    *,
    encoder: str,
    seeds: List[int],
    device: str,
    max_epochs: Optional[int],
    select: str = DEFAULT_SELECT,
    artifact_store: Any = None,
    zero_shot: Mapping[str, Tuple[Any, Any]] = {},
    show_progress: bool = True,
    final_front: int = DEFAULT_FINAL_FRONT,
) -> None:
    """Retrain the trial ``select`` picks with each seed; evaluate on test once per seed; store the scores.

    The starting configuration is retrained with the same seeds for the search
    gain (unless its scores are at hand). A rule whose earlier evaluation
    (``final_by_rule``) is still current is restored without training.
    ``artifact_store`` (e.g. ``Storage.artifact_store()``) receives the best
    seed's weights; ``None`` uploads nothing. ``max_epochs`` is recorded as
    ``final_max_epochs`` (what :func:`final_is_current` compares). A
    multi-objective study retrains up to ``final_front`` trials of its Pareto
    front instead (``select`` does not apply).
    """
    if is_multi_objective(study):
        _front_evaluation(
            study,
            data,
            encoder=encoder,
            seeds=seeds,
            device=device,
            max_epochs=max_epochs,
            final_front=final_front,
            artifact_store=artifact_store,
            zero_shot=zero_shot,
            show_progress=show_progress,
        )
        return
    selected = select_trial(study, select)
    by_rule = dict(study.user_attrs.get("final_by_rule") or {})
    # the same trial, seeds and epoch cap retrain to the same scores: a rule that picks what another rule
    # already evaluated (or itself, before a switch) reuses that record
    for rule in sorted(by_rule, key=lambda name: name != select):
        kept = by_rule[rule]
        if _matches(kept, selected.number, seeds, max_epochs) and (
            bool(kept.get("final_artifacts")) or artifact_store is None
        ):
            kept = {**kept, "final_select": select}
            for key in _RULE_KEYS:
                if key in kept:
                    study.set_user_attr(key, kept[key])
                elif key == "final_zero_shot" and key in study.user_attrs:
                    study.set_user_attr(key, {})
            by_rule[select] = kept
            study.set_user_attr("final_by_rule", by_rule)
            return

    config = config_from_dict(selected.user_attrs["config"])
    readout = PaperProtocol.from_attrs(study.user_attrs)
    scores = _retrain(config, data, seeds, device, zero_shot, encoder, show_progress, readout)
    test_scores, val_scores, zero_shot_scores = scores.test, scores.validation, scores.zero_shot
    best_model, best_seed, best_val = scores.best

    artifacts = _upload_best(study, data, config, (best_model, best_seed, best_val), selected.number, artifact_store)
    start_number, start_scores = _start_scores(
        study, data, selected, test_scores, seeds, device, max_epochs, encoder, show_progress, readout
    )

    mean = statistics.fmean(test_scores)
    sign = -1.0 if study.user_attrs.get("direction") == "minimize" else 1.0
    record: Dict[str, Any] = {
        "final_test_mean": mean,
        "final_test_std": statistics.stdev(test_scores) if len(test_scores) > 1 else 0.0,
        "final_test_scores": test_scores,
        "final_val_scores": val_scores,
        "final_seeds": list(seeds),
        "final_trial": selected.number,
        "final_config": config.to_dict(),
        "final_artifacts": artifacts,
        "final_artifact_seed": best_seed,
        "final_select": select,
        "final_selected_value": float(selected.value),
        # a matched objective against a paper-protocol test score would measure the protocol: no gap there
        "final_val_test_gap": None if readout is not None else sign * (float(selected.value) - mean),
        "final_start_trial": start_number,
        "final_start_test_mean": None if start_scores is None else statistics.fmean(start_scores),
        "final_start_test_scores": start_scores,
        "final_search_gain": None if start_scores is None else sign * (mean - statistics.fmean(start_scores)),
        "final_protocol": ({"protocol": "matched"} if readout is None else readout.record()),
    }
    if readout is not None and data.task_kind == "classification":  # each seed's draws (similarity has none)
        record["final_protocol"]["test_experiment_scores"] = scores.experiments
    if zero_shot_scores:
        record["final_zero_shot"] = {
            name: {
                "mean": statistics.fmean(scores),
                "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                "scores": scores,
            }
            for name, scores in zero_shot_scores.items()
        }
    record["final_max_epochs"] = max_epochs
    for key, value in record.items():
        study.set_user_attr(key, value)
    if "final_zero_shot" not in record and "final_zero_shot" in study.user_attrs:
        study.set_user_attr("final_zero_shot", {})  # not this evaluation's: never shown beside its scores
    by_rule[select] = record
    study.set_user_attr("final_by_rule", by_rule)
