"""Overlapping fixed CIDRs wait (a fake daemon, tests/fakenode.py): a
sample whose fixed CIDR another sandbox holds waits for the range, said
once in the log with the network named by the eval's alias, and fails only
after cidr_wait_seconds."""

from __future__ import annotations

import logging

import anyio
import pytest
from fakenode import FakeNode
from inspect_ai.util import SandboxEnvironment
from test_preflight import reference

from inspect_pve_inspect import NodeConfig, PveInspectSandboxEnvironment, placement
from inspect_pve_inspect.client import Problem
from inspect_pve_inspect.compat import coerce

pytestmark = pytest.mark.anyio

HELD = Problem(
    409,
    {
        "type": "conflict",
        "detail": 'network "net0": cidr 172.31.250.0/24 overlaps a range in use',
        "reason": "cidr-in-use",
        "field": "networks[0].cidr",
    },
)


@pytest.mark.parametrize(
    ("p", "labels", "want"),
    [
        (HELD, ["'my lab' (net0)"], "network 'my lab' (net0): cidr 172.31.250.0/24 overlaps"),
        (HELD, [], 'network "net0": cidr 172.31.250.0/24 overlaps'),  # no label: as it is
        (Problem(409, {**HELD.doc, "field": None}), ["x"], 'network "net0"'),
    ],
)
async def test_range_detail_names_the_alias(p: Problem, labels: list[str], want: str) -> None:
    req = {"networks": [{"name": "net0", "cidr": "172.31.250.0/24"}]}
    assert placement.range_detail(p, req, labels).startswith(want)
    assert placement.range_held(p)


async def test_second_sample_waits_for_the_range(
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, node = fake_node
    fake.templates = ("debian", "kali")
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    monkeypatch.setattr(placement, "RANGE_POLL_FIRST", 0.01)
    monkeypatch.setattr(placement, "RANGE_POLL_MAX", 0.02)
    cfg = coerce(reference(node))
    first = await PveInspectSandboxEnvironment.sample_init("t", cfg, {})
    got: dict[str, SandboxEnvironment] = {}

    async def second() -> None:
        got.update(await PveInspectSandboxEnvironment.sample_init("t", cfg, {}))

    with caplog.at_level(logging.INFO, logger=placement.__name__):
        async with anyio.create_task_group() as tg:
            tg.start_soon(second)
            with anyio.fail_after(60):  # until it has been refused a few times
                while sum("range in use" in r.getMessage() for r in caplog.records) < 3:
                    await anyio.sleep(0.005)
            assert not got and len(fake.sandboxes) == 1
            await PveInspectSandboxEnvironment.sample_cleanup("t", cfg, first, False)
    assert sorted(got) == ["attacker", "target"] and len(fake.sandboxes) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "pve_inspect: network 'my lab' (net0) (sdn_config.vnet_configs[0].subnets[0].cidr): "
        "cidr 172.31.250.0/24 overlaps a range in use; "
        "waiting for it (up to 900 s, cidr_wait_seconds)"
    ]
    await PveInspectSandboxEnvironment.sample_cleanup("t", cfg, got, False)


async def test_wait_is_bounded(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    fake.templates = ("debian", "kali")
    monkeypatch.setenv("PVE_INSPECT_URL", node.url)
    cfg = coerce(reference(node))
    first = await PveInspectSandboxEnvironment.sample_init("t", cfg, {})
    try:
        with pytest.raises(RuntimeError) as e:
            await PveInspectSandboxEnvironment.sample_init(
                "t", cfg.model_copy(update={"cidr_wait_seconds": 0.0}), {}
            )
        assert str(e.value).startswith(
            "pve_inspect: network 'my lab' (net0) (sdn_config.vnet_configs[0].subnets[0].cidr): "
            "cidr 172.31.250.0/24 overlaps a range in use: "
            "still held after 0 s of waiting (cidr_wait_seconds is 0)"
        )
    finally:
        await PveInspectSandboxEnvironment.sample_cleanup("t", cfg, first, False)
