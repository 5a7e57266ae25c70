"""Healthchecks: a VM's guest command polled until it exits 0 before the
sample starts (:class:`~.config.HealthCheck`, the reference plugin's
``healthcheck`` with its fields and defaults).

Each attempt is one exec through the daemon with the check's timeout (the
daemon kills the command's whole tree at it). A non-zero exit, a timeout or
a program that cannot run counts as a failure, except within
``start_period`` of the first attempt; ``retries`` counted failures in a
row fail the sample. An attempt the daemon answers with an unreachable
guest agent (the guest still booting) or that does not reach the daemon is
not counted, but :data:`MAX_UNREACHABLE` in a row fail the sample. Any
other refusal (the sandbox is gone or broken) ends the wait at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from .client import ExecAnswer, NodeDown, Problem
from .config import HealthCheck

# Attempts in a row that cannot reach the guest agent before the check fails.
MAX_UNREACHABLE = 25

# The output an attempt keeps, each stream (bytes).
OUTPUT_LIMIT = 4096

# Problem types that mean "the guest agent does not answer yet".
_UNREACHABLE = {"guest-agent-unavailable", "guest-timeout"}


class Execer(Protocol):
    """What a healthcheck needs of the client."""

    async def exec(self, sid: str, vm: str, req: dict[str, Any]) -> ExecAnswer: ...


class HealthCheckFailed(RuntimeError):
    """A VM's healthcheck did not pass; the message says how."""


def _tail(b: bytes, n: int = 300) -> str:
    """The end of a guest's output for a message: at most ``n`` characters,
    every character that is not printable (a newline that would forge a
    line of :func:`wait_all`'s message, a terminal escape, a bidi
    override) shown as its Python escape."""
    s = b.decode("utf-8", "replace").strip()
    out: list[str] = []
    size = 0
    for c in reversed(s):
        e = c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        if size + len(e) > n:
            return "..." + "".join(reversed(out))
        out.append(e)
        size += len(e)
    return "".join(reversed(out))


def _describe(a: ExecAnswer) -> str:
    if a.timed_out:
        return "timed out"
    out = _tail(a.stderr) or _tail(a.stdout)
    return f"exit {a.exit_code}" + (f": {out}" if out else "")


async def wait_healthy(
    client: Execer,
    sid: str,
    vm: str,
    hc: HealthCheck,
    *,
    clock: Callable[[], float] = anyio.current_time,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> int:
    """Run ``hc`` in VM ``vm`` of sandbox ``sid`` until it passes; return
    the number of attempts. Raise :class:`HealthCheckFailed` when it does
    not pass (counted failures or unreachable attempts in a row), and let
    any other refusal of the daemon through."""
    # Only the output's end is shown (300 characters): a small limit keeps
    # a chatty check from holding the daemon's buffers.
    req = {"argv": list(hc.test), "timeout_seconds": hc.timeout, "output_limit": OUTPUT_LIMIT}
    first: float | None = None
    failures = unreachable = attempts = 0
    last = ""
    while True:
        attempts += 1
        now = clock()
        if first is None:
            first = now
        try:
            ans = await client.exec(sid, vm, req)
        except NodeDown as e:
            ans, why = None, f"the node does not answer: {e}"
        except Problem as p:
            if p.type not in _UNREACHABLE:
                raise
            ans, why = None, f"the guest agent does not answer: {p}"
        if ans is None:
            unreachable += 1
            last = why
            if unreachable >= MAX_UNREACHABLE:
                raise HealthCheckFailed(
                    f"VM {vm!r}: healthcheck {list(hc.test)!r} could not run "
                    f"{unreachable} times in a row ({last})"
                )
        else:
            unreachable = 0
            if ans.exit_code == 0 and not ans.timed_out:
                return attempts
            last = _describe(ans)
            if now - first >= hc.start_period:
                failures += 1
                if failures >= hc.retries:
                    raise HealthCheckFailed(
                        f"VM {vm!r}: healthcheck {list(hc.test)!r} failed {failures} "
                        f"times in a row (last: {last})"
                    )
        await sleep(hc.interval)


async def wait_all(client: Execer, sid: str, checks: list[tuple[str, HealthCheck]]) -> None:
    """Run every VM's healthcheck at once; raise one error naming each VM
    whose check failed (or the first other error)."""
    errors: list[Exception] = []

    async def one(vm: str, hc: HealthCheck) -> None:
        try:
            await wait_healthy(client, sid, vm, hc)
        except Exception as e:  # collected: the other checks run on
            errors.append(e)

    async with anyio.create_task_group() as tg:
        for vm, hc in checks:
            tg.start_soon(one, vm, hc)
    other = [e for e in errors if not isinstance(e, HealthCheckFailed)]
    if other:
        raise other[0]
    if errors:
        raise HealthCheckFailed(
            "pve_inspect: the sandbox's healthchecks failed:\n"
            + "\n".join(f"  - {e}" for e in errors)
        )
