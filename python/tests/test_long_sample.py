"""On the bed daemon (the rules themselves: test_keepalive.py,
test_preflight.py, test_ranges.py with a fake): a sample outlives its TTL
while a sample without the heartbeat is reaped and told so; task_init fails
on a bad config with the node's templates listed and loads a config file;
two samples with one fixed CIDR run one after the other."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anyio
import pytest
from conftest import need_bed
from inspect_ai.util import SandboxEnvironment, SandboxUnavailableError

from inspect_pve_inspect import (
    NetworkSpec,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
    VmSpec,
    placement,
)
from inspect_pve_inspect.client import Client, Problem
from inspect_pve_inspect.preflight import ConfigRefused

pytestmark = [pytest.mark.anyio, pytest.mark.bed]

Env = PveInspectSandboxEnvironment


def _one(envs: dict[str, SandboxEnvironment]) -> Env:
    env = next(iter(envs.values()))
    assert isinstance(env, Env)
    return env


async def test_task_init_checks_the_config_on_the_node(tmp_path: Path) -> None:
    need_bed()
    bad = PveInspectSandboxEnvironmentConfig(
        vms=(VmSpec(template="debian", name="a"), VmSpec(template="kali", name="target"))
    )
    with pytest.raises(ConfigRefused) as e:
        await Env.task_init("t", bad)
    msg = str(e.value)
    assert "VM 'target' (vms[1].template): unknown template \"kali\"" in msg, msg
    # the playground's VM and container templates
    assert "templates on this node: ct-debian, debian" in msg, msg
    f = tmp_path / "cfg.yaml"
    f.write_text("vms:\n  - template: debian\n    name: a\nttl_seconds: 600\n")
    await Env.task_init("t", str(f))


async def test_sample_outlives_its_ttl_and_a_late_expiry_is_said() -> None:
    """Two samples of a 60 s TTL: the one with the heartbeat runs on past
    the moment the daemon's reaper deletes the one without, whose next
    call says it expired."""
    need_bed()
    kept = PveInspectSandboxEnvironmentConfig(ttl_seconds=60)
    left = PveInspectSandboxEnvironmentConfig(ttl_seconds=60, keepalive=False)
    a = await Env.sample_init("t", kept, {})
    b = await Env.sample_init("t", left, {})
    ea, eb = _one(a), _one(b)
    try:
        async with Client(eb.client.node) as c:
            for _ in range(60):  # the TTL, then up to the reaper's interval (30 s)
                assert (await ea.exec(["true"])).success
                try:
                    await c.get(eb.sandbox_id)
                except Problem as p:
                    assert p.type == "not-found", p
                    break
                await anyio.sleep(5)
            else:
                pytest.fail("the sandbox without the heartbeat was never reaped")
        assert ea.keepalive is not None and ea.keepalive.running
        assert (await ea.exec(["true"])).success
        with pytest.raises(SandboxUnavailableError, match=r"is gone: it expired at \S+Z"):
            await eb.exec(["true"])
    finally:
        await Env.sample_cleanup("t", kept, a, False)
        await Env.sample_cleanup("t", left, b, False)


async def test_two_samples_with_one_fixed_cidr_take_turns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    need_bed()
    monkeypatch.setattr(placement, "RANGE_POLL_MAX", 2.0)
    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(VmSpec(template="debian", name="a", networks=("lab",)),),
        networks=(NetworkSpec(name="lab", cidr="172.31.250.0/24", alias="my lab"),),
    )
    first = await Env.sample_init("t", cfg, {})
    got: dict[str, SandboxEnvironment] = {}

    async def second() -> None:
        got.update(await Env.sample_init("t", cfg, {}))

    try:
        with caplog.at_level(logging.WARNING, logger=placement.__name__):
            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                deadline = time.monotonic() + 120
                while not any("waiting for it" in r.getMessage() for r in caplog.records):
                    assert time.monotonic() < deadline, "the second sample never waited"
                    await anyio.sleep(0.2)
                assert not got
                await Env.sample_cleanup("t", cfg, first, False)
                first = {}
        assert list(got) == ["a"]
        (msg,) = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
        assert msg.startswith("pve_inspect: network 'my lab' (lab): cidr 172.31.250.0/24 "), msg
        res = await _one(got).exec(["ip", "-4", "-o", "addr"])
        assert "172.31.250." in res.stdout, res.stdout
    finally:
        if first:
            await Env.sample_cleanup("t", cfg, first, False)
        if got:
            await Env.sample_cleanup("t", cfg, got, False)
