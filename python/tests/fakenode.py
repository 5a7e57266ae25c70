"""A fake pve-inspectd on a unix socket, for the provider's rules without a
bed: the calls the provider makes (healthz, capacity, validate, create,
extend, delete, exec, files), the sandbox API's answers and problem
documents as sandboxapi writes them, a clock the test moves and a reaper
the test runs. Not the daemon: only what the tests here need of it."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from inspect_pve_inspect import NodeConfig

_SB = re.compile(r"^/v1/sandboxes/([a-z0-9]+)(/.*)?$")
_VM = re.compile(r"^/vms/([^/]+)/")
# A drive-absolute Windows path, as the daemon's Windows guest client
# takes it (qga.IsWinPath).
_WIN_PATH = re.compile(r"^[A-Za-z]:[\\/]")


@dataclass
class Sandbox:
    """A sandbox of the fake."""

    id: str
    req: dict[str, Any]
    expires_at: datetime
    extends: int = 0


@dataclass
class FakeNode:
    """The fake's state; every field is read and written under ``lock``."""

    templates: tuple[str, ...] = ("debian",)
    token: str | None = None
    default_ttl: int = 3600
    max_ttl: int = 86400
    # The fake's clock: the time the test has moved it to.
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    sandboxes: dict[str, Sandbox] = field(default_factory=dict)
    # Why each deleted sandbox went ("expired at ...", "deleted by ...").
    gone: dict[str, tuple[str, str]] = field(default_factory=dict)
    # An answer every exec gets instead of running (status, problem), once.
    exec_answer: tuple[int, dict[str, Any]] | None = None
    # Each sandbox's egress record (GET .../egress/log, and what a delete
    # with egress_log=true hands over) and its dropped count; made_at_delete
    # is added to it by the delete itself (what its VMs did until they were
    # gone). handover: the fake hands a record over at a delete; False is a
    # node that keeps none to hand over (503 unavailable, nothing deleted).
    egress: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    egress_dropped: int = 0
    made_at_delete: list[dict[str, Any]] = field(default_factory=list)
    handover: bool = True
    # Template builds (POST /v1/templates/build): builds is whether the
    # node offers them; a build runs build_polls looks at it (GETs) and
    # then ends done (the template joins templates) or, with build_error,
    # failed; each look adds a progress line. build_runs are the builds by
    # name.
    builds: bool = False
    # build_refused: a POST /v1/templates/build is refused with this detail
    # (400 invalid-request, field recipe), as the daemon refuses a request
    # it cannot build.
    build_refused: str | None = None
    build_polls: int = 2
    build_error: str | None = None
    build_runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each image upload (PUT /v1/templates/build/{name}/image): its name,
    # query (file, sha256, ova_disk; import_only, disk_bus, os_type) and
    # size.
    uploads: list[dict[str, Any]] = field(default_factory=list)
    # upload_answer_lost: the answer to an upload never reaches the client,
    # as over TCP when the daemon answers without reading the body (done,
    # joined, the file already on the node, a refusal) and closes: the
    # client, still sending, gets a reset that drops the answer.
    upload_answer_lost: bool = False
    # upload_busy: how many uploads to come are refused as the daemon
    # refuses one past its uploads in flight (429, quota image-uploads,
    # Retry-After 1) before one is taken.
    upload_busy: int = 0
    # The image each template the node's builds made was built from
    # (sha256:HEX; "" for one whose ledger records none), as the node's
    # build ledger records it: set by an upload's build; GET
    # /v1/templates/{name} answers it (built, image) for every token, and
    # GET /v1/templates/builds/{name} of a template without a build run
    # (done, reused; no image when it has none).
    template_images: dict[str, str] = field(default_factory=dict)
    # owner_bound: the caller's token is bound to an owner, so the build
    # routes (node operations) answer it 403 whatever its scope.
    owner_bound: bool = False
    # template_route: the daemon serves GET /v1/templates/{name} (False:
    # one from before it, whose router answers it 404).
    template_route: bool = True
    # How each template was built, as the ledger records it and GET
    # answers it: import_only, disk_bus, os_type of one imported without
    # boot (an upload's build with import_only=true sets it); absent (or
    # empty) for a booted build.
    template_modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A few of the daemon's refusals of a create (validate and create):
    # sandbox_caps, the per-sandbox caps of the resource guard by
    # resource (vcpus, memory_mib; guard-refused); shared_vnets, the vnets
    # the node shares by id (a NIC's vnet it does not share is refused
    # naming the NIC's vnet field); host_networks, the host's networks (a
    # fixed cidr overlapping one is refused naming the network's cidr);
    # allow_uefi, whether the node takes firmware uefi.
    sandbox_caps: dict[str, int] = field(default_factory=dict)
    shared_vnets: tuple[str, ...] = ()
    host_networks: tuple[str, ...] = ()
    allow_uefi: bool = True
    calls: list[str] = field(default_factory=list)
    # Each exec's VM and body, and each file call's method, VM and path,
    # in the order they came.
    execs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    files: list[tuple[str, str, str]] = field(default_factory=list)
    # The exec and file calls refused for a VM created with agent false
    # (method, VM).
    no_agent_calls: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _next: int = 0

    def new_id(self) -> str:
        self._next += 1
        return f"sbfake{self._next:02d}"

    def advance(self, seconds: float) -> None:
        """Move the clock."""
        with self.lock:
            self.now += timedelta(seconds=seconds)

    def reap(self) -> list[str]:
        """Delete every sandbox past its expiry, as the daemon's reaper."""
        with self.lock:
            due = [s for s in self.sandboxes.values() if self.now >= s.expires_at]
            for s in due:
                del self.sandboxes[s.id]
                self.gone[s.id] = ("expired", f"it expired at {_rfc3339(s.expires_at)}")
            return [s.id for s in due]

    def extends(self, sid: str) -> int:
        """How many extends sandbox sid got."""
        with self.lock:
            sb = self.sandboxes.get(sid)
            return sb.extends if sb is not None else -1


def _rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _problem(status: int, typ: str, detail: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    return status, {"type": typ, "title": typ, "status": status, "detail": detail, **extra}


def _view(sb: Sandbox) -> dict[str, Any]:
    vms = [
        {
            "name": v.get("name") or f"vm{i}",
            "vmid": 100 + i,
            "template": v["template"],
            # a VM of no_network has no NIC, so no address
            "addresses": [
                {"network": n, "ipv4": f"10.0.{j}.{11 + i}"}
                for j, n in enumerate([] if v.get("no_network") else v.get("networks") or ["net0"])
            ],
            # the daemon answers agent false for a VM without one, else omits it
            **({"agent": False} if v.get("agent") is False else {}),
            **({"no_network": True, "networks": []} if v.get("no_network") else {}),
        }
        for i, v in enumerate(sb.req.get("vms", []))
    ]
    return {
        "id": sb.id,
        "state": "ready",
        "labels": sb.req.get("labels", {}),
        "expires_at": _rfc3339(sb.expires_at),
        "vms": vms,
        "networks": sb.req.get("networks", []),
    }


def _refusals(fake: FakeNode, req: dict[str, Any]) -> list[dict[str, Any]]:
    """What the fake's validate and create refuse (a few of the daemon's
    rules, in sandbox.Engine.Validate's order and words: unknown templates,
    firmware uefi, the per-sandbox caps, shared vnets, the host's
    networks; the TTL bound)."""
    out = []
    vms = req.get("vms", [])
    for i, v in enumerate(vms):
        if v.get("template") not in fake.templates:
            detail = f'unknown template "{v.get("template")}"'
            out.append(_problem(400, "invalid-request", detail, field=f"vms[{i}].template")[1])
    for i, v in enumerate(vms):
        if v.get("firmware") == "uefi" and not fake.allow_uefi:
            detail = 'firmware "uefi" is not allowed on this node: ... [api] allow_uefi = true'
            out.append(_problem(400, "invalid-request", detail, field=f"vms[{i}].firmware")[1])
            break
    want = {
        "vcpus": sum(int(v.get("cores") or 1) for v in vms),
        "memory_mib": sum(int(v.get("memory_mib") or 1024) for v in vms),
    }
    for k, limit in fake.sandbox_caps.items():
        if want[k] > limit:
            detail = f"cap sandbox_{k}: the create would need {want[k]}, the cap is {limit}"
            out.append(_problem(429, "guard-refused", detail, cap=f"sandbox_{k}")[1])
            break
    shares = ", ".join(fake.shared_vnets) or "none"
    for i, v in enumerate(vms):
        for j, n in enumerate(v.get("nics") or ()):
            if n.get("vnet") is not None and n["vnet"] not in fake.shared_vnets:
                detail = (
                    f'vnet "{n["vnet"]}": not a vnet this node shares (the operator lists them '
                    f"in [api] shared_vnets); this node shares {shares}"
                )
                f = f"vms[{i}].nics[{j}].vnet"
                out.append(_problem(400, "invalid-request", detail, field=f)[1])
    for i, n in enumerate(req.get("networks", [])):
        cidr = n.get("cidr", "auto")
        for h in fake.host_networks:
            if cidr != "auto" and ipaddress.ip_network(cidr).overlaps(ipaddress.ip_network(h)):
                detail = (
                    f'network "{n["name"]}": cidr {cidr} overlaps a network of the node\'s host '
                    "(its addresses and routes; which one is in the node's log): "
                    'pick another cidr, or "auto"'
                )
                out.append(_problem(400, "invalid-request", detail, field=f"networks[{i}].cidr")[1])
    ttl = int(req.get("ttl_seconds") or fake.default_ttl)
    if not 1 <= ttl <= fake.max_ttl:
        out.append(
            _problem(
                400,
                "invalid-request",
                f"ttl_seconds {ttl}: want 1..{fake.max_ttl}",
                field="ttl_seconds",
            )[1]
        )
    return out


def _held(fake: FakeNode, req: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The cidr-in-use refusal of a create whose fixed CIDR another sandbox holds."""
    for i, n in enumerate(req.get("networks", [])):
        cidr = n.get("cidr", "auto")
        if cidr == "auto":
            continue
        for sb in fake.sandboxes.values():
            if any(m.get("cidr") == cidr for m in sb.req.get("networks", [])):
                detail = f'network "{n["name"]}": cidr {cidr} overlaps a range in use'
                return _problem(
                    409, "conflict", detail, reason="cidr-in-use", field=f"networks[{i}].cidr"
                )
    return None


def handle(fake: FakeNode, method: str, path: str, body: bytes, query: str = "") -> tuple[int, Any]:
    """The fake's answer to one call."""
    fake.calls.append(f"{method} {path}" + (f"?{query}" if query else ""))
    doc: dict[str, Any] = json.loads(body) if body and method != "PUT" else {}
    if (method, path) == ("GET", "/v1/healthz"):
        return 200, {
            "status": "ok",
            "node": "fake",
            "sandboxes": len(fake.sandboxes),
            "default_ttl_seconds": fake.default_ttl,
            "max_ttl_seconds": fake.max_ttl,
            **({"template_builds": True} if fake.builds else {}),
        }
    info = method == "GET" and _TEMPLATE.match(path) is not None
    if path.startswith("/v1/templates/") and fake.owner_bound and not info:
        why = "a node operation: refused to owner-bound tokens (a template is every owner's)"
        return _problem(403, "forbidden", why)
    if info:
        return _template_info(fake, unquote(path.rsplit("/", 1)[1]))
    if method == "PUT" and path.startswith("/v1/templates/build/") and path.endswith("/image"):
        return _template_upload(fake, path, body, query)
    if path == "/v1/templates/build" or path.startswith("/v1/templates/builds/"):
        return _template_build(fake, method, path, doc)
    if (method, path) == ("GET", "/v1/capacity"):
        unlimited = {"sandboxes": -1, "vms": -1, "vcpus": -1, "memory_mib": -1}
        return 200, {"node": "fake", "free": unlimited, "sandbox": {}, "free_sandboxes": -1}
    if (method, path) == ("POST", "/v1/sandboxes/validate"):
        probs = _refusals(fake, doc)
        own = [p for p in probs if p.get("field") == "ttl_seconds"]  # the request's own rules
        if own:
            return 400, own[0]
        return 200, {"valid": not probs, "problems": probs, "templates": list(fake.templates)}
    if (method, path) == ("POST", "/v1/sandboxes"):
        probs = _refusals(fake, doc)
        if probs:
            return int(probs[0]["status"]), probs[0]
        held = _held(fake, doc)
        if held is not None:
            return held
        ttl = int(doc.get("ttl_seconds") or fake.default_ttl)
        new = Sandbox(fake.new_id(), doc, fake.now + timedelta(seconds=ttl))
        fake.sandboxes[new.id] = new
        return 201, _view(new)
    m = _SB.match(path)
    if m is None:
        return _problem(404, "not-found", f"no route {method} {path}")
    sid, rest = m[1], m[2] or ""
    sb = fake.sandboxes.get(sid)
    if method == "DELETE" and rest == "" and "egress_log=true" in query:
        return _delete_keeping_egress(fake, sid)
    if method == "DELETE" and rest == "":
        fake.egress.pop(sid, None)
        if fake.sandboxes.pop(sid, None) is not None:
            fake.gone[sid] = ("deleted", 'it was deleted by token "fake"')
        return 204, None
    if sb is None:
        return _problem(404, "not-found", f'sandbox "{sid}" not found')
    if method == "POST" and rest == "/extend":
        sb.expires_at = fake.now + timedelta(seconds=int(doc["ttl_seconds"]))
        sb.extends += 1
        return 200, _view(sb)
    vm = _VM.match(rest)
    vm_name = unquote(vm[1]) if vm else ""
    windows = _os_type(sb, vm_name) in ("win10", "win11")
    if (rest.endswith("/exec") or rest.endswith("/files")) and _no_agent(sb, vm_name):
        # the daemon's refusal of guest I/O on a VM created with agent false
        fake.no_agent_calls.append((method, vm_name))
        detail = (
            f"vm {vm_name} has no guest agent (created with agent false): exec and file calls "
            "go through the guest agent, so it is not offered for it"
        )
        return _problem(409, "conflict", detail)
    if method == "POST" and rest.endswith("/exec"):
        fake.execs.append((vm_name, doc))
        if windows:
            refused = _windows_exec_refusal(doc)
            if refused is not None:
                return refused
        if fake.exec_answer is not None:
            ans, fake.exec_answer = fake.exec_answer, None
            return ans
        out = base64.b64encode(" ".join(doc.get("argv", [])).encode()).decode()
        return 200, {"exit_code": 0, "stdout": out, "stderr": ""}
    if method == "GET" and rest == "/egress/log":
        recs = fake.egress.get(sid, [])
        return 200, _egress_log(sid, recs, fake.egress_dropped)
    if rest.endswith("/files"):
        path = parse_qs(query).get("path", [""])[0]
        fake.files.append((method, vm_name, path))
        if windows and not _WIN_PATH.match(path):
            return _problem(
                400, "invalid-request", f"guest path {path!r} is not a drive-absolute Windows path"
            )
        return (204, None) if method == "PUT" else (200, b"data")
    return _problem(404, "not-found", f"no route {method} {path}")


def _no_agent(sb: Sandbox, vm: str) -> bool:
    """Whether the sandbox's create asked VM vm without a guest agent."""
    for i, v in enumerate(sb.req.get("vms", [])):
        if (v.get("name") or f"vm{i}") == vm:
            return v.get("agent") is False
    return False


def _os_type(sb: Sandbox, vm: str) -> str | None:
    """The os_type the sandbox's create asked for VM vm."""
    for i, v in enumerate(sb.req.get("vms", [])):
        if (v.get("name") or f"vm{i}") == vm:
            return str(v["os_type"]) if v.get("os_type") else None
    return None


def _windows_exec_refusal(doc: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The daemon's 400 for an exec a Windows guest does not take (a few
    of qga's winValidate rules: user, a cwd that is not drive-absolute)."""
    if doc.get("user"):
        detail = (
            f"user {doc['user']!r}: a Windows guest runs every command as its agent's "
            "service account; user is not supported there"
        )
        return _problem(400, "invalid-request", detail, field="user")
    cwd = doc.get("cwd")
    if cwd and not _WIN_PATH.match(cwd):
        detail = f"cwd: guest path {cwd!r} is not a drive-absolute Windows path"
        return _problem(400, "invalid-request", detail, field="cwd")
    return None


# GET /v1/templates/{name} (not the build routes beside it).
_TEMPLATE = re.compile(r"^/v1/templates/(?!builds?$)[^/]+$")


def _template_info(fake: FakeNode, name: str) -> tuple[int, Any]:
    """GET /v1/templates/{name} as sandboxapi answers it: the template's
    VMID, whether the node's builds made it (its ledger records it) and
    the image the ledger records; every token may ask."""
    if not fake.template_route:
        return _problem(404, "not-found", f"no route GET /v1/templates/{name}")
    if name not in fake.templates:
        return _problem(404, "not-found", f"no VM template {name!r} on this node")
    image = fake.template_images.get(name)
    doc = {"name": name, "vmid": 9100, "built": image is not None}
    mode = (fake.template_modes.get(name) or {}) if image is not None else {}
    return 200, {**doc, **({"image": image} if image else {}), **mode}


def _template_upload(fake: FakeNode, path: str, body: bytes, query: str) -> tuple[int, Any]:
    """PUT /v1/templates/build/{name}/image as sandboxapi answers it: an
    existing template answers done (the body unread); a body whose sha256
    is not the one given is refused naming sha256; else the build runs
    (as a recipe's, see _template_build) and the upload is recorded."""
    if not fake.builds:
        return _problem(403, "forbidden", "template builds are off on this node")
    if fake.upload_busy > 0:
        fake.upload_busy -= 1
        why = "the node takes 2 image uploads at once and has as many in flight"
        return _problem(429, "too-many-requests", why, quota="image-uploads")
    name = unquote(path.split("/")[4])
    q = {k: v[0] for k, v in parse_qs(query).items()}
    mode, bad = _upload_mode(q)
    if bad is not None:
        return bad
    if name in fake.templates:
        was = fake.template_modes.get(name) or {}
        if fake.template_images.get(name) != "sha256:" + q.get("sha256", "") or was != mode:
            why = f"template {name!r} exists, built from another image or the other way"
            return _problem(409, "conflict", why)
        st = {"name": name, "state": "done", "vmid": 9100, "reused": True, "progress": []}
        return 200, {**st, **mode}
    if hashlib.sha256(body).hexdigest() != q.get("sha256"):
        why = "the image is not the one of its sha256"
        return _problem(400, "invalid-request", why, field="sha256")
    fake.uploads.append({"name": name, **q, "size": len(body)})
    b = {"name": name, "from": "upload:" + q.get("file", ""), "state": "running", "looks": 0}
    b.update(mode)
    b["progress"] = [f"upload: {len(body)} bytes"]
    b["built_from"] = "sha256:" + str(q.get("sha256"))
    fake.build_runs[name] = b
    return 202, {k: v for k, v in b.items() if k not in ("looks", "built_from")}


def _upload_mode(q: dict[str, str]) -> tuple[dict[str, Any], tuple[int, Any] | None]:
    """An upload's build mode as templatebuild normalizes it (import_only
    with its disk_bus and os_type, defaults filled), or the 400 naming the
    field it refuses."""
    imp = q.get("import_only", "")
    if imp not in ("", "true", "false"):
        return {}, _problem(400, "invalid-request", f"import_only: {imp!r}", field="import_only")
    if imp != "true":
        for k in ("disk_bus", "os_type"):
            if k in q:
                return {}, _problem(400, "invalid-request", f"{k}: goes with import_only", field=k)
        if q.get("file", "").endswith(".ova") != ("ova_disk" in q):
            return {}, _problem(400, "invalid-request", "ova_disk", field="ova_disk")
        return {}, None
    if "ova_disk" in q:
        return {}, _problem(400, "invalid-request", "ova_disk with import_only", field="ova_disk")
    mode = {
        "import_only": True,
        "disk_bus": q.get("disk_bus", "scsi"),
        "os_type": q.get("os_type", "l26"),
    }
    if mode["disk_bus"] not in ("scsi", "ide", "sata"):
        return {}, _problem(400, "invalid-request", "disk_bus", field="disk_bus")
    if mode["os_type"] not in ("l26", "win10", "win11"):
        return {}, _problem(400, "invalid-request", "os_type", field="os_type")
    return mode, None


def _template_build(fake: FakeNode, method: str, path: str, doc: dict[str, Any]) -> tuple[int, Any]:
    """The template build routes as sandboxapi answers them."""
    if not fake.builds:
        return _problem(403, "forbidden", "template builds are off on this node")
    if method == "GET":
        name = path.rsplit("/", 1)[1]
        b = fake.build_runs.get(name)
        if b is None and name in fake.templates:
            image = fake.template_images.get(name)
            st = {"name": name, "state": "done", "vmid": 9100, "reused": True, "progress": []}
            st.update(fake.template_modes.get(name) or {})
            return 200, {**st, **({"image": image} if image else {})}
        if b is None:
            return _problem(404, "not-found", f"no build of template {name!r}")
        b["looks"] += 1
        b["progress"].append(f"step {b['looks']}")
        if b["state"] == "running" and b["looks"] >= fake.build_polls:
            if fake.build_error is not None:
                b.update(state="failed", error=fake.build_error)
            else:
                b.update(state="done", vmid=9100)
                fake.templates = (*fake.templates, name)
                if "built_from" in b:
                    fake.template_images[name] = b["image"] = b["built_from"]
                    mode: dict[str, Any] = {
                        k: b[k] for k in ("import_only", "disk_bus", "os_type") if k in b
                    }
                    fake.template_modes[name] = mode
        return 200, {k: v for k, v in b.items() if k not in ("looks", "built_from")}
    name = str(doc.get("name"))
    if doc.get("recipe") not in ("debian13", "ubuntu24.04", "kali2025.4"):
        return _problem(400, "invalid-request", f"recipe {doc.get('recipe')!r}", field="recipe")
    if fake.build_refused is not None:
        return _problem(400, "invalid-request", fake.build_refused, field="recipe")
    if name in fake.templates:
        return 200, {"name": name, "state": "done", "vmid": 9100, "reused": True, "progress": []}
    b = fake.build_runs.get(name)
    if b is not None and b["state"] == "running":
        return 202, {**{k: v for k, v in b.items() if k != "looks"}, "joined": True}
    b = {"name": name, "recipe": doc["recipe"], "state": "running", "looks": 0}
    b["progress"] = ["image: downloading"]
    fake.build_runs[name] = b
    return 202, {k: v for k, v in b.items() if k != "looks"}


def _egress_log(sid: str, recs: list[dict[str, Any]], dropped: int) -> dict[str, Any]:
    nxt = int(recs[-1]["seq"]) if recs else 0
    return {"sandbox": sid, "records": recs, "dropped": dropped, "next": nxt, "more": False}


def _delete_keeping_egress(fake: FakeNode, sid: str) -> tuple[int, Any]:
    """DELETE /v1/sandboxes/{id}?egress_log=true as sandboxapi answers it."""
    if sid not in fake.sandboxes:
        return _problem(404, "not-found", f'sandbox "{sid}" not found: no egress record')
    if not fake.handover:
        return _problem(503, "unavailable", "this node keeps no egress record")
    del fake.sandboxes[sid]
    fake.gone[sid] = ("deleted", 'it was deleted by token "fake"')
    recs = fake.egress.pop(sid, []) + fake.made_at_delete
    return 200, _egress_log(sid, recs, fake.egress_dropped)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, fake: FakeNode) -> None:
        self.fake = fake
        super().__init__(path, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        fake = self.server.fake
        if fake.token is not None and self.headers.get("Authorization") != f"Bearer {fake.token}":
            code, doc = _problem(401, "unauthorized", "missing or unknown bearer token")
        else:
            with fake.lock:
                url = urlsplit(self.path)
                code, doc = handle(fake, self.command, url.path, body, url.query)
            if fake.upload_answer_lost and self.command == "PUT" and url.path.endswith("/image"):
                self.close_connection = True
                return
        self.send_response(code)
        if isinstance(doc, bytes):
            b, ctype = doc, "application/octet-stream"
        else:
            b = b"" if doc is None else json.dumps(doc).encode()
            ctype = "application/json" if code < 400 else "application/problem+json"
        if code == 429:
            self.send_header("Retry-After", "1")
        if b:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    do_GET = do_POST = do_PUT = do_DELETE = _serve


@contextmanager
def serve(path: str, fake: FakeNode) -> Iterator[NodeConfig]:
    """Serve fake on the unix socket path; yields its NodeConfig."""
    srv = _Server(path, fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield NodeConfig(url="unix://" + path)
    finally:
        srv.shutdown()
        srv.server_close()
