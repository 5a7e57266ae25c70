"""Inspect's own conformance suite on a pve_inspect sandbox (the bed): on a
VM, and on an unprivileged container (kind lxc) entered without an agent.

Known failures (the same on both), each shown by a test below: the guest agent (and so every
exec without ``user``, and every file read and write) runs as root, and
root is not stopped by a file's mode bits. Inspect's permission checks
expect a refusal a root caller never gets; the reference Proxmox plugin
lists the same three (and, besides, the 50 MiB round trip, which passes
here).
"""

from __future__ import annotations

import pytest
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from inspect_pve_inspect import PveInspectSandboxEnvironment

pytestmark = pytest.mark.anyio

KNOWN_FAILURES = {
    "test_read_file_not_allowed": "root ignores mode bits",
    "test_write_text_file_without_permissions": "root ignores mode bits",
    "test_write_binary_file_without_permissions": "root ignores mode bits",
}


@pytest.fixture(params=["vm", "lxc"])
async def sandbox_env(
    request: pytest.FixtureRequest,
    two_vm_sample: dict[str, PveInspectSandboxEnvironment],
    container_sample: dict[str, PveInspectSandboxEnvironment],
) -> PveInspectSandboxEnvironment:
    name = getattr(request.node, "originalname", request.node.name)
    if name in KNOWN_FAILURES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_FAILURES[name], strict=True))
    if request.param == "lxc":
        return container_sample["box"]
    return next(iter(two_vm_sample.values()))


async def test_known_failure_root_ignores_mode_bits(
    sandbox_env: PveInspectSandboxEnvironment,
) -> None:
    """Why the three are known failures: the default user is root (in a
    container, root of its user namespace: uid 100000 on the node), and a
    file with no permission bits at all is still read and written."""
    env = sandbox_env
    who = await env.exec(["id", "-u"])
    assert who.stdout.strip() == "0"
    await env.write_file("known_failure.file", "x")
    assert (await env.exec(["chmod", "000", "known_failure.file"])).success
    assert await env.read_file("known_failure.file") == "x"
    await env.write_file("known_failure.file", "y")
    assert await env.read_file("known_failure.file") == "y"
    # ...while an unprivileged user is refused by the same file:
    r = await env.exec(["cat", "known_failure.file"], user="nobody")
    assert not r.success and "Permission denied" in r.stderr
    await env.exec(["rm", "-f", "known_failure.file"])
