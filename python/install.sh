#!/usr/bin/env bash
# Installs the Python side (inspect-pve-inspect, the real inspect-ai, pytest,
# mypy, ruff, schemathesis) from PyPI into python/.venv, every version
# pinned by constraints.txt. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
  -e '.[test]'
cp constraints.txt .venv/.constraints
