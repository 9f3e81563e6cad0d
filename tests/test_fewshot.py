"""Few-shot curves in the report: a small real sweep over shots 8, 16 and the full subset (trec on the synthetic
setup: no model loads)."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from ilge_search.report import build_report
from ilge_search.report.data import collect_records
from ilge_search.report.document import slug
from ilge_search.report.fewshot import fewshot_frame
from ilge_search.study import SweepOverrides, SweepRuntime

GRID = """
storage = "{storage}"
models = ["{model}"]
encoders = ["cayley", "last-layer"]
final_seeds = 2
max_train = 240
max_eval = 100
max_epochs = 4
shots = [8, 16, "full"]
[trials]
default = 1
[tasks.trec]
"""


@pytest.fixture(scope="module")
def fewshot_storage(tmp_path_factory, synthetic):
    from ilge_search.study import run_sweep
    from ilge_search.testing import refuse_model_loads

    for shots in (8, 16, None):
        synthetic.cache("trec", shots=shots, max_train=240, max_eval=100)
    folder = tmp_path_factory.mktemp("fewshot")
    url = f"sqlite:///{folder / 'studies.db'}"
    grid = folder / "grid.toml"
    grid.write_text(GRID.format(storage=url, model=synthetic.model))
    with refuse_model_loads():
        run_sweep(
            grid,
            runtime=SweepRuntime(
                data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu", progress=False
            ),
            overrides=SweepOverrides(threads=1),
        )
    return url


def stored_finals(url):
    """{(encoder, shots): (final test scores, train size)} straight from the storage."""
    out = {}
    for summary in optuna.get_all_study_summaries(url):
        attrs = summary.user_attrs
        out[(attrs["encoder"], attrs["shots"])] = (attrs["final_test_scores"], attrs["split_sizes"]["train"])
    return out


def test_few_shot_studies_are_their_own_rows_and_curve_points(fewshot_storage, tmp_path, synthetic):
    model = synthetic.model
    finals = stored_finals(fewshot_storage)
    assert sorted(finals, key=str) == sorted(((e, s) for e in ("cayley", "last-layer") for s in (8, 16, None)), key=str)
    assert finals[("cayley", 8)][1] == 48 and finals[("cayley", 16)][1] == 96 and finals[("cayley", None)][1] == 240

    result = build_report(fewshot_storage, tmp_path / "out", progress=False)
    # the main tables: one row per shots value, never merged into one cell
    table = result.tables[model]
    assert list(table.index) == ["trec", "trec (8-shot)", "trec (16-shot)"]  # by number, not as text
    for (encoder, shots), (scores, _) in finals.items():
        row = "trec" if shots is None else f"trec ({shots}-shot)"
        assert table.loc[row, encoder] == pytest.approx(100 * sum(scores) / len(scores))

    # a few-shot row is a point of its curve: one task in the summary, and no per-task figures of its own
    assert set(result.summary["tasks"]) == {1}
    assert not [path for path in result.figures if "shot" in path and not path.endswith("-fewshot.png")]

    frame = result.fewshot
    assert len(frame) == 6
    for (encoder, shots), (scores, train) in finals.items():
        part = frame[frame["encoder"] == encoder]
        row = (part[part["shots"].isna()] if shots is None else part[part["shots"] == shots]).iloc[0]
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
        assert row["mean"] == pytest.approx(100 * mean) and row["std"] == pytest.approx(100 * std)
        assert row["n_seeds"] == 2 and row["train_size"] == train

    text = result.files["markdown"].read_text()
    section = text.split("## Few-shot curves\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith(f"| {model} | trec |")]
    cayley = next(line for line in lines if "| Cayley |" in line)
    cells = [c.strip().strip("*") for c in cayley.strip("|").split("|")]
    for index, shots in ((4, 8), (5, 16), (6, None)):
        scores = finals[("cayley", shots)][0]
        mean = 100 * sum(scores) / len(scores)
        assert cells[index].startswith(f"{mean:.2f} ± ")
    assert cells[6].endswith("(n=240)")
    assert "with 8 examples per label, Cayley minus the last layer" in section
    assert "[Few-shot curves](#few-shot)" in text
    figure = f"figures/{slug(model, 'trec')}-fewshot.png"
    assert (result.out_dir / figure).is_file() and figure in result.figures
    assert "Defaults on tasks they never saw" not in text  # no leave-one-task-out evaluation stored


def test_a_curve_needs_the_same_setting(fewshot_storage):
    """The full-data study of another max_train is no point of the curve."""
    records, duplicates, _ = collect_records(fewshot_storage)
    other = [r for r in records + duplicates if r.identity.shots is None]
    for record in other:
        record.stored = dataclasses.replace(record.stored, identity=dataclasses.replace(record.identity, max_train=999))
    frame, notes = fewshot_frame(records + duplicates)
    assert frame["shots"].notna().all() and len(frame) == 4 and notes == []


def test_a_curve_has_one_protocol_and_only_encoders_with_few_shot_points(fewshot_storage):
    """A paper-protocol study of the same data is not the matched curve's full point, and an encoder with a
    full-subset study but no few-shot study draws no curve."""
    records, duplicates, _ = collect_records(fewshot_storage)
    every = records + duplicates
    full = [r for r in every if r.identity.shots is None]
    paper = [
        dataclasses.replace(
            r,
            name=r.name + ":paper",
            stored=dataclasses.replace(
                r.stored,
                identity=dataclasses.replace(r.identity, protocol="paper"),
                final=dataclasses.replace(r.final, test_mean=0.01),
            ),
        )
        for r in full
    ]
    alone = [dataclasses.replace(r, name=r.name + ":fc", encoder="fc") for r in full if r.encoder == "cayley"]
    frame, _ = fewshot_frame(every + paper + alone)
    expected, _ = fewshot_frame(every)
    assert set(frame["encoder"]) == {"cayley", "last-layer"}
    assert frame[["encoder", "shots", "mean"]].equals(expected[["encoder", "shots", "mean"]])
    assert frame["shots"].isna().sum() == 2 and (frame["mean"] > 1.0).all()
