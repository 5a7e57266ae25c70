"""Windows VMs as Inspect sandboxes (a fake daemon, tests/fakenode.py,
that refuses what the daemon's Windows guest client refuses: a user, a
cwd or file path that is not drive-absolute): exec passes the argv as it
is with a Windows cwd, files go by Windows paths, and none of the
provider's POSIX paths (the /bin/sh staging, chown, rm, mkdir -p) reaches
a Windows VM."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakenode import FakeNode
from inspect_ai.util import SandboxEnvironment

from inspect_pve_inspect import (
    HealthCheck,
    NodeConfig,
    PveInspectSandboxEnvironment,
    PveInspectSandboxEnvironmentConfig,
    VmSpec,
)
from inspect_pve_inspect.sandbox import INLINE_ARGV, INLINE_STDIN

pytestmark = pytest.mark.anyio

Sample = dict[str, PveInspectSandboxEnvironment]


@pytest.fixture
async def samples() -> AsyncIterator[list[tuple[PveInspectSandboxEnvironmentConfig, Sample]]]:
    made: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]] = []
    yield made
    for c, envs in made:
        await PveInspectSandboxEnvironment.sample_cleanup("t", c, dict(envs), False)


async def _sample(
    fake: FakeNode,
    node: NodeConfig,
    made: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
    *vms: VmSpec,
    **cfg: Any,
) -> Sample:
    fake.templates = ("debian", "win")
    c = PveInspectSandboxEnvironmentConfig(nodes=(node,), vms=vms, **cfg)
    envs: dict[str, SandboxEnvironment] = await PveInspectSandboxEnvironment.sample_init("t", c, {})
    out = {k: v for k, v in envs.items() if isinstance(v, PveInspectSandboxEnvironment)}
    made.append((c, out))
    return out


LINUX = VmSpec(template="debian", name="attacker")
WIN = VmSpec(template="win", name="win", os_type="win11")


def _posix(fake: FakeNode, vm: str) -> list[Any]:
    """What reached vm of the provider's POSIX paths: an exec of a /bin
    program or mkdir, a POSIX cwd or file path."""
    out: list[Any] = [b for v, b in fake.execs if v == vm and b["argv"][0].startswith("/")]
    out += [b for v, b in fake.execs if v == vm and b["argv"][0] == "mkdir"]
    out += [b for v, b in fake.execs if v == vm and str(b.get("cwd", "")).startswith("/")]
    out += [f for f in fake.files if f[1] == vm and f[2].startswith("/")]
    return out


async def test_a_windows_vm_is_a_sandbox_beside_a_linux_one(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    """Both VMs are environments, the Windows one in C:\\ (a drive root:
    nothing made there); the Linux one's working directory is made as
    before, in it only."""
    fake, node = fake_node
    envs = await _sample(fake, node, samples, LINUX, WIN)
    assert sorted(envs) == ["attacker", "win"]
    assert (envs["win"].windows, envs["win"].working_dir) == (True, "C:\\")
    assert (envs["attacker"].windows, envs["attacker"].working_dir) == (False, "/root")
    assert fake.execs == [("attacker", {"argv": ["mkdir", "-p", "--", "/root"]})]
    body = fake.sandboxes[envs["win"].sandbox_id].req
    assert body["vms"][1]["os_type"] == "win11"


@pytest.mark.parametrize(
    ("cmd", "cwd", "want_cwd"),
    [
        # a shell string, cmd.exe's operators and %VAR% in it, as it is
        (["cmd.exe", "/c", "echo %USERNAME% & dir C:\\Users"], None, "C:\\work"),
        (
            ["powershell", "-Command", "Get-ChildItem 'C:\\Program Files'"],
            "C:\\Users\\Public",
            None,
        ),
        (["python", "-c", "print('a b')"], "tools\\bin", "C:\\work\\tools\\bin"),
        (["whoami"], "C:/Temp/x/../y", "C:\\Temp\\y"),
        (["where", "cmd"], "\\Windows", "C:\\Windows"),
    ],
)
async def test_windows_exec_sends_the_argv_and_a_windows_cwd(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
    cmd: list[str],
    cwd: str | None,
    want_cwd: str | None,
) -> None:
    fake, node = fake_node
    envs = await _sample(fake, node, samples, WIN, windows_working_dir="C:\\work")
    n = len(fake.execs)
    r = await envs["win"].exec(cmd, cwd=cwd, env={"LANG": "x"}, timeout=5)
    assert r.success and r.stdout == " ".join(cmd)
    ((vm, body),) = fake.execs[n:]
    assert vm == "win"
    assert body["argv"] == cmd
    assert body["cwd"] == (want_cwd or cwd)
    assert (body["env"], body["timeout_seconds"]) == ({"LANG": "x"}, 5)
    assert "user" not in body and _posix(fake, "win") == []


async def test_windows_big_argv_and_stdin_go_inline_not_staged(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    """Past the Linux staging thresholds a Windows exec still goes as one
    request (no /bin/sh wrapper, no file uploaded, none removed); the same
    on the Linux VM is staged, as before."""
    fake, node = fake_node
    envs = await _sample(fake, node, samples, LINUX, WIN)
    big = ["cmd.exe", "/c", "echo " + "x" * (INLINE_ARGV + 10)]
    stdin = b"\x00y" * (INLINE_STDIN // 2 + 10)
    await envs["win"].exec(big, input=stdin)
    vm, body = fake.execs[-1]
    assert vm == "win" and body["argv"] == big
    assert base64.b64decode(body["stdin"]) == stdin
    assert fake.files == [] and _posix(fake, "win") == []
    await envs["attacker"].exec(big, input=stdin)
    assert fake.execs[-1][1]["argv"][0] == "/bin/sh"
    assert [f[1] for f in fake.files] == ["attacker", "attacker"]


async def test_windows_stdin_past_the_body_is_refused_before_sending(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    fake, node = fake_node
    envs = await _sample(fake, node, samples, WIN)
    n = len(fake.execs)
    with pytest.raises(ValueError, match=r"stdin of 6291456 bytes does not fit"):
        await envs["win"].exec(["findstr", "x"], input=b"y" * (6 << 20))
    assert len(fake.execs) == n and fake.files == []


async def test_windows_exec_and_connection_take_no_user(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    """user is refused before any call, with the daemon's reason (it would
    answer 400); no chown is tried. The Linux VM still takes one."""
    fake, node = fake_node
    envs = await _sample(fake, node, samples, LINUX, WIN)
    n = len(fake.execs)
    with pytest.raises(ValueError, match=r"daemon refuses it.*service account"):
        await envs["win"].exec(["whoami"], user="Administrator")
    with pytest.raises(ValueError, match="takes no user"):
        await envs["win"].connection(user="Administrator")
    assert len(fake.execs) == n
    conn = await envs["win"].connection()
    assert conn.command.endswith(f"exec --stdin {envs['win'].sandbox_id} win -- cmd.exe")
    await envs["attacker"].exec(["id"], user="nobody")
    assert fake.execs[-1] == (
        "attacker",
        {
            "argv": ["id"],
            "cwd": "/root",
            "output_limit": fake.execs[-1][1]["output_limit"],
            "user": "nobody",
        },
    )


@pytest.mark.parametrize(
    ("file", "want"),
    [
        ("C:\\Users\\Public\\a b.txt", "C:\\Users\\Public\\a b.txt"),
        ("notes.txt", "C:\\notes.txt"),
        ("sub/dir/f.bin", "C:\\sub\\dir\\f.bin"),
        ("D:/data/x.csv", "D:\\data\\x.csv"),
        ("\\Windows\\Temp\\t", "C:\\Windows\\Temp\\t"),
    ],
)
async def test_windows_files_go_by_windows_paths(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
    file: str,
    want: str,
) -> None:
    fake, node = fake_node
    envs = await _sample(fake, node, samples, WIN)
    await envs["win"].write_file(file, "hello")
    assert await envs["win"].read_file(file) == "data"
    assert fake.files == [("PUT", "win", want), ("GET", "win", want)]
    assert _posix(fake, "win") == []


async def test_windows_working_dir_is_made_through_cmd(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    """A working directory that is not a drive root is made in each
    Windows VM through cmd.exe (batch text: a % doubled), no POSIX mkdir."""
    fake, node = fake_node
    win2 = VmSpec(template="win", name="win2", os_type="win10")
    await _sample(fake, node, samples, WIN, win2, windows_working_dir="c:/eval/100%")
    line = 'mkdir "C:\\eval\\100%%" 2>nul & cd /d "C:\\eval\\100%%" && exit /b 0 || exit /b 1'
    assert fake.execs == [
        ("win", {"argv": ["cmd.exe", "/c", line]}),
        ("win2", {"argv": ["cmd.exe", "/c", line]}),
    ]


async def test_windows_working_dir_that_cannot_be_made_fails_the_sample(
    fake_node: tuple[FakeNode, NodeConfig],
) -> None:
    fake, node = fake_node
    fake.templates = ("win",)
    err = base64.b64encode(b"The system cannot find the path specified.\r\n").decode()
    fake.exec_answer = (200, {"exit_code": 1, "stdout": "", "stderr": err})
    c = PveInspectSandboxEnvironmentConfig(
        nodes=(node,), vms=(WIN,), windows_working_dir="Z:\\nope"
    )
    with pytest.raises(
        RuntimeError,
        match=r"cannot make windows_working_dir Z:\\nope: exit 1: "
        "The system cannot find the path specified",
    ):
        await PveInspectSandboxEnvironment.sample_init("t", c, {})
    assert fake.sandboxes == {}


async def test_windows_healthcheck_runs_through_exec(
    fake_node: tuple[FakeNode, NodeConfig],
    samples: list[tuple[PveInspectSandboxEnvironmentConfig, Sample]],
) -> None:
    fake, node = fake_node
    hc = HealthCheck(test=("cmd.exe", "/c", "sc query qemu-ga | findstr RUNNING"), timeout=7)
    win = VmSpec(template="win", name="win", os_type="win11", healthcheck=hc)
    await _sample(fake, node, samples, win)
    ((vm, body),) = fake.execs
    assert vm == "win" and body["argv"] == list(hc.test) and body["timeout_seconds"] == 7
    assert "cwd" not in body


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("C:\\", "C:\\"),
        ("c:/work/x/", "C:\\work\\x"),
        ("D:\\a\\\\b", "D:\\a\\b"),
        ("/root", None),
        ("C:work", None),
        ("\\\\server\\share", None),
        ("C:\\a\\..\\b", None),
        ("C:\\a:stream", None),
        ("C:\\trailing.", None),
    ],
)
def test_windows_working_dir_is_a_drive_absolute_path(value: str, want: str | None) -> None:
    if want is None:
        with pytest.raises(ValueError, match="windows_working_dir"):
            PveInspectSandboxEnvironmentConfig(windows_working_dir=value)
        return
    assert PveInspectSandboxEnvironmentConfig(windows_working_dir=value).windows_working_dir == want
