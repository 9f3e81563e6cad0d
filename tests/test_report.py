"""Reports: a small storage of real studies (trec / stsb subsets on the synthetic setup) and stored partial grids."""

from __future__ import annotations

import json
import math
import re

import optuna
import pandas as pd
import pytest
from announced_skips import skip_because
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.record import Identity, ZeroShotScores
from ilge_search.report import MISSING, build_report, method_labels, methods
from ilge_search.report.document import slug
from ilge_search.report.paper_results import canonical_model, canonical_task, load_paper_results, published_result
from ilge_search.study import StudyOptions
from ilge_search.testing import FakeTrial, add_study, classification_data, final_record, similarity_data

SMALL = dict(max_train=240, max_eval=100, max_epochs=2)  # the runner tests' subsets (shared embedding cache)


def markdown_table(text: str, heading: str):
    """Rows of the first table after ``heading`` as {first cell: {column: cell}}."""
    after = text.split(heading, 1)[1].splitlines()
    first = next(i for i, line in enumerate(after) if line.startswith("|"))
    lines = []
    for line in after[first:]:
        if not line.startswith("|"):
            break
        lines.append(line)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=False))
    return rows


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


# ----------------------------------------------------------------------------- a small storage of real studies


@pytest.fixture(scope="module")
def real_storage(tmp_path_factory, synthetic):
    """trec: last-layer, best-layer, cayley with final scores; scalar-mix without; stsb: last-layer only. The
    runner's studies on the synthetic setup (no model loads)."""
    from ilge_search.study import run_study
    from ilge_search.testing import refuse_model_loads

    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'studies.db'}"
    for task in ("trec", "stsb"):
        synthetic.cache(task, max_train=SMALL["max_train"], max_eval=SMALL["max_eval"])
    folders = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir)

    def run(task, encoders, **flat):
        options = StudyOptions.from_flat(device="cpu", progress=False, seed=0, ensemble=0, **folders, **SMALL, **flat)
        run_study(synthetic.model, task, encoders, storage=url, options=options)

    with refuse_model_loads():
        run(
            "trec",
            ["last-layer", "best-layer", "cayley"],
            n_trials={"last-layer": 2, "best-layer": 1, "cayley": 2},
            final_seeds=2,
        )
        run("trec", "scalar-mix", n_trials=1, final_seeds=0)
        run("stsb", "last-layer", n_trials=2, final_seeds=2)
    optuna.create_study(study_name="not-ours", storage=url).optimize(lambda t: t.suggest_float("x", 0, 1), 2)
    return url


@pytest.fixture(scope="module")
def real_report(real_storage, tmp_path_factory):
    out = tmp_path_factory.mktemp("report-out")
    return build_report(real_storage, out, progress=False), real_storage


def stored(url):
    """{(task, method): study user attrs} straight from the storage."""
    summaries = optuna.get_all_study_summaries(url)
    return {(s.user_attrs["task"], s.user_attrs["encoder"]): s.user_attrs for s in summaries if "model" in s.user_attrs}


def test_tables_hold_the_stored_final_scores_and_nothing_else(real_report, synthetic):
    result, url = real_report
    attrs = stored(url)
    assert list(result.tables) == [synthetic.model]
    table = result.tables[synthetic.model]
    assert list(table.index) == ["stsb", "trec"] and list(table.columns) == list(methods())
    for task in table.index:
        for method in methods():
            study = attrs.get((task, method))
            if study is not None and "final_test_mean" in study:
                assert table.loc[task, method] == pytest.approx(100 * study["final_test_mean"])
            else:  # no study, or a study without a final test score: missing, never filled in
                assert math.isnan(table.loc[task, method])
    assert not math.isnan(table.loc["trec", "cayley"]) and math.isnan(table.loc["trec", "scalar-mix"])
    row = result.results.set_index(["task", "method"]).loc[("trec", "cayley")]
    assert row["std"] == pytest.approx(100 * attrs[("trec", "cayley")]["final_test_std"])
    assert json.loads(row["scores"]) == pytest.approx([100 * s for s in attrs[("trec", "cayley")]["final_test_scores"]])
    assert row["n_seeds"] == 2 and row["unit"] == "acc. %"
    assert result.results.set_index(["task", "method"]).loc[("stsb", "last-layer"), "unit"] == "Spearman ×100"
    assert result.skipped == ["not-ours: not an ilge-search study (no model/task/encoder user attrs)"]


def test_markdown_cells_bold_row_best_and_gains(real_report, synthetic):
    result, url = real_report
    attrs = stored(url)
    text = result.files["markdown"].read_text()
    rows = markdown_table(text, f"## {synthetic.model}")
    assert set(rows) == {"stsb", "trec"}
    means = {m: attrs[("trec", m)].get("final_test_mean") for m in methods() if ("trec", m) in attrs}
    scored = {m: round(100 * v, 2) for m, v in means.items() if v is not None}
    best = max(scored.values())
    for method in methods():
        cell = rows["trec"][method_labels()[method]]
        if method not in scored:
            assert cell == MISSING
            continue
        std = 100 * attrs[("trec", method)]["final_test_std"]
        plain = f"{scored[method]:.2f} ± {std:.2f}"
        assert cell == (f"**{plain}**" if scored[method] == best else plain)
    assert rows["stsb"][method_labels()["last-layer"]].startswith("**")  # the only score of its row
    assert rows["trec"]["metric"] == "acc. %" and rows["stsb"]["metric"] == "Spearman ×100"

    gains = markdown_table(text, "gain over the last layer (points).")
    last = 100 * means["last-layer"]
    for method in ("best-layer", "cayley"):
        expected = 100 * means[method] - last
        assert result.gains[synthetic.model].loc["trec", method] == pytest.approx(expected)
        assert gains["trec"][method_labels()[method]] == f"{expected:+.2f}"
    assert (
        gains["trec"][method_labels()["scalar-mix"]] == MISSING and gains["stsb"][method_labels()["cayley"]] == MISSING
    )

    summary = markdown_table(text, "## Across models")
    assert summary[synthetic.model]  # one row per (model, method); the first cell is the model
    frame = result.summary.set_index("method")
    assert frame.loc["last-layer", "tasks"] == 2 and frame.loc["cayley", "tasks"] == 1
    assert frame.loc["cayley", "mean_gain"] == pytest.approx(100 * (means["cayley"] - means["last-layer"]))
    assert frame["wins"].sum() >= 2  # each row has at least one best
    notes = section(text, "Notes")
    assert "against the last layer" in notes and "against the best single layer" in notes
    # the model is not in the paper: the report says so instead of showing a published row
    assert "has a published number" in text and "pythia-410m" in text and ", published" not in text


def test_csv_latex_html_and_figures(real_report, synthetic):
    result, url = real_report
    out = result.out_dir
    frame = pd.read_csv(result.files["csv"])
    assert len(frame) == 5  # trec: 4 studies, stsb: 1
    assert set(frame.columns) >= {"model", "task", "method", "mean", "std", "n_seeds", "gain", "is_best", "published"}
    merged = frame.set_index(["task", "method"])["mean"]
    for (task, method), value in result.tables[synthetic.model].stack().dropna().items():
        assert merged[(task, method)] == pytest.approx(value)
    assert math.isnan(merged[("trec", "scalar-mix")])

    tex = result.files["latex"].read_text()
    # scores, gains and summary; no selection-rule tables: every study was evaluated under one rule only
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == 3
    assert r"\label{tab:selection}" not in tex
    assert tex.count(r"\textbf{") == int(result.results["is_best"].sum())
    assert r"$\pm$" in tex and "---" in tex

    page = result.files["html"].read_text()
    assert page.count("<html") == 1 and page.count("<table>") >= 4
    images = re.findall(r'<img src="([^"]+)"', page)
    assert sorted(images) == sorted(result.figures)
    layers = {task: f"figures/{slug(synthetic.model, task)}-layers.png" for task in ("trec", "stsb")}
    assert layers["trec"] in images and layers["stsb"] not in images
    for image in images:
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "no per-layer figure" in page  # stsb has no best-layer study

    importances = pd.read_csv(result.files["importances_csv"])
    assert not importances.empty
    for name, group in importances.groupby("study"):
        complete = [
            t
            for t in optuna.load_study(study_name=name, storage=url).trials
            if t.state == optuna.trial.TrialState.COMPLETE
        ]
        assert len(complete) >= 2 and len({t.value for t in complete}) >= 2
        assert set(group["param"]) <= set(complete[0].params)
        assert group["importance"].sum() == pytest.approx(1.0)
    # every other study says why it has none (e.g. the single scalar-mix trial)
    without = frame[~frame["study"].isin(importances["study"])]
    assert "scalar-mix" in set(without["method"])
    for method in without["method"]:
        assert f"{method_labels()[method]}: no importances (" in page


def test_report_cli(real_storage, tmp_path, synthetic):
    runner = CliRunner()
    result = runner.invoke(
        cli, ["report", "--storage", real_storage, "--out", str(tmp_path / "r"), "--no-figures", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert f"{synthetic.model}: 2 tasks, 4 cells with test scores" in result.output
    assert (tmp_path / "r" / "report.md").is_file() and not list((tmp_path / "r" / "figures").glob("*.png"))
    missing = runner.invoke(cli, ["report", "--storage", f"sqlite:///{tmp_path / 'absent.db'}"])
    assert missing.exit_code != 0 and "no study storage" in missing.output
    assert not (tmp_path / "absent.db").exists()


# ----------------------------------------------------------------------------- synthetic partial grids


def fake_study(url, model, task, method, test_scores, val=0.5, similarity=False, zero_shot=None, **identity):
    """A stored study as the runner leaves it (the fake study store): its record, one trial, final scores if
    given (with ``zero_shot``: {task: (mean, std, scores)})."""
    final = None
    if test_scores:
        scores = {name: ZeroShotScores(*values) for name, values in (zero_shot or {}).items()}
        final = final_record(test_scores, zero_shot=scores)
    study = add_study(
        url,
        Identity(model=model, task=task, encoder=method, **identity),
        data=similarity_data() if similarity else classification_data(),
        trials=[FakeTrial(val, params={"lr": 1e-3})],
        final=final,
    )
    return study.study_name


def test_published_numbers_are_data_with_their_source():
    cells = load_paper_results()
    assert len(cells) == 75  # 5 tasks x 3 models x 5 methods
    # the four cells cross-checked against an independent extraction
    checked = {(c.model, c.task, c.method): c.value for c in cells if c.cross_checked}
    assert checked == {
        ("meta-llama/Meta-Llama-3-8B", "banking77", "cayley"): 92.85,
        ("google/gemma-2-2b", "emotion", "fc"): 79.90,
        ("google/gemma-2-2b", "mtop_domain", "cayley"): 99.16,
        ("meta-llama/Meta-Llama-3-8B", "mtop_intent", "cayley"): 96.46,
    }
    assert published_result("EleutherAI/pythia-410m", "emotion", "cayley").value == 73.83
    assert published_result("pythia-410m", "emotion", "last-layer").value == 33.48
    assert published_result("/models/Meta-Llama-3-8B", "MTOPDomainClassification", "mlp-last").value == 98.58
    assert published_result("google/gemma-2-2b", "poem_sentiment", "deepset").value == 78.56
    assert canonical_model("google/gemma-2-2b-it") is None  # the paper used the base checkpoints
    assert canonical_model("EleutherAI/pythia-410m-deduped") is None
    assert canonical_task("trec") is None
    assert published_result("minilm-l6", "banking77", "cayley") is None
    assert published_result("EleutherAI/pythia-410m", "banking77", "best-layer") is None


def test_published_numbers_match_the_spec_table(data_dir):
    spec = data_dir.parent / "spec" / "paper-results.md"
    if not spec.is_file():
        skip_because(f"{spec} not present: it comes with the shared task data (ILGE_SEARCH_DATA)")
    models = {
        "Pythia-410m": "EleutherAI/pythia-410m",
        "Gemma2-2B": "google/gemma-2-2b",
        "Llama3-8B": "meta-llama/Meta-Llama-3-8B",
    }
    methods = ["cayley", "fc", "last-layer", "deepset", "mlp-last"]
    seen = 0
    for line in spec.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or canonical_task(cells[0]) is None:
            continue
        for model, cell in zip(models.values(), cells[1:], strict=True):
            for method, value in zip(methods, cell.split("/"), strict=False):
                assert published_result(model, cells[0], method).value == float(value)
                seen += 1
    assert seen == 75


def test_partial_grid_published_rows_duplicates_and_few_shot(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    pythia = "EleutherAI/pythia-410m"
    paper = dict(protocol="paper", samples_per_label=8)  # the published numbers sit beside these scores only
    fake_study(url, pythia, "banking77", "last-layer", [0.60, 0.62], **paper)
    fake_study(url, pythia, "banking77", "cayley", [0.88, 0.90, 0.89], **paper)
    fake_study(url, pythia, "banking77", "fc", [0.89, 0.89, 0.89], **paper)  # ties Cayley at the shown precision
    fake_study(url, pythia, "banking77", "deepset", [], **paper)  # running: no final scores yet
    fake_study(url, pythia, "banking77", "cayley", [0.95])  # matched: its own row, never beside the paper
    fake_study(url, pythia, "emotion", "cayley", [0.70], **paper)
    fake_study(url, pythia, "emotion", "mean-layers", [0.40])  # one seed: no std shown
    shown = fake_study(url, pythia, "emotion", "scalar-mix", [0.5, 0.5, 0.5], max_train=2000)
    hidden = fake_study(url, pythia, "emotion", "scalar-mix", [0.9], max_train=100)  # fewer seeds: not shown
    fake_study(url, pythia, "emotion", "cayley", [0.30], shots=8)  # its own row, never matched to the paper
    fake_study(url, pythia, "emotion", "cayley", [0.33], shots=16)  # after 8 shots: sorted by number, not text
    fake_study(url, "my/model_x", "trec", "cayley", [0.7, 0.8])  # a LaTeX-special name
    fake_study(
        url, pythia, "stsb", "cayley", [0.80, 0.82], similarity=True, zero_shot={"sick_r": (0.61, 0.01, [0.6, 0.62])}
    )
    fake_study(
        url,
        pythia,
        "stsb",
        "last-layer",
        [0.70, 0.72],
        similarity=True,
        zero_shot={"sick_r": (0.65, 0.0, [0.65, 0.65])},
    )

    result = build_report(url, tmp_path / "out", progress=False)
    table = result.tables[pythia]
    bank, emo = "banking77 [paper protocol]", "emotion [paper protocol]"
    assert list(table.index) == [
        "banking77",
        bank,
        "emotion",
        "emotion (8-shot)",
        "emotion (16-shot)",
        emo,
        "stsb",
        "sick_r (zero-shot, stsb encoder)",
    ]  # zero-shot rows follow their source task
    zero_row = "sick_r (zero-shot, stsb encoder)"
    assert table.loc[zero_row, "cayley"] == pytest.approx(61.0) and table.loc["stsb", "cayley"] == pytest.approx(81.0)
    assert table.loc[bank, "cayley"] == pytest.approx(89.0) and table.loc["banking77", "cayley"] == pytest.approx(95.0)
    assert math.isnan(table.loc[bank, "deepset"]) and math.isnan(table.loc["emotion", "last-layer"])
    assert table.loc["emotion", "scalar-mix"] == pytest.approx(50.0)
    assert any(s.startswith(hidden) for s in result.skipped) and not any(s.startswith(shown) for s in result.skipped)

    text = result.files["markdown"].read_text()
    rows = markdown_table(text, f"## {pythia}")  # the matched table
    papers = markdown_table(text, "paper protocol (MTEB's logistic readout")
    assert set(papers) == {bank, f"*{bank}, published*", emo, f"*{emo}, published*"}
    assert papers[bank]["Cayley"] == "**89.00 ± 1.00**" and papers[bank]["FC"] == "**89.00 ± 0.00**"
    assert papers[bank]["DeepSet"] == MISSING and papers[bank]["Mean layers"] == MISSING
    assert rows["banking77"]["Cayley"] == "**95.00**" and bank not in rows
    assert rows["emotion"]["Mean layers"] == "40.00"  # one seed: no std
    assert rows["emotion"]["Scalar mix"] == "**50.00 ± 0.00**"
    assert rows[zero_row]["Last layer"] == "**65.00 ± 0.00**"
    assert rows[zero_row]["Cayley"] == "61.00 ± 1.00"  # the stored std
    assert rows[zero_row]["metric"] == rows["stsb"]["metric"] == "Spearman ×100"
    assert rows["stsb"]["Cayley"] == "**81.00 ± 1.41**"
    # published numbers beside the paper-protocol scores, for the paper's methods only
    published = papers[f"*{bank}, published*"]
    assert published["Cayley"] == "*89.43*" and published["FC"] == "*90.65*" and published["Last layer"] == "*61.17*"
    assert published["Best layer"] == f"*{MISSING}*" and published["Mean layers"] == f"*{MISSING}*"
    # never beside matched or few-shot rows
    assert not any("published" in row for row in rows)
    # the paper's whole row is shown, also for methods without a study here
    assert papers[f"*{emo}, published*"]["Last layer"] == "*33.48*" and papers[emo]["Last layer"] == MISSING
    assert "arXiv 2603.22665" in text
    frame = result.results.set_index(["task", "method"])
    assert frame.loc[(bank, "cayley"), "published"] == 89.43 and frame.loc[(bank, "cayley"), "protocol"] == "paper"
    assert math.isnan(frame.loc[("banking77", "cayley"), "published"])  # matched
    assert frame.loc[("banking77", "cayley"), "protocol"] == "matched"
    assert math.isnan(frame.loc[("emotion (8-shot)", "cayley"), "published"])
    assert frame.loc[(bank, "cayley"), "gain"] == pytest.approx(89.0 - 61.0)  # within the paper protocol
    assert ("emotion", "cayley") not in frame.index  # the 8-shot study is not the full-data row
    assert "Final seeds: 3 for most cells; fewer for" in text
    tex = result.files["latex"].read_text()
    assert r"my/model\_x" in tex and "my/model_x" not in tex.replace(r"model\_x", "")
    # figures need trials with values; a one-trial study has no importances, which is said, not drawn
    assert "no importances (1 complete trial(s))" in text


def test_a_storage_without_ilge_studies_is_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="other", storage=url)
    with pytest.raises(ValueError, match="no ilge-search studies"):
        build_report(url, tmp_path / "out", progress=False)


def test_contents_anchors_figure_sizes_and_trial_states(tmp_path):
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    from ilge_search.report.data import collect_records
    from ilge_search.report.figures import display_width, trial_counts

    url = f"sqlite:///{tmp_path / 's.db'}"
    models, tasks = ("minilm-l6", "smollm2-135m"), ("sst2", "trec")
    for model in models:
        for task in tasks:
            fake_study(url, model, task, "last-layer", [0.80, 0.82])
    name = fake_study(url, "minilm-l6", "trec", "cayley", [0.85, 0.86])
    study = optuna.load_study(study_name=name, storage=url)
    lr = {"lr": FloatDistribution(1e-5, 1e-2, log=True)}
    study.add_trial(create_trial(params={"lr": 1e-4}, distributions=lr, value=0.6))
    study.add_trial(
        create_trial(state=TrialState.PRUNED, params={"lr": 1e-2}, distributions=lr, intermediate_values={1: 0.3})
    )
    study.add_trial(create_trial(state=TrialState.FAIL, params={"lr": 1e-5}, distributions=lr))

    result = build_report(url, tmp_path / "out", progress=False)
    cayley = next(r for r in collect_records(url)[0] if r.encoder == "cayley")
    assert trial_counts(cayley) == "2 complete, 1 pruned, 1 failed"
    last = next(r for r in collect_records(url)[0] if r.encoder == "last-layer")
    assert trial_counts(last) == "1 complete, 0 pruned"  # failed only when there are any

    page = result.files["html"].read_text()
    ids = set(re.findall(r' id="([^"]+)"', page))
    links = re.findall(r'<nav class="contents">.*?</nav>', page, re.S)[0]
    targets = re.findall(r'href="#([^"]+)"', links)
    assert targets and set(targets) <= ids  # every contents link lands on a heading
    for model in models:
        assert f'href="#model-{model}"' in links
        for task in tasks:
            assert f'href="#figures-{model}-{task}"' in links
    markdown = result.files["markdown"].read_text()
    contents = markdown.split("## ", 1)[0]
    assert set(re.findall(r"\]\(#([^)]+)\)", contents)) <= set(re.findall(r'<a id="([^"]+)"></a>', markdown))

    # each figure is shown at the size it was drawn for (never wider than the page), and histories get one
    # panel per encoder: two encoders on minilm-l6 / trec, one on sst2
    images = re.findall(r'<img src="([^"]+)" alt="[^"]+" width="(\d+)">', page)
    assert len(images) == len(result.figures) > 0
    for path, width in images:
        assert int(width) == display_width(result.out_dir / path) <= 1200
    history = {path: int(width) for path, width in images if path.endswith("-history.png")}
    assert history["figures/minilm-l6-trec-history.png"] == 2 * history["figures/minilm-l6-sst2-history.png"]
