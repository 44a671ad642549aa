"""What a stage that runs as its own streaming query does by default (see :class:`Stage`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from pipelines.progress import BatchCommit

if TYPE_CHECKING:
    from pipelines.stages import Stage


class QueryStage:
    """Defaults of a stage whose query hosts no other stage and needs no word of the others."""

    def write_batch(self, batch: DataFrame, batch_id: int) -> BatchCommit:
        raise NotImplementedError

    def starting(self, trigger_mode: str) -> None:
        """Before its query starts, under ``trigger_mode``: nothing to learn by default."""

    def write_with(self, batch: DataFrame, batch_id: int, fused: Sequence[Stage]) -> None:
        """Write one batch of the stage's own query; only bronze hosts fused stages."""
        if fused:
            kinds = ", ".join(stage.kind for stage in fused)
            raise TypeError(f"{type(self).__name__} cannot host the fused stages {kinds}")
        self.write_batch(batch, batch_id)
