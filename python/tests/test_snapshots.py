"""Snapshots for epochs: snapshot a sample's VM, change it, roll back."""

from __future__ import annotations

import pytest

from inspect_pve_inspect import PveInspectSandboxEnvironment

pytestmark = pytest.mark.anyio


async def test_snapshot_and_rollback(
    two_vm_sample: dict[str, PveInspectSandboxEnvironment],
) -> None:
    env = two_vm_sample["b"]
    await env.write_file("/root/epoch.txt", "clean\n")
    await env.snapshot("epoch0")
    await env.write_file("/root/epoch.txt", "dirty\n")
    await env.exec(["touch", "/root/left-by-attempt"])
    await env.rollback("epoch0")
    assert await env.read_file("/root/epoch.txt") == "clean\n"
    r = await env.exec(["test", "-e", "/root/left-by-attempt"])
    assert not r.success
    # The other VM of the sample is untouched by the rollback.
    other = two_vm_sample["a"]
    assert (await other.exec(["true"])).success
