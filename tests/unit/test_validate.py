"""``conflux validate`` lists every problem of every spec in the flows folder, then exits 2; the
other commands stop at the first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.cli import main

SCHEMA = "id BIGINT, amount DOUBLE, paid_at TIMESTAMP"


def write(folder: Path, name: str, silver: dict[str, Any], **more: Any) -> str:
    path = folder / f"{name}.yaml"
    spec = {
        "name": name,
        "source": {"kind": "kafka", "topics": [name]},
        "target": {"table": f"bronze_{name}"},
        "silver": {"format": "debezium", "schema": SCHEMA, **silver},
        **more,
    }
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_every_problem_of_every_spec_is_listed(
    flows: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two bad specs (one with two field errors, one with a column problem and an unknown key)
    and a good one that joins a bad one: every problem once, the good one ok."""
    payments = write(
        flows, "payments", {"current": {"table": "paid", "keys": ["id"]}}, trigger={"mode": "soon"}
    )
    with_payments = yaml.safe_load(Path(payments).read_text())
    with_payments["source"]["topics"] = ["bad topic!"]
    Path(payments).write_text(yaml.safe_dump(with_payments))
    cdc = write(
        flows, "cdc", {"current": {"table": "cdc_current", "keys": ["id"], "sequence_by": "source.lsn"}},
        domain_name="sales",
    )  # fmt: skip
    join = {
        "table": "gold_paid",
        "allowed_lateness": "10 minutes",
        "join": {
            "keys": ["id"],
            "left": {"event_time": "paid_at"},
            "right": {"flow": "payments", "event_time": "paid_at"},
            "within": {"after": "1 hour"},
        },
    }
    orders = write(flows, "orders", {}, gold=[join])

    assert main(["validate"]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"ok  {'orders':24} {orders}", f"1 flow(s) valid in {flows}"]
    lines = err.splitlines()
    assert [line.split(": ")[3] for line in lines[:-1]] == [
        "silver.current.sequence_by",
        "domain_name",
        "source.topics",
        "trigger.mode",
    ]
    assert all(line.startswith("conflux: error: ") for line in lines[:-1])
    assert lines[0].startswith(
        f"conflux: error: {cdc}: silver.current.sequence_by: 'source.lsn' names column 'source'"
    )
    assert lines[1] == (
        f"conflux: error: {cdc}: domain_name: unknown field; allowed: name, description, domain, "
        "owners, tags, source, target, trigger, silver, gold, maintenance"
    )
    assert lines[2].startswith(f"conflux: error: {payments}: source.topics: 'bad topic!'")
    assert lines[3] == (
        f"conflux: error: {payments}: trigger.mode: unknown trigger mode 'soon'; known: "
        "available_now, continuous"
    )
    assert lines[-1] == f"conflux: 4 problem(s) in 2 of 3 spec(s) in {flows}"


def test_problems_between_specs_are_listed_with_the_rest(
    flows: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name used twice, two specs writing one location, a column problem: all listed."""
    write(flows, "a", {"current": {"table": "a_current", "keys": ["nope"]}})
    second = write(flows, "b", {})
    spec = yaml.safe_load(Path(second).read_text())
    Path(second).write_text(yaml.safe_dump({**spec, "name": "a"}))
    (flows / "c.yaml").write_text("name: [unclosed\n")

    assert main(["validate"]) == 2
    out, err = capsys.readouterr()
    assert "ok  " not in out and "0 flow(s) valid" in out
    lines = err.splitlines()
    assert f"{flows / 'a.yaml'}: silver.current.keys: 'nope' is not a column of schema" in lines[0]
    assert lines[1] == f"conflux: error: {second}: name: 'a' is already used by {flows / 'a.yaml'}"
    assert lines[2] == (
        f"conflux: error: {flows / 'c.yaml'}: cannot read the spec: while parsing a flow "
        "sequence: expected ',' or ']', but got '<stream end>' (line 2, column 1)"
    )
    assert lines[3:] == [f"conflux: 3 problem(s) in 3 of 3 spec(s) in {flows}"]
    assert main(["flows"]) == 2  # any other command stops at the first
    assert capsys.readouterr().err.count("conflux: error: ") == 1
    Path(flows / "a.yaml").write_text(Path(flows / "a.yaml").read_text().replace("nope", "id"))
    (flows / "c.yaml").unlink()
    assert main(["validate"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 4)[2:4] for line in lines[:-1]] == [
        [second, "name"],
        [second, "silver.events.table"],  # silver_a_events: the default of a flow named a
        [second, "silver.quarantine.table"],
        [second, "silver.events"],  # and so its location
    ]
    assert lines[-1] == f"conflux: 4 problem(s) in 1 of 2 spec(s) in {flows}"


def test_a_folder_of_good_specs_validates(flows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(flows, "a", {"current": {"table": "a_current", "keys": ["id"]}})
    write(
        flows,
        "b",
        {"current": {"sequence_by": "coalesce(_source_lsn, 0)", "table": "b_c", "keys": ["id"]}},
    )
    assert main(["validate"]) == 0
    out, err = capsys.readouterr()
    assert "2 flow(s) valid" in out and err == ""
