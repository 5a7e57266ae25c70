"""The reference plugin's built-ins end to end on the playground, whose node
builds templates on request from its mirror (cmd/pve-inspect-demo
TestInspectBuiltInBuild): a real ``inspect_ai.eval`` of a task whose config
is the reference's ``{"vms_config": [{"vm_source_config": {"built_in":
NAME}}]}``, with the mock model. The first eval's preflight finds no
template NAME, asks the node to build it (``POST /v1/templates/build``,
the recipe NAME from the mirror) and waits; the sample then runs in a clone
of the new template and scores. A second eval finds the template and
builds nothing: the node's last build of NAME is still the first one, and
asking for it now answers ``reused``.

The token is the playground's ``admin_token`` (PVE_INSPECT_TOKEN, as for
the whole suite): builds are node operations, refused to owner-bound
tokens, so the examples' owner-bound token could not start one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import eval_uname_then_submit_42, need_bed
from inspect_ai import Task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import basic_agent
from inspect_ai.tool import bash
from inspect_ai.util import SandboxEnvironmentSpec

from inspect_pve_inspect import preflight as preflight_mod
from inspect_pve_inspect.client import Client, Problem
from inspect_pve_inspect.compat import ProxmoxSandboxEnvironmentConfig
from inspect_pve_inspect.config import nodes_from_env


def reference_config(built_in: str) -> ProxmoxSandboxEnvironmentConfig:
    """The reference's config of one VM of a built-in, in its own model."""
    return ProxmoxSandboxEnvironmentConfig.model_validate(
        {"vms_config": [{"vm_source_config": {"built_in": built_in}}]}
    )


def builtin_task(built_in: str) -> Task:
    """The reference's ``task_for_test`` on a VM of ``built_in``."""
    return Task(
        dataset=[Sample(input="sample text", target="42")],
        solver=[basic_agent(tools=[bash()], message_limit=20)],
        scorer=includes(),
        sandbox=SandboxEnvironmentSpec("pve_inspect", reference_config(built_in)),
    )


def run_eval(built_in: str, log_dir: Path) -> None:
    """One eval with the mock model (``uname -a``, then submit 42): it
    succeeds and scores correct, the bash call answered by the guest."""
    eval_uname_then_submit_42(builtin_task(built_in), str(log_dir))


async def last_build(name: str) -> dict[str, Any] | None:
    """The node's running or last build of ``name`` (None: none)."""
    (node,) = nodes_from_env()
    async with Client(node) as c:
        try:
            return await c.template_build(name)
        except Problem as p:
            if p.status == 404:
                return None
            raise


async def templates() -> list[str]:
    """The template names the node knows (a validate's report)."""
    (node,) = nodes_from_env()
    async with Client(node) as c:
        rep = await c.validate({"vms": [{"template": "debian"}]})
    assert rep is not None
    return list(rep.get("templates") or ())


async def ask_build(name: str) -> dict[str, Any]:
    (node,) = nodes_from_env()
    async with Client(node) as c:
        return await c.build_template({"name": name, "recipe": name})


@pytest.mark.parametrize("built_in", ["ubuntu24.04", "debian13", "kali2025.4"])
def test_built_in_builds_once_then_reused(
    built_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_bed()
    monkeypatch.setattr(preflight_mod, "BUILD_POLL", 1.0)
    health_templates = anyio.run(templates)
    assert built_in not in health_templates, health_templates
    assert anyio.run(last_build, built_in) is None

    run_eval(built_in, tmp_path / "first")
    first = anyio.run(last_build, built_in)
    assert first is not None, "the first eval did not build the template"
    assert first["state"] == "done" and not first.get("reused"), first
    assert first["recipe"] == built_in and first["vmid"] > 0, first
    # the image came from the playground's mirror, verified by its list
    assert any("/images/" + built_in + "/" in line for line in first["progress"]), first
    assert built_in in anyio.run(templates)

    run_eval(built_in, tmp_path / "second")
    second = anyio.run(last_build, built_in)
    assert second is not None
    assert (second["started"], second["vmid"], second.get("reused")) == (
        first["started"],
        first["vmid"],
        first.get("reused"),
    ), "the second eval started another build"
    again = anyio.run(ask_build, built_in)
    assert again["state"] == "done" and again.get("reused"), again
    assert again["vmid"] == first["vmid"], again
