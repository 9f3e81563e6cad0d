"""Test helpers shipped with the package, in the style of ``optuna.testing``: fakes, so that tests of
studies, reports, selection, export and defaults need no language model.

- :class:`LayerEncoderContract`: the contract every layer encoder family passes; subclass it in a test
  module and implement ``make_config``.
- :mod:`~ilge_search.testing.synthetic`: layer embeddings whose label is carried by one chosen layer
  (:class:`LayerSignal`), for classification and for sentence pairs.
- :mod:`~ilge_search.testing.tasks`: small made-up tasks written as JSONL (:func:`write_task`).
- :mod:`~ilge_search.testing.tiny_model`: a random BERT of a few hundred kilobytes with a word-level
  tokenizer (:func:`write_tiny_model`), a real model folder that loads in milliseconds.
- :mod:`~ilge_search.testing.cached`: synthetic embeddings written into the embedding cache under the keys
  the runner computes (:func:`cache_study_embeddings`), so ``run_study``, ``export``, ``explain``,
  ``loto`` and the report run their real code with no model loaded (:func:`refuse_model_loads` proves it).
- :mod:`~ilge_search.testing.store`: studies written straight into an Optuna storage through the study
  record's writers (:func:`add_study`), for code that only reads studies.
- :mod:`~ilge_search.testing.portfolio`: a cross-task matrix stored with scores the test chooses
  (:func:`add_matrix_problems`, :func:`store_matrix`), for code that reads what ``ilge-search portfolio`` stored.
"""

from .cached import (
    EntryFormat,
    SyntheticSetup,
    cache_study_embeddings,
    cache_text_embeddings,
    refuse_model_loads,
    split_features,
    write_split_embeddings,
)
from .encoder_contract import LayerEncoderContract
from .portfolio import add_matrix_problems, store_matrix
from .store import FakeTrial, add_study, classification_data, final_record, similarity_data
from .synthetic import LayerSignal, classification_features, similarity_features
from .tasks import VOCABULARY, SyntheticTask, write_task
from .tiny_model import TinyModelSpec, write_tiny_model

__all__ = [
    "LayerEncoderContract",
    "LayerSignal",
    "classification_features",
    "similarity_features",
    "SyntheticTask",
    "VOCABULARY",
    "write_task",
    "TinyModelSpec",
    "write_tiny_model",
    "EntryFormat",
    "SyntheticSetup",
    "split_features",
    "write_split_embeddings",
    "cache_study_embeddings",
    "cache_text_embeddings",
    "refuse_model_loads",
    "FakeTrial",
    "add_study",
    "final_record",
    "classification_data",
    "similarity_data",
    "add_matrix_problems",
    "store_matrix",
]
