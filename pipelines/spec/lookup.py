"""A folder of specs: loading all of it, and finding the flows beside a spec.

Flows meet through gold joins (a join reads another flow's silver events), so a folder's specs
are checked together (unique names and tables, joins that resolve), and a single spec finds the
flows it reads, or that read it, by reading the YAML files beside it. :func:`check_specs` finds
every problem of a folder (``conflux validate``); :func:`load_specs` raises the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic_core import PydanticCustomError

from .base import SpecError, SpecProblem
from .flow import FlowSpec
from .gold import GoldJoinSpec
from .loading import parse_spec, read_spec


@dataclass(frozen=True)
class FolderCheck:
    """What checking a folder of specs found: its spec files, the specs that validate on their
    own (sorted by name), and every problem, of one file or between files."""

    folder: Path
    files: tuple[str, ...]
    specs: tuple[FlowSpec, ...]
    problems: tuple[SpecProblem, ...]

    def raise_any(self) -> None:
        """Raise the problems (the first as the message), if any."""
        if self.problems:
            raise SpecError.of(self.problems)


def check_specs(folder: Path) -> FolderCheck:
    """Check every spec in ``folder`` (``*.yaml``), each on its own, then together: flow and table
    names are unique (the tables of every stage), and joins resolve. A join that reads a flow
    whose own spec does not validate is left to that spec's problems."""
    files = sorted(folder.glob("*.yaml"))
    specs: list[FlowSpec] = []
    problems: list[SpecProblem] = []
    broken: dict[str, str] = {}  # the flows whose specs do not validate: name -> file
    for path in files:
        data: Any = None
        try:
            data = read_spec(path)
            specs.append(parse_spec(data, where=str(path)))
        except SpecError as exc:
            problems += exc.problems or [SpecProblem(str(path), str(exc))]
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                broken.setdefault(data["name"], str(path))
    specs.sort(key=lambda s: s.name)
    problems += _folder_problems(specs, broken)
    return FolderCheck(folder, tuple(map(str, files)), tuple(specs), tuple(problems))


def load_specs(folder: Path) -> list[FlowSpec]:
    """All specs in ``folder`` (``*.yaml``), sorted by name, checked by :func:`check_specs`.

    Raises:
        SpecError: the first problem found (:attr:`SpecError.problems`: all of them).
    """
    check = check_specs(folder)
    check.raise_any()
    return list(check.specs)


def _folder_problems(specs: list[FlowSpec], broken: dict[str, str]) -> Iterator[SpecProblem]:
    """Flow and table names used twice (a flow's name also by a spec that does not validate),
    joins that do not resolve."""
    names: dict[str, str] = dict(broken)
    for spec in specs:
        if spec.name in names:
            line = f"{spec.spec_file}: name: {spec.name!r} is already used by {names[spec.name]}"
            yield SpecProblem(spec.spec_file, line)
        names.setdefault(spec.name, spec.spec_file)
    tables: dict[str, str] = {}
    for spec in specs:
        for declared in spec.tables():
            table = declared.name
            if table in tables:
                line = (
                    f"{spec.spec_file}: {declared.role.name_field}: {table!r} is already used by "
                    f"{tables[table]}"
                )
                yield SpecProblem(spec.spec_file, line)
            tables.setdefault(table, spec.spec_file)
    by_name = {spec.name: spec for spec in specs}
    for spec in specs:
        for index, gold in enumerate(spec.gold):
            if isinstance(gold, GoldJoinSpec) and gold.join.right_flow(spec.name) not in broken:
                try:
                    join_input(spec, gold, by_name, f"gold.{index}")
                except SpecError as exc:
                    yield SpecProblem(spec.spec_file, str(exc))


def join_input(
    spec: FlowSpec,
    gold: GoldJoinSpec,
    flows: dict[str, FlowSpec] | None = None,
    field: str = "gold",
) -> FlowSpec:
    """The flow whose silver events are the right side of ``gold`` (this flow, or a flow of the
    folder ``spec`` was read from), its columns checked.

    Raises:
        SpecError: no such flow, it has no silver stage, or not the columns the join reads.
    """
    name = gold.join.right_flow(spec.name)
    if name == spec.name:
        return spec
    where = f"{spec.spec_file}: {field}.join.right.flow"
    known: list[str] = sorted(flows or ())
    if flows is None:
        flows = {}
        for path, data in _specs_beside(spec):
            if data.get("name") == name:
                flows[name] = parse_spec(data, where=str(path))
            elif isinstance(data.get("name"), str):
                known.append(data["name"])
    other = flows.get(name)
    if other is None:
        raise SpecError(
            f"{where}: no flow named {name!r} among the specs beside it "
            f"({', '.join(sorted(known)) or 'none'}); name one of them"
        )
    try:
        right = gold.join.right
        other.check_event_columns(
            gold.side_columns("right"), right.event_time, f"{field}.join.right", right.where
        )
    except PydanticCustomError as exc:
        context = exc.context or {}
        raise SpecError(
            f"{spec.spec_file}: {context.get('field') or field}: {context.get('message', exc)}"
        ) from None
    return other


def _specs_beside(spec: FlowSpec) -> Iterable[tuple[Path, dict[str, Any]]]:
    """The YAML mappings in the folder ``spec`` was read from (unreadable files skipped: they are
    not this lookup's to judge)."""
    for path in sorted(Path(spec.spec_file).parent.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            yield path, data


def join_readers(spec: FlowSpec) -> list[tuple[FlowSpec, GoldJoinSpec]]:
    """The gold joins of other flows beside ``spec`` that read its silver events (as their right
    side): a reset or refresh of its silver events breaks their streams.

    Raises:
        SpecError: a spec beside it names this flow in a join but does not validate (so whether
            its join has streamed cannot be told).
    """
    readers = []
    for path, data in _specs_beside(spec):
        golds = data.get("gold")
        named = isinstance(golds, list) and any(
            isinstance(g, dict)
            and isinstance(g.get("join"), dict)
            and isinstance(g["join"].get("right"), dict)
            and g["join"]["right"].get("flow") == spec.name
            for g in golds
        )
        if not named or data.get("name") == spec.name:
            continue
        other = parse_spec(data, where=str(path))  # a SpecError names the file and the field
        readers += [
            (other, gold)
            for gold in other.gold
            if isinstance(gold, GoldJoinSpec) and gold.join.right_flow(other.name) == spec.name
        ]
    return readers
