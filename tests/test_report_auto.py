"""The auto measurement page: an auto study's chosen model against the best single-layer probe (from its
leaderboard) and the per-method studies of the same problem in another storage."""

from __future__ import annotations

import math

import pytest

from ilge_search import run_study
from ilge_search.record import leaderboard_record
from ilge_search.report.auto import auto_frame, auto_sentences, write_auto_page
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


@pytest.fixture
def storages(synthetic, tmp_path):
    synthetic.cache("trec", **DATA)
    auto, per_method = f"sqlite:///{tmp_path / 'auto.db'}", f"sqlite:///{tmp_path / 'methods.db'}"
    with refuse_model_loads():
        run_study(
            synthetic.model,
            "trec",
            "auto",
            storage=auto,
            options=_options(synthetic, n_trials=4, methods="last-layer,fc"),
        )
        run_study(
            synthetic.model,
            "trec",
            ["last-layer", "cayley"],
            storage=per_method,
            options=_options(synthetic, n_trials=1),
        )
    return auto, per_method


def test_the_page_compares_the_chosen_model_with_the_probe_and_the_per_method_studies(storages, tmp_path):
    auto, per_method = storages
    frame = auto_frame(auto, [per_method])
    assert len(frame) == 1
    row = frame.iloc[0]
    study = open_storage(auto).existing_study(open_storage(auto).study_summaries()[0].study_name)
    board, (ensemble, _) = leaderboard_record(study), export_choice(study)
    chosen = board.row("ensemble" if ensemble else "selected")
    assert row["chosen"] == ("ensemble" if ensemble else chosen.name)
    assert row["auto"] == pytest.approx(chosen.test_mean * 100)
    assert row["vs_best_layer"] == pytest.approx(row["auto"] - row["best_layer"])
    assert row["ci_low"] <= row["vs_best_layer"] <= row["ci_high"]
    # the per-method studies of the same problem and data setting, by name
    assert not math.isnan(row["last_layer"]) and not math.isnan(row["cayley"])
    assert row["best_study"] == max(row["last_layer"], row["cayley"])
    lines = auto_sentences(frame)
    assert "mean over 1 problems" in lines[0] and "Against the best per-method study" in lines[1]
    page = write_auto_page(auto, [per_method], tmp_path / "auto").read_text()
    assert "| model | task | setting | chosen |" in page and f"{row['vs_best_layer']:+.2f}" in page
    with pytest.raises(ValueError, match="exists"):
        write_auto_page(auto, [per_method], tmp_path / "auto")
