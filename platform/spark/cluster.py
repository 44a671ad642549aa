"""Local Spark standalone cluster for Conflux: a master and two workers on 127.0.0.1.

Run it as a script (from any directory)::

    .venv/bin/python platform/spark/cluster.py start [--timeout 90] [--isolation auto|namespace|none]
    .venv/bin/python platform/spark/cluster.py stop [--timeout 30]
    .venv/bin/python platform/spark/cluster.py status

Everything lives under ``Settings.cluster_dir`` (``<runtime>/spark-cluster``): ``ports.json`` (the
master's ports, chosen once and kept, so the master URL survives restarts), ``cluster.json`` (the
running cluster: master URL, pids, what the workers can see; read by the ``cluster`` profile),
``logs/`` (one file per daemon), ``work/worker-N`` (each worker's application folders, cleaned by
the worker) and ``local/worker-N`` (executors' shuffle and spill files).

**Workers do not share the driver's flow state.** On a real cluster an executor runs on another
host: a table or checkpoint on the driver's local disk is not there. Here each worker starts in a
private mount namespace (``unshare``; root only) where the runtime folder shows only the jars and
this cluster's own folder, read-only: the lake, the checkpoints, the flows' leases and status and
every other service's state are absent. An executor that touches one of them fails as it would on
another host. The project (its code, its virtualenv and pyspark's ``spark-class``) stays visible,
as an image would carry it. ``--isolation none`` (the fallback when not root) shares the disk,
and ``status`` says so.

Machine-readable results (JSON) go to stdout, messages to stderr. Exit codes: 0 success,
1 cluster failure or not healthy, 2 configuration problem (missing Java or pyspark, port taken...).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))

from local_service import (  # platform/services/local_service.py
    HOST,
    Command,
    ensure_port_free,
    free_ports,
    locked,
    log_tail,
    now,
    print_json,
    read_json,
    run_cli,
    runs_with,
    say,
    spawn_logged,
    terminate,
    write_json,
)

from pipelines.errors import ConfigError
from pipelines.jvm import check_java, java_executable
from pipelines.settings import Settings

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
WORKERS = 2
#: Two cores per worker on a 2-core machine: two applications (a flow and a maintenance job, say)
#: can each hold one executor on every worker (``spark.cores.max`` 2 on the cluster profile).
WORKER_CORES = 2
WORKER_MEMORY = "3g"
#: Daemons are small and must start in seconds: C1 only, a small heap.
DAEMON_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
DAEMON_MEMORY = "384m"
#: The worker deletes the folders of finished applications (jars, py-files, logs) after an hour.
WORKER_CLEANUP = (
    "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 "
    "-Dspark.worker.cleanup.appDataTtl=3600"
)


class ClusterError(RuntimeError):
    """The cluster failed to start or is not healthy."""


@dataclass(frozen=True)
class ClusterPaths:
    root: Path

    @classmethod
    def of(cls, settings: Settings) -> ClusterPaths:
        return cls(settings.cluster_dir)

    @property
    def ports(self) -> Path:
        return self.root / "ports.json"

    @property
    def state(self) -> Path:
        return self.root / "cluster.json"

    @property
    def lock(self) -> Path:
        return self.root / "cluster.lock"

    def log_file(self, daemon: str) -> Path:
        return self.root / "logs" / f"{daemon}.out"

    def work_dir(self, worker: int) -> Path:
        return self.root / "work" / f"worker-{worker}"

    def local_dir(self, worker: int) -> Path:
        return self.root / "local" / f"worker-{worker}"


def spark_home() -> Path:
    """The pip-installed Spark (``bin/spark-class`` and ``jars/``): the one every driver uses."""
    import pyspark

    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    if not (home / "bin" / "spark-class").exists():
        raise ConfigError(f"{home}/bin/spark-class is missing: install pyspark (make setup)")
    return home


def saved_ports(paths: ClusterPaths) -> dict[str, int]:
    """The master's RPC and web UI ports: chosen once, kept across restarts."""
    saved = read_json(paths.ports) or {}
    if {"master", "master_ui"} <= saved.keys():
        return {key: int(saved[key]) for key in ("master", "master_ui")}
    master, master_ui = free_ports(2)
    paths.root.mkdir(parents=True, exist_ok=True)
    write_json(paths.ports, {"master": master, "master_ui": master_ui})
    return {"master": master, "master_ui": master_ui}


# --------------------------------------------------------------------------- isolation


def isolation_mode(requested: str, settings: Settings, paths: ClusterPaths) -> str:
    """``namespace`` (workers in a private mount namespace) or ``none``.

    ``auto`` takes ``namespace`` when the workers' namespace can really be set up here (the
    script of :func:`namespace_script` is run once, ending in ``true``), else ``none`` with a
    warning; an explicit ``namespace`` that cannot be had is a ConfigError naming the cause.
    """
    if requested == "none":
        return "none"
    problem = _namespace_problem(settings, paths)
    if problem is None:
        return "namespace"
    if requested == "namespace":
        raise ConfigError(f"--isolation namespace: {problem}; use --isolation none to share disk")
    say(f"warning: workers share the driver's disk ({problem})")
    return "none"


def _namespace_problem(settings: Settings, paths: ClusterPaths) -> str | None:
    runtime = settings.runtime_dir.resolve()
    if runtime.is_relative_to(settings.jars_dir.resolve()):
        return f"the jars folder {settings.jars_dir} holds the runtime folder: nothing to hide"
    if os.geteuid() != 0:
        return "private mount namespaces need root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    for folder in visible_folders(settings, paths):
        folder.mkdir(parents=True, exist_ok=True)
    script = namespace_script(settings, paths) + "\nexec true"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"setting up the workers' mount namespace failed: {probe.stderr.strip()}"
    return None


def visible_folders(settings: Settings, paths: ClusterPaths) -> list[Path]:
    """What a worker sees of the runtime folder: the jars and the cluster's own folder."""
    runtime = settings.runtime_dir.resolve()
    keep = [settings.jars_dir.resolve(), paths.root.resolve()]
    return [folder for folder in keep if folder.is_relative_to(runtime)]


def namespace_script(settings: Settings, paths: ClusterPaths) -> str:
    """Shell lines run (as root, in the worker's new mount namespace) before it starts: the
    runtime folder replaced by an empty read-only one that holds only :func:`visible_folders`,
    bind-mounted back from a staging tmpfs on ``/mnt`` (the namespace's own, dropped after)."""
    runtime = shlex.quote(str(settings.runtime_dir.resolve()))
    visible = [shlex.quote(str(folder)) for folder in visible_folders(settings, paths)]
    lines = ["set -e", "mount -t tmpfs conflux-stage /mnt"]
    for index, folder in enumerate(visible):
        lines += [f"mkdir /mnt/{index}", f"mount --bind {folder} /mnt/{index}"]
    lines.append(f"mount -t tmpfs -o mode=0755 conflux-runtime {runtime}")
    lines += [f"mkdir -p {folder}" for folder in visible]
    lines.append(f"mount -o remount,ro {runtime}")
    writable = shlex.quote(str(paths.root.resolve()))  # the workers' own folders
    for index, folder in enumerate(visible):
        lines.append(f"mount --bind /mnt/{index} {folder}")
        if folder != writable:
            lines.append(f"mount -o remount,ro,bind {folder}")
    lines.append("umount -l /mnt")
    return "\n".join(lines)


def worker_command(
    settings: Settings, paths: ClusterPaths, worker: int, master_url: str, isolation: str
) -> list[str]:
    """The worker's command line; in a namespace, ``exec`` keeps one pid from unshare to java."""
    home = spark_home()
    work = paths.work_dir(worker)
    worker_args = [
        str(home / "bin" / "spark-class"), WORKER_CLASS, "--host", HOST,
        "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY, "--webui-port", "0",
        "--work-dir", str(work), master_url,
    ]  # fmt: skip
    if isolation == "none":
        return worker_args
    script = namespace_script(settings, paths) + "\nexec " + shlex.join(worker_args)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def daemon_environment(paths: ClusterPaths, worker: int | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": DAEMON_OPTIONS,
    }
    if worker is not None:
        env.update(
            SPARK_WORKER_DIR=str(paths.work_dir(worker)),
            SPARK_LOCAL_DIRS=str(paths.local_dir(worker)),
            SPARK_WORKER_OPTS=WORKER_CLEANUP,
        )
    return {k: v for k, v in env.items() if not k.startswith(("CONFLUX_", "AWS_"))}


# --------------------------------------------------------------------------- health


def master_json(ui_port: int, timeout: float = 2.0) -> dict[str, Any] | None:
    """The master's own view (``/json``: its status and every worker's), or None."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{ui_port}/json/", timeout=timeout) as reply:
            data = json.loads(reply.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def alive_workers(view: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not view:
        return []
    return [w for w in view.get("workers", []) if w.get("state") == "ALIVE"]


def wait_for_workers(ui_port: int, count: int, timeout: float, pids: Sequence[int]) -> float:
    """Block until the master reports ``count`` live workers; the seconds waited."""
    start = time.monotonic()
    while len(alive_workers(master_json(ui_port))) < count:
        dead = [pid for pid in pids if not runs_with(pid)]
        if dead:
            raise ClusterError(f"daemon(s) {dead} exited before {count} workers registered")
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{count} workers did not register within {timeout:.0f} s")
        time.sleep(0.3)
    return time.monotonic() - start


# --------------------------------------------------------------------------- start / stop


def _live(state: dict[str, Any] | None) -> bool:
    return state is not None and runs_with(state.get("master_pid", -1), MASTER_CLASS)


def start_cluster(
    settings: Settings, timeout: float = 90.0, isolation: str = "auto"
) -> dict[str, Any]:
    """Start the master and the workers, or return the state of the healthy cluster running."""
    check_java(java_executable())
    paths = ClusterPaths.of(settings)
    with locked(paths.lock):
        state = read_json(paths.state)
        if _live(state):
            assert state is not None
            dead = [pid for pid in state["worker_pids"] if not runs_with(pid, WORKER_CLASS)]
            if dead:
                raise ClusterError(
                    f"the master runs (pid {state['master_pid']}) but worker(s) {dead} died: "
                    f"see {paths.root / 'logs'}; restart the cluster (make cluster-stop "
                    "cluster-start)"
                )
            try:
                wait_for_workers(state["master_ui_port"], WORKERS, timeout, state["worker_pids"])
            except TimeoutError as exc:
                raise ClusterError(f"{exc}: see {paths.root / 'logs'}") from exc
            return {**state, "already_running": True, "healthy": True}
        _stop_daemons(state or {}, 10.0)
        mode = isolation_mode(isolation, settings, paths)
        ports = saved_ports(paths)
        ensure_port_free(ports["master"], "master port", "(delete ports.json to choose again)")
        ensure_port_free(ports["master_ui"], "master UI port", "(delete ports.json)")
        return _launch(settings, paths, ports, mode, timeout)


def _launch(
    settings: Settings, paths: ClusterPaths, ports: dict[str, int], mode: str, timeout: float
) -> dict[str, Any]:
    (paths.root / "logs").mkdir(parents=True, exist_ok=True)
    master_url = f"spark://{HOST}:{ports['master']}"
    started = time.monotonic()
    master = spawn_logged(
        [str(spark_home() / "bin" / "spark-class"), MASTER_CLASS, "--host", HOST,
         "--port", str(ports["master"]), "--webui-port", str(ports["master_ui"])],
        paths.log_file("master"), paths.root, env=daemon_environment(paths),
    )  # fmt: skip
    pids = [master.pid]
    try:
        for worker in range(1, WORKERS + 1):
            for folder in (paths.work_dir(worker), paths.local_dir(worker)):
                folder.mkdir(parents=True, exist_ok=True)
            process = spawn_logged(
                worker_command(settings, paths, worker, master_url, mode),
                paths.log_file(f"worker-{worker}"),
                paths.root,
                env=daemon_environment(paths, worker),
            )
            pids.append(process.pid)
        wait_for_workers(ports["master_ui"], WORKERS, timeout, pids)
    except BaseException as exc:
        for pid in reversed(pids):
            terminate(pid, 10.0)
        if not isinstance(exc, TimeoutError | ClusterError):
            raise
        tails = "\n".join(
            f"--- the end of {log}:\n{log_tail(log, 15)}"
            for log in sorted((paths.root / "logs").glob("*.out"))
        )
        raise ClusterError(f"{exc}\n{tails}") from exc
    state = {
        "master_url": master_url,
        "master_pid": master.pid,
        "master_ui_port": ports["master_ui"],
        "master_ui": f"http://{HOST}:{ports['master_ui']}",
        "worker_pids": pids[1:],
        "worker_cores": WORKER_CORES,
        "worker_memory": WORKER_MEMORY,
        "isolation": mode,
        "worker_sees": [str(p) for p in visible_folders(settings, paths)] if mode != "none" else [],
        "logs": str(paths.root / "logs"),
        "started_at": now(),
    }
    write_json(paths.state, state)
    return {**state, "healthy": True, "ready_seconds": round(time.monotonic() - started, 2)}


def _stop_daemons(state: dict[str, Any], timeout: float) -> list[int]:
    """Stop the daemons ``state`` names that still run as what they were (a pid recycled since
    a crash or a reboot belongs to someone else: never signalled)."""
    daemons = [(pid, WORKER_CLASS) for pid in state.get("worker_pids", [])]
    daemons.append((state.get("master_pid"), MASTER_CLASS))
    stopped = []
    for pid, daemon_class in daemons:
        if isinstance(pid, int) and runs_with(pid, daemon_class):
            terminate(pid, timeout)
            stopped.append(pid)
    return stopped


def stop_cluster(settings: Settings, timeout: float = 30.0) -> bool:
    """Stop the workers (their executors with them), then the master; True if one was running."""
    paths = ClusterPaths.of(settings)
    with locked(paths.lock):
        state = read_json(paths.state)
        if state is None:
            return False
        live = _live(state)
        for pid in _stop_daemons(state, timeout):
            say(f"spark daemon pid {pid} stopped")
        paths.state.unlink(missing_ok=True)
        return live


def executor_pids(state: dict[str, Any]) -> list[int]:
    """The executor JVMs the workers run now (children of a worker's process)."""
    workers = set(state.get("worker_pids", []))
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        pid = int(stat.parent.name)
        if parent in workers and runs_with(pid, EXECUTOR_CLASS):
            found.append(pid)
    return sorted(found)


def cluster_status(settings: Settings) -> dict[str, Any]:
    """The cluster's state plus ``running``, ``healthy``, live workers and executors."""
    paths = ClusterPaths.of(settings)
    state = read_json(paths.state)
    if state is None:
        return {"running": False, "healthy": False, "state_file": str(paths.state)}
    if not _live(state):
        return {**state, "running": False, "healthy": False, "stale": True}
    alive = alive_workers(master_json(state["master_ui_port"]))
    return {
        **state,
        "running": True,
        "healthy": len(alive) >= WORKERS,
        "alive_workers": [w.get("id") for w in alive],
        "executor_pids": executor_pids(state),
    }


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cluster.py", description="Manage the local Spark standalone cluster."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start master + workers (no-op if healthy)")
    start.add_argument("--timeout", type=float, default=90.0, help="seconds to become healthy")
    start.add_argument(
        "--isolation",
        choices=("auto", "namespace", "none"),
        default="auto",
        help="workers in a private mount namespace (default when root) or on the shared disk",
    )
    stop = commands.add_parser("stop", help="stop the workers and the master")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    commands.add_parser("status", help="print the state; exit 0 only if healthy")
    return parser


def _cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    state = start_cluster(settings, args.timeout, args.isolation)
    print_json(state)
    if "ready_seconds" in state:
        say(
            f"Spark cluster ready at {state['master_url']} ({WORKERS} workers, "
            f"isolation {state['isolation']}) in {state['ready_seconds']} s; UI {state['master_ui']}"
        )
    return 0


def _cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    if not stop_cluster(settings, args.timeout):
        say(f"no cluster was running for {ClusterPaths.of(settings).root}")
    return 0


def _cmd_status(settings: Settings, _args: argparse.Namespace) -> int:
    status = cluster_status(settings)
    print_json(status)
    return 0 if status["healthy"] else 1


_COMMANDS: dict[str, Command] = {
    "start": _cmd_start,
    "stop": _cmd_stop,
    "status": _cmd_status,
}


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), _COMMANDS, ClusterError, argv)


if __name__ == "__main__":
    sys.exit(main())
