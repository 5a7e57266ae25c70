"""``addresses()``: each VM's IPv4 addresses by network, the node's record
(Proxmox's IPAM through the daemon's API), the same address a sibling
resolves the VM's name to; a name the sandbox lacks is refused."""

from __future__ import annotations

import ipaddress

import pytest

from inspect_pve_inspect import PveInspectSandboxEnvironment

pytestmark = pytest.mark.anyio


async def test_addresses_are_what_siblings_resolve(
    two_vm_sample: dict[str, PveInspectSandboxEnvironment],
) -> None:
    a, b = two_vm_sample["a"], two_vm_sample["b"]
    of_b = a.addresses("b")
    assert list(of_b) == ["net0"] and len(of_b["net0"]) == 1, of_b
    ip = ipaddress.IPv4Address(of_b["net0"][0])
    assert b.addresses() == of_b and a.addresses() != of_b
    r = await a.exec(["getent", "hosts", "b"])
    assert r.success and r.stdout.split()[0] == str(ip), r
    with pytest.raises(ValueError, match="no VM 'c'"):
        a.addresses("c")
