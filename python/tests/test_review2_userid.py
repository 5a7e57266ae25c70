"""review2: the user id is made on disk before the first create; where the
state home cannot be written (a read-only root filesystem, as eval runners
in Kubernetes often have, with no XDG_STATE_HOME), every sandbox create of
the eval fails instead of falling back to an id that is not persisted."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspect_pve_inspect.config import PveInspectSandboxEnvironmentConfig
from inspect_pve_inspect.sandbox import LABEL_USER, create_request


def test_create_without_writable_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # stands in for a read-only state home (root ignores modes)
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    req = create_request(PveInspectSandboxEnvironmentConfig(), "task")
    assert req["labels"][LABEL_USER]
