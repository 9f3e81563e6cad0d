"""A finished study's model, ready for use: the final evaluation's weights, or the best trial retrained once.

:func:`load_study_model` reads a study back as a :class:`StudyModel`: the trained
:class:`~ilge_search.engine.ILGEModel`, what running it on new texts needs and where it came from
(:attr:`StudyModel.provenance`). A study with a final evaluation gives the weights of its best final seed by validation;
one without (or ``retrain=True``) gives the best trial retrained once with ``seed``, as the final evaluation trains each
seed; ``trial=N`` takes any complete trial (a multi-objective study's front member gives the weights its final
evaluation kept). The estimators wrap the result; this module never imports them (they sit in a higher layer).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optuna.artifacts import FileSystemArtifactStore, download_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
from safetensors import SafetensorError
from safetensors.torch import load_file

from .._version import __version__
from ..embeddings.models import resolve_device
from ..encoders import config_from_dict
from ..encoders.configs import BestLayerConfig, EncoderConfig
from ..engine import build_model, build_tagger
from ..engine.ensemble import build_ensemble
from ..record import (
    DEFAULT_MAX_LENGTH,
    DEFAULT_TOKEN_POOLING,
    FinalRecord,
    SourceRecord,
    StudyRecord,
    ensemble_record,
    source_record,
    study_record,
    trial_config,
)
from ..record.fields import Attrs
from ..storage import Storage, count_trials, open_storage
from ..validation import check_int
from .retraining import TrainingSetup, train_seeds
from .selection import DEFAULT_SELECT
from .stored import chosen_trial, data_of, identity_of, load_run_study, selected_trial

if TYPE_CHECKING:
    import optuna
    import torch

    from ..engine import ILGEModel, TaggerModel
    from ..engine.ensemble import EnsembleModel

__all__ = [
    "StudyModel",
    "StudyExport",
    "load_study_model",
    "load_for_estimator",
    "load_study_ensemble",
    "study_task_kind",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


@dataclass
class StudyModel:
    """A study's trained model and everything needed to run it on new inputs.

    Attributes:
        model: the trained ``ILGEModel`` in eval mode (its standardiser statistics are buffers).
        config: the encoder configuration it was trained with.
        task_kind: ``"classification"``, ``"similarity"`` or ``"tagging"`` (``model`` is then a
            :class:`~ilge_search.engine.TaggerModel`).
        metric: the study's metric (``accuracy`` or ``spearman``).
        base_model: the frozen model the features come from, as the study names it.
        token_pooling, max_length: how the study pooled and truncated tokens.
        num_layers, hidden_size: the shape ``(L, D)`` of one text's features.
        label_names: class (or tag) id -> name (empty for similarity).
        score_range: ``(low, high)`` of the gold scores (similarity only).
        provenance: study, trial, seed, storage (password hidden), scores, the study's protocol and versions;
            ``test_score`` is that seed's stored test score, ``None`` under the paper protocol (whose test
            scores read the vectors out with a logistic regression, not with this model's head).
        word_pooling: a tagging study's word pooling (``first`` or ``mean``); ``None`` for other tasks.
    """

    model: torch.nn.Module
    config: EncoderConfig
    task_kind: str
    metric: str
    base_model: str
    token_pooling: str
    max_length: int
    num_layers: int
    hidden_size: int
    label_names: list[str] = field(default_factory=list)
    score_range: tuple[float, float] | None = None
    provenance: Attrs = field(default_factory=dict)
    word_pooling: str | None = None

    def estimator_arguments(self, export: StudyExport) -> Attrs:
        """What an estimator built from this model (``ILGEClassifier``, ``ILGETagger``) is constructed with,
        besides its pooling: the study's model, config and max length, the trained seed, and ``export``'s
        device, cache, batch size and progress."""
        return dict(
            base_model=self.base_model,
            config=self.config,
            max_length=self.max_length,
            batch_size=export.batch_size,
            device=export.device,
            random_state=int(self.provenance["seed"]),
            cache_dir=export.cache_dir,
            progress=export.progress,
        )

    def model_on(self, device: str) -> torch.nn.Module:
        """The trained model on ``device`` (``auto`` resolved), in eval mode."""

        return self.model.to(resolve_device(device)).eval()

    @property
    def best_layer(self) -> int | None:
        """The layer a best-layer model reads (``None`` for every other encoder)."""
        return self.config.layer if isinstance(self.config, BestLayerConfig) else None


@dataclass(frozen=True)
class StudyExport:
    """How ``ILGEClassifier.from_study`` and ``ILGETagger.from_study`` read a study's model, so that both read a
    study the same way.

    Attributes:
        seed: the training seed when the best trial is retrained.
        retrain: retrain the selected trial even when the final evaluation stored its weights.
        artifact_dir: where ``run`` uploaded the weights, if not next to the storage.
        data_dir: where the study's data is now, for retraining and texts.
        device, cache_dir, batch_size, progress: how the estimator runs its model and embeds texts.
        trial: any complete trial instead of the selected one (a trial of a multi-objective study's final front gives
            the weights its final evaluation kept; any other is retrained with ``seed``).
        task_path: where a custom task's data is now, when it moved since the study ran.
    """

    seed: int = 0
    retrain: bool = False
    artifact_dir: PathLike | None = None
    data_dir: PathLike | None = None
    device: str = "auto"
    cache_dir: PathLike | None = None
    batch_size: int = 32
    progress: bool = False
    trial: int | None = None
    task_path: PathLike | None = None

    @classmethod
    def with_settings(cls, export: StudyExport | None, settings: Mapping[str, Any]) -> StudyExport:
        """``export`` (default: every field's default) with the fields ``settings`` names replaced; a name that is
        no field is refused, so that a misspelt setting never falls back to its default."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            listed = ", ".join(map(repr, unknown))
            raise TypeError(f"unknown export setting {listed}; the settings are {', '.join(names)}")
        return replace(export or cls(), **settings)


def load_for_estimator(
    storage: str | Storage | None, study_name: str, export: StudyExport, *, tagging: bool
) -> StudyModel:
    """:func:`load_study_model` with ``export``'s options, for ``ILGETagger.from_study`` (``tagging``) or
    ``ILGEClassifier.from_study``: a study of the other kind is refused in one line naming the class to use."""
    found = load_study_model(storage, study_name, export)
    if (found.task_kind == "tagging") != tagging:
        other = "ILGETagger" if found.task_kind == "tagging" else "ILGEClassifier"
        raise ValueError(f"study {study_name!r} is a {found.task_kind} study; export it with {other}.from_study")
    return found


def _open_study(storage: str | Storage | None, study_name: str) -> tuple[Storage, optuna.Study]:
    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    study = load_run_study(opened, study_name, purpose="exported")
    if not count_trials(study, ("COMPLETE",)):
        raise ValueError(f"study {study_name!r} has no complete trial yet; run it first (`ilge-search run`)")
    return opened, study


def study_task_kind(storage: str | Storage | None, study_name: str) -> str:
    """The task kind a study made by ``ilge-search run`` was run on (``classification``, ``similarity`` or
    ``tagging``), read from its record without loading any model."""
    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    study = load_run_study(opened, study_name, purpose="exported")
    return str(data_of(study_record(study)).task_kind or "classification")


def _base_model(name: str) -> str:
    """The study's model name; a relative local folder becomes absolute, so the export works from anywhere."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def _download(
    storage: Storage, study: optuna.Study, artifact_id: str, target: Path, artifact_dir: PathLike | None
) -> None:
    """Fetch one artifact from the first artifact store that has it."""

    candidates = [Path(artifact_dir).expanduser()] if artifact_dir is not None else []
    candidates.append(storage.artifact_dir)
    recorded = data_of(study_record(study)).artifact_dir
    if recorded:
        candidates.append(Path(recorded))
    for folder in dict.fromkeys(candidates):
        if not folder.is_dir():
            continue
        try:
            download_artifact(
                artifact_store=FileSystemArtifactStore(folder), file_path=str(target), artifact_id=artifact_id
            )
            return
        except (ArtifactNotFound, FileNotFoundError):
            continue
    looked = ", ".join(str(f) for f in dict.fromkeys(candidates))
    raise ValueError(
        f"the final weights of study {study.study_name!r} (artifact {artifact_id}) are not in {looked}; "
        "pass --artifact-dir with the folder `run` uploaded them to, or --retrain to train the best "
        "trial again"
    )


def _from_artifacts(
    storage: Storage, study: optuna.Study, artifact_dir: PathLike | None, ids: dict[str, str]
) -> tuple[ILGEModel | TaggerModel, Attrs]:
    """A final evaluation's model (``ids``: its weights + config JSON artifacts) and its recorded metadata."""

    retrain = "; pass --retrain to train the best trial again"
    meta, state = _read_artifacts(ArtifactPlace(storage, study, artifact_dir), ids, "final", retrain)
    config = config_from_dict(meta["config"])
    score_range = meta.get("score_range")
    if meta["task_kind"] == "tagging":
        model: ILGEModel | TaggerModel = build_tagger(
            config, int(meta["num_layers"]), int(meta["hidden_size"]), int(meta["num_classes"])
        )
    else:
        model = build_model(
            config,
            int(meta["num_layers"]),
            int(meta["hidden_size"]),
            meta["task_kind"],
            num_classes=meta.get("num_classes"),
            score_range=None if score_range is None else tuple(score_range),
        )
    expected = model.state_dict()
    if set(expected) != set(state) or any(expected[k].shape != state[k].shape for k in expected):
        raise ValueError(
            f"the final weights of study {study.study_name!r} do not match their config; "
            "pass --retrain to train the best trial again"
        )
    model.load_state_dict(state)
    return model.eval(), meta


def _retrained(
    study: optuna.Study, trial: optuna.trial.FrozenTrial, how: StudyExport
) -> tuple[ILGEModel | TaggerModel, float]:
    """``trial``'s config trained once with ``how.seed`` on the study's data (as the final evaluation does)."""
    setup = TrainingSetup(data_dir=how.data_dir, cache_dir=how.cache_dir, device=how.device, task_path=how.task_path)
    data = setup.load_data(study, with_test=False, progress=how.progress)
    trained = next(train_seeds(data, trial_config(trial), [how.seed], device=how.device))
    return trained.model, float(trained.best_val_metric or 0.0)


def load_study_model(storage: str | Storage | None, study_name: str, export: StudyExport | None = None) -> StudyModel:
    """The model a finished study found, with its provenance.

    Args:
        storage: the study's storage URL (or an opened :class:`~ilge_search.storage.Storage`); a SQLite file must exist.
        study_name: the study (see ``ilge-search studies``).
        export: how (default :class:`StudyExport`): ``seed``, the training seed when the best trial is retrained;
            ``retrain``, retrain it even when a final evaluation exists; ``artifact_dir``, where the final weights were
            uploaded, if not next to the storage; ``data_dir``, ``cache_dir``, ``device``, ``progress``: for retraining
            (the task data, embedding cache, progress bars); ``task_path``: where a custom task's data is now, when it
            moved since the study recorded it; ``trial``: export this complete trial instead of the study's selected
            one: its final-front weights when a multi-objective study's final evaluation retrained it, else retrained
            with ``seed``.

    Raises:
        ValueError: no such storage, study or trial, no complete trial (or ``trial`` not complete),
            missing or damaged final artifacts, or task data that differ from the study's.
    """
    how = export or StudyExport()
    check_int("seed", how.seed, minimum=0)
    opened, study = _open_study(storage, study_name)
    if how.trial is not None:
        return _trial_model(opened, study, chosen_trial(study, how.trial), how)
    record = study_record(study)
    final = record.final
    provenance = _provenance(opened, record)
    if final is not None and final.artifacts and not how.retrain:
        model, meta = _from_artifacts(opened, study, how.artifact_dir, final.artifacts)
        selected_now = selected_trial(study, final.select or DEFAULT_SELECT).number
        provenance.update(_final_fields(meta, final, final.test_scores, int(meta["trial"]), selected_now, provenance))
        config = config_from_dict(meta["config"])
    else:
        selected = selected_trial(study)
        model, val_score = _retrained(study, selected, how)
        provenance.update(_retrained_fields(selected.number, how.seed, val_score))
        config = trial_config(selected)
    return _study_model(record, model, config, provenance, source_record(study))


def _final_fields(
    meta: Attrs, final: FinalRecord, scores: list[float], trial: int, selected_now: int, provenance: Attrs
) -> Attrs:
    """The provenance of weights a final evaluation kept (``meta``: their stored record; ``scores``: the test
    scores of the final seeds); under the paper protocol the stored test scores are a logistic readout of
    the vectors, not this model's head, so no test score is given."""
    paper = provenance["protocol"] == "paper"
    trained_seed = int(meta["seed"])
    return dict(
        source="final evaluation",
        trial=trial,
        seed=trained_seed,
        val_score=float(meta["val_metric"]),
        test_score=None if paper else _seed_score(final.seeds, scores, trained_seed),
        trained_with={"ilge_search": meta.get("ilge_search_version"), "torch": meta.get("torch_version")},
        selected_trial_now=selected_now,
        **_seed_choice(final, scores, paper),
    )


def _retrained_fields(trial: int, seed: int, val_score: float) -> Attrs:
    """The provenance of a trial retrained once with ``seed`` (no stored weights used)."""
    return dict(source="retrained", trial=trial, seed=seed, val_score=val_score, test_score=None, **RETRAINED)


# how the exported seed was chosen, as the provenance's ``seed_rule``
BEST_SEED_RULE = "the final seed with the best validation score (test never chooses)"
RETRAINED = {"seed_rule": "--seed: the trial retrained once (no final weights were used)", "final_seeds": []}


def _seed_choice(final: FinalRecord, scores: list[float], paper: bool) -> Attrs:
    """The provenance fields saying which seed an export takes and why: the rule, the final seeds it chose
    among and their test mean (what the study's tables show; ``None`` under the paper protocol)."""
    return {
        "seed_rule": BEST_SEED_RULE,
        "final_seeds": list(final.seeds),
        "test_mean": None if paper or not scores else sum(scores) / len(scores),
    }


def _seed_score(seeds: Sequence[int], scores: Sequence[float], seed: int) -> float | None:
    """The test score of ``seed`` among the final seeds (``scores`` in their order); ``None`` when it has none."""
    seeds = list(seeds)
    return scores[seeds.index(seed)] if seed in seeds[: len(scores)] else None


def _provenance(opened: Storage, record: StudyRecord) -> Attrs:
    identity, data = identity_of(record), data_of(record)
    return {
        "study": record.name,
        "storage": opened.shown_url,
        "model": identity.model,
        "model_revision": data.model_revision,
        "task": identity.task,
        "encoder": identity.encoder,
        "metric": data.metric,
        "data": identity.data_setting(),
        "protocol": identity.protocol,
    }


def _trial_model(opened: Storage, study: optuna.Study, trial: optuna.trial.FrozenTrial, how: StudyExport) -> StudyModel:
    """One chosen trial's model: the weights the final evaluation kept for it, else retrained with ``how.seed``."""
    record = study_record(study)
    final = record.final
    stored: tuple[dict[str, str], list[float]] | None = None  # (artifacts, test scores) kept for this trial
    if final is not None:
        kept = [(m.artifacts, m.test_scores) for m in final.front if m.trial == trial.number]
        if final.trial == trial.number and final.artifacts:
            kept.append((final.artifacts, final.test_scores))
        stored = next((entry for entry in kept if entry[0]), None)
    provenance = _provenance(opened, record)
    if final is not None and stored is not None and not how.retrain:
        artifacts, scores = stored
        model, meta = _from_artifacts(opened, study, how.artifact_dir, artifacts)
        provenance.update(_final_fields(meta, final, scores, trial.number, trial.number, provenance))
        return _study_model(record, model, config_from_dict(meta["config"]), provenance, source_record(study))
    model, val_score = _retrained(study, trial, how)
    provenance.update(_retrained_fields(trial.number, how.seed, val_score))
    return _study_model(record, model, trial_config(trial), provenance, source_record(study))


def _study_model(
    record: StudyRecord, model: Any, config: EncoderConfig, provenance: Attrs, source: SourceRecord
) -> StudyModel:
    identity, data = identity_of(record), data_of(record)
    provenance.update(
        ilge_search_version=__version__, exported_at=datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    task_kind = str(data.task_kind)
    tagging = task_kind == "tagging"
    return StudyModel(
        model=model,
        config=config,
        task_kind=task_kind,
        metric=data.metric or "",
        base_model=_base_model(str(identity.model)),
        token_pooling=source.token_pooling,
        max_length=source.max_length,
        num_layers=int(model.num_layers if tagging else model.aggregator.num_layers),
        hidden_size=int(model.hidden_in if tagging else model.aggregator.hidden_in),
        label_names=list(data.label_names) if task_kind in ("classification", "tagging") else [],
        score_range=None if tagging else model.score_range,
        provenance=provenance,
        word_pooling=(identity.word_pooling or "first") if tagging else None,
    )


def load_study_ensemble(
    storage: str | Storage | None, study_name: str, *, artifact_dir: PathLike | None = None
) -> StudyModel:
    """The ensemble a study's ensemble evaluation stored (``ilge-search ensemble`` or ``run --ensemble K``):
    an :class:`~ilge_search.engine.ensemble.EnsembleModel` of its members trained with its best seed by
    validation, as a :class:`StudyModel` whose ``config`` is the most-picked member's.

    Raises:
        ValueError: no such study, no stored ensemble, or missing or damaged artifacts.
    """

    opened, study = _open_study(storage, study_name)
    stored = ensemble_record(study)
    if stored is None or not stored.artifacts:
        raise ValueError(
            f"study {study_name!r} has no stored ensemble; make one with `ilge-search ensemble --study "
            f"{study_name} --size K` (or `run --ensemble K`)"
        )
    model, meta = _ensemble_artifacts(opened, study, stored.artifacts, artifact_dir)
    record = study_record(study)
    ensemble = stored.ensemble
    provenance = _provenance(opened, record)
    seed = int(meta["seed"])
    provenance.update(
        source="ensemble evaluation",
        members={str(m["trial"]): int(m["count"]) for m in meta["ensemble"]},
        mix=meta.get("mix"),
        seed=seed,
        trial=int(max(meta["ensemble"], key=lambda m: m["count"])["trial"]),
        test_score=None if ensemble is None else _seed_score(stored.seeds, ensemble.test_scores, seed),
        seed_rule="the final seed whose ensemble has the best validation score (test never chooses)",
        final_seeds=list(stored.seeds),
        test_mean=None if ensemble is None else ensemble.test_mean,
        picks=None if ensemble is None else ensemble.describe(),
        ilge_search_version=__version__,
        exported_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    data, identity = data_of(record), identity_of(record)
    first = max(meta["ensemble"], key=lambda m: m["count"])
    return StudyModel(
        model=model.eval(),
        config=config_from_dict(first["config"]),
        task_kind=str(data.task_kind),
        metric=data.metric or "",
        base_model=_base_model(str(identity.model)),
        token_pooling=DEFAULT_TOKEN_POOLING,  # what studies stored before their SourceRecord used
        max_length=DEFAULT_MAX_LENGTH,
        num_layers=int(meta["num_layers"]),
        hidden_size=int(meta["hidden_size"]),
        label_names=list(data.label_names) if data.task_kind == "classification" else [],
        score_range=model.score_range,
        provenance=provenance,
    )


def _ensemble_artifacts(
    opened: Storage, study: optuna.Study, artifacts: dict[str, str], artifact_dir: PathLike | None
) -> tuple[EnsembleModel, Attrs]:
    """The stored ensemble's model with its weights, and its description (members, mix, seed, sizes)."""

    meta, state = _read_artifacts(ArtifactPlace(opened, study, artifact_dir), artifacts, "ensemble", "")
    try:
        model = build_ensemble(meta)
        model.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"the ensemble artifacts of study {study.study_name!r} cannot be read ({exc})") from None
    return model, meta


@dataclass(frozen=True)
class ArtifactPlace:
    """Where a study's artifacts are looked for: its storage, the study and the folder the user named."""

    storage: Storage
    study: optuna.Study
    artifact_dir: PathLike | None


def _read_artifacts(
    place: ArtifactPlace, ids: Mapping[str, str], what: str, hint: str
) -> tuple[Attrs, dict[str, torch.Tensor]]:
    """The JSON description and the weights of one stored model (``ids``: their artifact ids); an artifact
    that cannot be read is one line naming ``what`` they are, followed by ``hint``."""

    with tempfile.TemporaryDirectory(prefix="ilge-export-") as tmp:
        meta_path, weights_path = Path(tmp, "config.json"), Path(tmp, "model.safetensors")
        _download(place.storage, place.study, ids["config"], meta_path, place.artifact_dir)
        _download(place.storage, place.study, ids["weights"], weights_path, place.artifact_dir)
        try:
            return json.loads(meta_path.read_text(encoding="utf-8")), load_file(str(weights_path))
        except (ValueError, OSError, SafetensorError) as exc:
            raise ValueError(
                f"the {what} artifacts of study {place.study.study_name!r} cannot be read ({exc}){hint}"
            ) from None
