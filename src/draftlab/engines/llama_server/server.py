"""One llama-server process: started on a free port of 127.0.0.1 (never another interface), its log
kept in a file, ready once `/health` answers, and stopped (its whole process group) on success, on
error and on Ctrl-C, so that no server is left behind."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from draftlab.children import die_with_parent
from draftlab.engines.llamacpp.load import model_params
from draftlab.engines.llamacpp.probe import cpu_flags
from draftlab.errors import DraftlabError

HOST = "127.0.0.1"
START_TIMEOUT_S = 180
# A free port is chosen before the server binds it: another process may take it meanwhile (two test
# workers starting servers at once). The server answers to a name of its own, so that a neighbour on
# the port is never taken for it, and it starts again on another port.
START_ATTEMPTS = 3
_RUNNING: set[LlamaServer] = set()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class LlamaServer:
    def __init__(
        self,
        binary: Path,
        model: Path,
        args: list[str],
        threads: int,
        n_ctx: int,
        log: Path,
        slots: int = 1,
    ) -> None:
        """`n_ctx`: each slot's context; `slots`: requests decoded at once (llama-server's -np)."""
        self.binary, self.model, self.args = binary, model, list(args)
        self.threads, self.n_ctx, self.log, self.slots = threads, n_ctx, log, slots
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.start_s = 0.0
        self.alias = f"draftlab-{os.getpid()}-{uuid.uuid4().hex[:12]}"  # who answers on the port

    @property
    def command(self) -> list[str]:
        return [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "-t",
            str(self.threads),
            "-tb",
            str(self.threads),
            "-c",
            str(self.n_ctx * self.slots),  # split evenly: each slot keeps the whole context
            "-np",
            str(self.slots),
            "--no-kv-unified",
            "--no-webui",
            "--alias",
            self.alias,
            # As the llamacpp engine loads (engines/llamacpp/load.py): no extra buffer types on a
            # CPU with AMX, where the server died of an illegal instruction loading the Q4_1 file.
            *([] if model_params(cpu_flags())["use_extra_bufts"] else ["--no-repack"]),
            *self.args,
        ]

    def start(self) -> LlamaServer:
        t0 = time.perf_counter()
        for attempt in range(START_ATTEMPTS):  # the last attempt returns True or raises
            if self._start_on_a_free_port(last=attempt == START_ATTEMPTS - 1):
                break
        self.start_s = time.perf_counter() - t0
        return self

    def _start_on_a_free_port(self, last: bool) -> bool:
        """Whether the server came up; False where another process held the port (tried again
        elsewhere unless `last`)."""
        self.port = free_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as log:
            log.write(f"\n$ {' '.join(self.command)}\n")
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )
        _RUNNING.add(self)
        deadline = time.monotonic() + START_TIMEOUT_S
        neighbour = False  # another server answered on this port
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()
                if neighbour and not last:
                    return False
                raise DraftlabError(f"llama-server exited with code {code}: {self._last_log_line()}")
            answer = self._who_answers()
            if answer == self.alias:
                return True
            neighbour = neighbour or answer is not None
            time.sleep(0.05)
        self.stop()
        raise DraftlabError(
            f"llama-server did not answer /health within {START_TIMEOUT_S} s (log: {self.log})"
        )

    def _who_answers(self) -> str | None:
        """The name of the healthy server on this port (None: none answers yet)."""
        if not self._healthy():
            return None
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/props", timeout=2) as response:
                return str(json.loads(response.read()).get("model_alias"))
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
            return None

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _last_log_line(self) -> str:
        try:
            lines = [
                line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()
            ]
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(empty log)"

    def complete(self, payload: dict, timeout: float = 600) -> dict:
        """POST /completion; the parsed JSON answer."""
        if self.process is None or self.process.poll() is not None:
            raise DraftlabError(f"llama-server is not running: {self._last_log_line()}")
        request = urllib.request.Request(
            f"http://{HOST}:{self.port}/completion",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise DraftlabError(
                f"llama-server refused a request ({exc.code}): {exc.read().decode(errors='replace')[:300]}"
            ) from None
        except (urllib.error.URLError, ConnectionError) as exc:
            raise DraftlabError(f"llama-server stopped answering ({exc}): {self._last_log_line()}") from None

    def stop(self) -> None:
        process, self.process = self.process, None
        _RUNNING.discard(self)
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()
