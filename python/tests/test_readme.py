"""The README's Inspect section as written, on the bed daemon: its config
block and its config file pass the node's checks (``task_init``'s), and its
``inspect eval ... --sandbox pve_inspect:FILE`` line runs the example and
scores. The section is read from the README itself, so an example that
names what the playground lacks (a ``kali`` template) fails here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
from conftest import need_bed
from inspect_ai.log import list_eval_logs, read_eval_log
from inspect_ai.util import SandboxEnvironmentSpec

import inspect_pve_inspect
from inspect_pve_inspect import PveInspectSandboxEnvironmentConfig
from inspect_pve_inspect.compat import coerce
from inspect_pve_inspect.preflight import preflight
from inspect_pve_inspect.sandbox import create_request

REPO = Path(__file__).resolve().parents[2]
HEADING = "## Inspect: the `pve_inspect` sandbox provider"


def _section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start : end if end >= 0 else len(text)]


def _config_block(sec: str) -> str:
    m = re.search(r"```python\n(.*?)```", sec, re.S)
    assert m, "the Inspect section has no python config block"
    return m.group(1)


def _config_file(sec: str) -> tuple[str, str]:
    """The heredoc's target path and body (the README indents both by 4)."""
    m = re.search(r"\n    cat > (\S+) <<'EOF'\n(.*?)\n    EOF\n", sec, re.S)
    assert m, "the Inspect section has no config file heredoc"
    return m.group(1), textwrap.dedent(m.group(2)) + "\n"


def _eval_line(sec: str) -> list[str]:
    for line in sec.splitlines():
        if "inspect eval" in line and "--sandbox pve_inspect:" in line:
            return shlex.split(line.split("#", 1)[0])
    raise AssertionError(
        "the Inspect section has no `inspect eval ... --sandbox pve_inspect:` line"
    )


def test_readme_sections_parse() -> None:
    """Needs no bed: the pieces the bed tests run are where they say."""
    sec = _section()
    _config_block(sec)
    path, body = _config_file(sec)
    assert path in " ".join(_eval_line(sec)), "the eval line does not use the config file"
    assert "vms:" in body


def _check(cfg: PveInspectSandboxEnvironmentConfig) -> None:
    anyio.run(preflight, cfg, create_request(cfg, "readme"))


def test_readme_config_block_passes_the_node() -> None:
    need_bed()
    names = {k: getattr(inspect_pve_inspect, k) for k in inspect_pve_inspect.__all__}
    spec = eval(
        compile(_config_block(_section()), "README.md", "eval"),
        {"SandboxEnvironmentSpec": SandboxEnvironmentSpec, **names},
    )
    assert isinstance(spec, SandboxEnvironmentSpec) and spec.type == "pve_inspect"
    assert isinstance(spec.config, PveInspectSandboxEnvironmentConfig)
    _check(spec.config)


def test_readme_config_file_runs_the_example(tmp_path: Path) -> None:
    """The heredoc written where the README writes it (under tmp_path), then
    the README's eval line as written, from the checkout's root, with the
    logs under tmp_path."""
    need_bed()
    sec = _section()
    path, body = _config_file(sec)
    cfg_file = tmp_path / Path(path).name
    cfg_file.write_text(body)
    _check(coerce(str(cfg_file)))  # the file as Inspect hands it over: a path
    argv = [a.replace(path, str(cfg_file)) for a in _eval_line(sec)]
    assert argv[0] == "python/.venv/bin/inspect", argv
    argv[0] = str(Path(sys.executable).parent / "inspect")
    logs = tmp_path / "logs"
    run = subprocess.run(
        [*argv, "--log-dir", str(logs), "--display", "plain"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    found = list_eval_logs(str(logs))
    assert len(found) == 1, found
    log = read_eval_log(found[0])
    assert log.status == "success", log.error
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
