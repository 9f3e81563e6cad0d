"""The warm-start page (report/warmstart.py) on synthetic stored searches: warm vs cold on test, search gains on test
and validation, trials to reach the start, the best single layer when stored, and the targets' summary lines."""

from __future__ import annotations

from optuna.trial import TrialState

from ilge_search.record import Identity, WarmMember, WarmStartRecord, save_warm_start
from ilge_search.report.warmstart import summary_lines, warmstart_rows, write_warmstart_page
from ilge_search.testing import FakeTrial, add_study, final_record

MODEL = "minilm-l6"


def search(url, task, warm, values, *, tests, start_test, selected, encoder="cayley"):
    """One stored search: trial 0 the start, ``values`` its trials' validation scores (``None``: pruned)."""
    trials = [
        FakeTrial(v, recommended=i == 0) if v is not None else FakeTrial(None, state=TrialState.PRUNED)
        for i, v in enumerate(values)
    ]
    final = final_record(
        tests,
        trial=selected,
        start_test_mean=start_test,
        search_gain=sum(tests) / len(tests) - start_test,
        selected_value=values[selected],
    )
    identity = Identity(
        model=MODEL, task=task, encoder=encoder, max_train=500, max_eval=400, max_epochs=10, warm_start=warm or None
    )
    study = add_study(url, identity, trials=trials, final=final)
    if warm:
        members = tuple(WarmMember(name, {}, ("other-task",)) for name in ("c4", "c2")[:warm])
        save_warm_start(study, WarmStartRecord("the portfolio stored in x", ("p1", "p2"), task, members))
    return study


def storage_of_8(tmp_path):
    url = f"sqlite:///{tmp_path / 'warm8.db'}"
    search(url, "trec", 0, [0.80, 0.70, 0.79, 0.82, 0.75, 0.81, None, 0.78], tests=[0.70, 0.72, 0.74],
           start_test=0.73, selected=3)  # fmt: skip
    search(url, "trec", 2, [0.80, 0.83, 0.79, 0.70, 0.71, 0.72, 0.73, 0.74], tests=[0.75, 0.76, 0.77],
           start_test=0.73, selected=1)  # fmt: skip
    search(url, "emotion", 2, [0.50, 0.40, 0.45, 0.41, 0.42, 0.43, 0.44, 0.30], tests=[0.49, 0.50, 0.51],
           start_test=0.52, selected=0)  # fmt: skip
    search(url, "trec", 0, [0.74], tests=[0.74, 0.74, 0.74], start_test=0.74, selected=0, encoder="best-layer")
    return url


def test_the_rows_hold_test_and_validation_gains_trials_to_reach_the_start_and_the_best_layer(tmp_path):
    rows = {(r.task, r.warm): r for r in warmstart_rows(storage_of_8(tmp_path))}
    assert set(rows) == {("trec", 0), ("trec", 2), ("emotion", 2)}  # the best-layer study is no search
    cold, warm, emotion = rows["trec", 0], rows["trec", 2], rows["emotion", 2]
    assert cold.trials == 8 and cold.to_reach == 3  # trial 3 is the first at or above the start's 0.80
    assert round(cold.gain_test, 2) == -1.00 and round(cold.gain_val, 2) == 2.00
    assert round(warm.test_mean, 2) == 76.00 and round(warm.test_std, 2) == 1.00 and warm.to_reach == 1
    assert round(warm.gain_test, 2) == 3.00 and round(warm.best_layer, 2) == 74.00 and warm.members == ("c4", "c2")
    assert emotion.to_reach is None and emotion.best_layer is None and round(emotion.gain_val, 2) == 0.00


def test_the_page_tables_each_search_and_states_the_targets(tmp_path):
    url = storage_of_8(tmp_path)
    url16 = f"sqlite:///{tmp_path / 'warm16.db'}"  # the same search resumed to 16 trials, in its own storage
    search(url16, "trec", 2, [0.80, 0.83, *[0.70] * 14], tests=[0.78, 0.78, 0.78], start_test=0.73, selected=1)
    # stopped at 11 of its 16 trials: its final evaluation belongs to its first 8, so it is named, not tabled
    search(
        url16, "trec", 0, [0.80, 0.70, 0.79, 0.82, *[0.75] * 7], tests=[0.70, 0.72, 0.74], start_test=0.73, selected=3
    )
    page = write_warmstart_page([url, url16], tmp_path / "reports" / "warmstart.md").read_text()
    assert "| minilm-l6 | trec | 500 | 8 | cold | 72.00 ± 2.00 | - | -1.00 | +2.00 | 3 | -2.00 | - |" in page
    assert "| minilm-l6 | trec | 500 | 8 | warm 2 | 76.00 ± 1.00 | +4.00 | +3.00 | +3.00 | 1 | +2.00 | c4, c2 |" in page
    assert "| minilm-l6 | emotion | 500 | 8 | warm 2 | 50.00 ± 1.00 | - | -2.00 | +0.00 | never | not stored |" in page
    assert "| minilm-l6 | trec | 500 | 16 | warm 2 | 78.00 ± 0.00 | - | +5.00 |" in page  # no cold 16-trial search
    assert "| 11 |" not in page and "11-trial" not in page
    assert (
        "Not shown, short of a budget of 8 or 16 trials: `minilm-l6:trec:cayley:train500:eval400:ep10` (11 trials)."
        in page
    )
    assert (
        "Mean search gain of warm-started (K = 2) 8-trial searches at 500 texts (test, selected trial minus start, "
        "same seeds): +0.50 points over 2 searches." in page
    )
    assert "Of these 2 warm-started (K = 2) searches, 1 ends below their start on test." in page
    assert "Mean search gain of cold 8-trial searches at 500 texts" in page and "over 1 searches" in page
    assert "Mean search gain of warm-started (K = 2) 16-trial searches at 500 texts" in page
    assert "Selection rule of the final evaluations: best." in page
    assert "*val* columns are validation scores" in page and "nothing here was chosen on test" in page


def test_an_empty_storage_says_nothing_is_stored_yet(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    search(url, "trec", 0, [0.80, 0.81, *[0.70] * 6], tests=[0.7], start_test=0.7, selected=1)  # cold only
    assert summary_lines(warmstart_rows(url)) == ["No warm-started 8-trial search at 500 training texts is stored yet."]
    page = write_warmstart_page(url, tmp_path / "page.md").read_text()
    assert "No warm-started 8-trial search at 500 training texts is stored yet." in page


def test_warm_minus_cold_and_the_search_gains_carry_their_intervals(tmp_path):
    from ilge_search.report.warmstart import interval_lines

    lines = interval_lines(warmstart_rows(storage_of_8(tmp_path)))
    # trec: warm 2 scored 75/76/77 where cold scored 70/72/74 with the same seeds: +5, +4, +3 per seed, a win
    assert lines[0] == (
        "warm-started (K = 2) minus cold, 8 trials at 500 texts (test, higher is better): +4.00 points [+4.00, "
        "+4.00] over 1 search (95% bootstrap over searches: a win; per search over the seeds, 95% t interval: "
        "1 win, 0 tie, 0 loss)."
    )
    assert lines[1].startswith("Search gain of warm-started (K = 2) 8-trial searches at 500 texts (test): +0.50 points")
    assert "over 2 searches" in lines[1] and lines[-1].startswith("Search gain of cold 8-trial searches")
