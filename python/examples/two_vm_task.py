"""A runnable example: a two-VM sample on pve-inspect, scored by a file.

The model (here Inspect's mock model, scripted; swap in a real one) runs
``bash`` in VM ``attacker`` and in VM ``target``; the scorer reads back the
file each wrote. Run it against a daemon (the playground prints the URL,
CA and token)::

    export PVE_INSPECT_URL=https://127.0.0.1:8443 PVE_INSPECT_TOKEN=pvei_... \\
           PVE_INSPECT_CA_FILE=/run/pve-inspect-testbed/<bed>/demo/api.pem
    inspect eval python/examples/two_vm_task.py --model mockllm/model

``-T shape=reference`` runs the same sample from a config written for the
reference Proxmox plugin (``ProxmoxSandboxEnvironmentConfig``), only the
sandbox type changed. ``-T shape=mixed`` makes ``target`` an unprivileged
container (``kind="lxc"``, from CT template ``-T ct_template=ct-debian``)
beside the ``attacker`` VM: the same tools, files and scorer.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    GenerateConfig,
    Model,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import ToolChoice, ToolInfo, bash, tool_with
from inspect_ai.util import SandboxEnvironmentSpec, sandbox
from pydantic import BaseModel

from inspect_pve_inspect import PveInspectSandboxEnvironmentConfig, VmSpec
from inspect_pve_inspect.compat import (
    DhcpRange,
    ProxmoxSandboxEnvironmentConfig,
    SdnConfig,
    SubnetConfig,
    VmConfig,
    VmNicConfig,
    VmSourceConfig,
    VnetConfig,
)

FLAG = "/root/flag.txt"


def native_config(template: str = "debian") -> PveInspectSandboxEnvironmentConfig:
    return PveInspectSandboxEnvironmentConfig(
        vms=(VmSpec(template=template, name="attacker"), VmSpec(template=template, name="target")),
        labels={"example": "two-vm"},
    )


def mixed_config(
    template: str = "debian", ct_template: str = "ct-debian"
) -> PveInspectSandboxEnvironmentConfig:
    """The attacker a VM, the target an unprivileged container."""
    return PveInspectSandboxEnvironmentConfig(
        vms=(
            VmSpec(template=template, name="attacker"),
            VmSpec(template=ct_template, name="target", kind="lxc", memory_mib=512),
        ),
        labels={"example": "mixed"},
    )


def reference_config(template: str = "debian") -> ProxmoxSandboxEnvironmentConfig:
    def vm(name: str) -> VmConfig:
        return VmConfig(
            vm_source_config=VmSourceConfig(existing_vm_template_tag=template),
            name=name,
            ram_mb=1024,
            vcpus=1,
            nics=(VmNicConfig(vnet_alias="lab"),),
        )

    return ProxmoxSandboxEnvironmentConfig(
        sdn_config=SdnConfig(
            vnet_configs=(
                VnetConfig(
                    alias="lab",
                    subnets=(
                        SubnetConfig(
                            cidr="172.31.250.0/24",
                            gateway="172.31.250.1",
                            snat=False,
                            dhcp_ranges=(DhcpRange(start="172.31.250.10", end="172.31.250.254"),),
                        ),
                    ),
                ),
            )
        ),
        vms_config=(vm("attacker"), vm("target")),
    )


def scripted_turn(
    messages: list[ChatMessage], tools: list[ToolInfo], choice: ToolChoice, config: GenerateConfig
) -> ModelOutput:
    """The mock model's turn in a sample: bash in each VM, then an answer,
    by how many tool results the conversation holds (so every sample of a
    concurrent eval gets the whole script). Every output carries a usage,
    so the mock model counts no tokens itself (no tokenizer download)."""
    done = sum(1 for m in messages if isinstance(m, ChatMessageTool))
    script = [
        ("bash", f"echo from-$(hostname)-attacker > {FLAG}"),
        # the uid map shows, in the transcript, whose root the target's is
        ("bash_target", f"echo from-target > {FLAG}; cat /proc/self/uid_map"),
    ]
    if done < len(script):
        tool, cmd = script[done]
        out = ModelOutput.for_tool_call("mockllm/model", tool, {"command": cmd})
    else:
        out = ModelOutput.from_content("mockllm/model", "done")
    out.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return out


@scorer(metrics=[accuracy()])
def flags_written() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        a = await sandbox("attacker").read_file(FLAG)
        t = await sandbox("target").read_file(FLAG)
        ok = a.startswith("from-") and a.endswith("-attacker\n") and t == "from-target\n"
        return Score(
            value=CORRECT if ok else INCORRECT, explanation=f"attacker {a!r}, target {t!r}"
        )

    return score


@task
def two_vm(
    shape: str = "native",
    template: str = "debian",
    samples: int = 1,
    ct_template: str = "ct-debian",
) -> Task:
    config: BaseModel
    if shape == "reference":
        config = reference_config(template)
    elif shape == "mixed":
        config = mixed_config(template, ct_template)
    elif shape == "native":
        config = native_config(template)
    else:
        raise ValueError(f"shape {shape!r}: one of native, reference, mixed")
    return Task(
        dataset=[Sample(input="Write the flags.", id=i + 1) for i in range(samples)],
        solver=[
            use_tools(
                bash(timeout=60), tool_with(bash(timeout=60, sandbox="target"), name="bash_target")
            ),
            generate(),
        ],
        scorer=flags_written(),
        sandbox=SandboxEnvironmentSpec("pve_inspect", config),
        model=mock_model(),
    )


def mock_model() -> Model:
    """The scripted mock model (``inspect_ai.eval(two_vm(), model=mock_model())``)."""
    return get_model("mockllm/model", custom_outputs=scripted_turn)
