"""The config without a daemon: this provider's own, the reference
plugin's shape converted, and every field it cannot honour refused by name."""

from __future__ import annotations

from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from inspect_pve_inspect import (
    ConfigError,
    HealthCheck,
    NicSpec,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
    VmSpec,
)
from inspect_pve_inspect.compat import (
    DhcpRange,
    ProxmoxSandboxEnvironmentConfig,
    SdnConfig,
    SubnetConfig,
    VmConfig,
    VmNicConfig,
    VmSourceConfig,
    VnetConfig,
    coerce,
)
from inspect_pve_inspect.config import nodes_from_env
from inspect_pve_inspect.sandbox import LABEL_PROVIDER, create_request


def ref_vm(**kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"vm_source_config": {"existing_vm_template_tag": "debian"}}
    d.update(kw)
    return d


def lab(**subnet: Any) -> dict[str, Any]:
    sn = {
        "cidr": "172.31.250.0/24",
        "gateway": "172.31.250.1",
        "snat": False,
        "dhcp_ranges": [{"start": "172.31.250.10", "end": "172.31.250.254"}],
    }
    sn.update(subnet)
    return {"vnet_configs": [{"alias": "my lab", "subnets": [sn]}]}


def test_reference_dhcp_ranges_pass_through() -> None:
    """A subnet's dhcp_ranges go to the daemon's network as written, in
    order; the daemon's plan written out is passed on the same way; an
    empty list is a network without DHCP and sends none."""
    ranges = [
        {"start": "172.31.250.200", "end": "172.31.250.210"},
        {"start": "172.31.250.50", "end": "172.31.250.100"},
    ]
    plan = [{"start": "172.31.250.10", "end": "172.31.250.254"}]
    for given, dhcp in [(ranges, True), (plan, True), ([], False)]:
        cfg = coerce({"sdn_config": lab(dhcp_ranges=given), "vms_config": [ref_vm()]})
        (net,) = cfg.networks
        req = net.request()
        want: dict[str, Any] = {
            "name": "net0",
            "cidr": "172.31.250.0/24",
            "dhcp": dhcp,
            "snat": False,
        }
        if given:
            want["dhcp_ranges"] = given
        assert req == want, given


def test_reference_shape_converts() -> None:
    cfg = PveInspectSandboxEnvironment.config_deserialize(
        {
            "sdn_config": lab(),
            "vms_config": [
                ref_vm(name="attacker", ram_mb=4096, vcpus=2, nics=[{"vnet_alias": "my lab"}]),
                ref_vm(name="router", is_sandbox=False),
            ],
        }
    )
    assert isinstance(cfg, PveInspectSandboxEnvironmentConfig)
    assert [v.name for v in cfg.vms] == ["attacker", "router"]
    assert cfg.vms[0].memory_mib == 4096 and cfg.vms[0].cores == 2
    assert cfg.vms[0].networks == ("net0",) and cfg.vms[1].networks is None
    assert not cfg.vms[1].sandbox
    (net,) = cfg.networks
    assert (net.name, net.cidr, net.dhcp, net.snat) == ("net0", "172.31.250.0/24", True, False)
    # The reference's defaults (2048 MiB, 2 vCPUs) are kept as they are.
    d = coerce({"vms_config": [ref_vm()]})
    assert (d.vms[0].memory_mib, d.vms[0].cores, d.networks) == (2048, 2, ())


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"vms_config": [ref_vm(uefi_boot="yes")]}, "vms_config[0].uefi_boot"),
        ({"vms_config": [ref_vm(firewall="yes")]}, "vms_config[0].firewall"),
        ({"vms_config": [ref_vm(nic_controller="rtl8139")]}, "vms_config[0].nic_controller"),
        ({"vms_config": [ref_vm(vga="std")]}, "vms_config[0].vga"),
        ({"vms_config": [ref_vm(tablet=True)]}, "vms_config[0].tablet"),
        (
            {
                "sdn_config": lab(),
                "vms_config": [ref_vm(nics=[{"vnet_alias": "my lab", "vlan_tag": 5}])],
            },
            "vms_config[0].nics[0].vlan_tag",
        ),
        (
            {
                "sdn_config": {"vnet_configs": [{**lab()["vnet_configs"][0], "vlan_aware": True}]},
                "vms_config": [ref_vm()],
            },
            "sdn_config.vnet_configs[0].vlan_aware",
        ),
        ({"vms_config": [ref_vm(depends_on=["nope"])]}, "vms_config[0].depends_on"),
        ({"vms_config": [ref_vm(name="a", depends_on=["a"])]}, "vms_config[0].depends_on"),
        (
            {
                "vms_config": [
                    ref_vm(name="a", depends_on=["b"]),
                    ref_vm(name="b", depends_on=["a"]),
                ]
            },
            "vms_config",
        ),
        ({"vms_config": [ref_vm(healthcheck={"test": []})]}, "vms_config[0]"),
        ({"vms_config": [ref_vm(healthcheck={"test": ["true"], "retries": 0})]}, "vms_config[0]"),
        ({"vms_config": [ref_vm(cpu="custom-fast")]}, "vms_config[0].cpu"),
        ({"vms_config": [ref_vm(cpu="host,flags=+vmx")]}, "vms_config[0].cpu"),
        ({"vms_config": [ref_vm(os_type="wxp", is_sandbox=False)]}, "vms_config[0].os_type"),
        ({"vms_config": [ref_vm(os_type="other")]}, "vms_config[0].os_type"),
        ({"vms_config": [ref_vm(disk_controller="sata")]}, "vms_config[0].disk_controller"),
        ({"vms_config": [ref_vm(is_sandbox="no")]}, "vms_config[0].is_sandbox"),
        ({"vms_config": [ref_vm(await_before_next_vm=True)]}, "vms_config[0].await_before_next_vm"),
        (
            {"vms_config": [{"vm_source_config": {"built_in": "ubuntu22.04"}}]},
            "vms_config[0].vm_source_config.built_in",
        ),
        (
            {"vms_config": [{"vm_source_config": {"ova": "/x.ova"}}]},
            "vms_config[0].vm_source_config.ova",
        ),
        # an alias none of the config's vnets has names an existing
        # (shared) vnet, which takes no fixed MAC, address or VLAN
        (
            {
                "sdn_config": lab(),
                "vms_config": [ref_vm(nics=[{"vnet_alias": "nope", "mac": "02:00:00:00:00:01"}])],
            },
            "vms_config[0].nics[0].mac",
        ),
        (
            {"sdn_config": lab(), "vms_config": [ref_vm(nics=[{"vnet_alias": ""}])]},
            "vms_config[0].nics[0].vnet_alias",
        ),
        (
            {
                "sdn_config": lab(),
                "vms_config": [ref_vm(nics=[{"vnet_alias": "my lab", "mac": "01:16:3d:1d:eb:a0"}])],
            },
            "vms_config[0].nics[0].mac",
        ),
        (
            {
                "sdn_config": lab(),
                "vms_config": [ref_vm(nics=[{"vnet_alias": "my lab", "ipv4": "172.31.251.5"}])],
            },
            "vms_config[0].nics[0].ipv4",
        ),
        (
            {
                "sdn_config": lab(),
                "vms_config": [ref_vm(nics=[{"vnet_alias": "my lab", "ipv4": "172.31.250.1"}])],
            },
            "vms_config[0].nics[0].ipv4",
        ),
        (
            {
                "sdn_config": lab(),
                "vms_config": [
                    ref_vm(name="a", nics=[{"vnet_alias": "my lab", "ipv4": "172.31.250.5"}]),
                    ref_vm(name="b", nics=[{"vnet_alias": "my lab", "ipv4": "172.31.250.5"}]),
                ],
            },
            "vms_config[1].nics[0].ipv4",
        ),
        (
            {
                "sdn_config": lab(),
                "vms_config": [ref_vm(nics=[{"vnet_alias": "my lab", "vlan_tag": 5}])],
            },
            "vms_config[0].nics[0].vlan_tag",
        ),
        # sdn_config "auto" has no aliases: every alias names an existing vnet
        (
            {"vms_config": [ref_vm(nics=[{"vnet_alias": "x", "ipv4": "10.0.0.5"}])]},
            "vms_config[0].nics[0].ipv4",
        ),
        # sdn_config None: existing (shared) vnets, named in every VM's nics
        # (nics=[]: a VM without network access)
        ({"sdn_config": None, "vms_config": [ref_vm()]}, "vms_config[0].nics"),
        (
            {
                "sdn_config": None,
                "vms_config": [ref_vm(nics=[{"vnet_alias": "lab", "ipv4": "10.0.0.5"}])],
            },
            "vms_config[0].nics[0].ipv4",
        ),
        (
            {
                "sdn_config": None,
                "vms_config": [ref_vm(nics=[{"vnet_alias": "lab", "mac": "02:00:00:00:00:01"}])],
            },
            "vms_config[0].nics[0].mac",
        ),
        (
            {
                "sdn_config": None,
                "vms_config": [ref_vm(nics=[{"vnet_alias": "lab", "vlan_tag": 5}])],
            },
            "vms_config[0].nics[0].vlan_tag",
        ),
        (
            {"sdn_config": lab(gateway="172.31.250.254"), "vms_config": [ref_vm()]},
            "sdn_config.vnet_configs[0].subnets[0].gateway",
        ),
        (
            {
                "sdn_config": lab(dhcp_ranges=[{"start": "172.31.250.1", "end": "172.31.250.60"}]),
                "vms_config": [ref_vm()],
            },
            "sdn_config.vnet_configs[0].subnets[0].dhcp_ranges[0]",
        ),
        (
            {
                "sdn_config": lab(
                    dhcp_ranges=[
                        {"start": "172.31.250.50", "end": "172.31.250.60"},
                        {"start": "172.31.250.70", "end": "172.31.250.60"},
                    ]
                ),
                "vms_config": [ref_vm()],
            },
            "sdn_config.vnet_configs[0].subnets[0].dhcp_ranges[1]",
        ),
        (
            {
                "sdn_config": lab(dhcp_ranges=[{"start": "172.31.250.50", "end": "172.31.251.60"}]),
                "vms_config": [ref_vm()],
            },
            "sdn_config.vnet_configs[0].subnets[0].dhcp_ranges[0]",
        ),
        (
            {
                "sdn_config": lab(
                    dhcp_ranges=[
                        {"start": f"172.31.250.{i}", "end": f"172.31.250.{i}"}
                        for i in range(50, 55)
                    ]
                ),
                "vms_config": [ref_vm()],
            },
            "sdn_config.vnet_configs[0].subnets[0].dhcp_ranges",
        ),
        (
            {
                "sdn_config": lab(cidr="8.8.8.0/24", gateway="8.8.8.1", dhcp_ranges=[]),
                "vms_config": [ref_vm()],
            },
            "sdn_config.vnet_configs[0].subnets[0].cidr",
        ),
        (
            {"sdn_config": {**lab(), "use_pve_ipam_dnsnmasq": False}, "vms_config": [ref_vm()]},
            "sdn_config.use_pve_ipam_dnsnmasq",
        ),
        ({"instance_pool_id": "ami-1", "vms_config": [ref_vm()]}, "instance_pool_id"),
        ({"vms_config": []}, "vms_config"),
    ],
)
def test_reference_shape_refuses_what_it_cannot_honour(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        coerce(config)
    assert e.value.field == field, str(e.value)


def test_reference_static_addresses() -> None:
    """The reference's VmNicConfig(mac=, ipv4=) becomes the VM's nics, sent
    as the create's nics; a NIC without either stays a network name."""
    cfg = coerce(
        {
            "sdn_config": lab(),
            "vms_config": [
                ref_vm(
                    name="web",
                    nics=[
                        {"vnet_alias": "my lab", "mac": "52:54:00:12:34:5a", "ipv4": "172.31.250.5"}
                    ],
                ),
                ref_vm(name="db", nics=[{"vnet_alias": "my lab", "ipv4": "172.31.250.10"}]),
                ref_vm(name="cli", nics=[{"vnet_alias": "my lab"}]),
            ],
        }
    )
    web, db, cli = cfg.vms
    assert web.networks is None and web.nics == (
        NicSpec(network="net0", mac="52:54:00:12:34:5A", ipv4="172.31.250.5"),
    )
    assert db.nics == (NicSpec(network="net0", ipv4="172.31.250.10"),)
    assert cli.nics is None and cli.networks == ("net0",)
    req = create_request(cfg, "t")
    assert req["vms"][0]["nics"] == [
        {"network": "net0", "mac": "52:54:00:12:34:5A", "ipv4": "172.31.250.5"}
    ]
    assert req["vms"][1]["nics"] == [{"network": "net0", "ipv4": "172.31.250.10"}]
    assert "nics" not in req["vms"][2] and req["vms"][2]["networks"] == ["net0"]


def test_reference_static_address_on_subnet_without_dhcp_ranges() -> None:
    """The reference's SubnetConfig without dhcp_ranges (valid there beside
    another subnet with some, as its use_pve_ipam_dnsnmasq check wants)
    with a VmNicConfig(mac=, ipv4=) on it converts: a network of dhcp off
    (a Proxmox subnet without a dhcp-range, whose mapped MACs the zone's
    dnsmasq serves: pve-network Vnets.pm add_dhcp_mapping, Dnsmasq.pm
    configure_subnet), the fixed MAC and address sent as the VM's nics; a
    sibling on it without either stays a network name."""

    def vm(name: str, *nics: VmNicConfig) -> VmConfig:
        src = VmSourceConfig(existing_vm_template_tag="debian")
        return VmConfig(vm_source_config=src, name=name, nics=nics)

    def vnet(alias: str, cidr: str, *ranges: DhcpRange) -> VnetConfig:
        net = ip_network(cidr)
        sn = SubnetConfig(cidr=net, gateway=net[1], snat=True, dhcp_ranges=ranges)
        return VnetConfig(alias=alias, subnets=(sn,))

    fixed = VmNicConfig(vnet_alias="dark", mac="52:54:00:12:34:5b", ipv4=ip_address("10.8.0.2"))
    ref = ProxmoxSandboxEnvironmentConfig(
        vms_config=(
            vm("web", fixed),
            vm("cli", VmNicConfig(vnet_alias="dark"), VmNicConfig(vnet_alias="lan")),
        ),
        sdn_config=SdnConfig(
            vnet_configs=(
                vnet("dark", "10.8.0.0/24"),
                vnet("lan", "10.9.0.0/24", DhcpRange(start="10.9.0.50", end="10.9.0.100")),
            )
        ),
    )
    cfg = coerce(ref)
    dark, lan = cfg.networks
    assert (dark.cidr, dark.dhcp, dark.dhcp_ranges, lan.dhcp) == ("10.8.0.0/24", False, (), True)
    web, cli = cfg.vms
    assert web.networks is None and web.nics == (
        NicSpec(network=dark.name, mac="52:54:00:12:34:5B", ipv4="10.8.0.2"),
    )
    assert cli.nics is None and cli.networks == (dark.name, lan.name)
    req = create_request(cfg, "t")
    assert req["networks"][0] == {
        "name": dark.name,
        "cidr": "10.8.0.0/24",
        "dhcp": False,
        "snat": True,
    }
    assert req["vms"][0]["nics"] == [
        {"network": dark.name, "mac": "52:54:00:12:34:5B", "ipv4": "10.8.0.2"}
    ]


def test_native_fixed_address_without_dhcp() -> None:
    """This provider's own config takes a fixed address on a network of
    dhcp off, and sends it."""
    cfg = PveInspectSandboxEnvironmentConfig.model_validate(
        {
            "vms": [{"template": "d", "nics": [{"network": "dark", "ipv4": "10.8.0.5"}]}],
            "networks": [{"name": "dark", "cidr": "10.8.0.0/24", "dhcp": False}],
        }
    )
    req = create_request(cfg, "t")
    assert req["vms"][0]["nics"] == [{"network": "dark", "ipv4": "10.8.0.5"}]
    assert req["networks"] == [{"name": "dark", "cidr": "10.8.0.0/24", "dhcp": False, "snat": True}]


def test_container_member_in_request() -> None:
    cfg = PveInspectSandboxEnvironmentConfig.model_validate(
        {
            "vms": [
                {"template": "debian", "name": "attacker"},
                {"template": "ct-debian", "name": "target", "kind": "lxc", "memory_mib": 512},
            ]
        }
    )
    req = create_request(cfg, "t")
    assert "kind" not in req["vms"][0]
    assert req["vms"][1] == {
        "kind": "lxc",
        "template": "ct-debian",
        "name": "target",
        "memory_mib": 512,
    }


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"template": "c", "kind": "lxc", "disk_gib": 4}, "disk_gib"),
        (
            {"template": "c", "kind": "lxc", "nics": [{"network": "net0", "ipv4": "10.9.0.5"}]},
            "fixed",
        ),
        ({"template": "c", "kind": "kvm"}, "kind"),
    ],
)
def test_container_member_refused(spec: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VmSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("vms", "networks", "match"),
    [
        ([{"template": "d", "networks": ["lan"], "nics": [{"network": "lan"}]}], None, "not both"),
        (
            [{"template": "d", "nics": [{"network": "lan", "mac": "00:00:00:00:00:00"}]}],
            None,
            "mac",
        ),
        ([{"template": "d", "nics": [{"network": "lan", "ipv4": "10.9.0.256"}]}], None, "ipv4"),
        ([{"template": "d", "nics": [{"network": "dmz"}]}], None, "no network named 'dmz'"),
        ([{"template": "d", "nics": [{"network": "net0", "ipv4": "10.9.0.5"}]}], [], "auto"),
        (
            [{"template": "d", "nics": [{"network": "lan", "ipv4": "10.9.0.255"}]}],
            None,
            "broadcast",
        ),
        (
            [{"template": "d", "nics": [{"network": "lan", "ipv4": "10.9.0.0"}]}],
            None,
            "own address",
        ),
        (
            [
                {
                    "template": "d",
                    "name": "a",
                    "nics": [{"network": "lan", "mac": "02:00:00:00:00:0a"}],
                },
                {
                    "template": "d",
                    "name": "b",
                    "nics": [{"network": "lan", "mac": "02:00:00:00:00:0A"}],
                },
            ],
            None,
            r"vms\[1\]\.nics\[0\]\.mac",
        ),
        (
            [{"template": "d", "nics": [{"network": "dark", "ipv4": "10.8.0.1"}]}],
            [{"name": "dark", "cidr": "10.8.0.0/24", "dhcp": False}],
            "gateway",
        ),
    ],
)
def test_native_fixed_nics_refused(
    vms: list[dict[str, Any]], networks: list[dict[str, Any]] | None, match: str
) -> None:
    nets = [{"name": "lan", "cidr": "10.9.0.0/24"}] if networks is None else networks
    with pytest.raises(ValueError, match=match):
        PveInspectSandboxEnvironmentConfig.model_validate({"vms": vms, "networks": nets})


def test_native_config_and_request(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = PveInspectSandboxEnvironmentConfig.model_validate(
        {
            "vms": [{"template": "kali", "name": "attacker", "cores": 2}, {"template": "debian"}],
            "egress": {"mode": "allowlist", "allow": ["pypi.org"]},
            "ttl_seconds": 3600,
            "labels": {"eval": "ctf"},
        }
    )
    assert hash(cfg) == hash(cfg.model_copy())
    req = create_request(cfg, "my task")
    assert req["vms"] == [
        {"template": "kali", "name": "attacker", "cores": 2},
        {"template": "debian"},
    ]
    assert req["egress"] == {"mode": "allowlist", "allow": ["pypi.org"]}
    assert req["ttl_seconds"] == 3600
    assert req["labels"]["eval"] == "ctf" and req["labels"][LABEL_PROVIDER] == "pve_inspect"
    assert req["labels"]["inspect.task"] == "my task"
    with pytest.raises(ValueError, match="extra"):
        PveInspectSandboxEnvironmentConfig.model_validate({"vmz": []})
    with pytest.raises(ValueError, match="allowlist"):
        PveInspectSandboxEnvironmentConfig.model_validate(
            {"egress": {"mode": "none", "allow": ["x"]}}
        )
    with pytest.raises(ValueError, match="sandbox"):
        PveInspectSandboxEnvironmentConfig(vms=(VmSpec(template="debian", sandbox=False),))
    for reserved in ("localhost", "ip6-allnodes"):
        with pytest.raises(ValueError, match="loopback"):
            VmSpec(template="debian", name=reserved)
    assert VmSpec(template="debian", name="localhost1").name == "localhost1"
    monkeypatch.setenv("PVE_INSPECT_TEMPLATE", "kali")
    assert PveInspectSandboxEnvironmentConfig().resolved_vms()[0].template == "kali"


def test_nodes_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "PVE_INSPECT_URL", "https://10.0.0.1:8443, https://10.0.0.2:8443 unix:///run/x.sock"
    )
    monkeypatch.setenv("PVE_INSPECT_TOKEN", "pvei_secret")
    monkeypatch.setenv("PVE_INSPECT_CA_FILE", "/etc/ca.pem")
    nodes = nodes_from_env()
    assert [n.url for n in nodes] == [
        "https://10.0.0.1:8443",
        "https://10.0.0.2:8443",
        "unix:///run/x.sock",
    ]
    assert nodes[0].token is not None and nodes[0].token.get_secret_value() == "pvei_secret"
    assert "pvei_secret" not in repr(nodes[0])
    monkeypatch.setenv("PVE_INSPECT_URL", "https://a:1,https://b:2")
    monkeypatch.setenv("PVE_INSPECT_TOKEN", "ta,tb")
    monkeypatch.setenv("PVE_INSPECT_CA_FILE", "/a.pem /b.pem")
    a, b = nodes_from_env()
    assert a.token is not None and b.token is not None
    assert (a.token.get_secret_value(), a.ca_file, b.token.get_secret_value(), b.ca_file) == (
        "ta",
        "/a.pem",
        "tb",
        "/b.pem",
    )
    monkeypatch.setenv("PVE_INSPECT_TOKEN", "ta,tb,tc")
    with pytest.raises(ConfigError, match="3 entries for 2 URLs"):
        nodes_from_env()
    monkeypatch.setenv("PVE_INSPECT_URL", "")
    with pytest.raises(ConfigError) as e:
        nodes_from_env()
    assert e.value.field == "nodes"


def test_reference_effective_defaults_written_out_are_accepted() -> None:
    """Every field the reference has, at its default written out (and at the
    value the reference uses when the field is unset), converts; so do
    firewall=True (the guard's job here) and depends_on between VMs."""
    vm = ref_vm(
        name="default",
        ram_mb=2048,
        vcpus=2,
        nics=None,
        is_sandbox=True,
        uefi_boot=False,
        disk_controller="scsi",
        nic_controller="virtio",
        firewall=True,
        os_type="l26",
        vga="none",
        tablet=False,
        cpu="host",
        depends_on=[],
        healthcheck=None,
    )
    target = ref_vm(name="target", disk_controller=None, nic_controller=None, cpu=None)
    d = coerce(
        {
            "instance_pool_id": "default",
            "sdn_config": "auto",
            "vms_config": [vm, {**target, "depends_on": ["default"]}],
        }
    )
    assert [v.name for v in d.vms] == ["default", "target"]


def test_reference_healthcheck_converts() -> None:
    d = coerce(
        {
            "vms_config": [
                ref_vm(
                    name="web",
                    healthcheck={"test": ["sh", "-c", "true"], "interval": 0.5, "retries": 3},
                )
            ]
        }
    )
    hc = d.vms[0].healthcheck
    assert hc is not None
    assert (hc.test, hc.interval, hc.timeout, hc.retries, hc.start_period) == (
        ("sh", "-c", "true"),
        0.5,
        30,
        3,
        0,
    )


def test_reference_vm_options_map_to_the_daemons() -> None:
    """uefi_boot, cpu, os_type, disk_controller and nic_controller become
    the daemon's per-VM options in the create body; their defaults written
    out (cpu "host", disk_controller "scsi" included) send nothing (the
    template's, and the warm pool may serve them)."""
    d = coerce(
        {
            "vms_config": [
                ref_vm(name="attacker", uefi_boot=True, cpu="host", disk_controller="scsi"),
                ref_vm(name="old", cpu="qemu64"),
                ref_vm(name="target", os_type="win11", is_sandbox=False, cpu="x86-64-v3"),
                ref_vm(
                    name="plain",
                    uefi_boot=False,
                    os_type="l26",
                    nic_controller="virtio",
                    disk_controller=None,
                    cpu=None,
                ),
            ]
        }
    )
    body = create_request(d, "task")
    opts = ("firmware", "cpu", "os_type", "disk_controller", "nic_controller")
    got = [{k: v[k] for k in opts if k in v} for v in body["vms"]]
    assert got == [
        {"firmware": "uefi"},
        {"cpu": "qemu64"},
        {"cpu": "x86-64-v3", "os_type": "win11"},
        {},
    ]


def test_reference_defaults_written_out_send_no_vm_options() -> None:
    """A VM that writes out every reference default of the VM options sends
    none of the daemon's per-VM options, so the daemon may serve it from its
    warm pool (a VM with any of them set is built cold)."""
    vm = ref_vm(
        uefi_boot=False,
        os_type="l26",
        cpu="host",
        disk_controller="scsi",
        nic_controller="virtio",
    )
    body = create_request(coerce({"vms_config": [vm]}), "task")
    opts = {"firmware", "cpu", "os_type", "disk_controller", "nic_controller"}
    assert opts & set(body["vms"][0]) == set()


def test_native_vm_options() -> None:
    """The provider's own VmSpec takes the daemon's values (a Windows VM
    as a sandbox, with a healthcheck, too) and refuses options on a
    container."""
    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(
            VmSpec(template="debian", name="attacker"),
            VmSpec(template="win", name="target", os_type="win10", sandbox=False, firmware="uefi"),
        )
    )
    assert create_request(cfg, "t")["vms"][1]["os_type"] == "win10"
    win = VmSpec(
        template="win",
        os_type="win11",
        healthcheck=HealthCheck(test=("cmd.exe", "/c", "ver")),
    )
    assert win.sandbox and win.is_windows() and not cfg.vms[0].is_windows()
    with pytest.raises(ValueError, match="container"):
        VmSpec(template="ct", kind="lxc", cpu="host")
    with pytest.raises(ValueError):
        VmSpec.model_validate({"template": "d", "nic_controller": "rtl8139"})
    old = VmSpec(template="d", nic_controller="e1000", disk_controller="ide")
    assert (old.nic_controller, old.disk_controller) == ("e1000", "ide")


def test_reference_ctf_victim_converts() -> None:
    """The reference's CTF example (ctf4.py): a victim with is_sandbox=False,
    disk_controller="ide" and nic_controller="e1000" beside its attacker
    becomes a VM without a guest agent ("agent": false) of the daemon, on
    ide and e1000; the attacker is sent as any VM (no agent key). A VM with
    is_sandbox=False and a healthcheck keeps its agent (the check runs
    through it)."""
    cfg = coerce(
        {
            "sdn_config": lab(),
            "vms_config": [
                ref_vm(name="agent", nics=[{"vnet_alias": "my lab"}]),
                ref_vm(
                    name="victim",
                    disk_controller="ide",
                    nic_controller="e1000",
                    is_sandbox=False,
                    nics=[{"vnet_alias": "my lab"}],
                ),
                ref_vm(
                    name="web",
                    is_sandbox=False,
                    healthcheck={"test": ["true"]},
                    nics=[{"vnet_alias": "my lab"}],
                ),
            ],
        }
    )
    attacker, victim, web = create_request(cfg, "ctf4")["vms"]
    assert "agent" not in attacker and "nic_controller" not in attacker
    assert (victim["agent"], victim["disk_controller"], victim["nic_controller"]) == (
        False,
        "ide",
        "e1000",
    )
    assert victim["networks"] == ["net0"]
    assert "agent" not in web
    assert [v.agent for v in cfg.vms] == [True, False, True]
    assert [v.sandbox for v in cfg.vms] == [True, False, False]


def test_native_agent_rules() -> None:
    """agent=False in this provider's own shape: only for a VM that is no
    Inspect sandbox and has no healthcheck (both run through the agent),
    never on a container; sent as "agent": false."""
    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(
            VmSpec(template="kali", name="attacker"),
            VmSpec(template="victim", name="victim", sandbox=False, agent=False),
        )
    )
    assert create_request(cfg, "t")["vms"][1]["agent"] is False
    cases: list[tuple[dict[str, Any], str]] = [
        ({"agent": False}, "give sandbox=False too"),
        (
            {"agent": False, "sandbox": False, "healthcheck": HealthCheck(test=("true",))},
            "healthcheck runs through the guest agent",
        ),
        ({"agent": False, "sandbox": False, "kind": "lxc"}, "container"),
    ]
    for bad, why in cases:
        with pytest.raises(ValueError, match=why):
            VmSpec.model_validate({"template": "d", **bad})
    with pytest.raises(ValueError, match="at least one VM must be a sandbox"):
        PveInspectSandboxEnvironmentConfig(vms=(VmSpec(template="d", sandbox=False, agent=False),))


def test_native_no_network_rules() -> None:
    """no_network=True in this provider's own shape: a VM without any NIC,
    sent as "no_network": true with neither networks nor nics; it gives no
    networks or nics, and an empty networks or nics without it is refused
    (the daemon's default for no networks is the first network, never a VM
    without NICs by accident)."""
    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(
            VmSpec(template="kali", name="attacker"),
            VmSpec(template="debian", name="vault", no_network=True),
            VmSpec(template="debian", name="quiet", no_network=True, networks=()),
        )
    )
    a, vault, quiet = create_request(cfg, "t")["vms"]
    assert "no_network" not in a
    assert vault == {"template": "debian", "name": "vault", "no_network": True}
    assert quiet == {"template": "debian", "name": "quiet", "no_network": True}
    assert cfg.vms[1].network_names() == ()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"no_network": True, "networks": ["net0"]}, "give no networks or nics"),
        ({"no_network": True, "nics": [{"network": "net0"}]}, "give no networks or nics"),
        ({"networks": []}, "give no_network=True"),
        ({"nics": []}, "give no_network=True"),
    ]
    for bad, why in cases:
        with pytest.raises(ValueError, match=why):
            VmSpec.model_validate({"template": "d", **bad})
