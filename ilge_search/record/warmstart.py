"""A warm-started study's record: which portfolio members it enqueued and what they were chosen from.

``run --warm-start K`` enqueues the first K members of a *warm-start order*, which must never come from
the study's own task's validation data: :func:`warm_start_order` takes the order ``ilge-search portfolio``
chose without that task (``by_task``), else the shipped ``data/portfolio.json`` without members that came
only from that task (``docs/transfer.md``). What was enqueued is stored as a :class:`WarmStartRecord`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .fields import Attrs
from .portfolio import load_shipped_portfolio, portfolio_study_name, stored_portfolio_choice

if TYPE_CHECKING:
    import optuna

__all__ = ["WarmMember", "WarmStartRecord", "warm_start_order", "save_warm_start", "warm_start_record"]

_RECORD_ATTR = "warm_start_record"


@dataclass(frozen=True)
class WarmMember:
    """One member of a warm-start order: its candidate name in the matrix, its configuration, the Optuna params
    a study enqueues for it (filled by the study), and the problems (study names) or, for the shipped file,
    the tasks it came from."""

    name: str
    config: Attrs
    sources: tuple[str, ...] = ()
    params: Attrs = field(default_factory=dict)


@dataclass(frozen=True)
class WarmStartRecord:
    """A warm start: where its order came from (``origin``), the problems it was chosen on (validation), the task whose
    problems were left out (``None``: the study's task was not among them, or the order is the shipped one), its members
    in order, and the shipped members skipped for coming only from the study's own task."""

    origin: str
    chosen_from: tuple[str, ...]
    left_out_task: str | None
    members: tuple[WarmMember, ...]
    skipped: tuple[str, ...] = ()

    def with_members(self, members: Sequence[WarmMember]) -> WarmStartRecord:
        return replace(self, members=tuple(members))

    def describe(self) -> str:
        """One sentence: the members and what they were chosen from."""
        names = ", ".join(m.name for m in self.members) or "none"
        without = f" without task {self.left_out_task}'s problems" if self.left_out_task else ""
        skipped = f"; skipped (from this task only): {', '.join(self.skipped)}" if self.skipped else ""
        return (
            f"{len(self.members)} warm-start member{'s' if len(self.members) != 1 else ''} ({names}) from "
            f"{self.origin}, chosen on the validation scores of {len(self.chosen_from)} problems{without}{skipped}"
        )


def _task_of(problem: str) -> str:
    """The task of a problem's study name (``model:task:encoder:...``), for choices stored without tasks."""
    parts = problem.split(":")
    return parts[1] if len(parts) > 1 else problem


def _members(
    configs: Sequence[Mapping[str, object]], names: Sequence[object] | None, sources: Sequence[Sequence[object]] | None
) -> list[WarmMember]:
    out = []
    for i, config in enumerate(configs):
        name = str(names[i]) if names and i < len(names) else f"member {i}"
        came = tuple(str(s) for s in sources[i]) if sources and i < len(sources) else ()
        out.append(WarmMember(name=name, config=dict(config), sources=came))
    return out


def _from_choice(choice: Attrs, where: str, family: str, task: str) -> WarmStartRecord:
    problems = [str(p) for p in choice.get("problems") or []]
    tasks = choice.get("problem_tasks") or [_task_of(p) for p in problems]
    if task not in tasks:
        configs = choice.get("warm_start") or choice.get("portfolio") or []
        members = _members(configs, choice.get("warm_start_names"), choice.get("warm_start_sources"))
        return WarmStartRecord(where, tuple(problems), None, tuple(members))
    by_task = choice.get("by_task")
    rerun = (
        f"rerun `ilge-search portfolio --storage URL --family {family}` with the options it was run with "
        "(it trains nothing when the cells are stored)"
    )
    if not isinstance(by_task, Mapping):
        raise ValueError(
            f"{where} was chosen with task {task}'s own problems and holds no order chosen without them; {rerun}, "
            "so that a warm start never uses members chosen on this task's validation data"
        )
    if task not in by_task:
        raise ValueError(
            f"every problem of {where} is task {task}'s own: a warm start would use members chosen on its validation "
            "data; store studies of other tasks and rerun `ilge-search portfolio`, or run without --warm-start"
        )
    own = by_task[task]
    members = _members(own.get("warm_start") or [], own.get("names"), own.get("sources"))
    return WarmStartRecord(where, tuple(str(p) for p in own.get("problems") or []), task, tuple(members))


def _from_shipped(entry: Attrs, family: str, task: str) -> WarmStartRecord:
    where = "the portfolio shipped with ilge-search"
    provenance = entry["provenance"]
    problems = [str(p) for p in provenance.get("problems") or []]
    member_tasks = provenance.get("member_tasks")
    names = provenance.get("member_names")
    members = _members(entry["members"], names, member_tasks)
    if member_tasks is None:
        if task in (provenance.get("tasks") or [_task_of(p) for p in problems]):
            raise ValueError(
                f"{where} was chosen with task {task}'s problems and does not say which tasks its {family} members "
                "came from; run `ilge-search portfolio --update-shipped` again, or run without --warm-start"
            )
        return WarmStartRecord(where, tuple(problems), None, tuple(members))
    kept = [m for m in members if set(m.sources) != {task}]
    skipped = tuple(m.name for m in members if set(m.sources) == {task})
    return WarmStartRecord(where, tuple(problems), None, tuple(kept), skipped)


def warm_start_order(storage: Any, family: str, bucket: str, task: str) -> WarmStartRecord:
    """The warm-start order of ``family`` and ``bucket`` for a study of ``task`` (see the module docstring):
    from the choice stored in ``storage`` (an opened :class:`~ilge_search.storage.Storage`, or ``None``), else
    the shipped file; no members when neither has one.

    Raises:
        ValueError: the stored choice was chosen with ``task``'s problems and holds no order without them, or
            the shipped file is malformed.
    """
    name = portfolio_study_name(family, bucket)
    study = None if storage is None else storage.load_study(name)
    where = None if storage is None else f"the portfolio choice stored in {storage.shown_url} (study {name})"
    choice = None if study is None else stored_portfolio_choice(study, where)
    if choice and (choice.get("warm_start") or choice.get("portfolio")):
        return _from_choice(choice, f"the portfolio stored in {storage.shown_url}", family, task)
    entry = load_shipped_portfolio()["families"].get(family, {}).get(bucket)
    if entry:
        return _from_shipped(entry, family, task)
    return WarmStartRecord("no stored or shipped portfolio", (), None, ())


def save_warm_start(study: optuna.Study, record: WarmStartRecord) -> None:
    """Store what a warm-started study enqueued (once, when the study is set up)."""
    study.set_user_attr(_RECORD_ATTR, asdict(record))


def warm_start_record(study: optuna.Study) -> WarmStartRecord | None:
    """The :class:`WarmStartRecord` :func:`save_warm_start` stored, or ``None`` (a cold study, or one warm-started
    before the record existed)."""
    value = study.user_attrs.get(_RECORD_ATTR)
    if not isinstance(value, Mapping):
        return None
    members = tuple(
        WarmMember(
            name=str(m.get("name")),
            config=dict(m.get("config") or {}),
            sources=tuple(m.get("sources") or ()),
            params=dict(m.get("params") or {}),
        )
        for m in value.get("members") or []
    )
    return WarmStartRecord(
        origin=str(value.get("origin", "")),
        chosen_from=tuple(value.get("chosen_from") or ()),
        left_out_task=value.get("left_out_task"),
        members=members,
        skipped=tuple(value.get("skipped") or ()),
    )
