"""The schemathesis hook that applies the create's stated cross-field rules
to generated valid bodies (no bed needed)."""

from __future__ import annotations

from typing import Any

from st_hooks import BED_VMS, MAX_ENV_BYTES, TEMPLATE, apply_create_rules


def test_names_made_unique_and_references_defined() -> None:
    body: dict[str, Any] = {
        "networks": [{"name": "a"}, {"name": "a"}, {"name": "b"}],
        "vms": [{"template": "x", "name": "vm1", "networks": ["a", "zz"]}, {"template": "y"}],
    }
    out = apply_create_rules(body)
    nets = [n["name"] for n in out["networks"]]
    assert len(set(nets)) == 3 and nets[0] == "a" and nets[2] == "b", nets
    vm0, vm1 = out["vms"]
    assert vm0["template"] == TEMPLATE == vm1["template"]
    assert vm0["networks"][0] == "a" and vm0["networks"][1] in nets, vm0
    # vm1 defaults to the name vm1, which vm0 holds: it is renamed
    assert vm1.get("name", "vm1") != "vm1", vm1


def test_no_networks_means_net0_and_bed_limits() -> None:
    body: dict[str, Any] = {
        "vms": [{"template": "t", "networks": ["q"], "disk_gib": 5}] * 1
        + [{"template": "t"} for _ in range(5)],
        "env": {f"K{i}": "x" * 4000 for i in range(40)},
    }
    out = apply_create_rules(body)
    assert len(out["vms"]) == BED_VMS
    assert out["vms"][0]["networks"] == ["net0"] and "disk_gib" not in out["vms"][0]
    assert sum(len(k) + len(v) for k, v in out["env"].items()) <= MAX_ENV_BYTES


def test_nic_rules() -> None:
    body: dict[str, Any] = {
        "networks": [{"name": "lan", "cidr": "10.9.0.0/24"}, {"name": "wan"}],
        "vms": [
            {
                "template": "t",
                "networks": ["lan"],
                "nics": [
                    {"network": "lan", "mac": "02:00:00:00:00:0a", "ipv4": "10.9.0.5"},
                    {"network": "zz", "ipv4": "10.9.0.6"},
                ],
            },
            {
                "template": "t",
                "nics": [
                    {"network": "lan", "mac": "02:00:00:00:00:0A", "ipv4": "10.9.0.5"},
                    {"network": "lan", "ipv4": "10.9.0.1"},
                ],
            },
        ],
    }
    vm0, vm1 = apply_create_rules(body)["vms"]
    assert "networks" not in vm0
    assert vm0["nics"][0] == {"network": "lan", "mac": "02:00:00:00:00:0a", "ipv4": "10.9.0.5"}
    # zz is not defined: lan (the first), where 10.9.0.6 is fine
    assert vm0["nics"][1] == {"network": "lan", "ipv4": "10.9.0.6"}
    # the MAC and the address are vm0's; the gateway is no fixed address
    assert vm1["nics"] == [{"network": "lan"}, {"network": "lan"}]
    # a network of dhcp off takes a fixed address too, an auto one none
    body = {
        "networks": [{"name": "dark", "cidr": "10.8.0.0/24", "dhcp": False}, {"name": "wan"}],
        "vms": [
            {
                "template": "t",
                "nics": [
                    {"network": "dark", "ipv4": "10.8.0.5"},
                    {"network": "wan", "ipv4": "10.8.0.6"},
                ],
            }
        ],
    }
    (vm,) = apply_create_rules(body)["vms"]
    assert vm["nics"] == [{"network": "dark", "ipv4": "10.8.0.5"}, {"network": "wan"}]


def test_container_takes_no_vm_options() -> None:
    """A container (kind lxc) takes no VM option: the hook drops them (the
    create refuses them, vms[i].cpu and the like), and keeps a VM's."""
    opts = {
        "firmware": "",
        "cpu": "qemu64",
        "os_type": "l26",
        "disk_controller": "",
        "nic_controller": "virtio",
        "agent": False,
    }
    body: dict[str, Any] = {
        "vms": [{"template": "t", **opts}, {"template": "t", "kind": "lxc", **opts}]
    }
    out = apply_create_rules(body)
    vm, ct = out["vms"]
    assert all(vm[k] == v for k, v in opts.items()), vm
    assert not any(k in ct for k in opts), ct


def test_agent_and_disk_rules() -> None:
    """env needs a VM with a guest agent: a body whose VMs all have agent
    false gets the first one's agent back; ide is dropped (the node's
    template has its disks on scsi); otherwise agent false stays."""
    body: dict[str, Any] = {
        "vms": [
            {"template": "t", "agent": False, "disk_controller": "ide"},
            {"template": "t", "agent": False},
        ],
        "env": {"K": "v"},
    }
    vm0, vm1 = apply_create_rules(body)["vms"]
    assert "agent" not in vm0 and vm1["agent"] is False
    assert "disk_controller" not in vm0
    body = {"vms": [{"template": "t", "agent": False}]}
    assert apply_create_rules(body)["vms"][0]["agent"] is False


def test_range_rules() -> None:
    """dhcp_ranges kept only where the stated rules hold: a fixed cidr with
    DHCP, ends inside it (not its network, broadcast or gateway address),
    in order, not overlapping, with room for the network's NICs."""
    r = [{"start": "10.9.0.50", "end": "10.9.0.50"}]
    body: dict[str, Any] = {
        "networks": [
            {"name": "ok", "cidr": "10.9.0.0/24", "dhcp_ranges": r},
            {"name": "auto", "dhcp_ranges": r},
            {"name": "off", "cidr": "10.9.0.0/24", "dhcp": False, "dhcp_ranges": r},
            {
                "name": "gw",
                "cidr": "10.9.0.0/24",
                "dhcp_ranges": [{"start": "10.9.0.1", "end": "10.9.0.9"}],
            },
            {
                "name": "back",
                "cidr": "10.9.0.0/24",
                "dhcp_ranges": [{"start": "10.9.0.9", "end": "10.9.0.8"}],
            },
            {"name": "ovl", "cidr": "10.9.0.0/24", "dhcp_ranges": r + r},
            {"name": "full", "cidr": "10.9.0.0/24", "dhcp_ranges": r},
        ],
        "vms": [
            {"template": "t", "networks": ["ok", "full"]},
            {"template": "t", "nics": [{"network": "full", "ipv4": "10.9.0.7"}]},
        ],
    }
    out = apply_create_rules(body)
    kept = [n["name"] for n in out["networks"] if "dhcp_ranges" in n]
    assert kept == ["ok"], kept


def test_prefix_room_without_dhcp() -> None:
    """A network of dhcp false with a fixed cidr keeps room for its NICs
    (each an address of the cidr while configured, a fixed one besides):
    a /28's 13 addresses hold 12 NICs of no fixed address, not 12 of which
    two are fixed (their addresses left out), nor 14 (the cidr made auto)."""
    nics = [{"network": "dark"} for _ in range(8)] + [
        {"network": "dark", "ipv4": "10.9.0.5"},
        {"network": "dark", "ipv4": "10.9.0.6"},
    ]
    body: dict[str, Any] = {
        "networks": [{"name": "dark", "cidr": "10.9.0.0/28", "dhcp": False}],
        "vms": [{"template": "t", "nics": nics}, {"template": "t", "networks": ["dark"] * 2}],
    }
    out = apply_create_rules(body)
    assert not any("ipv4" in n for n in out["vms"][0]["nics"]), out["vms"][0]["nics"]
    assert out["networks"][0]["cidr"] == "10.9.0.0/28", out["networks"]
    for more, cidr in ((4, None), (3, "10.9.2.0/28")):
        body = {
            "networks": [{"name": "many", "cidr": "10.9.2.0/28", "dhcp": False}],
            "vms": [
                {"template": "t", "networks": ["many"] * 10},
                {"template": "t", "networks": ["many"] * more},
            ],
        }
        assert apply_create_rules(body)["networks"][0].get("cidr") == cidr, (more, body)


def test_plan_room_with_dhcp() -> None:
    """A network with DHCP, a fixed cidr and no dhcp_ranges keeps room for
    its NICs in the daemon's range of the cidr (a /28's .2-.14, 13
    addresses; a /24's .10-.254): 12 NICs with two fixed inside it lose
    their fixed addresses, 14 make the cidr auto, 13 keep it."""
    nics = [{"network": "lan"} for _ in range(10)] + [
        {"network": "lan", "ipv4": "10.9.0.5"},
        {"network": "lan", "ipv4": "10.9.0.6"},
    ]
    body: dict[str, Any] = {
        "networks": [{"name": "lan", "cidr": "10.9.0.0/28"}],
        "vms": [{"template": "t", "nics": nics}],
    }
    out = apply_create_rules(body)
    assert not any("ipv4" in n for n in out["vms"][0]["nics"]), out["vms"][0]["nics"]
    assert out["networks"][0]["cidr"] == "10.9.0.0/28", out["networks"]
    for more, cidr in ((4, None), (3, "10.9.2.0/28")):
        body = {
            "networks": [{"name": "many", "cidr": "10.9.2.0/28"}],
            "vms": [
                {"template": "t", "networks": ["many"] * 10},
                {"template": "t", "networks": ["many"] * more},
            ],
        }
        assert apply_create_rules(body)["networks"][0].get("cidr") == cidr, (more, body)
    wide: dict[str, Any] = {
        "networks": [{"name": "w", "cidr": "10.9.3.0/24"}],
        "vms": [{"template": "t", "nics": [{"network": "w", "ipv4": "10.9.3.5"}]}],
    }
    assert apply_create_rules(wide)["vms"][0]["nics"][0].get("ipv4") == "10.9.3.5"


def test_no_network_rules() -> None:
    """A VM of no_network gives neither networks nor nics, and takes no
    address of a network's ranges (one address is room for the one VM on
    the first network beside it)."""
    r = [{"start": "10.9.0.50", "end": "10.9.0.50"}]
    for bad in ({"networks": ["lan"]}, {"nics": [{"network": "lan"}]}):
        body: dict[str, Any] = {
            "networks": [{"name": "lan", "cidr": "10.9.0.0/24", "dhcp_ranges": r}],
            "vms": [{"template": "t", "name": "a", "no_network": True, **bad}, {"template": "t"}],
        }
        out = apply_create_rules(body)
        a, c = out["vms"]
        assert "networks" not in a and "nics" not in a, a
        assert "networks" not in c and out["networks"][0]["dhcp_ranges"] == r, out
