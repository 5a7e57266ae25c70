"""Quota refusals: a call the daemon refused before any of it ran (a 429
or 503 whose problem names the ``quota``) is tried again after its
Retry-After, within the client's wait; a refusal that came during a call
(no ``quota``), or one past the wait, reaches the caller at once, so
nothing runs twice (a fake daemon on a unix socket)."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anyio
import pytest

from inspect_pve_inspect import NodeConfig
from inspect_pve_inspect.client import Client, Problem, retriable, retry_after

_EXIT = {"exit_code": 0, "stdout": "", "stderr": ""}


class _Daemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, answers: list[tuple[int, dict[str, Any]]]) -> None:
        self.answers = answers
        self.calls = 0
        super().__init__(path, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Daemon

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        i = min(self.server.calls, len(self.server.answers) - 1)
        self.server.calls += 1
        code, doc = self.server.answers[i]
        b = json.dumps(doc).encode()
        self.send_response(code)
        ctype = "application/json" if code < 400 else "application/problem+json"
        self.send_header("Content-Type", ctype)
        if code >= 400:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "api.sock")


def _slots(status: int) -> tuple[int, dict[str, Any]]:
    typ = "too-many-requests" if status == 429 else "unavailable"
    return status, {"type": typ, "status": status, "detail": "slots", "quota": "exec-slots"}


_DURING = (
    429,
    {"type": "too-many-requests", "status": 429, "detail": "guest buffer bytes"},
)


@pytest.mark.parametrize(
    ("answers", "wait", "want_calls", "want_error"),
    [
        ([_slots(429), _slots(503), (200, _EXIT)], 30.0, 3, None),
        ([_DURING, (200, _EXIT)], 30.0, 1, "too-many-requests"),
        ([_slots(429), (200, _EXIT)], 0.0, 1, "too-many-requests"),
        (
            [(400, {"type": "invalid-request", "status": 400, "quota": "x"}), (200, _EXIT)],
            30.0,
            1,
            "invalid-request",
        ),
    ],
    ids=["retried-until-it-runs", "refused-during-the-call", "no-time-left", "not-a-quota-status"],
)
def test_quota_refusal_retried_only_before_the_call(
    sock: str,
    answers: list[tuple[int, dict[str, Any]]],
    wait: float,
    want_calls: int,
    want_error: str | None,
) -> None:
    srv = _Daemon(sock, answers)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    async def run() -> None:
        async with Client(NodeConfig(url="unix://" + sock), quota_wait=wait) as c:
            await c.exec("sb1", "default", {"argv": ["true"]})

    try:
        if want_error is None:
            anyio.run(run)
        else:
            with pytest.raises(Problem) as e:
                anyio.run(run)
            assert e.value.type == want_error
    finally:
        srv.shutdown()
        srv.server_close()
    assert srv.calls == want_calls


@pytest.mark.parametrize(
    ("header", "want"),
    [(None, 1.0), ("5", 5.0), ("0", 1.0), ("3600", 30.0), ("soon", 1.0)],
)
def test_retry_after(header: str | None, want: float) -> None:
    assert retry_after(header) == want


def test_retriable() -> None:
    assert retriable(Problem(429, {"type": "too-many-requests", "quota": "file-slots"}))
    assert retriable(Problem(503, {"type": "unavailable", "quota": "exec-slots"}))
    assert not retriable(Problem(429, {"type": "too-many-requests"}))
    assert not retriable(Problem(429, {"type": "guard-refused", "cap": "vms"}))
    assert not retriable(Problem(500, {"type": "internal", "quota": "exec-slots"}))
