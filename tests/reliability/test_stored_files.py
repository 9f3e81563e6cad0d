"""Stored and shipped inputs are checked when read: a portfolio choice stored by ``ilge-search portfolio``, the
shipped ``data/portfolio.json`` and the recommended-defaults files (the user's and the shipped one). A damaged
one is refused in one line naming the file or study, the member (1-based, with its family) and what to do,
instead of being ignored or failing later with a message that names neither."""

from __future__ import annotations

import json

import pytest
from reliability_helpers import labelled, one_line_error, refused_run, sqlite_url, write_task

from ilge_search.defaults.portfolio import portfolio_study
from ilge_search.encoders.configs import CayleyConfig
from ilge_search.record import load_shipped_portfolio, save_portfolio_choice
from ilge_search.record import portfolio as record_portfolio
from ilge_search.storage import open_storage
from ilge_search.study.trial import warm_start_params

GOOD = CayleyConfig(lr=3e-4, gnn_layers=2, hidden_dim=128).to_dict()
PROVENANCE = {"source": "s", "family": "cayley", "bucket": "small", "problems": [], "chosen_on": "validation"}


def _portfolio_study(tmp_path):
    url = sqlite_url(tmp_path / "p.db")
    storage = open_storage(url)
    study = portfolio_study(storage, "cayley", "small", create=True)
    return storage, study


def _warm_start(storage):
    return warm_start_params(storage, "cayley", 1, hidden_size=384, model="minilm-l6", task="trec")


def test_a_garbage_stored_choice_is_refused_naming_the_storage_and_study(tmp_path):
    storage, study = _portfolio_study(tmp_path)
    study.set_user_attr("portfolio_choice", "garbage")  # before: ignored, the shipped portfolio used instead
    with pytest.raises(ValueError) as caught:
        _warm_start(storage)
    message = str(caught.value)
    assert storage.shown_url in message and "ilge-portfolio:cayley:small" in message
    assert "not a portfolio choice" in message and "rerun `ilge-search portfolio`" in message


@pytest.mark.parametrize(
    "bad, expected",
    [
        ({"conv_type": "transformer"}, "member 2 (cayley): conv_type must be one of"),
        ({"lr": -5}, "member 2 (cayley): lr must be > 0, got -5"),
        ({"hidden_dim": -7}, "member 2 (cayley): hidden_dim"),
    ],
)
def test_bad_values_in_a_stored_choice_name_the_study_and_the_member(tmp_path, bad, expected):
    storage, study = _portfolio_study(tmp_path)
    save_portfolio_choice(study, {"portfolio": [GOOD, {**GOOD, **bad}], "warm_start": [GOOD], "problems": []})
    with pytest.raises(ValueError) as caught:
        _warm_start(storage)
    message = str(caught.value)
    assert expected in message and "ilge-portfolio:cayley:small" in message, message
    assert "\n" not in message


def test_bad_values_in_the_shipped_portfolio_name_the_file_and_the_member(tmp_path, monkeypatch):
    path = tmp_path / "portfolio.json"
    entry = {"members": [GOOD, {**GOOD, "hidden_dim": -7}], "provenance": PROVENANCE}
    path.write_text(json.dumps({"format_version": 1, "families": {"cayley": {"small": entry}}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"families\.cayley\.small: member 2 \(cayley\): hidden_dim") as caught:
        load_shipped_portfolio(path)
    assert str(path) in str(caught.value)

    monkeypatch.setattr(record_portfolio, "SHIPPED_PORTFOLIO_PATH", path)  # what a warm start reads
    with pytest.raises(ValueError, match=r"member 2 \(cayley\)"):
        warm_start_params(None, "cayley", 1, hidden_size=384, model="minilm-l6", task="trec")


def test_the_committed_shipped_portfolio_passes_the_member_checks():
    families = load_shipped_portfolio()["families"]
    assert families  # every member of the package's file is a configuration the config classes accept


def _task(tmp_path):
    return write_task(tmp_path / "task", {"train": labelled(40, ["a", "b"]), "test": labelled(10, ["a", "b"], 100)})


def test_a_bad_value_in_the_user_defaults_file_refuses_the_run_naming_file_and_family(
    tmp_path, monkeypatch, no_model_loads
):
    user = tmp_path / "my-defaults.json"
    user.write_text(json.dumps({"format_version": 1, "families": {"fc": {"small": {"lr": -5}}}}), encoding="utf-8")
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(user))
    message = one_line_error(refused_run(tmp_path, _task(tmp_path), "--encoder", "cayley"))
    assert str(user) in message and "families.fc.small" in message and "lr must be > 0" in message


def test_a_bad_value_in_the_shipped_defaults_file_refuses_the_run(tmp_path, monkeypatch, no_model_loads):
    from ilge_search import tuning

    shipped = tmp_path / "shipped-defaults.json"
    values = {"deepset": {"large": {"hidden_dim": 0}}}
    shipped.write_text(json.dumps({"format_version": 1, "families": values}), encoding="utf-8")
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", shipped)
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "none.json"))
    message = one_line_error(refused_run(tmp_path, _task(tmp_path)))
    assert str(shipped) in message and "families.deepset.large" in message and "hidden_dim" in message


def test_cache_ls_marks_a_truncated_entry_as_damaged_and_says_how_to_clear_it(tmp_path):
    from click.testing import CliRunner

    from ilge_search.cli import cli
    from ilge_search.tasks.core import load_task
    from ilge_search.testing.cached import write_split_embeddings

    task = load_task(_task(tmp_path))
    cache = tmp_path / "cache"
    keys = write_split_embeddings("minilm-l6", task, cache_dir=cache, splits=["train", "test"])
    data_file = cache / "embeddings" / f"{keys['train']}.safetensors"
    with open(data_file, "r+b") as handle:  # a copy cut short, as a full disk leaves it
        handle.truncate(100)
    result = CliRunner().invoke(cli, ["cache", "ls", "--cache-dir", str(cache)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()[0] in keys.values()}
    assert "damaged" in rows[keys["train"]].split() and "damaged" not in rows[keys["test"]].split()
    note = " ".join(result.stderr.split())
    assert f"1 damaged entry ({keys['train']}: {data_file.name} has 100 bytes, expected" in note
    assert f"`ilge-search cache rm KEY` ({keys['train']})" in note
