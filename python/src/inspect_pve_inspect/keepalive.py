"""Keeping a sample's sandbox alive while the sample runs.

The daemon reaps a sandbox at its expiry (``ttl_seconds`` after its create,
or after its last extend). A :class:`Keepalive` is the heartbeat of one
sandbox: an asyncio task that extends it by its lease (the config's
``ttl_seconds``, else the node's ``default_ttl``, never more than its
``max_ttl``: ``GET /v1/healthz``) every third of the lease, so that a
sample runs as long as it needs while a sandbox whose eval died is reaped
one lease after the last renewal. The sample's environments own it:
``sample_init`` starts it, ``sample_cleanup`` stops it before the delete,
``task_cleanup`` stops any left (the task is never left running).

When the sandbox turns out gone (an extend answers not-found, or a
conflict saying it expired or was deleted), the heartbeat stops and keeps
why, so that the sample's next call raises Inspect's
``SandboxUnavailableError`` saying why rather than "not found".
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import httpx

from .client import CALL_TIMEOUT, Client, NodeDown, Problem

log = logging.getLogger(__name__)

# The problem reasons of a conflict that say the sandbox is going or gone
# (sandboxapi apitype.ReasonExpired, ReasonDeleted).
GONE_REASONS = ("expired", "deleted")
# Renewals per lease: two in a row may fail before the sandbox expires.
RENEW_PER_LEASE = 3
# The shortest time between two renewals (seconds).
MIN_INTERVAL = 1.0
# After a failed renewal, the next try comes this soon (or at the interval,
# if that is sooner), so that several tries fit in one lease.
RETRY = 10.0


def lease_seconds(want: int | None, health: dict[str, object]) -> int:
    """The lease of a sandbox: ``want`` (the config's ttl_seconds) or the
    node's default TTL, within 1 and the node's max TTL (either of which an
    older daemon may not report)."""
    default = _int(health.get("default_ttl_seconds"))
    most = _int(health.get("max_ttl_seconds"))
    lease = want or default or 3600
    return max(1, min(lease, most) if most else lease)


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def parse_time(v: object) -> datetime | None:
    """An RFC 3339 time of the API (``expires_at``), None if absent."""
    if not isinstance(v, str):
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None


def gone_problem(p: Problem) -> bool:
    """Whether ``p`` says the sandbox is gone or going (not-found, or a
    conflict of reason expired or deleted)."""
    return p.type == "not-found" or (p.type == "conflict" and p.reason in GONE_REASONS)


class Keepalive:
    """The heartbeat of one sandbox (see the module)."""

    def __init__(
        self,
        client: Client,
        sandbox_id: str,
        lease: int,
        expires_at: datetime | None,
        interval: float | None = None,
    ) -> None:
        self.client = client
        self.sandbox_id = sandbox_id
        self.lease = lease
        self.interval = (
            interval if interval is not None else max(MIN_INTERVAL, lease / RENEW_PER_LEASE)
        )
        # The expiry the daemon last answered.
        self.expires_at = expires_at
        # Why the sandbox is gone, once the heartbeat saw it go.
        self.gone: str | None = None
        # The last renewal's failure, while renewals fail.
        self.failing: str | None = None
        self._task: asyncio.Task[None] | None = None
        # Set by stop: the heartbeat ends at its next wait.
        self._stopping = asyncio.Event()

    def start(self) -> bool:
        """Start the heartbeat in the running event loop; False (and a
        warning: the sandbox keeps its TTL) when that is not asyncio's."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio, or no event loop
            log.warning(
                "pve_inspect: sandbox %s is not kept alive (the heartbeat needs asyncio): "
                "it is reaped %d s after its creation",
                self.sandbox_id,
                self.lease,
            )
            return False
        self._task = loop.create_task(self._run(), name=f"pve_inspect keepalive {self.sandbox_id}")
        return True

    @property
    def running(self) -> bool:
        """Whether the heartbeat's task runs."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Stop the heartbeat and wait for its task to end (idempotent).

        A renewal in flight is let finish (it ends by its own timeout)
        rather than cancelled: cancelling a read on a unix-socket stream
        races anyio's reader callback (up to anyio 4.16 it can set the
        result of the cancelled future, an InvalidStateError in the event
        loop). The task is cancelled only if it outlives that."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), CALL_TIMEOUT + 5)
        except TimeoutError:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as e:
                log.warning(
                    "pve_inspect: the heartbeat of sandbox %s had ended: %r", self.sandbox_id, e
                )
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception as e:  # the heartbeat's own failure must not stop the cleanup
            log.warning(
                "pve_inspect: the heartbeat of sandbox %s had ended: %r", self.sandbox_id, e
            )

    async def _run(self) -> None:
        wait = self.interval
        while True:
            try:
                await asyncio.wait_for(self._stopping.wait(), wait)
                return  # stopped
            except TimeoutError:
                pass
            wait = self.interval
            try:
                sb = await self.client.extend(
                    self.sandbox_id, self.lease, timeout=min(CALL_TIMEOUT, self.interval)
                )
            except Problem as p:
                if gone_problem(p):
                    self.gone = self.why_gone(p)
                    log.warning("pve_inspect: sandbox %s is gone: %s", self.sandbox_id, self.gone)
                    return
                self._failed(str(p))
                wait = min(RETRY, self.interval)
                continue
            except (NodeDown, httpx.HTTPError, OSError) as e:
                self._failed(str(e) or type(e).__name__)
                wait = min(RETRY, self.interval)
                continue
            except Exception as e:  # an answer it cannot read: renew again later
                self._failed(f"{type(e).__name__}: {e}")
                wait = min(RETRY, self.interval)
                continue
            self.expires_at = parse_time(sb.get("expires_at")) or self.expires_at
            if self.failing is not None:
                log.warning("pve_inspect: sandbox %s renewed again", self.sandbox_id)
            self.failing = None

    def _failed(self, why: str) -> None:
        self.failing = why
        log.warning(
            "pve_inspect: could not renew sandbox %s (it expires at %s unless a renewal "
            "gets through): %s",
            self.sandbox_id,
            _when(self.expires_at),
            why,
        )

    def why_gone(self, p: Problem | None = None) -> str:
        """Why the sandbox is gone, as best known: what the heartbeat saw;
        the daemon's word when ``p`` is a conflict that says it (expired at,
        deleted by); else, for a bare not-found, whether its last known
        expiry has passed."""
        if self.gone is not None:
            return self.gone
        if p is not None and p.type == "conflict" and p.reason in GONE_REASONS:
            return p.detail
        if self.expires_at is not None and datetime.now(UTC) >= self.expires_at:
            why = f"it expired at {_when(self.expires_at)} (the daemon reaped it at its TTL"
            if self.failing is not None:
                why += f"; the renewals failed: {self.failing}"
            return why + ")"
        return (
            f"it was deleted before its expiry ({_when(self.expires_at)}), not by this "
            "sample (another client, or the node's operator)"
        )


def _when(t: datetime | None) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else "unknown"
