"""The benchmark's own Kafka broker, started and stopped through ``platform/kafka/broker.py``."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import PROJECT_ROOT, PYTHON, BenchError, Outcome, Row, conflux_env, say

BROKER_SCRIPT = PROJECT_ROOT / "platform" / "kafka" / "broker.py"


@dataclass(frozen=True)
class Broker:
    runtime_dir: Path
    jars_dir: Path
    state: dict[str, Any]
    command_seconds: float

    @property
    def bootstrap(self) -> str:
        return str(self.state["bootstrap_servers"])


def broker_cli(
    runtime_dir: Path, jars_dir: Path, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(BROKER_SCRIPT), *args],
        env=conflux_env(runtime_dir, jars_dir),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_broker(runtime_dir: Path, jars_dir: Path) -> Broker:
    """Start a fresh broker (the start formats its storage) and time the start command."""
    say(f"starting a fresh broker in {runtime_dir}")
    started = time.monotonic()
    result = broker_cli(runtime_dir, jars_dir, "start", "--timeout", "120", timeout=240)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise BenchError(f"broker start failed (exit {result.returncode}):\n{result.stderr}")
    state = json.loads(result.stdout)
    if not state.get("formatted_storage"):
        raise BenchError("the broker was not freshly formatted: the measurement would be wrong")
    say(f"broker ready at {state['bootstrap_servers']} ({state['ready_seconds']} s)")
    return Broker(runtime_dir, jars_dir, state, seconds)


def stop_broker(runtime_dir: Path, jars_dir: Path) -> None:
    """Stop the broker of ``runtime_dir`` (a no-op if none runs); never raises."""
    try:
        result = broker_cli(runtime_dir, jars_dir, "stop", "--timeout", "60", timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"WARNING: stopping the broker failed: {exc}")
        return
    say(f"broker stop: exit {result.returncode}: {result.stderr.strip()}")


def broker_outcome(broker: Broker) -> Outcome:
    ready = float(broker.state["ready_seconds"])
    rows = [
        Row("broker_start", "spawn → healthy (CLI ready_seconds)", f"{ready:.2f} s",
            "JVM start until a metadata request succeeds"),
        Row("broker_start", "start command wall time", f"{broker.command_seconds:.2f} s",
            "python CLI + java -version + storage format + spawn + healthy"),
    ]  # fmt: skip
    data = {"ready_seconds": ready, "command_seconds": round(broker.command_seconds, 3)}
    return Outcome(rows, data)
