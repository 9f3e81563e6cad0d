"""The files behind the ensemble record: validation predictions as float16 ``.npy`` artifacts of a study or trial.

Not re-exported by :mod:`ilge_search.record`, which stays free of numpy and Optuna's artifact modules: the
stages and the trial import it by name.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.artifacts import download_artifact, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound

from .ensemble import trial_predictions

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

__all__ = ["upload_predictions", "download_predictions", "validation_predictions"]

_FILE = "val_predictions.npy"
logger = logging.getLogger(__name__)


def upload_predictions(study_or_trial: optuna.Study | optuna.Trial, values: np.ndarray, artifact_store: Any) -> str:
    """Store ``values`` (predictions) as a float16 ``.npy`` artifact of ``study_or_trial``; its artifact id."""
    with tempfile.TemporaryDirectory(prefix="ilge-predictions-") as tmp:
        path = Path(tmp, _FILE)
        np.save(path, np.asarray(values, dtype=np.float16))
        return upload_artifact(study_or_trial=study_or_trial, file_path=str(path), artifact_store=artifact_store)


def download_predictions(artifact_store: Any, artifact_id: str) -> np.ndarray | None:
    """Stored predictions, or ``None`` when the artifact is not in ``artifact_store`` (a storage copied
    without its artifact folder) or unreadable: such a trial is backfilled again."""
    with tempfile.TemporaryDirectory(prefix="ilge-predictions-") as tmp:
        path = Path(tmp, _FILE)
        try:
            download_artifact(artifact_store=artifact_store, file_path=str(path), artifact_id=artifact_id)
            return np.load(path).astype(np.float64)
        except (ArtifactNotFound, OSError, ValueError, EOFError) as exc:  # EOFError: an emptied file
            if not isinstance(exc, ArtifactNotFound):  # a missing one: the backfill's own line counts them
                logger.warning("validation predictions %s: %r; their trial is retrained", artifact_id, exc)
            return None


def validation_predictions(
    study: optuna.Study, trials: Sequence[FrozenTrial], artifact_store: Any
) -> dict[int, np.ndarray]:
    """Trial number -> validation predictions, for the ``trials`` whose stored predictions can be read."""
    read = {n: download_predictions(artifact_store, a) for n, (a, _) in trial_predictions(study, trials).items()}
    return {number: predictions for number, predictions in read.items() if predictions is not None}
