"""The numeric settings of a run checked against the data they apply to, before anything is created.

:func:`check_data_limits` is part of :func:`~ilge_search.study.plan.check_run`. It reads the task as loaded
and as the study will use it (after ``--shots`` and the caps) and refuses, in one line that says what to
pass instead:

- ``--shots`` whose few-shot set ``--max-train`` would cut again (the study would be named ``N-shot`` and
  hold fewer examples per label);
- ``--samples-per-label`` on a task whose paper readout trains nothing (similarity, tagging), or above
  every label's count of the training split (each of the ten draws would be the whole split);
- ``--cv K`` with more folds than the largest label has training examples (most folds would validate on
  a handful of rows), or, on a similarity task, fewer than three pairs per fold (no Spearman correlation).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from .options import StudyOptions
from .protocol import paper_samples_per_label

if TYPE_CHECKING:  # pragma: no cover
    from ..tasks.core import TaskData

__all__ = [
    "check_data_limits",
    "MIN_PAIRS_PER_FOLD",
    "MIN_SEEDS",
    "MIN_TEST_ROWS",
    "too_few_for_an_interval",
    "warn_too_few_for_intervals",
]

logger = logging.getLogger(__name__)

MIN_PAIRS_PER_FOLD = 3  # a Spearman correlation over fewer pairs is undefined or meaningless

# Below these sizes no interval is shown (docs/statistics.md, "Minimum sizes"): under 20 test examples one
# example moves a score by 5 points or more, and a bootstrap over so few has too few distinct resamples to hold
# its 95% level; a t interval needs two seeds to have a spread at all.
MIN_TEST_ROWS = 20
MIN_SEEDS = 2
_ROWS = {"classification": "texts", "similarity": "pairs", "tagging": "sentences"}

# the task kinds whose test predictions a paired bootstrap can score (tagging is scored over words, the
# paper protocol by a logistic readout: neither is stored)
PAIRED_KINDS = ("classification", "similarity")


def too_few_for_an_interval(test_rows: int | None, seeds: int, task_kind: str | None) -> str | None:
    """Why a table shows no interval for a difference over ``test_rows`` test examples and ``seeds`` paired
    seeds (``2 test pairs: too few for an interval``); ``None`` when both reach their minimum."""
    if test_rows is not None and test_rows < MIN_TEST_ROWS:
        return f"{test_rows} test {_ROWS.get(task_kind or '', 'rows')}: too few for an interval"
    if seeds < MIN_SEEDS:
        return f"{seeds} seed{'' if seeds == 1 else 's'}: too few for an interval"
    return None


def _label_counts(task: TaskData) -> list[int]:
    """Training examples per label present (classification)."""

    labels = np.asarray(task.split("train").labels)
    return [int(count) for count in np.bincount(labels) if count > 0] if labels.size else []


def _check_shots(options: StudyOptions, loaded: TaskData) -> None:
    shots, cap = options.data.shots, options.data.max_train
    if shots is None or cap is None or loaded.kind != "classification":
        return
    kept = sum(min(count, shots) for count in _label_counts(loaded))
    if cap < kept:
        raise ValueError(
            f"--shots {shots} keeps {kept} training examples ({shots} or all of each label), but --max-train "
            f"{cap} would cut them again, so the study would not be {shots}-shot; drop --max-train, or pass "
            f"--max-train {kept} or more, or fewer --shots"
        )


def _check_samples_per_label(options: StudyOptions, task_name: str, used: TaskData) -> None:

    given = options.final.samples_per_label
    if options.final.protocol != "paper":
        return
    if used.kind != "classification":
        if given is not None:
            raise ValueError(
                f"--samples-per-label sets the paper protocol's logistic readout of classification tasks; "
                f"{used.name!r} is a {used.kind} task, whose readout trains nothing: drop --samples-per-label"
            )
        return
    per_label = paper_samples_per_label(task_name, given)
    counts = _label_counts(used)
    largest = max(counts, default=0)
    if per_label > largest:
        named = (
            f"--samples-per-label {per_label}" if given is not None else f"the default {per_label} samples per label"
        )
        raise ValueError(
            f"{named} is more than any label has in the training split the study uses (the largest has "
            f"{largest}), so every one of the paper protocol's draws would be the whole split; pass "
            f"--samples-per-label {largest} or fewer, or a larger --max-train"
        )


def _check_cv(options: StudyOptions, used: TaskData) -> None:
    folds = options.search.cv
    if folds is None:
        return
    rows = len(used.split("train"))
    if used.kind == "similarity" and rows < MIN_PAIRS_PER_FOLD * folds:
        raise ValueError(
            f"--cv {folds} leaves fewer than {MIN_PAIRS_PER_FOLD} of the {rows} training pairs in a fold, too few "
            f"for a Spearman correlation; pass --cv {max(2, rows // MIN_PAIRS_PER_FOLD)} or fewer, or more training "
            "rows"
        )
    if used.kind != "classification":
        return
    counts = _label_counts(used)
    largest = max(counts, default=0)
    if folds > largest:
        raise ValueError(
            f"--cv {folds} makes more folds than any label has training examples (the largest of the "
            f"{len(counts)} labels has {largest} of {rows} rows), so most folds would validate on a handful of "
            f"rows; pass --cv {max(2, largest)} or fewer, or a larger --max-train (about {folds * len(counts)})"
        )


def check_data_limits(options: StudyOptions, task_name: str, loaded: TaskData, used: TaskData) -> None:
    """Refuse, in one line, settings the data cannot honour (see the module docstring): ``loaded`` is the task
    as read, ``used`` after ``--shots`` and the caps, ``task_name`` as the command line named it."""
    _check_shots(options, loaded)
    _check_samples_per_label(options, task_name, used)
    _check_cv(options, used)


def warn_too_few_for_intervals(options: StudyOptions, used: TaskData) -> None:
    """Say, once a run's checks passed and before any work, when the final evaluation's differences will get
    no interval: a test split under :data:`MIN_TEST_ROWS`, or one final seed where no paired bootstrap over
    test examples is stored (tagging, the paper protocol)."""
    seeds = options.final.seeds
    if not seeds or "test" not in used.splits:
        return
    bootstrap = used.kind in PAIRED_KINDS and options.final.protocol != "paper"
    note = too_few_for_an_interval(len(used.split("test")), seeds if not bootstrap else MIN_SEEDS, used.kind)
    if note is not None:
        fix = "pass a larger test split" if "test" in note else f"pass --final-seeds {MIN_SEEDS} or more"
        logger.warning("%s: the tables will show the final differences without one; %s", note, fix)
