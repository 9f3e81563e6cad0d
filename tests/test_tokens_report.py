"""The report's tagging section (report/tokens.py): its table, macro-F1 in its own column, one figure per model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from ilge_search.record import FinalRecord
from ilge_search.report.tokens import TOKEN_COLUMNS, draw_token_figures, token_rows, tokens_frame


def _frame() -> pd.DataFrame:
    rows = []
    for model, scores in {"minilm-l6": (72.6, 91.9, 49.8), "smollm2-135m": (76.5, 86.8, 41.1)}.items():
        for method, mean in zip(("last-layer", "cayley-word", "cayley"), scores, strict=True):
            f1 = math.nan if method == "cayley" else mean - 20.0  # cayley: stored before macro-F1 was recorded
            rows.append(
                dict.fromkeys(TOKEN_COLUMNS)
                | {"model": model, "task": "ud_ewt_pos", "setting": "train 300"}
                | {"method": method, "mean": mean, "std": 0.5, "n_seeds": 3, "macro_f1": f1, "macro_f1_std": 1.25}
            )
    return pd.DataFrame(rows, columns=TOKEN_COLUMNS)


def test_each_model_gets_a_row_per_method_with_the_best_in_bold_and_its_own_figure(tmp_path):
    frame = _frame()
    header, rows = token_rows(frame, "smollm2-135m")
    assert header == ["task", "setting", "method", "token accuracy", "macro-F1"]
    assert [[cell.text for cell in row[2:]] for row in rows] == [
        ["Last layer", "76.5 ± 0.5 (3)", "56.5 ± 1.2"],
        ["Cayley per word", "86.8 ± 0.5 (3)", "66.8 ± 1.2"],
        ["Cayley per sentence", "41.1 ± 0.5 (3)", "—"],
    ]
    assert [[cell.bold for cell in row[3:]] for row in rows] == [[False, False], [True, True], [False, False]]
    paths = draw_token_figures(frame, tmp_path)  # two models: one figure each
    assert sorted(paths) == ["minilm-l6", "smollm2-135m"] and all(path.stat().st_size > 0 for path in paths.values())


def _study(macro_f1: list[float] | None) -> SimpleNamespace:
    final = FinalRecord(
        select="best",
        trial=0,
        config={},
        seeds=[1000, 1001],
        test_scores=[0.9, 0.8],
        test_mean=0.85,
        test_std=0.07,
        test_macro_f1=macro_f1,
        test_macro_f1_mean=None if macro_f1 is None else sum(macro_f1) / len(macro_f1),
    )
    identity = SimpleNamespace(max_train=300, max_eval=None, max_epochs=None, word_pooling="first")
    return SimpleNamespace(
        final=final,
        test_mean=0.85,
        test_std=0.07,
        test_scores=[0.9, 0.8],
        model="minilm-l6",
        base_task="ud_ewt_pos",
        encoder="cayley-word",
        identity=identity,
        best_value=0.86,
        n_complete=1,
        n_pruned=0,
        trial_seconds=None,
        name="study",
    )


def test_the_frame_takes_macro_f1_from_the_final_record():
    frame = tokens_frame([_study([0.5, 0.75]), _study(None)])  # type: ignore[list-item]
    assert frame["macro_f1"][0] == pytest.approx(62.5) and frame["macro_f1_std"][0] == pytest.approx(17.6776695)
    assert math.isnan(frame["macro_f1"][1]) and math.isnan(frame["macro_f1_std"][1])
