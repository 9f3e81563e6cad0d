"""Where a study's data came from and how its texts were embedded: the study's :class:`SourceRecord`.

A study records, when it is created (and again when a run finds its data at a new place):

- ``data_dir`` (as given) and ``data_dir_resolved``: the folder of a registered task's data (the shared
  layout), so that ``export``, ``explain`` and ``loto`` find it without ``--data-dir`` and without trying the
  hub; ``None`` when the data came from ``$ILGE_SEARCH_DATA`` or the hub;
- ``task_path_given``: a custom task's file or folder as the command line named it (the resolved path is
  :class:`~ilge_search.record.core.DataRecord`'s ``task_path``);
- ``task_columns``: the columns a custom file was read with (``run --text-col`` ..., ``--tokens-col`` and
  ``--tags-col`` for a token task);
- ``token_pooling`` and ``max_length``: how the extraction pooled and truncated tokens, which an exported
  classifier must repeat on new texts.

Studies stored before this record read as the defaults every study used then (mean pooling, 512 tokens, no
data folder). On disk each field is a flat user attr under the name above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from .fields import Attrs, write_attrs

if TYPE_CHECKING:
    import optuna

__all__ = [
    "SourceRecord",
    "source_record",
    "save_source",
    "DEFAULT_TOKEN_POOLING",
    "DEFAULT_MAX_LENGTH",
    "COLUMN_OPTIONS",
]

DEFAULT_TOKEN_POOLING = "mean"  # how every study pools a text's tokens in each layer
DEFAULT_MAX_LENGTH = 512  # tokens per text every study's extraction keeps
# the column options of a custom task file (`run`/`embed` --text-col ..., `run --tokens-col`), as load_task names them
COLUMN_OPTIONS = ("text_col", "label_col", "text_cols", "score_col", "tokens_col", "tags_col")


@dataclass(frozen=True)
class SourceRecord:
    """Where a study's data is and how it was embedded (see the module docstring)."""

    VERSION: ClassVar[int] = 1
    ATTRS: ClassVar[tuple[str, ...]] = (
        "data_dir",
        "data_dir_resolved",
        "task_path_given",
        "task_columns",
        "token_pooling",
        "max_length",
    )

    data_dir: str | None = None
    data_dir_resolved: str | None = None
    task_path_given: str | None = None
    task_columns: Attrs = field(default_factory=dict)
    token_pooling: str = DEFAULT_TOKEN_POOLING
    max_length: int = DEFAULT_MAX_LENGTH

    def __post_init__(self) -> None:
        unknown = set(self.task_columns) - set(COLUMN_OPTIONS)
        if unknown:
            raise ValueError(f"unknown task column option(s) {sorted(unknown)}; expected some of {COLUMN_OPTIONS}")

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, object]) -> SourceRecord:
        values: Attrs = {name: attrs[name] for name in cls.ATTRS if attrs.get(name) is not None}
        columns = values.get("task_columns")
        if isinstance(columns, Mapping):
            values["task_columns"] = {k: v for k, v in columns.items() if k in COLUMN_OPTIONS and v is not None}
        else:
            values.pop("task_columns", None)
        return cls(**values)

    def to_attrs(self) -> Attrs:
        return {name: getattr(self, name) for name in self.ATTRS}


def source_record(study: optuna.Study) -> SourceRecord:
    """The :class:`SourceRecord` of an Optuna study, frozen study or summary (defaults when none is stored)."""
    return SourceRecord.from_attrs(getattr(study, "user_attrs", {}) or {})


def save_source(study: optuna.Study, record: SourceRecord) -> None:
    """Store ``record`` on ``study`` (each field a flat user attr)."""
    write_attrs(study, record.to_attrs())
