"""Study stages as plug-ins: a toy stage registered from here runs after the built-in ones on a real
(synthetic-embedding) study and is skipped on a rerun while its stored result is current, and a toy stage's
cost is counted by the dry run and the time budget, with no edit to the library; the registry's order and
refusals."""

from __future__ import annotations

import hashlib
import json
import logging

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.record import ensemble_record, run_times, study_record
from ilge_search.report import build_report
from ilge_search.storage import count_trials
from ilge_search.study import StudyOptions, run_study
from ilge_search.study.notes import write_study_note
from ilge_search.study.results import list_studies
from ilge_search.study.stages import (
    Stage,
    StageContext,
    StagePart,
    register_stage,
    registered_stages,
    unregister_stage,
)
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=240, max_eval=100)


class CompleteTrialCount(Stage):
    """Stores the study's complete trial count and what the built-in stages stored before it, in a file."""

    name = "toy-count"

    def __init__(self, folder):
        self.folder = folder
        self.runs: list[str] = []

    def _path(self, context: StageContext):
        # a study's name holds the model's path, so the file is named by its hash
        return self.folder / f"{hashlib.sha256(context.study.study_name.encode()).hexdigest()[:16]}.json"

    def applies(self, context: StageContext) -> bool:
        return True

    def is_current(self, context: StageContext) -> bool:
        path = self._path(context)
        return path.exists() and json.loads(path.read_text())["complete"] == count_trials(context.study, ("COMPLETE",))

    def current_note(self, context: StageContext) -> str:
        return "the toy count is up to date"

    column_names = ("toy_complete",)

    def _stored(self, study):
        path = self.folder / f"{hashlib.sha256(study.study_name.encode()).hexdigest()[:16]}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def columns(self, study):
        stored = self._stored(study)
        return {"toy_complete": None if stored is None else stored["complete"]}

    def note_lines(self, study, metric):
        stored = self._stored(study)
        return [] if stored is None else ["", f"Toy count: {stored['complete']} complete trials."]

    def report_part(self, studies):
        counts = [(study.study_name, self._stored(study)) for study in studies]
        rows = tuple((name.split(":")[-1], str(stored["complete"])) for name, stored in counts if stored)
        if not rows:
            return None
        return StagePart("Toy counts", "Complete trials per study.", ("encoder", "complete"), rows)

    def run(self, context: StageContext) -> None:
        self.runs.append(context.name)
        stored = {
            "complete": count_trials(context.study, ("COMPLETE",)),
            "final_before": study_record(context.study).final is not None,
            "ensemble_before": ensemble_record(context.study) is not None,
        }
        self._path(context).write_text(json.dumps(stored))


@pytest.fixture
def toy_stage(tmp_path):
    stage = register_stage(CompleteTrialCount(tmp_path), after="ensemble")
    try:
        yield stage
    finally:
        unregister_stage(stage.name)


def test_the_built_in_stages_come_first_and_the_registry_refuses_clashes(toy_stage):
    names = [stage.name for stage in registered_stages()]
    assert names[:3] == ["final", "ensemble", "toy-count"]
    with pytest.raises(ValueError, match="registered already"):
        register_stage(CompleteTrialCount(toy_stage.folder))
    nameless = CompleteTrialCount(toy_stage.folder)
    nameless.name = ""
    with pytest.raises(ValueError, match="needs a name"):
        register_stage(nameless)
    other = CompleteTrialCount(toy_stage.folder)
    other.name = "toy-other"
    with pytest.raises(ValueError, match="no stage named 'nowhere'"):
        register_stage(other, after="nowhere")
    assert "toy-other" not in [stage.name for stage in registered_stages()]


def test_a_registered_stage_runs_after_the_built_ins_and_is_skipped_while_current(
    toy_stage, synthetic, tmp_path, caplog
):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    common = dict(
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        threads=1,
        progress=False,
        max_epochs=3,
        final_seeds=1,
        ensemble=2,
        seed=0,
        **DATA,
    )
    synthetic.cache("trec", **DATA)
    with refuse_model_loads():
        first = run_study(
            synthetic.model, "trec", "fc", storage=url, options=StudyOptions.from_flat(n_trials=3, **common)
        )
    name = first[0].study_name
    assert toy_stage.runs == [name]
    files = list(toy_stage.folder.glob("*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert stored["final_before"] and stored["ensemble_before"]  # the built-in stages ran first
    assert stored["complete"] >= 1
    # its column in the `studies` listing and its lines in the dashboard note, beside the built-in ones
    listing = list_studies(url)
    assert list(listing.columns[-3:]) == ["ensemble_k", "ensemble_test_mean", "toy_complete"]
    assert listing["toy_complete"].tolist() == [stored["complete"]]
    note = write_study_note(optuna.load_study(study_name=name, storage=url))
    assert "### Ensembles" in note and note.index("### Ensembles") < note.index("Toy count: ")
    # its section in the results report, after the built-in sections and before the studies table
    report = build_report(url, tmp_path / "report", figures=False, progress=False).files["markdown"].read_text()
    assert "## Toy counts" in report and report.index("## Toy counts") < report.index("## Studies")
    assert "| encoder | complete |" in report and f"| {name.split(':')[-1]} | {stored['complete']} |" in report

    caplog.set_level(logging.INFO, logger="ilge_search")
    with refuse_model_loads():
        run_study(synthetic.model, "trec", "fc", storage=url, options=StudyOptions.from_flat(n_trials=0, **common))
    assert toy_stage.runs == [name]  # current: not run again
    assert f"{name}: the toy count is up to date" in caplog.text
    assert f"{name}: final scores of trial" in caplog.text and "is up to date" in caplog.text
    # each run recorded where its time went on the study: the first searched and ran every stage, in order;
    # the rerun added no trial and found every stage current
    first_run, rerun = run_times(optuna.load_study(study_name=name, storage=url))
    assert list(first_run.stages) == ["final", "ensemble", "toy-count"] and first_run.current == []
    assert first_run.search > 0 and first_run.trials_added == 3 and first_run.trial_cap == 3
    assert first_run.elapsed >= first_run.before_search + first_run.search + sum(first_run.stages.values())
    assert first_run.limit is None and first_run.used is None
    assert rerun.stages == {} and rerun.current == ["final", "ensemble", "toy-count"] and rerun.trials_added == 0
    assert rerun.stage("final") == 0.0 and rerun.stage("leaderboard") is None and rerun.started > first_run.started


def test_unregistering_restores_the_built_in_pipeline(tmp_path):
    before = [stage.name for stage in registered_stages()]
    stage = register_stage(CompleteTrialCount(tmp_path))
    assert [s.name for s in registered_stages()] == [*before, stage.name]
    assert unregister_stage(stage.name) is stage
    assert [s.name for s in registered_stages()] == before
    with pytest.raises(ValueError, match="no stage named"):
        unregister_stage(stage.name)


class WaitingStage(Stage):
    """Costs a fixed number of seconds after the search (a stage that waits on a remote service, say)."""

    name = "toy-wait"
    seconds = 15.0

    def applies(self, context) -> bool:
        return True

    def reserve_seconds(self, context, trials) -> float:
        return self.seconds

    def is_current(self, context: StageContext) -> bool:
        return True  # nothing to store: the test times the budget, not the stage

    def run(self, context: StageContext) -> None:
        raise AssertionError("a current stage does not run")


@pytest.fixture
def waiting_stage():
    stage = register_stage(WaitingStage())
    try:
        yield stage
    finally:
        unregister_stage(stage.name)


def test_a_registered_stages_cost_is_in_the_dry_run_and_the_time_limits_split(
    waiting_stage, synthetic, tmp_path, caplog
):
    synthetic.cache("trec", **DATA)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    where = ["--data-dir", str(synthetic.data_dir), "--cache-dir", str(synthetic.cache_dir), "--device", "cpu"]
    args = ["run", "--model", synthetic.model, "--task", "trec", "--encoder", "fc", "--storage", url, *where]
    size = ["--max-train", "240", "--max-eval", "100", "--max-epochs", "3", "--threads", "1"]
    with refuse_model_loads():
        result = CliRunner().invoke(cli, [*args, *size, "--n-trials", "2", "--time-limit", "10m", "--dry-run"])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.strip().startswith("time limit 600 s")]
    assert line.endswith(", toy-wait ~15 s") and ", final ~" in line, result.output  # after the built-in stages
    (study_line,) = [line for line in result.output.splitlines() if "+2 trials" in line]
    assert "retrainings, toy-wait ~15 s" in study_line, result.output  # after the built-in stages' retrainings

    caplog.set_level(logging.INFO, logger="ilge_search")
    options = StudyOptions.from_flat(
        n_trials=None, time_limit=20, final_seeds=1, ensemble=2, seed=0, max_epochs=3, threads=1, progress=False, **DATA
    )
    where_options = dict(data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu")
    with refuse_model_loads():
        (done,) = run_study(synthetic.model, "trec", "fc", storage=url, options=options.replace(**where_options))
    (split,) = [r.getMessage() for r in caplog.records if "time limit 20 s: search ~" in r.getMessage()]
    assert split.endswith(", toy-wait ~15 s") and ", final ~" in split, split
    assert run_times(optuna.load_study(study_name=done.study_name, storage=url))[-1].current == ["toy-wait"]
