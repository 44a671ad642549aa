"""One step of the demo: its story on the terminal, its whole log in a file.

``python platform/demo/step.py TITLE LOG -- COMMAND...`` runs COMMAND with its output (Spark's
WARNs, Dagster's DEBUG events, the runner's JSON progress lines) going to
``<runtime>/demo-logs/LOG.log``, and prints what a person follows: the title, Conflux's own
``conflux:`` lines, the batches and rows each flow committed, Dagster's verdict, and a line every
15 s while it runs. A failure prints the log's end and its path; the exit code is the command's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.job_progress import ticking
from pipelines.reporting import PROGRESS_PREFIX
from pipelines.settings import load_settings

#: Seconds between the "still running" lines of a long step.
TICK_SECONDS = 15.0
#: Dagster's lines worth telling, by the words that mark them.
DAGSTER_VERDICTS = ("RUN_SUCCESS", "RUN_FAILURE", "STEP_FAILURE")
#: Conflux's own lines that are noise in a story (the progress JSON is summed instead).
QUIET = ("conflux.progress", "conflux.summary")


def told(line: str) -> str | None:
    """The part of a log line a person reads in the demo, or None."""
    if PROGRESS_PREFIX in line or any(q in line for q in QUIET):
        return None
    if "conflux: " in line:
        return "  " + line[line.index("conflux: ") :].strip()
    for verdict in DAGSTER_VERDICTS:
        if verdict in line:
            return f"  dagster: {verdict.lower().replace('_', ' ')}" + (
                f": {line.split(' - ')[-1].strip()}" if " - " in line else ""
            )
    return None


def batches(log_text: str) -> Counter[str]:
    """Rows each flow's stages added, from the runner's progress lines."""
    rows: Counter[str] = Counter()
    for line in log_text.splitlines():
        if PROGRESS_PREFIX not in line:
            continue
        try:
            batch = json.loads(line.split(PROGRESS_PREFIX, 1)[1])
        except ValueError:
            continue
        rows[f"{batch.get('flow')} {batch.get('stage')}"] += int(batch.get("rows_added") or 0)
    return rows


def run(title: str, log_name: str, command: list[str]) -> int:
    logs = load_settings().runtime_dir / "demo-logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{log_name}.log"
    print(f"\n== {title}", flush=True)
    started = time.monotonic()
    with log.open("w") as out, ticking(TICK_SECONDS):
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            out.write(line)
            if (story := told(line)) is not None:
                print(story, flush=True)
        code = process.wait()
    text = log.read_text(errors="replace")
    for stage, rows in sorted(batches(text).items()):
        print(f"  {stage}: {rows} rows added", flush=True)
    if code != 0:
        print("".join(text.splitlines(keepends=True)[-40:]), end="", file=sys.stderr)
    print(f"  ({time.monotonic() - started:.0f} s, exit code {code}; full log: {log})", flush=True)
    return code


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 2:
        print("usage: step.py TITLE LOG -- COMMAND...", file=sys.stderr)
        return 2
    return run(argv[0], argv[1], argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
