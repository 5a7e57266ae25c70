"""A reference config's refusals name the fields its author wrote (a fake
daemon, tests/fakenode.py): each refusal task_init's check meets for a
config converted from the reference plugin's shape names the reference's
path (``vms_config[1].vm_source_config.existing_vm_template_tag``,
``sdn_config.vnet_configs[0].subnets[0].cidr``), not the create request's
(``vms[1].template``, ``networks[0].cidr``), with the daemon's words of
why and the node's templates, in one list; so does a create the node
refuses later. A native config keeps the request's names.

Not reachable from a reference config: an egress entry (the reference's
config has no egress policy, and the conversion sets none)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakenode import FakeNode
from test_preflight import reference

from inspect_pve_inspect import (
    NetworkSpec,
    NicSpec,
    NodeConfig,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
    VmSpec,
)
from inspect_pve_inspect.client import Problem
from inspect_pve_inspect.compat import coerce
from inspect_pve_inspect.preflight import ConfigRefused, range_label
from inspect_pve_inspect.refpaths import ReferencePaths, reference_paths

pytestmark = pytest.mark.anyio

# The daemon's words of each refusal the fake makes (fakenode._refusals).
NOT_SHARED = (
    'vnet "lab": not a vnet this node shares (the operator lists them in [api] '
    "shared_vnets); this node shares uplink"
)
HOST_CLASH = (
    'network "net0": cidr 172.31.250.0/24 overlaps a network of the node\'s host '
    "(its addresses and routes; which one is in the node's log): "
    'pick another cidr, or "auto"'
)


def _on_shared_vnets(node: NodeConfig) -> dict[str, Any]:
    """The reference config on existing vnets (sdn_config None): the
    attacker's second NIC on the vnet lab, which the fake does not share."""
    d = reference(node)
    d["sdn_config"] = None
    d["vms_config"][0]["nics"] = [{"vnet_alias": "uplink"}, {"vnet_alias": "lab"}]
    d["vms_config"][1]["nics"] = [{"vnet_alias": "uplink"}]
    return d


def _case(node: NodeConfig, fake: FakeNode, kind: str) -> tuple[dict[str, Any], str]:
    """A reference config that meets one kind of refusal on ``fake`` (set
    up for it), and the line of the message that names it."""
    d = reference(node)
    vms = d["vms_config"]
    if kind == "template by tag":  # the fake has debian only
        return d, (
            "  - VM 'target' (vms_config[1].vm_source_config.existing_vm_template_tag): "
            'unknown template "kali"'
        )
    fake.templates = ("debian", "kali")
    if kind == "built_in, node without builds":
        vms[1]["vm_source_config"] = {"built_in": "ubuntu24.04"}
        return d, (
            f"pve_inspect: {node.url} has no template of the built-in 'ubuntu24.04' "
            "(vms_config[1].vm_source_config.built_in) and does not build templates on "
            "request; build it on the node as root:"
        )
    if kind == "oversize vcpus":
        vms[0]["vcpus"], vms[1]["vcpus"] = 4, 3
        fake.sandbox_caps = {"vcpus": 6}
        return d, (
            "  - size (vms_config[0].vcpus, vms_config[1].vcpus): cap sandbox_vcpus: "
            "the create would need 7, the cap is 6"
        )
    if kind == "oversize ram_mb":
        vms[1]["ram_mb"] = 8192
        fake.sandbox_caps = {"memory_mib": 8192}
        return d, (
            "  - size (vms_config[0].ram_mb, vms_config[1].ram_mb): cap sandbox_memory_mib: "
            "the create would need 10240, the cap is 8192"
        )
    if kind == "vnet not shared":
        fake.shared_vnets = ("uplink",)
        return _on_shared_vnets(node), (
            f"  - VM 'attacker' (vms_config[0].nics[1].vnet_alias): {NOT_SHARED}"
        )
    if kind == "cidr on the host's network":
        fake.host_networks = ("172.31.0.0/16",)
        return d, (
            "  - network 'my lab' (net0) (sdn_config.vnet_configs[0].subnets[0].cidr): "
            + HOST_CLASH
        )
    if kind == "uefi_boot":
        vms[1]["uefi_boot"] = True
        fake.allow_uefi = False
        return d, "  - VM 'target' (vms_config[1].uefi_boot): firmware \"uefi\" is not allowed"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "template by tag",
        "built_in, node without builds",
        "oversize vcpus",
        "oversize ram_mb",
        "vnet not shared",
        "cidr on the host's network",
        "uefi_boot",
    ],
)
async def test_refusal_names_the_reference_field(
    kind: str, fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    d, want = _case(node, fake, kind)
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", coerce(d))
    msg = str(e.value)
    assert any(line.startswith(want) for line in msg.splitlines()), msg
    # the request's names are nowhere in it
    for own in ("vms[", "networks[", ".template", ".cores", ".memory_mib", ".firmware", ".vnet)"):
        assert own not in msg, msg
    if "(1 problem)" in msg:  # a node's report: what it has follows
        templates = ", ".join(fake.templates)
        assert msg.splitlines()[-1] == f"  templates on this node: {templates}", msg
    assert "POST /v1/sandboxes" not in fake.calls


async def test_several_refusals_are_one_list(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    fake.host_networks = ("172.31.0.0/16",)
    fake.sandbox_caps = {"vcpus": 3}
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", coerce(reference(node)))
    assert str(e.value) == (
        f"pve_inspect: the sandbox config cannot run on {node.url} (3 problems):\n"
        "  - VM 'target' (vms_config[1].vm_source_config.existing_vm_template_tag): "
        'unknown template "kali"\n'
        "  - size (vms_config[0].vcpus, vms_config[1].vcpus): cap sandbox_vcpus: "
        "the create would need 4, the cap is 3\n"
        "  - network 'my lab' (net0) (sdn_config.vnet_configs[0].subnets[0].cidr): "
        f"{HOST_CLASH}\n"
        "  templates on this node: debian"
    )


def _native(node: NodeConfig) -> PveInspectSandboxEnvironmentConfig:
    """A native config of the reference config's shape: two VMs on net0 of
    a fixed cidr, the attacker's second NIC on the vnet lab, the target
    of template kali and firmware uefi."""
    return PveInspectSandboxEnvironmentConfig(
        nodes=(node,),
        networks=(NetworkSpec(name="net0", cidr="172.31.250.0/24", alias="my lab"),),
        vms=(
            VmSpec(
                template="debian",
                name="attacker",
                cores=2,
                nics=(NicSpec(network="net0"), NicSpec(vnet="lab")),
            ),
            VmSpec(template="kali", name="target", cores=2, firmware="uefi"),
        ),
    )


async def test_native_config_keeps_its_own_names(
    fake_node: tuple[FakeNode, NodeConfig],
) -> None:
    fake, node = fake_node
    fake.host_networks = ("172.31.0.0/16",)
    fake.sandbox_caps = {"vcpus": 3}
    fake.shared_vnets = ("uplink",)
    fake.allow_uefi = False
    cfg = _native(node)
    assert cfg.reference_paths() is None
    with pytest.raises(ConfigRefused) as e:
        await PveInspectSandboxEnvironment.task_init("t", cfg)
    assert str(e.value) == (
        f"pve_inspect: the sandbox config cannot run on {node.url} (5 problems):\n"
        "  - VM 'target' (vms[1].template): unknown template \"kali\"\n"
        "  - VM 'target' (vms[1].firmware): firmware \"uefi\" is not allowed on this node: "
        "... [api] allow_uefi = true\n"
        "  - size (vms[0].cores, vms[1].cores): cap sandbox_vcpus: "
        "the create would need 4, the cap is 3\n"
        f"  - VM 'attacker' (vms[0].nics[1].vnet): {NOT_SHARED}\n"
        f"  - network 'my lab' (net0) (networks[0].cidr): {HOST_CLASH}\n"
        "  templates on this node: debian"
    )


async def test_later_create_refusal_names_the_reference_field(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template the node had at task start and lost before the sample:
    the create's refusal names the reference's field too (a native
    config's is the node's own)."""
    fake, node = fake_node
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    fake.templates = ("debian", "kali")
    cfg = coerce(reference(node))
    await PveInspectSandboxEnvironment.task_init("t", cfg)
    fake.templates = ("debian",)
    with pytest.raises(Problem) as e:
        await PveInspectSandboxEnvironment.sample_init("t", cfg, {})
    assert e.value.type == "invalid-request"
    assert e.value.field == "vms_config[1].vm_source_config.existing_vm_template_tag"
    assert str(e.value) == (
        "invalid-request (400): VM 'target' "
        '(vms_config[1].vm_source_config.existing_vm_template_tag): unknown template "kali"'
    )
    native = _native(node).model_copy(update={"vms": (VmSpec(template="kali", name="t"),)})
    with pytest.raises(Problem) as e:
        await PveInspectSandboxEnvironment.sample_init("t", native, {})
    assert (e.value.field, e.value.detail) == ("vms[0].template", 'unknown template "kali"')
    assert fake.sandboxes == {}


def test_the_record_follows_copies_and_files(tmp_path: Path) -> None:
    """The record travels with the converted config: its copies, a config
    file of the reference's shape; it is no field (the config's identity,
    hash and dump, is the native one's)."""
    d = reference(NodeConfig(url="unix:///x"))
    cfg = coerce(d)
    paths = cfg.reference_paths()
    assert paths is not None
    assert cfg.model_copy(update={"ttl_seconds": 600}).reference_paths() == paths
    assert cfg.model_copy(deep=True).reference_paths() == paths
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps(d))
    assert coerce(str(f)).reference_paths() == paths
    native = PveInspectSandboxEnvironmentConfig.model_validate(cfg.model_dump())
    assert native.reference_paths() is None and native.model_dump_json() == cfg.model_dump_json()
    assert hash(native) == hash(cfg)


@pytest.mark.parametrize(
    ("field", "want"),
    [
        ("vms[0].template", "vms_config[0].vm_source_config.existing_vm_template_tag"),
        ("vms[1].template", "vms_config[1].vm_source_config.built_in"),
        ("vms[2].template", "vms_config[2].vm_source_config.ova"),
        ("vms[0].cores", "vms_config[0].vcpus"),
        ("vms[1].memory_mib", "vms_config[1].ram_mb"),
        ("vms[0].firmware", "vms_config[0].uefi_boot"),
        ("vms[1].agent", "vms_config[1].is_sandbox"),
        ("vms[1].no_network", "vms_config[1].nics"),  # nics=[]: a VM without network
        ("vms[0].networks", "vms_config[0].nics"),
        ("vms[0].networks[1]", "vms_config[0].nics[1].vnet_alias"),
        ("vms[0].nics[1].network", "vms_config[0].nics[1].vnet_alias"),
        ("vms[0].nics[1].vnet", "vms_config[0].nics[1].vnet_alias"),
        ("vms[0].nics[1].mac", "vms_config[0].nics[1].mac"),  # through its NIC
        ("vms[2].disk_gib", "vms_config[2].disk_gib"),  # through its VM
        ("vms", "vms_config"),
        ("networks[0].cidr", "sdn_config.vnet_configs[0].subnets[0].cidr"),
        (
            "networks[0].dhcp_ranges[1].start",
            "sdn_config.vnet_configs[0].subnets[0].dhcp_ranges[1].start",
        ),
        ("networks[0].name", "sdn_config.vnet_configs[0].alias"),
        ("ttl_seconds", "ttl_seconds"),  # none of the reference's: as it is
        ("egress", "egress"),
    ],
)
def test_reference_paths_name_every_converted_field(field: str, want: str) -> None:
    vms: list[dict[str, Any]] = [
        {"vm_source_config": {"existing_vm_template_tag": "a"}, "nics": [{}, {}]},
        {"vm_source_config": {"built_in": "debian13"}},
        {"vm_source_config": {"ova": "/x.ova"}},
    ]
    assert reference_paths(vms, [0, 1, 2], 1).name(field) == want


def test_reference_paths_follow_the_vms_order() -> None:
    """A conversion that reorders or drops VMs names the entries the user
    wrote: each converted VM is recorded with its vms_config index."""
    vms: list[dict[str, Any]] = [
        {"vm_source_config": {"existing_vm_template_tag": "a"}},
        {"vm_source_config": {"built_in": "debian13"}, "nics": [{}]},
        {"vm_source_config": {"ova": "/x.ova"}},
    ]
    paths = reference_paths(vms, [2, 1], 0)  # the first dropped, the others swapped
    assert paths.name("vms[0].template") == "vms_config[2].vm_source_config.ova"
    assert paths.name("vms[1].template") == "vms_config[1].vm_source_config.built_in"
    assert paths.name("vms[1].nics[0].vnet") == "vms_config[1].nics[0].vnet_alias"
    assert paths.name("vms[1].cores") == "vms_config[1].vcpus"
    assert paths.name("vms[2].cores") == "vms[2].cores"  # no such VM: as it is
    assert paths.name("vms") == "vms_config"


@pytest.mark.parametrize(
    ("field", "want"),
    [
        ("a", "A"),
        ("a.x", "A.x"),
        ("a.b[0]", "B"),
        ("a.b[0].c", "C"),
        ("a.b[0].d[2]", "B.d[2]"),
        ("a.b[1]", "A.b[1]"),
        ("ab", "ab"),
        ("l", "L"),  # whole: itself only
        ("l[3]", "l[3]"),
        ("l[0].y", "L0.y"),
    ],
)
def test_reference_paths_name_by_the_longest_recorded_prefix(field: str, want: str) -> None:
    p = ReferencePaths({"a": "A", "a.b[0]": "B", "a.b[0].c": "C", "l": "L", "l[0]": "L0"}, ("l",))
    assert p.name(field) == want


def test_range_label_names_the_cidr_field() -> None:
    node = NodeConfig(url="unix:///x")
    assert range_label(coerce(reference(node)), 0) == (
        "'my lab' (net0) (sdn_config.vnet_configs[0].subnets[0].cidr)"
    )
    assert range_label(_native(node), 0) == "'my lab' (net0)"
