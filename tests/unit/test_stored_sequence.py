"""The driver's figure of the highest stored sequence (``pipelines.silver.changes.Stored``) and
its judgement of a batch as in order: what may skip the re-sent-change lookup, so every doubt must
send a batch down the full path."""

from __future__ import annotations

import math
from datetime import date
from decimal import Decimal

from pipelines.silver.changes import Stored, Tally


def tally(lowest: object, highest: object, rows: int = 3, unordered: int = 0) -> Tally:
    return Tally(rows=rows, lowest=lowest, highest=highest, unordered=unordered)


def test_a_batch_is_in_order_only_when_all_of_it_is_newer() -> None:
    assert tally(11, 20).newer_than(Stored(10))
    assert not tally(10, 20).newer_than(Stored(10))  # equal: maybe the same change again
    assert not tally(5, 20).newer_than(Stored(10))
    assert tally(1, 2).newer_than(Stored(None))  # nothing stored
    assert tally(None, None, rows=0).newer_than(Stored(10))  # an empty batch
    assert not tally(11, 20, unordered=1).newer_than(Stored(10))  # a snapshot read or TRUNCATE
    assert not tally(None, None).newer_than(Stored(10))  # the driver could not compare them
    assert not tally("11", "20").newer_than(Stored(10))  # another type: no order assumed
    assert tally(Decimal("10.5"), Decimal("11")).newer_than(Stored(Decimal("10.25")))
    assert tally(date(2026, 1, 2), date(2026, 1, 3)).newer_than(Stored(date(2026, 1, 1)))


def test_the_figure_only_rises_and_gives_up_when_it_cannot_compare() -> None:
    assert Stored(10).after(20) == Stored(20)
    assert Stored(10).after(5) == Stored(10)  # the MERGE kept the newer stored rows
    assert Stored(10).after(None) == Stored(10)  # a batch without a comparable sequence
    assert Stored(None).after(3) == Stored(3)
    assert Stored(10).after(math.nan) is None  # Spark orders NaN above all: read it again
    assert Stored(10).after("20") is None
    assert not tally(11.0, 12.0).newer_than(Stored(math.nan))
