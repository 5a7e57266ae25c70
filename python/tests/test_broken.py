"""A broken sandbox (problem type sandbox-broken) is Inspect's sandbox
error, saying the sandbox broke and why; no daemon needed."""

from __future__ import annotations

import errno

import pytest
from inspect_ai.util._sandbox.environment import SandboxUnavailableError

from inspect_pve_inspect.client import Problem
from inspect_pve_inspect.sandbox import _exec_error, _file_error

BROKEN = {
    "type": "sandbox-broken",
    "title": "Sandbox broken",
    "status": 409,
    "detail": "sandbox sbabc123 vm vm0 is broken (vm-stopped): vm vm0 (101) is stopped in Proxmox",
    "reason": "vm-stopped",
}


@pytest.mark.parametrize("mapper", ["exec", "file"])
def test_broken_is_a_sandbox_error(mapper: str) -> None:
    p = Problem(409, BROKEN)
    err = _exec_error(p) if mapper == "exec" else _file_error(p, "/etc/hostname")
    assert isinstance(err, SandboxUnavailableError)
    assert "sandbox broken (vm-stopped)" in str(err)
    assert "stopped in Proxmox" in str(err)


def test_other_problems_keep_their_meaning() -> None:
    p = Problem(404, {"type": "file-not-found", "detail": "no such file"})
    assert isinstance(_file_error(p, "/x"), FileNotFoundError)
    other = Problem(502, {"type": "guest-agent-error", "detail": "bad"})
    assert _exec_error(other) is other


def test_no_space_is_enospc() -> None:
    p = Problem(507, {"type": "guest-no-space", "detail": "the guest's file system is full"})
    err = _file_error(p, "/root/big")
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert err.filename == "/root/big"
