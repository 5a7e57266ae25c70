"""The ``pve_inspect`` sandbox environment.

One sample = one pve-inspectd sandbox (``POST /v1/sandboxes``): its VMs on
an SDN zone of their own; every VM marked ``sandbox`` is an Inspect
environment, named by its VM name, the first one the default. Commands and
files go through the daemon's guest-agent API; a Windows VM's (os_type
win10, win11) by Windows paths, its argv as given, without the POSIX
staging of big arguments and stdin. A heartbeat
(:mod:`.keepalive`) renews the sandbox's lease while the sample runs; the
VMs are deleted in ``sample_cleanup``, and whatever a killed eval left is
found again by its labels (``inspect sandbox cleanup pve_inspect``, this
user's only: see :mod:`.user`) or reaped one lease after its last renewal.
``task_init`` checks the config against every node first (:mod:`.preflight`).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import ntpath
import os
import posixpath
import secrets
import shlex
import uuid
from collections.abc import Sequence
from typing import Any, Literal, overload

import anyio
from inspect_ai.log import transcript
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    sandboxenv,
    store,
)
from pydantic import BaseModel

from .client import Client, NodeDown, Problem, TooLarge
from .compat import coerce
from .config import NodeConfig, PveInspectSandboxEnvironmentConfig
from .healthcheck import wait_all
from .keepalive import Keepalive, gone_problem, lease_seconds, parse_time
from .placement import node_room, place
from .preflight import named_refusal, preflight, range_label
from .user import user_id

log = logging.getLogger(__name__)

# Labels on every sandbox this provider creates.
LABEL_PROVIDER = "inspect.provider"
LABEL_TASK = "inspect.task"
LABEL_RUN = "inspect.run"
# This OS user's id (user.user_id): cli_cleanup deletes only its own.
LABEL_USER = "inspect.user"
PROVIDER = "pve_inspect"

# Set to 1 (or true, yes), `inspect sandbox cleanup pve_inspect` deletes
# every provider sandbox its token sees, other users' included, after
# listing them (Inspect's cleanup command passes only an id, so the opt-in
# is this variable).
ENV_CLEANUP_ALL = "PVE_INSPECT_CLEANUP_ALL"

# stdin up to this size rides in the exec body (the daemon caps the body at
# 8 MiB, base64 grows it by a third), and arguments up to this total (the
# daemon caps them at 1 MiB); past either, they are uploaded as files first.
INLINE_STDIN = 2 << 20
INLINE_ARGV = 512 << 10

# The wrapper of a staged exec: sources the uploaded script (it sets "$@"
# and opens stdin), unlinks it, then runs the command through the guest's
# PATH as the agent's own exec would. Launched by absolute path.
_STAGED_WRAPPER = 'f=$1; . "$f" || exit 125; rm -f -- "$f"; unset f; exec "$@"'

# The daemon's cap on an exec body (sandboxapi maxExecBody). A Windows
# guest takes stdin in one guest-exec only, so it rides in the body
# whatever its size (no staging through /bin/sh there).
EXEC_BODY_MAX = 8 << 20

# Why exec takes no user in a Windows VM: the daemon refuses it (400).
_WINDOWS_NO_USER = (
    "exec takes no user in a Windows VM: the daemon refuses it (400), as the Windows guest "
    "agent runs every command as its own service account and Windows has no setpriv"
)


def _label_value(s: str) -> str:
    out = "".join(c if c.isprintable() else "_" for c in s)
    return out[:256] or "_"


class _Run:
    """What this process created and has not deleted (for task_cleanup)."""

    id = uuid.uuid4().hex[:16]
    live: dict[str, NodeConfig] = {}  # noqa: RUF012 - sandbox id -> its node
    # sandbox id -> its heartbeat, until sample_cleanup (or task_cleanup) stops it
    keepalives: dict[str, Keepalive] = {}  # noqa: RUF012
    # sandbox id -> the sandbox config its sample was made with: Inspect
    # calls task_cleanup once per distinct config (with the task name
    # "shutdown", not the task's), so a cleanup stops and deletes the
    # sandboxes of its config only, never those of another config that
    # another task of the same eval-set still runs
    cfg_of: dict[str, str] = {}  # noqa: RUF012


@sandboxenv(name=PROVIDER)
class PveInspectSandboxEnvironment(SandboxEnvironment):
    """A VM of a pve-inspectd sandbox."""

    def __init__(
        self,
        client: Client,
        sandbox_id: str,
        vm: str,
        working_dir: str,
        sandbox: dict[str, Any],
        keepalive: Keepalive | None = None,
        windows: bool = False,
    ) -> None:
        super().__init__()
        self.client = client
        self.sandbox_id = sandbox_id
        self.vm = vm
        self.working_dir = working_dir
        self.sandbox = sandbox
        # A Windows VM (os_type win10, win11): Windows paths (ntpath), the
        # argv passed as it is, no user, no staging through /bin/sh.
        self.windows = windows
        # The sample's heartbeat (one per sandbox, shared by its VMs): it
        # also knows the sandbox's expiry, for saying why it is gone.
        self.keepalive = keepalive

    # --- lifecycle -------------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return coerce(config)

    @classmethod
    def config_files(cls) -> list[str]:
        """Config files Inspect finds in the task's directory when
        ``--sandbox pve_inspect`` names none (``pve_inspect:FILE`` names one)."""
        return ["pve_inspect.yaml", "pve_inspect.yml", "pve_inspect.json"]

    @classmethod
    def default_concurrency(cls) -> int | None:
        """Inspect's default ``max_sandboxes``: the sandboxes the nodes of
        the environment hold now (``GET /v1/capacity`` of each, summed);
        None (no bound) when none answers or one is unbounded. A sample
        that finds every node full waits for room (placement.PLACE_WAIT)."""
        return node_room()

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Fail at task start, not per sample, with one message: the config
        (a file's too) converts, every node that answers accepts the token
        and would create it (templates, caps, egress, networks), and at
        least one answers."""
        cfg = coerce(config)
        await preflight(cfg, create_request(cfg, task_name))

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        cfg = coerce(config)
        req = create_request(cfg, task_name)
        try:
            client, sb = await place(
                cfg.resolved_nodes(),
                req,
                cidr_wait=cfg.cidr_wait_seconds,
                labels=[range_label(cfg, i) for i in range(len(cfg.networks))],
            )
        except Problem as p:
            # a create refused (what task_init's check could not foresee),
            # its field named as the config names it
            raise named_refusal(p, cfg, req) from None
        _Run.live[sb["id"]] = client.node
        _Run.cfg_of[sb["id"]] = _config_key(cfg)
        try:
            try:
                health = await client.healthz()
            except (NodeDown, Problem):
                health = {}  # the lease is then the config's, or an hour
            ka = Keepalive(
                client,
                sb["id"],
                lease_seconds(cfg.ttl_seconds, health),
                parse_time(sb.get("expires_at")),
            )
            if cfg.keepalive and ka.start():
                _Run.keepalives[sb["id"]] = ka
            envs: dict[str, SandboxEnvironment] = {}
            for vm, spec in zip(sb["vms"], cfg.resolved_vms(), strict=True):
                if spec.sandbox:
                    win = spec.is_windows()
                    wd = cfg.windows_working_dir if win else cfg.working_dir
                    envs[vm["name"]] = cls(client, sb["id"], vm["name"], wd, sb, ka, windows=win)
            checks = [
                (vm["name"], spec.healthcheck)
                for vm, spec in zip(sb["vms"], cfg.resolved_vms(), strict=True)
                if spec.healthcheck is not None
            ]
            if checks:
                await wait_all(client, sb["id"], checks)
            await _make_working_dirs(
                [e for e in envs.values() if isinstance(e, PveInspectSandboxEnvironment)]
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _stop_keepalive(sb["id"])
                await _delete(client, sb["id"])
                await client.aclose()
            raise
        return envs

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        seen: set[str] = set()
        for env in environments.values():
            if not isinstance(env, PveInspectSandboxEnvironment) or env.sandbox_id in seen:
                continue
            seen.add(env.sandbox_id)
            with anyio.CancelScope(shield=True):
                await _stop_keepalive(env.sandbox_id)
                if interrupted:
                    await _delete(env.client, env.sandbox_id)
                else:
                    await _delete_attaching_egress(env)
                await env.client.aclose()

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        key = _config_key(coerce(config))
        mine = {sid for sid, k in _Run.cfg_of.items() if k == key}
        for sid in list(_Run.keepalives):
            if sid in mine:
                await _stop_keepalive(sid)
        left = {sid: node for sid, node in _Run.live.items() if sid in mine}
        if not left:
            return
        if not cleanup:
            print(f"pve_inspect: {len(left)} sandbox(es) kept: {', '.join(sorted(left))}")
            return
        for sid, node in left.items():
            async with Client(node) as c:
                await _delete(c, sid)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """Delete sandbox ``id``; without one, every sandbox this user's
        runs made on the nodes of the environment (labelled
        ``inspect.provider=pve_inspect`` and ``inspect.user`` = this user's
        id). Other provider sandboxes the token sees (other users', a run
        older than the label) are listed and left alone, unless
        ``PVE_INSPECT_CLEANUP_ALL=1``: then they are listed and deleted."""
        everyone = os.environ.get(ENV_CLEANUP_ALL, "").strip().lower() in ("1", "true", "yes")
        me = user_id()
        for node in PveInspectSandboxEnvironment._cleanup_nodes():
            try:
                async with Client(node) as c:
                    sbs = await c.list()
                    if id is not None:
                        for sb in sbs:
                            if sb["id"] == id:
                                await _cli_delete(c, node, sb)
                        continue
                    ours = [sb for sb in sbs if _labels(sb).get(LABEL_PROVIDER) == PROVIDER]
                    mine = [sb for sb in ours if _labels(sb).get(LABEL_USER) == me]
                    others = [sb for sb in ours if _labels(sb).get(LABEL_USER) != me]
                    if others:
                        what = "deleting" if everyone else "left alone"
                        print(
                            f"pve_inspect: {node.url}: {len(others)} sandbox(es) of other users "
                            f"or older runs, {what}:"
                        )
                        for sb in others:
                            print("  " + _describe(sb))
                        if not everyone:
                            print(f"pve_inspect: set {ENV_CLEANUP_ALL}=1 to delete them too")
                    for sb in mine + (others if everyone else []):
                        await _cli_delete(c, node, sb)
            except NodeDown as e:
                print(f"pve_inspect: {node.url} is down: {e}")

    @staticmethod
    def _cleanup_nodes() -> Sequence[NodeConfig]:
        return PveInspectSandboxEnvironmentConfig().resolved_nodes()

    # --- exec ------------------------------------------------------------

    def _path(self, p: str) -> str:
        """p in the guest: relative to the working directory; a Windows
        VM's by Windows rules (``C:\\dir``, ``C:/dir``; a rooted ``\\dir``
        on the working directory's drive)."""
        if self.windows:
            return ntpath.normpath(ntpath.join(self.working_dir, p))
        return posixpath.normpath(posixpath.join(self.working_dir, p))

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if user is not None and self.windows:
            raise ValueError(f"pve_inspect: VM {self.vm!r}: {_WINDOWS_NO_USER}")
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        req: dict[str, Any] = {
            "argv": list(cmd),
            "cwd": self._path(cwd) if cwd else self.working_dir,
            "output_limit": limit,
        }
        if env:
            req["env"] = dict(env)
        if user is not None:
            req["user"] = user
        if timeout is not None:
            req["timeout_seconds"] = max(1, int(timeout))
        stdin = input.encode() if isinstance(input, str) else input
        big_argv = sum(len(a.encode()) + 1 for a in cmd) > INLINE_ARGV
        big_stdin = stdin is not None and len(stdin) > INLINE_STDIN
        if self.windows:
            # No staging (its wrapper is /bin/sh): the argv goes as it is,
            # within the daemon's caps, and stdin in the body.
            big_argv = big_stdin = False
            if stdin is not None:
                _check_windows_stdin(self.vm, req, len(stdin))
        staged: list[str] = []
        if big_argv or big_stdin:
            # Past the exec body's caps: the arguments (and stdin) go up as
            # files first; a sourced script sets them and unlinks the files.
            staged = await self._stage(cmd, stdin if big_stdin else None, user)
            req["argv"] = ["/bin/sh", "-c", _STAGED_WRAPPER, "pve-inspect-exec", staged[0]]
        if stdin is not None and not big_stdin:
            # An empty stdin is the agent's default (/dev/null): nothing to send.
            req["stdin"] = base64.b64encode(stdin).decode()
        try:
            ans = await self.client.exec(self.sandbox_id, self.vm, req)
        except Problem as p:
            for f in staged:
                await self._unlink(f)
            raise self._gone(p) or _exec_error(p) from p
        except NodeDown as e:
            raise SandboxUnavailableError(str(e)) from e
        if ans.timed_out:
            raise TimeoutError(f"command timed out after {timeout} seconds: {shlex.join(cmd)}")
        stdout = ans.stdout.decode("utf-8", errors="replace")
        stderr = ans.stderr.decode("utf-8", errors="replace")
        if ans.stdout_truncated or ans.stderr_truncated:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=stdout if ans.stdout_truncated else stderr,
            )
        if ans.exit_code == 126 and "permission denied" in stderr.lower():
            raise PermissionError(
                errno.EACCES, f"permission denied executing {cmd[0]}: {stderr.strip()}"
            )
        return ExecResult(
            success=ans.exit_code == 0, returncode=ans.exit_code, stdout=stdout, stderr=stderr
        )

    async def _stage(self, cmd: list[str], stdin: bytes | None, user: str | None) -> list[str]:
        """Upload the script that sets the command's arguments (and opens
        its stdin); returns the paths, the script first."""
        base = f"/tmp/.pve-inspect-exec-{secrets.token_hex(8)}"
        script, paths = [], [base + ".sh"]
        if stdin is not None:
            paths.append(base + ".in")
            await self._write(paths[1], stdin, 0o600)
            script.append(f"exec 0<{shlex.quote(paths[1])} || exit 125")
            script.append(f"rm -f -- {shlex.quote(paths[1])}")
        script.append("set -- " + " ".join(shlex.quote(a) for a in cmd))
        await self._write(paths[0], ("\n".join(script) + "\n").encode(), 0o600)
        if user is not None and user not in ("root", "0"):
            r = await self.client.exec(
                self.sandbox_id, self.vm, {"argv": ["/bin/chown", "--", user, *paths]}
            )
            if r.exit_code != 0:
                # No such user: let the command's own exec say so.
                for f in paths:
                    await self._unlink(f)
        return paths

    async def _unlink(self, path: str) -> None:
        with contextlib.suppress(Problem, NodeDown):
            await self.client.exec(
                self.sandbox_id, self.vm, {"argv": ["/bin/rm", "-f", "--", path]}
            )

    def _gone(self, p: Problem) -> SandboxUnavailableError | None:
        """Inspect's sandbox error when ``p`` says the sandbox is gone
        (expired, deleted: during the call or before it), saying why; None
        for any other problem."""
        if not gone_problem(p):
            return None
        why = self.keepalive.why_gone(p) if self.keepalive is not None else p.detail
        return SandboxUnavailableError(f"pve_inspect: sandbox {self.sandbox_id} is gone: {why}")

    # --- files -----------------------------------------------------------

    async def _write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        try:
            await self.client.write_file(self.sandbox_id, self.vm, path, data, mode)
        except Problem as p:
            raise self._gone(p) or _file_error(p, path) from p
        except NodeDown as e:
            raise SandboxUnavailableError(str(e)) from e

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        await self._write(self._path(file), data)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        path = self._path(file)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        chunks: list[bytes] = []
        try:
            async for c in self.client.read_file(self.sandbox_id, self.vm, path, limit):
                chunks.append(c)
        except TooLarge:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            ) from None
        except Problem as p:
            raise self._gone(p) or _file_error(p, file) from p
        except NodeDown as e:
            raise SandboxUnavailableError(str(e)) from e
        data = b"".join(chunks)
        # newline="" semantics: bytes are decoded as they are, CRLF kept.
        return data.decode("utf-8") if text else data

    # --- connection and snapshots ---------------------------------------

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """The daemon's CLI, one shell script per call: type commands, end
        with Ctrl-D, they run in the VM (PVE_INSPECT_TOKEN must be set for
        a TCP node)."""
        node = self.client.node
        argv = ["pve-inspectd", "sandbox"]
        if node.url.startswith("unix://"):
            argv += ["--socket", node.url.removeprefix("unix://")]
        else:
            argv += ["--addr", node.url.split("://", 1)[1]]
            if node.ca_file:
                argv += ["--ca-file", node.ca_file]
        argv += ["exec", "--stdin"]
        if user is not None:
            if self.windows:
                raise ValueError(f"pve_inspect: VM {self.vm!r}: {_WINDOWS_NO_USER}")
            argv += ["--user", user]
        argv += [self.sandbox_id, self.vm, "--"]
        # cmd.exe reads the typed commands from its stdin
        argv += ["cmd.exe"] if self.windows else ["bash", "-l"]
        return SandboxConnection(
            type=PROVIDER, command=shlex.join(argv), container=f"{self.sandbox_id}/{self.vm}"
        )

    async def snapshot(self, name: str) -> None:
        """Snapshot this VM (e.g. before an epoch's attempt)."""
        await self.client.snapshot(self.sandbox_id, self.vm, name)

    async def rollback(self, name: str) -> None:
        """Roll this VM back to a snapshot; returns once its agent answers."""
        await self.client.rollback(self.sandbox_id, self.vm, name)

    def addresses(self, vm: str | None = None) -> dict[str, list[str]]:
        """The IPv4 addresses of a VM of this sample's sandbox (this one
        when ``vm`` is None) by network name, in NIC order: the node's own
        record (Proxmox's IPAM, as the daemon's API reported them when the
        sandbox was made), never what the guest says. A network without
        DHCP, or a VM without an address yet, has none. Every guest
        resolves its siblings by name too (``getent hosts NAME``)."""
        name = vm or self.vm
        for v in self.sandbox.get("vms") or []:
            if v.get("name") == name:
                out: dict[str, list[str]] = {}
                for a in v.get("addresses") or []:
                    out.setdefault(str(a["network"]), []).append(str(a["ipv4"]))
                return out
        raise ValueError(f"sandbox {self.sandbox_id} has no VM {name!r}")

    async def egress_log(self, max_records: int = 100_000) -> tuple[list[dict[str, Any]], int]:
        """The sandbox's egress record so far (every VM's: the daemon's
        ``GET .../egress/log``, paged through, at most ``max_records``) and
        how many records the daemon dropped (its ring was full)."""
        out: list[dict[str, Any]] = []
        since, dropped = 0, 0
        while len(out) < max_records:
            page = await self.client.egress_log(
                self.sandbox_id, since=since, limit=min(1000, max_records - len(out))
            )
            out += page.get("records") or []
            dropped = int(page.get("dropped") or 0)
            if not page.get("more"):
                break
            since = int(page["next"])
        return out, dropped


def _check_windows_stdin(vm: str, req: dict[str, Any], size: int) -> None:
    """Refuse stdin a Windows VM's exec body cannot carry: the daemon caps
    the body at EXEC_BODY_MAX, and stdin travels in it base64-encoded
    (Windows has no /bin/sh to stage it through a file)."""
    body = len(json.dumps(req)) + 4 * -(-size // 3) + len(',"stdin":""')
    if body > EXEC_BODY_MAX:
        raise ValueError(
            f"pve_inspect: VM {vm!r}: stdin of {size} bytes does not fit in the exec request "
            f"(the daemon caps it at {EXEC_BODY_MAX >> 20} MiB, stdin base64-encoded in it: "
            "about 6 MiB of stdin); a Windows VM takes stdin in one guest-exec, so it is not "
            "staged through a file as in a Linux VM: write the data with write_file and "
            "redirect it (['cmd.exe', '/c', 'prog < FILE'])"
        )


async def _make_working_dirs(envs: list[PveInspectSandboxEnvironment]) -> None:
    """Make the working directory of the sample's first Linux VM
    (``mkdir -p``) and of each Windows VM whose working directory is not
    a drive's root (``mkdir`` through cmd.exe, then ``cd /d`` to it: a
    directory that cannot be made fails the sample, saying why)."""
    linux = [e for e in envs if not e.windows]
    if linux:
        e = linux[0]
        await e.client.exec(e.sandbox_id, e.vm, {"argv": ["mkdir", "-p", "--", e.working_dir]})
    for e in envs:
        if not e.windows or len(e.working_dir) <= 3:
            continue
        d = e.working_dir.replace("%", "%%")  # batch text: %% is a literal %
        # cd's own status (&&, ||), not an error level mkdir may have left
        line = f'mkdir "{d}" 2>nul & cd /d "{d}" && exit /b 0 || exit /b 1'
        ans = await e.client.exec(e.sandbox_id, e.vm, {"argv": ["cmd.exe", "/c", line]})
        if ans.exit_code != 0:
            why = (ans.stderr or ans.stdout).decode("utf-8", "replace").strip()
            raise RuntimeError(
                f"pve_inspect: VM {e.vm!r}: cannot make windows_working_dir "
                f"{e.working_dir}: exit {ans.exit_code}: {why}"
            )


def create_request(cfg: PveInspectSandboxEnvironmentConfig, task_name: str) -> dict[str, Any]:
    """The ``POST /v1/sandboxes`` body of a sample."""
    vms = []
    for v in cfg.resolved_vms():
        d: dict[str, Any] = {"template": v.template}
        for k in (
            "kind",
            "name",
            "cores",
            "memory_mib",
            "disk_gib",
            "firmware",
            "cpu",
            "os_type",
            "disk_controller",
            "nic_controller",
        ):
            if getattr(v, k) is not None:
                d[k] = getattr(v, k)
        if not v.agent:
            d["agent"] = False
        if v.no_network:
            # no NIC at all: neither networks nor nics (empty if given)
            d["no_network"] = True
        elif v.networks is not None:
            d["networks"] = list(v.networks)
        elif v.nics is not None:
            d["nics"] = [n.model_dump(exclude_none=True) for n in v.nics]
        vms.append(d)
    labels = dict(cfg.labels)
    labels.update(
        {
            LABEL_PROVIDER: PROVIDER,
            LABEL_TASK: _label_value(task_name),
            LABEL_RUN: _Run.id,
            LABEL_USER: user_id(),
        }
    )
    req: dict[str, Any] = {"vms": vms, "labels": labels}
    if cfg.networks:
        req["networks"] = [n.request() for n in cfg.networks]
    if cfg.egress is not None:
        e = cfg.egress
        req["egress"] = {
            "mode": e.mode,
            **({"allow": list(e.allow)} if e.allow else {}),
            **({"deny": list(e.deny)} if e.deny else {}),
        }
    if cfg.ttl_seconds is not None:
        req["ttl_seconds"] = cfg.ttl_seconds
    return req


def _config_key(cfg: PveInspectSandboxEnvironmentConfig) -> str:
    """The identity of a sandbox config, as task_cleanup gets it back."""
    return cfg.model_dump_json()


# Where sample_cleanup puts a sample's egress summary in its store.
EGRESS_STORE_KEY = "pve_inspect/egress"


async def _delete_attaching_egress(env: PveInspectSandboxEnvironment) -> None:
    """Delete the sandbox and put its egress record, handed over by the
    delete itself (``DELETE ...?egress_log=true``: every record made until
    its VMs were gone, none missed between a read and the delete), summed
    up, in the sample's store (EGRESS_STORE_KEY) and a line in its
    transcript. Never fatal: where the delete cannot hand the record over
    (a node that keeps none, a sandbox still being created, or a daemon
    too old to know egress_log) the
    record is read as far as it goes
    (bounded, 10 s) and the sandbox deleted after; a sandbox already gone
    attaches nothing."""
    sid = env.sandbox_id
    try:
        doc = await env.client.delete_keeping_egress(sid)
    except Problem as p:
        if p.type == "not-found":  # gone already (reaped): its record went with it
            log.info("pve_inspect: sandbox %s already gone: no egress record", sid)
            _forget(sid)
            return
        log.info("pve_inspect: egress record of %s not handed over by its delete: %s", sid, p)
        await _attach_egress(env)
        await _delete(env.client, sid)
        return
    except NodeDown as e:
        # Left to the TTL reaper and `inspect sandbox cleanup pve_inspect`.
        print(f"pve_inspect: delete {sid}: {e}")
        return
    _forget(sid)
    if doc is None:
        log.info("pve_inspect: the daemon deleted %s without handing its egress record over", sid)
        return
    records = doc.get("records") or []
    _attach_summary(sid, records, int(doc.get("dropped") or 0))


async def _attach_egress(env: PveInspectSandboxEnvironment) -> None:
    """Read the sandbox's egress record so far and attach it as
    _attach_summary does, while the sandbox lives: a record made after
    the read is missed. Bounded (10 s) and never fatal: a node that keeps
    no record, or any failure, attaches nothing."""
    try:
        with anyio.fail_after(10):
            records, dropped = await env.egress_log(max_records=10_000)
    except Exception as e:  # the record is a bonus; the cleanup goes on
        log.info("pve_inspect: no egress record for sandbox %s: %s", env.sandbox_id, e)
        return
    _attach_summary(env.sandbox_id, records, dropped)


def _attach_summary(sid: str, records: list[dict[str, Any]], dropped: int) -> None:
    """Put a sandbox's egress records, summed up, in the sample's store
    (EGRESS_STORE_KEY) and a line in its transcript; never fatal."""
    from .egress import summarize

    s = summarize(records, dropped)
    doc = {
        "sandbox": sid,
        "asked": sorted(s.asked),
        "refused": sorted(s.refused | s.blocked),
        "reached": sorted(s.reached),
        "bytes_out": s.bytes_out,
        "bytes_in": s.bytes_in,
        "records": len(records),
        "dropped": dropped,
    }
    try:
        store().set(EGRESS_STORE_KEY, doc)
        transcript().info(
            f"pve_inspect egress: reached {doc['reached'] or 'nothing'}, "
            f"refused {doc['refused'] or 'nothing'}, {s.bytes_out} bytes out, {s.bytes_in} in",
            source="pve_inspect",
        )
    except Exception as e:  # outside a sample (a test, a CLI): nothing to attach to
        log.info("pve_inspect: egress summary of %s not attached: %s", sid, e)


async def _stop_keepalive(sid: str) -> None:
    ka = _Run.keepalives.pop(sid, None)
    if ka is not None:
        await ka.stop()


async def _delete(client: Client, sid: str) -> None:
    try:
        await client.delete(sid)
    except (Problem, NodeDown) as e:
        # Left to the TTL reaper and `inspect sandbox cleanup pve_inspect`.
        print(f"pve_inspect: delete {sid}: {e}")
        return
    _forget(sid)


def _forget(sid: str) -> None:
    """The sandbox is deleted: task_cleanup has nothing left of it."""
    _Run.live.pop(sid, None)
    _Run.cfg_of.pop(sid, None)


def _labels(sb: dict[str, Any]) -> dict[str, str]:
    labels = sb.get("labels")
    return labels if isinstance(labels, dict) else {}


def _describe(sb: dict[str, Any]) -> str:
    lb = _labels(sb)
    return (
        f"{sb['id']} (owner {sb.get('owner') or '-'}, task {lb.get(LABEL_TASK, '-')}, "
        f"user {lb.get(LABEL_USER, '-')})"
    )


async def _cli_delete(c: Client, node: NodeConfig, sb: dict[str, Any]) -> None:
    try:
        await c.delete(sb["id"])
    except Problem as p:
        print(f"pve_inspect: delete {sb['id']} on {node.url}: {p}")
        return
    print(f"pve_inspect: deleted {sb['id']} on {node.url}")


def _broken(p: Problem) -> SandboxUnavailableError:
    """The sandbox broke (the daemon's health says so from host-side
    signals): Inspect's sandbox error, saying why, so the eval log records
    a broken sandbox rather than a failed command."""
    reason = p.reason or "broken"
    return SandboxUnavailableError(f"sandbox broken ({reason}): {p.detail}")


def _file_error(p: Problem, path: str) -> Exception:
    msg = f"{path}: {p.detail}"
    match p.type:
        case "sandbox-broken":
            return _broken(p)
        case "file-not-found":
            return FileNotFoundError(errno.ENOENT, f"file not found: {msg}", path)
        case "is-a-directory":
            return IsADirectoryError(errno.EISDIR, f"is a directory: {msg}", path)
        case "permission-denied":
            return PermissionError(errno.EACCES, f"permission denied: {msg}", path)
        case "guest-no-space":
            return OSError(errno.ENOSPC, f"no space left in the guest: {msg}", path)
        case "output-limit":
            return OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            )
        case "guest-timeout" | "timeout":
            return TimeoutError(msg)
        case "not-found" | "guest-agent-unavailable" | "unavailable":
            return SandboxUnavailableError(msg)
    return p


def _exec_error(p: Problem) -> Exception:
    match p.type:
        case "sandbox-broken":
            return _broken(p)
        case "guest-timeout" | "timeout":
            return TimeoutError(p.detail)
        case "not-found" | "guest-agent-unavailable" | "unavailable":
            return SandboxUnavailableError(str(p))
        case "permission-denied":
            return PermissionError(errno.EACCES, p.detail)
    return p
