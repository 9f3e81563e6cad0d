"""The portfolio shipped with the package: the committed file, its schema and loader, the maintainer command that
writes it from a stored matrix (only with --update-shipped, training nothing), and warm starts taking it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.defaults.portfolio import PortfolioRequest
from ilge_search.encoders.configs import CayleyConfig
from ilge_search.record import load_shipped_portfolio, write_shipped_portfolio
from ilge_search.record import portfolio as record_portfolio
from ilge_search.testing import add_matrix_problems, store_matrix

MODEL = "minilm-l6"
START = CayleyConfig(lr=1e-3, gnn_layers=1, hidden_dim=256).to_dict()  # the built-in defaults (small)
TRIALS = {
    "trec": CayleyConfig(lr=3e-4, gnn_layers=2, hidden_dim=512).to_dict(),
    "sst2": CayleyConfig(lr=1e-3, gnn_layers=3, hidden_dim=128, conv_type="gcn").to_dict(),
    "emotion": CayleyConfig(lr=1e-3, gnn_layers=2, hidden_dim=128, pooling="sum").to_dict(),
}
REQUEST = PortfolioRequest(top_k=1, seeds=1, size=3)
PROVENANCE = {"source": "s", "family": "cayley", "bucket": "small", "problems": [], "chosen_on": "validation"}


def score(candidate, problem, seed):
    """The built-in defaults best on average, trec's trial second everywhere, sst2's best on sst2 only."""
    sources = candidate.sources if candidate is not None else ("marginal",)
    if "built-in" in sources:
        return 0.80, 0.75
    if any(s.startswith(f"{MODEL}:trec:") for s in sources):
        return 0.78, 0.74
    if any(s.startswith(f"{MODEL}:sst2:") for s in sources):
        return (0.95 if problem.task == "sst2" else 0.40), 0.5
    if any(s.startswith(f"{MODEL}:emotion:") for s in sources):
        return 0.60, 0.55
    return 0.50, 0.45  # the marginal rule's


@pytest.fixture()
def builtin_start(tmp_path, monkeypatch):
    """Studies start from the built-in defaults (START), whatever the package ships: the synthetic matrices
    here are built around them."""
    from ilge_search import tuning

    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", tmp_path / "no-shipped-defaults.json")
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(tmp_path / "no-user-defaults.json"))


@pytest.fixture()
def problems_url(tmp_path, builtin_start):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    add_matrix_problems(url, {(MODEL, task): [(START, 0.70), (config, 0.80)] for task, config in TRIALS.items()})
    return url


@pytest.fixture()
def shipped_path(tmp_path, monkeypatch):
    path = tmp_path / "portfolio.json"
    monkeypatch.setattr(record_portfolio, "SHIPPED_PORTFOLIO_PATH", path)
    return path


def test_the_committed_file_is_the_full_matrix_portfolio_and_warm_starts_take_it():
    from ilge_search.defaults.shipped_portfolio import shipped_start
    from ilge_search.study.trial import config_params, recommended_params, warm_start_params

    document = load_shipped_portfolio()
    assert document["format_version"] == 1 and set(document["families"]) == {"cayley", "fc", "deepset"}
    for family in ("fc", "deepset"):  # their matrices chose the built-in defaults, the start, which no member is
        start = config_params(family, shipped_start(family, "small"))
        members = document["families"][family]["small"]["members"]
        assert members and all(config_params(family, m) != start for m in members)
    entry = document["families"]["cayley"]["small"]
    provenance = entry["provenance"]
    assert provenance["source"] == "sqlite:///reports/transfer.db" and provenance["chosen_on"] == "validation"
    # both offline models x 6 tasks, nothing excluded (reports/transfer.md)
    assert provenance["models"] == ["minilm-l6", "smollm2-135m"] and len(provenance["problems"]) == 12
    assert provenance["excluded_tasks"] == [] and provenance["excluded_models"] == []
    assert len(provenance["tasks"]) == 6 and len(entry["members"]) == 4 and provenance["greedy_members"] == 4
    verdicts = provenance["left_out_checks_on_test"]
    for fold in ("task", "model"):  # the portfolio default's margins are ties: intervals over problems contain 0
        verdict = verdicts[f"{fold}/portfolio_default"]
        assert verdict["mean_difference"] > 0 and verdict["interval"][0] < 0 < verdict["interval"][1]
        assert verdict["verdict"] == "tie"
    # the start is the built-in defaults again (the matrix's default c6 did not pass the shipping rule), so the
    # order c6, c7, marginal, c5 is shipped whole
    assert provenance["member_names"] == ["c6", "c7", "marginal", "c5"]
    assert provenance["member_tasks"] == [["sst2"], ["stsb"], provenance["tasks"], ["banking77", "emotion"]]
    start = recommended_params("cayley", 384, model=MODEL)
    assert start == config_params("cayley", shipped_start("cayley", "small"))
    assert start["conv_type"] == "gin"  # the built-in defaults: no regenerated default passed the shipping rule
    # a storage without a portfolio: --warm-start 4 takes the shipped members, none of them the start
    warm = warm_start_params(None, "cayley", 4, hidden_size=384, model=MODEL, task="trec")
    params = [m.params for m in warm.members]
    assert len(params) == 4 and start not in params
    assert [m.name for m in warm.members] == provenance["member_names"] and warm.skipped == ()
    with pytest.raises(ValueError, match=r"--warm-start 5: the portfolio shipped with ilge-search has 4 cayley"):
        warm_start_params(None, "cayley", 5, hidden_size=384, model=MODEL, task="trec")
    # c7 came from stsb's best trial only: a stsb study skips it; c5 came from two tasks and stays
    stsb = warm_start_params(None, "cayley", 3, hidden_size=384, model=MODEL, task="stsb")
    assert [m.name for m in stsb.members] == ["c6", "marginal", "c5"] and stsb.skipped == ("c7",)
    with pytest.raises(ValueError, match=r"has 3 cayley \(small\) .*skipped, from task stsb only: c7"):
        warm_start_params(None, "cayley", 4, hidden_size=384, model=MODEL, task="stsb")
    emotion = warm_start_params(None, "cayley", 4, hidden_size=384, model=MODEL, task="emotion")
    assert [m.name for m in emotion.members] == provenance["member_names"]


ENTRY = '{"format_version": 1, "families": {"cayley": {"small": %s}}}'


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        ('{"format_version": 2, "families": {}}', "format_version 2; this ilge-search reads version 1"),
        ('{"families": []}', "not a portfolio file"),
        (ENTRY % '{"members": [{"family": "cayley"}]}', "no provenance"),
        (ENTRY % '{"members": []}', "non-empty list"),
        (ENTRY % '{"members": [{"family": "fc"}], "provenance": {}}', "holds a 'fc' configuration"),
    ],
)
def test_a_malformed_shipped_file_is_one_line_naming_it(shipped_path, content, message):
    shipped_path.write_text(content)
    with pytest.raises(ValueError) as info:
        load_shipped_portfolio()
    assert message in str(info.value) and str(shipped_path) in str(info.value) and "\n" not in str(info.value)


def test_a_file_not_chosen_on_validation_is_refused(shipped_path):
    with pytest.raises(ValueError, match="not chosen on validation"):
        write_shipped_portfolio("cayley", "small", [START], {**PROVENANCE, "generated": "x", "chosen_on": "test"})
    assert not shipped_path.exists()
    with pytest.raises(ValueError, match="provenance lacks generated"):
        write_shipped_portfolio("cayley", "small", [START], PROVENANCE)


def test_update_shipped_writes_the_warm_start_order_without_the_start_and_keeps_other_entries(
    problems_url, shipped_path
):
    from ilge_search.defaults.shipped_portfolio import update_shipped_portfolio
    from ilge_search.study.trial import config_params

    fc = {"members": [{"family": "fc"}], "provenance": {**PROVENANCE, "family": "fc", "generated": "earlier"}}
    shipped_path.write_text(json.dumps({"format_version": 1, "families": {"fc": {"small": fc}}}))
    result = store_matrix(problems_url, REQUEST, score)
    builtin = next(i for i, c in enumerate(result.candidates) if c.name == "built-in")
    assert result.default == builtin  # the start is the best default here, so it is no warm-start member
    written, again, members = update_shipped_portfolio(problems_url, REQUEST, note="a test")
    assert written == shipped_path and again.order == result.order
    expected = [result.candidates[i].config for i in result.order if i != builtin][: REQUEST.size]
    assert members == expected and len(members) == 3
    assert config_params("cayley", members[0]) == config_params("cayley", TRIALS["sst2"])  # the greedy 2nd member
    document = load_shipped_portfolio()
    assert document["families"]["fc"]["small"] == fc  # the other entries are kept
    provenance = document["families"]["cayley"]["small"]["provenance"]
    assert provenance["chosen_on"] == "validation" and provenance["note"] == "a test"
    assert provenance["problems"] == [p.study for p in result.problems] and provenance["greedy_members"] == 1
    assert provenance["member_tasks"][0] == ["sst2"]  # sst2's own trial: an sst2 study skips it
    assert provenance["left_out_checks_on_test"]["task/portfolio_default"]["problems"] == 3


def test_update_shipped_trains_nothing_and_refuses_a_matrix_with_missing_cells(problems_url, shipped_path):
    runner = CliRunner()
    args = ["portfolio", "--storage", problems_url, "--top-k", "1", "--seeds", "1", "--size", "3"]
    out = runner.invoke(cli, [*args, "--update-shipped"])
    assert out.exit_code == 1 and "cells of this cayley (small) matrix are not stored" in out.output
    assert "--update-shipped trains nothing" in out.output and "Traceback" not in out.output
    assert not shipped_path.exists()
    store_matrix(problems_url, REQUEST, score)
    plain = runner.invoke(cli, [*args, "--quiet", "--format", "json"])  # without the flag: nothing shipped
    assert plain.exit_code == 0, plain.output
    assert not shipped_path.exists()
    shipped = runner.invoke(cli, [*args, "--update-shipped", "--note", "x"])
    assert shipped.exit_code == 0, shipped.output
    assert "wrote 3 cayley (small) warm-start members" in shipped.output and str(shipped_path) in shipped.output
    assert load_shipped_portfolio()["families"]["cayley"]["small"]["provenance"]["note"] == "x"


def test_a_stored_choice_warm_starts_in_its_order_beyond_the_greedy_portfolio(problems_url):
    from ilge_search.storage import open_storage
    from ilge_search.study.trial import config_params, warm_start_params

    result = store_matrix(problems_url, REQUEST, score)
    assert len(result.portfolio) < 3 <= len(result.order) - 1  # the greedy step stopped; the order goes on
    warm = warm_start_params(open_storage(problems_url), "cayley", 3, hidden_size=384, model=MODEL, task="banking77")
    builtin = next(i for i, c in enumerate(result.candidates) if c.name == "built-in")
    order = [config_params("cayley", result.candidates[i].config) for i in result.order if i != builtin]
    assert [m.params for m in warm.members] == order[:3]
    assert warm.left_out_task is None and warm.chosen_from == tuple(p.study for p in result.problems)


def test_a_study_of_a_matrix_task_warm_starts_with_the_order_chosen_without_that_task(problems_url):
    import numpy as np

    from ilge_search.defaults.choice import greedy_portfolio, normalise, warm_start_order
    from ilge_search.storage import open_storage
    from ilge_search.study.trial import config_params, warm_start_params

    result = store_matrix(problems_url, REQUEST, score)
    names = [c.name for c in result.candidates]
    sst2_trial = next(i for i, c in enumerate(result.candidates) if any(":sst2:" in s for s in c.sources))
    builtin = names.index("built-in")
    # with every problem, sst2's own best trial is the greedy second member (it is best on sst2 only)
    assert result.order[1] == sst2_trial
    warm = warm_start_params(open_storage(problems_url), "cayley", 2, hidden_size=384, model=MODEL, task="sst2")
    own = next(p.study for p in result.problems if p.task == "sst2")
    assert warm.left_out_task == "sst2" and own not in warm.chosen_from and len(warm.chosen_from) == 2
    # the order recomputed by hand: the built-in defaults and trec's and emotion's trials, on their two columns
    others = (f"{MODEL}:trec:", f"{MODEL}:emotion:")
    rows = [
        i
        for i, c in enumerate(result.candidates)
        if "built-in" in c.sources or any(s.startswith(others) and "#" in s for s in c.sources)
    ]
    kept = [i for i, p in enumerate(result.problems) if p.task != "sst2"]
    normalised = normalise(result.matrix.validation[np.ix_(rows, kept)], [True] * len(kept))
    expected = [rows[i] for i in warm_start_order(normalised, greedy_portfolio(normalised, REQUEST.size))]
    expected = [config_params("cayley", result.candidates[i].config) for i in expected if i != builtin]
    assert [m.params for m in warm.members] == expected[:2]
    assert all(own not in m.sources for m in warm.members)  # nothing chosen on sst2's validation data
    assert sst2_trial not in [names.index(m.name) for m in warm.members] and "marginal" not in [
        m.name for m in warm.members
    ]
    with pytest.raises(ValueError, match=r"without task sst2's problems\) has 2 cayley"):
        warm_start_params(open_storage(problems_url), "cayley", 3, hidden_size=384, model=MODEL, task="sst2")


def test_a_stored_choice_without_left_out_orders_is_refused_for_its_own_tasks(problems_url):
    import optuna

    from ilge_search.record import portfolio_study_name, save_portfolio_choice
    from ilge_search.storage import open_storage
    from ilge_search.study.trial import warm_start_params

    opened = open_storage(problems_url)
    study = optuna.create_study(study_name=portfolio_study_name("cayley", "small"), storage=opened.rdb)
    members = [TRIALS["trec"], TRIALS["sst2"]]
    save_portfolio_choice(study, {"warm_start": members, "problems": [f"{MODEL}:trec:cayley:train500"]})
    with pytest.raises(ValueError, match=r"chosen with task trec's own problems and holds no order chosen without"):
        warm_start_params(opened, "cayley", 1, hidden_size=384, model=MODEL, task="trec")
    other = warm_start_params(opened, "cayley", 2, hidden_size=384, model=MODEL, task="sst2")
    assert [m.config for m in other.members] == members and other.left_out_task is None


def test_the_portfolio_is_copied_once_into_a_fresh_storage_with_its_left_out_orders(problems_url, tmp_path):
    import optuna

    from ilge_search.defaults.transfer import copy_portfolio
    from ilge_search.record import portfolio_study_name, save_portfolio_choice
    from ilge_search.storage import StorageError, open_storage
    from ilge_search.study.trial import warm_start_params

    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    with pytest.raises(ValueError, match="holds no cayley \\(small\\) portfolio chosen with its leave-one-task-out"):
        copy_portfolio(problems_url, fresh)
    store_matrix(problems_url, REQUEST, score)
    assert copy_portfolio(problems_url, fresh) is True and copy_portfolio(problems_url, fresh) is False
    studies = {s.study_name for s in optuna.get_all_study_summaries(fresh)}
    assert studies == {portfolio_study_name("cayley", "small")}  # the matrix's problems stay behind
    for task in ("sst2", "banking77"):
        here = warm_start_params(open_storage(problems_url), "cayley", 2, hidden_size=384, model=MODEL, task=task)
        there = warm_start_params(open_storage(fresh), "cayley", 2, hidden_size=384, model=MODEL, task=task)
        assert there.members == here.members and there.chosen_from == here.chosen_from
    # a study of that name that is no copy is never replaced
    other = f"sqlite:///{tmp_path / 'other.db'}"
    mine = optuna.create_study(study_name=portfolio_study_name("cayley", "small"), storage=other)
    save_portfolio_choice(mine, {"warm_start": [TRIALS["trec"]]})
    with pytest.raises(StorageError, match="that is no copy of"):
        copy_portfolio(problems_url, other)


def test_a_matrix_of_one_task_cannot_warm_start_that_task(tmp_path, builtin_start):
    from ilge_search.storage import open_storage
    from ilge_search.study.trial import warm_start_params

    url = f"sqlite:///{tmp_path / 'one-task.db'}"
    add_matrix_problems(
        url, {(model, "trec"): [(START, 0.70), (TRIALS["trec"], 0.80)] for model in (MODEL, "smollm2-135m")}
    )
    store_matrix(url, REQUEST, score)
    with pytest.raises(ValueError, match=r"every problem of the portfolio stored in .* is task trec's own"):
        warm_start_params(open_storage(url), "cayley", 1, hidden_size=384, model=MODEL, task="trec")
    other = warm_start_params(open_storage(url), "cayley", 1, hidden_size=384, model=MODEL, task="sst2")
    assert other.members[0].sources and len(other.chosen_from) == 2  # any other task takes the whole order


def test_recommend_keeps_the_builtin_defaults_when_the_matrix_chose_them(problems_url, tmp_path):
    from ilge_search import tuning
    from ilge_search.report.defaults_page import recommend_defaults

    store_matrix(problems_url, REQUEST, score)  # the built-in defaults are the best default here
    page = tmp_path / "defaults.md"
    data = recommend_defaults(problems_url, None, page, families=["cayley"], method="portfolio", update_shipped=True)
    assert data["families"] == {} and json.loads(tuning.RECOMMENDED_DEFAULTS_PATH.read_text())["families"] == {}
    why = data["metadata"]["shipping"]["cayley/small"]
    assert why.startswith("built-in kept (the matrix's default is the built-in defaults; leave one task out: +0.00")
    text = page.read_text()
    assert f"`ilge-search recommend --storage {problems_url} --method portfolio`" in text
    assert text.count("Shipped in `ilge_search/data/recommended_defaults.json`") == 1 and why in text
