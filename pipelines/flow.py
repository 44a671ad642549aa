"""A flow is a pipeline of stages (source → bronze → silver …), composed here and nowhere else.

:func:`build_stages` makes the stages a spec declares, in order (:data:`STAGE_KINDS`). Each stage
either runs as its own streaming query with its own checkpoint, reading what the stage before it
wrote (silver reads the bronze table as a Delta stream), or is *fused*: it writes inside the
previous query's ``foreachBatch``, on the very rows that query writes, under that query's batch
ids. Both are exactly once for the same reason: every write carries the batch id of the query it
runs in as its Delta transaction version (:mod:`pipelines.delta_writes`).

With the ``available_now`` trigger a stage's own query must not start before the stage it reads
has caught up (its snapshot of the input is taken at start), so :meth:`FlowPipeline.phases` puts
them in successive phases; continuous queries all run at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.delta_writes import TableWrite
from pipelines.held import run_batch
from pipelines.lease import LeaseGuard
from pipelines.progress import BatchCommit, ProgressTracker
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, GoldJoinSpec, GoldSpec
from pipelines.stages import Stage
from pipelines.stages.bronze import BronzeStage
from pipelines.stages.gold import GoldSplitStage, GoldStage
from pipelines.stages.gold_join import JoinSplitStage, JoinStage
from pipelines.stages.silver import SilverStage

OnCommit = Callable[[BatchCommit], None]
#: The two queries of each kind of gold table: the split, then the stateful one.
GOLD_KINDS: dict[
    type, tuple[type[GoldSplitStage | JoinSplitStage], type[GoldStage | JoinStage]]
] = {
    GoldSpec: (GoldSplitStage, GoldStage),
    GoldJoinSpec: (JoinSplitStage, JoinStage),
}


def gold_stages(
    spec: FlowSpec,
    settings: Settings,
    guard: LeaseGuard | None,
    on_commit: OnCommit,
    _full_refresh: bool = False,
) -> list[Stage]:
    """The two stages of each gold table of the spec, in order (split, then stateful)."""
    stages: list[Stage] = []
    for gold in spec.gold:
        for stage_class in GOLD_KINDS[type(gold)]:
            stages.append(stage_class(spec, gold, settings, guard, on_commit))
    return stages


#: Builds a kind's stages: (spec, settings, lease guard, on commit, full refresh) -> the stages.
StageBuilder = Callable[[FlowSpec, Settings, LeaseGuard | None, OnCommit, bool], list[Stage]]
#: Stage kinds in flow order: whether a spec declares the stage, and how to build its stages
#: (gold: two queries per gold table).
STAGE_KINDS: list[tuple[str, Callable[[FlowSpec], bool], StageBuilder]] = [
    (
        "bronze",
        lambda spec: True,
        lambda spec, st, guard, commit, _refresh: [BronzeStage(spec, st, guard, commit)],
    ),
    ("silver", lambda spec: spec.silver is not None, lambda *args: [SilverStage(*args)]),
    ("gold", lambda spec: bool(spec.gold), gold_stages),
]


@dataclass
class FlowPipeline:
    """The stages of one flow and the queries that run them."""

    spec: FlowSpec
    settings: Settings
    guard: LeaseGuard | None
    tracker: ProgressTracker
    #: Rebuild the stages after bronze from bronze (:mod:`pipelines.silver.refresh`).
    full_refresh: bool = False
    stages: list[Stage] = field(init=False)

    def __post_init__(self) -> None:
        self.stages = []
        query = self.spec.name
        for _kind, declared, build in STAGE_KINDS:
            if not declared(self.spec):
                continue
            runs_in: dict[str, str] = {}
            built = build(
                self.spec, self.settings, self.guard, self._recorder(runs_in), self.full_refresh
            )
            for stage in built:
                query = stage.query_name if stage.own_query else query
                runs_in[stage.kind] = query
                self.stages.append(stage)
                self.tracker.track(self.spec.name, stage.kind, stage.main_table, stage.tables)

    def _recorder(self, runs_in: dict[str, str]) -> OnCommit:
        """Records a stage's commits under the query whose batch it runs in (by stage kind)."""
        return lambda commit: self.tracker.record_commit(commit, runs_in[commit.stage])

    def prepare(self, spark: SparkSession) -> None:
        for stage in self.stages:
            stage.prepare(spark)

    def finish(self, spark: SparkSession) -> list[TableWrite]:
        """After every query of the run ended cleanly: each stage's closing work, in order."""
        return [write for stage in self.stages for write in stage.finish(spark)]

    def phases(self, trigger_mode: str | None) -> list[list[Stage]]:
        """The stages that start a query, grouped in the phases they run in (see module doc)."""
        heads = [s for s in self.stages if s.own_query]
        if (trigger_mode or self.spec.trigger.mode) == "available_now":
            return [[stage] for stage in heads]
        return [heads]

    def fused_after(self, head: Stage) -> list[Stage]:
        """The stages that write inside ``head``'s query."""
        index = self.stages.index(head)
        fused: list[Stage] = []
        for stage in self.stages[index + 1 :]:
            if stage.own_query:
                break
            fused.append(stage)
        return fused

    def start(self, head: Stage, spark: SparkSession, trigger_mode: str | None) -> StreamingQuery:
        """Start the query of ``head`` (a stage with its own query) and the stages fused into it."""
        fused = self.fused_after(head)
        mode = trigger_mode or self.spec.trigger.mode
        head.starting(mode)

        def write(batch: DataFrame, batch_id: int) -> None:
            what = f"{head.query_name} batch {batch_id}"
            run_batch(lambda: head.write_with(batch, batch_id, fused), what)

        head.checkpoint.mkdir()
        writer = (
            head.input_stream(spark)
            .writeStream.queryName(head.query_name)
            .option("checkpointLocation", str(head.checkpoint))
            .outputMode(head.output_mode)
            .foreachBatch(self.tracker.failures.watch(head.query_name, write))
        )
        if mode == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.spec.trigger.interval)
        return writer.start()
