"""Placing a sample's sandbox on one of several nodes.

Each node is one pve-inspectd. A node that does not answer is skipped; the
others are asked for their free capacity (``GET /v1/capacity``, when the
daemon serves it) and tried from the emptiest; a create that a node refuses
for want of room (``guard-refused``, ``unavailable``) or that fails because
the node went down moves on to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from .client import Client, NodeDown, Problem
from .config import NodeConfig

# Problem types that mean "this node cannot take it now; another may".
_NEXT_NODE = {"guard-refused", "unavailable"}
PROBE_TIMEOUT = 10.0


async def _probe(node: NodeConfig) -> tuple[NodeConfig, float] | None:
    """(node, free sandbox slots) or None when the node is down or full."""
    try:
        with anyio.fail_after(PROBE_TIMEOUT):
            async with Client(node) as c:
                cap = await c.capacity()
                if cap is None:
                    h = await c.healthz()
                    # No capacity endpoint: prefer the less loaded node.
                    return node, -float(h.get("sandboxes", 0))
    except (NodeDown, Problem, TimeoutError, OSError):
        # OSError: also a CA file that is gone, or TLS that fails.
        return None
    free = float(cap.get("free_sandboxes", 0))
    return (node, free) if free > 0 else None


class _Turn:
    """Rotates the order of equally free nodes, so that samples started
    together (all seeing the same free room) spread over the nodes."""

    n = 0


async def rank(nodes: Sequence[NodeConfig]) -> list[NodeConfig]:
    """The nodes that answer and have room, the emptiest first (ties in
    turn)."""
    turn = _Turn.n
    _Turn.n += 1
    found: list[tuple[int, tuple[NodeConfig, float]]] = []

    async def one(i: int, n: NodeConfig) -> None:
        r = await _probe(n)
        if r is not None:
            found.append((i, r))

    async with anyio.create_task_group() as tg:
        for i, n in enumerate(nodes):
            tg.start_soon(one, i, n)
    found.sort(key=lambda x: (-x[1][1], (x[0] - turn) % len(nodes)))
    return [r[0] for _, r in found]


async def place(nodes: Sequence[NodeConfig], req: dict[str, Any]) -> tuple[Client, dict[str, Any]]:
    """Create the sandbox on the first node that takes it; the returned
    client stays open (the caller closes it)."""
    errs: list[str] = []
    ranked = await rank(nodes)
    for node in ranked:
        try:
            c = Client(node)
        except OSError as e:
            errs.append(f"{node.url}: {e}")
            continue
        try:
            return c, await c.create(req)
        except (NodeDown, OSError) as e:
            errs.append(f"{node.url}: down: {e}")
        except Problem as p:
            if p.type not in _NEXT_NODE:
                await c.aclose()
                raise
            errs.append(f"{node.url}: {p}")
        await c.aclose()
    down = len(nodes) - len(ranked)
    raise RuntimeError(
        f"pve_inspect: no node could take the sample ({down} of {len(nodes)} down or full"
        + (": " + "; ".join(errs) if errs else "")
        + ")"
    )
