# pve-inspect build, test, demo, bench and lint.
# sudo's secure_path usually lacks Go: fall back to its standard place.
GO      ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Debian version: grows with every commit, so a rebuilt package upgrades.
DEB_VERSION ?= 0.1.0~git$(shell git rev-list --count HEAD 2>/dev/null || echo 0).$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)-1
LDFLAGS := -s -w -X main.version=$(VERSION)
BIN     ?= bin
# Where `make deb` stages its generated files and writes the package.
DIST    ?= dist
# The targets that need root (deps, test, demo, playground, bench) run as
# they are when make runs as root, and through sudo otherwise.
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo env PATH="$(PATH)")

.PHONY: all build test race demo playground bench lint deps deb clean reference-suite

all: build

deps:
	@$(AS_ROOT) .ci/install-deps

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# Runs every test, including the root and test-bed ones (needs root).
test: deps build
	$(AS_ROOT) $(GO) test -count=1 -timeout 75m ./...

# The race detector on the packages that share state between tenants: the
# engine, the API, the guest agent client and the egress resolver and proxy
# (needs root: their tests use the bed and network namespaces).
race: deps
	$(AS_ROOT) $(GO) test -race -count=1 -timeout 45m ./sandbox/ ./sandboxapi/ ./qga/ ./firewall/egress/

# Brings the node in a box up, runs the containment check, tears it down.
demo: deps build
	$(AS_ROOT) $(BIN)/pve-inspect-demo

# The node in a box with the daemon, its API and MCP server, until Ctrl-C:
# it prints how to reach each (CLI, curl, MCP client configs).
playground: deps build
	$(AS_ROOT) $(BIN)/pve-inspect-demo --stay

# The reference Inspect plugin's own suite against the playground, pytest in
# the bed's uplink namespace (never in CI): make reference-suite PLUGIN=path
# (a checkout of UKGovernmentBEIS/inspect_proxmox_sandbox).
reference-suite: deps build
	@test -n "$(PLUGIN)" || { echo "make reference-suite PLUGIN=<plugin checkout>"; exit 2; }
	$(AS_ROOT) scripts/reference-suite.sh $(PLUGIN)

bench: deps build
	$(AS_ROOT) $(BIN)/pve-inspect-bench $(BENCHFLAGS)

# promtool comes with Debian's prometheus package (make deps).
PROMTOOL ?= promtool

lint:
	@out=$$(gofmt -l . ); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	$(PROMTOOL) check rules packaging/deb/alerts.yml
	$(PROMTOOL) test rules packaging/deb/alerts_test.yml packaging/deb/alerts_health_test.yml
	cd python && .venv/bin/ruff check && .venv/bin/ruff format --check && .venv/bin/mypy

# The .deb of pve-inspectd, in $(DIST)/ (nfpm.yaml reads DIST and VERSION).
deb: build
	mkdir -p $(DIST)
	$(BIN)/pve-inspectd manpage | gzip -9n > $(DIST)/pve-inspectd.8.gz
	$(BIN)/pve-inspectd completion bash > $(DIST)/completion.bash
	$(BIN)/pve-inspectd completion zsh > $(DIST)/completion.zsh
	packaging/deb/changelog.sh $(DEB_VERSION) | gzip -9n > $(DIST)/changelog.Debian.gz
	cp $(BIN)/pve-inspectd $(BIN)/pve-inspect-probe $(DIST)/
	DIST=$(DIST) VERSION=$(DEB_VERSION) $(GO) tool nfpm pkg --packager deb --config packaging/deb/nfpm.yaml --target $(DIST)/pve-inspectd_$(DEB_VERSION)_amd64.deb

clean:
	rm -rf $(BIN) dist
