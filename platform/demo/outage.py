"""The demo's broker outage: a continuous flow rides it out, and its state says so all along.

``conflux run orders_live --continuous`` runs in the background (its log in
``<runtime>/demo-logs/outage.log``); orders arrive; the local broker stops; the flow's query fails
when Kafka's client gives up and waits for the broker inside its application ("waiting for
source"); the broker starts again on the port it had; the query starts again from its checkpoint,
in the same application, and lands the orders produced meanwhile; ``conflux stop`` ends it. Each
step prints what ``conflux status`` says then (the same state the Dagster check and sensor read).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from confluent_kafka import Producer  # noqa: E402
from produce_sample import TOPIC, next_ids, order  # noqa: E402
from step import batches  # noqa: E402

from pipelines.run_state import Phase, RunState, flow_run_state  # noqa: E402
from pipelines.settings import Settings, load_settings  # noqa: E402
from pipelines.spec import FlowSpec, load_spec  # noqa: E402

FLOW = "orders_live"
BROKER = [sys.executable, str(ROOT / "platform" / "kafka" / "broker.py")]
CONFLUX = str(Path(sys.executable).parent / "conflux")


def say(line: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')}  {line}", flush=True)


def produce(settings: Settings, count: int) -> range:
    """``count`` new orders on the orders topic (only: the other demo flows are done)."""
    ids, rng = next_ids(settings, count), random.Random(7)
    producer = Producer({"bootstrap.servers": settings.resolved_bootstrap_servers()})
    for order_id in ids:
        event = order(order_id, rng)
        producer.produce(
            TOPIC, key=str(event["customer_id"]).encode(), value=json.dumps(event).encode()
        )
    if producer.flush(60) != 0:
        raise RuntimeError("the demo's orders were not delivered")
    return ids


def wait_for(what: str, test: Callable[[], RunState | None], timeout: float) -> RunState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = test()
        if found is not None:
            return found
        time.sleep(1)
    raise SystemExit(f"the demo's outage step gave up waiting for {what} after {timeout:.0f} s")


def state_is(spec: FlowSpec, settings: Settings, phase: Phase) -> Callable[[], RunState | None]:
    def test() -> RunState | None:
        state = flow_run_state(spec, settings)
        return state if state.phase is phase else None

    return test


def landed(log: Path) -> int:
    return sum(rows for stage, rows in batches(log.read_text()).items() if stage.endswith("bronze"))


def main() -> int:
    settings = load_settings()
    spec = load_spec(settings.flows_dir / f"{FLOW}.yaml")
    log = settings.runtime_dir / "demo-logs" / "outage.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"\n== a broker outage, ridden out: conflux run {FLOW} --continuous while the broker stops"
    )
    with log.open("w") as out:
        run = subprocess.Popen(
            [CONFLUX, "run", FLOW, "--continuous"], stdout=out, stderr=subprocess.STDOUT
        )
        try:
            return outage(spec, settings, run, log)
        finally:
            if run.poll() is None:
                run.kill()
            print(f"  (full log: {log})", flush=True)


def outage(spec: FlowSpec, settings: Settings, run: subprocess.Popen[bytes], log: Path) -> int:
    first = wait_for("the flow to run", state_is(spec, settings, Phase.RUNNING), 240)
    time.sleep(10)  # its query has settled on the topic's end (starting_offsets: latest)
    produce(settings, 200)
    wait_for("its first orders", lambda: first if landed(log) >= 200 else None, 120)
    before = landed(log)
    say(f"{before} orders landed in bronze_{FLOW}")
    say(f"conflux status: {flow_run_state(spec, settings).summary}")

    bootstrap = settings.resolved_bootstrap_servers()
    subprocess.run([*BROKER, "stop"], check=True, capture_output=True)
    say(f"the broker at {bootstrap} is stopped")
    waiting = wait_for(
        "the flow to wait for its source", state_is(spec, settings, Phase.WAITING_FOR_SOURCE), 300
    )
    say(f"conflux status: {waiting.summary}")
    time.sleep(15)
    subprocess.run([*BROKER, "start"], check=True, capture_output=True)
    say(f"the broker is back at {load_settings().resolved_bootstrap_servers()}")
    produce(settings, 300)
    say("300 more orders produced")
    back = wait_for("the flow to run again", state_is(spec, settings, Phase.RUNNING), 240)
    wait_for("the new orders", lambda: back if landed(log) >= before + 300 else None, 240)
    same = "the same application" if back.owner == first.owner else "a new application"
    say(f"conflux status: {back.summary} ({same})")
    say(f"{landed(log) - before} more orders landed after the outage")

    subprocess.run([CONFLUX, "stop", FLOW], check=True, capture_output=True)
    code = run.wait(timeout=180)
    say(f"conflux stop {FLOW}: conflux run exited with code {code}")
    say(f"conflux status: {flow_run_state(spec, settings).summary}")
    return code


if __name__ == "__main__":
    sys.exit(main())
