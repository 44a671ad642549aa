"""Run the stream runner as a real separate process, the way a scheduler or a cluster would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pipelines.settings import PROJECT_ROOT

T = TypeVar("T")


class RunnerProcess:
    """``python -m pipelines.runner`` in its own process group, output captured to a file."""

    def __init__(self, specs: list[Path], env: dict[str, str], log: Path, *args: str) -> None:
        command = [sys.executable, "-m", "pipelines.runner"]
        for spec in specs:
            command += ["--spec", str(spec)]
        self.log = log
        self._out = log.open("ab")
        self.process = subprocess.Popen(
            [*command, *args],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def progress_lines(self) -> int:
        return self.output().count("conflux.progress ")

    def wait_for_progress(self, batches: int, timeout: float) -> bool:
        """True once ``batches`` progress lines appeared in total; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.progress_lines() >= batches:
                return True
            time.sleep(0.2)
        return False

    def kill(self) -> None:
        """SIGKILL the driver and its JVM: a crash, with no chance to clean up."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        self._out.close()

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._out.close()


#: The ``conflux`` console script of this environment.
CONFLUX = str(Path(sys.executable).parent / "conflux")


class CliProcess:
    """``conflux <args>`` in its own process group, as a terminal runs it; output to a file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        self._out = log.open("wb")
        self.process = subprocess.Popen(
            [CONFLUX, *args], env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def interrupt(self) -> None:
        """What a terminal's Ctrl-C does: SIGINT to the foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.wait(timeout=60)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._out.close()


def wait_until(
    predicate: Callable[[], T], timeout: float, what: str, alive: CliProcess | None = None
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``, or
    as soon as ``alive`` exited, with the end of its output."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if alive is not None:
            assert alive.process.poll() is None, f"exited before {what}:\n{alive.output()[-4000:]}"
        tail = alive.output()[-4000:] if alive is not None else ""
        assert time.monotonic() < deadline, (
            f"timed out after {timeout:.0f} s waiting for {what}\n{tail}"
        )
        time.sleep(0.2)
    return value
