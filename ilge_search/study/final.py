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
from ..protocol import PaperProtocol, cosine_spearman, is_parameter_free, logistic_readout, paper_vectors
from ..storage import StorageError, count_trials
from .selection import DEFAULT_SELECT, select_trial, start_trial

if TYPE_CHECKING:  # pragma: no cover
    from .data import StudyData

__all__ = ["final_is_current", "final_evaluation", "LEGACY_SELECT"]

LEGACY_SELECT = "best"  # the rule of final evaluations stored without final_select
_RULE_KEYS = ("final_test_mean", "final_test_std", "final_test_scores", "final_val_scores", "final_seeds",
              "final_trial", "final_config", "final_artifacts", "final_artifact_seed", "final_zero_shot",
              "final_max_epochs", "final_select", "final_selected_value", "final_val_test_gap", "final_start_trial",
              "final_start_test_mean", "final_start_test_scores", "final_search_gain", "final_protocol")


def _matches(record: Mapping[str, Any], trial: int, seeds: List[int], max_epochs: Optional[int]) -> bool:
    return (record.get("final_trial") == trial and record.get("final_seeds") == list(seeds)
            and record.get("final_max_epochs") == max_epochs and "final_test_mean" in record)


def final_is_current(study: Any, seeds: List[int], max_epochs: Optional[int], select: str = DEFAULT_SELECT) -> bool:
    """Whether ``study``'s stored final scores are those a final evaluation would produce now.

    True when the study has a complete trial and its final evaluation exists
    (``final_test_mean``) under the rule ``select``, for the trial that rule
    selects now, with the same seed list and the same ``max_epochs``. The
    runner and sweeps both ask this.
    """
    if not count_trials(study, ("COMPLETE",)):
        return False
    attrs = study.user_attrs
    if attrs.get("final_select", LEGACY_SELECT) != select:
        return False
    return _matches(attrs, select_trial(study, select).number, seeds, max_epochs)


def _upload_artifacts(study: Any, data: "StudyData", config: Any, model: Any, *, seed: int, val_metric: float,
                      trial: int, artifact_store: Any) -> Dict[str, str]:
    """Upload the weights (safetensors) and a JSON of config, labels and provenance; their artifact ids."""
    import torch
    from optuna.artifacts import upload_artifact
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="ilge-final-") as tmp:
        weights_path = Path(tmp, "model.safetensors")
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(weights_path))
        meta_path = Path(tmp, "config.json")
        meta_path.write_text(json.dumps({
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
        }, indent=2))
        return {
            "weights": upload_artifact(study_or_trial=study, file_path=str(weights_path),
                                       artifact_store=artifact_store),
            "config": upload_artifact(study_or_trial=study, file_path=str(meta_path), artifact_store=artifact_store,
                                      mimetype="application/json"),
        }


@dataclass
class _Scores:
    """What a final evaluation measured: per seed, and the best seed's model by validation."""

    test: List[float] = field(default_factory=list)
    validation: List[float] = field(default_factory=list)
    zero_shot: Dict[str, List[float]] = field(default_factory=dict)
    experiments: List[List[float]] = field(default_factory=list)  # paper protocol: each seed's draws on test
    best: Tuple[Any, Any, float] = (None, None, -math.inf)  # (model, seed, validation score)


def _paper_readout(data: "StudyData", zero_shot: Mapping[str, Tuple[Any, Any]], readout: PaperProtocol, *,
                   model: Any = None, config: Any = None) -> Tuple[float, float, Dict[str, float], List[float]]:
    """(test score, validation score, zero-shot scores, test score of each draw) of one final model, or of
    a parameter-free baseline's ``config`` untrained, under the paper protocol."""
    import numpy as np

    def vectors(features: Any) -> Any:
        return paper_vectors(features, model=model, config=config)

    zero = {name: cosine_spearman(*vectors(features).transpose(1, 0, 2), labels)
            for name, (features, labels) in zero_shot.items()}
    if data.task_kind == "similarity":
        test, validation = (cosine_spearman(*vectors(split[0]).transpose(1, 0, 2), split[1])
                            for split in (data.test, data.validation))
        return test, validation, zero, []
    scores = logistic_readout((vectors(data.train[0]), np.asarray(data.train[1])),
                              {"test": (vectors(data.test[0]), np.asarray(data.test[1])),
                               "validation": (vectors(data.validation[0]), np.asarray(data.validation[1]))},
                              readout)
    return statistics.fmean(scores["test"]), statistics.fmean(scores["validation"]), zero, scores["test"]


def _retrain(config: Any, data: "StudyData", seeds: List[int], device: str, zero_shot: Mapping[str, Tuple[Any, Any]],
             encoder: str, show_progress: bool, readout: Optional[PaperProtocol] = None) -> _Scores:
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
            result = train_encoder(config, data.train, data.validation, task_kind=data.task_kind,
                                   num_classes=data.num_classes, seed=seed, device=device)
            if result.best_val_metric > out.best[2]:  # the artifact is the best seed by validation, never by test
                out.best = (result.model, seed, float(result.best_val_metric))
            if readout is not None:
                test, validation, zero, draws = _paper_readout(data, zero_shot, readout, model=result.model)
            else:
                test = float(evaluate(result.model, *data.test, task_kind=data.task_kind)[data.metric])
                validation, draws = float(result.best_val_metric), []
                zero = {name: float(evaluate(result.model, features, labels, "similarity")["spearman"])
                        for name, (features, labels) in zero_shot.items()}
        out.test.append(float(test))
        out.validation.append(float(validation))
        out.experiments.append(list(draws))
        for name, value in zero.items():
            out.zero_shot[name].append(float(value))
    return out


def _start_scores(study: Any, data: "StudyData", selected: Any, test_scores: List[float], seeds: List[int],
                  device: str, max_epochs: Optional[int], encoder: str, show_progress: bool,
                  readout: Optional[PaperProtocol]) -> Tuple[Optional[int], Optional[List[float]]]:
    """The starting configuration's test scores with ``seeds``: the selected trial's own when it is the start,
    else those stored by an earlier evaluation with the same seeds and epoch cap, else retrained."""
    start = start_trial(study)
    if start is None:
        return None, None
    if start.number == selected.number:
        return start.number, list(test_scores)
    attrs = study.user_attrs
    for record in [attrs, *(attrs.get("final_by_rule") or {}).values()]:
        if (record.get("final_start_trial") == start.number and record.get("final_seeds") == list(seeds)
                and record.get("final_max_epochs") == max_epochs and record.get("final_start_test_scores")):
            return start.number, list(record["final_start_test_scores"])
    config = config_from_dict(start.user_attrs["config"])
    return start.number, _retrain(config, data, seeds, device, {}, f"{encoder} start", show_progress, readout).test


def final_evaluation(study: Any, data: "StudyData", *, encoder: str, seeds: List[int], device: str,
                     max_epochs: Optional[int], select: str = DEFAULT_SELECT, artifact_store: Any = None,
                     zero_shot: Mapping[str, Tuple[Any, Any]] = {}, show_progress: bool = True) -> None:
    """Retrain the trial ``select`` picks with each seed; evaluate on test once per seed; store the scores.

    The starting configuration is retrained with the same seeds for the search
    gain (unless its scores are at hand). A rule whose earlier evaluation
    (``final_by_rule``) is still current is restored without training.
    ``artifact_store`` (e.g. ``Storage.artifact_store()``) receives the best
    seed's weights; ``None`` uploads nothing. ``max_epochs`` is recorded as
    ``final_max_epochs`` (what :func:`final_is_current` compares).
    """
    selected = select_trial(study, select)
    by_rule = dict(study.user_attrs.get("final_by_rule") or {})
    # the same trial, seeds and epoch cap retrain to the same scores: a rule that picks what another rule
    # already evaluated (or itself, before a switch) reuses that record
    for rule in sorted(by_rule, key=lambda name: name != select):
        kept = by_rule[rule]
        if _matches(kept, selected.number, seeds, max_epochs) and (
                bool(kept.get("final_artifacts")) or artifact_store is None):
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

    artifacts: Dict[str, str] = {}
    if artifact_store is not None and best_model is not None:
        try:
            artifacts = _upload_artifacts(study, data, config, best_model, seed=best_seed, val_metric=best_val,
                                          trial=selected.number, artifact_store=artifact_store)
        except OSError as exc:  # a full or read-only artifact folder: nothing of the final evaluation is stored
            raise StorageError(f"cannot store the best weights in the artifact store ({exc.strerror or exc}); "
                               "free space there or pass another --artifact-dir, then rerun with --n-trials 0 "
                               "to redo the final evaluation") from exc
    start_number, start_scores = _start_scores(study, data, selected, test_scores, seeds, device, max_epochs,
                                               encoder, show_progress, readout)

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
            name: {"mean": statistics.fmean(scores), "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                   "scores": scores}
            for name, scores in zero_shot_scores.items()
        }
    record["final_max_epochs"] = max_epochs
    for key, value in record.items():
        study.set_user_attr(key, value)
    if "final_zero_shot" not in record and "final_zero_shot" in study.user_attrs:
        study.set_user_attr("final_zero_shot", {})  # not this evaluation's: never shown beside its scores
    by_rule[select] = record
    study.set_user_attr("final_by_rule", by_rule)
