"""A batch's parse planned once per spec: each later batch's rows run through that plan.

The parse of a silver batch (the Debezium or JSON decode, the schema policy's reasons, the
expectations) is the same plan in every batch but for its input, the batch's held rows. Planning
it anyway costs the driver a fixed ~1-1.6 s a batch on two cores, whatever the batch's size
(bench/HISTORY.md, "Silver freshness, nineteenth session" and "twentieth session"): replaying the
recorded steps (:mod:`pipelines.silver.steps`), each of which analyses the growing plan, then
Catalyst's optimiser over a plan of thousands of expressions, then physical planning. At 500
changes/s that is most of the parse.

:class:`BoundPlan` plans the first batch of each input schema as usual and keeps its *physical*
plan as a template: a chain of per-row operators (projections, filters) over a scan of the
batch's rows (``RDDScanExec``). For each later batch it copies that scan with the batch's rows,
puts the copy in place of the template's scan, and runs the result as an RDD, which it returns as
a frame (a ``LogicalRDD``, the template's output attributes): nothing is analysed, optimised or
planned again; whole-stage code is generated again but not compiled (Spark's compile cache,
keyed by the code, finds it). The bound frame claims no partitioning or ordering (the template
batch's need not be the batch's) and the input's statistics (for the joins planned above it).
A template whose physical plan is not such a chain (an exchange, adaptive execution, a subquery,
a Python UDF) or that reads a clock or randomness (a spec's SQL may: ``current_date()``,
``rand()``, both fixed when a plan is analysed or optimised) is never bound: its batches are
planned as usual, as are all later ones if binding ever fails (logged once).

The input: a held frame (:func:`pipelines.held.hold`) is a scan of its rows already; any other
frame is planned as itself first and its rows taken from that plan, so whatever it computes, a
clock included (``current_timestamp()`` is fixed when a plan is optimised), is computed for its
own batch and never taken from the template's. One template is kept per input schema (a batch
parsed again after its columns evolved has rows of another shape, see
:meth:`pipelines.stages.silver.SilverStage._parse_again`). A template holds its batch's physical
plan and the lineage of its rows (not the rows: the stage releases them) for the stage's life.

Why the rows are the ones planning the batch gives: the optimiser's rewrites of a parse depend
on its expressions and the leaf's attributes, never on the rows, except where a leaf is known to
be empty (a ``LocalRelation``, never a scan of an RDD); a plan reading a clock or randomness is
refused (above); and the batch id, the one value of the batch's own, is added after binding.
``tests/integration/test_bound_plan.py`` parses batches with every hostile record class both ways
and compares the rows.

The price: the bound parse is executed outside a ``QueryExecution``, so Spark's SQL tab shows the
frame that reads it (the stage's hold), not the parse's own operators and metrics.

PySpark cannot rewrite a plan's tree itself: the rewrite is Spark's ``transformUp`` with a rule
implemented in Python, a ``scala.PartialFunction`` served by Py4J's callback server (called once
for each node of the plan).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pyspark import SparkContext
from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_LEAF = "LogicalRDD"
_SCAN = "RDDScanExec"
#: Physical operators that compute each output row from one input row, and wrappers of them.
_PER_ROW = frozenset({"ProjectExec", "FilterExec", "WholeStageCodegenExec", "InputAdapter"})


class _ReplaceNode:
    """The rule ``transformUp`` applies: the template's node becomes the batch's."""

    def __init__(self, node: Any, replacement: Any) -> None:
        self.node, self.replacement = node, replacement

    def isDefinedAt(self, node: Any) -> bool:  # noqa: N802 - Scala's PartialFunction
        return bool(node.equals(self.node))

    def apply(self, node: Any) -> Any:
        return self.replacement if node.equals(self.node) else node

    def applyOrElse(self, node: Any, default: Any) -> Any:  # noqa: N802 - Scala's
        return self.replacement if node.equals(self.node) else default.apply(node)

    class Java:
        implements: ClassVar[list[str]] = ["scala.PartialFunction"]


def _jvm() -> Any:
    jvm = SparkContext._jvm
    assert jvm is not None, "a Spark session is running"
    return jvm


def _over_rows(frame: DataFrame) -> tuple[DataFrame, Any]:
    """``frame`` as a bare ``LogicalRDD`` of its rows, and that leaf: a held frame as it is, any
    other planned as itself (its ``toRdd``; a persisted frame's rows then come from its cache)."""
    plan = frame._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == _LEAF:
        return frame, plan
    jvm = _jvm()
    rows = frame._jdf.queryExecution().toRdd()
    companion = getattr(jvm.org.apache.spark.sql.execution, "LogicalRDD$").__getattr__("MODULE$")
    leaf = companion.fromDataset(rows, frame._jdf, False)
    session = frame.sparkSession
    over = jvm.org.apache.spark.sql.classic.Dataset.ofRows(session._jsparkSession, leaf)
    return DataFrame(over, session), leaf


def varies_by_run(node: Any) -> bool:
    """Whether a plan or expression (a JVM object) reads randomness or a clock: Spark fixes a
    clock's value (``current_timestamp()``, ``current_date()``, ``now()``) when it optimises the
    plan, and a random function's seed when it analyses it, so its rows depend on when and how
    often that happened, not on its input alone."""
    pattern = _jvm().org.apache.spark.sql.catalyst.trees.TreePattern.CURRENT_LIKE()
    return not node.deterministic() or bool(node.containsPattern(pattern))


def _scan_of(physical: Any) -> Any | None:
    """The ``RDDScanExec`` under a chain of per-row operators; None if ``physical`` is not one."""
    node = physical
    while node.getClass().getSimpleName() in _PER_ROW:
        if node.children().size() != 1 or node.subqueries().size() != 0:
            return None
        node = node.children().head()
    return node if node.getClass().getSimpleName() == _SCAN else None


@dataclass(frozen=True)
class _Template:
    physical: Any  # the template batch's physical plan
    scan: Any  # its scan of the template batch's rows

    def bind(self, frame: DataFrame, leaf: Any) -> DataFrame:
        """The template's plan run over ``leaf``'s rows, as a frame of the template's output."""
        jvm, session = _jvm(), frame.sparkSession
        jsession, none = session._jsparkSession, jvm.scala.Option.empty()
        jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(jsession)  # new nodes' own
        rdd = leaf.rdd()
        unknown = jvm.org.apache.spark.sql.catalyst.plans.physical.UnknownPartitioning(
            rdd.getNumPartitions()
        )
        unordered = self.scan.outputOrdering().take(0)
        batch_scan = self.scan.copy(
            self.scan.output(), rdd, self.scan.name(), unknown, unordered, none
        )
        plan = self.physical.transformUp(_ReplaceNode(self.scan, batch_scan))
        stats = jvm.scala.Option.apply(leaf.stats())  # the input's, for joins above (module doc)
        rows = jvm.org.apache.spark.sql.execution.LogicalRDD(
            plan.output(), plan.execute(), unknown, unordered, False, none, jsession,
            stats, none,
        )  # fmt: skip
        bound = jvm.org.apache.spark.sql.classic.Dataset.ofRows(jsession, rows)
        return DataFrame(bound, session)


class BoundPlan:
    """``build`` (a function of the batch's frame alone) planned once, run over each batch."""

    def __init__(self, build: Callable[[DataFrame], DataFrame]) -> None:
        self._build = build
        #: The input's schema (JSON) -> its template, or None where the plan cannot be bound.
        self._templates: dict[str, _Template | None] = {}

    def apply(self, frame: DataFrame) -> DataFrame:
        """``build(frame)``, through the template's plan when there is one (module doc)."""
        frame, leaf = _over_rows(frame)
        schema = frame.schema.json()
        if schema not in self._templates:
            built = self._build(frame)
            self._templates[schema] = _template_of(built)
            return built
        template = self._templates[schema]
        if template is None:
            return self._build(frame)
        try:
            return template.bind(frame, leaf)
        except Exception:  # Spark's internals moved under us: plan every batch, as before
            log.warning("binding a batch to its planned parse failed; planning each batch from "
                        "now on", exc_info=True)  # fmt: skip
            self._templates[schema] = None
            return self._build(frame)

    def bindable(self, frame: DataFrame) -> bool:
        """Whether batches of ``frame``'s schema run through a template (for tests, reports)."""
        return self._templates.get(_over_rows(frame)[0].schema.json()) is not None


def _template_of(built: DataFrame) -> _Template | None:
    """The template ``built``'s plan makes, or None if it cannot be bound (module doc)."""
    execution = built._jdf.queryExecution()
    if varies_by_run(execution.analyzed()):
        return None
    physical = execution.executedPlan()
    scan = _scan_of(physical)
    if scan is None:
        return None
    _callbacks_served(built)
    return _Template(physical, scan)


def _callbacks_served(frame: DataFrame) -> None:
    """Start Py4J's callback server if nothing has yet (a ``foreachBatch`` query has)."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = frame.sparkSession.sparkContext._gateway
    assert gateway is not None
    ensure_callback_server_started(gateway)
