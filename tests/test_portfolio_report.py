"""The stored cross-task matrix in the results report and on the defaults page, on a synthetic stored matrix
with known scores (no training): its columns on the left-out problems' test split, its heatmap, and nothing
at all when no matrix is stored."""

from __future__ import annotations

import shutil

import pytest

from ilge_search.defaults.portfolio import PortfolioRequest
from ilge_search.encoders.configs import CayleyConfig
from ilge_search.testing import add_matrix_problems, store_matrix

MODEL = "minilm-l6"
START = CayleyConfig(lr=1e-3, gnn_layers=1, hidden_dim=256).to_dict()  # the built-in defaults (small)
WIDE = CayleyConfig(lr=3e-4, gnn_layers=2, hidden_dim=512).to_dict()  # good everywhere: the known default
SPECIALIST = CayleyConfig(lr=1e-3, gnn_layers=3, hidden_dim=128, conv_type="gcn").to_dict()  # best on sst2 only
PLAIN = CayleyConfig(lr=1e-3, gnn_layers=2, hidden_dim=128, pooling="sum").to_dict()
BEST_TRIAL = {"trec": WIDE, "sst2": SPECIALIST, "emotion": PLAIN}  # each problem's top trial
VALIDATION = {"start": 0.75, "wide": 0.80, "plain": 0.70, "other": 0.60}  # the specialist: 0.95 on sst2, else 0.50
REQUEST = PortfolioRequest(top_k=1, seeds=2, size=3)


def score(candidate, problem, seed):
    """Validation by configuration (test = validation - 0.05): the wide trial is the best default, the
    specialist the portfolio's second member; the marginal rule's configurations score 0.60."""
    sources = candidate.sources if candidate is not None else ("marginal",)
    kinds = set()
    for source in sources:
        if source == "built-in":
            kinds.add("start")
        elif "#" in source:
            config = BEST_TRIAL[source.split(":")[1]]
            kinds.add({id(WIDE): "wide", id(SPECIALIST): "specialist", id(PLAIN): "plain"}[id(config)])
    kind = next(iter(kinds)) if kinds else "other"
    value = (0.95 if problem.task == "sst2" else 0.50) if kind == "specialist" else VALIDATION[kind]
    return value, value - 0.05


@pytest.fixture(scope="module")
def matrix_storage(tmp_path_factory):
    folder = tmp_path_factory.mktemp("portfolio-report")
    url = f"sqlite:///{folder / 'studies.db'}"
    add_matrix_problems(url, {(MODEL, task): [(START, 0.70), (BEST_TRIAL[task], 0.80)] for task in BEST_TRIAL})
    result = store_matrix(url, REQUEST, score)
    return url, result


def copy_of(url: str, tmp_path) -> str:
    target = tmp_path / "copy.db"
    shutil.copyfile(url.removeprefix("sqlite:///"), target)
    return f"sqlite:///{target}"


def test_the_synthetic_matrix_has_its_known_default_portfolio_and_left_out_rows(matrix_storage):
    _, result = matrix_storage
    names = {c.name: c for c in result.candidates}
    default = result.candidates[result.default]
    assert any(s.startswith(f"{MODEL}:trec:") for s in default.sources)  # the wide trial
    second = result.candidates[result.portfolio[1]]
    assert any(s.startswith(f"{MODEL}:sst2:") for s in second.sources)  # the specialist
    assert len(result.portfolio) == 2  # nothing adds a third: the pair holds every problem's best
    assert "built-in" in names
    rows = {r["held_out"]: r for r in result.held_out.rows}
    assert rows["sst2"]["builtin"] == pytest.approx(70.0) and rows["sst2"]["portfolio_default_diff"] == pytest.approx(5)
    assert rows["trec"]["portfolio_default_diff"] == pytest.approx(0)  # without trec the wide trial is no candidate
    verdict = result.held_out.verdicts[("task", "portfolio_default")]
    assert verdict["mean_difference"] == pytest.approx(10 / 3) and (verdict["ahead"], verdict["behind"]) == (2, 0)


def test_the_report_shows_the_matrix_its_heatmap_and_the_left_out_columns(matrix_storage, tmp_path):
    from ilge_search.report import build_report

    url, result = matrix_storage
    report = build_report(url, tmp_path / "report", progress=False)
    text = report.files["markdown"].read_text()
    section = text[text.index("## Defaults on tasks they never saw") :]
    assert "### Cross-task matrix: cayley (small models)" in section
    assert "(#portfolio-cayley-small)" in text[: text.index("## Defaults on tasks they never saw")]  # contents
    assert "figures/portfolio-cayley-small.png" in report.figures
    assert (tmp_path / "report" / "figures" / "portfolio-cayley-small.png").read_bytes()[:4] == b"\x89PNG"
    assert "](figures/portfolio-cayley-small.png)" in section
    header = next(line for line in section.splitlines() if line.startswith("| left out | model | task |"))
    for column in ("built-in", "marginal rule", "portfolio default", "best member", "default diff"):
        assert f"| {column} |" in header
    sst2 = next(line for line in section.splitlines() if line.startswith("| task sst2 |"))
    assert "| 70.00 |" in sst2 and "| **75.00** |" in sst2 and "| +5.00 |" in sst2
    # ahead on 2 of 3 problems, level on one: the interval over problems touches 0, a tie (not bold)
    assert "| one task | portfolio default | 3 | +3.33 | [+0.00, +5.00] | tie | 2 | 0 |" in section
    # the matrix table: the default marked D, the second member P, validation scores
    default_row = next(line for line in section.splitlines() if line.startswith(f"| {result.candidates[0].name} |"))
    assert "0.7500" in default_row
    assert "Chosen on validation: default" in section
    assert "portfolio-cayley-small" in report.files["latex"].read_text()


def test_a_storage_without_a_matrix_gets_no_empty_section(tmp_path):
    from ilge_search.report import build_report
    from ilge_search.report.defaults_page import recommend_defaults

    url = f"sqlite:///{tmp_path / 'plain.db'}"
    add_matrix_problems(url, {(MODEL, task): [(START, 0.70), (BEST_TRIAL[task], 0.80)] for task in BEST_TRIAL})
    report = build_report(url, tmp_path / "report", figures=False, progress=False)
    text = report.files["markdown"].read_text()
    assert "Defaults on tasks they never saw" not in text and "Cross-task matrix" not in text
    recommend_defaults(url, tmp_path / "mine.json", tmp_path / "mine.md", families=["cayley"])
    page = (tmp_path / "mine.md").read_text()
    assert "No leave-one-task-out evaluation is stored" in page and "Cross-task matrix" not in page


def test_the_defaults_page_has_the_same_columns(matrix_storage, tmp_path):
    from ilge_search.report.defaults_page import recommend_defaults

    url, _ = matrix_storage
    recommend_defaults(url, tmp_path / "mine.json", tmp_path / "mine.md", families=["cayley"])
    page = (tmp_path / "mine.md").read_text()
    section = page[page.index("## On tasks they never saw") : page.index("## Rule")]
    assert "### Cross-task matrix: cayley (small models)" in section
    assert "| built-in | marginal rule | portfolio default | best member |" in section
    # ahead on 2 of 3 problems, level on one: the interval over problems touches 0, a tie (not bold)
    assert "| one task | portfolio default | 3 | +3.33 | [+0.00, +5.00] | tie | 2 | 0 |" in section
    assert "No leave-one-task-out evaluation is stored" not in section


def test_the_report_shows_the_latest_run_with_its_exclusions(matrix_storage, tmp_path):
    from ilge_search.defaults.transfer import stored_portfolio
    from ilge_search.report import build_report

    url = copy_of(matrix_storage[0], tmp_path)
    without = PortfolioRequest(top_k=1, seeds=2, size=3, exclude_tasks=("emotion",))
    store_matrix(url, without, score)
    latest = stored_portfolio(url, "cayley", "small", latest=True)
    assert [p.task for p in latest.problems] == ["sst2", "trec"]
    full = stored_portfolio(url, "cayley", "small")  # what run --warm-start and recommend use: no exclusion
    assert [p.task for p in full.problems] == ["emotion", "sst2", "trec"]
    text = build_report(url, tmp_path / "report", figures=False, progress=False).files["markdown"].read_text()
    assert "without the tasks emotion" in text and "| task emotion |" not in text
