"""Placement over several nodes by their free capacity (no bed needed for
the rules; the last test asks the bed daemon)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import need_bed
from pydantic import SecretStr

from inspect_pve_inspect import PveInspectSandboxEnvironment, placement
from inspect_pve_inspect.client import Client
from inspect_pve_inspect.config import NodeConfig, nodes_from_env


def cap(free: dict[str, int], sandbox: dict[str, int] | None = None) -> dict[str, Any]:
    return {"free": free, "sandbox": sandbox or {}, "free_sandboxes": 0}


UNLIMITED = {"sandboxes": -1, "vms": -1, "vcpus": -1, "memory_mib": -1}


def test_shape_fills_the_daemons_defaults() -> None:
    req = {"vms": [{"template": "debian"}, {"template": "debian", "cores": 4, "memory_mib": 512}]}
    assert placement.shape(req) == {"vms": 2, "vcpus": 5, "memory_mib": 1536}


@pytest.mark.parametrize(
    ("free", "per", "want"),
    [
        (UNLIMITED, None, math.inf),
        ({**UNLIMITED, "sandboxes": 3}, None, 3),
        ({**UNLIMITED, "vcpus": 5}, None, 2),  # 2 cores each
        ({**UNLIMITED, "memory_mib": 3000}, None, 1),  # 2048 each
        ({"sandboxes": 4, "vms": 4, "vcpus": 4, "memory_mib": 1000}, None, 0),
        (UNLIMITED, {"vcpus": 1}, 0),  # over the per-sandbox cap: fits nowhere
        (UNLIMITED, {"vcpus": 2, "vms": 2}, math.inf),  # at the cap
    ],
)
def test_fits_is_the_guards_rule(
    free: dict[str, int], per: dict[str, int] | None, want: float
) -> None:
    """The same cases as apitype.TestCapacityFits (Go): one VM pair of one
    core and 1024 MiB each."""
    assert placement.fits(cap(free, per), {"vms": 2, "vcpus": 2, "memory_mib": 2048}) == want


def _nodes(n: int) -> tuple[NodeConfig, ...]:
    return tuple(
        NodeConfig(url=f"https://node{i}.test:8443", token=SecretStr("t")) for i in range(n)
    )


@pytest.mark.anyio
async def test_rank_skips_down_and_full_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    rooms = {"https://node0.test:8443": None, "https://node1.test:8443": 0.0}
    rooms["https://node2.test:8443"] = 2.0
    rooms["https://node3.test:8443"] = 5.0

    async def probe(node: NodeConfig, want: Any) -> float | None:
        return rooms[node.url]

    monkeypatch.setattr(placement, "_probe", probe)
    ranked, full = await placement.rank(_nodes(4))
    assert [n.url for n in ranked] == ["https://node3.test:8443", "https://node2.test:8443"]
    assert full == 1


@pytest.mark.anyio
async def test_place_waits_while_every_node_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node full: the sample waits and asks again, and is placed once
    a node has room (the nodes bound how many samples run)."""
    asked: list[int] = []

    async def rank(nodes: Any, want: Any) -> tuple[list[NodeConfig], int]:
        asked.append(1)
        return (list(nodes), 0) if len(asked) >= 3 else ([], len(nodes))

    async def create(self: Client, req: dict[str, Any]) -> dict[str, Any]:
        return {"id": "sbx", "vms": []}

    monkeypatch.setattr(placement, "rank", rank)
    monkeypatch.setattr(placement, "PLACE_POLL", 0.01)
    monkeypatch.setattr(Client, "create", create)
    c, sb = await placement.place(_nodes(2), {"vms": [{"template": "debian"}]}, wait=5)
    await c.aclose()
    assert sb["id"] == "sbx" and len(asked) == 3


@pytest.mark.anyio
async def test_place_gives_up_when_all_are_down(monkeypatch: pytest.MonkeyPatch) -> None:
    async def rank(nodes: Any, want: Any) -> tuple[list[NodeConfig], int]:
        return [], 0

    monkeypatch.setattr(placement, "rank", rank)
    with pytest.raises(RuntimeError, match="2 of 2 down"):
        await placement.place(_nodes(2), {"vms": [{"template": "debian"}]}, wait=60)


@pytest.mark.anyio
async def test_place_gives_up_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    async def rank(nodes: Any, want: Any) -> tuple[list[NodeConfig], int]:
        return [], len(nodes)

    monkeypatch.setattr(placement, "rank", rank)
    monkeypatch.setattr(placement, "PLACE_POLL", 0.01)
    with pytest.raises(RuntimeError, match="0 of 2 down, the others full"):
        await placement.place(_nodes(2), {"vms": [{"template": "debian"}]}, wait=0.05)


def test_default_concurrency_sums_the_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PVE_INSPECT_URL", "https://a.test:1,https://b.test:1,https://c.test:1")
    monkeypatch.setattr(placement, "_room", {})
    room = {"https://a.test:1": 3, "https://b.test:1": 4}  # c is down

    def cap_sync(node: NodeConfig, timeout: float) -> dict[str, Any] | None:
        return {"free_sandboxes": room[node.url]} if node.url in room else None

    monkeypatch.setattr(placement, "capacity_sync", cap_sync)
    assert PveInspectSandboxEnvironment.default_concurrency() == 7
    room["https://a.test:1"] = 0
    assert PveInspectSandboxEnvironment.default_concurrency() == 7, "asked once per process"
    monkeypatch.setattr(placement, "_room", {})
    room["https://b.test:1"] = -1  # unbounded
    assert PveInspectSandboxEnvironment.default_concurrency() is None
    monkeypatch.setattr(placement, "_room", {})
    room.clear()  # none answers
    assert PveInspectSandboxEnvironment.default_concurrency() is None


@pytest.mark.anyio
async def test_capacity_on_bed() -> None:
    """The bed daemon says its room, and a sample's sandbox is counted."""
    need_bed()
    node = nodes_from_env()[0]
    async with Client(node) as c:
        before = await c.capacity()
        assert before is not None and before["node"], before
        sb = await c.create({"vms": [{"template": "debian", "cores": 1, "memory_mib": 512}]})
        try:
            during = await c.capacity()
            assert during is not None
            assert during["used"]["sandboxes"] == before["used"]["sandboxes"] + 1, during
            assert during["used"]["memory_mib"] == before["used"]["memory_mib"] + 512, during
        finally:
            await c.delete(sb["id"])
