"""The reference plugin's built-in images (``VmSourceConfig(built_in=...)``):
each is the node's template of the recipe's name; at task start a node that
lacks it builds it when it offers builds, else the task fails with the
command that builds it (a fake daemon, tests/fakenode.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fakenode import FakeNode

from inspect_pve_inspect import ConfigError, NodeConfig, PveInspectSandboxEnvironment
from inspect_pve_inspect import preflight as preflight_mod
from inspect_pve_inspect.compat import coerce
from inspect_pve_inspect.preflight import ConfigRefused

pytestmark = pytest.mark.anyio


def builtin_config(built_in: str = "debian13", **src: Any) -> dict[str, Any]:
    """A reference config: an attacker of a built-in and a target of the
    node's debian template."""
    return {
        "vms_config": [
            {"name": "attacker", "vm_source_config": {"built_in": built_in, **src}},
            {"name": "target", "vm_source_config": {"existing_vm_template_tag": "debian"}},
        ]
    }


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight_mod, "BUILD_POLL", 0.01)


def test_built_in_is_the_template_of_its_name() -> None:
    cfg = coerce(builtin_config("ubuntu24.04"))
    vm = cfg.resolved_vms()[0]
    assert (vm.template, vm.built_in) == ("ubuntu24.04", "ubuntu24.04")
    assert cfg.resolved_vms()[1].built_in is None


@pytest.mark.parametrize(
    ("cfg", "field", "says"),
    [
        (builtin_config("centos9"), "vms_config[0].vm_source_config.built_in", "debian13"),
        (
            builtin_config(existing_vm_template_tag="debian"),
            "vms_config[0].vm_source_config",
            "not both",
        ),
        (
            {"vms_config": [{"vm_source_config": {"ova": "https://x/y.ova"}}]},
            "vms_config[0].vm_source_config.ova",
            "pve-inspectd template build",
        ),
    ],
)
def test_bad_built_ins_name_the_field(cfg: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        coerce(cfg)
    assert e.value.field == field
    assert says in str(e.value)


@pytest.mark.parametrize("built_in", ["debian13", "ubuntu24.04", "kali2025.4"])
async def test_node_with_builds_builds_the_missing_built_in_once(
    built_in: str,
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every built-in, kali2025.4's .tar.xz too (the node downloads, unpacks
    and uploads it itself), is the node's build of the recipe of its name."""
    fake, node = fake_node
    fake.builds = True
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    cfg = coerce(builtin_config(built_in))
    with caplog.at_level(logging.INFO, logger="inspect_pve_inspect.preflight"):
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert built_in in fake.templates
    builds = [c for c in fake.calls if c == "POST /v1/templates/build"]
    assert builds == ["POST /v1/templates/build"]
    assert fake.build_runs[built_in]["recipe"] == built_in
    # validated again after the build
    assert fake.calls.count("POST /v1/sandboxes/validate") == 2
    logged = caplog.text
    assert f"template {built_in}: image: downloading" in logged
    assert f"template {built_in}: step 2" in logged
    assert f"template '{built_in}' is VM 9100" in logged
    # a second task finds it: no build asked
    fake.calls.clear()
    await PveInspectSandboxEnvironment.task_init("t2", cfg)
    assert "POST /v1/templates/build" not in fake.calls


async def test_node_without_builds_names_the_command(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", coerce(builtin_config()))
    assert str(e.value) == (
        f"pve_inspect: {node.url} has no template of the built-in 'debian13' "
        "(vms_config[0].vm_source_config.built_in) and does not build templates on request; "
        "build it on the node as root:\n"
        "  `pve-inspectd template build debian13 --recipe debian13`\n"
        "  (or an operator turns on [templates] build in the node's config.toml)"
    )
    assert not any(c.startswith("POST /v1/templates") for c in fake.calls)


async def test_failed_build_fails_the_task(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    fake.builds, fake.build_error = True, "download: checksum mismatch"
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", coerce(builtin_config()))
    msg = str(e.value)
    assert "failed to build the template 'debian13': download: checksum mismatch" in msg
    assert "pve-inspectd template build debian13 --recipe debian13" in msg
    assert "debian13" not in fake.templates


async def test_refused_build_fails_the_task(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    fake.builds = True
    fake.build_refused = "recipe: [templates] mirror: image URL refused"
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", coerce(builtin_config("kali2025.4")))
    assert "refuses to build the template 'kali2025.4' (invalid-request" in str(e.value)
    assert "image URL refused" in str(e.value)
    assert "pve-inspectd template build kali2025.4 --recipe kali2025.4" in str(e.value)
    assert "kali2025.4" not in fake.templates


async def test_build_past_its_bound_fails_the_task(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    fake.builds, fake.build_polls = True, 10**9
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    cfg = coerce(builtin_config()).model_copy(update={"template_build_seconds": 0.05})
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert "still building the template 'debian13' after 0 s" in str(e.value)
