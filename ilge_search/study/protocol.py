"""How a study's final scores are measured: the *matched* protocol, or the paper's (MTEB's evaluators).

- ``matched`` (the default): every encoder, baselines included, is trained with its linear head on the study's
  training split and scored by that head on test.
- ``paper``: each final model becomes vectors (a parameter-free baseline's raw layer readout, untrained),
  scored as MTEB :data:`MTEB_VERSION` does: :func:`logistic_readout` (``LogisticRegression(max_iter=100)`` on
  ``samples_per_label`` examples per label, :func:`undersample`'s draws, ``n_experiments`` times) for
  classification, :func:`cosine_spearman` for similarity. The examples are drawn from the study's training
  split, so the draws are not MTEB's own (docs/protocols.md); ``tests/test_protocol.py`` checks these
  functions against the installed ``mteb``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score
from sklearn.metrics.pairwise import paired_cosine_distances

from ..encoders.aggregator import build_aggregator
from ..record import DEFAULT_PROTOCOL, PROTOCOLS, Identity
from ..validation import check_choice, check_int

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..encoders.configs import EncoderConfig
    from ..engine.metrics import ArrayLike
    from .shapes import Features, TrainedModel

__all__ = [
    "PROTOCOLS",
    "DEFAULT_PROTOCOL",
    "MTEB_VERSION",
    "MTEB_SEED",
    "MTEB_N_EXPERIMENTS",
    "MTEB_DEFAULT_SAMPLES_PER_LABEL",
    "MTEB_SAMPLES_PER_LABEL",
    "MTEB_TASK_NAMES",
    "PARAMETER_FREE_FAMILIES",
    "PaperProtocol",
    "check_protocol",
    "paper_samples_per_label",
    "undersample",
    "logistic_readout",
    "cosine_spearman",
    "is_parameter_free",
    "paper_vectors",
]

MTEB_VERSION = "2.26.24"  # the mteb release whose evaluator code and task settings are followed
MTEB_SEED = 42  # AbsTask's default seed: the undersampling RandomState and LogisticRegression's random_state
MTEB_N_EXPERIMENTS = 10  # AbsTaskClassification.n_experiments
MTEB_DEFAULT_SAMPLES_PER_LABEL = 8  # AbsTaskClassification.samples_per_label
MTEB_LOGREG_MAX_ITER = 100  # AbsTaskClassification.evaluator_model = LogisticRegression(max_iter=100)
# MTEB tasks that override samples_per_label (every other MTEB classification task of the paper uses 8)
MTEB_SAMPLES_PER_LABEL: dict[str, int] = {"emotion": 16}
# our registry names -> MTEB's task names, for the paper's tasks MTEB has
# the baselines with no trainable parameter (tests/test_protocol.py checks this against the modules)
PARAMETER_FREE_FAMILIES: tuple[str, ...] = ("last-layer", "best-layer", "mean-layers")
MTEB_TASK_NAMES: dict[str, str] = {
    "banking77": "Banking77Classification",
    "emotion": "EmotionClassification",
    "mtop_domain": "MTOPDomainClassification",
    "mtop_intent": "MTOPIntentClassification",
    "poem_sentiment": "PoemSentimentClassification",
    "stsb": "STSBenchmark",
    "sts12": "STS12",
    "sts13": "STS13",
    "sts14": "STS14",
    "sts15": "STS15",
    "sts16": "STS16",
    "biosses": "BIOSSES",
    "sick_r": "SICK-R",
}


def check_protocol(protocol: object) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS`."""
    return str(check_choice("protocol", protocol, PROTOCOLS))


def paper_samples_per_label(task: str | None, override: int | None = None) -> int:
    """Examples per label of the paper protocol: ``override``, else the MTEB task's own value for a
    registered task (``task``; ``None`` for a custom task), else MTEB's default (8)."""
    if override is not None:
        return check_int("samples_per_label", override)
    return (
        MTEB_SAMPLES_PER_LABEL.get(str(task), MTEB_DEFAULT_SAMPLES_PER_LABEL)
        if task
        else MTEB_DEFAULT_SAMPLES_PER_LABEL
    )


@dataclass(frozen=True)
class PaperProtocol:
    """The settings of the paper protocol's classification readout (see the module docstring)."""

    samples_per_label: int = MTEB_DEFAULT_SAMPLES_PER_LABEL
    n_experiments: int = MTEB_N_EXPERIMENTS
    seed: int = MTEB_SEED

    def __post_init__(self) -> None:
        check_int("samples_per_label", self.samples_per_label)
        check_int("n_experiments", self.n_experiments)
        check_int("seed", self.seed, minimum=0)

    def record(self) -> dict[str, object]:
        """What a study stores about the readout beside its scores (``final_protocol``)."""
        return {
            "protocol": "paper",
            "samples_per_label": self.samples_per_label,
            "n_experiments": self.n_experiments,
            "seed": self.seed,
            "classifier": f"LogisticRegression(max_iter={MTEB_LOGREG_MAX_ITER})",
            "similarity": "cosine_spearman",
            "mteb_version": MTEB_VERSION,
            "pool": "the study's training split",
        }

    @classmethod
    def for_identity(cls, identity: Identity) -> PaperProtocol | None:
        """The readout of a study with this identity; ``None`` for a matched study."""
        if identity.protocol != "paper":
            return None
        return cls(samples_per_label=int(identity.samples_per_label or MTEB_DEFAULT_SAMPLES_PER_LABEL))


def undersample(
    labels: Sequence[object] | np.ndarray,
    samples_per_label: int,
    n_experiments: int = MTEB_N_EXPERIMENTS,
    seed: int = MTEB_SEED,
) -> list[np.ndarray]:
    """The training rows of each experiment, drawn as MTEB's ``AbsTaskClassification._undersample_data``.

    Returns ``n_experiments`` index arrays into ``labels``, each in the shuffled
    order MTEB fits in; a label with fewer than ``samples_per_label`` rows keeps all of them.
    """
    check_int("samples_per_label", samples_per_label)
    check_int("n_experiments", n_experiments)
    labels = np.asarray(labels).tolist()
    order = list(range(len(labels)))  # one list shuffled again before every experiment, as MTEB does
    draws = []
    for _ in range(n_experiments):
        np.random.RandomState(seed).shuffle(order)
        taken: dict[object, int] = defaultdict(int)
        chosen = []
        for index in order:
            if taken[labels[index]] < samples_per_label:
                chosen.append(index)
                taken[labels[index]] += 1
        draws.append(np.asarray(chosen, dtype=np.int64))
    return draws


def logistic_readout(
    train: tuple[np.ndarray, np.ndarray],
    evaluations: Mapping[str, tuple[np.ndarray, np.ndarray]],
    protocol: PaperProtocol = PaperProtocol(),
) -> dict[str, list[float]]:
    """MTEB's classification evaluator on vectors: per experiment, ``LogisticRegression(max_iter=100)``
    fitted on the undersampled training rows; the accuracy on each evaluation set.

    Args:
        train: ``(vectors (N, E), labels (N,))`` to draw the few training examples from.
        evaluations: ``{name: (vectors, labels)}``, e.g. test and validation; each is scored
            with the same fitted classifiers.
        protocol: samples per label, experiments, seed.

    Returns:
        ``{name: [accuracy of each experiment]}``; MTEB's score is their mean.

    Raises:
        ValueError: an undersample holds a single label (nothing to classify).
    """

    vectors, labels = np.asarray(train[0]), np.asarray(train[1])
    scores: dict[str, list[float]] = {name: [] for name in evaluations}
    for rows in undersample(labels, protocol.samples_per_label, protocol.n_experiments, protocol.seed):
        if len(np.unique(labels[rows])) < 2:
            raise ValueError("the paper protocol's readout needs at least two labels in the training split")
        classifier = LogisticRegression(max_iter=MTEB_LOGREG_MAX_ITER, random_state=protocol.seed)
        classifier.fit(vectors[rows], labels[rows])
        for name, (eval_vectors, eval_labels) in evaluations.items():
            predicted = classifier.predict(np.asarray(eval_vectors))
            scores[name].append(float(accuracy_score(np.asarray(eval_labels), predicted)))
    return scores


def cosine_spearman(first: ArrayLike, second: ArrayLike, gold: ArrayLike) -> float:
    """MTEB's STS main score: Spearman correlation of the pairs' cosine similarity with the gold scores."""

    cosine = 1 - paired_cosine_distances(np.asarray(first), np.asarray(second))
    return float(spearmanr(np.asarray(gold, dtype=np.float64), cosine)[0])


def is_parameter_free(config: EncoderConfig | str) -> bool:
    """Whether ``config``'s encoder reads its vector off the layers with nothing to train (last layer,
    best layer, mean of layers): under the paper protocol it is scored untrained, on the raw features."""
    return getattr(config, "family", config) in PARAMETER_FREE_FAMILIES


def paper_vectors(
    features: Features,
    *,
    model: TrainedModel | None = None,
    config: EncoderConfig | None = None,
    batch_size: int = 1024,
) -> np.ndarray:
    """The vectors MTEB would score, float32: ``(N, E)`` for ``(N, L, D)`` features, ``(N, 2, E)`` for pairs.

    Give a trained ``model`` (an ``ILGEModel``): its representation before the
    classification head (``model.embed``), or for a similarity model the
    projected vectors whose cosine it was trained on. Or give the ``config`` of
    a parameter-free baseline: its readout of the raw features, untrained.
    """

    if (model is None) == (config is None):
        raise ValueError("give either a trained model or a parameter-free baseline's config")
    features = torch.as_tensor(features)
    pairs = features.dim() == 4
    flat = features.flatten(0, 1) if pairs else features
    if model is not None:
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()

        def encode(x: torch.Tensor) -> torch.Tensor:
            z = model.embed(x.to(device))
            return model.head(z) if model.task_kind == "similarity" else z
    else:
        assert config is not None  # checked above: a model or a config
        readout = build_aggregator(config, num_layers=flat.shape[1], hidden_in=flat.shape[2]).eval()
        was_training = False
        encode = readout
    outputs = []
    try:
        with torch.no_grad():
            for start in range(0, flat.shape[0], batch_size):
                outputs.append(encode(flat[start : start + batch_size].float()).float().cpu())
    finally:
        if model is not None:
            model.train(was_training)
    vectors = torch.cat(outputs).numpy()
    return vectors.reshape(features.shape[0], 2, -1) if pairs else vectors
