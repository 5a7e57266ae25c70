"""Owner-scoped faces without a daemon: the provider refuses ``http://``
before a byte goes out, every sandbox it makes carries this user's id, and
``inspect sandbox cleanup pve_inspect`` deletes only this user's sandboxes
unless ``PVE_INSPECT_CLEANUP_ALL=1`` (a fake daemon on a unix socket stands
in for pve-inspectd; test_eval.py does the same on the bed)."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anyio
import pytest

from inspect_pve_inspect import NodeConfig, PveInspectSandboxEnvironment
from inspect_pve_inspect.config import PveInspectSandboxEnvironmentConfig, nodes_from_env
from inspect_pve_inspect.sandbox import (
    ENV_CLEANUP_ALL,
    LABEL_PROVIDER,
    LABEL_USER,
    PROVIDER,
    create_request,
)
from inspect_pve_inspect.user import user_id


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener that nothing should ever reach."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(0.3)
    yield s
    s.close()


def _reached(s: socket.socket) -> bool:
    try:
        c, _ = s.accept()
    except TimeoutError:
        return False
    c.close()
    return True


def test_http_url_refused_before_any_request(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    monkeypatch.setenv("PVE_INSPECT_URL", url)
    monkeypatch.setenv("PVE_INSPECT_TOKEN", "pvei_00000000_secret")
    for call in (
        nodes_from_env,
        lambda: anyio.run(PveInspectSandboxEnvironment.task_init, "t", None),
        lambda: anyio.run(PveInspectSandboxEnvironment.cli_cleanup, None),
        PveInspectSandboxEnvironment.default_concurrency,
    ):
        with pytest.raises(ValueError, match=r"http:// is refused.*in clear"):
            call()
    with pytest.raises(ValueError, match="http:// is refused"):
        NodeConfig(url="HTTP://node:8443")
    with pytest.raises(ValueError, match="http:// is refused"):
        PveInspectSandboxEnvironmentConfig.model_validate({"nodes": [{"url": url}]})
    assert not _reached(listener), "a request went out to an http:// URL"
    assert NodeConfig(url="https://node:8443/").url == "https://node:8443"


def test_user_id_is_kept_and_labels_every_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "a"))
    a = user_id()
    assert a == user_id() and len(a) == 32
    assert (tmp_path / "a" / "inspect-pve-inspect" / "user-id").read_text().strip() == a
    req = create_request(PveInspectSandboxEnvironmentConfig(), "task")
    assert req["labels"][LABEL_USER] == a
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "b"))
    assert user_id() != a
    (tmp_path / "b" / "inspect-pve-inspect" / "user-id").write_text("not an id\n")
    with pytest.raises(RuntimeError, match="does not hold a user id"):
        user_id()


class _FakeDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, sandboxes: list[dict[str, Any]]) -> None:
        self.sandboxes = sandboxes
        self.deleted: list[str] = []
        super().__init__(path, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _FakeDaemon

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, code: int, doc: object) -> None:
        b = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self) -> None:
        if self.path == "/v1/sandboxes":
            live = [s for s in self.server.sandboxes if s["id"] not in self.server.deleted]
            self._answer(200, {"sandboxes": live})
        else:
            self._answer(404, {"type": "not-found", "detail": self.path})

    def do_DELETE(self) -> None:
        sid = self.path.removeprefix("/v1/sandboxes/")
        self.server.deleted.append(sid)
        self.send_response(204)
        self.end_headers()


def _sb(sid: str, user: str | None, provider: str = PROVIDER) -> dict[str, Any]:
    labels = {LABEL_PROVIDER: provider, "inspect.task": "t"}
    if user is not None:
        labels[LABEL_USER] = user
    return {"id": sid, "owner": "", "labels": labels}


@pytest.mark.parametrize(
    ("all_env", "id", "want"),
    [
        (None, None, ["mine1", "mine2"]),
        ("1", None, ["mine1", "mine2", "theirs", "old"]),
        (None, "theirs", ["theirs"]),
    ],
)
def test_cli_cleanup_deletes_only_this_users_sandboxes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    all_env: str | None,
    id: str | None,
    want: list[str],
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    me = user_id()
    sock = str(tmp_path / "api.sock")
    srv = _FakeDaemon(
        sock,
        [
            _sb("mine1", me),
            _sb("theirs", "f" * 32),
            _sb("old", None),  # made before the inspect.user label
            _sb("mine2", me),
            _sb("foreign", me, provider="other"),
        ],
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PVE_INSPECT_URL", "unix://" + sock)
        monkeypatch.delenv("PVE_INSPECT_TOKEN", raising=False)
        monkeypatch.delenv("PVE_INSPECT_CA_FILE", raising=False)
        if all_env is None:
            monkeypatch.delenv(ENV_CLEANUP_ALL, raising=False)
        else:
            monkeypatch.setenv(ENV_CLEANUP_ALL, all_env)
        anyio.run(PveInspectSandboxEnvironment.cli_cleanup, id)
    finally:
        srv.shutdown()
        srv.server_close()
    assert sorted(srv.deleted) == sorted(want)
    out = capsys.readouterr().out
    if id is None:
        # Others' sandboxes are listed, whether deleted or left alone.
        assert "theirs (owner -, task t, user " + "f" * 32 in out, out
        assert "old (owner -, task t, user -)" in out, out
        assert (ENV_CLEANUP_ALL + "=1 to delete them too" in out) == (all_env is None), out
