"""`recommend_defaults` on synthetic studies whose right answer is known by construction."""

from __future__ import annotations

import itertools
import json

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from ilge_search import tuning
from ilge_search.cli import cli
from ilge_search.defaults.problems import normalised_ranks
from ilge_search.embeddings.models import model_num_params, model_size_bucket
from ilge_search.encoders import builtin_start
from ilge_search.report.defaults_page import recommend_defaults
from ilge_search.tuning import recommended_config, suggest_config

FIXED = {"gnn_layers": 1, "pooling": "mean", "dropout": 0.1, "weight_decay": 1e-4}

# additive effects on the validation score; the best level of each is the right answer
SMALL_EFFECTS = {
    "conv_type": {"gcn": 0.30, "gin": 0.10, "gat": 0.0},
    "hidden_dim": {128: 0.20, 256: 0.10, 512: 0.0},
    "lr": {1e-2: 0.50, 1e-3: 0.25, 1e-4: 0.0},
    "gin_mlp_layers": {1: 0.0, 2: 0.05},
    "gat_heads": {2: 0.0, 8: 0.05},
}
LARGE_EFFECTS = {
    "conv_type": {"gat": 0.30, "gin": 0.10, "gcn": 0.0},
    "hidden_dim": {512: 0.20, 256: 0.10, 128: 0.0},
    "lr": {1e-4: 0.50, 1e-3: 0.25, 1e-2: 0.0},
    "gin_mlp_layers": {1: 0.05, 2: 0.0},
    "gat_heads": {2: 0.0, 8: 0.05},
}


def graph_grid():
    """conv_type x hidden_dim x lr, with gin_mlp_layers / gat_heads crossed in where they exist."""
    for conv, hidden, lr in itertools.product(["gin", "gcn", "gat"], [128, 256, 512], [1e-4, 1e-3, 1e-2]):
        extras = {
            "gin": [{"gin_mlp_layers": 1}, {"gin_mlp_layers": 2}],
            "gat": [{"gat_heads": 2}, {"gat_heads": 8}],
            "gcn": [{}],
        }[conv]
        for extra in extras:
            yield {"conv_type": conv, "hidden_dim": hidden, "lr": lr, **extra, **FIXED}


def score(params, effects, scale, offset):
    value = sum(effects[name][params[name]] for name in effects if name in params)
    return offset + scale * value


def add_study(url, name, attrs, family, rows, direction="maximize"):
    """rows: (params, value or None for a pruned trial); built in memory, then copied to ``url``."""
    memory = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name=name, storage=memory, direction=direction)
    for key, value in {"task_kind": "classification", "metric": "accuracy", **attrs, "encoder": family}.items():
        study.set_user_attr(key, value)
    for index, (params, value) in enumerate(rows):
        study.enqueue_trial(params, user_attrs={"recommended": True} if index == 0 else {})
        trial = study.ask()
        suggest_config(trial, family)
        if value is None:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, value)
    optuna.copy_study(from_study_name=name, from_storage=memory, to_storage=url)


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('recommend') / 'studies.db'}"
    problems = {
        "small": [("minilm-l6", 384), ("smollm2-135m", 576)],
        "large": [("meta-llama/Meta-Llama-3-8B", 4096), ("my-lab/custom-7b", 4096)],
    }  # proxy: hidden > 3000
    for bucket, models in problems.items():
        effects = SMALL_EFFECTS if bucket == "small" else LARGE_EFFECTS
        for (model, hidden), (k, task) in itertools.product(models, enumerate(["trec", "emotion"])):
            # tasks differ in level and spread; the order of the effects is the same
            rows = [(p, score(p, effects, scale=0.1 * (k + 1), offset=0.3 + 0.2 * k)) for p in graph_grid()]
            if bucket == "small" and model == "minilm-l6" and task == "trec":
                # the best trial of one study, at a level no other study tried: coverage 1/4 < 1/2, so it
                # must not win lr (a rule without the coverage condition would pick 3e-3)
                rows.append(({"conv_type": "gcn", "hidden_dim": 128, "lr": 3e-3, **FIXED}, 5.0))
            attrs = {"model": model, "task": task, "hidden_size": hidden}
            add_study(url, f"{model}:{task}:cayley", attrs, "cayley", rows)
    for task in ["trec", "emotion"]:
        rows = [
            (
                {
                    "hidden_dim": h,
                    "pre_pooling_layers": 1,
                    "post_pooling_layers": 1,
                    "pooling": "sum",
                    "dropout": 0.2,
                    "lr": lr,
                    "weight_decay": 1e-5,
                },
                {512: 0.2, 256: 0.1, 128: 0.0}[h] + {3e-4: 0.3, 1e-3: 0.1, 1e-5: 0.0}[lr],
            )
            for h, lr in itertools.product([128, 256, 512], [1e-5, 3e-4, 1e-3])
        ]
        add_study(
            url, f"minilm-l6:{task}:deepset", {"model": "minilm-l6", "task": task, "hidden_size": 384}, "deepset", rows
        )
    # not used: a baseline, a study with one trial, a study that ilge-search did not create
    add_study(
        url,
        "minilm-l6:trec:last-layer",
        {"model": "minilm-l6", "task": "trec", "hidden_size": 384},
        "last-layer",
        [({"lr": 1e-3, "weight_decay": 1e-4}, 0.5), ({"lr": 1e-2, "weight_decay": 1e-4}, 0.9)],
    )
    add_study(
        url,
        "smollm2-135m:sst2:fc",
        {"model": "smollm2-135m", "task": "sst2", "hidden_size": 576},
        "fc",
        [({"conv_type": "gcn", "hidden_dim": 512, "lr": 1e-3, **FIXED}, 0.7)],
    )
    foreign = optuna.create_study(study_name="foreign", storage=url)
    foreign.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    return url


def test_normalised_ranks_average_ties_and_put_pruned_last():
    assert normalised_ranks([0.9, 0.5, 0.7]) == [1.0, 0.0, 0.5]
    assert normalised_ranks([0.9, 0.5, 0.7], maximize=False) == [0.0, 1.0, 0.5]
    # ties share the mean of their ranks (2 and 3 of 4 -> 2.5 -> q = 0.5)
    assert normalised_ranks([0.1, 0.6, 0.6, 0.8]) == [0.0, 0.5, 0.5, 1.0]
    # two pruned trials tie below the complete ones (ranks 1 and 2 -> 1.5 -> q = 1/6)
    assert normalised_ranks([None, 0.2, None, 0.3]) == pytest.approx([1 / 6, 2 / 3, 1 / 6, 1.0])
    with pytest.raises(ValueError, match="at least two"):
        normalised_ranks([0.4])


def test_model_size_buckets():
    assert model_size_bucket("minilm-l6") == model_size_bucket("smollm2-135m") == "small"
    assert model_size_bucket("EleutherAI/pythia-410m") == "small"
    assert model_size_bucket("google/gemma-2-2b") == "small"  # between 1B and 3B: small, as the runner does
    assert model_size_bucket("meta-llama/Meta-Llama-3-8B") == "large"
    assert model_size_bucket("/models/Meta-Llama-3-8B") == "large"  # a local folder named after the model
    assert model_size_bucket("Qwen/Qwen3-4B") == "large"
    assert model_num_params("sentence-transformers/all-MiniLM-L6-v2") == pytest.approx(22.7e6)
    assert model_size_bucket("someone/unknown", hidden_size=4096) == "large"
    assert model_size_bucket("someone/unknown", hidden_size=768) == "small"
    with pytest.raises(ValueError, match="hidden_size"):
        model_size_bucket("someone/unknown")


def test_recommend_recovers_the_known_best_configuration(storage_url, tmp_path):
    out, md = tmp_path / "defaults.json", tmp_path / "defaults.md"
    data = recommend_defaults(storage_url, out, md)
    families = data["families"]
    # small: gcn (so no gin_mlp_layers/gat_heads), width 128, lr 1e-2; the unvaried fields keep their one level
    assert families["cayley"]["small"] == {"conv_type": "gcn", "hidden_dim": 128, "lr": 1e-2, **FIXED}
    # large: gat with 8 heads, width 512, lr 1e-4; four studies (one bucketed by the hidden-size proxy)
    assert families["cayley"]["large"] == {"conv_type": "gat", "hidden_dim": 512, "lr": 1e-4, "gat_heads": 8, **FIXED}
    assert families["deepset"] == {
        "small": {
            "hidden_dim": 512,
            "lr": 3e-4,
            "pre_pooling_layers": 1,
            "post_pooling_layers": 1,
            "pooling": "sum",
            "dropout": 0.2,
            "weight_decay": 1e-5,
        }
    }
    assert "fc" not in families and "last-layer" not in families
    studies = data["metadata"]["studies"]
    assert sorted(studies) == ["cayley/large", "cayley/small", "deepset/small"]
    assert "my-lab/custom-7b:emotion:cayley" in studies["cayley/large"]
    assert any(s.startswith("smollm2-135m:sst2:fc") for s in data["metadata"]["skipped"])
    assert json.loads(out.read_text()) == data


def test_recommended_config_reads_the_written_file(storage_url, tmp_path, monkeypatch):
    out = tmp_path / "defaults.json"
    recommend_defaults(storage_url, out, None)
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", out)
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "no-user-file.json"))  # no user file on top
    small = recommended_config("cayley", "small", source="regenerated")
    assert (small.conv_type, small.hidden_dim, small.lr, small.dropout) == ("gcn", 128, 1e-2, 0.1)
    large = recommended_config("cayley", "large", source="regenerated")
    assert (large.conv_type, large.gat_heads, large.hidden_dim, large.lr) == ("gat", 8, 512, 1e-4)
    assert recommended_config("deepset", "small", source="regenerated").hidden_dim == 512
    # no deepset studies of large models, no fc studies: the built-in values stay
    assert recommended_config("deepset", "large", source="regenerated").lr == builtin_start("deepset", "large")["lr"]
    assert recommended_config("fc", "small", source="regenerated").lr == builtin_start("fc", "small")["lr"]


def test_defaults_markdown_has_the_table_and_the_evidence(storage_url, tmp_path):
    md = tmp_path / "reports" / "defaults.md"
    recommend_defaults(storage_url, tmp_path / "d.json", md)
    text = md.read_text()
    assert text.startswith("# Defaults by model size")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "conv_type=gcn" in rows["cayley"] and "hidden_dim=128" in rows["cayley"] and "lr=0.01" in rows["cayley"]
    assert "conv_type=gat" in rows["cayley"] and "gat_heads=8" in rows["cayley"]
    assert "*built-in*" in rows["fc"]
    assert "### cayley, small" in text and "4 studies" in text
    # the lr level 3e-3 was tried in 1 of 4 small studies only: shown in no row as the winner
    lr_row = next(line for line in text.split("### cayley, small")[1].splitlines() if line.startswith("| lr "))
    assert "| lr | 0.01 |" in lr_row and "4/4" in lr_row


def test_recommend_cli_and_errors(storage_url, tmp_path):
    out, md = tmp_path / "cli.json", tmp_path / "cli.md"
    result = CliRunner().invoke(
        cli, ["recommend", "--storage", storage_url, "--out", str(out), "--report", str(md), "--family", "deepset"]
    )
    assert result.exit_code == 0, result.output
    line = [row for row in result.output.splitlines() if row.startswith("deepset")]
    assert len(line) == 1 and line[0].split()[:2] == ["deepset", "small"] and "hidden_dim=512" in line[0]
    assert list(json.loads(out.read_text())["families"]) == ["deepset"]
    missing = CliRunner().invoke(
        cli, ["recommend", "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--out", str(tmp_path / "new.json")]
    )  # a fresh --out: an existing one is refused before the storage is opened
    assert missing.exit_code != 0 and "no study storage" in missing.output
    assert not (tmp_path / "none.db").exists()
    with pytest.raises(ValueError, match="no fc study"):
        recommend_defaults(storage_url, tmp_path / "x.json", None, families=["fc"])
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(ValueError, match="unknown families"):
        recommend_defaults(storage_url, tmp_path / "x.json", None, families=["gnn"])


# ----------------------------------------------------------------------------- --exclude-task


@pytest.fixture(scope="module")
def one_task_decides_url(tmp_path_factory):
    """trec's studies favour hidden_dim 512 strongly; the other tasks are indifferent to it (every level ties,
    so the built-in 256 wins the tie). All tasks agree on lr 1e-2; every trial is a GCN."""
    url = f"sqlite:///{tmp_path_factory.mktemp('exclude') / 'studies.db'}"
    indifferent = {**SMALL_EFFECTS, "hidden_dim": {128: 0.0, 256: 0.0, 512: 0.0}}
    decisive = {**SMALL_EFFECTS, "hidden_dim": {128: 0.0, 256: 0.0, 512: 2.0}}
    for model, hidden in [("minilm-l6", 384), ("smollm2-135m", 576)]:
        for task in ["trec", "emotion", "sst2"]:
            effects = decisive if task == "trec" else indifferent
            rows = [(p, score(p, effects, scale=0.1, offset=0.3)) for p in graph_grid() if p["conv_type"] == "gcn"]
            add_study(
                url, f"{model}:{task}:cayley", {"model": model, "task": task, "hidden_size": hidden}, "cayley", rows
            )
    return url


def test_exclude_task_leaves_out_exactly_the_named_tasks_studies(one_task_decides_url, tmp_path):
    every = recommend_defaults(one_task_decides_url, tmp_path / "all.json", None)
    assert every["families"]["cayley"]["small"]["hidden_dim"] == 512  # trec's studies decide it
    without = recommend_defaults(
        one_task_decides_url, tmp_path / "no-trec.json", tmp_path / "no-trec.md", exclude_tasks=["trec"]
    )
    assert without["families"]["cayley"]["small"]["hidden_dim"] == 256
    assert without["families"]["cayley"]["small"]["conv_type"] == "gcn" and without["metadata"]["excluded_tasks"] == [
        "trec"
    ]
    assert sorted(without["metadata"]["studies"]["cayley/small"]) == sorted(
        f"{m}:{t}:cayley" for m in ("minilm-l6", "smollm2-135m") for t in ("emotion", "sst2")
    )
    assert "Regenerated without the studies of `trec`" in (tmp_path / "no-trec.md").read_text()
    # leaving out a task that does not decide anything changes nothing
    no_sst2 = recommend_defaults(one_task_decides_url, tmp_path / "no-sst2.json", None, exclude_tasks=["sst2"])
    assert no_sst2["families"] == every["families"]

    result = CliRunner().invoke(
        cli,
        ["recommend", "--storage", one_task_decides_url, "--out", str(tmp_path / "cli.json"), "--exclude-task", "trec"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "cli.json").read_text())["families"] == without["families"]
    # a task without studies (a typo) and --exclude-task with --update-shipped are one-line errors, nothing written
    typo = CliRunner().invoke(
        cli,
        [
            "recommend",
            "--storage",
            one_task_decides_url,
            "--out",
            str(tmp_path / "typo.json"),
            "--exclude-task",
            "treck",
        ],
    )
    assert typo.exit_code == 1 and "--exclude-task treck: no cayley/fc/deepset study of that task" in typo.output
    assert "(its tasks: emotion, sst2, trec)" in typo.output and not (tmp_path / "typo.json").exists()
    shipped = CliRunner().invoke(
        cli, ["recommend", "--storage", one_task_decides_url, "--update-shipped", "--exclude-task", "trec"]
    )
    assert shipped.exit_code == 1 and "drop --exclude-task" in shipped.output
    with pytest.raises(ValueError, match="besides those of the excluded tasks"):
        recommend_defaults(
            one_task_decides_url, tmp_path / "none.json", None, exclude_tasks=["trec", "emotion", "sst2"]
        )


def _with_rival_cayley_studies(source_url, tmp_path, suffix, attrs):
    """Defaults before and after adding, to a copy of ``source_url``, a Cayley study per model and task (name
    ``...:cayley:<suffix>``, extra user ``attrs``) whose trials would pull hidden_dim to 128 if they voted."""
    import shutil

    copy = tmp_path / "studies.db"
    shutil.copyfile(source_url.removeprefix("sqlite:///"), copy)
    url = f"sqlite:///{copy}"
    before = recommend_defaults(url, tmp_path / "before.json", None)
    small = {"hidden_dim": {128: 0.9, 256: 0.0, 512: 0.0}}
    for model, hidden in (("minilm-l6", 384), ("smollm2-135m", 576)):
        for task in ("emotion", "sst2", "trec"):
            rows = [(p, score(p, small, scale=1.0, offset=0.1)) for p in graph_grid() if p["conv_type"] == "gcn"]
            add_study(
                url,
                f"{model}:{task}:cayley:{suffix}",
                {"model": model, "task": task, "hidden_size": hidden, **attrs},
                "cayley",
                rows,
            )
    return before, recommend_defaults(url, tmp_path / "after.json", None)


def test_few_shot_studies_do_not_vote(one_task_decides_url, tmp_path):
    before, after = _with_rival_cayley_studies(one_task_decides_url, tmp_path, "8shot", {"shots": 8})
    assert after["families"] == before["families"] and before["families"]["cayley"]["small"]["hidden_dim"] == 512
    assert (
        "minilm-l6:trec:cayley:8shot: a few-shot study (8 per label); defaults come from searches on whole "
        "training subsets" in after["metadata"]["skipped"]
    )


def test_a_paper_sibling_of_a_study_stored_before_objectives_is_counted_once(one_task_decides_url, tmp_path):
    """The matched studies here predate the ``objectives`` attr; their paper-protocol siblings store
    ``["score"]``. Both search the same thing, so the siblings must not vote a second time."""
    before, after = _with_rival_cayley_studies(
        one_task_decides_url, tmp_path, "paper", {"objectives": ["score"], "protocol": "paper", "samples_per_label": 8}
    )
    assert after["families"] == before["families"]
    assert (
        "minilm-l6:trec:cayley:paper: the same search as its matched-protocol study, counted once"
        in after["metadata"]["skipped"]
    )
