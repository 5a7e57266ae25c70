#!/bin/bash
# Runs the reference Inspect plugin's own end-to-end suite (pytest -m
# req_proxmox of UKGovernmentBEIS/inspect_proxmox_sandbox) against the node
# in a box: the playground (pve-inspect-demo --stay --reference-plugin) with
# the emulated Proxmox API and pve-inspectd guarding the node. pytest runs
# inside the bed's uplink namespace only (no route out), as a user's client
# beside the node would. Never in CI: CI cannot reach the plugin's
# repository, and the suite takes tens of minutes.
#
#   sudo scripts/reference-suite.sh PLUGIN_CHECKOUT [pytest args...]
#   make reference-suite PLUGIN=PLUGIN_CHECKOUT
#
# PLUGIN_CHECKOUT is a checkout of the plugin (git clone
# https://github.com/UKGovernmentBEIS/inspect_proxmox_sandbox). The script
# makes a virtual environment in PLUGIN_CHECKOUT/.venv-bed with the plugin,
# inspect-ai from PyPI and its test tools at the versions of the plugin's
# uv.lock (done once, outside the bed; delete it to reinstall).
# Environment:
#   PVE_RELEASE   the emulated release, 9.2 (default) or 9.1
#   LOCKDOWN=0    skip the second run, the egress lockdown test with the
#                 daemon's lockdown marker set
#   KEEP_LOG=DIR  keep the playground's output and pytest's in DIR
# Exit status: pytest's (the first run's, or the lockdown run's if that one
# fails). The tests a bed cannot pass are listed in README.md.
set -euo pipefail

if [ -n "${CI:-}" ]; then
	echo "reference-suite: not in CI (it needs the plugin's repository and a bed)" >&2
	exit 2
fi
if [ $# -lt 1 ] || [ ! -f "$1/pyproject.toml" ] || ! grep -q 'inspect-proxmox-sandbox' "$1/pyproject.toml"; then
	echo "usage: $0 PLUGIN_CHECKOUT [pytest args...]  (a checkout of UKGovernmentBEIS/inspect_proxmox_sandbox)" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ]; then
	echo "reference-suite: the bed needs root (sudo $0 ...)" >&2
	exit 2
fi
plugin=$(cd "$1" && pwd)
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
release=${PVE_RELEASE:-9.2}
logdir=${KEEP_LOG:-$(mktemp -d)}
mkdir -p "$logdir"

# The tests that need what no bed has (README.md, "The reference plugin's
# suite on the bed"): the repository's OVA fixture (kept outside git) and
# the built-in VM tests (an Ubuntu cloud image from the internet).
deselect=(
	--deselect tests/proxmoxsandboxtest/test_built_in_vm.py
	--deselect tests/proxmoxsandboxtest/test_proxmox_sandbox_environment_e2e.py::test_ova
	--deselect tests/proxmoxsandboxtest/test_qemu_commands.py::test_from_ova_local
	--deselect tests/proxmoxsandboxtest/test_qemu_commands.py::test_from_ova_uefi_sandbox
)

# inspect-ai and the test tools at the versions the plugin's uv.lock pins
# (the newest inspect-ai may lack what its tests import).
locked() {
	local v
	v=$(grep -A1 "^name = \"$1\"\$" "$plugin/uv.lock" 2>/dev/null | sed -n 's/^version = "\(.*\)"/\1/p' | head -1)
	echo "$1${v:+==$v}"
}
venv=$plugin/.venv-bed
if [ ! -x "$venv/bin/pytest" ]; then
	python3 -m venv "$venv"
	"$venv/bin/pip" install --quiet --upgrade pip
	"$venv/bin/pip" install --quiet -e "$plugin" "$(locked inspect-ai)" "$(locked pytest)" "$(locked pytest-asyncio)"
fi

make -C "$repo" --no-print-directory build >/dev/null
out=$logdir/playground.log
"$repo/bin/pve-inspect-demo" --stay --bin "$repo/bin" --listen 127.0.0.1:0 \
	--pve-release "$release" --reference-plugin >"$out" 2>&1 &
demo=$!
stop() {
	if kill -0 "$demo" 2>/dev/null; then
		kill -TERM "$demo"
		wait "$demo" || true
	fi
	[ -n "${KEEP_LOG:-}" ] || rm -rf "$logdir"
}
trap stop EXIT
for _ in $(seq 600); do
	grep -q '^playground ready' "$out" && break
	kill -0 "$demo" 2>/dev/null || { cat "$out" >&2; exit 1; }
	sleep 1
done
grep -q '^playground ready' "$out" || { echo "reference-suite: playground not ready" >&2; exit 1; }
key() { sed -n "s/^$1 = //p" "$out" | head -1; }
uplink=$(key uplink_ns)
marker=$(key marker)
[ -n "$uplink" ] && [ -n "$marker" ] || { echo "reference-suite: playground printed no uplink_ns/marker" >&2; exit 1; }

# The plugin's settings (its README), for the emulated node "pve".
plugin_env=(
	PROXMOX_HOST="$(key pve_host)" PROXMOX_PORT=8006 PROXMOX_USER=root PROXMOX_REALM=pam
	PROXMOX_PASSWORD="$(cat "$(key pve_root_password_file)")" PROXMOX_NODE=pve PROXMOX_VERIFY_TLS=0
	PROXMOX_IMAGE_STORAGE=local-lvm
)
# run_pytest EXTRA_ENV ARGS...: pytest in the uplink namespace.
run_pytest() {
	local extra=$1
	shift
	# shellcheck disable=SC2086 # extra is empty or one VAR=value
	(cd "$plugin" && ip netns exec "$uplink" env "${plugin_env[@]}" $extra "$venv/bin/pytest" "$@")
}

status=0
echo "reference-suite: release $release, bed $(key bed), logs in $logdir"
run_pytest "" -m req_proxmox -rA "${deselect[@]}" "$@" 2>&1 | tee "$logdir/pytest.log" || status=$?
if [ "${LOCKDOWN:-1}" != 0 ]; then
	# The lockdown test with the lockdown in force (the plugin's
	# CONTRIBUTING.md: touch the marker, run it, remove the marker).
	touch "$marker"
	sleep 3
	lstatus=0
	run_pytest PROXMOX_EGRESS_LOCKDOWN_ENABLED=1 tests/proxmoxsandboxtest/test_egress_lockdown_e2e.py -rA 2>&1 |
		tee "$logdir/pytest-lockdown.log" || lstatus=$?
	rm -f "$marker"
	[ "$lstatus" = 0 ] || status=$lstatus
fi
exit "$status"
