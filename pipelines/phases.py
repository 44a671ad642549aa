"""The order a run starts its flows' queries in: the flows' tables are prepared readers last,
and each flow's stage queries start phase by phase (:meth:`FlowPipeline.phases`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.catalog.roles import BRONZE_STAGE, SILVER_STAGE
from pipelines.flow import FlowPipeline
from pipelines.messages import StageStarted
from pipelines.progress import flow_of_query

#: The stage kinds that write a flow's silver events (which other flows' stages may read).
FEEDING_KINDS = (BRONZE_STAGE, SILVER_STAGE)


class Phases:
    """Starts each flow's stage queries phase by phase (:meth:`FlowPipeline.phases`): a flow's
    next phase starts once all its queries of the current one ended cleanly, independently of
    the other flows of the application (a continuous flow never holds an incremental one up)."""

    def __init__(
        self, pipelines: Sequence[FlowPipeline], spark: SparkSession, trigger_mode: str | None
    ) -> None:
        self.spark, self.trigger_mode = spark, trigger_mode
        self.pipelines = {p.spec.name: p for p in pipelines}
        self.pending = {p.spec.name: deque(p.phases(trigger_mode)) for p in pipelines}
        self.trigger_modes = {p.spec.name: trigger_mode or p.spec.trigger.mode for p in pipelines}
        self.running: dict[str, list[str]] = {}

    @property
    def done(self) -> bool:
        return not any(self.pending.values())

    def start(self, flow: str) -> dict[str, StreamingQuery]:
        pipeline = self.pipelines[flow]
        started = {
            head.query_name: pipeline.start(head, self.spark, self.trigger_mode)
            for head in self.pending[flow].popleft()
        }
        self.running[flow] = list(started)
        return started

    def started(self, query: str) -> list[StageStarted]:
        """The stages that started with ``query``: its own, and those fused into it."""
        for flow, pipeline in self.pipelines.items():
            for head in pipeline.stages:
                if head.own_query and head.query_name == query:
                    return [
                        StageStarted(flow, stage.kind, query)
                        for stage in (head, *pipeline.fused_after(head))
                    ]
        return []

    def restart(self, query: str) -> StreamingQuery:
        """Start ``query`` again from its checkpoint, in this application (its source is back)."""
        pipeline = self.pipelines[flow_of_query(query)]
        head = next(s for s in pipeline.stages if s.own_query and s.query_name == query)
        pipeline.tracker.failures.forget(query)
        return pipeline.start(head, self.spark, self.trigger_mode)

    def start_first(self) -> dict[str, StreamingQuery]:
        started: dict[str, StreamingQuery] = {}
        try:
            for flow in self.pipelines:
                started.update(self.start(flow))
        except BaseException:
            for query in started.values():
                query.stop()
            raise
        return started

    def _feeds_others(
        self, flow: str, queries: dict[str, StreamingQuery], waiting: Collection[str]
    ) -> bool:
        """Whether ``flow`` still has a bronze or silver query to run or running, or waiting for
        its source to start again (another flow's stage that reads its events waits for those)."""
        pending = [s for phase in self.pending[flow] for s in phase]
        running = [
            s
            for s in self.pipelines[flow].stages
            if s.query_name in self.running.get(flow, [])
            and (queries[s.query_name].isActive or s.query_name in waiting)
        ]
        return any(s.kind in FEEDING_KINDS for s in (*pending, *running))

    def advance(
        self, queries: dict[str, StreamingQuery], waiting: Collection[str] = ()
    ) -> dict[str, StreamingQuery]:
        """Start the next phase of every flow whose current phase ended without failing, and
        whose stages of that phase read no flow of the application still feeding its events
        (``waiting``: queries that wait for their source, :mod:`pipelines.outages`)."""
        started: dict[str, StreamingQuery] = {}
        for flow, names in list(self.running.items()):
            current = [queries[name] for name in names]
            if not self.pending[flow] or not all(
                not q.isActive and q.exception() is None for q in current
            ):
                continue
            waits_for = {  # flows of this run that catch up and end (a continuous one never does)
                other
                for stage in self.pending[flow][0]
                for other in stage.reads_flows
                if other in self.pipelines
                and other != flow
                and self.trigger_modes[other] == "available_now"
            }
            if self.trigger_modes[flow] == "available_now" and any(
                self._feeds_others(other, queries, waiting) for other in waits_for
            ):
                continue
            started.update(self.start(flow))
        return started


def readers_last(pipelines: Sequence[FlowPipeline]) -> list[FlowPipeline]:
    """The pipelines in an order where a flow comes after the flows whose events it reads (they
    create their events tables when they prepare); flows that read each other (a cycle) come in
    the order the walk meets them, which prepares one before the other has its table."""
    by_name = {p.spec.name: p for p in pipelines}
    ordered: list[FlowPipeline] = []
    visiting: set[str] = set()

    def visit(pipeline: FlowPipeline) -> None:
        name = pipeline.spec.name
        if pipeline in ordered or name in visiting:
            return
        visiting.add(name)
        for stage in pipeline.stages:
            for other in stage.reads_flows:
                if other in by_name:
                    visit(by_name[other])
        ordered.append(pipeline)

    for pipeline in pipelines:
        visit(pipeline)
    return ordered
