"""Samples as long as they need (a fake daemon, tests/fakenode.py): the
heartbeat renews the sample's sandbox by its lease while the sample runs
and stops at sample_cleanup; a sandbox that expires or is deleted under a
running sample is Inspect's SandboxUnavailableError saying why."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fakenode import FakeNode
from inspect_ai.util import SandboxUnavailableError

from inspect_pve_inspect import (
    NodeConfig,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
    keepalive,
)
from inspect_pve_inspect.sandbox import _Run

pytestmark = pytest.mark.anyio

Sample = dict[str, PveInspectSandboxEnvironment]


@pytest.mark.parametrize(
    ("want", "health", "lease"),
    [
        (None, {"default_ttl_seconds": 3600, "max_ttl_seconds": 86400}, 3600),
        (7200, {"default_ttl_seconds": 3600, "max_ttl_seconds": 86400}, 7200),
        (7200, {"default_ttl_seconds": 600, "max_ttl_seconds": 1800}, 1800),  # the node's most
        (None, {"status": "ok"}, 3600),  # an older daemon says neither
        (120, {"status": "ok"}, 120),
    ],
)
def test_lease_is_bounded_by_the_node(
    want: int | None, health: dict[str, object], lease: int
) -> None:
    assert keepalive.lease_seconds(want, health) == lease


def _heartbeats() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("pve_inspect keepalive")]


async def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait for cond, a minute at most (a test's timeout, not a measure)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if cond():
            return
        await asyncio.sleep(0.005)
    pytest.fail(f"timed out waiting for {what}")


async def _next_renewal(fake: FakeNode, sid: str) -> None:
    n = fake.extends(sid)
    await _until(lambda: fake.extends(sid) > n, "a renewal")


async def _sample(
    node: NodeConfig, monkeypatch: pytest.MonkeyPatch, task: str = "t", **cfg: Any
) -> tuple[PveInspectSandboxEnvironmentConfig, Sample]:
    # A renewal every 10 ms of a 60 s lease: the test moves the fake's clock.
    monkeypatch.setattr(keepalive, "RENEW_PER_LEASE", 6000)
    monkeypatch.setattr(keepalive, "MIN_INTERVAL", 0.0)
    c = PveInspectSandboxEnvironmentConfig(nodes=(node,), ttl_seconds=60, **cfg)
    envs = await PveInspectSandboxEnvironment.sample_init(task, c, {})
    return c, {k: v for k, v in envs.items() if isinstance(v, PveInspectSandboxEnvironment)}


@pytest.fixture
async def cleanup() -> AsyncIterator[list[tuple[PveInspectSandboxEnvironmentConfig, Sample]]]:
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]] = []
    yield samples
    for c, envs in samples:
        await PveInspectSandboxEnvironment.sample_cleanup("t", c, dict(envs), False)


async def test_sample_outlives_its_lease_and_the_heartbeat_stops_at_cleanup(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    c, envs = await _sample(node, monkeypatch)
    env = envs["vm0"]
    assert env.keepalive is not None and env.keepalive.running
    assert env.keepalive.lease == 60
    assert _Run.keepalives[env.sandbox_id] is env.keepalive
    # Ten leases on the fake's clock, the reaper running after each move:
    # the sandbox is renewed in time, every time.
    for _ in range(10):
        await _next_renewal(fake, env.sandbox_id)
        fake.advance(50)
        assert fake.reap() == []
        assert (await env.exec(["true"])).success
    await PveInspectSandboxEnvironment.sample_cleanup("t", c, dict(envs), False)
    assert not env.keepalive.running and _heartbeats() == []
    assert env.sandbox_id not in _Run.keepalives and env.sandbox_id not in fake.sandboxes


async def test_without_keepalive_the_ttl_holds_and_expiry_is_said(
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    cleanup: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    """keepalive=False: the sandbox expires at its TTL; the sample's next
    call says it expired, and when, from the expiry the daemon answered."""
    fake, node = fake_node
    # The fake's clock an hour behind: its expiries are past on this one.
    fake.advance(-3600)
    c, envs = await _sample(node, monkeypatch, keepalive=False)
    cleanup.append((c, envs))
    env = envs["vm0"]
    assert env.keepalive is not None and not env.keepalive.running and _heartbeats() == []
    fake.advance(61)
    assert fake.reap() == [env.sandbox_id]
    exp = fake.gone[env.sandbox_id][1].removeprefix("it expired at ")
    with pytest.raises(SandboxUnavailableError, match=f"is gone: it expired at {exp}"):
        await env.exec(["true"])
    with pytest.raises(SandboxUnavailableError, match="expired at"):
        await env.read_file("/etc/hostname")


@pytest.mark.parametrize("call", ["exec", "write_file", "read_file"])
async def test_gone_during_the_call_says_why(
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    cleanup: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
    call: str,
) -> None:
    """The daemon's conflict of reason expired (a call its reaper ended)
    is Inspect's sandbox error with the daemon's why, not a 409."""
    fake, node = fake_node
    c, envs = await _sample(node, monkeypatch)
    cleanup.append((c, envs))
    env = envs["vm0"]
    detail = (
        f"sandbox {env.sandbox_id} was deleted during the call: it expired at "
        "2026-01-01T01:00:00Z (its TTL ran out and nothing extended it)"
    )
    gone = (409, {"type": "conflict", "status": 409, "detail": detail, "reason": "expired"})

    async def do() -> None:
        if call == "exec":
            fake.exec_answer = gone
            await env.exec(["sleep", "1"])
        elif call == "write_file":
            monkeypatch.setattr(env.client, "write_file", _raising(gone))
            await env.write_file("f", "x")
        else:
            monkeypatch.setattr(env.client, "read_file", _raising_iter(gone))
            await env.read_file("f")

    with pytest.raises(SandboxUnavailableError) as e:
        await do()
    assert str(e.value) == f"pve_inspect: sandbox {env.sandbox_id} is gone: {detail}"


def _raising(ans: tuple[int, dict[str, Any]]) -> Callable[..., Any]:
    from inspect_pve_inspect.client import Problem

    async def f(*a: object, **kw: object) -> None:
        raise Problem(*ans)

    return f


def _raising_iter(ans: tuple[int, dict[str, Any]]) -> Callable[..., Any]:
    from inspect_pve_inspect.client import Problem

    async def f(*a: object, **kw: object) -> AsyncIterator[bytes]:
        raise Problem(*ans)
        yield b""

    return f


async def test_heartbeat_sees_the_sandbox_go_and_stops(
    fake_node: tuple[FakeNode, NodeConfig],
    monkeypatch: pytest.MonkeyPatch,
    cleanup: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    """A sandbox deleted under the sample (not by it): the heartbeat's
    renewal finds it gone and ends; the sample's next call says it was
    deleted before its expiry, not by this sample."""
    fake, node = fake_node
    c, envs = await _sample(node, monkeypatch)
    cleanup.append((c, envs))
    env = envs["vm0"]
    ka = env.keepalive
    assert ka is not None
    with fake.lock:
        del fake.sandboxes[env.sandbox_id]
    await _until(lambda: not ka.running, "the heartbeat to end")
    assert ka.gone is not None and "deleted before its expiry" in ka.gone
    with pytest.raises(SandboxUnavailableError, match="not by this sample"):
        await env.exec(["true"])


async def test_failed_sample_init_leaves_no_heartbeat(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample_init that fails after the create (its first exec) stops
    the heartbeat and deletes the sandbox."""
    fake, node = fake_node
    before = dict(_Run.keepalives)  # other tests' (this process's other evals)
    fake.exec_answer = (502, {"type": "guest-agent-error", "status": 502, "detail": "bad"})
    with pytest.raises(Exception, match="guest-agent-error"):
        await _sample(node, monkeypatch)
    assert _heartbeats() == [] and _Run.keepalives == before and fake.sandboxes == {}


async def test_task_cleanup_stops_what_sample_cleanup_did_not(
    fake_node: tuple[FakeNode, NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, node = fake_node
    before = dict(_Run.keepalives)  # other tests' (this process's other evals)
    c, envs = await _sample(node, monkeypatch, task="task-a")
    other_c, other = await _sample(node, monkeypatch, task="task-b", cidr_wait_seconds=5)
    assert len(_heartbeats()) == 2
    # Inspect calls task_cleanup once per sandbox config, as "shutdown"
    # (inspect_ai _eval/run.py): the cleanup of task a's config stops and
    # deletes its sandbox only; task b's, of another config and running
    # beside it in an eval-set, keeps its heartbeat and sandbox.
    await PveInspectSandboxEnvironment.task_cleanup("shutdown", c, True)
    assert len(_heartbeats()) == 1 and list(fake.sandboxes) == [other["vm0"].sandbox_id]
    assert _Run.keepalives.keys() - before.keys() == {other["vm0"].sandbox_id}
    await PveInspectSandboxEnvironment.task_cleanup("shutdown", other_c, True)
    assert _heartbeats() == [] and _Run.keepalives == before and fake.sandboxes == {}
    await envs["vm0"].client.aclose()
    await other["vm0"].client.aclose()


async def test_stop_lets_a_renewal_in_flight_finish() -> None:
    """stop() does not cancel a renewal under way (cancelling a read on a
    unix-socket stream races anyio's reader callback: InvalidStateError in
    the loop, seen in CI); it waits for it, then the heartbeat ends."""
    started, release = asyncio.Event(), asyncio.Event()
    seen: list[str] = []

    class Slow:
        async def extend(self, sid: str, ttl: int, timeout: float) -> dict[str, Any]:
            started.set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            seen.append("finished")
            return {}

    ka = keepalive.Keepalive(Slow(), "sb1", 60, None, interval=0.001)  # type: ignore[arg-type]
    assert ka.start()
    await started.wait()
    stopping = asyncio.create_task(ka.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done(), "stop() returned while the renewal was under way"
    release.set()
    await stopping
    assert seen == ["finished"] and not ka.running
