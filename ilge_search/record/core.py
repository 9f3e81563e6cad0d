"""The study record: everything ilge-search stores on an Optuna study or trial, typed and versioned.

Optuna keeps free-form *user attrs* on every study and trial. The ``record`` package is the one reader and
writer of them; every other module works with the typed records below:

- :class:`StudyRecord`, one per study, read with :func:`study_record` from an ``optuna.Study``, a ``FrozenStudy`` or a
  study summary. It holds the study's :class:`Identity` (what its trials search and how its final scores are measured),
  its :class:`DataRecord` (the embeddings it ran on), its :class:`FinalRecord` (the final evaluation under the current
  selection rule; one per rule in ``by_rule``), and the :class:`ExplainRecord` and :class:`LotoRecord` entries other
  commands stored on it;
- :class:`~ilge_search.record.trial.TrialRecord`, one per trial, read with
  :func:`~ilge_search.record.trial.trial_record` (:mod:`ilge_search.record.trial`).

Writers (:func:`save_identity`, :func:`save_final` ...) take the same records. On disk every field stays a flat user
attr under its historical name (``final_test_mean``, ``val_metric`` ...), so optuna-dashboard shows them and older tools
keep reading them; a study written by this version also stores :data:`VERSION_ATTR` = :data:`RECORD_VERSION`.

Format versions: version 1 is every study stored before the record existed (no :data:`VERSION_ATTR`).
:func:`upgrade_attrs` is the one converter: it reads a version-1 study's absent keys as what they meant then
(objectives: the score alone; protocol: ``matched``; a final evaluation without a rule: ``best``), so every reader sees
one shape.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .fields import Attrs, Stored, attrs_of, fields_from, read_stored, write_attrs

if TYPE_CHECKING:
    import optuna


__all__ = [
    "RECORD_VERSION",
    "VERSION_ATTR",
    "READY_ATTR",
    "DEFAULT_OBJECTIVES",
    "DEFAULT_PROTOCOL",
    "PROTOCOLS",
    "WORD_POOLINGS",
    "LEGACY_SELECT",
    "IDENTITY_KEYS",
    "PROTOCOL_KEYS",
    "DATA_SPLITS",
    "Identity",
    "DataRecord",
    "ZeroShotScores",
    "FrontMember",
    "FinalRecord",
    "ExplainRecord",
    "LotoScores",
    "LotoRecord",
    "StudyRecord",
    "upgrade_attrs",
    "study_record",
    "is_ilge_study",
    "save_identity",
    "save_data_fingerprints",
    "save_task_path",
    "mark_ready",
    "is_ready",
    "save_final",
    "save_explain",
    "save_loto",
]

RECORD_VERSION = 2  # the format this module writes; version 1: studies stored without VERSION_ATTR
VERSION_ATTR = "ilge_record_version"
READY_ATTR = "ilge_search_ready"  # set last by the process that creates a study
DEFAULT_OBJECTIVES: tuple[str, ...] = ("score",)
DEFAULT_PROTOCOL = "matched"
# how a study's final scores are measured (ilge_search.study.protocol); here, with the rest of the identity's
# vocabulary, so the options and the CLI name them without importing numpy
PROTOCOLS: tuple[str, ...] = (DEFAULT_PROTOCOL, "paper")
# how a tagging study pools a word's sub-word pieces (ilge_search.embeddings.words), named here for the same reason
WORD_POOLINGS: tuple[str, ...] = ("first", "mean")
LEGACY_SELECT = "best"  # the rule of final evaluations stored before selection rules existed
DATA_SPLITS = ("train", "validation", "test")

# the identity keys that decide how the final scores are measured, not what the trials do
PROTOCOL_KEYS = ("protocol", "samples_per_label")

# ----------------------------------------------------------------------------- identity and data


@dataclass(frozen=True)
class Identity:
    """What a study's trials search and how its final scores are measured.

    Two runs may share a study only when their identities are equal. ``task`` is a registered task's name or a custom
    task's file or folder name; ``objectives`` is ``("score",)`` or the score with ``params`` and/or ``latency``;
    ``protocol`` is ``matched`` or ``paper`` (with its ``samples_per_label``, ``None`` under ``matched``).
    """

    VERSION: ClassVar[int] = 1

    model: str
    task: str
    encoder: str
    shots: int | None = None
    max_train: int | None = None
    max_eval: int | None = None
    max_epochs: int | None = None
    data_seed: int | None = 0
    cv: int | None = None
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    protocol: str = DEFAULT_PROTOCOL
    samples_per_label: int | None = None
    word_pooling: str | None = None  # tagging studies: how words are made from pieces (None: not a tagging study)
    warm_start: int | None = None  # portfolio members enqueued after the starting configuration (None: 0)
    methods: tuple[str, ...] | None = None  # an auto study's methods, the first parameter's choices (else None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives", tuple(self.objectives))
        if self.methods is not None:
            object.__setattr__(self, "methods", tuple(self.methods))

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, object]) -> Identity:
        """The identity stored in (upgraded) user ``attrs``."""
        values: Attrs = {key: attrs.get(key) for key in IDENTITY_KEYS}
        values["objectives"] = tuple(values["objectives"] or DEFAULT_OBJECTIVES)
        values["protocol"] = str(values["protocol"] or DEFAULT_PROTOCOL)
        return cls(**values)

    def to_attrs(self) -> Attrs:
        """The user attrs this identity is stored as (``objectives`` as a list, as JSON keeps it)."""
        out = {key: getattr(self, key) for key in IDENTITY_KEYS}
        out["objectives"] = list(self.objectives)
        out["methods"] = None if self.methods is None else list(self.methods)
        return out

    def differences(self, other: Identity, *, ignore: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
        """``{key: (self's value, other's value)}`` for every identity key that differs."""
        mine, theirs = self.to_attrs(), other.to_attrs()
        return {
            key: (mine[key], theirs[key]) for key in IDENTITY_KEYS if key not in ignore and mine[key] != theirs[key]
        }

    def search_key(self, without: Sequence[str] = ()) -> tuple[str, ...]:
        """What the trials search, as a hashable key: the identity without the protocol's keys (trials are
        the same under either protocol) and without ``without``."""
        attrs = self.to_attrs()
        return tuple(
            json.dumps(attrs[key], sort_keys=True, default=str)
            for key in IDENTITY_KEYS
            if key not in PROTOCOL_KEYS and key not in without
        )

    @property
    def multi_objective(self) -> bool:
        """Whether the study has more than one objective."""
        return len(self.objectives) > 1

    def data_setting(self) -> Attrs:
        """The data and budget options of the identity: what decides the arrays and epochs a config trains."""
        return {key: getattr(self, key) for key in ("shots", "max_train", "max_eval", "data_seed", "max_epochs")}


# what a study searches and how its final scores are measured (the fields of Identity): must match when a study
# is resumed
IDENTITY_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Identity))


@dataclass(frozen=True)
class DataRecord:
    """The embeddings a study ran on, recorded when it was created.

    ``data_fingerprints`` (split -> sha256 of its content) and ``label_names`` decide whether new data may join the
    study; ``cache_keys`` are the embedding-cache entries of its splits; ``task_path`` is a custom task's file or folder
    (absolute), ``artifact_dir`` the artifact store its weights went to.
    """

    VERSION: ClassVar[int] = 1

    task_kind: str | None = None
    metric: str | None = None
    direction: str = "maximize"
    num_layers: int | None = None
    hidden_size: int | None = None
    num_classes: int | None = None
    label_names: list[str] = field(default_factory=list)
    split_sizes: dict[str, int] = field(default_factory=dict)
    cache_keys: dict[str, str] = field(default_factory=dict)
    data_fingerprints: dict[str, str] | None = None
    model_revision: str = ""
    task_path: str | None = None
    artifact_dir: str | None = None
    ilge_search_version: str | None = None

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, object]) -> DataRecord:
        record = fields_from(cls, {k: v for k, v in attrs.items() if v is not None or k == "data_fingerprints"})
        return dataclasses.replace(
            record,
            label_names=list(record.label_names or []),
            split_sizes=dict(record.split_sizes or {}),
            cache_keys=dict(record.cache_keys or {}),
        )

    def to_attrs(self) -> Attrs:
        return dataclasses.asdict(self)

    @property
    def maximize(self) -> bool:
        """Whether a higher score is better (every metric but a loss)."""
        return self.direction != "minimize"

    @property
    def n_validation(self) -> int | None:
        """The validation split's size."""
        return self.split_sizes.get("validation")


_DATA_FIELDS = frozenset(f.name for f in dataclasses.fields(DataRecord))


# ----------------------------------------------------------------------------- final evaluation


@dataclass(frozen=True)
class ZeroShotScores:
    """One zero-shot similarity task's test scores over the final seeds."""

    mean: float
    std: float
    scores: list[float]

    @classmethod
    def from_attrs(cls, values: Mapping[str, object]) -> ZeroShotScores:
        """The scores stored for one task; a spread or scores not stored read as NaN and none."""
        return fields_from(cls, {"std": math.nan, "scores": [], **values})


@dataclass(frozen=True)
class FrontMember:
    """One trial of a multi-objective study's final front, retrained with the final seeds (``values``: its
    objective values by name; ``artifacts``: the best seed's weights by validation, ``artifact_seed``)."""

    trial: int
    val_score: float
    test_mean: float
    test_std: float
    test_scores: list[float]
    config: Attrs = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    params: int | None = None
    latency_ms: float | None = None
    val_scores: list[float] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    artifact_seed: int | None = None

    @classmethod
    def from_attrs(cls, values: Mapping[str, object]) -> FrontMember:
        """A stored member; what it lacks (written by hand or by an earlier version) reads as unknown or empty."""
        absent: Attrs = {"config": {}, "values": {}, "params": None, "latency_ms": None, "artifact_seed": None}
        return fields_from(cls, {**absent, "test_scores": [], "val_scores": [], "artifacts": {}, **values})

    def to_attrs(self) -> Attrs:
        return dataclasses.asdict(self)


# final_* attr -> FinalRecord field, for the fields whose names differ only by the prefix
_FINAL_PREFIX = "final_"


@dataclass(frozen=True)
class FinalRecord:
    """A study's final evaluation under one selection rule.

    The selected trial (``trial``, by the rule ``select``: ``best``, ``one-se`` or ``front``) retrained once per seed
    and scored on test; the starting configuration retrained with the same seeds (``start_*``) and the ``search_gain``
    (selected minus start, in the direction of improvement); ``selected_value`` (the selected trial's objective) and
    ``val_test_gap`` (that minus the test mean; ``None`` under the paper protocol); ``artifacts`` (the best seed's
    weights by validation) and ``artifact_seed``; ``protocol`` (how the test scores were measured, with the paper
    protocol's draws); ``zero_shot`` scores on similarity tasks; a multi-objective study's ``front`` with ``front_k``
    (asked for) and ``front_size`` (of the whole front then). For a tagging study, ``test_macro_f1`` holds each seed's
    macro-F1 over the test words (beside its token accuracy in ``test_scores``) and ``test_macro_f1_mean`` their mean
    (of a multi-objective study's best-score front trial); ``None`` for other tasks and for evaluations stored before
    they were recorded (absent attrs: not measured, so no format change). ``predictions`` is the artifact id of
    the per-example test predictions of each seed (:mod:`ilge_search.study.predictions`: ``truth``, ``selected``
    and ``start``), from which paired intervals are computed; ``None`` for evaluations stored before they were
    kept, under the paper protocol and for tagging.
    """

    VERSION: ClassVar[int] = 1

    select: str
    trial: int
    config: Attrs
    seeds: list[int]
    test_scores: list[float]
    test_mean: float
    test_std: float
    val_scores: list[float] = field(default_factory=list)
    max_epochs: int | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    artifact_seed: int | None = None
    selected_value: float | None = None
    val_test_gap: float | None = None
    start_trial: int | None = None
    start_test_mean: float | None = None
    start_test_scores: list[float] | None = None
    search_gain: float | None = None
    protocol: Attrs = field(default_factory=lambda: {"protocol": DEFAULT_PROTOCOL})
    zero_shot: dict[str, ZeroShotScores] = field(default_factory=dict)
    front: list[FrontMember] = field(default_factory=list)
    front_k: int | None = None
    front_size: int | None = None
    test_macro_f1: list[float] | None = None
    test_macro_f1_mean: float | None = None
    predictions: str | None = None

    # the attrs one rule's evaluation consists of (final_by_rule keeps these per rule)
    RULE_FIELDS: ClassVar[tuple[str, ...]] = (
        "test_mean",
        "test_std",
        "test_scores",
        "val_scores",
        "seeds",
        "trial",
        "config",
        "artifacts",
        "artifact_seed",
        "zero_shot",
        "max_epochs",
        "select",
        "selected_value",
        "val_test_gap",
        "start_trial",
        "start_test_mean",
        "start_test_scores",
        "search_gain",
        "protocol",
        "test_macro_f1",
        "test_macro_f1_mean",
        "predictions",
    )
    FRONT_FIELDS: ClassVar[tuple[str, ...]] = ("front", "front_k", "front_size")

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, object]) -> FinalRecord | None:
        """The final evaluation stored in ``attrs`` (a study's upgraded attrs, or one ``final_by_rule``
        entry); ``None`` when there is none."""
        if "final_test_mean" not in attrs:
            return None
        values: Attrs = {
            f.name: attrs[_FINAL_PREFIX + f.name]
            for f in dataclasses.fields(cls)
            if _FINAL_PREFIX + f.name in attrs and attrs[_FINAL_PREFIX + f.name] is not None
        }
        values.setdefault("select", LEGACY_SELECT)
        values["zero_shot"] = {
            name: ZeroShotScores.from_attrs(scores) for name, scores in (values.get("zero_shot") or {}).items()
        }
        values["front"] = [FrontMember.from_attrs(member) for member in values.get("front") or []]
        values.setdefault("config", {})
        values.setdefault("seeds", [])
        values.setdefault("test_scores", [])
        values.setdefault("test_std", 0.0)
        values.setdefault("trial", -1)
        return cls(**values)

    def to_attrs(self) -> Attrs:
        """The ``final_*`` user attrs of this evaluation (front attrs only for a front)."""
        names = self.RULE_FIELDS + (self.FRONT_FIELDS if self.front else ())
        out = {}
        for name in names:
            value = getattr(self, name)
            if name == "zero_shot":
                value = {task: dataclasses.asdict(scores) for task, scores in value.items()}
            elif name == "front":
                value = [member.to_attrs() for member in value]
            out[_FINAL_PREFIX + name] = value
        return out

    def rule_attrs(self) -> Attrs:
        """The attrs of this evaluation kept per rule in ``final_by_rule``."""
        attrs = self.to_attrs()
        return {_FINAL_PREFIX + name: attrs[_FINAL_PREFIX + name] for name in self.RULE_FIELDS}

    def matches(self, trial: int, seeds: Sequence[int], max_epochs: int | None) -> bool:
        """Whether this evaluation retrained ``trial`` with ``seeds`` under the epoch cap ``max_epochs``
        (then a new evaluation would give the same scores)."""
        return self.trial == trial and list(self.seeds) == list(seeds) and self.max_epochs == max_epochs


# ----------------------------------------------------------------------------- explain and LOTO


@dataclass(frozen=True)
class ExplainRecord:
    """A study's layer attribution (``ilge-search explain``): per final seed, the validation score, the
    ablation drop and gradient x input of every layer, and ``source``, what it was computed from (it is
    current while the study's final evaluation and data are those)."""

    VERSION: ClassVar[int] = 1
    ATTR: ClassVar[str] = "explain_layers"

    split: str
    metric: str
    seeds: list[int]
    scores: list[float]
    ablation: list[list[float]]
    gradient_input: list[list[float]]
    source: Attrs
    seconds: float = 0.0
    version: int = 1

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, object]) -> ExplainRecord | None:
        stored = attrs.get(cls.ATTR)
        if not isinstance(stored, Mapping) or not isinstance(stored.get("source"), Mapping):
            return None
        return read_stored(stored, lambda values: fields_from(cls, values), (TypeError,))

    def to_attrs(self) -> Attrs:
        return {self.ATTR: dataclasses.asdict(self)}


@dataclass(frozen=True)
class LotoScores:
    """One configuration trained with no search on a study's data: its test and validation scores per seed."""

    config: Attrs
    test_scores: list[float]
    val_scores: list[float]


@dataclass(frozen=True)
class LotoRecord:
    """Leave one task out on one study: the built-in and the regenerated defaults (chosen without this
    study's task) trained with the same seeds; ``key`` says what the numbers depend on."""

    VERSION: ClassVar[int] = 1
    ATTR: ClassVar[str] = "loto_evaluations"

    key: Attrs
    builtin: LotoScores
    regenerated: LotoScores
    regenerated_from: list[str] = field(default_factory=list)
    ilge_search_version: str | None = None
    version: int = 1

    @classmethod
    def from_value(cls, stored: object) -> LotoRecord | None:
        def build(values: Attrs) -> LotoRecord:
            scores = {name: fields_from(LotoScores, values[name]) for name in ("builtin", "regenerated")}
            return fields_from(cls, {**values, **scores})

        return read_stored(stored, build, (KeyError, TypeError))

    def to_value(self) -> Attrs:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- the study record


def upgrade_attrs(attrs: Mapping[str, object]) -> Attrs:
    """A study's user attrs in the current format (:data:`RECORD_VERSION`), whatever version wrote them.

    Version 1 (no :data:`VERSION_ATTR`): ``objectives`` absent means the score alone, ``protocol`` absent means
    ``matched``, and a final evaluation without ``final_select`` was made under ``best``. Nothing else changed meaning.
    """
    out: Attrs = dict(attrs)
    version = int(out.get(VERSION_ATTR) or 1)
    if version > RECORD_VERSION:
        raise ValueError(
            f"this study was stored by a newer ilge-search (record format {version}, this one reads "
            f"up to {RECORD_VERSION}); upgrade ilge-search to read it"
        )
    if "objectives" not in out or not out["objectives"]:
        out["objectives"] = list(DEFAULT_OBJECTIVES)
    if not out.get("protocol"):
        out["protocol"] = DEFAULT_PROTOCOL
    if "final_test_mean" in out and not out.get("final_select"):
        out["final_select"] = LEGACY_SELECT
    out[VERSION_ATTR] = RECORD_VERSION
    return out


@dataclass(frozen=True)
class StudyRecord:
    """Everything ilge-search stored on one study, typed (see the module's docstring).

    ``identity`` and ``data`` are ``None`` when none of their fields was stored (a study ilge-search did not create; see
    :attr:`is_ours`); ``final`` is the evaluation under the rule the study was last evaluated with and ``by_rule`` every
    rule's; ``loto`` maps a key digest to a :class:`LotoRecord`. ``version`` is the format the study was stored in.
    """

    name: str
    identity: Identity | None
    data: DataRecord | None
    final: FinalRecord | None
    by_rule: dict[str, FinalRecord]
    explain: ExplainRecord | None
    loto: dict[str, LotoRecord]
    ready: bool
    version: int

    @classmethod
    def from_attrs(cls, name: str, attrs: Mapping[str, Any]) -> StudyRecord:
        stored_version = int(attrs.get(VERSION_ATTR) or 1)
        upgraded = upgrade_attrs(attrs)
        by_rule = {}
        for rule, entry in (upgraded.get("final_by_rule") or {}).items():
            final = FinalRecord.from_attrs({"final_select": rule, **entry}) if isinstance(entry, Mapping) else None
            if final is not None:
                by_rule[str(rule)] = final
        loto = {}
        for digest, value in (upgraded.get(LotoRecord.ATTR) or {}).items():
            entry = LotoRecord.from_value(value)
            if entry is not None:
                loto[str(digest)] = entry
        return cls(
            name=name,
            identity=Identity.from_attrs(upgraded) if any(key in attrs for key in IDENTITY_KEYS) else None,
            data=DataRecord.from_attrs(upgraded) if _DATA_FIELDS & upgraded.keys() else None,
            final=FinalRecord.from_attrs(upgraded),
            by_rule=by_rule,
            explain=ExplainRecord.from_attrs(upgraded),
            loto=loto,
            ready=bool(upgraded.get(READY_ATTR)),
            version=stored_version,
        )

    @property
    def is_ours(self) -> bool:
        """Whether ilge-search created the study (it names its model, task and encoder)."""
        identity = self.identity
        return identity is not None and all((identity.model, identity.task, identity.encoder))

    @property
    def has_data(self) -> bool:
        """Whether the study recorded its data (``task_kind``): made by ``ilge-search run``."""
        return self.data is not None and self.data.task_kind is not None

    @property
    def maximize(self) -> bool:
        return self.data is None or self.data.maximize

    @property
    def select(self) -> str | None:
        """The rule of the stored final evaluation (``None``: none yet)."""
        return None if self.final is None else self.final.select

    @property
    def objectives(self) -> tuple[str, ...]:
        """What the study optimises (the score alone for a study ilge-search did not create)."""
        return DEFAULT_OBJECTIVES if self.identity is None else self.identity.objectives


def study_record(study: Stored) -> StudyRecord:
    """The :class:`StudyRecord` of an ``optuna.Study``, ``FrozenStudy`` or study summary."""
    return StudyRecord.from_attrs(str(getattr(study, "study_name", "")), attrs_of(study))


def is_ilge_study(study: optuna.Study) -> bool:
    """Whether ``study`` was created by ilge-search (cheaper than a whole record)."""
    return "model" in attrs_of(study)


def save_identity(study: optuna.Study, identity: Identity, data: DataRecord) -> None:
    """Store a new study's identity and data record (before it is marked ready)."""
    write_attrs(study, {**identity.to_attrs(), **data.to_attrs(), VERSION_ATTR: RECORD_VERSION})


def save_data_fingerprints(
    study: optuna.Study, task: str, label_names: Sequence[str], fingerprints: Mapping[str, str]
) -> None:
    """Give a study stored before data fingerprints existed its task name and fingerprints (adopted)."""
    write_attrs(study, {"task": task, "label_names": list(label_names), "data_fingerprints": dict(fingerprints)})


def save_task_path(study: optuna.Study, task_path: str) -> None:
    """Record where a custom task's data is now (its file or folder moved)."""
    study.set_user_attr("task_path", task_path)


def mark_ready(study: optuna.Study) -> None:
    """Mark a study set up: its creator stored its identity and enqueued its first trial."""
    study.set_user_attr(READY_ATTR, True)


def is_ready(study: optuna.Study) -> bool:
    """Whether a study's creator finished setting it up (read fresh from the storage)."""
    return bool(study._storage.get_study_user_attrs(study._study_id).get(READY_ATTR))


def save_final(study: optuna.Study, final: FinalRecord, *, keep_by_rule: bool = True) -> None:
    """Store ``final`` as the study's final evaluation; with ``keep_by_rule`` it is also kept as its rule's
    entry of ``final_by_rule`` (a multi-objective study's front is not). A zero-shot record of an earlier
    evaluation is cleared when this one has none."""
    attrs = final.to_attrs()
    if not final.zero_shot and "final_zero_shot" not in attrs_of(study):
        attrs.pop("final_zero_shot", None)
    write_attrs(study, attrs)
    if keep_by_rule:
        by_rule = dict(attrs_of(study).get("final_by_rule") or {})
        by_rule[final.select] = final.rule_attrs()
        study.set_user_attr("final_by_rule", by_rule)


def save_explain(study: optuna.Study, record: ExplainRecord) -> None:
    write_attrs(study, record.to_attrs())


def save_loto(study: optuna.Study, records: Mapping[str, LotoRecord]) -> None:
    """Replace a study's leave-one-task-out records with ``records`` (digest -> record)."""
    study.set_user_attr(LotoRecord.ATTR, {digest: record.to_value() for digest, record in records.items()})
