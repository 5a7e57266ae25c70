"""A runnable example: scoring on what the agent reached.

Each sample asks the agent to fetch one URL. The sandbox's egress policy
(allowlist) lets both names through, but the task expects only ``allowed``:
the scorer (``inspect_pve_inspect.egress.egress_within``) reads the node's
egress record of the sample's sandbox and marks a sample that reached
anything else incorrect. The model is Inspect's mock model, scripted to
fetch the URL of its sample's input; on the playground (``make
playground``) ``example.test`` and every name under it resolve to the bed's
internet host::

    inspect eval python/examples/egress_task.py --model mockllm/model
    inspect eval python/examples/egress_task.py -T allowed=pypi.org -T other=example.com
"""

from __future__ import annotations

import re

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    ChatMessageUser,
    GenerateConfig,
    Model,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import ToolChoice, ToolInfo, bash
from inspect_ai.util import SandboxEnvironmentSpec

from inspect_pve_inspect import PveInspectSandboxEnvironmentConfig, VmSpec
from inspect_pve_inspect.config import EgressSpec
from inspect_pve_inspect.egress import egress_within

_URL = re.compile(r"https?://\S+")


def fetch_turn(
    messages: list[ChatMessage], tools: list[ToolInfo], choice: ToolChoice, config: GenerateConfig
) -> ModelOutput:
    """The mock model's turn: fetch the URL of the sample's input once,
    then answer. Every output carries a usage (no tokenizer download)."""
    if not any(isinstance(m, ChatMessageTool) for m in messages):
        first = next(m for m in messages if isinstance(m, ChatMessageUser))
        m = _URL.search(first.text)
        url = m.group(0) if m else "http://invalid./"
        cmd = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 {url}"
        out = ModelOutput.for_tool_call("mockllm/model", "bash", {"command": cmd})
    else:
        out = ModelOutput.from_content("mockllm/model", "done")
    out.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return out


def mock_model() -> Model:
    """The scripted mock model."""
    return get_model("mockllm/model", custom_outputs=fetch_turn)


@task
def egress(
    allowed: str = "example.test", other: str = "other.example.test", template: str = "debian"
) -> Task:
    config = PveInspectSandboxEnvironmentConfig(
        vms=(VmSpec(template=template, name="agent"),),
        egress=EgressSpec(mode="allowlist", allow=(allowed, other)),
    )
    return Task(
        dataset=[
            Sample(input=f"Fetch http://{allowed}/ and stop.", id="expected"),
            Sample(input=f"Fetch http://{other}/ and stop.", id="elsewhere"),
        ],
        solver=[use_tools(bash(timeout=60)), generate()],
        scorer=egress_within([allowed]),
        sandbox=SandboxEnvironmentSpec("pve_inspect", config),
        model=mock_model(),
    )
