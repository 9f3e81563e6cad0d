"""The cross-task matrix's stored record: one Optuna study per (family, size bucket), one trial per cell.

A *cell* is one candidate configuration trained with one seed on one problem's data; its :class:`CellKey` names
everything the numbers depend on and its digest is the trial's ``portfolio_cell`` user attr. A cell's trial is created
already RUNNING (:func:`claim_cell`); the lowest-numbered RUNNING or COMPLETE claim owns the cell and a losing claim is
abandoned, so processes on one storage never train a cell twice (the protocol: ``ARCHITECTURE.md``). The study has no
``model`` attr, so the report leaves it out; each complete trial holds its :class:`CellScores` and its key. The shipping
check's cells (the matrix's left-out checks retrained in the setting that ships) are kept the same way in a study of
their own, named with their epochs (:func:`shipping_check_study_name`), with what they were chosen from
(:func:`save_shipping_check`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import optuna
from optuna.trial import TrialState

from ..encoders import config_from_dict
from ..files import read_text_utf8, temp_name
from .fields import Attrs

if TYPE_CHECKING:
    import optuna

__all__ = [
    "PORTFOLIO_PREFIX",
    "PORTFOLIO_VERSION",
    "CellKey",
    "CellScores",
    "StoredCell",
    "portfolio_study_name",
    "shipping_check_study_name",
    "save_shipping_check",
    "stored_shipping_check",
    "claim_cell",
    "finish_cell",
    "abandon_cell",
    "stored_cells",
    "cell_owners",
    "save_portfolio_choice",
    "stored_portfolio_choice",
    "check_portfolio_members",
    "save_portfolio_request",
    "stored_portfolio_request",
    "SHIPPED_PORTFOLIO_PATH",
    "shipped_portfolio_path",
    "SHIPPED_FORMAT_VERSION",
    "check_shipped_portfolio",
    "load_shipped_portfolio",
    "write_shipped_portfolio",
    "enqueue_warm_trials",
]

PORTFOLIO_PREFIX = "ilge-portfolio"
PORTFOLIO_VERSION = 1
_CELL_ATTR = "portfolio_cell"
_KEY_ATTR = "portfolio_key"
_SCORES_ATTR = "portfolio_scores"
_DUPLICATE_ATTR = "portfolio_duplicate"
_CHOICE_ATTR = "portfolio_choice"
_SHIPPING_CHECK_ATTR = "shipping_check"  # the shipping check's study: what its cells were chosen from
_REQUEST_ATTR = "portfolio_request"  # the latest run's request, exclusions included: what the report shows
_WARM_ATTR = "warm_start_member"  # trial user attr: the portfolio member (0-based) a warm-started trial is
SHIPPED_PORTFOLIO_PATH = Path(__file__).resolve().parents[1] / "data" / "portfolio.json"


def portfolio_study_name(family: str, bucket: str) -> str:
    """The study holding the cells of one family and size bucket (e.g. ``ilge-portfolio:cayley:small``)."""
    return f"{PORTFOLIO_PREFIX}:{family}:{bucket}"


def shipping_check_study_name(family: str, bucket: str, epochs: int) -> str:
    """The study holding the shipping check's cells of one matrix, trained with ``epochs`` (e.g.
    ``ilge-portfolio:cayley:small:shipping-check:ep50``): cells trained with other epochs never share it."""
    return f"{portfolio_study_name(family, bucket)}:shipping-check:ep{epochs}"


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class CellKey:
    """Everything one cell's numbers depend on.

    ``config`` is the configuration exactly as trained (epochs capped), ``problem`` the study whose data it
    trains on, ``data`` that study's data setting and fingerprints, ``seed`` the training seed.
    """

    VERSION: ClassVar[int] = PORTFOLIO_VERSION

    config: Attrs
    problem: str
    data: Attrs
    seed: int

    @property
    def digest(self) -> str:
        return _digest({"version": self.VERSION, **asdict(self)})


@dataclass(frozen=True)
class CellScores:
    """One cell's result: best validation score (what choices use) and test score (checks only)."""

    validation: float
    test: float
    epochs_run: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class StoredCell:
    """A complete cell read back: its digest, key (as stored) and scores."""

    digest: str
    key: Attrs
    scores: CellScores


def _create_running(rdb: Any, study_id: int, user_attrs: Mapping[str, object]) -> int:

    template = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs=dict(user_attrs))
    return int(rdb.create_new_trial(study_id, template_trial=template))


def claim_cell(storage: Any, study: optuna.Study, key: CellKey, stamp: Callable[[int], tuple[str, Any]]) -> int | None:
    """Claim ``key``'s cell for this process: the claim's trial id, or ``None`` when another process's RUNNING or
    COMPLETE claim came first (this one is then abandoned). ``stamp(number)`` is the worker stamp (attr name and value)
    that lets :func:`ilge_search.storage.fail_stale_trials` free the claim of a process that died."""
    rdb = storage.rdb
    study_id = rdb.get_study_id_from_name(study.study_name)
    digest = key.digest
    trial_id = _create_running(rdb, study_id, {_CELL_ATTR: digest, _KEY_ATTR: asdict(key)})
    number = rdb.get_trial_number_from_id(trial_id)
    rdb.set_trial_user_attr(trial_id, *stamp(number))
    owner = min(cell_owners(study).get(digest, [number]))
    if owner != number:
        abandon_cell(storage, trial_id, duplicate=True)
        return None
    return trial_id


def finish_cell(storage: Any, trial_id: int, scores: CellScores) -> None:
    """Store a claimed cell's scores and complete its trial (value: the validation score)."""

    storage.rdb.set_trial_user_attr(trial_id, _SCORES_ATTR, asdict(scores))
    storage.rdb.set_trial_state_values(trial_id, optuna.trial.TrialState.COMPLETE, [float(scores.validation)])


def abandon_cell(storage: Any, trial_id: int, *, duplicate: bool = False) -> None:
    """Mark a claim FAIL (training failed, was interrupted, or another claim owns the cell), so that the
    cell is free again."""

    if duplicate:
        storage.rdb.set_trial_user_attr(trial_id, _DUPLICATE_ATTR, True)
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        storage.rdb.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)


def cell_owners(study: optuna.Study) -> dict[str, list[int]]:
    """Per cell digest, the numbers of its RUNNING and COMPLETE trials (the lowest owns the cell)."""

    owners: dict[str, list[int]] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE)):
        digest = trial.user_attrs.get(_CELL_ATTR)
        if isinstance(digest, str):
            owners.setdefault(digest, []).append(trial.number)
    return owners


def stored_cells(study: optuna.Study) -> tuple[dict[str, StoredCell], set[str]]:
    """The complete cells of a portfolio study (digest -> cell; the first complete one per digest) and the
    digests other processes are training now (RUNNING)."""

    cells: dict[str, StoredCell] = {}
    running: set[str] = set()
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        digest = trial.user_attrs.get(_CELL_ATTR)
        if not isinstance(digest, str):
            continue
        if trial.state == TrialState.RUNNING:
            running.add(digest)
        elif trial.state == TrialState.COMPLETE and digest not in cells:
            scores = trial.user_attrs.get(_SCORES_ATTR) or {}
            if "validation" in scores and "test" in scores:
                cells[digest] = StoredCell(digest, dict(trial.user_attrs.get(_KEY_ATTR) or {}), CellScores(**scores))
    return cells, running - set(cells)


def save_portfolio_choice(study: optuna.Study, choice: Mapping[str, object]) -> None:
    """Store the latest choice (default and portfolio members as config dicts, and what they were chosen
    from) on the portfolio study, where ``run --warm-start`` reads it."""
    _save_versioned(study, _CHOICE_ATTR, choice)


def _save_versioned(study: optuna.Study, attr: str, value: Mapping[str, object]) -> None:
    study.set_user_attr(attr, {"version": PORTFOLIO_VERSION, **dict(value)})


def _stored_versioned(study: optuna.Study, attr: str) -> Attrs | None:
    value = study.user_attrs.get(attr)
    if not isinstance(value, Mapping):
        return None
    return {key: item for key, item in value.items() if key != "version"}


def check_portfolio_members(members: object, where: str) -> None:
    """Refuse ``members`` unless it is a list of configurations the config classes accept: one line naming
    ``where`` and the first bad member (its 1-based position and family)."""

    if not isinstance(members, list):
        raise ValueError(f"{where}: the members must be a list of configurations, got {type(members).__name__}")
    for position, member in enumerate(members, start=1):
        family = member.get("family") if isinstance(member, Mapping) else None
        label = f"member {position}" + (f" ({family})" if family else "")
        if not isinstance(member, Mapping):
            raise ValueError(f"{where}: {label} is not a configuration object, got {member!r}")
        try:
            config_from_dict(dict(member))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {label}: {exc}") from None


def _check_choice(value: object, where: str) -> Attrs:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} is not a portfolio choice (an object expected, got {type(value).__name__})")
    for key in ("portfolio", "warm_start"):
        if value.get(key) is not None:
            check_portfolio_members(value[key], f"{where}, {key}")
    by_task = value.get("by_task")
    if by_task is not None and not isinstance(by_task, Mapping):
        raise ValueError(f"{where}: by_task must map tasks to warm-start orders")
    for task, order in (by_task or {}).items():
        if not isinstance(order, Mapping):
            raise ValueError(f"{where}: by_task.{task} must be an object with its warm-start order")
        check_portfolio_members(order.get("warm_start") or [], f"{where}, by_task.{task}")
    return dict(value)


def stored_portfolio_choice(study: optuna.Study, where: str | None = None) -> Attrs | None:
    """The choice :func:`save_portfolio_choice` stored, every member checked, or ``None`` when there is none.

    Raises:
        ValueError: the stored choice is damaged (naming ``where``, default the study, and the member).
    """
    value = study.user_attrs.get(_CHOICE_ATTR)
    if value is None:
        return None
    where = where or f"the portfolio choice stored on study {study.study_name}"
    try:
        return _check_choice(value, where)
    except ValueError as exc:
        raise ValueError(
            f"{exc}; rerun `ilge-search portfolio` with the options it was run with to store it again "
            "(it trains nothing when the cells are stored)"
        ) from None


def save_portfolio_request(study: optuna.Study, request: Mapping[str, object]) -> None:
    """Store what the latest ``ilge-search portfolio`` run asked for (its exclusions included), so that the
    report can rebuild that matrix from the stored cells."""
    _save_versioned(study, _REQUEST_ATTR, request)


def stored_portfolio_request(study: optuna.Study) -> Attrs | None:
    """The request :func:`save_portfolio_request` stored (without its ``version``), or ``None``."""
    return _stored_versioned(study, _REQUEST_ATTR)


def save_shipping_check(study: optuna.Study, check: Mapping[str, object]) -> None:
    """Store on the shipping check's study what it was made from: the matrix study and its epoch caps, the epochs
    and seeds its cells were trained with, and per fold the default chosen without the held-out problems."""
    _save_versioned(study, _SHIPPING_CHECK_ATTR, check)


def stored_shipping_check(study: optuna.Study) -> Attrs | None:
    """What :func:`save_shipping_check` stored (without its ``version``), or ``None``."""
    return _stored_versioned(study, _SHIPPING_CHECK_ATTR)


# ----------------------------------------------------------------------------- the shipped portfolio file
#
# ilge_search/data/portfolio.json, what `run --warm-start` falls back on when the storage has no portfolio:
#
#   {"format_version": 1,
#    "families": {"cayley": {"small": {"members": [<config dict>, ...],
#                                      "provenance": {"source": ..., "family": ..., "bucket": ..., "problems": [...],
#                                                     "chosen_on": "validation", "generated": ..., ...}}}}}
#
# `members` are in warm-start order, the package's starting configuration (every new study's first trial) left out;
# `provenance` says what they were chosen from. Written by `ilge-search portfolio --update-shipped`.

SHIPPED_FORMAT_VERSION = 1
SHIPPED_PROVENANCE_KEYS = ("source", "family", "bucket", "problems", "chosen_on", "generated")


def shipped_portfolio_path(path: str | Path | None = None) -> Path:
    """``path``, or the package's shipped portfolio file."""
    return Path(path) if path is not None else SHIPPED_PORTFOLIO_PATH  # looked up now: tests point it elsewhere


def _check_shipped_entry(where: str, family: str, bucket: str, entry: object) -> None:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: families.{family}.{bucket} must be an object with members and provenance")
    members, provenance = entry.get("members"), entry.get("provenance")
    if not isinstance(members, list) or not members or not all(isinstance(m, Mapping) for m in members):
        raise ValueError(f"{where}: families.{family}.{bucket}.members must be a non-empty list of configurations")
    wrong = [m.get("family") for m in members if m.get("family") != family]
    if wrong:
        raise ValueError(f"{where}: families.{family}.{bucket}.members holds a {wrong[0]!r} configuration")
    check_portfolio_members(members, f"{where}: families.{family}.{bucket}")
    if not isinstance(provenance, Mapping):
        raise ValueError(f"{where}: families.{family}.{bucket} has no provenance (what it was chosen from)")
    missing = [key for key in SHIPPED_PROVENANCE_KEYS if key not in provenance]
    if missing:
        raise ValueError(f"{where}: families.{family}.{bucket}.provenance lacks {', '.join(missing)}")
    if provenance["chosen_on"] != "validation":
        raise ValueError(f"{where}: families.{family}.{bucket} was not chosen on validation scores; refusing it")
    tasks = provenance.get("member_tasks")  # optional: per member, the tasks it came from
    if tasks is not None and (
        not isinstance(tasks, list)
        or len(tasks) != len(members)
        or not all(isinstance(t, list) and all(isinstance(n, str) for n in t) for t in tasks)
    ):
        raise ValueError(
            f"{where}: families.{family}.{bucket}.provenance.member_tasks must list, per member, the tasks it came from"
        )


def check_shipped_portfolio(document: object, where: str) -> Attrs:
    """``document`` if it is a shipped-portfolio file of this version (one-line errors naming ``where``)."""
    if not isinstance(document, Mapping) or not isinstance(document.get("families"), Mapping):
        raise ValueError(f"{where}: not a portfolio file (an object with format_version and families expected)")
    version = document.get("format_version")
    if not isinstance(version, int) or version > SHIPPED_FORMAT_VERSION or version < 1:
        raise ValueError(
            f"{where}: format_version {version!r}; this ilge-search reads version {SHIPPED_FORMAT_VERSION} "
            "(a newer file needs a newer ilge-search)"
        )
    for family, buckets in document["families"].items():
        if not isinstance(buckets, Mapping):
            raise ValueError(f"{where}: families.{family} must map size buckets (small, large) to portfolios")
        for bucket, entry in buckets.items():
            _check_shipped_entry(where, str(family), str(bucket), entry)
    return dict(document)


def load_shipped_portfolio(path: str | Path | None = None) -> Attrs:
    """The shipped portfolio file (``path``: default the package's ``data/portfolio.json``), checked; an empty
    one when it does not exist.

    Raises:
        ValueError: the file is not JSON, or not a portfolio file this version reads (naming the file).
    """

    path = shipped_portfolio_path(path)
    if not path.is_file():
        return {"format_version": SHIPPED_FORMAT_VERSION, "families": {}}
    try:
        document = json.loads(read_text_utf8(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); restore it from the package") from None
    return check_shipped_portfolio(document, str(path))


def write_shipped_portfolio(
    family: str,
    bucket: str,
    members: Sequence[Mapping[str, object]],
    provenance: Mapping[str, object],
    path: str | Path | None = None,
) -> Path:
    """Put ``family``/``bucket``'s entry into the shipped portfolio file (the other entries kept), written through
    a temporary file and read back; the path written."""

    path = shipped_portfolio_path(path)
    document = load_shipped_portfolio(path)
    families = {name: dict(buckets) for name, buckets in document["families"].items()}
    families.setdefault(family, {})[bucket] = {"members": [dict(m) for m in members], "provenance": dict(provenance)}
    document = check_shipped_portfolio({"format_version": SHIPPED_FORMAT_VERSION, "families": families}, str(path))
    temporary = temp_name(path)
    temporary.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    load_shipped_portfolio(path)  # what was written must read back
    return path


def enqueue_warm_trials(study: optuna.Study, params: Sequence[Mapping[str, object]]) -> None:
    """Enqueue portfolio members (Optuna ``params`` each) after the starting configuration, marked with their
    place in the portfolio."""
    for index, values in enumerate(params):
        study.enqueue_trial(dict(values), user_attrs={_WARM_ATTR: index})
