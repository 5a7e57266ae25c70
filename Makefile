# pve-inspect build, test, demo, bench and lint.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
BIN     := bin

.PHONY: all build test demo bench lint deps deb clean

all: build

deps:
	@.ci/install-deps

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# Runs every test, including the root and test-bed ones (needs root).
test: deps build
	$(GO) test -count=1 -timeout 75m ./...

# Brings the node in a box up, runs the containment check, tears it down.
demo: deps build
	$(BIN)/pve-inspect-demo

bench: deps build
	$(GO) run ./testvm/cmd/pve-inspect-bench

lint:
	@out=$$(gofmt -l . ); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

clean:
	rm -rf $(BIN)
