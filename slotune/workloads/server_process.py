"""A serving engine started from a shell command, for as long as a run needs it.

``regress`` (a suite's ``server``) and ``tune --verify`` (one server per configuration)
start servers the same way: in a process group of their own, the output kept in a log
file, ready when ``GET /health`` answers 200 within a bounded wait, and stopped with the
whole group (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``) so the port is free afterwards.

Runs that repeat prompts on one server (``tune --verify``'s repeats, the probe's loads)
first ask it to drop its prefix cache (``reset_prefix_cache``): the simulation they are
compared with starts cold. vLLM serves that endpoint only in its development mode, which
the servers started here get (``VLLM_SERVER_DEV_MODE=1``, as vLLM's own benchmark sweeps
start theirs).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path
from types import TracebackType

STOP_TIMEOUT_S = 10.0
RESET_TIMEOUT_S = 30.0
# the prefix-cache resets a server may serve: vLLM's (and slotune's), SGLang's
RESET_ENDPOINTS = ("/reset_prefix_cache", "/flush_cache")
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
RESET_HINT = "vLLM serves /reset_prefix_cache with VLLM_SERVER_DEV_MODE=1 in its environment"


class ServerStartError(RuntimeError):
    """The server exited or did not answer ``/health`` in time; ``log_tail`` is the end
    of its output."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(f"{message}: {log_tail}" if log_tail else message)
        self.log_tail = log_tail


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served_model(url: str) -> str:
    """The first model id the OpenAI-compatible server at ``url`` lists at ``/v1/models``."""
    import json

    with urllib.request.urlopen(f"{url.rstrip('/')}/v1/models", timeout=10) as response:
        data = json.loads(response.read())
    return str(data["data"][0]["id"])


def reset_prefix_cache(url: str) -> str | None:
    """Ask the server at ``url`` to drop its prefix cache; the endpoint that did it, or
    None when none of ``RESET_ENDPOINTS`` answered 200 (not served, or the server busy)."""
    for path in RESET_ENDPOINTS:
        request = urllib.request.Request(f"{url.rstrip('/')}{path}", data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=RESET_TIMEOUT_S) as response:
                if response.status == 200:
                    return path
        except urllib.error.HTTPError:
            continue
        except (urllib.error.URLError, OSError):
            return None
    return None


class ServerProcess:
    """``with ServerProcess(command, url, log=path) as server:`` runs ``command`` (a shell
    line) until the block ends; entering waits until ``url``/health answers."""

    def __init__(
        self,
        command: str,
        url: str,
        *,
        log: Path,
        cwd: Path | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.command = command
        self.url = url.rstrip("/")
        self.log = log
        self.cwd = cwd
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def restart(self) -> None:
        """Stop the server and start it again (a cold cache when it cannot drop its own)."""
        self.stop()
        self.restarts += 1
        self.start()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def start(self) -> None:
        """Launch the command and wait until it answers ``/health`` (ServerStartError if it
        exits or stays silent; it is stopped then)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab" if self.restarts else "wb") as out:  # a restart appends
            self.proc = subprocess.Popen(
                self.command,
                shell=True,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=os.environ | SERVER_ENV,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        health = f"{self.url}/health"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"server exited with {self.proc.returncode}", self.log_tail(1)
                )
            try:
                with urllib.request.urlopen(health, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise ServerStartError(
            f"{health} did not answer within {self.start_timeout_s:g} s", self.log_tail(1)
        )

    def stop(self) -> None:
        """SIGTERM the server's process group and wait until all of it has exited, SIGKILL
        after ``STOP_TIMEOUT_S``. The shell that started the server exits at once while the
        server drains, so waiting for the shell alone would leave the port still bound."""
        proc = self.proc
        if proc is None:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_S
        _signal_group(proc, signal.SIGTERM)
        while _group_alive(proc):
            if time.monotonic() > deadline:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.05)
        self.proc = None


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    proc.poll()  # reap the shell, or the group stays alive as its zombie
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True
