"""The session confs a micro-batch's DML runs under: transaction ids, and deletion vectors only
where they pay (no JVM: a fake session stands in for Spark's)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pipelines import delta_writes
from pipelines.delta_writes import (
    DELETION_VECTORS_FROM_BYTES,
    PERSISTENT_DV_CONFS,
    TXN_APP_ID_CONF,
    TXN_VERSION_CONF,
    idempotent_session,
    session_confs,
)


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class FakeSession:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.conf = FakeConf(values or {})


def test_session_confs_restore_what_was_there_and_remove_what_was_not() -> None:
    spark = FakeSession({"a": "user's"})
    with session_confs(spark, {"a": "block's", "b": "block's"}):  # type: ignore[arg-type]
        assert spark.conf.values == {"a": "block's", "b": "block's"}
    assert spark.conf.values == {"a": "user's"}


def test_session_confs_restore_after_a_failure() -> None:
    spark = FakeSession()
    with pytest.raises(RuntimeError), session_confs(spark, {"a": "1"}):  # type: ignore[arg-type]
        raise RuntimeError("the MERGE failed")
    assert spark.conf.values == {}


def _sized(monkeypatch: pytest.MonkeyPatch, pays: bool) -> list[str]:
    asked: list[str] = []

    def pay(_spark: Any, path: str) -> bool:
        asked.append(path)
        return pays

    monkeypatch.setattr(delta_writes, "deletion_vectors_pay", pay)
    return asked


def test_a_small_target_is_rewritten_instead_of_given_deletion_vectors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = _sized(monkeypatch, pays=False)
    spark = FakeSession()
    with idempotent_session(spark, "app", 7, target="/lake/t"):  # type: ignore[arg-type]
        assert spark.conf.values[TXN_APP_ID_CONF] == "app"
        assert spark.conf.values[TXN_VERSION_CONF] == "7"
        assert all(spark.conf.values[key] == "false" for key in PERSISTENT_DV_CONFS)
    assert asked == ["/lake/t"]
    assert spark.conf.values == {}


def test_a_large_or_unnamed_target_keeps_delta_s_deletion_vectors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _sized(monkeypatch, pays=True)
    for target in ("/lake/t", None):
        spark = FakeSession()
        with idempotent_session(spark, "app", 7, target=target):  # type: ignore[arg-type]
            assert set(spark.conf.values) == {TXN_APP_ID_CONF, TXN_VERSION_CONF}


def _session_with_table_of(size: int | None) -> Any:
    """A session whose JVM's DeltaLog holds a snapshot of ``size`` bytes (None: the API fails)."""

    def snapshot() -> SimpleNamespace:
        if size is None:
            raise RuntimeError("no such API")
        return SimpleNamespace(sizeInBytes=lambda: size)

    log = SimpleNamespace(unsafeVolatileSnapshot=snapshot)
    delta = SimpleNamespace(DeltaLog=SimpleNamespace(forTable=lambda _session, _path: log))
    jvm = SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(spark=SimpleNamespace(
        sql=SimpleNamespace(delta=delta)))))  # fmt: skip
    return SimpleNamespace(sparkContext=SimpleNamespace(_jvm=jvm), _jsparkSession=object())


def test_deletion_vectors_pay_from_the_threshold_and_when_the_size_is_unknown() -> None:
    pays = delta_writes.deletion_vectors_pay
    assert pays(_session_with_table_of(DELETION_VECTORS_FROM_BYTES), "/t") is True
    assert pays(_session_with_table_of(DELETION_VECTORS_FROM_BYTES - 1), "/t") is False
    assert pays(_session_with_table_of(None), "/t") is True
