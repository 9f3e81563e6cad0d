"""Test helpers shipped with the package, in the style of ``optuna.testing``: fakes, so that tests of
studies, reports, selection, export and defaults need no language model (ARCHITECTURE.md lists the
modules).
"""

from typing import TYPE_CHECKING, Any

from . import cached
from .cached import (  # noqa: F401  re-exported: __all__ takes them from cached.__all__
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

if TYPE_CHECKING:
    from .encoder_contract import LayerEncoderContract


def __getattr__(name: str) -> Any:
    # the contract is a pytest class: a library user without pytest can import the other helpers
    if name == "LayerEncoderContract":
        return LayerEncoderContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    *cached.__all__,
    "FakeTrial",
    "add_study",
    "final_record",
    "classification_data",
    "similarity_data",
    "add_matrix_problems",
    "store_matrix",
]
