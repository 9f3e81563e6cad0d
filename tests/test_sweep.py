"""Sweep grids: parsing the shipped files, errors that name the key, and a tiny real sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from ilge_search.study import SweepFilter, SweepRuntime, load_sweep, plan_sweep, resolve_encoders, run_sweep

SEQUENCE_ENCODERS = resolve_encoders("all")  # "all" of a text task: the tagging-only encoders are not in it

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "grid.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_paper_grid_has_three_models_thirteen_tasks_and_paper_budgets():
    sweep = load_sweep(REPO / "studies" / "paper.toml")
    models = sorted({e.model for e in sweep.entries})
    assert models == ["EleutherAI/pythia-410m", "google/gemma-2-2b", "meta-llama/Meta-Llama-3-8B"]
    trained = sorted({e.task for e in sweep.entries})
    zero_shot = sorted({name for e in sweep.entries for name in e.zero_shot})
    assert len(trained) + len(zero_shot) == 13
    assert zero_shot == ["biosses", "sick_r", "sts12", "sts13", "sts14", "sts15", "sts16"]
    assert len(sweep.entries) == 3 * len(trained) * len(SEQUENCE_ENCODERS)
    budget = {e.encoder: e.n_trials for e in sweep.entries if e.task == "banking77"}
    assert (budget["cayley"], budget["fc"], budget["deepset"], budget["mlp-last"], budget["scalar-mix"]) == (
        100,
        100,
        100,
        100,
        50,
    )
    assert {e.max_epochs for e in sweep.entries if e.task == "stsb"} == {25}


def test_offline_grid_covers_both_offline_models_six_tasks_every_method():
    sweep = load_sweep(REPO / "studies" / "offline.toml")
    assert sorted({e.model for e in sweep.entries}) == ["minilm-l6", "smollm2-135m"]
    assert sorted({e.task for e in sweep.entries}) == sorted(
        ["banking77", "emotion", "trec", "sst2", "tweeteval_emotion", "stsb"]
    )
    assert len(sweep.entries) == 2 * 6 * len(SEQUENCE_ENCODERS)
    assert sweep.final_seeds >= 3
    assert all(e.n_trials > 0 for e in sweep.entries)


def test_budgets_defaults_and_task_overrides(tmp_path):
    path = write(
        tmp_path,
        """
models = ["minilm-l6"]
encoders = ["cayley", "last-layer"]
max_train = 500
[trials]
default = 7
last-layer = 2
[tasks.trec]
[tasks.sst2]
max_train = 100
shots = 4
trials = { cayley = 3 }
""",
    )
    sweep = load_sweep(path)
    got = {(e.task, e.encoder): (e.n_trials, e.max_train, e.shots) for e in sweep.entries}
    assert got == {
        ("trec", "cayley"): (7, 500, None),
        ("trec", "last-layer"): (2, 500, None),
        ("sst2", "cayley"): (3, 100, 4),
        ("sst2", "last-layer"): (2, 100, 4),
    }
    assert (
        sweep.name == "grid"
        and sweep.storage is None
        and sweep.pairs() == [("minilm-l6", "trec"), ("minilm-l6", "sst2")]
    )


def test_a_shots_list_expands_to_one_study_per_count_and_full(tmp_path):
    path = write(
        tmp_path,
        """
models = ["minilm-l6"]
encoders = ["cayley", "last-layer"]
max_train = 500
max_eval = 400
shots = [8, 16, "full"]
[trials]
default = 2
[tasks.trec]
[tasks.sst2]
shots = 32
[tasks.emotion]
shots = ["full", 64]
""",
    )
    sweep = load_sweep(path)
    got = [(e.task, e.shots, e.encoder) for e in sweep.entries]
    assert got == [
        ("trec", 8, "cayley"),
        ("trec", 8, "last-layer"),
        ("trec", 16, "cayley"),
        ("trec", 16, "last-layer"),
        ("trec", None, "cayley"),
        ("trec", None, "last-layer"),
        ("sst2", 32, "cayley"),
        ("sst2", 32, "last-layer"),
        ("emotion", None, "cayley"),
        ("emotion", None, "last-layer"),
        ("emotion", 64, "cayley"),
        ("emotion", 64, "last-layer"),
    ]
    names = [e.study_name for e in sweep.entries if e.task == "trec" and e.encoder == "cayley"]
    assert names == [
        "minilm-l6:trec:cayley:8shot:train500:eval400",
        "minilm-l6:trec:cayley:16shot:train500:eval400",
        "minilm-l6:trec:cayley:train500:eval400",
    ]  # "full" is the study a grid without shots makes
    assert len({e.study_name for e in sweep.entries}) == len(sweep.entries)
    assert sweep.pairs() == [("minilm-l6", "trec"), ("minilm-l6", "sst2"), ("minilm-l6", "emotion")]
    # each count is its own study identity, run by its own run_study call
    from ilge_search.study.identity import run_identity

    options = sweep.study_options()
    identities = {
        e.shots: run_identity(
            e.model, e.task, e.encoder, options.replace(shots=e.shots, max_train=e.max_train)
        ).to_attrs()
        for e in sweep.entries
        if e.task == "trec" and e.encoder == "cayley"
    }
    assert [identities[s]["shots"] for s in (8, 16, None)] == [8, 16, None]


def test_old_grids_keep_their_studies(tmp_path):
    """A single count (or none) gives exactly the entries and names it gave before shots lists existed."""
    path = write(
        tmp_path,
        """
models = ["minilm-l6"]
encoders = ["cayley"]
shots = 8
[trials]
default = 2
[tasks.trec]
[tasks.sst2]
shots = 4
""",
    )
    assert [e.study_name for e in load_sweep(path).entries] == [
        "minilm-l6:trec:cayley:8shot",
        "minilm-l6:sst2:cayley:4shot",
    ]
    offline = load_sweep(REPO / "studies" / "offline.toml")
    assert {e.shots for e in offline.entries} == {None}
    assert "minilm-l6:trec:cayley:train500:eval400:ep10" in {e.study_name for e in offline.entries}


def test_the_fewshot_grid_shares_the_offline_grids_full_data_studies():
    fewshot = load_sweep(REPO / "studies" / "fewshot.toml")
    offline = load_sweep(REPO / "studies" / "offline.toml")
    assert fewshot.storage == offline.storage and fewshot.final_seeds >= 3
    assert sorted({e.model for e in fewshot.entries}) == ["minilm-l6", "smollm2-135m"]
    assert {e.shots for e in fewshot.entries} == {8, 16, 32, 64, None}
    assert {e.encoder for e in fewshot.entries} == {"cayley", "last-layer", "best-layer"}
    full = {e.study_name for e in fewshot.entries if e.shots is None}
    assert full <= {e.study_name for e in offline.entries}  # the full points are the offline grid's studies


@pytest.mark.parametrize(
    "text, message",
    [
        ('models = ["m"]\ncolour = 1\n[trials]\ndefault = 1\n[tasks.trec]\n', "unknown key(s) ['colour']"),
        ('models = ["m"]\nencoders = ["cayley"]\n[tasks.trec]\n', "no trial budget for encoder 'cayley'"),
        ('models = ["m"]\nsampler = "cmaes"\n[trials]\ndefault = 1\n[tasks.trec]\n', "unknown sampler 'cmaes'"),
        ('models = ["m"]\nencoders = ["gnn"]\n[trials]\ndefault = 1\n[tasks.trec]\n', "unknown encoder 'gnn'"),
        ('models = ["m"]\n[trials]\ndefault = 1\n[tasks.no_such_task]\n', "unknown task 'no_such_task'"),
        ('models = ["m"]\n[trials]\ndefault = 1\n[tasks.trec]\nmax_train = 0\n', "max_train must be an integer >= 1"),
        (
            'models = ["m"]\n[trials]\ndefault = 1\n[tasks.trec]\nepochs = 3\n',
            "[tasks.trec]: unknown key(s) ['epochs']",
        ),
        ("models = []\n[trials]\ndefault = 1\n[tasks.trec]\n", "models must be a non-empty list"),
        ('models = ["m"]\n[trials]\ndefault = 1\n', "no tasks"),
        (
            'models = ["m"]\nstorage = "studies.db"\n[trials]\ndefault = 1\n[tasks.trec]\n',
            "storage must be a database URL",
        ),
        ('models = ["m"\n', "not valid TOML"),
        ('models = ["m"]\nshots = "full"\n[trials]\ndefault = 1\n[tasks.trec]\n', "shots must be a count >= 1"),
        ('models = ["m"]\nshots = [8, 0]\n[trials]\ndefault = 1\n[tasks.trec]\n', "shots must be an integer >= 1"),
        ('models = ["m"]\nshots = []\n[trials]\ndefault = 1\n[tasks.trec]\n', "non-empty list of counts"),
        ('models = ["m"]\n[trials]\ndefault = 1\n[tasks.trec]\nshots = [8, 8]\n', "[tasks.trec]: shots lists 8 twice"),
        ('models = ["m"]\n[trials]\ndefault = 1\n[tasks.stsb]\nshots = [8, "full"]\n', "shots needs a classification"),
    ],
)
def test_bad_grids_fail_with_the_key_named(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        load_sweep(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_sweep(tmp_path / "nope.toml")


def test_plan_of_an_empty_storage_has_everything_to_run(tmp_path):
    path = write(
        tmp_path,
        """
models = ["minilm-l6", "smollm2-135m"]
encoders = ["deepset"]
[trials]
default = 4
[tasks.trec]
""",
    )
    plan = plan_sweep(path, storage=f"sqlite:///{tmp_path / 's.db'}")
    assert list(plan["to_run"]) == [4, 4]
    assert list(plan["finished"]) == [0, 0]
    assert not plan["final_done"].any()


def test_tiny_real_sweep_runs_to_budget_and_a_rerun_adds_nothing(tmp_path, synthetic, no_model_loads):
    import optuna

    synthetic.cache("trec", max_train=200, max_eval=150)  # the sweep's studies read these: no model loads
    data_dir, cache_dir = synthetic.data_dir, synthetic.cache_dir
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    path = write(
        tmp_path,
        f"""
storage = "{storage}"
models = ["{synthetic.model}"]
encoders = ["last-layer", "deepset"]
final_seeds = 2
threads = 1
max_epochs = 5
max_train = 200
max_eval = 150
[trials]
default = 3
last-layer = 2
[tasks.trec]
""",
    )
    results = run_sweep(
        path, runtime=SweepRuntime(data_dir=data_dir, cache_dir=cache_dir, device="cpu", progress=False)
    )
    assert [(r.encoder, r.n_finished) for r in results] == [("last-layer", 2), ("deepset", 3)]
    assert all(len(r.test_scores) == 2 and r.test_mean is not None for r in results)
    plan = plan_sweep(path)
    assert list(plan["to_run"]) == [0, 0] and plan["final_done"].all()

    again = run_sweep(path, runtime=SweepRuntime(data_dir=data_dir, cache_dir=cache_dir, device="cpu", progress=False))
    assert [r.n_finished for r in again] == [2, 3]
    for r in results:
        study = optuna.load_study(study_name=r.study_name, storage=storage)
        assert len(study.trials) == r.n_finished
        assert study.user_attrs["max_train"] == 200 and study.user_attrs["split_sizes"]["train"] == 200

    # a bigger budget tops the study up to it, not by it
    path.write_text(path.read_text().replace("last-layer = 2", "last-layer = 4"))
    topped = run_sweep(
        path,
        runtime=SweepRuntime(data_dir=data_dir, cache_dir=cache_dir, device="cpu", progress=False),
        only=SweepFilter(encoders=["last-layer"]),
    )
    assert [(r.encoder, r.n_finished) for r in topped] == [("last-layer", 4)]

    # a trial in flight in another process (a second sweep on the same storage) counts toward the budget,
    # so the two stop at it together instead of each adding what was missing when it started
    from collections import Counter

    optuna.load_study(study_name=topped[0].study_name, storage=storage).ask()
    path.write_text(path.read_text().replace("last-layer = 4", "last-layer = 6"))
    run_sweep(
        path,
        runtime=SweepRuntime(data_dir=data_dir, cache_dir=cache_dir, device="cpu", progress=False),
        only=SweepFilter(encoders=["last-layer"]),
    )
    states = Counter(t.state.name for t in optuna.load_study(study_name=topped[0].study_name, storage=storage).trials)
    assert states["RUNNING"] == 1 and states["COMPLETE"] + states["PRUNED"] == 5


def test_every_study_option_in_a_studys_identity_is_a_grid_key_at_the_top_and_per_task():
    """A run option that changes a study's identity must be settable in a grid: the identity's fields are
    study options of the same name, and each is a grid key (so a future one cannot be forgotten)."""
    import dataclasses

    from ilge_search.record import Identity
    from ilge_search.study.grid import GRID_KEYS, TASK_KEYS
    from ilge_search.study.options import FLAT_NAMES, IDENTITY_OPTIONS

    identity = {f.name for f in dataclasses.fields(Identity)} - {"model", "task", "encoder"}
    assert identity <= set(FLAT_NAMES), "an identity field without a study option of its name"
    assert set(IDENTITY_OPTIONS) == identity
    assert identity <= GRID_KEYS and identity <= TASK_KEYS
    assert {"warm_start", "word_pooling", "data_seed"} <= identity  # the three grids lacked


# one non-default value per identity option, with the task and encoder it applies to
IDENTITY_VALUES = {
    "shots": ("trec", "cayley", "8", 8),
    "max_train": ("trec", "cayley", "100", 100),
    "max_eval": ("trec", "cayley", "50", 50),
    "max_epochs": ("trec", "cayley", "3", 3),
    "data_seed": ("trec", "cayley", "2", 2),
    "cv": ("trec", "cayley", "3", 3),
    "objectives": ("trec", "cayley", '["score", "params"]', ["score", "params"]),
    "protocol": ("trec", "cayley", '"paper"', "paper"),
    "samples_per_label": ("trec", "cayley", '4\nprotocol = "paper"', 4),
    "word_pooling": ("ud_ewt_pos", "cayley-word", '"mean"', "mean"),
    "warm_start": ("trec", "cayley", "2", 2),
    "methods": ("trec", "auto", '["cayley", "last-layer"]', ["cayley", "last-layer"]),
}


@pytest.mark.parametrize("key", sorted(IDENTITY_VALUES))
@pytest.mark.parametrize("level", ["top", "task"])
def test_each_identity_key_of_a_grid_reaches_the_studys_identity_and_name(tmp_path, key, level):
    from ilge_search.study.identity import default_study_name, run_identity
    from ilge_search.study.options import IDENTITY_OPTIONS as IDENTITY_KEYS

    assert set(IDENTITY_VALUES) == set(IDENTITY_KEYS)
    task, encoder, toml, expected = IDENTITY_VALUES[key]
    setting = f"{key} = {toml}\n"
    top, per_task = (setting, "") if level == "top" else ("", setting)
    path = write(
        tmp_path,
        f'models = ["minilm-l6"]\nencoders = ["{encoder}"]\n{top}[trials]\ndefault = 2\n[tasks.{task}]\n{per_task}',
    )
    (entry,) = load_sweep(path).entries
    options = entry.options(load_sweep(path).study_options(), 2)
    identity = run_identity(entry.model, entry.task, entry.encoder, options, tagging=task == "ud_ewt_pos").to_attrs()
    assert identity[key] == expected
    wanted = {name: identity[name] for name in IDENTITY_KEYS}
    # the sweep looks a study up by the name the runner gives it
    assert entry.study_name == default_study_name(entry.model, entry.task, entry.encoder, **wanted)
    assert entry.study_name != f"minilm-l6:{task}:{encoder}"  # the setting is in the name


def test_warm_start_and_word_pooling_apply_where_they_mean_something(tmp_path):
    path = write(
        tmp_path,
        """
models = ["minilm-l6"]
encoders = ["cayley", "last-layer"]
warm_start = 3
word_pooling = "mean"
[trials]
default = 2
[tasks.trec]
[tasks.ud_ewt_pos]
encoders = ["cayley-word", "last-layer"]
[tasks.sst2]
warm_start = 0
""",
    )
    sweep = load_sweep(path)
    got = {(e.task, e.encoder): (e.warm_start, e.word_pooling) for e in sweep.entries}
    assert got == {
        ("trec", "cayley"): (3, "first"),  # a text task pools no words: the grid's word_pooling is not its
        ("trec", "last-layer"): (0, "first"),  # a baseline has no portfolio to warm-start from
        ("ud_ewt_pos", "cayley-word"): (0, "mean"),
        ("ud_ewt_pos", "last-layer"): (0, "mean"),
        ("sst2", "cayley"): (0, "first"),
        ("sst2", "last-layer"): (0, "first"),
    }
    names = {e.study_name for e in sweep.entries}
    assert {"minilm-l6:trec:cayley:warm3", "minilm-l6:trec:last-layer", "minilm-l6:sst2:cayley"} <= names
    assert "minilm-l6:ud_ewt_pos:cayley-word:mean-words" in names
    # the warm-started and the cold studies of one (model, task) are two run_study calls (two option sets)
    trec = [e.group_key() for e in sweep.entries if e.task == "trec"]
    assert trec[0] != trec[1]


@pytest.mark.parametrize(
    "text, message",
    [
        ('[tasks.trec]\nword_pooling = "mean"\n', "[tasks.trec]: word_pooling applies to tagging tasks"),
        ('word_pooling = "max"\n[tasks.ud_ewt_pos]\n', "word_pooling must be one of ['first', 'mean']"),
        ("warm_start = -1\n[tasks.trec]\n", "warm_start must be an integer >= 0"),
        ('[tasks.trec]\ndata_seed = "a"\n', "data_seed must be an integer"),
    ],
)
def test_bad_identity_keys_name_the_key(tmp_path, text, message):
    if text.startswith("[tasks"):
        text = "[trials]\ndefault = 1\n" + text
    else:
        head, tasks = text.split("[tasks", 1)
        text = head + "[trials]\ndefault = 1\n[tasks" + tasks
    path = write(tmp_path, 'models = ["m"]\n' + text)
    with pytest.raises(ValueError) as info:
        load_sweep(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_the_grids_in_the_docs_load(tmp_path):
    import re

    text = (REPO / "docs" / "transfer.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```toml\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks
    for number, block in enumerate(blocks):
        sweep = load_sweep(write(tmp_path, block, f"doc{number}.toml"))
        assert sweep.entries
    names = {e.study_name for e in load_sweep(tmp_path / "doc0.toml").entries}
    assert "minilm-l6:trec:cayley:train500:warm4" in names and "minilm-l6:trec:last-layer:train500" in names
    assert "minilm-l6:sst2:cayley:train500" in names
