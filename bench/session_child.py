"""Child of the ``spark_session_start`` benchmark: create a Conflux SparkSession, run one job.

Prints one ``bench.session {json}`` line with the timings. Run by bench/session_start.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.spark import get_spark_session


def main() -> int:
    imported = time.time()
    created = time.monotonic()
    spark = get_spark_session("bench-session-start")
    ready = time.monotonic()
    spark.range(1).count()
    counted = time.monotonic()
    timings = {
        "imports_done_epoch": imported,
        "count_done_epoch": time.time(),
        "session_seconds": ready - created,
        "first_count_seconds": counted - ready,
        "create_to_count_seconds": counted - created,
    }
    print("bench.session " + json.dumps(timings), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
