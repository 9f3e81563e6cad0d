"""What a study stage is: the :class:`Stage` base and the :class:`StageContext` every stage reads.

A stage is one step of the pipeline after the search (the final evaluation, the ensemble, whatever comes
next). The runner asks each registered stage, in order, whether it applies to the study, whether its stored
result is current, and otherwise runs it; it knows no stage by name.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from ...record import StudyRecord, study_record
from ...storage import count_trials

if TYPE_CHECKING:
    import optuna

    from ...engine.core import Dataset
    from ...storage import Storage
    from ..budget import TrialCosts
    from ..data import DataSpec, StudyData
    from ..final import FinalModels
    from ..options import StudyOptions
    from ..planned import PlannedStudy

__all__ = ["Stage", "StageContext", "StagePart", "StoredStudy", "StudyFacts", "StudyView"]

StoredStudy = Any
"""A study as the listing and the notes read it: an ``optuna.Study`` or a ``FrozenStudy`` summary (both carry
the user attrs the record reads)."""


@dataclass(frozen=True)
class StagePart:
    """A stage's section of the results report, as plain text the report renders in every format: a title, a
    paragraph, a table (``header`` and ``rows`` of cell texts) and bullet sentences, each optional."""

    title: str
    paragraph: str = ""
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    bullets: tuple[str, ...] = ()


@dataclass
class StageContext:
    """One study as its stages see it, after the search: the study, where it is stored, what was planned for
    it, its data and the run's options.

    ``trained`` holds the models earlier stages of this run trained (trial -> seed -> (model, seconds)), so a
    later stage reuses them instead of training them again; it is the one field stages write.
    """

    study: optuna.Study
    storage: Storage
    planned: PlannedStudy
    data: StudyData
    spec: DataSpec
    options: StudyOptions
    zero_shot: Mapping[str, Dataset]
    trained: FinalModels = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The study's name, as log lines start."""
        return self.planned.name

    @property
    def record(self) -> StudyRecord:
        return study_record(self.study)

    @property
    def task_kind(self) -> str:
        return self.data.task_kind

    @property
    def complete(self) -> int:
        return count_trials(self.study, ("COMPLETE",))


@dataclass(frozen=True)
class StudyFacts:
    """A study as the time budget and the dry run see it before its search ends: its record (a new study's as
    created), its complete trials (measured or planned) and, where the dry run adds no trial, the stored study
    (``unchanged``: a stage whose result is current costs nothing)."""

    name: str
    record: StudyRecord
    options: StudyOptions
    task_kind: str
    complete: int = 0
    unchanged: optuna.Study | None = field(default=None, compare=False)


StudyView: TypeAlias = "StageContext | StudyFacts"
"""What :meth:`Stage.applies` reads of a study (``name``, ``record``, ``options``, ``task_kind``, ``complete``):
a :class:`StageContext` after the search, or the :class:`StudyFacts` the budget and the dry run have before."""


class Stage(abc.ABC):
    """One step after the search. Subclasses set :attr:`name` and implement :meth:`applies`,
    :meth:`is_current` and :meth:`run`; the other hooks are optional.

    The runner calls, per study: :meth:`applies` (``False``: :meth:`skipped`, and the stage is done), then
    :meth:`is_current` (``True``: it logs :meth:`current_note`), else :meth:`run`. The time budget and the dry
    run add up :meth:`reserve_seconds` of the stages that apply.
    """

    name: str = ""

    @abc.abstractmethod
    def applies(self, context: StudyView) -> bool:
        """Whether this stage has anything to do on the study under this run's options (:data:`StudyView`)."""

    def reserve_seconds(self, context: StudyFacts, trials: TrialCosts) -> float:
        """Seconds to keep for this stage after the search (``--time-limit``, ``--dry-run``): retraining
        ``trials`` through :meth:`~ilge_search.study.budget.TrialCosts.retrain`, or any cost of its own."""
        return 0.0

    def skipped(self, context: StageContext) -> None:  # noqa: B027 -- optional: most stages skip silently
        """Called when :meth:`applies` said no: where a user asked for the stage, say why it does not run."""

    @abc.abstractmethod
    def is_current(self, context: StageContext) -> bool:
        """Whether the stage's stored result already matches the study and the run's options."""

    def current_note(self, context: StageContext) -> str:
        """The log line (after the study's name) when the stored result is current."""
        return f"{self.name} is up to date"

    @abc.abstractmethod
    def run(self, context: StageContext) -> None:
        """Compute the stage's result and store it on the study (through the record)."""

    # ---- what the stage shows of its stored result (optional)

    column_names: tuple[str, ...] = ()
    """The columns the stage adds to the ``studies`` listing (after the built-in ones), in order."""

    def columns(self, study: StoredStudy) -> dict[str, object]:
        """The stage's ``studies`` columns of one study (keys: :attr:`column_names`; ``None`` where it has
        no result)."""
        return dict.fromkeys(self.column_names)

    def note_lines(self, study: StoredStudy, metric: str) -> list[str]:
        """Markdown lines of the stage's result for the study's dashboard note (after the final evaluation's
        part; none: nothing stored)."""
        return []

    def report_part(self, studies: Sequence[StoredStudy]) -> StagePart | None:
        """The stage's section of the results report over the storage's studies (``None``: no section; the
        built-in stages' results have their own sections in :mod:`ilge_search.report`, above this layer)."""
        return None
