"""The command line names the library's choices and documents the study options once.

The CLI modules copy a few choice tuples whose library module imports torch, numpy or the study runner, so
that `ilge-search --help` stays fast; these tests check every such ``click.Choice`` against the library's
constant (the options of ``StudyOptions`` fields copy nothing: their field's flag makes them), and that each
option of a ``StudyOptions`` field shows that field's help and default.
"""

from __future__ import annotations

import subprocess
import sys

import click

from ilge_search.cli import cli
from ilge_search.cli.group import StudyOption, study_option_help
from ilge_search.defaults.loto import LOTO_FAMILIES
from ilge_search.defaults.recommend import DEFAULT_FAMILIES
from ilge_search.defaults.recommend import METHODS as RECOMMEND_METHODS
from ilge_search.embeddings.cache import STORAGE_DTYPES
from ilge_search.embeddings.extraction import POOLINGS
from ilge_search.encoders import encoder_families
from ilge_search.study import encoder_choices
from ilge_search.study.objectives import OBJECTIVES
from ilge_search.study.options import FLAT_NAMES, option_default, option_help
from ilge_search.tuning import MODEL_SIZE_HINTS
from ilge_search.use.explain import EXPLAIN_FORMATS

# option name (its Python name) -> the library constant of its choices, whichever command has it
LIBRARY_CHOICES: dict[str, tuple[str, ...]] = {
    "pooling": POOLINGS,
    "storage_dtype": tuple(STORAGE_DTYPES),
    "families": encoder_families(),
    "family": encoder_families(),
    "bucket": MODEL_SIZE_HINTS,
    "method": RECOMMEND_METHODS,
    "fmt": EXPLAIN_FORMATS,
}
# the commands that build StudyOptions from their options (others reuse a few names for other things:
# `export --seed`, `loto --final-seeds`); --data-dir, --cache-dir and --device are every command's
STUDY_COMMANDS = ("run", "sweep")
LOCATION_OPTIONS = {"data_dir", "cache_dir", "device"}


def _commands(group: click.Group = cli, path: tuple[str, ...] = ()):
    for name, command in sorted(group.commands.items()):
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def _options():
    for path, command in _commands():
        for param in command.params:
            if isinstance(param, click.Option):
                yield " ".join(path), param


def test_every_choice_option_lists_the_library_constant():
    seen = set()
    for command, option in _options():
        if not isinstance(option.type, click.Choice) or isinstance(option, StudyOption):
            continue
        assert option.name in LIBRARY_CHOICES, f"`{command} {option.opts[0]}`: add its library constant here"
        assert tuple(option.type.choices) == LIBRARY_CHOICES[option.name], f"`{command} {option.opts[0]}`"
        seen.add(option.name)
    assert seen == set(LIBRARY_CHOICES)


def test_the_family_choices_are_one_constant():
    assert LOTO_FAMILIES == DEFAULT_FAMILIES == encoder_families()
    assert encoder_choices()[: len(encoder_families())] == encoder_families()


def test_each_study_option_shows_its_fields_help_and_default():
    study_options = 0
    for command, option in _options():
        if command not in STUDY_COMMANDS or option.name not in FLAT_NAMES or option.name in LOCATION_OPTIONS:
            continue
        where = f"`{command} {option.opts[0]}`"
        assert isinstance(option, StudyOption), f"{where}: declare it with study_options({option.name!r})"
        study_options += 1
        help_text = option.get_help_record(click.Context(cli))[1]
        description = option_help(option.study_field)
        assert help_text.startswith(description[:1].upper() + description[1:]), where
        if option.default is not None and not option.multiple:
            assert option.default == option_default(option.study_field), where
    # run's (with the six column options, --warm-start, --ensemble, --methods and --time-limit) and sweep's
    assert study_options == 34 + 7


def test_defaults_click_cannot_show_come_from_the_fields():
    run = cli.commands["run"]
    helps = {p.name: p.get_help_record(click.Context(run))[1] for p in run.params if isinstance(p, click.Option)}
    assert helps["select"].endswith(f"[default: {option_default('select')}]")
    assert "[default: 5]" in helps["final_front"] and "[default: 20; with --total-trials" in helps["n_trials"]
    assert study_option_help("objectives", "[default: {default}]").endswith("[default: score]")
    assert all(f"'{name}'" in helps["objectives"] for name in OBJECTIVES)
    assert all(name in helps["encoders"] for name in encoder_choices())


def test_the_group_help_imports_neither_the_study_options_nor_numpy():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from ilge_search.cli import cli\n"
        "assert CliRunner().invoke(cli, ['--help']).exit_code == 0\n"
        "print(sorted({'ilge_search.study.options', 'ilge_search.record', 'numpy', 'torch'} & set(sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
