"""A small async client of the pve-inspectd sandbox API (``/v1``).

Errors of the daemon are ``application/problem+json`` documents with a
stable ``type``; :class:`Problem` carries them and :func:`raise_for` maps
the ones Inspect gives a meaning to (missing file, directory, permission,
limits, timeouts) onto Inspect's exceptions.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

import anyio
import httpx

from .config import NodeConfig, check_scheme

# Deadlines of the calls (seconds): a create waits for every guest agent.
CREATE_TIMEOUT = 900.0
CALL_TIMEOUT = 60.0
FILE_TIMEOUT = 900.0
# An image upload for a template build (PUT /v1/templates/build/{name}/image):
# the read chunk and the bound of the whole call.
UPLOAD_CHUNK = 1 << 20
UPLOAD_TIMEOUT = 4 * 3600.0
# How long a call refused by one of the node's quotas before it ran (an
# owner's exec or file slots, its collected output, the node's totals:
# the problem names the quota) is tried again, after the daemon's
# Retry-After, before the refusal reaches the caller (seconds). Many
# samples of one eval share their owner's slots; they wait their turn.
QUOTA_WAIT = 600.0
# The longest single wait between two tries (seconds).
QUOTA_RETRY_MAX = 30.0

log = logging.getLogger(__name__)


class Problem(Exception):
    """An error document of the daemon (RFC 9457)."""

    def __init__(self, status: int, doc: dict[str, Any]) -> None:
        self.status = status
        self.type = str(doc.get("type", "internal"))
        self.detail = str(doc.get("detail", ""))
        self.field = doc.get("field")
        # The health reason of a sandbox-broken problem (vm-stopped,
        # agent-unresponsive, guest-panicked, ...).
        self.reason = str(doc.get("reason", ""))
        self.doc = doc
        super().__init__(f"{self.type} ({status}): {self.detail}")


class NodeDown(Exception):
    """The node did not answer (connection refused, reset, TLS or timeout)."""


class UploadCut(Exception):
    """An image upload ended without an answer after the node took the
    request: the daemon answers what it need not read the body for (a
    template that exists, a build it joins, the file already on the node, a
    refusal) at once and closes, and over TCP the reset of the body still
    being sent drops that answer. The node's build of the template says
    what became of it."""


@dataclass(frozen=True)
class ExecAnswer:
    """The collected result of an exec."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool


def _transport(node: NodeConfig) -> tuple[str, httpx.AsyncHTTPTransport]:
    check_scheme(node.url)  # also for a NodeConfig built without validation
    if node.url.startswith("unix://"):
        return "http://pve-inspectd", httpx.AsyncHTTPTransport(uds=node.url.removeprefix("unix://"))
    verify: ssl.SSLContext | bool = True
    if node.ca_file:
        verify = ssl.create_default_context(cafile=node.ca_file)
    return node.url, httpx.AsyncHTTPTransport(verify=verify)


class Client:
    """The API of one node. Use as ``async with Client(node) as c``."""

    def __init__(self, node: NodeConfig, quota_wait: float = QUOTA_WAIT) -> None:
        self.node = node
        # How long a call refused by a quota before it ran is retried.
        self.quota_wait = quota_wait
        base, transport = _transport(node)
        headers = {"User-Agent": "inspect-pve-inspect"}
        if node.token is not None:
            headers["Authorization"] = "Bearer " + node.token.get_secret_value()
        self._http = httpx.AsyncClient(
            base_url=base + "/v1",
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(CALL_TIMEOUT, connect=10.0),
        )

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(
        self, method: str, path: str, *, timeout: float | None = CALL_TIMEOUT, **kw: Any
    ) -> httpx.Response:
        give_up = time.monotonic() + self.quota_wait
        while True:
            try:
                r = await self._http.request(method, path, timeout=_timeout(timeout), **kw)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as e:
                raise NodeDown(f"{self.node.url}: {e}") from e
            if r.status_code < 400:
                return r
            p = _problem(r)
            await self._wait_quota(p, r, give_up, f"{method} {path}")

    async def _wait_quota(self, p: Problem, r: httpx.Response, give_up: float, what: str) -> None:
        """Return after the daemon's Retry-After when ``p`` is a quota
        refusal of a call that had not started and there is time left;
        raise ``p`` otherwise."""
        if not retriable(p):
            raise p
        after = retry_after(r.headers.get("Retry-After"))
        if time.monotonic() + after > give_up:
            raise p
        log.info("%s: %s; trying again in %.0f s", what, p.detail, after)
        await anyio.sleep(after)

    async def egress_log(
        self, sid: str, *, since: int = 0, limit: int = 1000, type: str | None = None
    ) -> dict[str, Any]:
        """One page of ``GET /v1/sandboxes/{id}/egress/log``: the records
        after ``since`` (``records``, ``next``, ``more``, ``dropped``)."""
        params = {"since": str(since), "limit": str(limit)}
        if type is not None:
            params["type"] = type
        r = await self._send("GET", f"/sandboxes/{quote(sid, safe='')}/egress/log", params=params)
        return cast(dict[str, Any], r.json())

    async def build_template(self, req: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/templates/build``: the build of ``req`` started or
        joined (queued, running), or the template that exists (done)."""
        r = await self._send("POST", "/templates/build", json=req)
        return cast(dict[str, Any], r.json())

    async def upload_template(
        self,
        name: str,
        path: str,
        size: int,
        sha256: str,
        ova_disk: str | None,
        build_mode: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``PUT /v1/templates/build/{name}/image``: the template ``name``
        built from the image file at ``path`` (``size`` bytes, streamed as
        read, never held whole), which the node verifies against
        ``sha256``; answers as :meth:`build_template` (an existing template:
        done, without the body). Sent again only when refused before its
        body was read by a full quota (the node's uploads in flight: 429
        with Retry-After), up to ``quota_wait`` seconds. ``build_mode`` is
        the build's mode (``import_only``, ``disk_bus``, ``os_type``: an
        import without boot), part of the build's identity on the node."""
        params = {"file": os.path.basename(path), "sha256": sha256, **(build_mode or {})}
        if ova_disk is not None:
            params["ova_disk"] = ova_disk

        async def chunks() -> AsyncIterator[bytes]:
            async with await anyio.open_file(path, "rb") as f:
                while chunk := await f.read(UPLOAD_CHUNK):
                    yield chunk

        path_ = f"/templates/build/{quote(name, safe='')}/image"
        give_up = time.monotonic() + self.quota_wait
        while True:
            try:
                r = await self._http.request(
                    "PUT",
                    path_,
                    params=params,
                    content=chunks(),
                    headers={
                        "Content-Type": "application/octet-stream",
                        "Content-Length": str(size),
                    },
                    timeout=_timeout(UPLOAD_TIMEOUT),
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                raise NodeDown(f"{self.node.url}: {e}") from e
            except httpx.TransportError as e:
                raise UploadCut(f"{self.node.url}: {type(e).__name__}: {e}") from e
            if r.status_code < 400:
                return cast(dict[str, Any], r.json())
            # the node's uploads in flight are full (429, quota
            # image-uploads): refused before the body was read, sent again
            await self._wait_quota(_problem(r), r, give_up, f"PUT {path_}")

    async def template_build(self, name: str) -> dict[str, Any]:
        """``GET /v1/templates/builds/{name}``: the node's running or last
        build of the template, else the template of the name its builds
        made (done); a done one's ``image`` is the ``sha256:HEX`` it was
        built from, when the node's build ledger says."""
        r = await self._send("GET", f"/templates/builds/{quote(name, safe='')}")
        return cast(dict[str, Any], r.json())

    async def template(self, name: str) -> dict[str, Any] | None:
        """``GET /v1/templates/{name}``: the VM template a create naming it
        clones on the node (``vmid``), whether the node's template builds
        made it (``built``) and the ``sha256:HEX`` of the image its build
        ledger records (``image``), for any token of the node; None when
        the node answers 404 (no such template, or a daemon from before
        the route)."""
        try:
            r = await self._send("GET", f"/templates/{quote(name, safe='')}")
        except Problem as p:
            if p.status in (404, 405):
                return None
            raise
        return cast(dict[str, Any], r.json())

    async def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], (await self._send("GET", "/healthz")).json())

    async def capacity(self) -> dict[str, Any] | None:
        """``GET /v1/capacity``; None when the daemon does not serve it."""
        try:
            r = await self._send("GET", "/capacity")
        except Problem as p:
            if p.status in (404, 405):
                return None
            raise
        return cast(dict[str, Any], r.json())

    async def validate(self, req: dict[str, Any]) -> dict[str, Any] | None:
        """``POST /v1/sandboxes/validate``: what a create of ``req`` would be
        refused for on this node, and its templates (a ValidateReport); None
        when the daemon does not serve it."""
        try:
            r = await self._send("POST", "/sandboxes/validate", json=req)
        except Problem as p:
            if p.status in (404, 405):
                return None
            raise
        return cast(dict[str, Any], r.json())

    async def extend(
        self, sid: str, ttl_seconds: int, timeout: float = CALL_TIMEOUT
    ) -> dict[str, Any]:
        """Set the sandbox's expiry to now plus ``ttl_seconds``."""
        r = await self._send(
            "POST",
            f"/sandboxes/{quote(sid, safe='')}/extend",
            json={"ttl_seconds": ttl_seconds},
            timeout=timeout,
        )
        return cast(dict[str, Any], r.json())

    async def create(self, req: dict[str, Any]) -> dict[str, Any]:
        r = await self._send("POST", "/sandboxes", json=req, timeout=CREATE_TIMEOUT)
        return cast(dict[str, Any], r.json())

    async def list(self) -> list[dict[str, Any]]:
        r = await self._send("GET", "/sandboxes")
        return cast(list[dict[str, Any]], r.json()["sandboxes"])

    async def get(self, sid: str) -> dict[str, Any]:
        r = await self._send("GET", f"/sandboxes/{quote(sid, safe='')}")
        return cast(dict[str, Any], r.json())

    async def delete(self, sid: str) -> None:
        await self._send("DELETE", f"/sandboxes/{quote(sid, safe='')}", timeout=CREATE_TIMEOUT)

    async def delete_keeping_egress(self, sid: str) -> dict[str, Any] | None:
        """``DELETE /v1/sandboxes/{id}?egress_log=true``: delete the sandbox
        and return its whole egress record as it stood once its VMs were
        gone (``records``, oldest first, ``dropped``, ``next``); None when
        the daemon answered 204 (one that predates ``egress_log``: the
        sandbox is deleted, its record is not in the answer). A refusal
        (a ``Problem``: ``conflict`` for a sandbox still being created; a
        node that keeps no record; ``not-found`` for a sandbox already gone)
        deleted nothing."""
        r = await self._send(
            "DELETE",
            f"/sandboxes/{quote(sid, safe='')}",
            params={"egress_log": "true"},
            timeout=CREATE_TIMEOUT,
        )
        if r.status_code == 204:
            return None
        return cast(dict[str, Any], r.json())

    def _vm(self, sid: str, vm: str) -> str:
        return f"/sandboxes/{quote(sid, safe='')}/vms/{quote(vm, safe='')}"

    async def exec(self, sid: str, vm: str, req: dict[str, Any]) -> ExecAnswer:
        t = req.get("timeout_seconds")
        # The daemon kills the command at its timeout; its answer follows.
        deadline = None if not t else float(t) + 60.0
        r = await self._send("POST", self._vm(sid, vm) + "/exec", json=req, timeout=deadline)
        d = r.json()
        return ExecAnswer(
            exit_code=int(d["exit_code"]),
            stdout=base64.b64decode(d.get("stdout") or ""),
            stderr=base64.b64decode(d.get("stderr") or ""),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            timed_out=bool(d.get("timed_out")),
        )

    async def write_file(
        self, sid: str, vm: str, path: str, data: bytes, mode: int = 0o644
    ) -> None:
        # A length-known body: past the daemon's disk_transfer_threshold it
        # goes through a hot-plugged disk instead of the guest agent.
        await self._send(
            "PUT",
            self._vm(sid, vm) + "/files",
            params={"path": path, "mode": format(mode, "o")},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
            timeout=FILE_TIMEOUT,
        )

    async def read_file(self, sid: str, vm: str, path: str, limit: int) -> AsyncIterator[bytes]:
        """Stream a guest file. Raises :class:`TooLarge` before the first
        chunk when the daemon says it holds more than ``limit`` bytes."""
        req = self._http.build_request(
            "GET",
            self._vm(sid, vm) + "/files",
            params={"path": path},
            timeout=_timeout(FILE_TIMEOUT),
        )
        give_up = time.monotonic() + self.quota_wait
        while True:
            try:
                r = await self._http.send(req, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as e:
                raise NodeDown(f"{self.node.url}: {e}") from e
            if r.status_code < 400:
                break
            try:
                await r.aread()
            finally:
                await r.aclose()
            await self._wait_quota(_problem(r), r, give_up, f"read {path}")
        try:
            size = r.headers.get("Content-Length")
            if size is not None and int(size) > limit:
                raise TooLarge(int(size))
            n = 0
            async for chunk in r.aiter_bytes():
                n += len(chunk)
                if n > limit:
                    raise TooLarge(n)
                yield chunk
        finally:
            await r.aclose()

    async def snapshot(self, sid: str, vm: str, name: str) -> None:
        await self._send(
            "POST", self._vm(sid, vm) + "/snapshots", json={"name": name}, timeout=CREATE_TIMEOUT
        )

    async def rollback(self, sid: str, vm: str, name: str) -> None:
        await self._send(
            "POST",
            self._vm(sid, vm) + f"/snapshots/{quote(name, safe='')}/rollback",
            timeout=CREATE_TIMEOUT,
        )


def capacity_sync(node: NodeConfig, timeout: float) -> dict[str, Any] | None:
    """``GET /v1/capacity`` without an event loop (Inspect's
    ``default_concurrency`` hook is synchronous); None when the node does
    not answer or does not serve it."""
    headers = {"User-Agent": "inspect-pve-inspect"}
    if node.token is not None:
        headers["Authorization"] = "Bearer " + node.token.get_secret_value()
    check_scheme(node.url)
    base, transport = node.url, None
    verify: ssl.SSLContext | bool = True
    if node.url.startswith("unix://"):
        base = "http://pve-inspectd"
        transport = httpx.HTTPTransport(uds=node.url.removeprefix("unix://"))
    elif node.ca_file:
        try:
            verify = ssl.create_default_context(cafile=node.ca_file)
        except OSError:
            return None
    try:
        with httpx.Client(
            base_url=base + "/v1",
            headers=headers,
            timeout=timeout,
            verify=verify,
            transport=transport,
        ) as c:
            r = c.get("/capacity")
    except (httpx.HTTPError, OSError):
        return None
    if r.status_code != 200:
        return None
    doc = r.json()
    return cast(dict[str, Any], doc) if isinstance(doc, dict) else None


class TooLarge(Exception):
    """A read passed the caller's limit; ``size`` is what was known."""

    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(f"{size} bytes")


def retriable(p: Problem) -> bool:
    """Whether ``p`` refused a call before any of it ran, so that trying it
    again cannot run anything twice: a 429 or 503 naming the quota that
    refused it (``quota``; a refusal during a call names none)."""
    return p.status in (429, 503) and bool(p.doc.get("quota"))


def retry_after(h: str | None) -> float:
    """The seconds of a Retry-After header (delay-seconds form), within
    1 and QUOTA_RETRY_MAX; 1 when absent or not a number."""
    try:
        v = float(h) if h is not None else 1.0
    except ValueError:
        v = 1.0
    return min(max(v, 1.0), QUOTA_RETRY_MAX)


def _timeout(t: float | None) -> httpx.Timeout:
    return httpx.Timeout(t, connect=10.0)


def _problem(r: httpx.Response) -> Problem:
    try:
        doc = r.json()
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except ValueError:
        doc = {"type": "internal", "detail": r.text[:500]}
    return Problem(r.status_code, doc)
