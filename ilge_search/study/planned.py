"""A planned study: one study a run makes or resumes, as :func:`~.check.check_run` checked it and every later
step (creating or loading it, the search, the stages) receives it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..record import Identity

__all__ = ["PlannedStudy"]


@dataclass(frozen=True)
class PlannedStudy:
    """One study a run makes or resumes: what it is (``identity``, with the data it was checked on:
    ``data_id`` and the model's revision), its ``name``, its ``encoder``, this run's trial budget (``count``:
    trials to add, ``None`` until a timeout or a total) and the hint a name conflict ends with."""

    encoder: str
    name: str
    identity: Identity
    data_id: Mapping[str, Any]
    model_revision: str | None
    count: int | None
    hint: str

    @property
    def attrs(self) -> dict[str, Any]:
        """The identity with its data as the checks take it (:func:`~.identity.check_identity`'s ``wanted``)."""
        return {**self.identity.to_attrs(), **self.data_id, "model_revision": self.model_revision}
