"""Healthchecks: the rules against a scripted client and a clock the test
moves, then on the bed daemon (a check that passes on its second attempt,
one that never passes and fails the sample, leaving no sandbox)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from conftest import need_bed

from inspect_pve_inspect import PveInspectSandboxEnvironment, PveInspectSandboxEnvironmentConfig
from inspect_pve_inspect.client import Client, ExecAnswer, NodeDown, Problem
from inspect_pve_inspect.config import HealthCheck, VmSpec, nodes_from_env
from inspect_pve_inspect.healthcheck import (
    MAX_UNREACHABLE,
    OUTPUT_LIMIT,
    HealthCheckFailed,
    wait_all,
    wait_healthy,
)

pytestmark = pytest.mark.anyio


def ans(code: int = 0, err: bytes = b"", timed_out: bool = False) -> ExecAnswer:
    return ExecAnswer(code, b"", err, False, False, timed_out)


def unreachable() -> Problem:
    return Problem(502, {"type": "guest-agent-unavailable", "detail": "no agent"})


class Script:
    """Answers (or raises) in order, the last one for ever; counts calls."""

    def __init__(self, *steps: ExecAnswer | Exception) -> None:
        self.steps = list(steps)
        self.reqs: list[dict[str, Any]] = []

    async def exec(self, sid: str, vm: str, req: dict[str, Any]) -> ExecAnswer:
        self.reqs.append(req)
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, Exception):
            raise step
        return step


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.now += s


async def run(script: Script, hc: HealthCheck) -> int:
    c = Clock()
    return await wait_healthy(script, "sb1", "web", hc, clock=c, sleep=c.sleep)


@pytest.mark.parametrize(
    ("steps", "hc", "attempts"),
    [
        ((ans(),), HealthCheck(test=("true",)), 1),
        ((ans(1), ans(1), ans()), HealthCheck(test=("true",), retries=3), 3),
        # failures inside start_period do not count: 4 failures, retries 2
        (
            (ans(1), ans(1), ans(1), ans(1), ans()),
            HealthCheck(test=("x",), retries=2, interval=1, start_period=2.5),
            5,
        ),
        # unreachable attempts are not failures
        (
            (unreachable(), unreachable(), NodeDown("down"), ans()),
            HealthCheck(test=("x",), retries=1),
            4,
        ),
    ],
)
async def test_passes(
    steps: tuple[ExecAnswer | Exception, ...], hc: HealthCheck, attempts: int
) -> None:
    s = Script(*steps)
    assert await run(s, hc) == attempts
    assert s.reqs[0] == {
        "argv": list(hc.test),
        "timeout_seconds": hc.timeout,
        "output_limit": OUTPUT_LIMIT,
    }


@pytest.mark.parametrize(
    ("steps", "hc", "calls", "words"),
    [
        (
            (ans(1, b"no service"),),
            HealthCheck(test=("x",), retries=3),
            3,
            "failed 3 times in a row (last: exit 1: no service)",
        ),
        ((ans(0, timed_out=True),), HealthCheck(test=("x",), retries=2), 2, "(last: timed out)"),
        (
            (unreachable(),),
            HealthCheck(test=("x",), retries=1),
            MAX_UNREACHABLE,
            "could not run 25 times in a row",
        ),
        # an answer resets the unreachable count; the failure then counts
        (
            (unreachable(), ans(1), unreachable()),
            HealthCheck(test=("x",), retries=1),
            2,
            "failed 1 times",
        ),
    ],
)
async def test_fails(
    steps: tuple[ExecAnswer | Exception, ...], hc: HealthCheck, calls: int, words: str
) -> None:
    s = Script(*steps)
    with pytest.raises(HealthCheckFailed) as e:
        await run(s, hc)
    assert words in str(e.value)
    assert len(s.reqs) == calls


@pytest.mark.parametrize(
    ("err", "shown"),
    [
        # a forged line of the joined message, a terminal escape, a bidi
        # override: each shown as an escape, on the message's one line
        (
            b"no\n  - VM 'db': healthcheck passed",
            "exit 1: no\\n  - VM 'db': healthcheck passed",
        ),
        (b"\x1b]0;pwned\x07\x1b[2Jx", "exit 1: \\x1b]0;pwned\\x07\\x1b[2Jx"),
        ("a\u202eb".encode(), "exit 1: a\\u202eb"),
        (b"\xff\tz", "exit 1: \ufffd\\tz"),
    ],
)
async def test_guest_output_is_shown_escaped(err: bytes, shown: str) -> None:
    with pytest.raises(HealthCheckFailed) as e:
        await run(Script(ans(1, err)), HealthCheck(test=("x",), retries=1))
    msg = str(e.value)
    assert f"(last: {shown})" in msg
    assert msg.isprintable()


async def test_guest_output_shown_is_bounded() -> None:
    with pytest.raises(HealthCheckFailed) as e:
        await run(Script(ans(1, b"\x1b" * 10_000)), HealthCheck(test=("x",), retries=1))
    assert len(str(e.value)) < 500


async def test_other_refusals_end_the_wait() -> None:
    s = Script(Problem(409, {"type": "sandbox-broken", "detail": "vm stopped"}))
    with pytest.raises(Problem):
        await run(s, HealthCheck(test=("x",)))
    assert len(s.reqs) == 1


async def test_wait_all_names_each_failed_vm() -> None:
    class PerVM:
        async def exec(self, sid: str, vm: str, req: dict[str, Any]) -> ExecAnswer:
            return ans(0 if vm == "ok" else 1)

    hc = HealthCheck(test=("x",), retries=1, interval=0.01)
    await wait_all(PerVM(), "sb1", [("ok", hc)])
    with pytest.raises(HealthCheckFailed) as e:
        await wait_all(PerVM(), "sb1", [("ok", hc), ("a", hc), ("b", hc)])
    msg = str(e.value)
    assert "VM 'a'" in msg and "VM 'b'" in msg and "VM 'ok'" not in msg


async def _ids() -> list[str]:
    out: list[str] = []
    for node in nodes_from_env():
        async with Client(node) as c:
            out += [s["id"] for s in await c.list()]
    return out


async def test_bed_sample_waits_for_its_healthcheck() -> None:
    """The check fails once (its marker file is not there yet), then passes:
    the sample starts after the second attempt and sees the marker."""
    need_bed()
    hc = HealthCheck(
        test=("sh", "-c", "test -e /run/hc-seen && exit 0; touch /run/hc-seen; exit 1"),
        interval=0.2,
        retries=3,
    )
    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(VmSpec(template="debian", name="web", healthcheck=hc),)
    )
    envs = await PveInspectSandboxEnvironment.sample_init("hc", cfg, {})
    try:
        r = await envs["web"].exec(["test", "-e", "/run/hc-seen"])
        assert r.returncode == 0
    finally:
        await PveInspectSandboxEnvironment.sample_cleanup("hc", cfg, envs, False)


async def test_bed_failing_healthcheck_fails_the_sample_and_leaves_nothing() -> None:
    need_bed()
    before = set(await _ids())
    hc = HealthCheck(test=("sh", "-c", "echo not yet >&2; exit 3"), interval=0.2, retries=2)
    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(VmSpec(template="debian", name="web", healthcheck=hc),)
    )
    with pytest.raises(HealthCheckFailed) as e:
        await PveInspectSandboxEnvironment.sample_init("hc", cfg, {})
    assert "VM 'web'" in str(e.value) and "exit 3: not yet" in str(e.value)
    with anyio.fail_after(60):
        while set(await _ids()) - before:
            await anyio.sleep(0.5)
