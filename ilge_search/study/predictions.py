"""Per-example test predictions kept as a study artifact: the one format the final evaluation and the
leaderboard store, and the paired interval computed from two of them.

An artifact is one compressed ``.npz``: ``truth`` (the ``N`` test labels or gold scores) and one
``(seeds, N)`` array per named model, in the order of the record's seeds: predicted class ids (stored in
the smallest unsigned integer type that holds them) or predicted similarity scores (float32). With both
sides of a comparison stored on the same test examples and seeds, :func:`paired_interval` gives the
paired bootstrap over examples and seeds (:func:`~.statistics.paired_bootstrap`) that per-seed scores
cannot.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.artifacts import FileSystemArtifactStore, download_artifact, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound

from ..engine import predict_logits
from .limits import MIN_TEST_ROWS
from .statistics import METRICS, BootstrapSettings, Interval, paired_bootstrap

if TYPE_CHECKING:
    from ..record import FinalRecord
    from .shapes import Features, TrainedModel

__all__ = [
    "interval_kind",
    "StoredPredictions",
    "compact",
    "model_predictions",
    "predicted_labels",
    "upload_test_predictions",
    "read_test_predictions",
    "paired_interval",
    "stored_final_predictions",
]


logger = logging.getLogger(__name__)

# what a truncated or overwritten .npz raises from np.load or from reading one of its arrays
_UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error)
_FALLBACK = "the t interval over the seeds is used instead of the paired bootstrap"


def predicted_labels(predictions: np.ndarray, task_kind: str) -> np.ndarray:
    """What the paired bootstrap compares: class ids (argmax of class probabilities ``(..., N, C)``; a tagger's
    per word) or similarity scores (as given)."""
    predictions = np.asarray(predictions)
    return predictions if task_kind == "similarity" else predictions.argmax(axis=-1)


def model_predictions(model: TrainedModel, features: Features) -> np.ndarray:
    """A trained model's predicted class ids ``(N,)`` or similarity scores ``(N,)`` on ``features``."""

    return predicted_labels(predict_logits(model, features).double().numpy(), model.task_kind)


def compact(values: np.ndarray | Sequence[Any]) -> np.ndarray:
    """``values`` in the smallest exact dtype: class ids as uint8/uint16/int64, scores as float32."""
    array = np.asarray(values)
    if array.dtype.kind in "iub":
        if array.size == 0 or array.min() >= 0:
            top = int(array.max()) if array.size else 0
            return array.astype(np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.int64)
        return array.astype(np.int64)
    return array.astype(np.float32)


def upload_test_predictions(
    study: Any, arrays: Mapping[str, np.ndarray], artifact_store: Any, file_name: str
) -> str | None:
    """Store ``arrays`` (``truth`` and one ``(seeds, N)`` array per model) as one compressed ``.npz``
    artifact of ``study`` named ``file_name``; its artifact id (``None`` without an artifact store)."""
    if artifact_store is None:
        return None

    with tempfile.TemporaryDirectory(prefix="ilge-predictions-") as tmp:
        path = Path(tmp, file_name)
        np.savez_compressed(path, allow_pickle=False, **{key: compact(value) for key, value in arrays.items()})
        return upload_artifact(study_or_trial=study, file_path=str(path), artifact_store=artifact_store)


def read_test_predictions(artifacts: Any, artifact_id: str | None) -> dict[str, np.ndarray] | None:
    """The arrays of a stored predictions artifact (class ids as int64), or ``None`` when there is none:
    no id, no artifact folder (a storage copied without it; nothing is created), a missing or an unreadable
    file. A recorded artifact that cannot be read is treated as missing, with one warning naming the file.
    ``artifacts`` is the artifact folder or an artifact store."""
    if not artifact_id or artifacts is None:
        return None

    where: Path | str = f"artifact {artifact_id}"
    if isinstance(artifacts, (str, Path)):
        if not Path(artifacts).is_dir():
            _warn_once(f"{artifacts}: the artifact folder is missing, so are the stored test predictions; {_FALLBACK}")
            return None
        where, artifacts = Path(artifacts, artifact_id), FileSystemArtifactStore(str(artifacts))
    with tempfile.TemporaryDirectory(prefix="ilge-predictions-") as tmp:
        path = Path(tmp, "predictions.npz")
        try:
            download_artifact(artifact_store=artifacts, file_path=str(path), artifact_id=artifact_id)
            with np.load(path, allow_pickle=False) as stored:
                return {key: _widened(stored[key]) for key in stored.files}
        except ArtifactNotFound:
            _warn_once(f"{where}: the stored test predictions are missing; {_FALLBACK}")
        except _UNREADABLE as exc:
            _warn_once(f"{where}: the stored test predictions cannot be read ({type(exc).__name__}); {_FALLBACK}")
    return None


@functools.cache
def _warn_once(message: str) -> None:
    """One warning per damaged file, however many tables read it in this process."""
    logger.warning(message)


def _widened(array: np.ndarray) -> np.ndarray:
    return array.astype(np.int64) if array.dtype.kind in "iub" else array.astype(np.float64)


@dataclass(frozen=True)
class StoredPredictions:
    """One model's stored test predictions: the test truth, its ``(seeds, N)`` predictions and the seeds."""

    truth: np.ndarray
    predictions: np.ndarray
    seeds: tuple[int, ...]

    def pairs_with(self, other: StoredPredictions) -> bool:
        """Whether both were scored on the same test examples (the same truth, in order) with the same seeds."""
        return (
            self.seeds == other.seeds
            and self.predictions.shape == other.predictions.shape
            and np.array_equal(self.truth, other.truth)
        )


def paired_interval(
    first: StoredPredictions | None,
    second: StoredPredictions | None,
    metric: str,
    settings: BootstrapSettings | None = None,
) -> Interval | None:
    """The paired bootstrap interval of ``metric(first) - metric(second)`` over the same test examples and
    seeds; ``None`` when either side is missing, they do not pair, the metric is not one it scores or there are
    fewer than :data:`MIN_TEST_ROWS` test examples."""
    if first is None or second is None or metric not in METRICS or not first.pairs_with(second):
        return None
    if first.truth.size < MIN_TEST_ROWS:
        return None
    return paired_bootstrap(first.truth, first.predictions, second.predictions, metric=metric, settings=settings)


def stored_final_predictions(artifacts: Any, final: FinalRecord | None) -> dict[str, StoredPredictions]:
    """A final evaluation's stored test predictions by model (``selected``, ``start``); empty when it stored
    none (evaluations made before they were stored, the paper protocol, tagging). ``artifacts``: the artifact
    folder or store."""
    arrays = None if final is None else read_test_predictions(artifacts, final.predictions)
    if final is None or arrays is None or "truth" not in arrays:
        return {}
    seeds = tuple(int(seed) for seed in final.seeds)
    return {
        key: StoredPredictions(arrays["truth"], value, seeds)
        for key, value in arrays.items()
        if key != "truth" and value.ndim == 2 and value.shape[0] == len(seeds)
    }


def interval_kind(interval: Interval | None) -> str | None:
    """Which interval ``interval`` is, as tables name it: ``paired bootstrap`` (over test examples and seeds)
    or ``t interval`` (over the seeds); ``None`` for none."""
    if interval is None:
        return None
    return "paired bootstrap" if interval.method.startswith("paired bootstrap") else "t interval"
