"""ilge-search: Inter-Layer Geometry Encoders and an Optuna search platform around them.

Configs are imported eagerly (they are light); everything that pulls in
torch, PyTorch Geometric, transformers or Optuna is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
from .encoders import config_from_dict
from .encoders import configs as _configs
from .encoders.configs import (  # noqa: F401  re-exported: __all__ takes them from configs.__all__
    BestLayerConfig,
    CayleyConfig,
    DeepSetConfig,
    EncoderConfig,
    FCConfig,
    LastLayerConfig,
    MeanLayersConfig,
    MLPLastConfig,
    ScalarMixConfig,
)

# public name -> module that defines it (imported lazily)
_LAZY = {
    "build_aggregator": "encoders.aggregator",
    "build_per_token_aggregator": "encoders.aggregator",
    "Aggregator": "encoders.aggregator",
    "PerTokenAggregator": "encoders.aggregator",
    "num_layers_for": "embeddings.model_utils",
    "hidden_size_for": "embeddings.model_utils",
    "suggest_config": "tuning",
    "recommended_config": "tuning",
    "ILGEClassifier": "use.classifier",
    "ILGETagger": "use.tagger",
    "predict_file": "use.predict",
    "PredictInput": "use.predict",
    "PredictOutput": "use.predict",
    "PredictOptions": "use.predict",
    "explain_study": "use.explain",
    "LayerAttribution": "use.explain",
    "extract_layer_embeddings": "embeddings.extraction",
    "EmbeddingCache": "embeddings.cache",
    "load_task_embeddings": "embeddings.cache",
    "ExtractionSettings": "embeddings.extraction",
    "load_word_embeddings": "embeddings.word_cache",
    "WordOptions": "embeddings.word_cache",
    "LayerEmbedder": "embeddings.extraction",
    "resolve_model": "embeddings.models",
    "load_task": "tasks.core",
    "TaskColumns": "tasks.columns",
    "list_tasks": "tasks.core",
    "train_encoder": "engine",
    "PaperProtocol": "study.protocol",
    "logistic_readout": "study.protocol",
    "cosine_spearman": "study.protocol",
    "paper_vectors": "study.protocol",
    "run_study": "study",
    "list_studies": "study",
    "StudyResult": "study",
    "StudyOptions": "study",
    "run_sweep": "study",
    "load_sweep": "study",
    "plan_run": "study",
    "RunPlan": "study",
    "select_trial": "study",
    "study_front": "study",
    "OBJECTIVES": "study.objectives",
    "pareto_front": "study.objectives",
    "measure_latency": "study.objectives",
    "serve_dashboard": "report.dashboard",
    "write_notes": "study.notes",
    "StudyRecord": "record",
    "study_record": "record",
    "build_report": "report",
    "recommend_defaults": "report.defaults_page",
    "leave_one_task_out": "defaults.loto",
    "stored_loto": "defaults.loto",
    "LotoResult": "defaults.loto",
    "predict_tags_file": "use.predict_tags",
    "EnsembleModel": "engine.ensemble",
    "EnsembleRecord": "record",
    "ensemble_study": "cli.ensemble",
    "EnsembleRequest": "cli.ensemble",
    "greedy_selection": "engine.ensemble",
    "portfolio": "defaults.transfer",
    "stored_portfolio": "defaults.transfer",
    "PortfolioRequest": "defaults.portfolio",
    "PortfolioResult": "defaults.portfolio",
    "update_shipped_portfolio": "defaults.shipped_portfolio",
    "load_shipped_portfolio": "record",
    "WarmStartRecord": "record",
    "warm_start_record": "record",
    "copy_portfolio": "defaults.transfer",
    "write_warmstart_page": "report.warmstart",
}

__all__ = [
    "__version__",
    # every config class but the tagging-only CayleyWordConfig (and not the FieldValues alias)
    *(name for name in _configs.__all__ if name not in ("CayleyWordConfig", "FieldValues")),
    "config_from_dict",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ilge_search' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
