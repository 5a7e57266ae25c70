"""Fixtures: the bed daemon (PVE_INSPECT_URL, PVE_INSPECT_TOKEN,
PVE_INSPECT_CA_FILE; the Go test TestInspectProvider sets them) and a
sample's sandbox on it; a fake daemon for the rules that need no bed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import pytest
from fakenode import FakeNode, serve

from inspect_pve_inspect import (
    NodeConfig,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
)
from inspect_pve_inspect.config import ENV_URL


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def need_bed() -> None:
    """Skip loudly without a bed daemon; under CI that is a failure."""
    if os.environ.get(ENV_URL):
        return
    if os.environ.get("CI"):
        pytest.fail(f"{ENV_URL} is not set (CI is set, so this is a failure)")
    pytest.skip(
        f"SKIPPED: no bed daemon ({ENV_URL} unset); see cmd/pve-inspect-demo TestInspectProvider"
    )


@pytest.fixture
def fake_node() -> Iterator[tuple[FakeNode, NodeConfig]]:
    """A fake daemon (tests/fakenode.py) on a unix socket, and its node."""
    d = tempfile.mkdtemp(prefix="pvei-", dir="/tmp")  # a socket path is short
    fake = FakeNode()
    try:
        with serve(os.path.join(d, "api.sock"), fake) as node:
            yield fake, node
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
async def two_vm_sample() -> AsyncIterator[dict[str, PveInspectSandboxEnvironment]]:
    """One sample's sandbox of two VMs (a, b) for a whole module."""
    need_bed()
    from inspect_pve_inspect import VmSpec

    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(VmSpec(template="debian", name="a"), VmSpec(template="debian", name="b"))
    )
    envs = await PveInspectSandboxEnvironment.sample_init("selfcheck", cfg, {})
    try:
        yield {k: v for k, v in envs.items() if isinstance(v, PveInspectSandboxEnvironment)}
    finally:
        await PveInspectSandboxEnvironment.sample_cleanup("selfcheck", cfg, envs, False)


@pytest.fixture(scope="module")
async def container_sample() -> AsyncIterator[dict[str, PveInspectSandboxEnvironment]]:
    """One sample's sandbox of a VM (a) and an unprivileged container (box,
    kind lxc, from the playground's container template) for a whole module."""
    need_bed()
    from inspect_pve_inspect import VmSpec

    cfg = PveInspectSandboxEnvironmentConfig(
        vms=(
            VmSpec(template="debian", name="a"),
            VmSpec(template="ct-debian", name="box", kind="lxc", memory_mib=512),
        )
    )
    envs = await PveInspectSandboxEnvironment.sample_init("selfcheck-ct", cfg, {})
    try:
        yield {k: v for k, v in envs.items() if isinstance(v, PveInspectSandboxEnvironment)}
    finally:
        await PveInspectSandboxEnvironment.sample_cleanup("selfcheck-ct", cfg, envs, False)
