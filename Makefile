# slidegate — exact, distributed sliding-window rate limits for Kubernetes.
#
# Two commands set up everything on a fresh machine:
#   make demo   the main job: the whole flow on one machine, no cluster
#   make test   every test, with a real API server and real redis-server

# Image for both binaries (manager and sidecar), see Dockerfile.
IMG ?= ghcr.io/slidegate/slidegate:latest
CONTAINER_TOOL ?= docker

SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

LOCALBIN ?= $(shell pwd)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate CRDs, RBAC and webhook manifests from the Go markers.
	"$(CONTROLLER_GEN)" rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: controller-gen ## Generate DeepCopy code for the API types.
	"$(CONTROLLER_GEN)" object:headerFile="hack/boilerplate.go.txt" paths="./..."

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
verify: generate manifests ## Regenerate code and manifests; fail on any difference from what is committed.
	go mod tidy -diff
	@if [ -n "$$(git status --porcelain -- api config controllers internal cmd)" ]; then \
		echo "verify: generated files are out of date; run 'make generate manifests' and commit:"; \
		git status --porcelain -- api config controllers internal cmd; git diff --stat -- api config; exit 1; \
	fi
	kubectl kustomize config/default >/dev/null

.PHONY: test-deps
test-deps: ## Install what the tests need: redis-server, the envtest control plane, tools.
	hack/redis.sh
	hack/envtest.sh >/dev/null
	hack/tools.sh controller-gen >/dev/null
	hack/tools.sh golangci-lint >/dev/null

.PHONY: test
test: test-deps vet verify lint ## Run every test (race detector on) against a real API server and redis-server.
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" go test -race -count=1 ./... 2>&1 | tee /dev/stderr | hack/test-summary.sh

##@ Build

.PHONY: build
build: ## Build the manager and sidecar binaries into bin/.
	go build -trimpath -o bin/manager ./cmd/manager
	go build -trimpath -o bin/sidecar ./cmd/sidecar

.PHONY: run
run: manifests generate ## Run the manager against the cluster in ~/.kube/config.
	go run ./cmd/manager

.PHONY: docker-build
docker-build: ## Build the image with both binaries (needs a container engine).
	$(CONTAINER_TOOL) build -t $(IMG) .

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

.PHONY: demo
demo: ## Run the whole flow on this machine: control plane, Redis, manager, sidecar, traffic.
	@echo "make demo: not built yet. It needs the limiter, controller, sidecar and injector (issues 3-6) and the demo itself (issue 7)." >&2
	@exit 1

.PHONY: bench
bench: ## Run the benchmarks and write docs/benchmarks.md.
	@echo "make bench: not built yet. The limiter and sidecar benchmarks come with issues 3 and 5, the report with issue 7." >&2
	@exit 1

##@ Tools

.PHONY: controller-gen
controller-gen: ## Install controller-gen into bin/ (cached outside the checkout).
	@hack/tools.sh controller-gen >/dev/null

.PHONY: golangci-lint
golangci-lint: ## Install golangci-lint into bin/ (cached outside the checkout).
	@hack/tools.sh golangci-lint >/dev/null
