"""The auto measurement page: an auto study's chosen model against the best single-layer probe (from its
leaderboard) and the per-method studies of the same problem in another storage, one section per grid file, where
each study's time went and how runs under a time limit kept it."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pandas as pd
import pytest

from ilge_search import run_study
from ilge_search.record import RunTimes, leaderboard_record, run_times, save_run_times
from ilge_search.report.auto import AutoPage, auto_frame, auto_sentences, write_auto_page
from ilge_search.report.auto_times import grid_description, has_timed_run, study_times
from ilge_search.storage import open_storage
from ilge_search.study import StudyOptions
from ilge_search.study.leaderboard import export_choice
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=240, max_eval=100)


def _options(synthetic, **more):
    flat = dict(
        final_seeds=2,
        max_epochs=3,
        seed=0,
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        threads=1,
        progress=False,
        **DATA,
    )
    return StudyOptions.from_flat(**{**flat, **more})


@pytest.fixture(scope="module")
def storages(synthetic, tmp_path_factory):
    folder = tmp_path_factory.mktemp("auto-page")
    synthetic.cache("trec", **DATA)
    auto, per_method = f"sqlite:///{folder / 'auto.db'}", f"sqlite:///{folder / 'methods.db'}"
    with refuse_model_loads():
        run_study(
            synthetic.model,
            "trec",
            "auto",
            storage=auto,
            options=_options(synthetic, n_trials=4, methods="last-layer,fc"),
        )
        run_study(synthetic.model, "trec", "last-layer", storage=per_method, options=_options(synthetic, n_trials=1))
        run_study(synthetic.model, "trec", "cayley", storage=per_method, options=_options(synthetic, n_trials=3))
    return folder, auto, per_method


def _study(url):
    storage = open_storage(url)
    return storage.existing_study(storage.study_summaries()[0].study_name)


def _grid(synthetic, path, tasks, methods='["last-layer", "fc"]'):
    tables = "\n".join(f"[tasks.{task}]" for task in tasks)
    path.write_text(
        f'models = ["{synthetic.model}"]\nencoders = ["auto"]\nmethods = {methods}\nfinal_seeds = 2\n'
        "max_epochs = 3\nmax_train = 240\nmax_eval = 100\nworkers = 1\nthreads = 1\n\n"
        f"[trials]\nauto = 4\n\n{tables}\n",
        encoding="utf-8",
    )
    return path


def test_the_page_compares_the_chosen_model_with_the_probe_and_the_per_method_studies(storages, tmp_path):
    _, auto, per_method = storages
    frame = auto_frame(auto, [per_method])
    assert len(frame) == 1
    row = frame.iloc[0]
    study = _study(auto)
    board, (ensemble, _) = leaderboard_record(study), export_choice(study)
    chosen = board.row("ensemble" if ensemble else "selected")
    assert row["chosen"] == ("ensemble" if ensemble else chosen.name) and row["kind"] == "sentence"
    assert row["auto"] == pytest.approx(chosen.test_mean * 100)
    assert row["vs_best_layer"] == pytest.approx(row["auto"] - row["best_layer"])
    assert row["ci_low"] <= row["vs_best_layer"] <= row["ci_high"]
    # the per-method studies of the same problem and data setting, by name; the last layer from its study
    assert not math.isnan(row["last_layer"]) and not math.isnan(row["cayley"]) and not row["last_layer_from_auto"]
    assert row["best_study"] == max(row["last_layer"], row["cayley"])
    # Cayley's ensemble, paired per seed with the chosen model: a t interval over the two final seeds
    assert row["cayley_ensemble_k"] >= 1 and not math.isnan(row["cayley_ensemble"])
    assert row["vs_cayley_ensemble"] == pytest.approx(row["auto"] - row["cayley_ensemble"])
    assert row["cayley_ci_low"] <= row["vs_cayley_ensemble"] <= row["cayley_ci_high"]
    lines = auto_sentences(frame)
    # one problem: its difference, and no interval over problems (a bootstrap of one value is a point)
    assert f"on its one problem: {row['vs_best_layer']:+.2f} points (no interval" in lines[0]
    assert "Auto minus Cayley's ensemble" in lines[1] and "bootstrap over problems" not in "".join(lines)
    assert "Against the best per-method study" in lines[2] and "(among cayley, last-layer)" in lines[2]
    shifted = frame.assign(vs_best_layer=frame["vs_best_layer"] + 1.0)
    two = auto_sentences(pd.concat([frame, shifted], ignore_index=True))
    assert "mean over 2 problems:" in two[0] and "(bootstrap over problems)" in two[0]
    page = write_auto_page(AutoPage(auto, [per_method]), tmp_path / "auto").read_text()
    assert "| model | task | setting | chosen |" in page and f"{row['vs_best_layer']:+.2f}" in page
    assert "auto - cayley ens. [95% CI, seeds]" in page
    with pytest.raises(ValueError, match="exists"):
        write_auto_page(AutoPage(auto, [per_method]), tmp_path / "auto")


def test_without_a_per_method_last_layer_study_the_auto_studys_own_row_is_shown_and_marked(storages, tmp_path):
    auto = storages[1]
    row = auto_frame(auto, []).iloc[0]
    own = next(r for r in leaderboard_record(_study(auto)).rows if r.name == "last-layer")
    assert row["last_layer_from_auto"] and row["last_layer"] == pytest.approx(own.test_mean * 100)
    assert math.isnan(row["cayley"]) and row["best_study_encoder"] == ""
    page = write_auto_page(AutoPage(auto, []), tmp_path / "auto").read_text()
    assert f"{row['last_layer']:.2f}†" in page and "†: no per-method last-layer study" in page


def test_each_grid_is_a_section_described_from_its_file_and_a_grid_not_run_says_so(storages, synthetic, tmp_path):
    _, auto, per_method = storages
    ran = _grid(synthetic, tmp_path / "auto-small.toml", ["trec"])
    pending = _grid(synthetic, tmp_path / "auto-later.toml", ["emotion", "sst2"])
    title, paragraph, names = grid_description(ran)
    assert names == [_study(auto).study_name] and title == "trec at 240 texts"
    for said in ("240 training texts, 100 validation and 100 test texts", "epochs capped at 3", "4 trials per study"):
        assert said in paragraph
    assert "methods: last-layer, fc" in paragraph and "final seeds 1000-1001" in paragraph
    page = write_auto_page(AutoPage(auto, [per_method], [ran, pending]), tmp_path / "auto").read_text()
    first, later = page.index("## trec at 240 texts"), page.index("## emotion, sst2 at 240 texts")
    assert first < page.index("| model | task |") < later
    assert "Not measured yet: no study of this grid" in page[later:]


def test_the_time_section_shows_each_stage_and_an_older_study_its_search_span(storages, tmp_path):
    folder, auto, per_method = storages
    times = study_times(_study(auto))
    (run,) = run_times(_study(auto))
    assert times["runs"] == 1 and not times["estimated"] and times["search"] == pytest.approx(run.search)
    assert all(times[stage] == pytest.approx(run.stages[stage]) for stage in ("final", "ensemble", "leaderboard"))
    page = write_auto_page(AutoPage(auto, [per_method]), tmp_path / "auto").read_text()
    section = page[page.index("## Where the time goes") :]
    assert "| before search | search | final | ensemble | leaderboard | run | after search |" in section
    assert f"| {times['leaderboard']:,.0f} | {times['total']:,.0f} |" in section
    assert "Over the 1 study with recorded times, the stages after the search took" in section
    # a study stored before runs recorded their times: its search from the trials' stamps, nothing else
    older = tmp_path / "older.db"
    shutil.copyfile(folder / "auto.db", older)
    study = _study(f"sqlite:///{older}")
    study.set_user_attr(RunTimes.ATTR, [])
    times = study_times(study)
    assert times["estimated"] and times["search"] > 0 and times["final"] is None and times["total"] is None


def test_runs_under_a_time_limit_show_elapsed_over_limit_and_what_stopped_them(storages, tmp_path):
    folder, auto, per_method = storages
    timed = tmp_path / "timed.db"
    url = f"sqlite:///{timed}"
    assert not has_timed_run(url, "anything")  # no storage yet
    page = write_auto_page(AutoPage(auto, [per_method], timed_url=url), tmp_path / "auto").read_text()
    assert "## Runs under a time limit" in page and "Not measured yet: no run under a time limit" in page
    shutil.copyfile(folder / "auto.db", timed)
    study = _study(url)
    assert not has_timed_run(url, study.study_name)  # a run without a limit
    (run,) = run_times(study)
    save_run_times(study, dataclasses.replace(run, time_limit=60.0, limit=60.0, elapsed=63.0, trial_cap=500))
    save_run_times(study, dataclasses.replace(run, time_limit=60.0, limit=60.0, elapsed=70.0, trial_cap=4))
    assert has_timed_run(url, study.study_name)
    page = write_auto_page(AutoPage(auto, [per_method], timed_url=url), tmp_path / "auto2").read_text()
    section = page[page.index("## Runs under a time limit") :]
    assert "| 60 | 63 | 1.050 |" in section and "| time limit |" in section
    assert "| 60 | 70 | 1.167 |" in section and "| trial cap |" in section
    assert "1 of 2 runs ended before 110% of their limit (the target); elapsed / limit from 1.050 to 1.167" in section


def test_a_tagging_auto_study_has_its_own_columns_against_the_per_word_studies(tmp_path):
    """A toy tagging task (a tiny local encoder): the row compares the selected trial (tagging studies have no
    ensemble) with the best single-layer probe per word and the per-method cayley-word study of the same draw."""
    import json

    import numpy as np

    from ilge_search.testing.tiny_models import tiny_encoder

    words = ["the", "a", "fox", "dog", "runs", "jumps", ",", "."]
    tags = {"the": "DET", "a": "DET", "fox": "NOUN", "dog": "NOUN", "runs": "VERB", "jumps": "VERB"}
    task = tmp_path / "pos_toy"
    task.mkdir()
    for split, (count, seed) in {"train": (24, 0), "validation": (8, 1), "test": (8, 2)}.items():
        rng = np.random.default_rng(seed)
        rows = [list(rng.choice(words, size=int(rng.integers(2, 7)))) for _ in range(count)]
        lines = [json.dumps({"tokens": r, "tags": [tags.get(w, "PUNCT") for w in r]}) + "\n" for r in rows]
        (task / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    auto, per_word = f"sqlite:///{tmp_path / 'auto.db'}", f"sqlite:///{tmp_path / 'words.db'}"
    flat = dict(max_epochs=2, final_seeds=2, cache_dir=str(tmp_path / "cache"), progress=False, device="cpu")
    model = str(tiny_encoder(tmp_path / "model"))
    run_study(
        model,
        str(task),
        "auto",
        storage=auto,
        options=StudyOptions.from_flat(n_trials=2, **flat, methods="last-layer,cayley-word"),
    )
    run_study(model, str(task), "cayley-word", storage=per_word, options=StudyOptions.from_flat(n_trials=1, **flat))
    row = auto_frame(auto, [per_word]).iloc[0]
    assert row["kind"] == "tagging" and row["chosen"].startswith("selected (trial ")
    assert not math.isnan(row["cayley_word"]) and row["best_study_encoder"] == "cayley-word"
    assert math.isnan(row["cayley_ensemble"]) and row["last_layer_from_auto"]  # no per-method last-layer study
    page = write_auto_page(AutoPage(auto, [per_word]), tmp_path / "auto").read_text()
    assert "| last layer | cayley-word | best study |" in page and "cayley ens." not in page
    assert "paired over test words and seeds" in page
