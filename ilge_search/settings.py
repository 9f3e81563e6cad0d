"""Where things live: the embedding cache, task data, study storage and the user's recommended defaults.

One :class:`Settings` object is built by the CLI group (and by library entry
points that take ``cache_dir=``/``data_dir=``), so every command resolves
locations the same way: explicit argument, then environment variable, then default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Settings",
    "resolve_cache_dir",
    "resolve_data_dir",
    "SHIPPED_DATA_DIR",
    "registered_task_dir",
    "data_dir_note",
    "default_storage_url",
    "user_config_dir",
    "user_defaults_path",
]

PathLike = str | os.PathLike

CACHE_ENV = "ILGE_SEARCH_CACHE"
DATA_ENV = "ILGE_SEARCH_DATA"
DEFAULTS_ENV = "ILGE_SEARCH_DEFAULTS"
DEFAULTS_FILE_NAME = "recommended_defaults.json"


def resolve_cache_dir(cache_dir: PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$ILGE_SEARCH_CACHE``, else ``~/.cache/ilge-search``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/ilge-search").expanduser()


def resolve_data_dir(data_dir: PathLike | None = None) -> Path | None:
    """``data_dir`` if given, else ``$ILGE_SEARCH_DATA``, else None (online datasets)."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else None


# The small task data a source checkout ships (the demo's banking77 subset); absent in an installed wheel.
SHIPPED_DATA_DIR = Path(__file__).resolve().parent.parent / "examples" / "data"


def registered_task_dir(local_name: str | None, data_dir: PathLike | None = None) -> Path | None:
    """The folder a registered task whose files are ``<folder>/<local_name>/`` is read from, as every command
    resolves it: ``data_dir`` or ``$ILGE_SEARCH_DATA`` when set (the task must then be there), else
    :data:`SHIPPED_DATA_DIR` when it holds the task, else None (the Hugging Face hub).

    The shipped folder only serves the tasks it holds, so without a data folder every other task still
    loads from the hub as before."""
    given = resolve_data_dir(data_dir)
    if given is not None:
        return given
    if local_name and (SHIPPED_DATA_DIR / local_name / "train.jsonl").is_file():
        return SHIPPED_DATA_DIR
    return None


def data_dir_note(data_dir: PathLike | None = None) -> str:
    """One line saying which folder registered tasks are read from (what :func:`registered_task_dir` does)."""
    given = resolve_data_dir(data_dir)
    if given is not None:
        return f"task data: {given} (every registered task is read from it)"
    if SHIPPED_DATA_DIR.is_dir():
        return (
            f"task data: no --data-dir or ${DATA_ENV}; the tasks in the shipped {SHIPPED_DATA_DIR} are read "
            "from there, the others from the Hugging Face hub"
        )
    return f"task data: no --data-dir or ${DATA_ENV}; registered tasks load from the Hugging Face hub"


def default_storage_url(study_dir: PathLike = "studies") -> str:
    """The embedded default: one SQLite file under ``studies/``."""
    path = Path(study_dir) / "ilge.db"
    return f"sqlite:///{path}"


def user_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/ilge-search``, else ``~/.config/ilge-search``."""
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base).expanduser() if base else Path("~/.config").expanduser()) / "ilge-search"


def user_defaults_path(path: PathLike | None = None) -> Path:
    """The user's recommended-defaults file: ``path`` if given, else ``$ILGE_SEARCH_DEFAULTS``, else
    ``recommended_defaults.json`` in :func:`user_config_dir`.

    ``ilge-search recommend`` writes it and ``recommended_config`` reads it over
    the package's shipped defaults; the shipped file itself is only rewritten on
    request (``recommend --update-shipped``).
    """
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(DEFAULTS_ENV)
    if env:
        return Path(env).expanduser()
    return user_config_dir() / DEFAULTS_FILE_NAME


@dataclass
class Settings:
    """Locations and device shared by every CLI subcommand."""

    cache_dir: Path = field(default_factory=resolve_cache_dir)
    data_dir: Path | None = field(default_factory=resolve_data_dir)
    device: str = "auto"

    def updated(
        self,
        cache_dir: PathLike | None = None,
        data_dir: PathLike | None = None,
        device: str | None = None,
    ) -> Settings:
        """A copy with the given non-None values replaced (subcommand options win)."""
        return Settings(
            cache_dir=resolve_cache_dir(cache_dir) if cache_dir is not None else self.cache_dir,
            data_dir=resolve_data_dir(data_dir) if data_dir is not None else self.data_dir,
            device=device if device is not None else self.device,
        )
