"""The reference Proxmox plugin's own task and its README's configs
(UKGovernmentBEIS/inspect_proxmox_sandbox: tests/proxmoxsandboxtest/
test_eval.py's ``task_for_test``, README "Configuration" and "Static IP
Address Assignment", "Using Existing Proxmox VNETs", "Windows VMs"), each
written out here as the reference has it with only the sandbox type
changed to ``pve_inspect`` (facts of the reference, no code of it).

The task runs on the bed daemon with the mock model and scores as written.
Each README config is converted as the provider converts it at task start:
the full example converts whole (its OVA, a file on the eval machine, is
built into a template from the uploaded file at task start; its NIC on an
existing vnet is one on a vnet the node shares; its VM without NICs is the
daemon's no_network), and a field it cannot honour is named with why."""

from __future__ import annotations

import copy
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from conftest import eval_uname_then_submit_42, need_bed
from inspect_ai import Task, task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes, match
from inspect_ai.solver import Generate, Solver, TaskState, basic_agent, solver
from inspect_ai.tool import bash
from inspect_ai.util import SandboxEnvironmentSpec, sandbox
from test_ctf4 import ctf4
from test_ova import make_ova

from inspect_pve_inspect import ConfigError, PveInspectSandboxEnvironmentConfig
from inspect_pve_inspect.compat import (
    ProxmoxSandboxEnvironmentConfig,
    VmConfig,
    VmNicConfig,
    VmSourceConfig,
    coerce,
)
from inspect_pve_inspect.sandbox import create_request


@task
def reference_task_for_test() -> Task:
    """The reference's ``task_for_test``: one sample, ``basic_agent`` with
    ``bash``, scored by ``includes``; its ``sandbox="proxmox"`` is
    ``pve_inspect`` here."""
    return Task(
        dataset=[Sample(input="sample text", target="42")],
        solver=[basic_agent(tools=[bash()], message_limit=20)],
        scorer=includes(),
        sandbox="pve_inspect",
    )


def test_reference_task_for_test_scores(tmp_path: Path) -> None:
    """The reference's eval test with its mock model's two calls (``uname
    -a`` through bash, then submit 42) scores correct; the reference
    asserts an Ubuntu guest, the bed's guest is Linux (its Debian root)."""
    need_bed()
    eval_uname_then_submit_42(reference_task_for_test(), str(tmp_path))


# The README's "Configuration" example, field by field (its comments
# dropped): five VMs, one SDN with one vnet.
README_FULL: dict[str, Any] = {
    "vms_config": [
        {
            "vm_source_config": {"built_in": "ubuntu24.04"},
            "name": "romeo",
            "ram_mb": 512,
            "vcpus": 4,
            "uefi_boot": True,
            "is_sandbox": False,
            "disk_controller": "scsi",
            "nic_controller": "virtio",
            "cpu": "host",
            "firewall": True,
            "await_before_next_vm": False,
            "nics": [
                {
                    "vnet_alias": "my special vnet",
                    "mac": "00:16:3d:1d:eb:a0",
                    "ipv4": "192.168.20.10",
                }
            ],
        },
        {"vm_source_config": {"ova": "./tests/oVirtTinyCore64-13.11.ova"}, "os_type": "win10"},
        {"vm_source_config": {"existing_vm_template_tag": "java_server"}},
        {
            "vm_source_config": {"built_in": "ubuntu24.04"},
            "nics": [{"vnet_alias": "existing vnet alias"}],
        },
        {"vm_source_config": {"built_in": "ubuntu24.04"}, "nics": []},
    ],
    "sdn_config": {
        "vnet_configs": [
            {
                "subnets": [
                    {
                        "cidr": "192.168.20.0/24",
                        "gateway": "192.168.20.1",
                        "snat": True,
                        "dhcp_ranges": [{"start": "192.168.20.50", "end": "192.168.20.100"}],
                    }
                ],
                "alias": "my special vnet",
            }
        ],
        "use_pve_ipam_dnsnmasq": True,
    },
}


def _one_vm(vm: dict[str, Any], sdn: Any = None) -> dict[str, Any]:
    d: dict[str, Any] = {"vms_config": [vm]}
    if sdn is not None:
        d["sdn_config"] = sdn
    return d


def _full_with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """README_FULL with the field at path (keys and indexes) set to value."""
    d = copy.deepcopy(README_FULL)
    at: Any = d
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return d


@pytest.mark.parametrize(
    ("name", "config", "field"),
    [
        # the full example converts whole (test_readme_full_example_converts);
        # each of these changes one of its fields to a value this provider
        # cannot honour, and that field is named
        (
            "a fixed MAC on the existing vnet's NIC",
            _full_with(("vms_config", 3, "nics", 0, "mac"), "00:16:3d:1d:eb:a1"),
            "vms_config[3].nics[0].mac",
        ),
        (
            "a fixed address on the existing vnet's NIC",
            _full_with(("vms_config", 3, "nics", 0, "ipv4"), "192.168.20.11"),
            "vms_config[3].nics[0].ipv4",
        ),
        (
            "a VLAN tag on the existing vnet's NIC",
            _full_with(("vms_config", 3, "nics", 0, "vlan_tag"), 5),
            "vms_config[3].nics[0].vlan_tag",
        ),
        (
            "its vnet's gateway not the subnet's first address",
            _full_with(
                ("sdn_config", "vnet_configs", 0, "subnets", 0, "gateway"), "192.168.20.254"
            ),
            "sdn_config.vnet_configs[0].subnets[0].gateway",
        ),
        (
            "without the zone's IPAM and DHCP",
            _full_with(("sdn_config", "use_pve_ipam_dnsnmasq"), False),
            "sdn_config.use_pve_ipam_dnsnmasq",
        ),
        (
            "a display",
            _full_with(("vms_config", 4, "vga"), "std"),
            "vms_config[4].vga",
        ),
    ],
)
def test_readme_config_refused_by_field(
    name: str, config: dict[str, Any], field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each README config this provider cannot honour is refused at task
    start, naming the first field it cannot take and why."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    make_ova(tmp_path / "tests" / "oVirtTinyCore64-13.11.ova")
    with pytest.raises(ConfigError) as e:
        coerce(config)
    assert e.value.field == field, f"{name}: {e.value}"
    assert e.value.message, name


def test_readme_full_example_converts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's full example converts whole, its five VMs in order:
    romeo (a built-in, UEFI, no guest agent) with a fixed MAC and address
    on the config's own vnet "my special vnet"; the Windows 10 VM of an OVA
    on the eval machine; a VM of the template tag java_server (a template
    name the preflight checks at task start, listing the node's); a VM
    whose NIC names "existing vnet alias", none of the config's vnets,
    which the reference looks up among every Proxmox vnet: a NIC on a vnet
    the node's operator shares (the daemon refuses at task start one it
    does not share, listing those it does); and a VM with ``nics=[]``, the
    reference's "virtual machine with no network access": the daemon's
    ``no_network``, neither networks nor nics. The sandbox's network is
    the config's vnet with its DHCP range, and it asks no egress policy (a
    sandbox with a shared vnet's NIC takes none)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    ova = make_ova(tmp_path / "tests" / "oVirtTinyCore64-13.11.ova")
    cfg = coerce(README_FULL)
    romeo, win, java, shared, offline = cfg.vms
    (net,) = cfg.networks
    assert (net.name, net.alias, net.cidr) == ("net0", "my special vnet", "192.168.20.0/24")
    assert (romeo.name, romeo.template, romeo.firmware, romeo.agent) == (
        "romeo",
        "ubuntu24.04",
        "uefi",
        False,
    )
    assert win.template == f"ova-ovirttinycore64-13-11-ova-{ova.stat().st_size}"
    assert java.template == "java_server" and java.built_in is None
    assert shared.nics is not None and shared.networks is None
    assert [(n.network, n.vnet) for n in shared.nics] == [(None, "existing vnet alias")]
    assert offline.no_network and offline.networks is None and offline.nics is None
    assert (offline.template, offline.sandbox, offline.agent) == ("ubuntu24.04", True, True)
    assert cfg.egress is None
    req = create_request(cfg, "t")
    vms = req["vms"]
    assert vms[0]["nics"] == [
        {"network": "net0", "mac": "00:16:3D:1D:EB:A0", "ipv4": "192.168.20.10"}
    ]
    assert vms[0]["agent"] is False and vms[0]["firmware"] == "uefi"
    assert vms[1]["os_type"] == "win10" and "networks" not in vms[1] and "nics" not in vms[1]
    assert vms[2] == {"template": "java_server", "cores": 2, "memory_mib": 2048}
    assert vms[3]["nics"] == [{"vnet": "existing vnet alias"}] and "networks" not in vms[3]
    assert vms[4] == {
        "template": "ubuntu24.04",
        "cores": 2,
        "memory_mib": 2048,
        "no_network": True,
    }
    assert req["networks"] == [net.request()] and "egress" not in req


def test_existing_vnet_beside_the_config_s_own() -> None:
    """A VM may mix NICs on its sample's vnets and on existing ones, in its
    order: an alias of the config's sdn_config is the sample's vnet (with
    its fixed address), any other an existing vnet the node shares; with
    ``sdn_config="auto"``, which has no aliases, every alias names an
    existing vnet (the reference finds none among the vnets it made), the
    sample's own network still made for its other VMs."""
    sdn = README_FULL["sdn_config"]
    cfg = coerce(
        _one_vm(
            {
                "vm_source_config": {"existing_vm_template_tag": "debian"},
                "nics": [
                    {"vnet_alias": "lab"},
                    {"vnet_alias": "my special vnet", "ipv4": "192.168.20.7"},
                ],
            },
            sdn,
        )
    )
    (vm,) = cfg.vms
    assert vm.nics is not None
    assert [(n.network, n.vnet, n.ipv4) for n in vm.nics] == [
        (None, "lab", None),
        ("net0", None, "192.168.20.7"),
    ]
    assert create_request(cfg, "t")["vms"][0]["nics"] == [
        {"vnet": "lab"},
        {"network": "net0", "ipv4": "192.168.20.7"},
    ]
    # without a fixed one the sample's own vnets still go as nics beside a shared one
    plain = coerce(
        _one_vm(
            {
                "vm_source_config": {"existing_vm_template_tag": "debian"},
                "nics": [{"vnet_alias": "my special vnet"}, {"vnet_alias": "lab"}],
            },
            sdn,
        )
    )
    assert create_request(plain, "t")["vms"][0]["nics"] == [{"network": "net0"}, {"vnet": "lab"}]
    auto = coerce(
        {
            "vms_config": [
                {
                    "vm_source_config": {"existing_vm_template_tag": "debian"},
                    "nics": [{"vnet_alias": "lab"}],
                },
                {"vm_source_config": {"existing_vm_template_tag": "debian"}},
            ]
        }
    )
    req = create_request(auto, "t")
    assert req["vms"][0]["nics"] == [{"vnet": "lab"}]
    assert "nics" not in req["vms"][1] and "networks" not in req and auto.networks == ()


@pytest.mark.parametrize("sdn", ["auto", None, "own"])
def test_no_network_vm_converts_with_any_sdn_config(sdn: Any) -> None:
    """``nics=[]`` is a VM without network access whatever the sdn_config
    (``"auto"``, ``None``, the config's own vnets): the daemon's
    ``no_network``, beside a VM with a NIC."""
    sdn_config = README_FULL["sdn_config"] if sdn == "own" else sdn
    nic = {"vnet_alias": "my special vnet" if sdn == "own" else "lab"}
    vms = [
        {"vm_source_config": {"existing_vm_template_tag": "debian"}, "name": "box", "nics": []},
        {"vm_source_config": {"existing_vm_template_tag": "debian"}, "name": "net", "nics": [nic]},
    ]
    d: dict[str, Any] = {"vms_config": vms}
    if sdn != "auto":
        d["sdn_config"] = sdn_config
    cfg = coerce(d)
    box, other = create_request(cfg, "t")["vms"]
    assert box["no_network"] is True and "networks" not in box and "nics" not in box
    assert "no_network" not in other


def test_readme_full_example_ova_converts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full example's OVA VM (a Windows 10 guest from
    ./tests/oVirtTinyCore64-13.11.ova) converts: the template named as the
    reference tags the file, os_type passed to the VM and to the import
    without boot (every disk of it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    ova = make_ova(tmp_path / "tests" / "oVirtTinyCore64-13.11.ova")
    vm = coerce({"vms_config": [README_FULL["vms_config"][1]]}).resolved_vms()[0]
    assert vm.template == f"ova-ovirttinycore64-13-11-ova-{ova.stat().st_size}"
    assert vm.os_type == "win10"
    assert vm.ova is not None and vm.ova.import_only and vm.ova.os_type == "win10"


def test_readme_windows_sandbox_converts() -> None:
    """The README's "Windows VMs" config (a Windows 11 sandbox VM from a
    tagged template, UEFI, 8 GiB) converts: a sandbox VM of os_type win11
    (its exec and file calls go through the daemon's Windows guest
    client), the tag as the template's name, UEFI as the daemon's
    firmware, the reference's vcpus default."""
    cfg = coerce(
        _one_vm(
            {
                "vm_source_config": {"existing_vm_template_tag": "your-tag"},
                "os_type": "win11",
                "uefi_boot": True,
                "is_sandbox": True,
                "ram_mb": 8192,
            }
        )
    )
    assert isinstance(cfg, PveInspectSandboxEnvironmentConfig)
    (vm,) = cfg.vms
    assert (vm.template, vm.os_type, vm.firmware, vm.sandbox) == ("your-tag", "win11", "uefi", True)
    assert (vm.memory_mib, vm.cores) == (8192, 2)
    assert vm.is_windows() and cfg.windows_working_dir == "C:\\"


def test_readme_first_vm_and_static_address_convert() -> None:
    """The full example's first VM with its vnet as the README writes it
    (and so the README's "Static IP Address Assignment" snippet, the same
    nic) converts: the built-in template by its name, the vnet as a network
    of the sandbox with its DHCP range .50-.100 passed on, the fixed MAC
    and address on it (outside the range), UEFI as the daemon's firmware,
    the reference's defaults written out sending nothing."""
    # romeo is not a sandbox and a sample needs one: the README's own
    # plain built-in VM beside it
    config = _one_vm(README_FULL["vms_config"][0], README_FULL["sdn_config"])
    config["vms_config"].append({"vm_source_config": {"built_in": "ubuntu24.04"}})
    cfg = coerce(config)
    assert isinstance(cfg, PveInspectSandboxEnvironmentConfig)
    vm, plain = cfg.vms
    assert plain.template == "ubuntu24.04" and plain.sandbox
    assert vm.template == "ubuntu24.04" and vm.name == "romeo" and not vm.sandbox
    # is_sandbox=False without a healthcheck: the reference's VM whose
    # agent "need not be installed", the daemon's agent false
    assert not vm.agent and plain.agent
    assert (vm.memory_mib, vm.cores) == (512, 4)
    assert vm.firmware == "uefi" and vm.cpu is None and vm.disk_controller is None
    (net,) = cfg.networks
    assert (net.cidr, net.dhcp, net.snat) == ("192.168.20.0/24", True, True)
    assert net.request()["dhcp_ranges"] == [{"start": "192.168.20.50", "end": "192.168.20.100"}]
    assert vm.nics is not None
    (nic,) = vm.nics
    assert (nic.network, nic.mac, nic.ipv4) == (net.name, "00:16:3D:1D:EB:A0", "192.168.20.10")


def test_readme_existing_vnets_convert() -> None:
    """The README's "Using Existing Proxmox VNETs" config (``sdn_config=None``,
    a NIC by ``vnet_alias``) converts: the VM's NIC names the alias as a
    shared vnet (the daemon matches a vnet its operator shares by Proxmox
    alias or id, and refuses at task start, field named, one it does not
    share), the sandbox asks no networks of its own beyond the daemon's
    default and no egress policy; the create request carries the NIC as
    ``{"vnet": alias}``."""
    cfg = coerce(
        {
            "vms_config": [
                {
                    "vm_source_config": {"built_in": "ubuntu24.04"},
                    "nics": [{"vnet_alias": "existing-vnet-alias"}],
                }
            ],
            "sdn_config": None,
        }
    )
    assert isinstance(cfg, PveInspectSandboxEnvironmentConfig)
    (vm,) = cfg.vms
    assert vm.template == "ubuntu24.04" and vm.networks is None
    assert vm.nics is not None
    (nic,) = vm.nics
    assert (nic.network, nic.vnet, nic.mac, nic.ipv4) == (None, "existing-vnet-alias", None, None)
    assert cfg.networks == () and cfg.egress is None
    req = create_request(cfg, "t")
    assert req["vms"][0]["nics"] == [{"vnet": "existing-vnet-alias"}]
    assert "networks" not in req and "egress" not in req


@solver
def _look_at_links() -> Solver:
    """Each VM's network interfaces (``ls /sys/class/net``), through
    Inspect's sandbox exec, into the sample's store; the VM without
    network's answer is the sample's output."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        links = {}
        for name in ("box", "vault"):
            res = await sandbox(name).exec(["ls", "/sys/class/net"])
            assert res.success, res.stderr
            links[name] = res.stdout.split()
        state.store.set("links", links)
        state.output.completion = " ".join(links["vault"])
        return state

    return solve


def test_no_network_vm_runs_on_the_playground(tmp_path: Path) -> None:
    """The reference's VM "with no network access" (``nics=[]``) beside a
    VM on the sample's network (``sdn_config="auto"``), with only the
    sandbox type changed: the sample runs, Inspect's exec reaches both, and
    the VM without network has the loopback only while its sibling has a
    NIC."""
    need_bed()
    debian = VmSourceConfig(existing_vm_template_tag="debian")
    config = ProxmoxSandboxEnvironmentConfig(
        vms_config=(
            VmConfig(vm_source_config=debian, name="box"),
            VmConfig(vm_source_config=debian, name="vault", nics=()),
        )
    )
    task = Task(
        dataset=[Sample(input="which links", target="lo")],
        solver=_look_at_links(),
        scorer=match(),
        sandbox=SandboxEnvironmentSpec(type="pve_inspect", config=config),
    )
    logs = inspect_eval(tasks=[task], model="mockllm/model", log_dir=str(tmp_path), display="none")
    log = logs[0]
    assert log.status == "success", log.error
    assert log.samples is not None
    links = log.samples[0].store.get("links")
    assert isinstance(links, dict), log.samples[0].store
    assert links["vault"] == ["lo"], links
    assert "lo" in links["box"] and len(links["box"]) > 1, links


def ctf4_config(ova: Path) -> dict[str, Any]:
    """The reference's CTF config (src/proxmoxsandbox/experimental/ctf4.py)
    as text, its victim's OVA the file ova."""
    return {
        "vms_config": [
            {
                "vm_source_config": {"built_in": "kali2025.4"},
                "name": "agent",
                "nics": [{"vnet_alias": "ctf4_net"}],
            },
            {
                "vm_source_config": {"ova": str(ova)},
                "name": "victim",
                "disk_controller": "ide",
                "nic_controller": "e1000",
                "is_sandbox": False,
                "nics": [{"vnet_alias": "ctf4_net"}],
            },
        ],
        "sdn_config": {
            "vnet_configs": [
                {
                    "alias": "ctf4_net",
                    "subnets": [
                        {
                            "cidr": "192.168.20.0/24",
                            "gateway": "192.168.20.1",
                            "snat": True,
                            "dhcp_ranges": [{"start": "192.168.20.50", "end": "192.168.20.100"}],
                        }
                    ],
                }
            ]
        },
    }


def test_reference_ctf4_converts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's CTF example (src/proxmoxsandbox/experimental/ctf4.py)
    with only the sandbox type changed: a Kali agent and a LAMPSecurity
    victim from an OVA on the eval machine, ``disk_controller="ide"``,
    ``nic_controller="e1000"``, ``is_sandbox=False``, both on one vnet with
    SNAT and a DHCP range. It converts: the victim is the daemon's VM
    without a guest agent (``agent: false``) on ide and e1000, built from
    the uploaded OVA, on the sample's network beside the agent; only the
    agent is an Inspect environment. (The node must allow e1000, ``[api]
    allow_e1000``: the daemon's to check at task start.)"""
    monkeypatch.chdir(tmp_path)
    ova = make_ova(tmp_path / "ctf4.ova")
    cfg = coerce(ctf4_config(ova))
    agent, victim = cfg.resolved_vms()
    assert (agent.template, agent.sandbox, agent.agent) == ("kali2025.4", True, True)
    assert victim.template == f"ova-ctf4-ova-{ova.stat().st_size}"
    assert (victim.sandbox, victim.agent) == (False, False)
    # the OVA's template is imported without boot, its disks on ide, as the
    # reference imports it; the clone keeps them (nothing asked of it)
    assert victim.ova is not None
    assert (victim.ova.import_only, victim.ova.disk_bus) == (True, "ide")
    body = create_request(cfg, "ctf4")
    a, v = body["vms"]
    assert "agent" not in a and a["networks"] == ["net0"]
    assert "disk_controller" not in v
    assert {k: v[k] for k in ("agent", "nic_controller", "networks")} == {
        "agent": False,
        "nic_controller": "e1000",
        "networks": ["net0"],
    }
    assert body["networks"][0]["dhcp_ranges"] == [
        {"start": "192.168.20.50", "end": "192.168.20.100"}
    ]


def test_reference_models_take_its_typed_values(tmp_path: Path) -> None:
    """The drop-in models take the values the reference's schema types as
    objects, as ctf4.py passes them (``cidr=ip_network(...)``,
    ``gateway`` and the range's ends as ``ip_address(...)``, ``ova`` a
    ``Path``; test_ctf4.py's task is written so), and convert as their
    text does; a NIC's ``ipv4`` too."""
    ova = make_ova(tmp_path / "ctf4.ova")
    typed = ctf4(ova).sandbox
    assert typed is not None
    assert coerce(typed.config) == coerce(ctf4_config(ova))
    nic = VmNicConfig(vnet_alias="lab", mac="52:54:00:12:34:56", ipv4=ip_address("10.9.0.5"))
    assert nic.model_dump(mode="json")["ipv4"] == "10.9.0.5"
