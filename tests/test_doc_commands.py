"""Every shell block of README.md and of the guide pages runs in a bare clone, or says next to it what it needs.

A bare clone here is a ``git clone`` of this checkout's HEAD (commit first: uncommitted edits are not in it)
into a temporary folder with nothing beside it (no ``../shared``), a fresh ``HOME`` and no
``$ILGE_SEARCH_DATA``. Each page's blocks run in order with bash in the clone, ``ilge-search`` being this
environment's command on the clone's code (``PYTHONPATH``; the clone's ``.venv/bin/activate`` puts this
environment's commands first on ``PATH``, so ``. .venv/bin/activate`` works as written). After the last block
``git status`` must be clean: `.gitignore` expects every file the documented commands write by default.
README.md and the guide repeat the quick start, so they share one clone: the guide's run resumes the
finished study, and what the README's commands wrote outside ``studies/`` is removed before the guide's.

What this test changes, so that a page takes about a minute on 2 cores: the budgets are capped (:data:`CAPS`:
``--max-train 200``, ``--max-eval 100``, ``--max-epochs 2``, 2 trials, 1 worker) and the study names the pages
write (``...:train2000:eval800:ep10``) are changed to match; a ``run`` gets ``--final-seeds 1``; ``dashboard``
is started on a free port, must say that it serves, and is then stopped; the embedding cache is the session's
(``$ILGE_SEARCH_CACHE``), so pages share one extraction. A block under an HTML comment ``<!-- needs: X -->`` is
not run, and the prose beside it must name ``X``; the install and test blocks (``<!-- ci:setup -->``,
``<!-- ci:test -->``) are what CI runs itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/guide.md", "docs/api.md", "docs/cli.md", "docs/tokens.md", "docs/transfer.md"]
PAGES += ["docs/ensembles.md"]
CAPS = {"--max-train": 200, "--max-eval": 100, "--max-epochs": 2, "--n-trials": 2, "--total-trials": 2}
CAPS |= {"--workers": 1}
NAME_CAPS = {"train": CAPS["--max-train"], "eval": CAPS["--max-eval"], "ep": CAPS["--max-epochs"]}
RUN_BY_CI = ("ci:setup", "ci:test")
DASHBOARD_WAIT = 90  # seconds the started dashboard may take to say where it serves (a loaded machine is slow)
SERVING = "optuna-dashboard on http://127.0.0.1:"  # the line it prints once it serves
NEAR = 3  # lines before a marker and after its block where the visible sentence must name the need


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, counted from 1
    marker: str | None  # "needs: X", "ci:setup", ... from the HTML comment right above, or None
    text: str
    around: str  # the visible prose next to the block (a few lines before the marker, after the fence)


def _blocks(page: str) -> list[Block]:
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i] != "```bash":
            i += 1
            continue
        end = lines.index("```", i + 1)
        comment = re.fullmatch(r"<!-- (.+?) -->", lines[i - 1]) if i else None
        start = i - 1 if comment else i
        around = lines[max(0, start - NEAR) : start] + lines[end + 1 : end + 1 + NEAR]
        visible = "\n".join(line for line in around if not line.startswith("<!--"))
        marker = comment.group(1) if comment else None
        found.append(Block(page, i + 1, marker, "\n".join(lines[i + 1 : end]), visible))
        i = end + 1
    return found


def _needs(block: Block) -> str | None:
    return block.marker[len("needs:") :].strip() if block.marker and block.marker.startswith("needs:") else None


def _runs_here(block: Block) -> bool:
    return block.marker is None


def _cap(match: re.Match, cap: int) -> str:
    return f"{match.group(1)}{min(int(match.group(2)), cap)}"


def _serve_then_stop(command: str) -> str:
    """``command`` (a dashboard) on a free port in the background, until it prints that it serves or exits;
    then stopped. The line fails unless it said it serves."""
    log = '"$DOCS_SCRATCH/dashboard.log"'
    return (
        f"{command} --port 0 > {log} 2>&1 & served=$!; "
        f"for _ in $(seq {2 * DASHBOARD_WAIT}); do grep -q '{SERVING}' {log} && break; "
        f"kill -0 $served 2>/dev/null || break; sleep 0.5; done; "
        f"kill $served 2>/dev/null || true; wait $served || true; cat {log}; grep -q '{SERVING}' {log}"
    )


def shrink(block: str) -> str:
    """The block as this test runs it: capped budgets, matching study names, one final seed, a dashboard
    that is stopped after a few seconds (module docstring)."""
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#\s.*$", "", line)  # a trailing comment would swallow appended options
        for option, cap in CAPS.items():
            line = re.sub(rf"({option} )(\d+)", lambda m, cap=cap: _cap(m, cap), line)
        for part, cap in NAME_CAPS.items():
            line = re.sub(rf"(:{part})(\d+)\b", lambda m, cap=cap: _cap(m, cap), line)
        if re.search(r"\bilge-search .*\brun\b", line) and "--final-seeds" not in line:
            line += " --final-seeds 1"
        if re.match(r"ilge-search dashboard\b", line):
            line = _serve_then_stop(line)
        lines.append(line)
    return "\n".join(lines)


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def bare_clone(where: Path) -> Path:
    """A clone of this checkout's HEAD at ``where / "clone"``, whose ``.venv/bin/activate`` puts this
    environment's commands first on ``PATH``."""
    clone = where / "clone"
    _git("clone", "-q", "--no-checkout", str(ROOT), str(clone), cwd=where)
    _git("checkout", "-q", _git("rev-parse", "HEAD", cwd=ROOT).strip(), cwd=clone)
    # an activate script of its own, never a link into this environment: a block that made a venv in the
    # clone would otherwise write through the link into this environment's own script
    (clone / ".venv" / "bin").mkdir(parents=True)
    (clone / ".venv" / "bin" / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    return clone


def _bare_env(where: Path, clone: Path, cache_dir: Path) -> dict[str, str]:
    keep = {name: os.environ[name] for name in ("PATH", "LANG", "TMPDIR") if name in os.environ}
    home, scratch = where / "home", where / "scratch"
    home.mkdir()
    scratch.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    return keep | {
        "PATH": f"{venv_bin}:{keep.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "PYTHONPATH": str(clone),
        "ILGE_SEARCH_CACHE": str(cache_dir),
        "OMP_NUM_THREADS": "1",
        "DOCS_SCRATCH": str(scratch),
    }


def _shell_blocks() -> list[Block]:
    return [block for page in PAGES for block in _blocks(page)]


def test_every_shell_block_runs_here_or_says_what_it_needs():
    blocks = _shell_blocks()
    assert len(blocks) >= 15 and sum(_runs_here(block) for block in blocks) >= 8, blocks
    for block in blocks:
        if block.marker is None or block.marker in RUN_BY_CI:
            continue
        need = _needs(block)
        assert need, f"{block.page}:{block.line}: unknown marker <!-- {block.marker} -->"
        assert need in block.around.replace("`", ""), (
            f"{block.page}:{block.line}: no sentence beside the block names {need!r}"
        )
    installs = [f"{b.page}:{b.line}" for b in blocks if _runs_here(b) and re.search(r"\bpip |-m venv|\bmake ", b.text)]
    assert not installs, f"blocks that install (a package index) without a needs marker: {installs}"
    unmarked_shared = [f"{b.page}:{b.line}" for b in blocks if _runs_here(b) and "../shared" in b.text]
    assert not unmarked_shared, f"blocks that read ../shared without a needs marker: {unmarked_shared}"


def test_the_rewrite_caps_budgets_and_study_names_alike():
    shrunk = shrink(
        "ilge-search --data-dir examples/data run --model m --task t \\\n    --total-trials 8 --max-train 2000"
        " --max-eval 800 --max-epochs 10 --workers 2  # comment\n"
        "ilge-search export --study m:t:cayley:train2000:eval800:ep10 --out models/x\n"
        "ilge-search dashboard                    # browse"
    )
    run, export, dashboard = shrunk.splitlines()
    assert run.endswith("--total-trials 2 --max-train 200 --max-eval 100 --max-epochs 2 --workers 1 --final-seeds 1")
    assert export == "ilge-search export --study m:t:cayley:train200:eval100:ep2 --out models/x"
    assert dashboard.startswith("ilge-search dashboard --port 0 > ") and SERVING in dashboard


def _page_params() -> list:
    pages = [page for page in PAGES if any(_runs_here(block) for block in _blocks(page))]
    return [pytest.param(page, id=Path(page).stem, marks=[pytest.mark.slow, pytest.mark.realmodel]) for page in pages]


# Pages whose commands repeat the same study run in one clone, one after the other: the later page's run
# resumes the finished study instead of training it again, which keeps each page under a minute.
SHARED_CLONE = {"README.md": "quick start", "docs/guide.md": "quick start"}
_clones: dict[str, tuple[Path, dict[str, str]]] = {}


def _clone_for(page: str, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, str]]:
    group = SHARED_CLONE.get(page, page)
    if group not in _clones:
        where = tmp_path_factory.mktemp("bare")
        clone = bare_clone(where)
        _clones[group] = (clone, _bare_env(where, clone, cache_dir))
    clone, env = _clones[group]
    _remove_outputs_beside_the_storage(clone)
    return clone, env


def _remove_outputs_beside_the_storage(clone: Path) -> None:
    """What an earlier page wrote outside ``studies/`` (its exports, labels, layers): the next page's commands
    write the same paths and, rightly, refuse to replace them."""
    ignored = _git("ls-files", "--others", "--ignored", "--exclude-standard", "--directory", cwd=clone)
    for name in ignored.splitlines():
        path = clone / name
        if name.startswith(("studies/", ".venv/")):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


@pytest.mark.parametrize("page", _page_params())
def test_the_pages_commands_run_in_a_bare_clone(page, tmp_path_factory, cache_dir):
    clone, env = _clone_for(page, tmp_path_factory, cache_dir)
    for block in _blocks(page):
        if not _runs_here(block):
            continue
        script = "set -euo pipefail\n" + shrink(block.text)
        done = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, (
            f"{page}:{block.line} failed:\n{script}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    untracked = _git("status", "--porcelain", cwd=clone)
    assert untracked == "", f"{page}'s commands left files git does not ignore:\n{untracked}"
