"""Who made a sandbox: the user id behind the ``inspect.user`` label.

Every sandbox the provider creates carries ``inspect.user=<id>``, a random
id made once per OS user and kept in the user's state directory
(``$XDG_STATE_HOME/inspect-pve-inspect/user-id``, by default
``~/.local/state/inspect-pve-inspect/user-id``). ``inspect sandbox cleanup
pve_inspect`` deletes only the sandboxes carrying this user's id, so one
user's cleanup never ends another user's running eval, even when both hold
a token that sees every sandbox of the node. The id identifies, it does not
authenticate: the daemon's tokens decide who may touch what.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

ENV_STATE_HOME = "XDG_STATE_HOME"
_ID = re.compile(r"^[0-9a-f]{32}$")


def state_dir() -> Path:
    """The provider's directory under the user's state home."""
    base = os.environ.get(ENV_STATE_HOME) or str(Path.home() / ".local" / "state")
    return Path(base) / "inspect-pve-inspect"


def user_id() -> str:
    """This user's id (32 hex digits), made on first use. Two processes
    making it at once agree on one (the first link wins)."""
    path = state_dir() / "user-id"
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".user-id.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_text(secrets.token_hex(16) + "\n")
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink()
    return _read(path)


def _read(path: Path) -> str:
    v = path.read_text().strip()
    if not _ID.match(v):
        raise RuntimeError(
            f"pve_inspect: {path} does not hold a user id (32 hex digits); "
            "remove it to make a new one"
        )
    return v
