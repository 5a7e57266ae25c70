"""The typed configuration of a ``pve_inspect`` sandbox.

A sample's sandbox is one pve-inspectd sandbox: VMs cloned from templates
onto an SDN zone of their own. Nodes (daemon URLs and tokens) come from the
config or from the environment (``PVE_INSPECT_URL``, ``PVE_INSPECT_TOKEN``,
``PVE_INSPECT_CA_FILE``); a config written for the reference Proxmox plugin
(``ProxmoxSandboxEnvironmentConfig``) is converted by :mod:`.compat`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from .refpaths import ReferencePaths

ENV_URL = "PVE_INSPECT_URL"
ENV_TOKEN = "PVE_INSPECT_TOKEN"
ENV_CA_FILE = "PVE_INSPECT_CA_FILE"
ENV_TEMPLATE = "PVE_INSPECT_TEMPLATE"

# The daemon's name rule for VMs and networks (sandboxapi/decode.go).
_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
# Names a guest's own /etc/hosts gives the loopback and IPv6 multicast
# addresses: the daemon refuses them as VM names (they would shadow, or be
# shadowed, in the sandbox's managed /etc/hosts block).
_RESERVED_HOST_NAMES = frozenset(
    {
        "localhost",
        "ip6-localhost",
        "ip6-loopback",
        "ip6-localnet",
        "ip6-mcastprefix",
        "ip6-allnodes",
        "ip6-allrouters",
        "ip6-allhosts",
        "broadcasthost",
    }
)


class ConfigError(ValueError):
    """A config field the provider cannot honour; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class NodeConfig(BaseModel):
    """One pve-inspectd (one Proxmox node).

    ``url`` is ``https://host:port`` (the daemon's TLS listener, a bearer
    token needed) or ``unix:///path/to/api.sock`` (the socket's mode decides
    who may call; no token). ``http://`` is refused before any request: the
    bearer token would go out in clear.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    url: str
    token: SecretStr | None = None
    ca_file: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v.startswith("unix://"):
            if not v.removeprefix("unix://").startswith("/"):
                raise ValueError(f"url {v!r}: want unix:///absolute/path")
            return v
        check_scheme(v)
        if not re.match(r"^https://[^/\s]+/?$", v):
            raise ValueError(f"url {v!r}: want https://host:port or unix:///path")
        return v.rstrip("/")


def check_scheme(url: str) -> None:
    """Refuse a plain ``http://`` URL: the daemon's token would travel in
    clear (its TCP listener speaks TLS only)."""
    if url[:7].lower() == "http://":
        raise ValueError(
            f"url {url!r}: http:// is refused, the bearer token would go out in clear; "
            "use https://host:port (the daemon's TLS listener) or unix:///path (its socket)"
        )


class HealthCheck(BaseModel):
    """A guest command run once the sandbox is up, until it exits 0; the
    sample starts only after it passed (the reference plugin's
    ``healthcheck``, same fields and defaults). Durations are seconds:
    ``interval`` between attempts, ``timeout`` per attempt (whole seconds;
    the daemon kills the command's tree then), ``retries`` failures in a
    row before the sample fails, ``start_period`` after the first attempt
    in which failures do not count. An attempt that cannot reach the guest
    agent does not count either, but 25 such in a row fail the sample."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    test: tuple[str, ...] = Field(min_length=1, description="argv run in the guest")
    interval: float = Field(default=5, gt=0)
    timeout: int = Field(default=30, gt=0)
    retries: int = Field(default=60, gt=0)
    start_period: float = Field(default=0, ge=0)

    @field_validator("test")
    @classmethod
    def _test(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v[0]:
            raise ValueError("test needs a program as its first element")
        if any("\x00" in a for a in v):
            raise ValueError("test arguments must not contain NUL")
        return v


# Proxmox's mac-addr format (pve-common JSONSchema.pm pve_verify_mac_addr),
# as the daemon checks it: six hex pairs, the group bit of the first clear.
_MAC = re.compile(r"^[0-9A-Fa-f][02468ACEace](?::[0-9A-Fa-f]{2}){5}$")


class NicSpec(BaseModel):
    """One NIC of a VM, on ``network``, optionally with a fixed ``mac`` and
    ``ipv4`` address (the reference plugin's ``VmNicConfig(mac=, ipv4=)``).

    A fixed address is reserved in Proxmox's IPAM for the NIC's MAC and the
    zone's DHCP server hands it to that MAC: it lies in the network's fixed
    ``cidr`` (not ``auto``) and is neither the cidr's network, broadcast
    nor gateway (first host) address; inside the DHCP range or not, and on
    a network of ``dhcp=False`` too (a subnet without a DHCP range, whose
    mapped MACs the zone's dnsmasq serves all the same). Without ``mac``
    the daemon picks one. Addresses and MACs
    are unique in the sandbox. A sandbox with a MAC or address fixed is
    never one of the node's warm pool.

    Instead of ``network``, ``vnet`` names a vnet the node's operator shares
    (the daemon's ``[api] shared_vnets``), by its Proxmox vnet id or alias:
    VMs of other sandboxes may be on it too. It takes no ``mac`` or
    ``ipv4``, and its sandbox no ``egress`` policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    network: str | None = None
    vnet: str | None = Field(
        default=None, description="instead of network: a vnet the node shares, by id or alias"
    )
    mac: str | None = Field(default=None, description="XX:XX:XX:XX:XX:XX, unicast, not all zeros")
    ipv4: str | None = Field(default=None, description="a fixed IPv4 address of the network")

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not _MAC.match(v) or v == "00:00:00:00:00:00":
            raise ValueError(
                f"mac {v!r}: want a unicast MAC XX:XX:XX:XX:XX:XX "
                "(the group bit of the first octet clear), not all zeros"
            )
        return v.upper()

    @model_validator(mode="after")
    def _network_or_vnet(self) -> NicSpec:
        if (self.network is None) == (self.vnet is None):
            raise ValueError("give network or vnet, one of them")
        if self.vnet is not None and (self.mac is not None or self.ipv4 is not None):
            raise ValueError(
                f"vnet {self.vnet!r} is shared: a NIC on it takes no fixed mac or ipv4"
            )
        return self

    @field_validator("ipv4")
    @classmethod
    def _ipv4(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return str(ipaddress.IPv4Address(v))
        except ValueError as e:
            raise ValueError(f"ipv4 {v!r}: {e}") from None


# The os_type values of a Windows guest (the daemon's Windows guest client).
WINDOWS_OS_TYPES = ("win10", "win11")

# The CPU models the daemon's hardened profile takes (hardening.CPUModels).
CpuModel = Literal[
    "x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4", "kvm64", "qemu64", "host"
]


class OvaImage(BaseModel):
    """An OVA file on the eval machine that a VM's template is built from
    (the reference's ``VmSourceConfig(ova=PATH)``): at task start a node
    that lacks the template and offers builds is sent the file.

    By default (``import_only``, as the reference imports an OVA) the node
    imports every disk the OVA's OVF lists, on ``disk_bus``, with
    ``os_type``, and makes the template without booting it: nothing in the
    image changes (no guest agent installed, no machine id or SSH host
    keys reset), so a sandbox VM of it needs its agent in the image
    already. With ``import_only`` False the node boots it once instead, as
    it builds a cloud image (cloud-init installs the agent): the OVA then
    names its one ``disk``. How the template was built is part of what it
    is: a node's template of the name built the other way is not taken.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="the OVA's path on the eval machine")
    size: int = Field(ge=1, description="its size in bytes when the config was read")
    import_only: bool = Field(
        default=True,
        description="build without boot: every disk of the OVA imported as it is (the "
        "reference's import); False: boot it once with cloud-init (the OVA's one disk)",
    )
    disk: str | None = Field(
        default=None,
        description="with import_only False: the disk inside it the template is built from (.vmdk)",
    )
    disk_bus: Literal["scsi", "ide", "sata"] | None = Field(
        default=None,
        description="with import_only: the bus of the imported disks, scsi (virtio-scsi, the "
        "default), ide or sata (for images without virtio drivers: the reference's "
        'disk_controller="ide")',
    )
    os_type: Literal["l26", "win10", "win11"] | None = Field(
        default=None, description="with import_only: the template's ostype (l26 by default)"
    )

    @model_validator(mode="after")
    def _mode(self) -> OvaImage:
        if self.import_only and self.disk is not None:
            raise ValueError("an import-only OVA imports every disk of it: give no disk")
        if not self.import_only:
            if self.disk is None:
                raise ValueError("an OVA built booted (import_only False) names its disk")
            if self.disk_bus is not None or self.os_type is not None:
                raise ValueError("disk_bus and os_type go with import_only")
        return self

    def build_mode(self) -> dict[str, str]:
        """The build's mode as the node's upload takes it (the query's
        ``import_only``, ``disk_bus``, ``os_type``); empty when booted."""
        if not self.import_only:
            return {}
        return {
            "import_only": "true",
            "disk_bus": self.disk_bus or "scsi",
            "os_type": self.os_type or "l26",
        }


class VmSpec(BaseModel):
    """One VM of the sample's sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template: str = Field(description="template name known to the daemon")
    kind: Literal["vm", "lxc"] | None = Field(
        default=None,
        description="vm (default): a QEMU VM; lxc: an unprivileged container cloned from a "
        "container template (no disk_gib, no fixed mac or ipv4)",
    )
    name: str | None = Field(default=None, description="unique in the sandbox; default vm<N>")
    cores: int | None = Field(default=None, ge=1, le=64)
    memory_mib: int | None = Field(default=None, ge=64)
    disk_gib: int | None = Field(default=None, ge=1)
    networks: tuple[str, ...] | None = Field(
        default=None, description="network names in NIC order; default the first network"
    )
    nics: tuple[NicSpec, ...] | None = Field(
        default=None,
        description="instead of networks: one NIC per entry, in order, each with an optional "
        "fixed mac and ipv4 address",
    )
    no_network: bool = Field(
        default=False,
        description="a VM without any NIC (the reference plugin's nics=[]): its template's NICs "
        "are removed and none added, so its guest has the loopback only; no networks or nics "
        "with it. Exec and files work; its siblings cannot reach it, nor it them; never from "
        "the warm pool",
    )
    sandbox: bool = Field(
        default=True, description="an Inspect environment (False: a VM the agent cannot exec in)"
    )
    agent: bool = Field(
        default=True,
        description="the guest runs the QEMU guest agent. False: a VM the daemon never reaches "
        "inside (a VulnHub image, an appliance): ready once it runs, no exec, files, healthcheck "
        "or env, never from the warm pool; its network is any VM's. Only for a VM with "
        "sandbox=False",
    )
    healthcheck: HealthCheck | None = Field(
        default=None, description="a guest command that must pass before the sample starts"
    )
    firmware: Literal["seabios", "uefi"] | None = Field(
        default=None,
        description="seabios (default) or uefi (OVMF with an EFI vars disk; the node must "
        "allow it: [api] allow_uefi)",
    )
    cpu: CpuModel | None = Field(
        default=None,
        description="the CPU model; default the template's. Nested virtualization stays off",
    )
    os_type: Literal["l26", "win10", "win11"] | None = Field(
        default=None,
        description="l26 (default), win10 or win11 (the node must allow Windows: [api] "
        "allow_windows). A Windows VM may be an Inspect sandbox: exec passes its argv to the "
        "daemon's Windows guest client (['cmd.exe', '/c', S] runs S as batch text), cwd and "
        "file paths are Windows paths relative to windows_working_dir, and exec takes no user",
    )
    disk_controller: Literal["scsi", "ide"] | None = Field(
        default=None,
        description="the bus every disk of the template must be on (a clone keeps them): scsi "
        "(on virtio-scsi) or ide",
    )
    nic_controller: Literal["virtio", "e1000"] | None = Field(
        default=None,
        description="the model of every NIC: virtio (default) or e1000 (QEMU's emulated Intel "
        "NIC, for a guest without virtio drivers; the node must allow it: [api] allow_e1000)",
    )
    built_in: Literal["debian13", "ubuntu24.04", "kali2025.4"] | None = Field(
        default=None,
        description="a recipe the node ships (the reference plugin's built-ins): template is "
        "the recipe's name, and a node that lacks it builds it at task start when it offers "
        "builds ([templates] build); else `pve-inspectd template build NAME --recipe NAME` "
        "on the node makes it",
    )

    ova: OvaImage | None = Field(
        default=None,
        description="an OVA on the eval machine the template is built from: a node that lacks "
        "the template (named ova-FILE-SIZE as the reference tags it) builds it at task start "
        "from the uploaded file when it offers builds ([templates] build)",
    )

    @model_validator(mode="after")
    def _networks_or_nics(self) -> VmSpec:
        if self.ova is not None and self.built_in is not None:
            raise ValueError("give ova or built_in, not both")
        if self.built_in is not None and self.template != self.built_in:
            raise ValueError(
                f"built_in {self.built_in!r} is the template named {self.built_in!r}, "
                f"not {self.template!r}"
            )
        if self.networks is not None and self.nics is not None:
            raise ValueError("give networks or nics, not both")
        if self.no_network and (self.networks or self.nics):
            raise ValueError("no_network is a VM without any NIC: give no networks or nics")
        if not self.no_network and (self.networks == () or self.nics == ()):
            # the daemon's empty networks is its default (the first
            # network): never a VM without NICs by accident
            raise ValueError("empty networks or nics: give no_network=True for a VM without NICs")
        if not self.agent:
            # what runs through the guest agent: an Inspect environment's
            # exec and files, a healthcheck
            if self.sandbox:
                raise ValueError(
                    "agent False: an Inspect sandbox runs its exec and files through the guest "
                    "agent; give sandbox=False too"
                )
            if self.healthcheck is not None:
                raise ValueError("agent False: a healthcheck runs through the guest agent")
            if self.kind == "lxc":
                raise ValueError("a container (kind lxc) has no guest agent to turn off")
        if self.kind == "lxc":
            if self.disk_gib is not None:
                raise ValueError("a container (kind lxc) takes no disk_gib")
            if any(n.mac is not None or n.ipv4 is not None for n in self.nics or ()):
                raise ValueError("a container (kind lxc) takes no fixed mac or ipv4")
            opts = ("firmware", "cpu", "os_type", "disk_controller", "nic_controller")
            if any(getattr(self, k) is not None for k in opts):
                raise ValueError(
                    "a container (kind lxc) takes no firmware, cpu, os_type or controllers"
                )
        return self

    def is_windows(self) -> bool:
        """Whether the VM runs Windows (os_type win10 or win11): its exec
        and file calls take Windows paths, and no user."""
        return self.os_type in WINDOWS_OS_TYPES

    def network_names(self) -> tuple[str, ...] | None:
        """The VM's networks in NIC order (from nics when given; none
        for a VM of no_network)."""
        if self.no_network:
            return ()
        if self.nics is not None:
            return tuple(n.network for n in self.nics if n.network is not None)
        return self.networks

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError(f"VM name {v!r}: want [a-z][a-z0-9-]*, at most 32 characters")
        if v in _RESERVED_HOST_NAMES:
            raise ValueError(
                f"VM name {v!r}: a name every guest's /etc/hosts gives the loopback or a "
                "multicast address; the other VMs could not reach it by name"
            )
        return v


class DhcpRangeSpec(BaseModel):
    """One range of addresses a network's DHCP server hands out, both ends
    included (the daemon's ``dhcp_ranges`` entry)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: str
    end: str

    @model_validator(mode="after")
    def _order(self) -> DhcpRangeSpec:
        try:
            a, b = ipaddress.IPv4Address(self.start), ipaddress.IPv4Address(self.end)
        except ValueError as e:
            raise ValueError(f"dhcp range {self.start}-{self.end}: {e}") from None
        if a > b:
            raise ValueError(f"dhcp range {self.start}-{self.end}: start is above end")
        return self


MAX_DHCP_RANGES = 4


class NetworkSpec(BaseModel):
    """One vnet (one subnet) of the sandbox's zone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    cidr: str = "auto"
    dhcp: bool = True
    snat: bool = True
    dhcp_ranges: tuple[DhcpRangeSpec, ...] = Field(
        default=(),
        description=(
            "the ranges the zone's DHCP server hands out, in order (a fixed cidr and dhcp on "
            "only, at most 4); empty: the daemon's plan, .10 (.2 in a /28) to the last but one"
        ),
    )
    alias: str | None = Field(
        default=None,
        description="what the eval calls this network (the reference's vnet alias), in messages",
    )

    def label(self) -> str:
        """The network as the eval's config names it."""
        return self.name if self.alias in (None, self.name) else f"{self.alias!r} ({self.name})"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"network name {v!r}: want [a-z][a-z0-9-]*, at most 32 characters")
        return v

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        if v == "auto":
            return v
        try:
            net = ipaddress.IPv4Network(v, strict=True)
        except ValueError as e:
            raise ValueError(f"cidr {v!r}: {e}") from None
        if not 16 <= net.prefixlen <= 28:
            raise ValueError(f"cidr {v!r}: prefix length must be 16..28")
        if not net.is_private:
            raise ValueError(f"cidr {v!r}: must be a private (RFC 1918) range")
        return v

    @model_validator(mode="after")
    def _ranges(self) -> NetworkSpec:
        if not self.dhcp_ranges:
            return self
        if len(self.dhcp_ranges) > MAX_DHCP_RANGES:
            raise ValueError(f"{len(self.dhcp_ranges)} dhcp ranges: at most {MAX_DHCP_RANGES}")
        if self.cidr == "auto" or not self.dhcp:
            raise ValueError("dhcp_ranges need a fixed cidr and dhcp on")
        net = ipaddress.IPv4Network(self.cidr)
        for r in self.dhcp_ranges:
            for a in (r.start, r.end):
                if ipaddress.IPv4Address(a) not in net:
                    raise ValueError(f"dhcp range {r.start}-{r.end}: {a} is outside {net}")
        return self

    def request(self) -> dict[str, object]:
        """The network as the daemon's create request takes it."""
        d = self.model_dump(exclude={"alias", "dhcp_ranges"})
        if self.dhcp_ranges:
            d["dhcp_ranges"] = [r.model_dump() for r in self.dhcp_ranges]
        return d


class EgressSpec(BaseModel):
    """The sandbox's egress policy, in force before its VMs start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["open", "allowlist", "none"] = "open"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _allow_only_in_allowlist(self) -> EgressSpec:
        if self.allow and self.mode != "allowlist":
            raise ValueError("allow: only in mode allowlist")
        return self


class PveInspectSandboxEnvironmentConfig(BaseModel):
    """Configuration of a ``pve_inspect`` sandbox (one per sample)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    nodes: tuple[NodeConfig, ...] = Field(
        default=(), description="daemons to place samples on; empty: from PVE_INSPECT_URL"
    )
    vms: tuple[VmSpec, ...] = Field(default=(), description="empty: one VM of PVE_INSPECT_TEMPLATE")
    networks: tuple[NetworkSpec, ...] = Field(
        default=(), description="empty: one network net0, CIDR auto, DHCP and SNAT on"
    )
    egress: EgressSpec | None = None
    ttl_seconds: int | None = Field(
        default=None,
        ge=60,
        description="the lease: with keepalive, the daemon reaps the sandbox this long after the "
        "provider last renewed it (the eval died or lost the node); without, its lifetime "
        "(default: the node's default_ttl; at most its max_ttl)",
    )
    keepalive: bool = Field(
        default=True,
        description="renew the lease while the sample runs (a heartbeat), so that a sample "
        "runs as long as it needs; False: the sandbox is reaped ttl_seconds after its creation",
    )
    template_build_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="how long task start waits for a node to build a built-in template it "
        "lacks (VmSpec.built_in) before it fails",
    )
    cidr_wait_seconds: float = Field(
        default=900.0,
        ge=0,
        description="how long a sample waits for a fixed CIDR that another sandbox holds "
        "before it fails",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    working_dir: str = Field(
        default="/root",
        description="where relative paths and commands without cwd start (Linux VMs)",
    )
    windows_working_dir: str = Field(
        default="C:\\",
        description="where relative paths and commands without cwd start in a Windows VM "
        "(os_type win10 or win11): a drive-absolute path, made at sample start when missing",
    )

    # The reference config's field paths when this config is a converted
    # one (compat.from_reference), else None: not a field (neither
    # serialized nor part of the hash), carried by copies of the object.
    _reference_paths: ReferencePaths | None = PrivateAttr(default=None)

    def reference_paths(self) -> ReferencePaths | None:
        """The field paths of the reference config this one was converted
        from (:mod:`.refpaths`); None for a native config."""
        return self._reference_paths

    def with_reference_paths(self, paths: ReferencePaths) -> PveInspectSandboxEnvironmentConfig:
        """A copy of this config that names its fields through ``paths``."""
        out = self.model_copy()
        out._reference_paths = paths
        return out

    def field_name(self, field: str) -> str:
        """A create request's field (``vms[1].template``) as this config's
        author wrote it: the reference config's path for a converted
        config, the field itself for a native one."""
        paths = self._reference_paths
        return field if paths is None or not field else paths.name(field)

    @field_validator("working_dir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"working_dir {v!r}: want an absolute path")
        return v

    @field_validator("windows_working_dir")
    @classmethod
    def _windows_workdir(cls, v: str) -> str:
        return windows_dir(v)

    @model_validator(mode="after")
    def _consistent(self) -> PveInspectSandboxEnvironmentConfig:
        names = [v.name for v in self.vms if v.name is not None]
        if len(set(names)) != len(names):
            raise ValueError("vms: a VM name is used twice")
        if self.vms and not any(v.sandbox for v in self.vms):
            raise ValueError("vms: at least one VM must be a sandbox")
        nets = {n.name for n in self.networks}
        if len(nets) != len(self.networks):
            raise ValueError("networks: a network name is used twice")
        for i, v in enumerate(self.vms):
            field = "nics" if v.nics is not None else "networks"
            for n in v.network_names() or ():
                if n not in nets and (self.networks or n != "net0"):
                    raise ValueError(f"vms[{i}].{field}: no network named {n!r}")
        self._check_fixed_nics()
        shared = any(n.vnet is not None for v in self.vms for n in v.nics or ())
        if shared and self.egress is not None:
            raise ValueError(
                "egress: a sandbox with a NIC on a shared vnet takes no egress policy "
                "(that vnet's zone has the node's default)"
            )
        for k in self.labels:
            if k.startswith("inspect."):
                raise ValueError(f"labels: {k!r}: the inspect. prefix is the provider's")
        return self

    def _check_fixed_nics(self) -> None:
        """The daemon's rules of fixed MACs and addresses (sandboxapi
        decode.go validateNICs), checked before any request."""
        nets = {n.name: n for n in self.networks}
        macs: dict[str, str] = {}
        ips: dict[str, str] = {}
        for i, v in enumerate(self.vms):
            for j, nic in enumerate(v.nics or ()):
                f = f"vms[{i}].nics[{j}]"
                if nic.mac is not None:
                    if nic.mac in macs:
                        raise ValueError(f"{f}.mac: {nic.mac} is {macs[nic.mac]}'s too")
                    macs[nic.mac] = f
                if nic.ipv4 is None or nic.network is None:
                    continue  # a shared vnet's NIC takes no ipv4 (NicSpec)
                net = nets.get(nic.network)
                if net is None or net.cidr == "auto":
                    label = repr(nic.network) if net is None else net.label()
                    raise ValueError(
                        f"{f}.ipv4: network {label} has cidr 'auto': "
                        "a fixed address needs a network with a fixed cidr"
                    )
                why = _fixed_address_refusal(ipaddress.IPv4Network(net.cidr), nic.ipv4)
                if why:
                    raise ValueError(f"{f}.ipv4: {nic.ipv4} on network {net.label()}: {why}")
                if nic.ipv4 in ips:
                    raise ValueError(f"{f}.ipv4: {nic.ipv4} is {ips[nic.ipv4]}'s too")
                ips[nic.ipv4] = f

    def __hash__(self) -> int:
        # Inspect keys its sandbox cache by the config; labels is a dict.
        return hash(self.model_dump_json())

    def resolved_vms(self) -> tuple[VmSpec, ...]:
        """The VMs, or one of ``PVE_INSPECT_TEMPLATE`` (default debian)."""
        if self.vms:
            return self.vms
        return (VmSpec(template=os.environ.get(ENV_TEMPLATE, "debian")),)

    def resolved_nodes(self) -> tuple[NodeConfig, ...]:
        """The nodes, or those of the environment."""
        if self.nodes:
            return self.nodes
        return nodes_from_env()


# What a Windows path element must not hold: the characters Windows
# forbids in names (a ':' past the drive would name an alternate data
# stream) and control characters (the daemon's qga.CleanWinPath rules).
_WIN_FORBIDDEN = re.compile(r'[<>:"|?*\x00-\x1f]')


def windows_dir(v: str) -> str:
    """v as a Windows VM's working directory: drive-absolute (``C:\\dir``
    or ``C:/dir``), normalized with backslashes; refused when the daemon's
    file calls would refuse it (no ``.`` or ``..``, no character Windows
    forbids in names, no element ending in a dot or space)."""
    if not re.match(r"^[A-Za-z]:[\\/]", v):
        raise ValueError(f"windows_working_dir {v!r}: want a drive-absolute path (C:\\dir)")
    elems = [e for e in re.split(r"[\\/]", v[3:]) if e]
    for e in elems:
        if e in (".", "..") or _WIN_FORBIDDEN.search(e) or e[-1] in ". ":
            raise ValueError(
                f"windows_working_dir {v!r}: element {e!r} is not a Windows name the daemon "
                'takes (no . or .., none of <>:"|?* or control characters, no trailing dot or '
                "space)"
            )
    return v[0].upper() + ":\\" + "\\".join(elems)


def _fixed_address_refusal(net: ipaddress.IPv4Network, ip: str) -> str:
    """Why ip cannot be a fixed address on net ("" when it can): outside
    it, its network or broadcast address, or the daemon's gateway (the
    first host address)."""
    a = ipaddress.IPv4Address(ip)
    if a not in net:
        return f"outside the network's cidr {net}"
    if a == net.network_address:
        return "the network's own address"
    if a == net.broadcast_address:
        return "the network's broadcast address"
    if a == net.network_address + 1:
        return "the network's gateway"
    return ""


def _per_node(name: str, n: int) -> list[str | None]:
    """An environment list: one value for every node, or one per node."""
    vals = [v for v in re.split(r"[,\s]+", os.environ.get(name, "")) if v]
    if not vals:
        return [None] * n
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise ConfigError("nodes", f"{name} has {len(vals)} entries for {n} URLs: want 1 or {n}")
    return list(vals)


def nodes_from_env() -> tuple[NodeConfig, ...]:
    """Nodes from ``PVE_INSPECT_URL`` (one URL, or several separated by
    commas or spaces) with ``PVE_INSPECT_TOKEN`` and ``PVE_INSPECT_CA_FILE``
    (one for all, or one per URL in the same order)."""
    urls = [u for u in re.split(r"[,\s]+", os.environ.get(ENV_URL, "")) if u]
    if not urls:
        raise ConfigError("nodes", f"no node: set {ENV_URL} or the config's nodes")
    tokens = _per_node(ENV_TOKEN, len(urls))
    cas = _per_node(ENV_CA_FILE, len(urls))
    return tuple(
        NodeConfig(url=u, token=SecretStr(t) if t else None, ca_file=c)
        for u, t, c in zip(urls, tokens, cas, strict=True)
    )
