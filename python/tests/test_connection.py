"""``connection()``: the command it gives a person is a shell in the VM
(the daemon's CLI, ``pve-inspectd sandbox ... exec --stdin``), run here as
a person would, with the token in the environment."""

from __future__ import annotations

import os
import shlex
import shutil

import anyio
import pytest

from inspect_pve_inspect import PveInspectSandboxEnvironment

pytestmark = pytest.mark.anyio

BIN_DIR = "PVE_INSPECT_BIN_DIR"  # where TestInspectProvider built pve-inspectd


async def test_connection_is_a_shell_in_the_vm(
    two_vm_sample: dict[str, PveInspectSandboxEnvironment],
) -> None:
    path = os.pathsep.join(p for p in (os.environ.get(BIN_DIR), os.environ.get("PATH")) if p)
    if shutil.which("pve-inspectd", path=path) is None:
        if os.environ.get("CI"):
            pytest.fail(f"pve-inspectd is not on {BIN_DIR} or PATH (CI is set: a failure)")
        pytest.skip(f"SKIPPED: pve-inspectd is not on {BIN_DIR} or PATH")
    env = two_vm_sample["b"]
    conn = await env.connection()
    assert conn.type == "pve_inspect" and conn.container == f"{env.sandbox_id}/b", conn
    argv = shlex.split(conn.command)
    token = os.environ["PVE_INSPECT_TOKEN"].split(",")[0]
    r = await anyio.run_process(
        argv,
        input=b"echo from-$(hostname)-$((6*7))\nid -un\n",
        env={**os.environ, "PATH": path, "PVE_INSPECT_TOKEN": token},
        check=False,
    )
    assert r.returncode == 0, (argv, r.stdout, r.stderr)
    out = r.stdout.decode().splitlines()
    assert len(out) == 2 and out[0].startswith("from-") and out[0].endswith("-42"), out
    assert out[1] == "root", out
