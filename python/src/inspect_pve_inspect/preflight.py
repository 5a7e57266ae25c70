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
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from inspect_ai._util.error import PrerequisiteError

from .client import Client, NodeDown, Problem
from .config import NodeConfig, PveInspectSandboxEnvironmentConfig


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
                await c.healthz()
                rep = await c.validate(req)
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
        if not where:
            where = {"guard-refused": "size", "template-not-hardened": "templates"}.get(
                str(p.get("type")), "sandbox"
            )
        lines.append(f"  - {where}: {p.get('detail') or p.get('type')}")
    if "templates" in rep:
        templates = rep["templates"] or []
        lines.append(
            "  templates on this node: " + (", ".join(map(str, templates)) if templates else "none")
        )
    return "\n".join(lines)


def where_of(field: str, cfg: PveInspectSandboxEnvironmentConfig, req: Mapping[str, Any]) -> str:
    """A problem's field (``vms[1].template``, ``networks[0].cidr``) as the
    config names it (``VM 'target' (vms[1].template)``); "" for none."""
    m = re.match(r"(vms|networks)\[(\d+)\]", field)
    if m is None:
        return field
    i = int(m[2])
    items = list(req.get(m[1]) or ())
    if m[1] == "vms":
        name = items[i].get("name") if i < len(items) else None
        return f"VM {name or f'vm{i}'!r} ({field})"
    if i < len(cfg.networks):
        return f"network {cfg.networks[i].label()} ({field})"
    return field
