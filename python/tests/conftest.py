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
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model

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


def eval_uname_then_submit_42(task: Task, log_dir: str) -> None:
    """Run ``task`` (one sample, a ``bash`` tool, target 42) with the mock
    model of the reference's eval test: ``uname -a`` through bash, then
    submit 42; it must succeed and score correct, the bash call answered by
    a Linux guest."""
    outs = [
        ModelOutput.for_tool_call(
            model="mockllm/model", tool_name="bash", tool_arguments={"command": "uname -a"}
        ),
        ModelOutput.for_tool_call(
            model="mockllm/model", tool_name="submit", tool_arguments={"answer": "42"}
        ),
    ]
    # a usage on each output: without one the mock model counts tokens
    # with tiktoken, which downloads its encoding (no network here)
    for o in outs:
        o.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    model = get_model("mockllm/model", custom_outputs=outs)
    logs = inspect_eval(tasks=[task], model=model, log_dir=log_dir, display="none")
    log = logs[0]
    assert log.status == "success", log.error
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None
    tools = [m for m in log.samples[0].messages if isinstance(m, ChatMessageTool)]
    assert tools and "Linux" in tools[0].text, [m.text for m in tools]


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
