"""Schemathesis hooks (SCHEMATHESIS_HOOKS=st_hooks): the check that no
token acts beyond its scope. ST_SCOPE is the scope of the token the run
sends (admin, exec, read; none: a token the daemon never issued)."""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any

import schemathesis

RANK = {"read": 1, "exec": 2, "admin": 3}


@schemathesis.check
def token_within_scope(ctx: Any, response: Any, case: Any) -> bool | None:
    """No request acts beyond its credentials: without an Authorization
    header nothing is served (no 2xx); with a token below the operation's
    scope the answer is 403; with a token the daemon never issued, 401. A
    method the route does not have may say 405 first (it serves nothing)."""
    scope = os.environ.get("ST_SCOPE", "admin")
    need = case.operation.definition.raw.get("x-scope", "admin")
    code = response.status_code
    label = f"{case.method} {case.operation.path}"
    sent = response.request.headers.get("Authorization")
    if code == 405:
        return None
    if not sent:
        if 200 <= code < 300:
            raise AssertionError(f"served without a token: {code} for {label}")
        return None
    if scope == "none":
        if code != 401:
            raise AssertionError(f"unknown token served: {code} for {label}")
    elif RANK[scope] < RANK[need] and code != 403:
        raise AssertionError(f"{scope} token on a {need} operation {label}: {code}, want 403")
    return None


# The create rules the OpenAPI document states in words (CreateRequest's
# description: JSON Schema cannot say them) and the node's state, applied to
# the bodies schemathesis generates as valid (positive) ones, so that such a
# body is refused only for a documented state reason (ST202). Negative
# bodies are left as they are: they must be refused.
TEMPLATE = os.environ.get("ST_TEMPLATE", "debian")  # the playground's template
CT_TEMPLATE = os.environ.get("ST_CT_TEMPLATE", "ct-debian")  # and its container template
MAX_ENV_BYTES = 64 << 10
# A create makes real VMs on the bed: a positive create has at most this many.
BED_VMS = 2


def _unique(name: str, used: set[str], i: int) -> str:
    n, k = name, 0
    while n in used:
        n, k = f"n{i}x{k}", k + 1
    used.add(n)
    return n


def _fixed_ok(net: Any, ip: Any) -> bool:
    """Whether ip may be a fixed address on the network net (a body's
    network object): a fixed cidr (DHCP on or off), inside it, not its
    network, broadcast or gateway (first host) address."""
    if not isinstance(net, dict) or net.get("cidr", "auto") in ("", "auto"):
        return False
    try:
        cidr = ipaddress.IPv4Network(net["cidr"])
        a = ipaddress.IPv4Address(ip)
    except ValueError:
        return False
    return a in cidr and a not in (
        cidr.network_address,
        cidr.broadcast_address,
        cidr.network_address + 1,
    )


def _apply_nic_rules(
    v: dict[str, Any], defined: list[str], nets: Any, seen: dict[str, set[str]]
) -> None:
    """A VM's nics with the stated rules applied: networks or nics, not
    both; each nic on a defined network of the sandbox (no shared vnet:
    the test node shares none); MACs unique in the sandbox (in any
    case), and fixed addresses too, each one its network allows (else
    left out)."""
    nics = v.get("nics")
    if not isinstance(nics, list):
        return
    if nics and isinstance(v.get("networks"), list) and v["networks"]:
        v.pop("networks")
    by_name = {n.get("name"): n for n in nets} if isinstance(nets, list) else {}
    for nic in nics:
        if not isinstance(nic, dict):
            continue
        # a nic names a network or a vnet the node shares ([api]
        # shared_vnets), not both; the test node shares none
        nic.pop("vnet", None)
        if nic.get("network") not in defined:
            nic["network"] = defined[0]
        mac = nic.get("mac")
        if isinstance(mac, str) and mac:
            if mac.upper() in seen["macs"]:
                nic.pop("mac")
            seen["macs"].add(mac.upper())
        ip = nic.get("ipv4")
        if isinstance(ip, str) and ip:
            if ip in seen["ips"] or not _fixed_ok(by_name.get(nic["network"]), ip):
                nic.pop("ipv4")
            else:
                seen["ips"].add(ip)


def _ranges_ok(net: dict[str, Any], nics: int, fixed: set[str]) -> bool:
    """Whether a body's network may keep its dhcp_ranges: a fixed cidr with
    DHCP, each end inside it and not its network, broadcast or gateway
    address, start not above end, no two sharing an address, room for the
    network's nics (its fixed addresses inside a range taken)."""
    rs = net.get("dhcp_ranges")
    if not isinstance(rs, list) or not rs:
        return True
    if net.get("cidr", "auto") in ("", "auto") or net.get("dhcp") is False:
        return False
    spans: list[tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]] = []
    for r in rs:
        if not isinstance(r, dict) or not all(_fixed_ok(net, r.get(k)) for k in ("start", "end")):
            return False
        lo, hi = ipaddress.IPv4Address(r["start"]), ipaddress.IPv4Address(r["end"])
        if lo > hi or any(not (hi < a or b < lo) for a, b in spans):
            return False
        spans.append((lo, hi))
    held = sum(1 for f in fixed if any(a <= ipaddress.IPv4Address(f) <= b for a, b in spans))
    return sum(int(b) - int(a) + 1 for a, b in spans) - held >= nics


def _nics_on(vms: list[dict[str, Any]], name: Any, first: Any) -> tuple[int, set[str]]:
    """The number of NICs on network ``name`` and their fixed addresses."""
    nics, fixed = 0, set()
    for v in vms:
        if v.get("no_network") is True:
            continue  # no NIC on any network
        on: list[Any] = [x for x in v.get("networks") or [] if isinstance(x, str)]
        for nic in v.get("nics") or []:
            if isinstance(nic, dict):
                on.append(nic.get("network"))
                if nic.get("network") == name and nic.get("ipv4"):
                    fixed.add(nic["ipv4"])
        # a VM of neither is on the first network
        nics += (on or [first]).count(name)
    return nics, fixed


def _prefix_room(net: dict[str, Any], nics: int, fixed: set[str]) -> bool:
    """Whether a network of dhcp false with a fixed cidr has room for its
    NICs: each takes an address of the cidr but its network, gateway and
    broadcast ones while configured, one with a fixed ipv4 besides its
    own."""
    try:
        cidr = ipaddress.IPv4Network(net["cidr"])
    except (KeyError, TypeError, ValueError):
        return True
    return cidr.num_addresses - 3 - len(fixed) >= nics


def _plan_room(net: dict[str, Any], nics: int, fixed: set[str]) -> bool:
    """Whether a network with DHCP, a fixed cidr and no dhcp_ranges has
    room for its NICs in the daemon's range of the cidr (sandbox
    PlanDHCPRange: from its 2nd address on a /28 or smaller, else its
    10th, to the last but one), its fixed addresses inside it taken."""
    try:
        cidr = ipaddress.IPv4Network(net["cidr"])
    except (KeyError, TypeError, ValueError):
        return True
    base, size = int(cidr.network_address), cidr.num_addresses
    lo, hi = base + (2 if size <= 16 else 10), base + size - 2
    held = 0
    for f in fixed:
        try:
            held += lo <= int(ipaddress.IPv4Address(f)) <= hi
        except ValueError:
            continue
    return hi - lo + 1 - held >= nics


def _drop_fixed_on(vms: list[dict[str, Any]], name: Any) -> None:
    """Every NIC's fixed address on network ``name`` left out."""
    for v in vms:
        for nic in v.get("nics") or []:
            if isinstance(nic, dict) and nic.get("network") == name:
                nic.pop("ipv4", None)


def _apply_range_rules(body: dict[str, Any]) -> None:
    """Each network's dhcp_ranges left out unless the stated rules hold;
    on a network without room for its NICs (of dhcp false: in its cidr;
    with DHCP and no ranges: in the daemon's range of its cidr), the fixed
    addresses left out, then its cidr made auto."""
    nets, vms = body.get("networks"), body.get("vms")
    if not isinstance(nets, list):
        return
    vms = [v for v in vms if isinstance(v, dict)] if isinstance(vms, list) else []
    for n in nets:
        if not isinstance(n, dict):
            continue
        first = nets[0].get("name") if isinstance(nets[0], dict) else None
        nics, fixed = _nics_on(vms, n.get("name"), first)
        if n.get("dhcp") is False and not _prefix_room(n, nics, fixed):
            _drop_fixed_on(vms, n.get("name"))
            if not _prefix_room(n, nics, set()):
                n.pop("cidr", None)
        if "dhcp_ranges" in n and not _ranges_ok(n, nics, fixed):
            n.pop("dhcp_ranges")
        if n.get("dhcp") is not False and "dhcp_ranges" not in n:
            # no ranges of its own: the daemon's range of the cidr
            nics, fixed = _nics_on(vms, n.get("name"), first)
            if not _plan_room(n, nics, fixed):
                _drop_fixed_on(vms, n.get("name"))
                if not _plan_room(n, nics, set()):
                    n.pop("cidr", None)


# The per-VM options a container (kind lxc) does not take.
VM_OPTIONS = ("firmware", "cpu", "os_type", "disk_controller", "nic_controller", "agent")


def apply_create_rules(body: dict[str, Any]) -> dict[str, Any]:
    """A generated create body with the stated cross-field rules applied:
    unique network and VM names, a VM's networks (or its nics' networks)
    among networks (net0 when there are none), none for a VM of
    no_network, the rules of nics, env
    within its byte budget; and the node's state: its template, the disk as
    the template has it (Proxmox refuses a smaller one), at most BED_VMS
    VMs."""
    nets = body.get("networks")
    defined = ["net0"]
    if isinstance(nets, list) and nets:
        used: set[str] = set()
        for i, n in enumerate(nets):
            if isinstance(n, dict) and isinstance(n.get("name"), str):
                n["name"] = _unique(n["name"], used, i)
        defined = sorted(used) or defined
    vms = body.get("vms")
    if isinstance(vms, list):
        del vms[BED_VMS:]
        names: set[str] = set()
        seen: dict[str, set[str]] = {"macs": set(), "ips": set()}
        for i, v in enumerate(vms):
            if not isinstance(v, dict):
                continue
            v["template"] = TEMPLATE
            v.pop("disk_gib", None)
            if v.get("disk_controller") == "ide":
                # the node's state: the template's disks are on scsi
                v.pop("disk_controller")
            if v.get("kind") == "lxc":
                # a container: its template, no fixed MAC or address, and
                # one NIC (the bed starts a container's net0 only: the
                # emulator's limit, FIDELITY)
                v["template"] = CT_TEMPLATE
                # a container takes none of a VM's options (firmware, cpu,
                # os_type, controllers)
                for key in VM_OPTIONS:
                    v.pop(key, None)
                for key in ("networks", "nics"):
                    if isinstance(v.get(key), list):
                        del v[key][1:]
                for nic in v.get("nics") or []:
                    if isinstance(nic, dict):
                        nic.pop("mac", None)
                        nic.pop("ipv4", None)
            if v.get("no_network") is True:
                # a VM without any NIC gives neither networks nor nics
                v.pop("networks", None)
                v.pop("nics", None)
            name = v.get("name") or f"vm{i}"
            if name in names:
                name = _unique(f"v{i}", names | {f"vm{j}" for j in range(len(vms))}, i)
                v["name"] = name
            names.add(name)
            if isinstance(v.get("networks"), list):
                v["networks"] = [r if r in defined else defined[0] for r in v["networks"]]
            _apply_nic_rules(v, defined, nets, seen)
    _apply_range_rules(body)
    env = body.get("env")
    if env and isinstance(vms, list):
        # env needs a VM with a guest agent
        agents = [v for v in vms if isinstance(v, dict)]
        if agents and all(v.get("agent") is False for v in agents):
            agents[0].pop("agent")
    if isinstance(env, dict):
        while sum(len(k.encode()) + len(str(x).encode()) for k, x in env.items()) > MAX_ENV_BYTES:
            env.pop(next(iter(env)))
    return body


# The document's key patterns (patternProperties; the generator honours
# them since they replaced propertyNames, which a 3.0 document does not
# have), kept as a guard on the keys of positive bodies.
CREATE_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
EXEC_ENV_KEY = CREATE_ENV_KEY


def keys_matching(d: Any, pattern: re.Pattern[str]) -> Any:
    """d without the keys pattern refuses (d itself if not an object)."""
    if not isinstance(d, dict):
        return d
    return {k: v for k, v in d.items() if pattern.match(k)}


MAX_ARG_BYTES = 1 << 20
# A collected exec reserves twice its output_limit of its owner's 64 MiB
# share of the collected output (owner_collected_bytes, sandboxapi/quota.go).
MAX_COLLECTED = 32 << 20


def apply_exec_rules(body: dict[str, Any]) -> dict[str, Any]:
    """A generated exec body with the stated cross-field rules applied:
    argv[0] not empty, the arguments within their byte budget, a collected
    answer's output_limit within its cap."""
    argv = body.get("argv")
    if isinstance(argv, list) and argv and isinstance(argv[0], str):
        if argv[0] == "":
            argv[0] = "true"
        while len(argv) > 1 and sum(len(str(a).encode()) for a in argv) > MAX_ARG_BYTES:
            argv.pop()
    if isinstance(body.get("output_limit"), int) and body["output_limit"] > MAX_COLLECTED:
        body["output_limit"] = MAX_COLLECTED
    return body


@schemathesis.hook("map_case")
def stated_rules(ctx: Any, case: Any) -> Any:
    op = case.operation
    meta = case.meta
    if not isinstance(case.body, dict) or meta is None or meta.generation.mode.is_negative:
        return case
    body = case.body
    if op.method.upper() == "POST" and op.path in ("/v1/sandboxes", "/v1/sandboxes/validate"):
        for k, pat in (("env", CREATE_ENV_KEY), ("labels", LABEL_KEY)):
            if k in body:
                body[k] = keys_matching(body[k], pat)
        case.body = apply_create_rules(body)
    elif op.method.upper() == "POST" and op.path.endswith("/exec"):
        if "env" in body:
            body["env"] = keys_matching(body["env"], EXEC_ENV_KEY)
        case.body = apply_exec_rules(body)
    elif op.method.upper() == "POST" and op.path.endswith("/check"):
        # which VMs a sandbox has is its state: a valid check asks the default
        body.pop("vm", None)
    return case
