"""Errors before the first sample (a fake daemon, tests/fakenode.py):
task_init fails once, in one message that names what is wrong by the
config's own names and lists what exists; a bad token says so; Inspect's
config files (``--sandbox pve_inspect:cfg.yaml`` / ``.json``) load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakenode import FakeNode
from inspect_ai.util import SandboxEnvironmentSpec
from pydantic import SecretStr

from inspect_pve_inspect import (
    ConfigError,
    NodeConfig,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
)
from inspect_pve_inspect.compat import coerce
from inspect_pve_inspect.preflight import ConfigRefused

pytestmark = pytest.mark.anyio


def reference(node: NodeConfig) -> dict[str, Any]:
    """A config in the reference plugin's shape: two VMs on a lab vnet."""
    return {
        "sdn_config": {
            "vnet_configs": [
                {
                    "alias": "my lab",
                    "subnets": [
                        {
                            "cidr": "172.31.250.0/24",
                            "gateway": "172.31.250.1",
                            "snat": False,
                            "dhcp_ranges": [{"start": "172.31.250.10", "end": "172.31.250.254"}],
                        }
                    ],
                }
            ]
        },
        "vms_config": [
            {
                "name": "attacker",
                "vm_source_config": {"existing_vm_template_tag": "debian"},
                "nics": [{"vnet_alias": "my lab"}],
            },
            {
                "name": "target",
                "vm_source_config": {"existing_vm_template_tag": "kali"},
                "nics": [{"vnet_alias": "my lab"}],
            },
        ],
    }


async def test_bad_config_fails_once_listing_what_is_wrong_and_what_exists(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    cfg = coerce(reference(node))
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert str(e.value) == (
        f"pve_inspect: the sandbox config cannot run on {node.url} (1 problem):\n"
        "  - VM 'target' (vms_config[1].vm_source_config.existing_vm_template_tag): "
        'unknown template "kali"\n'
        "  templates on this node: debian"
    )
    assert e.value.message == str(e.value)  # what Inspect prints, without a traceback
    # What the request's own rules refuse, the node answers as its create would.
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init(
            "t", cfg.model_copy(update={"ttl_seconds": 999999})
        )
    assert str(e.value) == (
        f"pve_inspect: the sandbox config cannot run on {node.url} (1 problem):\n"
        "  - ttl_seconds: ttl_seconds 999999: want 1..86400"
    )
    assert "POST /v1/sandboxes" not in fake.calls


async def test_good_config_passes(fake_node: tuple[FakeNode, NodeConfig]) -> None:
    fake, node = fake_node
    cfg = PveInspectSandboxEnvironmentConfig(nodes=(node,))
    await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert "POST /v1/sandboxes/validate" in fake.calls and fake.sandboxes == {}


async def test_network_problem_names_the_alias(fake_node: tuple[FakeNode, NodeConfig]) -> None:
    from inspect_pve_inspect.preflight import describe

    _, node = fake_node
    cfg = coerce(reference(node))
    rep = {
        "problems": [
            {
                "type": "invalid-request",
                "field": "networks[0].cidr",
                "detail": 'network "net0": cidr 172.31.250.0/24 overlaps the host\'s network',
            },
            {"type": "guard-refused", "cap": "sandbox_vcpus", "detail": "cap sandbox_vcpus: ..."},
        ],
        "templates": [],
    }
    msg = describe(node, rep, cfg, {"vms": [], "networks": [{"name": "net0"}]})
    assert (
        "  - network 'my lab' (net0) (sdn_config.vnet_configs[0].subnets[0].cidr): "
        'network "net0"' in msg
    )
    assert "  - size: cap sandbox_vcpus" in msg and "templates on this node: none" in msg


async def test_unshared_vnet_fails_listing_what_the_node_shares(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NIC on an existing vnet the node does not share (the reference's
    vnet_alias that is none of the config's own vnets, beside one that is)
    fails the task at start: the VM named, the field as the reference's
    (vms_config[i].nics[j].vnet_alias, its NICs in the order written, the
    sample's own vnet first), and the vnets the node shares listed; a VM
    without NICs beside it is no problem."""
    fake, node = fake_node
    fake.shared_vnets = ("dmz",)
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    cfg = reference(node)
    cfg["vms_config"][1] = {
        **cfg["vms_config"][1],
        "vm_source_config": {"existing_vm_template_tag": "debian"},
        "nics": [{"vnet_alias": "my lab"}, {"vnet_alias": "corp lab"}],
    }
    cfg["vms_config"].append(
        {"name": "vault", "vm_source_config": {"existing_vm_template_tag": "debian"}, "nics": []}
    )
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", coerce(cfg))
    assert str(e.value) == (
        f"pve_inspect: the sandbox config cannot run on {node.url} (1 problem):\n"
        "  - VM 'target' (vms_config[1].nics[1].vnet_alias): "
        'vnet "corp lab": not a vnet this node shares '
        "(the operator lists them in [api] shared_vnets); this node shares dmz\n"
        "  templates on this node: debian"
    )
    # a vnet the node shares passes
    cfg["vms_config"][1]["nics"][1] = {"vnet_alias": "dmz"}
    await PveInspectSandboxEnvironment.task_init("t", coerce(cfg))


async def test_bad_token_says_so(fake_node: tuple[FakeNode, NodeConfig]) -> None:
    fake, node = fake_node
    fake.token = "good"
    bad = NodeConfig(url=node.url, token=SecretStr("bad"))
    with pytest.raises(ConfigRefused, match=r"refuses the token .*unauthorized.*PVE_INSPECT_TOKEN"):
        await PveInspectSandboxEnvironment.task_init(
            "t", PveInspectSandboxEnvironmentConfig(nodes=(bad,))
        )
    good = NodeConfig(url=node.url, token=SecretStr("good"))
    await PveInspectSandboxEnvironment.task_init(
        "t", PveInspectSandboxEnvironmentConfig(nodes=(good,))
    )


async def test_no_node_answers(tmp_path: Path) -> None:
    down = NodeConfig(url="unix://" + str(tmp_path / "none.sock"))
    with pytest.raises(ConfigRefused, match="no node answers"):
        await PveInspectSandboxEnvironment.task_init(
            "t", PveInspectSandboxEnvironmentConfig(nodes=(down,))
        )


@pytest.mark.parametrize("ext", ["yaml", "yml", "json"])
@pytest.mark.parametrize("shape", ["native", "reference"])
async def test_config_file_loads(
    fake_node: tuple[FakeNode, NodeConfig], tmp_path: Path, ext: str, shape: str
) -> None:
    """Inspect passes ``pve_inspect:FILE`` as the file's path (a str), to
    task_init and to every sample; the file holds either shape."""
    fake, node = fake_node
    fake.templates = ("debian", "kali")
    doc: dict[str, Any] = (
        reference(node)
        if shape == "reference"
        else {"nodes": [{"url": node.url}], "vms": [{"template": "debian", "name": "a"}]}
    )
    f = tmp_path / f"cfg.{ext}"
    f.write_text(json.dumps(doc) if ext == "json" else yaml.safe_dump(doc))
    spec = SandboxEnvironmentSpec("pve_inspect", str(f))
    assert spec.config == str(f)
    cfg = coerce(spec.config)
    want = ["attacker", "target"] if shape == "reference" else ["a"]
    assert [v.name for v in cfg.vms] == want
    if shape == "native":
        await PveInspectSandboxEnvironment.task_init("t", str(f))
        envs = await PveInspectSandboxEnvironment.sample_init("t", str(f), {})
        await PveInspectSandboxEnvironment.sample_cleanup("t", str(f), envs, False)
        assert list(envs) == ["a"] and fake.sandboxes == {}


@pytest.mark.parametrize(
    ("text", "name", "match"),
    [
        ("vms: [", "cfg.yaml", r"config file .*cfg\.yaml: not valid YAML"),
        ("{", "cfg.json", r"config file .*cfg\.json: not valid JSON"),
        ("- a\n- b\n", "cfg.yaml", "want a mapping of config fields, got list"),
        (
            "vms: [{template: debian, cpus: 2}]",
            "cfg.yaml",
            r"(?s)config file .*cfg\.yaml: .*vms\.0\.cpus",
        ),
        (
            "vms_config: [{vm_source_config: {existing_vm_template_tag: d}, vga: std}]",
            "cfg.yaml",
            r"vms_config\[0\]\.vga: .*\(config file .*cfg\.yaml\)",
        ),
        (None, "missing.yaml", r"config file .*missing\.yaml: No such file"),
    ],
)
def test_config_file_errors_name_the_file(
    tmp_path: Path, text: str | None, name: str, match: str
) -> None:
    f = tmp_path / name
    if text is not None:
        f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        coerce(str(f))


def test_config_files_are_found_by_inspect() -> None:
    assert "pve_inspect.yaml" in PveInspectSandboxEnvironment.config_files()
    assert not PveInspectSandboxEnvironment.is_docker_compatible()
