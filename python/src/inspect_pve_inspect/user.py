"""Who made a sandbox: the user id behind the ``inspect.user`` label.

Every sandbox the provider creates carries ``inspect.user=<id>``, a random
id made once per OS user and kept in the user's state directory
(``$XDG_STATE_HOME/inspect-pve-inspect/user-id``, by default
``~/.local/state/inspect-pve-inspect/user-id``). ``inspect sandbox cleanup
pve_inspect`` deletes only the sandboxes carrying this user's id, so one
user's cleanup never ends another user's running eval, even when both hold
a token that sees every sandbox of the node. The id identifies, it does not
authenticate: the daemon's tokens decide who may touch what.

Where the state home cannot be written (a read-only home with no
``XDG_STATE_HOME``, as eval runners in containers often have), the id is
made for the process instead and kept in memory, with one warning in the
log: creates go on, but ``inspect sandbox cleanup pve_inspect`` (another
process, another id) then finds none of them as this user's. Set
``XDG_STATE_HOME`` to a writable directory to keep one id across runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import secrets
from pathlib import Path

ENV_STATE_HOME = "XDG_STATE_HOME"
_ID = re.compile(r"^[0-9a-f]{32}$")

log = logging.getLogger(__name__)


def state_dir() -> Path:
    """The provider's directory under the user's state home."""
    base = os.environ.get(ENV_STATE_HOME) or str(Path.home() / ".local" / "state")
    return Path(base) / "inspect-pve-inspect"


def user_id() -> str:
    """This user's id (32 hex digits), made on first use. Two processes
    making it at once agree on one (the first link wins). If the state home
    cannot be read or written, the id of this process (see the module)."""
    path = state_dir() / "user-id"
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        return _process_fallback(path, e)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".user-id.{os.getpid()}.{secrets.token_hex(4)}")
        tmp.write_text(secrets.token_hex(16) + "\n")
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink()
        return _read(path)
    except OSError as e:
        return _process_fallback(path, e)


def _process_fallback(path: Path, err: OSError) -> str:
    """The process's id in place of the user's, warning the first time."""
    if _process_id.cache_info().currsize == 0:
        log.warning(
            "pve_inspect: cannot keep a user id in %s (%s): using an id for this process "
            "only; `inspect sandbox cleanup pve_inspect` will not find this run's "
            "sandboxes as yours (set XDG_STATE_HOME to a writable directory)",
            path,
            err,
        )
    return _process_id()


@functools.cache
def _process_id() -> str:
    """An id made once for this process."""
    return secrets.token_hex(16)


def _read(path: Path) -> str:
    v = path.read_text().strip()
    if not _ID.match(v):
        raise RuntimeError(
            f"pve_inspect: {path} does not hold a user id (32 hex digits); "
            "remove it to make a new one"
        )
    return v
