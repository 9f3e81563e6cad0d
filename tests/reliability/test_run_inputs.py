"""What `run` says about its inputs: which defaults file its starting configuration came from, and the
column options custom task files need (on the synthetic setup: no language model loads)."""

from __future__ import annotations

import logging
import shutil

import optuna
from reliability_helpers import sqlite_url

from ilge_search.study import StudyOptions, run_study
from ilge_search.testing import refuse_model_loads
from ilge_search.tuning import RECOMMENDED_DEFAULTS_PATH

DATA = dict(max_train=240, max_eval=100, max_epochs=2)


def options(synthetic, **flat) -> StudyOptions:
    return StudyOptions.from_flat(
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        progress=False,
        threads=1,
        n_trials=1,
        final_seeds=0,
        **DATA,
        **flat,
    )


def test_a_user_defaults_file_is_named_in_one_line(synthetic, tmp_path, monkeypatch, caplog):
    synthetic.cache("trec", max_train=240, max_eval=100)
    url = sqlite_url(tmp_path / "s.db")
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "none.json"))
    with caplog.at_level(logging.WARNING), refuse_model_loads():
        run_study(synthetic.model, "trec", "deepset", storage=url, options=options(synthetic))
    assert not [r for r in caplog.records if "user defaults file" in r.getMessage()]  # the shipped ones: silent

    user = tmp_path / "mine.json"
    shutil.copyfile(RECOMMENDED_DEFAULTS_PATH, user)
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(user))
    caplog.clear()
    with caplog.at_level(logging.WARNING), refuse_model_loads():
        run_study(synthetic.model, "trec", "deepset", storage=url, options=options(synthetic))
    (line,) = [r.getMessage() for r in caplog.records if "user defaults file" in r.getMessage()]
    assert f"read from the user defaults file {user} over the shipped defaults" in line and "\n" not in line
    assert len(optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url).trials) == 2
