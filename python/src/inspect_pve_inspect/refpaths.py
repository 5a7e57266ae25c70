"""The field paths a converted reference config was written with.

A config in the reference plugin's shape (:mod:`.compat`) becomes this
provider's config, whose create request the daemon checks: its refusals
name the request's fields (``vms[1].template``, ``networks[0].cidr``,
``vms[0].nics[1].vnet``), which the eval's author never wrote. The
conversion records, for each field of the converted config, the reference
field it came from (``vms_config[1].vm_source_config.existing_vm_template_tag``,
``sdn_config.vnet_configs[0].subnets[0].cidr``,
``vms_config[0].nics[1].vnet_alias``: :func:`reference_paths`), and
messages name a refusal's field through that record
(:meth:`ReferencePaths.name`). The record is carried
by the converted config itself (:meth:`.config.PveInspectSandboxEnvironmentConfig.reference_paths`);
a native config has none and keeps its own names.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any

# Where a path may be cut into a prefix and the rest: before a ".name"
# or an "[index]" step.
_STEP = re.compile(r"\.|\[")


class ReferencePaths:
    """The reference field path of each converted field, by the field's
    path in the create request (the daemon's names). A path not recorded
    is named through its longest recorded prefix (``vms[0].nics[1].mac``
    through ``vms[0].nics[1]``), else as it is. A path of ``whole`` names
    only itself, not its parts: a list whose items are recorded one by one
    (``vms``, whose item ``vms[k]`` is ``vms_config[i]`` for the ``i`` it
    came from), so that an item not recorded is not named by its index."""

    __slots__ = ("_paths", "_whole")

    def __init__(self, paths: Mapping[str, str], whole: Collection[str] = ()) -> None:
        self._paths: dict[str, str] = dict(paths)
        self._whole = frozenset(whole)

    def name(self, field: str) -> str:
        """``field`` (a create request's path) as the reference config
        names it."""
        if field in self._paths:
            return self._paths[field]
        cuts = [m.start() for m in _STEP.finditer(field)]
        for cut in reversed(cuts):
            head = field[:cut]
            if head in self._paths and head not in self._whole:
                return self._paths[head] + field[cut:]
        return field

    def paths(self) -> Mapping[str, str]:
        """The record (read-only)."""
        return MappingProxyType(self._paths)

    def __copy__(self) -> ReferencePaths:
        return self  # immutable

    def __deepcopy__(self, memo: dict[int, object]) -> ReferencePaths:
        return self

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ReferencePaths)
            and self._paths == other._paths
            and self._whole == other._whole
        )

    def __hash__(self) -> int:
        return hash((tuple(sorted(self._paths.items())), self._whole))

    def __repr__(self) -> str:
        return f"ReferencePaths({self._paths!r}, whole={sorted(self._whole)!r})"


# A converted VM's fields (the create request's names) by the reference
# field each comes from, under vms_config[i]; the template's is its
# vm_source_config's, and NICs are recorded one by one (reference_paths).
_VM_PATHS = {
    "name": "name",
    "cores": "vcpus",
    "memory_mib": "ram_mb",
    "networks": "nics",
    "nics": "nics",
    "no_network": "nics",
    "sandbox": "is_sandbox",
    "agent": "is_sandbox",
    "healthcheck": "healthcheck",
    "firmware": "uefi_boot",
    "os_type": "os_type",
    "cpu": "cpu",
    "disk_controller": "disk_controller",
    "nic_controller": "nic_controller",
    "built_in": "vm_source_config.built_in",
    "ova": "vm_source_config.ova",
}
# A converted network's fields by the reference field each comes from,
# under sdn_config.vnet_configs[i] (its one subnet).
_NETWORK_PATHS = {
    "name": "alias",
    "cidr": "subnets[0].cidr",
    "dhcp": "subnets[0].dhcp_ranges",
    "dhcp_ranges": "subnets[0].dhcp_ranges",
    "snat": "subnets[0].snat",
}


def reference_paths(
    vms: Sequence[Mapping[str, Any]], sources: Sequence[int], networks: int
) -> ReferencePaths:
    """The reference path of each field of a converted config, by its path
    in the create request: ``sources[k]`` is the index in ``vms`` (the
    reference's vms_config) of the converted config's VM ``k``, so a
    conversion that reorders or drops VMs keeps naming the entries the
    user wrote; the ``networks`` networks are the sdn_config's vnets in
    order (one each), and a VM's NICs its ``nics`` in order."""
    out: dict[str, str] = {"vms": "vms_config", "networks": "sdn_config.vnet_configs"}
    for k, i in enumerate(sources):
        f, ref = f"vms[{k}]", f"vms_config[{i}]"
        vm = vms[i]
        src = vm.get("vm_source_config") or {}
        which = next(
            (w for w in ("ova", "built_in") if src.get(w) is not None), "existing_vm_template_tag"
        )
        out[f] = ref
        out[f"{f}.template"] = f"{ref}.vm_source_config.{which}"
        out.update({f"{f}.{a}": f"{ref}.{b}" for a, b in _VM_PATHS.items()})
        for j in range(len(vm.get("nics") or ())):
            nic = f"{ref}.nics[{j}]"
            out[f"{f}.nics[{j}]"] = nic
            for a in ("network", "vnet"):
                out[f"{f}.nics[{j}].{a}"] = f"{nic}.vnet_alias"
            out[f"{f}.networks[{j}]"] = f"{nic}.vnet_alias"
    for i in range(networks):
        f, ref = f"networks[{i}]", f"sdn_config.vnet_configs[{i}]"
        out[f] = ref
        out.update({f"{f}.{a}": f"{ref}.{b}" for a, b in _NETWORK_PATHS.items()})
    # a VM or network not recorded is not named by its index
    return ReferencePaths(out, whole=("vms", "networks"))
