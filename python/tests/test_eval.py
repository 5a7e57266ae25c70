"""Real ``inspect_ai.eval(...)`` runs on the bed daemon: the example task
(two VMs, the mock model's bash calls in each, a scorer reading the files
back) in this provider's config and in the reference plugin's shape, and
``inspect sandbox cleanup pve_inspect`` after a killed eval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from conftest import need_bed
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ChatMessageTool

from inspect_pve_inspect import PveInspectSandboxEnvironment, PveInspectSandboxEnvironmentConfig
from inspect_pve_inspect.client import Client
from inspect_pve_inspect.config import nodes_from_env
from inspect_pve_inspect.sandbox import ENV_CLEANUP_ALL, LABEL_PROVIDER, PROVIDER

sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
from two_vm_task import two_vm


async def _ours() -> list[str]:
    out = []
    for node in nodes_from_env():
        async with Client(node) as c:
            out += [
                s["id"]
                for s in await c.list()
                if s.get("labels", {}).get(LABEL_PROVIDER) == PROVIDER
            ]
    return out


@pytest.mark.parametrize("shape", ["native", "reference", "mixed"])
def test_eval_two_vms_scores_correct(shape: str, tmp_path: Path) -> None:
    """The example eval scores correct in each shape; in ``mixed`` the
    target is an unprivileged container: the transcript's uid map of its
    bash call maps root to the node's 100000 (a VM's root is its own)."""
    need_bed()
    logs = inspect_eval(two_vm(shape=shape), log_dir=str(tmp_path), display="none")
    log = logs[0]
    assert log.status == "success", log.error
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None and log.samples[0].scores is not None
    expl = log.samples[0].scores["flags_written"].explanation or ""
    assert "from-target" in expl, expl
    maps = [
        m.text.split()
        for m in log.samples[0].messages
        if isinstance(m, ChatMessageTool) and m.function == "bash_target"
    ]
    assert len(maps) == 1 and len(maps[0]) == 3, maps
    root_outside = "100000" if shape == "mixed" else "0"
    assert maps[0][:2] == ["0", root_outside], maps
    assert anyio.run(_ours) == [], "the eval left sandboxes"


def test_cli_cleanup_removes_what_a_killed_eval_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample whose eval died before sample_cleanup: its sandbox stays
    (until its TTL); `inspect sandbox cleanup pve_inspect` deletes it, and
    with an ID deletes only that one. Another user's sandbox (another
    inspect.user id, the same token: the kind that sees every sandbox) is
    listed and left alone, deleted only with PVE_INSPECT_CLEANUP_ALL=1."""
    need_bed()
    cfg = PveInspectSandboxEnvironmentConfig()
    me = str(tmp_path / "me")
    other = str(tmp_path / "other")

    async def leave(n: int) -> list[str]:
        ids = []
        for _ in range(n):
            envs = await PveInspectSandboxEnvironment.sample_init("killed", cfg, {})
            env = next(iter(envs.values()))
            assert isinstance(env, PveInspectSandboxEnvironment)
            ids.append(env.sandbox_id)
            await env.client.aclose()  # the process "dies": no sample_cleanup
        return ids

    monkeypatch.setenv("XDG_STATE_HOME", other)
    (theirs,) = anyio.run(leave, 1)
    monkeypatch.setenv("XDG_STATE_HOME", me)
    first, second = anyio.run(leave, 2)
    assert {first, second, theirs} <= set(anyio.run(_ours))

    def cleanup(*args: str, **env: str) -> str:
        inspect = Path(sys.executable).parent / "inspect"
        r = subprocess.run(
            [str(inspect), "sandbox", "cleanup", PROVIDER, *args],
            capture_output=True,
            text=True,
            env={**os.environ, "XDG_STATE_HOME": me, **env},
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    cleanup(first)
    left = anyio.run(_ours)
    assert first not in left and second in left and theirs in left, left
    out = cleanup()
    assert set(anyio.run(_ours)) == {theirs}, out
    assert theirs in out and "left alone" in out and ENV_CLEANUP_ALL + "=1" in out, out
    out = cleanup(**{ENV_CLEANUP_ALL: "1"})
    assert anyio.run(_ours) == [], out
    assert f"deleted {theirs}" in out, out
