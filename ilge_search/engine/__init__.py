"""The one training engine.

Every model in the project (``ILGEClassifier``, ``ILGETagger``, each study trial, each
layer baseline, each final evaluation) is trained by :func:`train_encoder`:

- the data: per-layer embeddings of texts ``(N, L, D)``, of sentence pairs ``(N, 2, L, D)``,
  or of words, ragged over sentences, for tagging (:mod:`~ilge_search.engine.tokens`);
- the loop (:mod:`~ilge_search.engine.loop`), the same for every kind: Adam (or AdamW) with
  the config's weight decay, ReduceLROnPlateau on the validation metric, early stopping,
  the best epoch's weights restored, ``epoch_callback(epoch, val_metric)`` after every epoch
  (the study runner raises ``optuna.TrialPruned`` from it and the exception propagates);
- seeded and deterministic on CPU: the same seed and data give the same metrics and
  weights, and the caller's global RNG state is left untouched.

:func:`train_many` trains several models of one architecture (seeds, ensemble members) in one pass,
each as :func:`train_encoder` would (:mod:`~ilge_search.engine.many`).

:func:`select_best_layer` trains one probe per layer and keeps the best on validation;
:func:`evaluate` and :func:`predict_logits` score and run a trained model.
"""

from __future__ import annotations

from .core import (
    EVAL_BATCH_SIZE,
    ILGEModel,
    TrainOptions,
    build_model,
    evaluate,
    predict_logits,
    select_best_layer,
    train_encoder,
)
from .loop import DEFAULT_RECIPE, METRICS, TAGGING, TASK_KINDS, TrainingRecipe, TrainResult
from .many import ModelJob, can_batch, train_many
from .metrics import macro_f1, pearson, spearman
from .standardizer import FeatureStandardizer
from .tokens import TaggerModel, build_tagger, predict_word_logits

__all__ = [
    "FeatureStandardizer",
    "ILGEModel",
    "TaggerModel",
    "TrainResult",
    "train_encoder",
    "TrainOptions",
    "train_many",
    "ModelJob",
    "can_batch",
    "TrainingRecipe",
    "DEFAULT_RECIPE",
    "build_model",
    "build_tagger",
    "evaluate",
    "predict_logits",
    "predict_word_logits",
    "select_best_layer",
    "spearman",
    "pearson",
    "macro_f1",
    "TASK_KINDS",
    "TAGGING",
    "METRICS",
    "EVAL_BATCH_SIZE",
]
