"""Checking a config against the nodes before the first sample.

``task_init`` (once per distinct sandbox config of the eval) asks every
node of the config whether a sample's sandbox could be created there:
``GET /v1/healthz`` (the node answers, the token is good), then ``POST
/v1/sandboxes/validate`` with the sample's create request (templates,
caps, egress entries, networks: every refusal a create would meet whatever
else runs). Anything wrong fails the task at once, in one message that
names each problem by the config's own names (its VMs, its networks'
aliases) and lists the templates each node has. A node that does not
answer is skipped (placement skips it too), unless none answers.

The daemon names a problem's field by the create request
(``vms[1].template``, ``networks[0].cidr``), which is a native config's
own shape. A config converted from the reference plugin's shape carries
the reference path of each of its fields (:mod:`.refpaths`), and the
message names that instead (``vms_config[1].vm_source_config.built_in``,
``sdn_config.vnet_configs[0].subnets[0].cidr``), the daemon's words of
why kept; so does a create the node refuses later (:func:`named_refusal`).

A VM of a built-in (``VmSpec.built_in``, the reference's
``VmSourceConfig(built_in=...)``) whose template a node lacks is built
there first when the node offers builds (``template_builds`` in its
healthz): ``POST /v1/templates/build`` (the daemon joins a build of the
name that runs, so each template is built once), its progress logged while
it runs, bounded by ``template_build_seconds``; then the node is asked
again. A node without builds fails the task with the command that builds
the template on it.

A VM of an OVA (``VmSpec.ova``, the reference's ``VmSourceConfig(ova=...)``)
whose template (``ova-FILE-SIZE``) a node lacks is built the same way from
the file itself: its sha256 is computed, the file streamed to the node
(``PUT /v1/templates/build/{name}/image``, which the node verifies against
the digest), and the build followed as a built-in's. By default the node
imports the OVA as the reference does, without booting it
(``import_only``: every disk of it, on ``disk_bus``, with ``os_type``). A
node without builds fails the task with the commands that put the file on
the node and build it.

An OVA's template name says nothing of its content (two files of one name
and size map to one name), so a node's template of the name is used only
when the node says it was built from this file: the file's sha256 is
computed at task start (once per file, size, mtime and inode in the
process) and compared with the image ``GET /v1/templates/{name}`` reports
(``image``, from the node's build ledger), and built the way the config
asks (booted, or imported without boot on its disk bus and ostype:
``import_only``, ``disk_bus``, ``os_type``). That route answers every
token of the node, an owner-bound one and on a node without builds too,
so an eval whose token may not build still runs on a template the
operator built from its file; a daemon from before it is asked ``GET
/v1/templates/builds/{name}`` (an admin operation) instead. Another image
or mode, or a node that cannot say, fails the task naming both (rename
the file, or have the operator remove the template).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpx
from inspect_ai._util.error import PrerequisiteError

from .client import Client, NodeDown, Problem, UploadCut
from .config import NodeConfig, OvaImage, PveInspectSandboxEnvironmentConfig

log = logging.getLogger(__name__)

# Pause between two looks at a running template build.
BUILD_POLL = 5.0


class ConfigRefused(PrerequisiteError):
    """The nodes refuse the config or the token (Inspect prints the
    message without a traceback)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.args = (message,)


async def preflight(cfg: PveInspectSandboxEnvironmentConfig, req: dict[str, Any]) -> None:
    """Raise :class:`ConfigRefused` when a node that answers refuses the
    token or would refuse ``req`` (the create request of ``cfg``), or when
    no node answers."""
    nodes = cfg.resolved_nodes()
    down: list[str] = []
    wrong: list[str] = []
    for node in nodes:
        try:
            async with Client(node) as c:
                health = await c.healthz()
                rep = await c.validate(req)
                missing = _missing_built_ins(rep, cfg)
                ovas = _missing_ovas(rep, cfg)
                if (missing or ovas) and not health.get("template_builds"):
                    wrong.append(_no_builds(node, cfg, missing, ovas))
                    continue
                if missing or ovas:
                    for name in missing:
                        await _build(c, node, name, cfg.template_build_seconds)
                    for name, ova in ovas:
                        await _upload(c, node, name, ova, cfg.template_build_seconds)
                    rep = await c.validate(req)
                other = await _other_images(c, node, rep, cfg)
                if other:
                    wrong.append(other)
                    continue
        except (NodeDown, httpx.HTTPError, OSError) as e:
            down.append(f"{node.url}: {e}")
            continue
        except Problem as p:
            if p.status in (401, 403):
                wrong.append(_token(node, p))
            elif p.type == "invalid-request":
                # The request's own rules: the node answers as its create would.
                wrong.append(describe(node, {"problems": [p.doc]}, cfg, req))
            else:
                down.append(f"{node.url}: {p}")
            continue
        if rep is not None and not rep.get("valid", True):
            wrong.append(describe(node, rep, cfg, req))
    if wrong:
        raise ConfigRefused("\n".join(wrong))
    if len(down) == len(nodes):
        raise ConfigRefused("pve_inspect: no node answers: " + "; ".join(down))


def _missing_built_ins(
    rep: Mapping[str, Any] | None, cfg: PveInspectSandboxEnvironmentConfig
) -> list[str]:
    """The built-in templates the config's VMs ask for that the node's
    report lists no template of (in the config's order, once each)."""
    if rep is None or rep.get("valid", True) or "templates" not in rep:
        return []
    have = set(rep.get("templates") or ())
    out: list[str] = []
    for v in cfg.resolved_vms():
        if v.built_in is not None and v.template not in have and v.template not in out:
            out.append(v.template)
    return out


def _missing_ovas(
    rep: Mapping[str, Any] | None, cfg: PveInspectSandboxEnvironmentConfig
) -> list[tuple[str, OvaImage]]:
    """The OVA templates the config's VMs ask for that the node's report
    lists no template of (in the config's order, once each)."""
    if rep is None or rep.get("valid", True) or "templates" not in rep:
        return []
    have = set(rep.get("templates") or ())
    out: dict[str, OvaImage] = {}
    for v in cfg.resolved_vms():
        if v.ova is not None and v.template not in have:
            out.setdefault(v.template, v.ova)
    return list(out.items())


def _command(name: str) -> str:
    return f"`pve-inspectd template build {name} --recipe {name}`"


def _ova_commands(name: str, ova: OvaImage) -> list[str]:
    file = os.path.basename(ova.path)
    if ova.import_only:
        flags = " --import-only"
        flags += f" --disk-bus {ova.disk_bus}" if ova.disk_bus else ""
        flags += f" --os-type {ova.os_type}" if ova.os_type else ""
        build = f"`pve-inspectd template build {name} --from local:import/{file}{flags}`"
    else:
        build = f"`pve-inspectd template build {name} --from local:import/{file}/{ova.disk}`"
    return [
        f"`scp {ova.path} root@NODE:/var/lib/vz/import/{file}` (the storage local, content import)",
        build,
    ]


def _asked_by(cfg: PveInspectSandboxEnvironmentConfig, template: str, field: str) -> list[str]:
    """The fields (``vms[0].built_in``; a converted reference config's
    ``vms_config[0].vm_source_config.built_in``) of the VMs that ask for
    ``template`` through ``field`` (built_in, ova)."""
    return [
        cfg.field_name(f"vms[{i}].{field}")
        for i, v in enumerate(cfg.resolved_vms())
        if v.template == template and getattr(v, field) is not None
    ]


def _missing_text(
    cfg: PveInspectSandboxEnvironmentConfig,
    names: Sequence[str],
    ovas: Sequence[tuple[str, OvaImage]],
) -> list[str]:
    """The missing built-ins and OVAs, each with the fields that ask for it."""
    out = []
    for n in names:
        fields = _asked_by(cfg, n, "built_in")
        out.append(f"the built-in {n!r}" + (f" ({', '.join(fields)})" if fields else ""))
    for n, o in ovas:
        named = ", ".join([repr(n), *_asked_by(cfg, n, "ova")])
        out.append(f"the OVA {os.path.basename(o.path)!r} ({named})")
    return out


def _no_builds(
    node: NodeConfig,
    cfg: PveInspectSandboxEnvironmentConfig,
    names: Sequence[str],
    ovas: Sequence[tuple[str, OvaImage]] = (),
) -> str:
    what = _missing_text(cfg, names, ovas)
    lines = [
        f"pve_inspect: {node.url} has no template of "
        + ", ".join(what)
        + " and does not build templates on request; build "
        + ("it" if len(what) == 1 else "them")
        + " on the node as root:"
    ]
    lines += [f"  {_command(n)}" for n in names]
    for n, o in ovas:
        lines += [f"  {cmd}" for cmd in _ova_commands(n, o)]
    lines.append("  (or an operator turns on [templates] build in the node's config.toml)")
    return "\n".join(lines)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# The sha256 of each OVA hashed in this process, by its path, size, mtime
# and inode (device, inode): a file is hashed once however many tasks and
# nodes ask, and again once it changes.
_digests: dict[tuple[str, int, int, int, int], str] = {}


def _file_key(path: str) -> tuple[str, int, int, int, int]:
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)


async def _ova_digest(name: str, ova: OvaImage) -> str:
    """The sha256 (hex) of the OVA's file, as the config found it (its
    size; else :class:`ConfigRefused`); computed once per file version."""
    try:
        key = _file_key(ova.path)
        if key[1] != ova.size:
            raise ConfigRefused(
                f"pve_inspect: {ova.path} changed since the config was read ({ova.size} bytes, "
                f"now {key[1]}): the template it names is {name!r}; run the task again"
            )
        if key in _digests:
            return _digests[key]
        log.info("computing the sha256 of %s (%d bytes)", ova.path, key[1])
        digest = await anyio.to_thread.run_sync(_sha256, ova.path)
        if _file_key(ova.path) == key:  # not changed while read
            _digests[key] = digest
        return digest
    except OSError as e:
        raise ConfigRefused(f"pve_inspect: read {ova.path}: {e}") from None


async def _other_images(
    c: Client,
    node: NodeConfig,
    rep: Mapping[str, Any] | None,
    cfg: PveInspectSandboxEnvironmentConfig,
) -> str:
    """Why the node's templates of the config's OVAs are not theirs ("" when
    each is): a template found by its name (``ova-FILE-SIZE``) is the file's
    only when the node reports it built from the file's sha256 (``image``
    of ``GET /v1/templates/{name}``)."""
    if rep is None or "templates" not in rep:
        return ""
    have = set(rep.get("templates") or ())
    seen: set[str] = set()
    lines: list[str] = []
    for v in cfg.resolved_vms():
        if v.ova is None or v.template not in have or v.template in seen:
            continue
        seen.add(v.template)
        want = "sha256:" + await _ova_digest(v.template, v.ova)
        got, mode, why = await _built_from(c, v.template)
        want_mode = v.ova.build_mode()
        if got == want and mode == want_mode:
            continue
        of = ", ".join(
            [
                f"of an OVA {os.path.basename(v.ova.path)!r} of {v.ova.size} bytes",
                *_asked_by(cfg, v.template, "ova"),
            ]
        )
        remedy = (
            f"rename {v.ova.path} (its template is named after the file's name and size), or "
            f"have the node's operator remove the template {v.template!r} (a node that builds "
            "templates on request then builds it from this file)"
        )
        if got == want:
            lines.append(
                f"pve_inspect: {node.url}'s template {v.template!r} ({of}) was built "
                f"{_mode_text(mode)}, not {_mode_text(want_mode)} "
                f"as the config asks: {remedy}"
            )
        elif got:
            lines.append(
                f"pve_inspect: {node.url}'s template {v.template!r} ({of}) was built from "
                f"another image ({got}), not from "
                f"{v.ova.path} ({want}): {remedy}"
            )
        else:
            lines.append(
                f"pve_inspect: {node.url} cannot say what image its template {v.template!r} "
                f"({of}) was built from ({why}), so it may "
                f"not be {v.ova.path} ({want}): {remedy}"
            )
    return "\n".join(lines)


async def _built_from(c: Client, name: str) -> tuple[str, dict[str, str], str]:
    """The image the node says its template ``name`` was built from
    (``sha256:HEX``) and how (as :meth:`OvaImage.build_mode` says it), or
    "" and why it says none."""
    try:
        t = await c.template(name)
    except Problem as p:
        return "", {}, f"GET /v1/templates/{name}: {p.type}: {p.detail}"
    if t is None:
        # a daemon from before GET /v1/templates/{name}: its build's state
        return await _build_says(c, name)
    image = str(t.get("image") or "")
    if image:
        return image, _mode_of(t), ""
    if not t.get("built"):
        return "", {}, "no build of the node made it: its build ledger does not record it"
    return "", {}, "its build ledger records no image for it"


async def _build_says(c: Client, name: str) -> tuple[str, dict[str, str], str]:
    """:func:`_built_from` of a daemon without ``GET /v1/templates/{name}``:
    the image of ``GET /v1/templates/builds/{name}`` (an admin token's)."""
    try:
        st = await c.template_build(name)
    except Problem as p:
        if p.status == 403:
            return "", {}, f"it does not answer template builds: {p.detail}"
        return "", {}, f"GET /v1/templates/builds/{name}: {p.type}: {p.detail}"
    if st.get("state") != "done":
        return "", {}, f"its build of the name is {st.get('state')}"
    image = str(st.get("image") or "")
    return image, _mode_of(st), "" if image else "its build ledger records no image for it"


def _mode_of(t: Mapping[str, Any]) -> dict[str, str]:
    """The build mode a template answer (``GET /v1/templates/{name}`` or a
    done build's state) carries, as :meth:`OvaImage.build_mode` says it."""
    if not t.get("import_only"):
        return {}
    return {
        "import_only": "true",
        "disk_bus": str(t.get("disk_bus") or "scsi"),
        "os_type": str(t.get("os_type") or "l26"),
    }


def _mode_text(mode: Mapping[str, str]) -> str:
    """A build mode (:meth:`OvaImage.build_mode`) as the node says it."""
    if not mode:
        return "booted (cloud-init, the guest agent)"
    return f"imported without boot (disks on {mode['disk_bus']}, ostype {mode['os_type']})"


async def _upload(c: Client, node: NodeConfig, name: str, ova: OvaImage, limit: float) -> None:
    """Send the OVA to the node for a build of template ``name`` (or join
    its build of it) and follow the build as :func:`_build`; the file must
    be as the config found it (its size)."""
    how = " or, on the node as root: " + "; then ".join(_ova_commands(name, ova))
    digest = await _ova_digest(name, ova)
    try:
        log.info("%s: uploading %s for template %r", node.url, ova.path, name)
        try:
            st = await c.upload_template(
                name, ova.path, ova.size, digest, ova.disk, ova.build_mode()
            )
        except UploadCut as e:
            st = await _after_cut(c, node, name, ova, str(e), how)
    except OSError as e:
        raise ConfigRefused(f"pve_inspect: read {ova.path}: {e}") from None
    except Problem as p:
        raise ConfigRefused(
            f"pve_inspect: {node.url} refuses to build the template {name!r} from {ova.path} "
            f"({p.type}: {p.detail});{how}"
        ) from None
    await _follow(c, node, name, st, limit, how)


async def _after_cut(
    c: Client, node: NodeConfig, name: str, ova: OvaImage, why: str, how: str
) -> dict[str, Any]:
    """The node's build of ``name`` from the upload of ``ova`` whose answer
    was lost (:class:`UploadCut`): joined, the file on the node already,
    done, or failed (a body cut on the way); :class:`ConfigRefused` when the
    node has none (it refused the upload, and the refusal was lost)."""
    file = os.path.basename(ova.path)
    try:
        st = await c.template_build(name)
    except Problem:
        st = {}
    if st.get("from") != "upload:" + file:
        raise ConfigRefused(
            f"pve_inspect: {node.url} ended the upload of {ova.path} for the template {name!r} "
            f"without an answer ({why}) and has no build of it: it refused the upload (its "
            f"log says why);{how}"
        )
    log.info("%s: the upload's answer was lost (%s): following the build", node.url, why)
    return st


async def _build(c: Client, node: NodeConfig, name: str, limit: float) -> None:
    """Have the node build (or join its build of) the built-in ``name``,
    logging its progress, until it is done; :class:`ConfigRefused` when it
    fails, is refused or takes longer than ``limit`` seconds."""
    try:
        st = await c.build_template({"name": name, "recipe": name})
    except Problem as p:
        raise ConfigRefused(
            f"pve_inspect: {node.url} refuses to build the template {name!r} ({p.type}: "
            f"{p.detail}); build it on the node as root: {_command(name)}"
        ) from None
    await _follow(c, node, name, st, limit, f" or build it on the node as root: {_command(name)}")


async def _follow(
    c: Client, node: NodeConfig, name: str, st: dict[str, Any], limit: float, how: str
) -> None:
    """Log the build of ``name`` (its state ``st``) until it is done;
    :class:`ConfigRefused` when it fails, or runs past ``limit`` seconds
    (``how`` says what else to do)."""
    try:
        log.info("%s: building template %r (%s)", node.url, name, st.get("state"))
        give_up = time.monotonic() + limit
        seen = 0
        while True:
            progress = list(st.get("progress") or ())
            for line in progress[seen:]:
                log.info("%s: template %s: %s", node.url, name, line)
            seen = max(seen, len(progress))
            if st.get("state") == "done":
                log.info("%s: template %r is VM %s", node.url, name, st.get("vmid"))
                return
            if st.get("state") == "failed":
                raise ConfigRefused(
                    f"pve_inspect: {node.url} failed to build the template {name!r}: "
                    f"{st.get('error')}; see its log,{how}"
                )
            if time.monotonic() >= give_up:
                raise ConfigRefused(
                    f"pve_inspect: {node.url} is still building the template {name!r} after "
                    f"{limit:.0f} s (template_build_seconds); it goes on: run the task again "
                    f"once it is done (GET /v1/templates/builds/{name})"
                )
            await anyio.sleep(BUILD_POLL)
            st = await c.template_build(name)
    except Problem as p:
        raise ConfigRefused(
            f"pve_inspect: {node.url} refuses to build the template {name!r} ({p.type}: "
            f"{p.detail});{how}"
        ) from None


def _token(node: NodeConfig, p: Problem) -> str:
    if p.status == 401:
        return (
            f"pve_inspect: {node.url} refuses the token ({p.type}: {p.detail}): set "
            "PVE_INSPECT_TOKEN (or the node's token in the config) to a token of this node "
            "(`pve-inspectd token create NAME --scope admin` on it)"
        )
    return (
        f"pve_inspect: {node.url}: the token may not do this ({p.type}: {p.detail}); "
        "creating sandboxes needs a token of scope admin"
    )


def describe(
    node: NodeConfig,
    rep: Mapping[str, Any],
    cfg: PveInspectSandboxEnvironmentConfig,
    req: Mapping[str, Any],
) -> str:
    """A node's ValidateReport as a message: each problem named by the
    config's names, then the node's templates (when the report has them)."""
    problems: Sequence[Mapping[str, Any]] = rep.get("problems") or ()
    lines = [
        f"pve_inspect: the sandbox config cannot run on {node.url} "
        f"({len(problems)} problem{'' if len(problems) == 1 else 's'}):"
    ]
    for p in problems:
        field = str(p.get("field") or "")
        where = where_of(field, cfg, req)
        if not where and p.get("type") == "guard-refused":
            where = _size_of(str(p.get("cap") or ""), cfg, req)
        if not where:
            where = {"template-not-hardened": "templates"}.get(str(p.get("type")), "sandbox")
        lines.append(f"  - {where}: {p.get('detail') or p.get('type')}")
    if "templates" in rep:
        templates = rep["templates"] or []
        lines.append(
            "  templates on this node: " + (", ".join(map(str, templates)) if templates else "none")
        )
    return "\n".join(lines)


def where_of(field: str, cfg: PveInspectSandboxEnvironmentConfig, req: Mapping[str, Any]) -> str:
    """A problem's field (``vms[1].template``, ``networks[0].cidr``) as the
    config names it (``VM 'target' (vms[1].template)``; a converted
    reference config's path, ``VM 'target'
    (vms_config[1].vm_source_config.existing_vm_template_tag)``); "" for
    none."""
    shown = cfg.field_name(field)
    m = re.match(r"(vms|networks)\[(\d+)\]", field)
    if m is None:
        return shown
    i = int(m[2])
    items = list(req.get(m[1]) or ())
    if m[1] == "vms":
        name = items[i].get("name") if i < len(items) else None
        return f"VM {name or f'vm{i}'!r} ({shown})"
    if i < len(cfg.networks):
        return f"network {cfg.networks[i].label()} ({shown})"
    return shown


def range_label(cfg: PveInspectSandboxEnvironmentConfig, i: int) -> str:
    """Network ``i`` of the config as a refusal of its fixed cidr names it:
    its label, and for a converted reference config the field of the cidr
    (``'my lab' (net0) (sdn_config.vnet_configs[0].subnets[0].cidr)``)."""
    label = cfg.networks[i].label()
    if cfg.reference_paths() is None:
        return label
    return f"{label} ({cfg.field_name(f'networks[{i}].cidr')})"


def named_refusal(
    p: Problem, cfg: PveInspectSandboxEnvironmentConfig, req: Mapping[str, Any]
) -> Problem:
    """A node's refusal of the config's create with its field named as a
    converted reference config names it (the field, and its detail led by
    where it is, as :func:`describe` says it); ``p`` itself for a native
    config or a refusal of no field."""
    field = str(p.field or "")
    if cfg.reference_paths() is None or not field:
        return p
    detail = f"{where_of(field, cfg, req)}: {p.detail}"
    return Problem(p.status, {**p.doc, "field": cfg.field_name(field), "detail": detail})


# The request field of each VM that a cap of the resource guard sums, by
# the cap's resource (the cap's name past its scope: sandbox_vcpus).
_CAP_FIELDS = {"vcpus": "cores", "memory_mib": "memory_mib"}


def _size_of(cap: str, cfg: PveInspectSandboxEnvironmentConfig, req: Mapping[str, Any]) -> str:
    """Where a guard refusal of ``cap`` (``sandbox_vcpus``) is: ``size`` and
    the fields the cap sums, as the config names them (``size (vms[0].cores,
    vms[1].cores)``; a converted reference config's ``size
    (vms_config[0].vcpus, vms_config[1].vcpus)``); ``size`` alone for a cap
    of whole sandboxes."""
    what = cap.split("_", 1)[1] if "_" in cap else ""
    n = len(req.get("vms") or ())
    if what == "vms":
        fields = [cfg.field_name("vms")]
    elif what in _CAP_FIELDS:
        fields = [cfg.field_name(f"vms[{i}].{_CAP_FIELDS[what]}") for i in range(n)]
    else:
        fields = []
    return f"size ({', '.join(fields)})" if fields else "size"
