#!/bin/sh
# Writes a Debian changelog entry for version $1 from the git commit.
set -eu
v=$1
when=$(git log -1 --format=%cD 2>/dev/null || date -R)
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cat <<EOT
pve-inspectd ($v) unstable; urgency=medium

  * Built from git commit $rev.

 -- pve-inspect developers <maintainers@pve-inspect.dev>  $when
EOT
