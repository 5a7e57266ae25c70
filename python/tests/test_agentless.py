"""VMs without a guest agent (the reference's ``is_sandbox=False``, the
daemon's ``"agent": false``) through the provider against a fake daemon
(tests/fakenode.py, which refuses exec and file calls on such a VM as the
daemon does): a sample's sandbox of the reference's CTF shape starts with
the victim sent without an agent, only the attacker is an Inspect
environment, and nothing of the provider's own reaches the victim."""

from __future__ import annotations

from typing import Any

import pytest
from fakenode import FakeNode
from inspect_ai.util import SandboxEnvironment

from inspect_pve_inspect import NodeConfig, PveInspectSandboxEnvironment
from inspect_pve_inspect.compat import coerce

pytestmark = pytest.mark.anyio


def _ctf(**victim: Any) -> dict[str, Any]:
    """The reference's CTF config (ctf4.py's shape, the victim's template
    by tag), the victim's fields changed by victim."""
    nic = [{"vnet_alias": "ctf_net"}]
    v: dict[str, Any] = {
        "vm_source_config": {"existing_vm_template_tag": "victim"},
        "name": "victim",
        "disk_controller": "ide",
        "nic_controller": "e1000",
        "is_sandbox": False,
        "nics": nic,
    }
    v.update(victim)
    subnet = {
        "cidr": "192.168.20.0/24",
        "gateway": "192.168.20.1",
        "snat": True,
        "dhcp_ranges": [{"start": "192.168.20.50", "end": "192.168.20.100"}],
    }
    return {
        "vms_config": [
            {
                "vm_source_config": {"existing_vm_template_tag": "debian"},
                "name": "agent",
                "nics": nic,
            },
            v,
        ],
        "sdn_config": {"vnet_configs": [{"alias": "ctf_net", "subnets": [subnet]}]},
    }


async def _sample(fake: FakeNode, node: NodeConfig, config: dict[str, Any]) -> Any:
    fake.templates = ("debian", "victim")
    cfg = coerce(config).model_copy(update={"nodes": (node,)})
    envs: dict[str, SandboxEnvironment] = await PveInspectSandboxEnvironment.sample_init(
        "ctf", cfg, {}
    )
    return cfg, envs


async def test_ctf_victim_without_agent(fake_node: tuple[FakeNode, NodeConfig]) -> None:
    """The victim is created with agent false on ide and e1000; the sample
    has one environment, the attacker, whose working directory is made
    there; no exec or file call of the provider goes to the victim (the
    daemon would refuse it, 409)."""
    fake, node = fake_node
    cfg, envs = await _sample(fake, node, _ctf())
    try:
        assert sorted(envs) == ["agent"]
        (sb,) = fake.sandboxes.values()
        victim = sb.req["vms"][1]
        assert (victim["agent"], victim["disk_controller"], victim["nic_controller"]) == (
            False,
            "ide",
            "e1000",
        )
        assert "agent" not in sb.req["vms"][0]
        assert fake.no_agent_calls == []
        assert [v for v, _ in fake.execs] == ["agent"]
        env = envs["agent"]
        assert isinstance(env, PveInspectSandboxEnvironment)
        res = await env.exec(["nmap", "-sn", "192.168.20.0/24"])
        assert res.success
        assert fake.no_agent_calls == []
    finally:
        await PveInspectSandboxEnvironment.sample_cleanup("ctf", cfg, envs, False)
    assert fake.sandboxes == {}


async def test_ctf_victim_with_healthcheck_keeps_its_agent(
    fake_node: tuple[FakeNode, NodeConfig],
) -> None:
    """A victim with is_sandbox=False and a healthcheck keeps its agent:
    its healthcheck runs through the daemon's exec before the sample
    starts, and it is still no Inspect environment."""
    fake, node = fake_node
    cfg, envs = await _sample(fake, node, _ctf(healthcheck={"test": ["true"]}))
    try:
        assert sorted(envs) == ["agent"]
        (sb,) = fake.sandboxes.values()
        assert "agent" not in sb.req["vms"][1]
        assert ("victim", {"argv": ["true"]}) in [(v, {"argv": b["argv"]}) for v, b in fake.execs]
        assert fake.no_agent_calls == []
    finally:
        await PveInspectSandboxEnvironment.sample_cleanup("ctf", cfg, envs, False)
