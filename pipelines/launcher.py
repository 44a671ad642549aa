"""Launch flows as their own Spark application, holding their leases while it runs.

This is the one launcher behind Dagster (``assets/launch.py``) and ``conflux run``; like a Dagster
``PipesClient`` it owns the child's whole life:

1. it takes every flow's lease *before* any process starts (a second launch fails right here,
   naming the owner), and renews it from this process for as long as it lives: if the launcher
   dies, its application, now an orphan, sees its pid gone and stops at once (a driver on
   another host: when the renewals stop, within one lease period);
2. it starts ``spark-submit pipelines/runner.py --lease-owner <owner>`` in a session of its own,
   so a terminal's Ctrl-C reaches the launcher and not the Spark JVM;
3. it turns a stop (a Dagster terminate, SIGTERM, Ctrl-C) into the runner's stop file: the
   application stops after its in-flight micro-batch commits and exits 0; only past
   ``graceful_stop_seconds`` does it escalate to SIGTERM, then SIGKILL, of the process group;
4. it releases the leases only once the application has exited.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import check_locations
from pipelines.errors import ConfigError
from pipelines.lease import (
    FlowLease,
    LeaseTerm,
    held_leases,
    new_owner_id,
    owner_details,
    owner_process_gone,
)
from pipelines.location import Location
from pipelines.settings import Settings, settings_environment
from pipelines.spark import spark_conf, spark_environment
from pipelines.spec import FlowSpec
from pipelines.stopping import ask_to_stop, requester

RUNNER_SCRIPT = Path(__file__).resolve().parent / "runner.py"


@dataclass(frozen=True)
class SparkSubmit:
    """How to run ``spark-submit``: the executable and the settings it turns into ``--conf``."""

    executable: str = ""

    def resolve_executable(self) -> str:
        if self.executable:
            return self.executable
        beside_python = Path(sys.executable).parent / "spark-submit"
        found = str(beside_python) if beside_python.exists() else shutil.which("spark-submit")
        if not found:
            raise ConfigError(
                "spark-submit not found: install pyspark (make setup) or set spark_submit"
            )
        return found

    @staticmethod
    def environment() -> dict[str, str]:
        """Variables spark-submit needs: the pip-installed Spark home and this Python."""
        import pyspark

        return {
            "SPARK_HOME": os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent),
            "PYSPARK_PYTHON": sys.executable,
        }

    def command(
        self,
        settings: Settings,
        spec_files: list[Path],
        trigger: str | None,
        stop_file: Path,
        lease_owner: str | None,
        runner_args: Sequence[str] = (),
    ) -> list[str]:
        conf = spark_conf(settings)
        command = [
            self.resolve_executable(), "--master", conf.pop("spark.master"), "--name", "conflux",
        ]  # fmt: skip
        for key, value in sorted(conf.items()):
            command += ["--conf", f"{key}={value}"]
        command.append(str(RUNNER_SCRIPT))
        for spec_file in spec_files:
            command += ["--spec", str(spec_file)]
        if trigger:
            command += ["--trigger", trigger]
        if lease_owner:
            command += ["--lease-owner", lease_owner]
        return [*command, *runner_args, "--stop-file", str(stop_file)]


@dataclass
class FlowApplication:
    """A spark-submit of the runner for ``specs``, with their leases held by this process.

    Use it as a context manager: entering takes the leases (raising
    :class:`~pipelines.lease.LeaseHeldError` before anything starts) and starts the application;
    leaving stops it gracefully if it still runs, then releases the leases.
    """

    specs: list[FlowSpec]
    settings: Settings
    spark_submit: SparkSubmit = field(default_factory=SparkSubmit)
    trigger: str | None = None
    #: More arguments for the runner (e.g. ``--full-refresh``).
    runner_args: Sequence[str] = ()
    owner_kind: str = "launcher"
    details: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    wait_for_expiry_of: Callable[[LeaseTerm], bool] | None = owner_process_gone
    on_lease_lost: Callable[[str], None] | None = None
    graceful_stop_seconds: float = 120.0
    stdout: IO[Any] | int | None = None
    stderr: IO[Any] | int | None = None
    owner: str = field(init=False)
    process: subprocess.Popen[Any] | None = field(init=False, default=None)
    _stack: contextlib.ExitStack = field(init=False, default_factory=contextlib.ExitStack)
    _scratch: Path = field(init=False)

    def __post_init__(self) -> None:
        self.owner = new_owner_id(self.owner_kind)
        # Exists before anything starts, so a stop requested while the leases are still being
        # taken is seen by the runner as soon as it starts.
        self._scratch = Path(tempfile.mkdtemp(prefix="conflux-launch-"))

    @property
    def stop_file(self) -> Path:
        return self._scratch / "stop"

    def command(self) -> list[str]:
        return self.spark_submit.command(
            self.settings,
            [Path(s.spec_file) for s in self.specs],
            self.trigger,
            self.stop_file,
            self.owner,
            self.runner_args,
        )

    def __enter__(self) -> FlowApplication:
        leases = [
            FlowLease(
                spec.name,
                FlowState.of(spec, self.settings).lease_store(),
                self.owner,
                owner_details(launcher=self.owner_kind, **self.details),
                self.settings.lease_seconds,
            )
            for spec in self.specs
        ]
        try:
            self._stack.callback(shutil.rmtree, self._scratch, ignore_errors=True)
            check_locations(self.specs, self.settings)  # before a lease is taken or Spark starts
            self._stack.enter_context(
                held_leases(leases, self.wait_for_expiry_of, self.on_lease_lost)
            )
            env = {
                **settings_environment(self.settings),
                **spark_environment(self.settings),  # the S3 store's credentials, never in argv
                **self.spark_submit.environment(),
                **self.env,
            }
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdout=self.stdout,
                stderr=self.stderr,
                start_new_session=True,  # a terminal's Ctrl-C reaches the launcher, not the JVM
            )
        except BaseException:
            self._stack.close()
            raise
        return self

    def poll(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def request_stop(self, by: str) -> None:
        """Ask the runner to stop after its in-flight batches commit; ``by``: who asks
        (:func:`pipelines.stopping.requester`), recorded as the stop's reason."""
        ask_to_stop(Location.local(self.stop_file), by)

    def stop_gracefully(self, by: str) -> None:
        """Stop file first; SIGTERM, then SIGKILL of the process group if it hangs."""
        assert self.process is not None
        self.request_stop(by)
        for sig, wait in (
            (None, self.graceful_stop_seconds),
            (signal.SIGTERM, 30.0),
            (signal.SIGKILL, 10.0),
        ):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                ending = "its caller failed" if exc_type is not None else "it is done"
                self.stop_gracefully(requester(f"launcher {self.owner}, as {ending}"))
        finally:
            self._stack.close()  # releases the leases once the application has exited
