"""Two bed nodes (TestInspectProviderTwoNodes sets PVE_INSPECT_URL to both,
with a token and CA each, and PVE_INSPECT_STOP_PID to the process that
keeps the second up): 8 samples spread over both; the second node is
stopped mid-eval; its samples are retried and finish on the first."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import anyio
import pytest
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, scorer
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import SandboxEnvironmentSpec, sandbox

from inspect_pve_inspect import PveInspectSandboxEnvironment, PveInspectSandboxEnvironmentConfig
from inspect_pve_inspect.client import Client, NodeDown
from inspect_pve_inspect.config import nodes_from_env

STOP_PID = "PVE_INSPECT_STOP_PID"
placements: list[tuple[int, str]] = []  # (sample id, node url) of every attempt


async def _stop_second_node() -> None:
    pid = int(os.environ[STOP_PID])
    os.kill(pid, signal.SIGTERM)
    node = nodes_from_env()[1]
    with anyio.fail_after(180):
        while True:
            try:
                async with Client(node) as c:
                    await c.healthz()
            except (NodeDown, OSError):
                return
            await anyio.sleep(1)


@solver
def work() -> Solver:
    stopped = anyio.Event()
    # samples in their exec on the second node right now
    on_second: set[int] = set()

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        env = sandbox().as_type(PveInspectSandboxEnvironment)
        sid = int(state.sample_id)
        url = env.client.node.url
        placements.append((sid, url))
        second = url == nodes_from_env()[1].url
        # Until the stop, a sample on the second node stays in its exec
        # long enough to be cut by it; the stop waits for one to be there,
        # so some sample is always mid-run on the node that goes away.
        pause = 10 if second and not stopped.is_set() else 3
        if second:
            on_second.add(sid)
        try:
            r = await env.exec(["sh", "-c", f"echo sample-{sid} > /root/out; sleep {pause}"])
        finally:
            on_second.discard(sid)
        assert r.success, r.stderr
        if not second and not stopped.is_set():
            # Mid-eval: the first sample done on the first node stops the
            # second once a sample runs there (bounded: the placement
            # spreads 4 samples over both nodes).
            stopped.set()
            with anyio.fail_after(120):
                while not on_second:
                    await anyio.sleep(0.1)
            await _stop_second_node()
        return state

    return solve


@scorer(metrics=[accuracy()])
def wrote() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        got = await sandbox().read_file("/root/out")
        return Score(value=CORRECT if got == f"sample-{state.sample_id}\n" else INCORRECT)

    return score


def test_two_nodes_one_stopped_mid_eval(tmp_path: Path) -> None:
    if not os.environ.get(STOP_PID):
        pytest.skip(f"runs in TestInspectProviderTwoNodes ({STOP_PID} unset)")
    first, second = nodes_from_env()
    task = Task(
        dataset=[Sample(input="x", id=i) for i in range(1, 9)],
        solver=work(),
        scorer=wrote(),
        sandbox=SandboxEnvironmentSpec("pve_inspect", PveInspectSandboxEnvironmentConfig()),
    )
    (log,) = inspect_eval(
        task,
        model="mockllm/model",
        log_dir=str(tmp_path),
        display="none",
        max_samples=4,
        retry_on_error=3,
        fail_on_error=False,
    )
    assert log.status == "success", log.error
    assert log.samples is not None and len(log.samples) == 8
    for s in log.samples:
        assert s.error is None, (s.id, re.sub(r"\x1b\[[0-9;]*m", "", s.error.traceback)[-4000:])
        assert s.scores is not None and s.scores["wrote"].value == CORRECT, s.id
    on = {url for _, url in placements}
    assert on == {first.url, second.url}, placements
    # After the stop every new attempt went to the first node, and the
    # samples that were on the second were retried there.
    retried = [s.id for s in log.samples if s.error_retries]
    assert retried, "no sample was on the second node when it stopped"
    last = {sid: url for sid, url in placements}
    assert set(last.values()) <= {first.url, second.url}
    assert all(last[int(str(sid))] == first.url for sid in retried), placements
