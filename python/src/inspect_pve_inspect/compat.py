"""The reference Proxmox plugin's config shape, converted.

An eval written for ``inspect_proxmox_sandbox`` passes a
``ProxmoxSandboxEnvironmentConfig``; with only the sandbox type changed to
``pve_inspect`` it runs here. Honoured: ``vms_config``
(``vm_source_config.existing_vm_template_tag``, ``built_in`` or ``ova``, ``name``, ``ram_mb``,
``vcpus``, ``is_sandbox`` (``False`` without a ``healthcheck``: a VM
without a guest agent, the daemon's ``agent: false``), ``nics`` by
``vnet_alias`` with their ``mac`` and ``ipv4`` (an alias that is none of
the config's own vnets names an existing vnet, as the reference looks it
up among every Proxmox vnet: a NIC on a vnet the node's operator shares,
without ``mac`` or ``ipv4``; ``nics=[]`` is a VM with no network access,
the daemon's ``no_network``: no NIC at all), ``healthcheck``, and
``uefi_boot``, ``os_type``, ``cpu``, ``disk_controller`` (``scsi``,
``ide``), ``nic_controller`` (``virtio``, ``e1000``) as the daemon's
per-VM options) and
``sdn_config`` (``"auto"``, or vnets with one subnet each, SNAT and DHCP
with the subnet's ``dhcp_ranges``, none a network of dhcp off whose NICs
take an ``ipv4`` too; its gateway must be the first address;
or ``None``: every VM's ``nics`` name existing vnets by ``vnet_alias``
(or are ``[]``), which become NICs on vnets the node's operator shares, by
Proxmox vnet alias or id; the daemon refuses at task start a vnet the node
does not share, listing the ones it does; no ``mac`` or ``ipv4`` on them).
Covered another way: ``firewall=True`` (the node's guard), ``depends_on``
(checked; every VM starts at once and the sample waits for all of them and
their healthchecks). A template tag is looked up as a template name of the
daemon; a built-in (``debian13``, ``ubuntu24.04``, ``kali2025.4``) is the
template of its name, which the node builds at task start when it lacks it
and offers builds (:mod:`.preflight`); an ``ova`` (a file on the eval
machine) is the template ``ova-FILE-SIZE`` (the reference's tag of it, as
a DNS name), which a node that lacks it and offers builds builds at task
start from the uploaded file, as the reference imports it: every disk of
it, without booting it (the VM's ``disk_controller="ide"`` puts the
disks on ide, its ``os_type`` is the template's). Every other field must keep the
reference's default (written out, or the value the reference uses when it
is unset); any other value raises :class:`ConfigError` naming the field
and why, never silently ignored. The converted config carries the
reference path of each of its fields (:func:`.refpaths.reference_paths`), so that
what a node refuses later is named as the eval wrote it.

The models here mirror the field names (so that
``from inspect_pve_inspect.compat import ProxmoxSandboxEnvironmentConfig``
is a drop-in); a config object of the reference package itself is accepted
too (by its ``model_dump()``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import pathlib
import re
import tarfile
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from .config import (
    MAX_DHCP_RANGES,
    ConfigError,
    DhcpRangeSpec,
    HealthCheck,
    NetworkSpec,
    NicSpec,
    OvaImage,
    PveInspectSandboxEnvironmentConfig,
    VmSpec,
)
from .refpaths import reference_paths

# The reference plugin's built-in images: recipes the node ships
# (templatebuild.Recipes), each built as the template of its name.
BUILT_INS = ("debian13", "ubuntu24.04", "kali2025.4")

# Fields this provider cannot honour otherwise: each may keep the
# reference's default, written out or not (its effective default, the
# value the reference itself uses when the field is unset, included).
_VM_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "vga": ("none",),
    "tablet": (False,),
    "await_before_next_vm": (False,),
}
# Why a value other than the defaults is refused, by field.
_VM_WHY: dict[str, str] = {
    "vga": "the hardened profile has no display device",
    "tablet": "the hardened profile has no USB tablet",
    "await_before_next_vm": "removed by the reference itself: use depends_on and healthcheck",
}
# The VM options mapped to the daemon's per-VM options (_vm_options). Each
# reference default, written out or not (uefi_boot=False, os_type="l26",
# cpu="host" or None, disk_controller="scsi" or None, nic_controller=
# "virtio" or None), maps to nothing sent: the template's hardware, and a
# VM with no per-VM option may be served from the daemon's warm pool.
# disk_controller="ide" and nic_controller="e1000" are sent as they are.
_VM_OPTIONS = ("uefi_boot", "os_type", "cpu", "disk_controller", "nic_controller")
# Accepted as covered: firewall=True (the node's guard isolates every
# sandbox whatever it says), depends_on (checked; every VM starts at once
# and the sample starts once all are ready and every healthcheck passed),
# healthcheck (run before the sample starts).
_VM_FIELDS = {
    "vm_source_config",
    "name",
    "ram_mb",
    "vcpus",
    "nics",
    "is_sandbox",
    "firewall",
    "depends_on",
    "healthcheck",
    *_VM_DEFAULTS,
    *_VM_OPTIONS,
}


def _as_text(v: Any) -> Any:
    """The reference's typed values as the text they stand for: its
    schema types addresses and networks as ``ipaddress`` objects
    (``IPvAnyAddress``, ``IPvAnyNetwork``) and an OVA as a ``Path``, and
    its examples pass them so (``cidr=ip_network(...)``, ``ova=PATH``)."""
    if isinstance(
        v,
        ipaddress.IPv4Address
        | ipaddress.IPv6Address
        | ipaddress.IPv4Network
        | ipaddress.IPv6Network,
    ):
        return str(v)
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    return v


# Fields the reference types as an address, a network or a path: they take
# those objects or their text, and hold the text.
Address = Annotated[str | ipaddress.IPv4Address | ipaddress.IPv6Address, BeforeValidator(_as_text)]
Network = Annotated[str | ipaddress.IPv4Network | ipaddress.IPv6Network, BeforeValidator(_as_text)]
FilePath = Annotated[str | pathlib.Path, BeforeValidator(_as_text)]


class DhcpRange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    start: Address
    end: Address


class SubnetConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    cidr: Network
    gateway: Address
    snat: bool
    dhcp_ranges: tuple[DhcpRange, ...]


class VnetConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    alias: str | None = None
    subnets: tuple[SubnetConfig, ...] = ()
    vlan_aware: bool = False


class SdnConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    vnet_configs: tuple[VnetConfig, ...]
    use_pve_ipam_dnsnmasq: bool = True


class VmSourceConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    existing_vm_template_tag: str | None = None
    ova: FilePath | None = None
    built_in: str | None = None


class VmNicConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    vnet_alias: str
    mac: str | None = None
    ipv4: Address | None = None
    vlan_tag: int | None = None


class VmConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    vm_source_config: VmSourceConfig
    name: str | None = None
    ram_mb: int | None = 2048
    vcpus: int | None = 2
    nics: tuple[VmNicConfig, ...] | None = None
    is_sandbox: bool = True
    uefi_boot: bool = False
    disk_controller: Literal["scsi", "ide"] | None = None
    nic_controller: Literal["virtio", "e1000"] | None = None
    firewall: bool = False
    os_type: str | None = "l26"
    vga: Literal["none", "std"] = "none"
    tablet: bool = False
    cpu: str | None = None
    depends_on: tuple[str, ...] = ()
    healthcheck: HealthCheck | None = None


class ProxmoxSandboxEnvironmentConfig(BaseModel):
    """The reference plugin's config shape (its common subset is honoured)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    instance_pool_id: str = "default"
    sdn_config: SdnConfig | Literal["auto"] | None = "auto"
    vms_config: tuple[VmConfig, ...] = ()


REFERENCE_KEYS = {"instance_pool_id", "sdn_config", "vms_config"}


def is_reference_shape(d: dict[str, Any]) -> bool:
    """Whether a config dict is in the reference plugin's shape."""
    return bool(d) and set(d) <= REFERENCE_KEYS


def _s(v: Any) -> str | None:
    return None if v is None else str(v)


def _networks(sdn: Any) -> tuple[tuple[NetworkSpec, ...], dict[str, str]]:
    """The networks of an sdn_config and the vnet alias -> network name map
    (none for ``"auto"`` and for ``None``; an alias not in it names an
    existing vnet: :func:`_shared_nic`)."""
    if sdn == "auto" or sdn is None:
        return (), {}
    if not isinstance(sdn, dict):
        raise ConfigError("sdn_config", f"want 'auto' or an SdnConfig, got {sdn!r}")
    extra = set(sdn) - {"vnet_configs", "use_pve_ipam_dnsnmasq"}
    if extra:
        raise ConfigError(f"sdn_config.{sorted(extra)[0]}", "unknown field")
    if sdn.get("use_pve_ipam_dnsnmasq", True) is not True:
        raise ConfigError(
            "sdn_config.use_pve_ipam_dnsnmasq",
            "False is not supported: the zone's DHCP is the daemon's",
        )
    nets: list[NetworkSpec] = []
    aliases: dict[str, str] = {}
    for i, vn in enumerate(sdn.get("vnet_configs") or ()):
        f = f"sdn_config.vnet_configs[{i}]"
        extra = set(vn) - {"alias", "subnets", "vlan_aware"}
        if extra:
            raise ConfigError(f"{f}.{sorted(extra)[0]}", "unknown field")
        if vn.get("vlan_aware", False) is not False:
            raise ConfigError(
                f"{f}.vlan_aware", "not supported: a sandbox's vnets carry no VLANs of the guest's"
            )
        subnets = list(vn.get("subnets") or ())
        if len(subnets) != 1:
            raise ConfigError(f"{f}.subnets", f"{len(subnets)} subnets: want exactly one per vnet")
        alias = vn.get("alias")
        nets.append(_subnet(f"{f}.subnets[0]", f"net{i}", subnets[0], _s(alias)))
        if alias is not None:
            if alias in aliases:
                raise ConfigError(f"{f}.alias", f"alias {alias!r} used twice")
            aliases[str(alias)] = f"net{i}"
    if not nets:
        raise ConfigError("sdn_config.vnet_configs", "at least one vnet")
    return tuple(nets), aliases


def _subnet(f: str, name: str, sn: dict[str, Any], alias: str | None) -> NetworkSpec:
    extra = set(sn) - {"cidr", "gateway", "snat", "dhcp_ranges"}
    if extra:
        raise ConfigError(f"{f}.{sorted(extra)[0]}", "unknown field")
    try:
        net = ipaddress.IPv4Network(str(sn["cidr"]), strict=True)
    except (KeyError, ValueError) as e:
        raise ConfigError(f"{f}.cidr", f"want an IPv4 prefix: {e}") from None
    # The daemon's gateway is the first address (sandbox subnetPlan); the
    # DHCP ranges are the reference's, passed on as given (the daemon
    # refuses the network, broadcast and gateway addresses in them,
    # overlaps, and ranges without room for the network's NICs).
    gw = net.network_address + 1
    if str(sn.get("gateway")) != str(gw):
        raise ConfigError(
            f"{f}.gateway", f"{sn.get('gateway')}: the daemon's gateway of {net} is {gw}"
        )
    raw = list(sn.get("dhcp_ranges") or ())
    if len(raw) > MAX_DHCP_RANGES:
        raise ConfigError(f"{f}.dhcp_ranges", f"{len(raw)} ranges: at most {MAX_DHCP_RANGES}")
    ranges: list[DhcpRangeSpec] = []
    for k, r in enumerate(raw):
        rf = f"{f}.dhcp_ranges[{k}]"
        if not isinstance(r, dict) or set(r) != {"start", "end"}:
            raise ConfigError(rf, f"want a range {{start, end}}, got {r!r}")
        try:
            rng = DhcpRangeSpec(start=str(r["start"]), end=str(r["end"]))
        except ValueError as e:
            raise ConfigError(rf, str(e)) from None
        for a in (rng.start, rng.end):
            if ipaddress.IPv4Address(a) in (net.network_address, net.broadcast_address, gw) or (
                ipaddress.IPv4Address(a) not in net
            ):
                raise ConfigError(
                    rf,
                    f"{a}: want an address of {net} other than its network, broadcast and gateway",
                )
        ranges.append(rng)
    try:
        # an empty list is the reference's subnet without DHCP ranges: a
        # network of dhcp off (a Proxmox subnet without dhcp-range), whose
        # NICs Proxmox's IPAM gives addresses of the prefix and the zone's
        # dnsmasq serves, a fixed ipv4 too (README "DHCP ranges")
        return NetworkSpec(
            name=name,
            cidr=str(net),
            dhcp=bool(ranges),
            snat=bool(sn.get("snat")),
            alias=alias,
            dhcp_ranges=tuple(ranges),
        )
    except ValueError as e:
        raise ConfigError(f"{f}.cidr", str(e)) from None


def _vm_options(f: str, vm: dict[str, Any]) -> dict[str, str]:
    """The daemon's per-VM options for the reference's ``uefi_boot``,
    ``os_type``, ``cpu``, ``disk_controller`` and ``nic_controller``.

    The reference's defaults, written out or not (False, l26, ``cpu``
    "host" or None, ``disk_controller`` "scsi" or None, ``nic_controller``
    "virtio" or None), send nothing, so a VM that only writes them out may
    still claim a warm pool member. So ``disk_controller="scsi"`` is not
    checked against the template as the reference checks it (the daemon's
    hardened profile wants ``scsiN`` disks on virtio-scsi either way), and
    ``cpu="host"`` keeps the template's model (the reference sets ``cpu``
    on OVA imports only, "host" when unset). Another ``cpu`` is set on the
    clone, nested virtualization off. ``disk_controller="ide"`` is sent:
    a clone keeps its template's disks, so the daemon checks that the
    template's are on ide (the reference attaches an OVA's disks there on
    import). ``nic_controller="e1000"`` is sent: the daemon writes every
    NIC of the VM e1000, where the node allows it (``[api] allow_e1000``;
    refused at task start otherwise, the field named).
    """
    out: dict[str, str] = {}
    uefi = vm.get("uefi_boot", False)
    if not isinstance(uefi, bool):
        raise ConfigError(f"{f}.uefi_boot", f"want a bool, got {uefi!r}")
    if uefi:
        out["firmware"] = "uefi"
    os_type = vm.get("os_type")
    if os_type not in (None, "l26"):
        # win10 and win11 pass (a sandbox too: the daemon's Windows guest
        # client runs its exec and file calls); VmSpec refuses the others
        out["os_type"] = str(os_type)
    if vm.get("cpu") not in (None, "host"):
        out["cpu"] = str(vm["cpu"])
    disk = vm.get("disk_controller")
    if disk not in (None, "scsi"):
        out["disk_controller"] = str(disk)
    nic = vm.get("nic_controller")
    if nic not in (None, "virtio"):
        out["nic_controller"] = str(nic)
    return out


def _agent(f: str, vm: dict[str, Any]) -> bool:
    """Whether the reference's VM runs with a guest agent: ``is_sandbox=False``
    is the reference's VM whose "qemu-guest-agent need not be installed",
    the daemon's ``agent: false`` (ready once it runs, never reached
    inside), unless it has a ``healthcheck``, which runs through the
    agent."""
    is_sandbox = vm.get("is_sandbox", True)
    if not isinstance(is_sandbox, bool):
        raise ConfigError(f"{f}.is_sandbox", f"want a bool, got {is_sandbox!r}")
    return is_sandbox or vm.get("healthcheck") is not None


def ova_template_name(file: str, size: int) -> str:
    """The template an OVA is built into: the reference's tag of it
    (``ova-FILE-SIZE``, every character outside ``[a-zA-Z0-9_-]`` made
    ``_``, lower-cased) with ``_`` made ``-`` (a template name is a VM
    name, a DNS name); past 63 characters the file part is cut and the
    first 8 hex digits of the whole tag's sha256 keep it unique."""
    tag = re.sub(r"[^a-zA-Z0-9_\-]", "_", f"ova-{file}-{size}").lower()
    name = tag.replace("_", "-")
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(tag.encode()).hexdigest()[:8]
    tail = f"-{digest}-{size}"
    head = name[: 63 - len(tail)].rstrip("-")
    return head + tail


def ova_image(field: str, value: Any) -> OvaImage:
    """The reference's ``ova`` (a path on the eval machine) checked: a
    file, an OVA (a tar) with an ``.ovf`` and at least one ``.vmdk`` (the
    reference imports each; so does the node's import-only build, every
    disk the OVF lists)."""
    if "://" in str(value):
        raise ConfigError(
            field,
            f"{value!r}: the reference's ova is a file on the eval machine; an OVA at a URL is "
            "built on the node: pve-inspectd template build NAME --from URL --ova-disk DISK.vmdk "
            "--checksum sha256:HEX, then name it in existing_vm_template_tag",
        )
    path = os.path.abspath(os.fspath(value))
    if not os.path.isfile(path):
        raise ConfigError(field, f"{path}: no such file (an OVA on this machine)")
    file = os.path.basename(path)
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.ova", file) is None:
        raise ConfigError(
            field,
            f"{file!r}: want a file name of letters, digits and '_.-' ending .ova (the name "
            "the node stores it under)",
        )
    try:
        with tarfile.open(path, "r") as tar:
            names = tar.getnames()
    except (tarfile.TarError, OSError) as e:
        raise ConfigError(field, f"{path}: not an OVA (a tar archive): {e}") from None
    if not any(n.endswith(".ovf") for n in names):
        raise ConfigError(field, f"{path} holds no .ovf descriptor: Proxmox takes no such OVA")
    if not any(n.endswith(".vmdk") for n in names):
        raise ConfigError(field, f"{path} holds no .vmdk disk")
    return OvaImage(path=path, size=os.path.getsize(path))


def _ova_mode(f: str, ova: OvaImage, vm: dict[str, Any]) -> OvaImage:
    """The OVA's import as the reference does it for the VM ``vm``: its
    disks on ide for ``disk_controller="ide"`` (the reference's disk prefix
    of the import; scsi else), its ``os_type`` (l26, win10, win11) the
    template's ostype."""
    bus = "ide" if vm.get("disk_controller") == "ide" else None
    os_type = vm.get("os_type")
    try:
        return OvaImage.model_validate(
            {
                **ova.model_dump(),
                "disk_bus": bus,
                "os_type": os_type if os_type not in (None, "l26") else None,
            }
        )
    except ValidationError as e:
        loc = e.errors()[0]["loc"]
        field = {"disk_bus": "disk_controller", "os_type": "os_type"}.get(
            str(loc[0]) if loc else ""
        )
        raise ConfigError(f"{f}.{field}" if field else f, e.errors()[0]["msg"]) from None


def _shared_nic(nf: str, nic: dict[str, Any]) -> NicSpec:
    """A NIC (field ``nf``) whose ``vnet_alias`` is none of the sample's own
    vnets: as the reference looks such an alias up among every existing
    Proxmox vnet (``GET /cluster/sdn/vnets``, by alias), with
    ``sdn_config=None`` ("Using Existing Proxmox VNETs") and beside a
    config's own vnets alike, it is a NIC on a vnet the node's operator
    shares, named by its Proxmox alias (what the reference matches) or id;
    the daemon resolves it at task start, or refuses it listing the vnets
    the node shares. The reference takes no static address there; this
    provider no fixed MAC either (the vnet's other guests are other
    sandboxes')."""
    if nic.get("vlan_tag") is not None:
        raise ConfigError(f"{nf}.vlan_tag", "not supported: a shared vnet carries no VLANs")
    for k in ("mac", "ipv4"):
        if nic.get(k) is not None:
            raise ConfigError(
                f"{nf}.{k}",
                "not supported on an existing (shared) vnet: its other guests are other "
                "sandboxes', and its addresses the vnet's DHCP's",
            )
    alias = nic.get("vnet_alias")
    if not isinstance(alias, str) or not alias:
        raise ConfigError(f"{nf}.vnet_alias", f"want a vnet alias, got {alias!r}")
    return NicSpec(vnet=alias)


def _nics(
    f: str, nics: list[dict[str, Any]], aliases: dict[str, str]
) -> tuple[tuple[str, ...] | None, tuple[NicSpec, ...] | None]:
    """A VM's ``nics`` as the daemon's ``networks`` (every NIC on a vnet of
    the sample's own, by alias, none fixed: the node's warm pool may serve
    it) or ``nics`` (else, in the same order): an alias of the config's
    ``sdn_config`` is the sample's own vnet, with its ``mac`` and ``ipv4``;
    any other (all of them with ``sdn_config`` ``"auto"`` or ``None``,
    which have no aliases of their own) names an existing vnet, a shared
    one (:func:`_shared_nic`)."""
    specs: list[NicSpec] = []
    for j, nic in enumerate(nics):
        nf = f"{f}.nics[{j}]"
        alias = nic.get("vnet_alias")
        if alias not in aliases:
            specs.append(_shared_nic(nf, nic))
            continue
        if nic.get("vlan_tag") is not None:
            raise ConfigError(f"{nf}.vlan_tag", "not supported: a sandbox's vnets carry no VLANs")
        try:
            specs.append(
                NicSpec(network=aliases[alias], mac=_s(nic.get("mac")), ipv4=_s(nic.get("ipv4")))
            )
        except ValidationError as e:
            err = e.errors()[0]
            raise ConfigError(f"{nf}.{err['loc'][0]}", err["msg"]) from None
    if any(n.vnet is not None or n.mac is not None or n.ipv4 is not None for n in specs):
        # a shared vnet, a fixed MAC or address: the NICs go as nics (never
        # from the node's warm pool), a fixed address reserved by its MAC
        # in Proxmox's IPAM
        return None, tuple(specs)
    return tuple(str(n.network) for n in specs), None


def _vm(i: int, vm: dict[str, Any], aliases: dict[str, str], shared: bool) -> VmSpec:
    f = f"vms_config[{i}]"
    extra = set(vm) - _VM_FIELDS
    if extra:
        raise ConfigError(f"{f}.{sorted(extra)[0]}", "unknown field")
    for k, ok in _VM_DEFAULTS.items():
        if k in vm and vm[k] not in ok:
            raise ConfigError(f"{f}.{k}", f"{vm[k]!r} is not supported: {_VM_WHY[k]}")
    if not isinstance(vm.get("firewall", False), bool):
        raise ConfigError(f"{f}.firewall", f"want a bool, got {vm['firewall']!r}")
    src = vm.get("vm_source_config") or {}
    ova = None
    if src.get("ova") is not None:
        if src.get("built_in") is not None or src.get("existing_vm_template_tag"):
            raise ConfigError(
                f"{f}.vm_source_config", "give one of ova, built_in and existing_vm_template_tag"
            )
        ova = ova_image(f"{f}.vm_source_config.ova", src["ova"])
    built_in = src.get("built_in")
    tag = src.get("existing_vm_template_tag")
    if built_in is not None:
        if built_in not in BUILT_INS:
            raise ConfigError(
                f"{f}.vm_source_config.built_in",
                f"{built_in!r}: not a built-in (one of {', '.join(BUILT_INS)})",
            )
        if tag:
            raise ConfigError(
                f"{f}.vm_source_config", "give existing_vm_template_tag or built_in, not both"
            )
        # the template a node's build of the recipe makes: named as the
        # recipe (pve-inspectd template build NAME --recipe NAME), tagged
        # builtin-NAME as the reference tags its built-ins
        tag = built_in
    if ova is not None:
        tag = ova_template_name(os.path.basename(ova.path), ova.size)
    if not tag:
        raise ConfigError(f"{f}.vm_source_config.existing_vm_template_tag", "required")
    nets: tuple[str, ...] | None = None
    fixed: tuple[NicSpec, ...] | None = None
    nics = vm.get("nics")
    # nics=[]: the reference's "virtual machine with no network access" (it
    # removes the template's NICs and adds none), the daemon's no_network
    no_network = nics is not None and len(nics) == 0
    if nics is None and shared:
        raise ConfigError(
            f"{f}.nics",
            "with sdn_config None every VM names its existing vnets in nics (or gives "
            "nics=[]: no network)",
        )
    if nics:
        nets, fixed = _nics(f, list(nics), aliases)
    hc = vm.get("healthcheck")
    if ova is not None:
        ova = _ova_mode(f, ova, vm)
        if vm.get("disk_controller") == "ide":
            # the template's disks are imported on ide: nothing to ask of
            # the clone (it keeps its template's disks)
            vm = {**vm, "disk_controller": None}
    opts = _vm_options(f, vm)
    agent = _agent(f, vm)
    try:
        return VmSpec.model_validate(
            {
                "template": str(tag),
                "built_in": built_in,
                "ova": ova,
                "name": _s(vm.get("name")),
                "cores": vm.get("vcpus", 2),
                "memory_mib": vm.get("ram_mb", 2048),
                "networks": nets,
                "nics": fixed,
                "no_network": no_network,
                "sandbox": bool(vm.get("is_sandbox", True)),
                "agent": agent,
                "healthcheck": None if hc is None else HealthCheck.model_validate(hc),
                **opts,
            }
        )
    except ValidationError as e:
        err = e.errors()[0]
        loc = err["loc"][0] if err["loc"] else ""
        back = {"firmware": "uefi_boot"}.get(str(loc), str(loc))
        field = f"{f}.{back}" if loc in opts else f
        raise ConfigError(field, err["msg"]) from None
    except ValueError as e:
        raise ConfigError(f, str(e)) from None


def _check_depends_on(vms: list[dict[str, Any]]) -> None:
    """depends_on names VMs of the config, never the VM itself, in no
    cycle (the reference refuses the same)."""
    names = [str(v.get("name") or "default") for v in vms]
    deps: dict[str, list[str]] = {}
    for i, v in enumerate(vms):
        f = f"vms_config[{i}].depends_on"
        on = [str(d) for d in (v.get("depends_on") or ())]
        for d in on:
            if d not in names:
                raise ConfigError(f, f"{d!r}: no VM of this config has that name")
            if d == names[i]:
                raise ConfigError(f, f"{d!r}: a VM cannot depend on itself")
        deps[names[i]] = on
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            cyc = [*path[path.index(n) :], n]
            raise ConfigError("vms_config", "depends_on has a cycle: " + " -> ".join(cyc))
        state[n] = 1
        for d in deps.get(n, []):
            visit(d, [*path, n])
        state[n] = 2

    for n in names:
        visit(n, [])


def from_reference(d: dict[str, Any]) -> PveInspectSandboxEnvironmentConfig:
    """Convert a ProxmoxSandboxEnvironmentConfig (as a dict) or refuse it."""
    extra = set(d) - REFERENCE_KEYS
    if extra:
        raise ConfigError(sorted(extra)[0], "unknown field of ProxmoxSandboxEnvironmentConfig")
    if d.get("instance_pool_id", "default") != "default":
        raise ConfigError(
            "instance_pool_id", "pools are not supported: list the nodes in PVE_INSPECT_URL"
        )
    sdn = d.get("sdn_config", "auto")
    nets, aliases = _networks(sdn)
    vms = d.get("vms_config")
    if not vms:
        raise ConfigError(
            "vms_config", "at least one VM (the reference's built-in default is not supported)"
        )
    # each converted VM with the index of the vms_config entry it came from
    converted = [(i, _vm(i, dict(v), aliases, sdn is None)) for i, v in enumerate(vms)]
    specs = tuple(spec for _, spec in converted)
    _check_depends_on([dict(v) for v in vms])
    paths = reference_paths([dict(v) for v in vms], [i for i, _ in converted], len(nets))
    try:
        cfg = PveInspectSandboxEnvironmentConfig(vms=specs, networks=nets)
        return cfg.with_reference_paths(paths)
    except ValueError as e:
        # a NIC's fixed MAC or address, named as the reference's field
        m = re.search(r"(vms\[\d+\]\.nics\[\d+\]\.\w+): ([^\n]*)", str(e))
        if m:
            raise ConfigError(paths.name(m[1]), m[2]) from None
        raise ConfigError("vms_config", str(e)) from None


def load_file(path: str) -> dict[str, Any]:
    """A config file (Inspect's ``--sandbox pve_inspect:cfg.yaml`` convention):
    YAML (``.yaml``, ``.yml``) or JSON (``.json``; any other name is read as
    YAML, which JSON is a subset of), holding one config in this provider's
    shape or the reference plugin's. A relative path is the working
    directory's (Inspect passes the task directory's, made absolute)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("config", f"config file {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError("config", f"config file {path}: not valid {_kind(path)}: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(
            "config",
            f"config file {path}: want a mapping of config fields, got {type(doc).__name__}",
        )
    return doc


def _kind(path: str) -> str:
    return "JSON" if path.endswith(".json") else "YAML"


def coerce(config: object) -> PveInspectSandboxEnvironmentConfig:
    """Any config Inspect hands over (ours, the reference's, a dict, the
    path of a config file, None)."""
    if config is None:
        return PveInspectSandboxEnvironmentConfig()
    if isinstance(config, PveInspectSandboxEnvironmentConfig):
        return config
    if isinstance(config, str):
        doc = load_file(config)
        try:
            return coerce(doc)
        except ConfigError as e:
            raise ConfigError(e.field, f"{e.message} (config file {config})") from None
        except ValidationError as e:
            raise ConfigError("config", f"config file {config}: {e}") from None
    if isinstance(config, BaseModel):
        config = config.model_dump(mode="json")
    if isinstance(config, dict):
        if is_reference_shape(config):
            return from_reference(config)
        return PveInspectSandboxEnvironmentConfig.model_validate(config)
    raise ConfigError(
        "config",
        f"want a PveInspectSandboxEnvironmentConfig or a config file's path, "
        f"got {type(config).__name__}",
    )
