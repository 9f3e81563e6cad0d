"""The final evaluation: the best trial's config retrained per seed and scored on test once.

Stored as study user attrs: ``final_test_mean``, ``final_test_std``,
``final_test_scores``, ``final_val_scores``, ``final_seeds``, ``final_trial``,
``final_config``, ``final_max_epochs``, ``final_artifacts`` (the weights of the
best seed by validation and a JSON with its config, uploaded to the artifact
store), ``final_artifact_seed`` and, for similarity studies scored on other
STS tasks, ``final_zero_shot``.
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from .._version import __version__
from ..configs import config_from_dict
from ..storage import StorageError, count_trials

if TYPE_CHECKING:  # pragma: no cover
    from .data import StudyData

__all__ = ["final_is_current", "final_evaluation"]


def final_is_current(study: Any, seeds: List[int], max_epochs: Optional[int]) -> bool:
    """Whether ``study``'s stored final scores are those a final evaluation would produce now.

    True when the study has a complete trial and its final evaluation exists
    (``final_test_mean``) for the current best trial, with the same seed list
    and the same ``max_epochs``. The runner and sweeps both ask this.
    """
    if not count_trials(study, ("COMPLETE",)):
        return False
    attrs = study.user_attrs
    return (attrs.get("final_trial") == study.best_trial.number and attrs.get("final_seeds") == list(seeds)
            and attrs.get("final_max_epochs") == max_epochs and "final_test_mean" in attrs)


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


def final_evaluation(study: Any, data: "StudyData", *, encoder: str, seeds: List[int], device: str,
                     max_epochs: Optional[int], artifact_store: Any = None,
                     zero_shot: Mapping[str, Tuple[Any, Any]] = {}, show_progress: bool = True) -> None:
    """Retrain the best trial's config with each seed; evaluate on test once per seed; store the scores.

    ``artifact_store`` (e.g. ``Storage.artifact_store()``) receives the best
    seed's weights; ``None`` uploads nothing. ``max_epochs`` is recorded as
    ``final_max_epochs`` (what :func:`final_is_current` compares).
    """
    from tqdm.auto import tqdm

    from ..engine import evaluate, train_encoder

    best = study.best_trial
    config = config_from_dict(best.user_attrs["config"])
    test_scores: List[float] = []
    val_scores: List[float] = []
    zero_shot_scores: Dict[str, List[float]] = {name: [] for name in zero_shot}
    best_model, best_seed, best_val = None, None, -math.inf
    for seed in tqdm(seeds, desc=f"final {encoder} ({len(seeds)} seeds)", disable=not show_progress, leave=False):
        result = train_encoder(config, data.train, data.validation, task_kind=data.task_kind,
                               num_classes=data.num_classes, seed=seed, device=device)
        test_scores.append(float(evaluate(result.model, *data.test, task_kind=data.task_kind)[data.metric]))
        val_scores.append(float(result.best_val_metric))
        for name, (features, labels) in zero_shot.items():
            zero_shot_scores[name].append(float(evaluate(result.model, features, labels, "similarity")["spearman"]))
        if result.best_val_metric > best_val:  # the artifact is the best seed by validation, never by test
            best_model, best_seed, best_val = result.model, seed, result.best_val_metric

    artifacts: Dict[str, str] = {}
    if artifact_store is not None:
        try:
            artifacts = _upload_artifacts(study, data, config, best_model, seed=best_seed, val_metric=best_val,
                                          trial=best.number, artifact_store=artifact_store)
        except OSError as exc:  # a full or read-only artifact folder: nothing of the final evaluation is stored
            raise StorageError(f"cannot store the best weights in the artifact store ({exc.strerror or exc}); "
                               "free space there or pass another --artifact-dir, then rerun with --n-trials 0 "
                               "to redo the final evaluation") from exc

    std = statistics.stdev(test_scores) if len(test_scores) > 1 else 0.0
    record = {
        "final_test_mean": statistics.fmean(test_scores),
        "final_test_std": std,
        "final_test_scores": test_scores,
        "final_val_scores": val_scores,
        "final_seeds": seeds,
        "final_trial": best.number,
        "final_config": config.to_dict(),
        "final_artifacts": artifacts,
        "final_artifact_seed": best_seed,
    }
    if zero_shot_scores:
        record["final_zero_shot"] = {
            name: {"mean": statistics.fmean(scores), "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                   "scores": scores}
            for name, scores in zero_shot_scores.items()
        }
    record["final_max_epochs"] = max_epochs
    for key, value in record.items():
        study.set_user_attr(key, value)
