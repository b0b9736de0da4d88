# slidegate — exact, distributed sliding-window rate limits for Kubernetes.
#
# Two commands set up everything on a fresh machine:
#   make demo   the main job: the whole flow on one machine, no cluster
#   make test   every test, with a real API server and real redis-server

# The release: the VERSION file. Binaries report it (--version,
# slidegate_build_info, the injection annotation), images are tagged with it,
# and `make dist` writes the install for it.
VERSION ?= $(shell cat VERSION)
LDFLAGS := -X github.com/slidegate/slidegate/internal/version.Version=$(VERSION)
# Image for the three binaries (manager, sidecar, rls): make image builds it
# (or the Dockerfile, with a container engine). The manifests name it in one
# place, config/manager/kustomization.yaml (newTag = VERSION, make verify).
IMAGE ?= ghcr.io/slidegate/slidegate
IMG ?= $(IMAGE):$(VERSION)
# The platforms of make image (this machine's; make dist: RELEASE_ARCHES).
ARCHES ?= $(shell go env GOARCH)
RELEASE_ARCHES = amd64 arm64
CONTAINER_TOOL ?= docker

SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

# One set of flags for every build that is not a race build (hack/goenv.sh
# says why: a package compiles once for all the tools that need it).
export CGO_ENABLED = 0
export GOFLAGS := $(filter-out -trimpath,$(GOFLAGS)) -trimpath

LOCALBIN ?= $(shell pwd)/bin
# controller-gen is a tool of go.mod: built with the project's dependencies.
CONTROLLER_GEN ?= go tool controller-gen
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate CRDs, RBAC and webhook manifests from the Go markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases
	@# The Helm chart's copies of what config/ holds (charts/slidegate/files).
	mkdir -p charts/slidegate/files/dashboards
	cp config/crd/bases/ratelimit.slidegate.dev_ratelimitpolicies.yaml charts/slidegate/files/crd.yaml
	cp config/rbac/role.yaml charts/slidegate/files/role.yaml
	cp config/components/monitoring/prometheusrule.yaml charts/slidegate/files/prometheusrule.yaml
	cp config/components/monitoring/dashboards/slidegate.json charts/slidegate/files/dashboards/slidegate.json

.PHONY: generate
generate: ## Generate DeepCopy code for the API types.
	@# Only api/ holds API types: loading ./... took 5x longer for the same output.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: docs
docs: manifests ## Generate the API reference (docs/api.md) from the CRD's field descriptions.
	go run ./hack/apidocs -crd config/crd/bases/ratelimit.slidegate.dev_ratelimitpolicies.yaml -out docs/api.md -append hack/apidocs/evolution.md

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint.
	"$(GOLANGCI_LINT)" run ./...

.PHONY: verify
verify: generate manifests docs ## Regenerate code, manifests and API docs; fail on any difference from what is committed.
	go mod tidy -diff
	@if [ -n "$$(git status --porcelain -- api config charts controllers internal cmd docs/api.md)" ]; then \
		echo "verify: generated files are out of date; run 'make generate manifests docs' and commit:"; \
		git status --porcelain -- api config charts controllers internal cmd docs/api.md; git diff --stat -- api config charts docs/api.md; exit 1; \
	fi
	kubectl kustomize config/default >/dev/null
	kubectl kustomize config/cert-manager >/dev/null
	kubectl kustomize config/monitoring >/dev/null
	kubectl kustomize config/samples >/dev/null
	kubectl kustomize config/rls >/dev/null
	kubectl kustomize config/rls-mtls >/dev/null
	kubectl kustomize config/istio-gateways >/dev/null
	kubectl kustomize config/envoy-gateways >/dev/null
	@# config/default installs the release in VERSION.
	@test "$$(sed -n 's/^ *newTag: *//p' config/manager/kustomization.yaml)" = "$(VERSION)" || \
		{ echo "verify: config/manager/kustomization.yaml's newTag is not VERSION ($(VERSION))"; exit 1; }
	@# make deploy's image must reach the manager and the sidecar it injects.
	@test "$$(hack/render-install.sh registry.test:5000/sg/slidegate | grep -c 'registry.test:5000/sg/slidegate:$(VERSION)$$')" = 2 || \
		{ echo "verify: hack/render-install.sh does not set both images"; exit 1; }

.PHONY: test-deps
test-deps: ## Install what the tests need: Debian's packages, the envtest control plane, tools.
	hack/packages.sh $(TEST_PACKAGES)
	hack/envtest.sh >/dev/null
	hack/tools.sh golangci-lint >/dev/null
	hack/tools.sh promtool >/dev/null

# Debian's packages for every test, installed with one apt-get update:
# redis-server for the limiter, containerd, runc, the CNI plugins and
# netfilter tools for the real node (hack/node.sh).
TEST_PACKAGES = redis-server redis-tools containerd runc containernetworking-plugins nftables iptables conntrack openssl

.PHONY: test
test: ## Run every test in phases, printing a timing table at the end (hack/test.sh): vet, verify, lint, go test -race against a real API server and redis-server, the alert rules, then the real node and the upgrade test.
	TEST_PACKAGES="$(TEST_PACKAGES)" hack/test.sh

.PHONY: test-packages
test-packages: ## Run go test -race on every package but the node's and the alerts' (needs make test-deps).
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" CGO_ENABLED=1 go test -race -vet=off -count=1 $$(go list ./... | grep -v -e /test/node -e /test/monitoring) 2>&1 | hack/test-summary.sh

.PHONY: test-alerts
test-alerts: ## Check the alert rules and run their unit tests with promtool; lint the Grafana dashboard (config/components/monitoring).
	PROMTOOL="$$(hack/tools.sh promtool)" go test -vet=off -count=1 -v ./test/monitoring 2>&1 | hack/test-summary.sh

.PHONY: test-stress
test-stress: test-deps ## Run the limiter, sidecar, RLS, e2e and node tests while stress-ng keeps every core busy (4 workers per core).
	@hack/packages.sh stress-ng
	@stress-ng --cpu $$((4 * $$(nproc))) --timeout 1800s >/dev/null 2>&1 & pid=$$!; trap 'kill $$pid 2>/dev/null' EXIT; \
		KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" CGO_ENABLED=1 go test -race -vet=off -count=1 ./internal/limiter ./internal/sidecar ./internal/rls ./test/e2e 2>&1 | hack/test-summary.sh && \
		hack/previous-modules.sh
	hack/tools.sh helm >/dev/null
	hack/node.sh run -- go test -count=1 -v -timeout 25m ./test/node 2>&1 | hack/test-summary.sh

.PHONY: test-exact-busy
test-exact-busy: test-deps ## Exactness on a busy machine: 3 sidecars x 64 callers, 10 s, healthy redis-server, every core busy, 10 runs: SlidingLog 100/2 s; token costs 1000/1 s (request, response, paired with counting) and debt's exact reopening.
	@hack/packages.sh stress-ng
	@stress-ng --cpu $$((4 * $$(nproc))) --timeout 3600s >/dev/null 2>&1 & pid=$$!; trap 'kill $$pid 2>/dev/null' EXIT; \
		SLIDEGATE_SLOW_CALLERS=64 SLIDEGATE_SLOW_SECONDS=10 go test -count=10 -v -timeout 60m -run '^(TestExactOnASlowRedis|TestCostExactAcrossSidecars|TestCostDebtRetryAfterIsExact)$$/^(healthy|request_cost|response_cost|requests_counted)$$' ./internal/sidecar 2>&1 | \
		grep -E '(slow|costexact)_test.go|^ *(--- |ok|FAIL)'

.PHONY: test-node
test-node: ## Run test/node on a real single node (kubelet, containerd, kube-proxy) brought up and torn down by hack/node.sh.
	hack/tools.sh helm >/dev/null
	hack/node.sh run -- go test -count=1 -v -timeout 25m ./test/node 2>&1 | hack/test-summary.sh

##@ Build

.PHONY: build
build: ## Build the manager, sidecar and rls binaries and the kubectl plugin (kubectl-slidegate) into bin/.
	go build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/manager ./cmd/sidecar ./cmd/rls ./cmd/kubectl-slidegate

.PHONY: run
run: manifests generate ## Run the manager against the cluster in ~/.kube/config.
	go run ./cmd/manager

.PHONY: image
image: ## Build the release image $(IMG) for linux/$(ARCHES) without a container engine (hack/image.sh): dist/images/ gets an OCI archive (kind load image-archive), an OCI layout (crane push) and the reference with the index's digest.
	IMAGE="$(IMAGE)" ARCHES="$(ARCHES)" hack/image.sh dist/images

.PHONY: docker-build
docker-build: ## Build the image with the three binaries, tagged with VERSION (needs a container engine).
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) -t $(IMG) .

.PHONY: dist
dist: ARCHES = $(RELEASE_ARCHES)
dist: image ## Write the release set into dist/ (hack/dist.sh): the image for linux/amd64 and linux/arm64, install.yaml with it pinned by tag and digest, the kubectl plugin for linux and darwin (amd64, arm64), its krew manifest, the release notes from CHANGELOG.md, checksums.
	hack/dist.sh dist

.PHONY: docker-push
docker-push: ## Push the image.
	$(CONTAINER_TOOL) push $(IMG)

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the cluster in ~/.kube/config.
	kubectl apply --server-side -k config/crd

.PHONY: uninstall
uninstall: manifests ## Remove the CRDs (and every RateLimitPolicy with them).
	kubectl delete --ignore-not-found -k config/crd

.PHONY: deploy
deploy: manifests ## Deploy the operator with image $(IMG) to the cluster in ~/.kube/config.
	hack/render-install.sh "$(IMG)" | kubectl apply --server-side -f -

.PHONY: undeploy
undeploy: ## Remove the operator from the cluster.
	hack/render-install.sh "$(IMG)" | kubectl delete --ignore-not-found -f -

##@ Main job and reports

# demo builds with go install into bin/, not go build -o: it links only the
# binaries whose packages changed, so a warm demo links nothing. No DWARF or
# symbol table (-s -w; panics still print their stacks): the three links of a
# fresh clone took 8.0 s with them and 5.8 s without (warm build cache).
.PHONY: demo
demo: ## Run the whole flow on this machine: control plane, Redis, manager, sidecar, traffic.
	@hack/redis.sh
	@echo "==> building slidegate's manager, sidecar and the demo (the first time: downloading modules and compiling about 1,200 packages, about 5 min on 2 cores, with progress; then the control plane, about 6 min more)"
	@GOBIN="$(LOCALBIN)" hack/progress.sh "demo: building slidegate" "@go list -deps ./cmd/manager ./cmd/sidecar ./hack/demo | wc -l" \
		go install -v -ldflags "$(LDFLAGS) -s -w" ./cmd/manager ./cmd/sidecar ./hack/demo
	@echo "==> the envtest control plane (kube-apiserver, etcd): hack/envtest.sh"
	@assets=$$(hack/envtest.sh) && KUBEBUILDER_ASSETS="$$assets" bin/demo -manager bin/manager -sidecar bin/sidecar

.PHONY: bench
bench: ## Run the limiter, sidecar, operator and RLS benchmarks side by side and write docs/benchmarks.md.
	hack/redis.sh
	mkdir -p docs/bench
	go run ./test/bench/limiter -out docs/bench/limiter.md
	go run ./test/bench/sidecar -out docs/bench/sidecar.md
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" go run ./test/bench/operator -out docs/bench/operator.md
	@command -v h2load >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nghttp2-client; }
	go run ./test/bench/rls -out docs/bench/rls.md
	go run ./test/bench/report -limiter docs/bench/limiter.md -sidecar docs/bench/sidecar.md -operator docs/bench/operator.md -rls docs/bench/rls.md -out docs/benchmarks.md

##@ Tools

.PHONY: golangci-lint
golangci-lint: ## Install golangci-lint into bin/ (cached outside the checkout).
	@hack/tools.sh golangci-lint >/dev/null
