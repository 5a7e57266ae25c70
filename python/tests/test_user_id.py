"""The user id behind the ``inspect.user`` label (user.py). It is made on
disk before the first create; where the state home cannot be written (a
read-only root filesystem, as eval runners in Kubernetes often have, with no
XDG_STATE_HOME), creates go on with an id kept for the process, warned about
once, instead of every sandbox create of the eval failing."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from inspect_pve_inspect import user
from inspect_pve_inspect.config import PveInspectSandboxEnvironmentConfig
from inspect_pve_inspect.sandbox import LABEL_USER, create_request


def test_create_without_writable_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    user._process_id.cache_clear()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # stands in for a read-only state home (root ignores modes)
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    with caplog.at_level(logging.WARNING, logger=user.__name__):
        ids = [
            create_request(PveInspectSandboxEnvironmentConfig(), "task")["labels"][LABEL_USER]
            for _ in range(3)
        ]
    assert re.fullmatch(r"[0-9a-f]{32}", ids[0])
    assert ids == [ids[0]] * 3, "the process's creates carry one id"
    warned = [r for r in caplog.records if "for this process only" in r.getMessage()]
    assert len(warned) == 1, caplog.records


def test_user_id_kept_in_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    first = user.user_id()
    assert (tmp_path / "inspect-pve-inspect" / "user-id").read_text().strip() == first
    assert user.user_id() == first
