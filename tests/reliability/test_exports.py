"""Exports and ensembles say what they are: the picks behind an ensemble, the seed an export takes and why,
the model card beside the weights, and what the ensemble stage costs (reused final models, slow members left
out, its retrainings counted by the dry run). On the synthetic setup: no language model loads."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from click.testing import CliRunner

from ilge_search import ILGEClassifier, run_study
from ilge_search.cli import cli
from ilge_search.encoders.configs import CayleyConfig
from ilge_search.record import EnsembleSize, Identity, TrialRecord, ensemble_record, study_record
from ilge_search.study import StudyOptions, plan_run
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=240, max_eval=100)
SMALL = dict(**DATA, max_epochs=4)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _size(members):
    counts = {str(n): c for n, c in members.items()}
    total = sum(counts.values())
    return EnsembleSize(size=total, members=counts, val_score=0.8, test_scores=[0.7], test_mean=0.7, test_std=0.0)


def test_an_ensemble_says_how_many_picks_and_which_trial_was_picked_twice():
    from ilge_search.study.results import StudyResult, summary_line

    assert _size({1: 1, 3: 2, 5: 1, 7: 1}).describe() == "5 picks (4 distinct trials, trial 3 twice)"
    assert _size({2: 3, 4: 1}).describe() == "4 picks (2 distinct trials, trial 2 3 times)"
    assert _size({0: 1, 1: 1, 2: 1}).describe() == "3 picks (3 distinct trials)"
    assert _size({6: 1}).describe() == "1 pick (1 distinct trial)"
    result = StudyResult("s", "", "m", "trec", "cayley", "accuracy", 5, 0, 0, ensemble=_size({1: 1, 3: 2, 5: 1, 7: 1}))
    line = summary_line(result)
    assert "ensemble of 5 picks (4 distinct trials, trial 3 twice): test accuracy 0.7000" in line
    assert "(4 trials)" not in line


def test_trials_far_slower_than_the_median_are_left_out_but_never_the_selected_or_the_start(tmp_path):
    from ilge_search.study.stages.ensemble_work import EnsembleRun, slow_trials
    from ilge_search.testing.store import FakeTrial, add_study

    config = dict(CayleyConfig().__dict__)

    def trial(value, seconds):
        return FakeTrial(value, record=TrialRecord(config=config, seconds=seconds))

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    # trial 0 is the start, trial 2 the best (selected); trial 3 took 46 s against about 4 s
    trials = [trial(0.70, 4.0), trial(0.71, 4.5), trial(0.80, 60.0), trial(0.75, 46.0), trial(0.72, 3.8)]
    study = add_study(url, Identity(model="minilm-l6", task="trec", encoder="cayley"), trials=trials)
    run = EnsembleRun(size=5, seeds=[0, 1, 2], max_epochs=4)
    assert slow_trials(study, study.trials, run) == {3: 46.0}  # the slow selected trial 2 stays
    assert slow_trials(study, study.trials, EnsembleRun(size=5, seeds=[0], max_epochs=4, slow_factor=None)) == {}
    quick = [trial(0.70, 0.5), trial(0.71, 0.6), trial(0.80, 0.6), trial(0.75, 2.0), trial(0.72, 0.7)]
    quick_study = add_study(url, Identity(model="minilm-l6", task="sst2", encoder="cayley"), trials=quick)
    assert slow_trials(quick_study, quick_study.trials, run) == {}  # 2 s is over 3x the median, but cheap


# ----------------------------------------------------------------------------- on one small study


@pytest.fixture(scope="module")
def exported(tmp_path_factory, synthetic):
    """A TREC Cayley study run with --ensemble 3 and 2 final seeds, with every training counted by the module
    that asked for it, then exported as one model and as the ensemble."""
    from ilge_search import engine

    folder = tmp_path_factory.mktemp("exports")
    url = f"sqlite:///{folder / 'studies.db'}"
    synthetic.cache("trec", **DATA)
    options = StudyOptions.from_flat(
        n_trials=4,
        final_seeds=2,
        ensemble=3,
        select="best",
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        threads=1,
        progress=False,
        **SMALL,
    )
    calls: list[str] = []
    original, original_many = engine.train_encoder, engine.train_many

    def asking_stage() -> str:  # the stage that asked, above the one retraining loop every stage shares
        frame = sys._getframe(2)
        while frame.f_back is not None and frame.f_globals["__name__"] == "ilge_search.study.retraining":
            frame = frame.f_back
        return frame.f_globals["__name__"]

    def counted(*args, **kwargs):
        calls.append(asking_stage())
        return original(*args, **kwargs)

    def counted_pass(jobs, *args, **kwargs):  # a pass counts each of its models
        calls.extend([asking_stage()] * len(jobs))
        return original_many(jobs, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, refuse_model_loads():
        patch.setattr(engine, "train_encoder", counted)
        patch.setattr(engine, "train_many", counted_pass)
        (result,) = run_study(synthetic.model, "trec", "cayley", storage=url, options=options)
    name = result.study_name
    single, ensemble = folder / "single", folder / "ensemble"
    with refuse_model_loads():
        one = invoke("export", "--storage", url, "--study", name, "--out", single)
        many = invoke("export", "--storage", url, "--study", name, "--ensemble", "--out", ensemble)
    return dict(
        url=url, name=name, calls=calls, single=single, ensemble=ensemble, one=one, many=many, model=synthetic.model
    )


def _load(exported, folder):
    return ILGEClassifier.load(exported[folder], base_model=exported["model"])


def _study(exported):
    import optuna

    return optuna.load_study(study_name=exported["name"], storage=exported["url"])


@pytest.mark.slow  # the module fixture runs one small study with an ensemble (about 20 s on 2 cores)
def test_the_ensemble_reuses_the_final_evaluations_models_instead_of_retraining_them(exported):
    study = _study(exported)
    record, final = ensemble_record(study), study_record(study).final
    assert record is not None and final is not None
    members = set(record.picks)
    assert final.trial in record.reused  # the selected trial was trained by the final evaluation just before
    assert set(record.reused) <= members | {final.trial, final.start_trial}
    retrained_here = [n for n in dict.fromkeys(record.picks) if n not in record.reused]
    # each member the final evaluation did not train costs one training per seed; the reused ones nothing
    assert exported["calls"].count("ilge_search.study.stages.ensemble_work") == 2 * len(retrained_here)
    assert record.left_out == {} or all(int(n) not in members for n in record.left_out)
    from ilge_search.cli.ensemble import format_ensemble

    assert f"not retrained (the final evaluation's models): trial(s) {', '.join(map(str, record.reused))}" in (
        format_ensemble(record)
    )


@pytest.mark.slow  # the module fixture runs one small study with an ensemble (about 20 s on 2 cores)
def test_export_says_which_seed_it_took_and_the_rule_and_the_tables_show_it(exported):
    study = _study(exported)
    final = study_record(study).final
    seed = final.artifact_seed
    seed_test = final.test_scores[final.seeds.index(seed)]
    assert exported["one"].exit_code == 0, exported["one"].output
    output = exported["one"].output
    assert f"seed {seed}: the final seed with the best validation score" in output
    assert f"among the final seeds {final.seeds}" in output and f"{final.test_mean:.4f}" in output
    provenance = _load(exported, "single").provenance_
    assert provenance["seed"] == seed and provenance["final_seeds"] == final.seeds
    assert provenance["seed_rule"].startswith("the final seed with the best validation score")
    assert provenance["test_score"] == pytest.approx(seed_test)
    assert provenance["test_mean"] == pytest.approx(final.test_mean)
    listed = invoke("studies", "--storage", exported["url"], "--format", "json")
    (row,) = [r for r in json.loads(listed.output) if r["study"] == exported["name"]]
    assert row["export_seed"] == seed and row["export_test"] == pytest.approx(seed_test)
    from ilge_search.study import format_results, study_result

    assert f"export: seed {seed} test {seed_test:.4f}" in format_results([study_result(study)])


@pytest.mark.slow  # the module fixture runs one small study with an ensemble (about 20 s on 2 cores)
def test_the_ensemble_export_names_its_picks_seed_and_rule(exported):
    record = ensemble_record(_study(exported))
    assert exported["many"].exit_code == 0, exported["many"].output
    output = exported["many"].output
    assert record.ensemble.describe() in output
    assert f"seed {record.artifact_seed}: the final seed whose ensemble has the best validation score" in output
    provenance = _load(exported, "ensemble").provenance_
    assert provenance["picks"] == record.ensemble.describe() and provenance["final_seeds"] == record.seeds


def _card(folder):
    text = (folder / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


@pytest.mark.slow  # the module fixture runs one small study with an ensemble (about 20 s on 2 cores)
def test_an_export_writes_a_hub_model_card_that_load_ignores(exported):
    meta, body = _card(exported["single"])
    assert set(meta) == {"base_model", "library_name", "tags", "datasets", "metrics", "license", "pipeline_tag"}
    assert meta["library_name"] == "ilge-search" and meta["pipeline_tag"] == "text-classification"
    assert meta["datasets"] == ["CogComp/trec"] and meta["license"] == "unknown"  # trec's source states none
    assert meta["metrics"] == ["accuracy"] and "cayley" in meta["tags"] and "trec" in meta["tags"]
    provenance = _load(exported, "single").provenance_
    assert meta["base_model"] == str(exported["model"])  # a local model folder: its path (a hub id otherwise)
    for needed in (
        f"Exported seed: {provenance['seed']}",
        f"study `{exported['name']}`",
        "Labels (",
        "## Training data and licence",
        "ILGEClassifier.load(",
        "ilge-search predict",
    ):
        assert needed in body, needed
    ensemble_meta, ensemble_body = _card(exported["ensemble"])
    assert "ensemble" in ensemble_meta["tags"] and "distinct trial" in ensemble_body


def test_the_card_names_the_licence_of_a_shipped_task_and_the_hub_metric():
    from ilge_search.study.card import ExportedModel, is_model_card, model_card

    provenance = {"task": "stsb", "metric": "spearman", "encoder": "cayley", "seed": 1, "final_seeds": [0, 1]}
    card = model_card(
        ExportedModel("similarity", "sentence-transformers/all-MiniLM-L6-v2", [], "ILGEClassifier", provenance)
    )
    meta = yaml.safe_load(card[4:].split("\n---\n", 1)[0])
    assert meta["license"] == "cc-by-sa-4.0" and meta["metrics"] == ["spearmanr"]
    assert meta["pipeline_tag"] == "sentence-similarity" and meta["datasets"] == ["mteb/stsbenchmark-sts"]
    assert is_model_card(card) and not is_model_card("# my notes\n")
    custom = model_card(ExportedModel("classification", "m", ["a", "b"], "ILGEClassifier", {"task": "mine"}))
    assert "license: unknown" in custom and "datasets:" not in custom


@pytest.mark.slow  # the module fixture runs one small study with an ensemble (about 20 s on 2 cores)
def test_a_readme_no_export_wrote_is_refused_before_any_work_and_a_card_is_replaced(exported, tmp_path):
    from ilge_search.use.export import check_card_path

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("# my notes\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a model card an export wrote; pass another --out, or --force"):
        check_card_path(str(mine), force=False)
    check_card_path(str(mine), force=True)
    check_card_path(str(exported["single"]), force=False)  # an earlier export's card: replaced
    with refuse_model_loads():
        again = invoke(
            "export", "--storage", exported["url"], "--study", exported["name"], "--out", exported["single"], "--force"
        )
    assert again.exit_code == 0, again.output
    assert _card(exported["single"])[0]["library_name"] == "ilge-search"


def test_the_dry_run_counts_the_ensembles_retrainings(tmp_path, synthetic):
    synthetic.cache("trec", **DATA)
    common = dict(
        data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu", threads=1, progress=False, **SMALL
    )
    url = f"sqlite:///{tmp_path / 'studies.db'}"

    def plan(**options):
        return plan_run(
            synthetic.model,
            "trec",
            "cayley",
            storage=url,
            calibrate=False,
            options=StudyOptions.from_flat(n_trials=8, final_seeds=3, **common, **options),
        )

    (default,) = plan().studies
    assert default.runs("ensemble") == 3 * (5 - 1)  # the default ensemble of 5: its first pick reuses the final's
    assert "ensemble up to 12 retrainings" in plan().describe()
    assert plan(ensemble=0).studies[0].runs("ensemble") == 0
    assert plan(ensemble=3).studies[0].runs("ensemble") == 3 * 2
    assert plan(protocol="paper").studies[0].runs("ensemble") == 0  # paper-protocol studies have no ensemble
    assert not (tmp_path / "studies.db").exists()
