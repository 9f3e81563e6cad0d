"""The report's tagging section (report/tokens.py): its table and one figure per model."""

from __future__ import annotations

import pandas as pd

from ilge_search.report.tokens import TOKEN_COLUMNS, draw_token_figures, token_rows


def _frame() -> pd.DataFrame:
    rows = []
    for model, scores in {"minilm-l6": (72.6, 91.9, 49.8), "smollm2-135m": (76.5, 86.8, 41.1)}.items():
        for method, mean in zip(("last-layer", "cayley-word", "cayley"), scores, strict=True):
            rows.append(
                dict.fromkeys(TOKEN_COLUMNS)
                | {"model": model, "task": "ud_ewt_pos", "setting": "train 300"}
                | {"method": method, "mean": mean, "std": 0.5, "n_seeds": 3}
            )
    return pd.DataFrame(rows, columns=TOKEN_COLUMNS)


def test_each_model_gets_its_row_with_the_best_method_in_bold_and_its_own_figure(tmp_path):
    frame = _frame()
    header, rows = token_rows(frame, "smollm2-135m")
    assert header == ["task", "setting", "Last layer", "Cayley per word", "Cayley per sentence"]
    assert [cell.text for cell in rows[0][2:]] == ["76.5 ± 0.5 (3)", "86.8 ± 0.5 (3)", "41.1 ± 0.5 (3)"]
    assert [cell.bold for cell in rows[0][2:]] == [False, True, False]
    paths = draw_token_figures(frame, tmp_path)  # two models: one figure each
    assert sorted(paths) == ["minilm-l6", "smollm2-135m"] and all(path.stat().st_size > 0 for path in paths.values())
