"""Placing a sample's sandbox on one of several nodes.

Each node is one pve-inspectd. Every node is asked for its free capacity
(``GET /v1/capacity``: the room its resource guard still admits); a node
that does not answer is skipped, and so is one with no room for the
sample's shape (its VMs, cores and memory, the daemon's defaults filled
in). The others are tried from the one with the most room; a create that a
node refuses for want of room (``guard-refused``, ``unavailable``) or that
fails because the node went down moves on to the next. When every node
that answers is full, the sample waits for room (up to ``PLACE_WAIT``
seconds) instead of failing: the nodes bound how many samples run.

A create refused because a fixed CIDR of the sample overlaps a range
another sandbox holds (a conflict of reason ``cidr-in-use``: two samples
of one eval with the same fixed CIDR, or another eval's) waits too: it is
tried again with a growing, jittered pause until the range is free, up to
the config's ``cidr_wait_seconds``, said once in the log with the network
named as the eval's config names it. The wait is the provider's, not the
daemon's: the range may be held on another node of the cluster (the
daemon sees it free only by asking Proxmox again), only the eval knows how
long its sample may wait, and every other client keeps the daemon's
immediate answer. A holder never keeps the range past its sample: the
sandbox goes at the sample's cleanup, or one lease after its eval died.

The eval's concurrency is bounded too: :func:`node_room` (the provider's
``default_concurrency``, Inspect's default ``max_sandboxes``) is what the
nodes of the environment hold now.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from .client import Client, NodeDown, Problem, capacity_sync
from .config import ConfigError, NodeConfig, nodes_from_env

# Problem types that mean "this node cannot take it now; another may".
_NEXT_NODE = {"guard-refused", "unavailable"}
PROBE_TIMEOUT = 10.0
# How long a sample waits for room when every node that answers is full,
# and how often it asks again.
PLACE_WAIT = 900.0
PLACE_POLL = 5.0
# The pauses between tries of a create whose fixed CIDR is held: from the
# first, doubling up to the last (each jittered down to half).
RANGE_POLL_FIRST = 2.0
RANGE_POLL_MAX = 30.0

log = logging.getLogger(__name__)

# The daemon's defaults for a VM that does not say (sandboxapi validateCreate).
DEFAULT_CORES = 1
DEFAULT_MEMORY_MIB = 1024


def shape(req: Mapping[str, Any]) -> dict[str, int]:
    """The resources a create request asks for in all (a capacity shape)."""
    vms = list(req.get("vms", []))
    return {
        "vms": len(vms),
        "vcpus": sum(int(v.get("cores") or DEFAULT_CORES) for v in vms),
        "memory_mib": sum(int(v.get("memory_mib") or DEFAULT_MEMORY_MIB) for v in vms),
    }


def fits(cap: Mapping[str, Any], want: Mapping[str, int]) -> float:
    """How many sandboxes of shape ``want`` the node admits now
    (``apitype.Capacity.Fits``): 0 when over a per-sandbox cap or out of
    room, ``math.inf`` when nothing bounds it."""
    per = cap.get("sandbox", {})
    for k in ("vms", "vcpus", "memory_mib"):
        limit = int(per.get(k, 0))
        if limit > 0 and want[k] > limit:
            return 0
    free = cap.get("free", {})
    n = float(free.get("sandboxes", -1))
    n = math.inf if n < 0 else n
    for k in ("vms", "vcpus", "memory_mib"):
        f, each = int(free.get(k, -1)), want[k]
        if f >= 0 and each > 0:
            n = min(n, f // each)
    return n


async def _probe(node: NodeConfig, want: Mapping[str, int]) -> float | None:
    """Sandboxes of shape ``want`` the node has room for, or None when it
    is down."""
    try:
        with anyio.fail_after(PROBE_TIMEOUT):
            async with Client(node) as c:
                cap = await c.capacity()
                if cap is None:
                    h = await c.healthz()
                    # No capacity endpoint (an older daemon): room unknown,
                    # prefer the less loaded node.
                    return 1.0 / (2 + float(h.get("sandboxes", 0)))
    except (NodeDown, Problem, TimeoutError, OSError):
        # OSError: also a CA file that is gone, or TLS that fails.
        return None
    return fits(cap, want)


class _Turn:
    """Rotates the order of equally free nodes, so that samples started
    together (all seeing the same free room) spread over the nodes."""

    n = 0


async def rank(
    nodes: Sequence[NodeConfig], want: Mapping[str, int] | None = None
) -> tuple[list[NodeConfig], int]:
    """The nodes that answer and have room for ``want`` (one VM of the
    daemon's defaults if None), the roomiest first (ties in turn); and how
    many answered but are full."""
    want = want or {"vms": 1, "vcpus": DEFAULT_CORES, "memory_mib": DEFAULT_MEMORY_MIB}
    turn = _Turn.n
    _Turn.n += 1
    found: list[tuple[int, NodeConfig, float]] = []

    async def one(i: int, n: NodeConfig) -> None:
        r = await _probe(n, want)
        if r is not None:
            found.append((i, n, r))

    async with anyio.create_task_group() as tg:
        for i, n in enumerate(nodes):
            tg.start_soon(one, i, n)
    found.sort(key=lambda x: (-x[2], (x[0] - turn) % len(nodes)))
    return [n for _, n, room in found if room > 0], sum(1 for *_, room in found if room <= 0)


def range_held(p: Problem) -> bool:
    """Whether ``p`` refused a create because a fixed CIDR of it overlaps a
    range another sandbox holds (a refusal that ends when that one goes)."""
    return p.type == "conflict" and p.reason == "cidr-in-use"


def range_detail(p: Problem, req: Mapping[str, Any], labels: Sequence[str]) -> str:
    """The daemon's detail of a ``cidr-in-use`` refusal with the network
    named as the eval's config names it (``labels``, by the request's
    network index; the problem's field gives the index)."""
    m = re.fullmatch(r"networks\[(\d+)\]\.cidr", str(p.field or ""))
    nets = list(req.get("networks") or ())
    if m is None or int(m[1]) >= min(len(nets), len(labels)):
        return p.detail
    i = int(m[1])
    return p.detail.replace(f'network "{nets[i]["name"]}"', f"network {labels[i]}", 1)


async def place(
    nodes: Sequence[NodeConfig],
    req: dict[str, Any],
    wait: float | None = None,
    cidr_wait: float = 0.0,
    labels: Sequence[str] = (),
) -> tuple[Client, dict[str, Any]]:
    """Create the sandbox on the first node that takes it; the returned
    client stays open (the caller closes it). While every node that answers
    is full it waits for room, up to ``wait`` seconds (``PLACE_WAIT``);
    while a fixed CIDR of it is held by another sandbox, up to
    ``cidr_wait`` seconds (``labels`` name its networks in the log and the
    error)."""
    want = shape(req)
    start = anyio.current_time()
    deadline = start + (PLACE_WAIT if wait is None else wait)
    held_tries = 0
    while True:
        errs: list[str] = []
        held: Problem | None = None
        ranked, full = await rank(nodes, want)
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
                if range_held(p):
                    held = p
                elif p.type not in _NEXT_NODE:
                    await c.aclose()
                    raise
                else:
                    full += 1
                errs.append(f"{node.url}: {p}")
            await c.aclose()
        if held is not None:
            what = range_detail(held, req, labels)
            pause = min(RANGE_POLL_MAX, RANGE_POLL_FIRST * 2**held_tries)
            pause *= random.uniform(0.5, 1.0)
            waited = anyio.current_time() - start
            if waited + pause > cidr_wait:
                raise RuntimeError(
                    f"pve_inspect: {what}: still held after {waited:.0f} s of waiting "
                    f"(cidr_wait_seconds is {cidr_wait:.0f}); give the sample's network "
                    "cidr 'auto', or let fewer samples with this cidr run at once"
                )
            if held_tries == 0:
                log.warning(
                    "pve_inspect: %s; waiting for it (up to %.0f s, cidr_wait_seconds)",
                    what,
                    cidr_wait,
                )
            else:
                log.info("pve_inspect: %s; trying again in %.0f s", what, pause)
            held_tries += 1
            await anyio.sleep(pause)
            continue
        if full == 0 or anyio.current_time() + PLACE_POLL > deadline:
            break
        await anyio.sleep(PLACE_POLL)
    down = len(nodes) - len(ranked) - full
    raise RuntimeError(
        f"pve_inspect: no node could take the sample ({max(down, 0)} of {len(nodes)} down, "
        f"the others full for {want})" + (": " + "; ".join(errs) if errs else "")
    )


_room: dict[str, int | None] = {}


def node_room() -> int | None:
    """The sandboxes the nodes of the environment (``PVE_INSPECT_URL``)
    hold now, summed over the nodes that answer (each its
    ``free_sandboxes``: sandboxes of the smallest shape; a larger shape
    waits for room in :func:`place`). None when no node is configured,
    none answers, or one is unbounded. Asked once per process and URL
    list: Inspect calls it for every sample."""
    key = os.environ.get("PVE_INSPECT_URL", "")
    if key in _room:
        return _room[key]
    try:
        nodes = nodes_from_env()
    except ConfigError:
        _room[key] = None
        return None
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(nodes)) as ex:
        caps = list(ex.map(lambda n: capacity_sync(n, timeout=3.0), nodes))
    answered = [c for c in caps if c is not None]
    room: int | None = None
    if answered and all(int(c.get("free_sandboxes", -1)) >= 0 for c in answered):
        room = max(1, sum(int(c["free_sandboxes"]) for c in answered))
    _room[key] = room
    return room
