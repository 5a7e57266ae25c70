"""Inspect sandbox provider for pve-inspect (sandbox type ``pve_inspect``)."""

from .compat import ProxmoxSandboxEnvironmentConfig
from .config import (
    ConfigError,
    DhcpRangeSpec,
    EgressSpec,
    HealthCheck,
    NetworkSpec,
    NicSpec,
    NodeConfig,
    PveInspectSandboxEnvironmentConfig,
    VmSpec,
)
from .sandbox import PveInspectSandboxEnvironment

__all__ = [
    "ConfigError",
    "DhcpRangeSpec",
    "EgressSpec",
    "HealthCheck",
    "NetworkSpec",
    "NicSpec",
    "NodeConfig",
    "ProxmoxSandboxEnvironmentConfig",
    "PveInspectSandboxEnvironment",
    "PveInspectSandboxEnvironmentConfig",
    "VmSpec",
]
