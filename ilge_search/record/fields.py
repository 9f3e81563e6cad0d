"""What the stored records share: the JSON mappings Optuna user attrs hold, and reading a record back from them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import optuna

__all__ = ["Attrs", "Stored", "read_stored", "attrs_of", "fields_from", "finite", "known_fields", "write_attrs"]

# a JSON-serialisable mapping: what a study's or trial's user attrs, a record's to_attrs and a saved file hold
Attrs = dict[str, Any]

_Record = TypeVar("_Record")


class Stored(Protocol):
    """What holds user attrs: an Optuna study, frozen study, study summary or trial."""

    @property
    def user_attrs(self) -> dict[str, Any]: ...


def attrs_of(obj: object) -> Mapping[str, Any]:
    """The user attrs of an Optuna study, frozen study, study summary or trial."""
    attrs = getattr(obj, "user_attrs", None)
    if attrs is None:
        raise TypeError(f"expected an Optuna study, trial or study summary, got {type(obj).__name__}")
    return attrs


def known_fields(cls: type, values: Mapping[str, object]) -> Attrs:
    """The entries of ``values`` that name a field of the dataclass ``cls``."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in values.items() if key in names}


def fields_from(cls: type[_Record], values: Mapping[str, object], rename: Mapping[str, str] | None = None) -> _Record:
    """An instance of the dataclass ``cls`` from ``values`` (attr name -> value; ``rename``: field -> attr
    name); absent attrs take the field's default."""
    rename = rename or {}
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = rename.get(f.name, f.name)
        if f.init and key in values:
            kwargs[f.name] = values[key]
    return cls(**kwargs)


def finite(value: object) -> float | None:
    """``value`` as a float, ``None`` when it is absent or not finite."""
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    return number if math.isfinite(number) else None


def write_attrs(study: optuna.Study, values: Mapping[str, object]) -> None:
    """Store each entry of ``values`` as a user attr of ``study``."""
    for key, value in values.items():
        study.set_user_attr(key, value)


def read_stored(
    stored: object, build: Callable[[Attrs], _Record], errors: tuple[type[Exception], ...]
) -> _Record | None:
    """``build`` applied to a copy of a stored mapping; ``None`` when ``stored`` is no mapping or ``build`` raises
    one of ``errors`` (a record missing a field, or of another shape, is no usable record)."""
    if not isinstance(stored, Mapping):
        return None
    try:
        return build(dict(stored))
    except errors:
        return None
