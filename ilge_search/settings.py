"""Where things live: the embedding cache, task data, study storage and the user's recommended defaults.

One :class:`Settings` object is built by the CLI group (and by library entry
points that take ``cache_dir=``/``data_dir=``), so every command resolves
locations the same way: explicit argument, then environment variable, then default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

__all__ = [
    "Settings",
    "resolve_cache_dir",
    "resolve_data_dir",
    "default_storage_url",
    "user_config_dir",
    "user_defaults_path",
]

PathLike = Union[str, os.PathLike]

CACHE_ENV = "ILGE_SEARCH_CACHE"
DATA_ENV = "ILGE_SEARCH_DATA"
DEFAULTS_ENV = "ILGE_SEARCH_DEFAULTS"
DEFAULTS_FILE_NAME = "recommended_defaults.json"


def resolve_cache_dir(cache_dir: Optional[PathLike] = None) -> Path:
    """``cache_dir`` if given, else ``$ILGE_SEARCH_CACHE``, else ``~/.cache/ilge-search``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/ilge-search").expanduser()


def resolve_data_dir(data_dir: Optional[PathLike] = None) -> Optional[Path]:
    """``data_dir`` if given, else ``$ILGE_SEARCH_DATA``, else None (online datasets)."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else None


def default_storage_url(study_dir: PathLike = "studies") -> str:
    """The embedded default: one SQLite file under ``studies/``."""
    path = Path(study_dir) / "ilge.db"
    return f"sqlite:///{path}"


def user_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/ilge-search``, else ``~/.config/ilge-search``."""
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base).expanduser() if base else Path("~/.config").expanduser()) / "ilge-search"


def user_defaults_path(path: Optional[PathLike] = None) -> Path:
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
    data_dir: Optional[Path] = field(default_factory=resolve_data_dir)
    device: str = "auto"

    def updated(
        self,
        cache_dir: Optional[PathLike] = None,
        data_dir: Optional[PathLike] = None,
        device: Optional[str] = None,
    ) -> "Settings":
        """A copy with the given non-None values replaced (subcommand options win)."""
        return Settings(
            cache_dir=resolve_cache_dir(cache_dir) if cache_dir is not None else self.cache_dir,
            data_dir=resolve_data_dir(data_dir) if data_dir is not None else self.data_dir,
            device=device if device is not None else self.device,
        )
