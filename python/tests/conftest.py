"""Fixtures: the bed daemon (PVE_INSPECT_URL, PVE_INSPECT_TOKEN,
PVE_INSPECT_CA_FILE; the Go test TestInspectProvider sets them) and a
sample's sandbox on it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from inspect_pve_inspect import PveInspectSandboxEnvironment, PveInspectSandboxEnvironmentConfig
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
