"""The import contract of ``ilge_search``, read from the source with ``ast`` (nothing is imported but the stage
registry, for the names of its stages).

- Layers: a module imports only from its own layer or lower ones (ARCHITECTURE.md draws them).
- No import cycle between modules, counting imports inside functions (lazy imports).
- No private name (leading underscore) imported from another module, and no private module of
  another package (``optuna.storages._rdb``): those break without notice on upgrades.
- At most 8 modules beside ``__init__.py`` at the top level, and no module longer than 700 lines (as `ruff format`
  writes them).
- The time budget, the dry run's plan and the runner name no built-in stage: each stage costs itself.
- No function longer than 60 lines, and none with more than 8 parameters outside ``cli/`` (click
  passes a command every option as a parameter) and the published API: the functions ``__init__.py``
  exports, and the constructor and public methods of the classes it exports and of their bases (a
  scikit-learn estimator takes its settings as keyword arguments of ``__init__``; ``get_params`` reads them),
  and the constructors of the torch modules in ``nn/`` (a module's hyperparameters are its keyword
  arguments, as in PyTorch Geometric's convolutions).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ilge_search"
MAX_LINES = 700  # lines as `ruff format` writes them
MAX_TOP_LEVEL_MODULES = 8  # beside __init__.py: the rest lives in one package per pipeline stage
MAX_FUNCTION_LINES = 60  # from the `def` line to the last line of the body, decorators not counted
MAX_PARAMETERS = 8  # self and cls not counted; click commands in cli/ and the published API are exempt

# first component below ilge_search -> layer; higher layers may import lower ones, never the reverse
LAYERS: dict[str, int] = {
    "_version": 0,
    "settings": 0,
    "progress": 0,
    "validation": 0,
    "files": 0,
    "nn": 2,
    "encoders": 2,  # configs, graphs, the registry and the aggregator; nn reads the configs, the registry reads nn
    "tuning": 2,
    "record": 2,
    "tasks": 3,
    "embeddings": 3,
    "engine": 3,
    "storage": 3,
    "study": 5,
    "defaults": 6,
    "use": 6,  # above study: ILGEClassifier.from_study reads studies
    # report above defaults: it reads what defaults/ stored and trains nothing
    "report": 7,
    "cli": 8,
    "testing": 8,
    "__init__": 9,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1 and parts != ["ilge_search", "__init__"]:
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import statement, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            found += [(target, alias.name, node.lineno) for alias in node.names]
    return found


def _internal_target(target: str, name: str, modules: dict[str, Path]) -> str:
    """The ilge_search module an import reaches (``from .study import runner`` reaches ``study.runner``)."""
    if name and f"{target}.{name}" in modules:
        return f"{target}.{name}"
    return target


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        for target, name, _ in _imports(module, path):
            if target == "ilge_search" or not target.startswith("ilge_search."):
                continue  # importing the top package itself only runs its light, lazy __init__
            reached = _internal_target(target, name, modules)
            if reached in modules and reached != module:
                graph[module].add(reached)
    return graph


def test_every_component_has_a_layer():
    components = {_component(name) for name in _modules()}
    assert components <= set(LAYERS), f"add {sorted(components - set(LAYERS))} to LAYERS and ARCHITECTURE.md"


def test_no_module_imports_a_higher_layer():
    wrong = []
    for module, targets in _graph().items():
        for target in targets:
            if LAYERS[_component(target)] > LAYERS[_component(module)]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "lower layers import higher ones: " + ", ".join(sorted(wrong))


def _find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_no_import_cycles_lazy_imports_included():
    cycle = _find_cycle(_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) == []


def test_no_private_names_from_other_modules():
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        for target, name, line in _imports(module, path):
            internal = target == "ilge_search" or target.startswith("ilge_search.")
            private_name = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            private_module = any(part.startswith("_") for part in target.split(".")[1:])
            if private_name and _internal_target(target, name, modules) == target:
                wrong.append(f"{path.name}:{line} imports {name} from {target}")
            elif private_module and not internal:
                wrong.append(f"{path.name}:{line} imports the private module {target}")
    assert not wrong, "\n".join(wrong)


def test_few_modules_at_the_top_level():
    top = sorted(path.stem for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules ({', '.join(top)}): move some"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_size(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines; split it (at most {MAX_LINES})"


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in names if name not in ("self", "cls")]


def _published_names(package: Path) -> set[str]:
    """The names ``__init__.py`` exports lazily (its ``_LAZY`` table), and the in-package bases of its classes."""
    init = package / "__init__.py"
    names: set[str] = set()
    if init.exists():
        for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_LAZY" for t in node.targets):
                names |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    bases: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.id for b in node.bases if isinstance(b, ast.Name)}
    todo = [name for name in names if name in bases]
    while todo:
        for base in bases.get(todo.pop(), set()) - names:
            names.add(base)
            todo.append(base)
    return names


def _published_functions(path: Path, published: set[str]) -> set[int]:
    """Line numbers of the published functions and methods defined in ``path``, and of nn/'s constructors."""
    lines = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in published:
            lines.add(node.lineno)
        module = path.parent.name == "nn"
        if isinstance(node, ast.ClassDef) and (node.name in published or module):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and (item.name == "__init__" or not item.name.startswith("_")):
                    lines.add(item.lineno)
    return lines


def _long_or_wide_functions(package: Path) -> list[str]:
    """One line per function of ``package`` over the line or the parameter limit."""
    wrong = []
    published = _published_names(package)
    for path in sorted(package.rglob("*.py")):
        in_cli = path.relative_to(package).parts[0] == "cli"
        exempt = _published_functions(path, published)
        for function in _functions(path):
            where = f"{path.relative_to(package)}:{function.lineno} {function.name}"
            lines = function.end_lineno - function.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                wrong.append(f"{where} has {lines} lines (at most {MAX_FUNCTION_LINES}); split it")
            count = len(_parameters(function))
            if count > MAX_PARAMETERS and not in_cli and function.lineno not in exempt:
                wrong.append(f"{where} takes {count} parameters (at most {MAX_PARAMETERS}); group them in a dataclass")
    return wrong


def test_functions_are_short_and_take_few_parameters():
    wrong = _long_or_wide_functions(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_function_check_finds_a_long_and_a_wide_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    wide = ", ".join(f"p{i}" for i in range(9))
    source = (
        f"def long():\n{body}\n    return x0\n\n\ndef wide(self, {wide}):\n    pass\n\n\ndef fine(a, b):\n    pass\n"
    )
    for folder in ("study", "cli"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "probe.py").write_text(source, encoding="utf-8")
    published = "class Estimator:\n    def __init__(self, " + wide + "):\n        pass\n"
    (tmp_path / "study" / "estimator.py").write_text(published + f"\n\ndef load({wide}):\n    pass\n", encoding="utf-8")
    (tmp_path / "__init__.py").write_text('_LAZY = {"Estimator": "study.estimator"}\n', encoding="utf-8")
    assert _long_or_wide_functions(tmp_path) == [
        "cli/probe.py:1 long has 61 lines (at most 60); split it",  # cli/ is exempt from the parameters only
        "study/estimator.py:6 load takes 9 parameters (at most 8); group them in a dataclass",  # not published
        "study/probe.py:1 long has 61 lines (at most 60); split it",
        "study/probe.py:64 wide takes 9 parameters (at most 8); group them in a dataclass",
    ]


# the study record is the one reader and writer of what ilge-search stores on studies and trials;
# storage.py stamps the process that runs a trial
USER_ATTR_MODULES = {"storage.py"}  # and every module of the record package, ilge_search/record/


def _touches_user_attrs(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in ("user_attrs", "set_user_attr"):
            return True
    return False


def test_only_the_record_and_the_storage_touch_user_attrs():
    touching = {str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py")) if _touches_user_attrs(path)}
    outside = {path for path in touching if not path.startswith("record/")}
    assert outside <= USER_ATTR_MODULES, f"read and write study and trial attrs through ilge_search.record: {outside}"


def test_user_attr_check_finds_an_access(tmp_path):
    (tmp_path / "reads.py").write_text("def f(study):\n    return study.user_attrs.get('x')\n", encoding="utf-8")
    (tmp_path / "writes.py").write_text("def g(trial):\n    trial.set_user_attr('x', 1)\n", encoding="utf-8")
    (tmp_path / "clean.py").write_text("def h(record):\n    return record.final\n", encoding="utf-8")
    assert [_touches_user_attrs(tmp_path / n) for n in ("reads.py", "writes.py", "clean.py")] == [True, True, False]


# the option group and option that share the first stage's name (``options.final.seeds``, ``--final-seeds``)
_OPTION_SPELLINGS = re.compile(r"options\.final\.|final[ _-]seeds?")


@pytest.mark.parametrize("module", ["study/budget.py", "study/plan.py", "study/runner.py"])
def test_the_budget_the_plan_and_the_runner_name_no_built_in_stage(module):
    from ilge_search.study.stages import registered_stages  # the built-in stages, as registered

    text = _OPTION_SPELLINGS.sub("", (PACKAGE / module).read_text())
    for stage in registered_stages():
        for name in (stage.name, type(stage).__name__):
            found = re.search(rf"\b{re.escape(name)}\b", text, flags=re.IGNORECASE)
            assert found is None, (
                f"{module} names the {stage.name} stage: ...{text[found.start() - 40 : found.end() + 40]}..."
            )


# an import inside a function hides the call graph from readers and tools: it stays there only for a heavy
# optional dependency or a real import cycle, and its comment says which
MAX_FUNCTION_IMPORTS = 100
_IMPORT_REASON = re.compile(r"#\s*(heavy|cycle):")


def _function_imports(package: Path) -> tuple[int, list[str]]:
    """How many imports stand inside the functions of ``package``, and those whose comment gives no reason."""
    count, silent = 0, []
    for path in sorted(package.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        inside = {
            (node.lineno, node.end_lineno or node.lineno)
            for function in _functions(path)
            for node in ast.walk(function)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        }
        count += len(inside)
        for first, last in sorted(inside):
            if not _IMPORT_REASON.search(" ".join(lines[first - 1 : last])):
                silent.append(f"{path.relative_to(package)}:{first}")
    return count, silent


def test_imports_inside_functions_are_few_and_say_why():
    count, silent = _function_imports(PACKAGE)
    assert not silent, "move these imports to the top, or say why they stay (# heavy: / # cycle:): " + ", ".join(silent)
    assert count <= MAX_FUNCTION_IMPORTS, f"{count} imports inside functions (at most {MAX_FUNCTION_IMPORTS})"


def _locals_calls(package: Path) -> list[str]:
    return [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "locals"
    ]


def test_no_arguments_are_forwarded_through_locals():
    assert not _locals_calls(PACKAGE), "pass arguments by name: " + ", ".join(_locals_calls(PACKAGE))


def test_import_and_locals_checks_find_what_they_look_for(tmp_path):
    (tmp_path / "probe.py").write_text(
        "import os\n\n\ndef f():\n    import json\n    from . import a  # cycle: a imports this module\n"
        "    import torch  # heavy: torch loads in seconds\n    return g(**locals())\n",
        encoding="utf-8",
    )
    assert _function_imports(tmp_path) == (3, ["probe.py:5"])
    assert _locals_calls(tmp_path) == ["probe.py:8"]
