"""Inspect's entry point (``inspect_ai``): importing it registers ``pve_inspect``."""

from .sandbox import PveInspectSandboxEnvironment

__all__ = ["PveInspectSandboxEnvironment"]
