# shellcheck shell=bash
# Sourced by the hack/ scripts; the Makefile sets the same. One set of flags
# for every build that is not a race build: slidegate's binaries and images,
# the Kubernetes binaries (hack/k8s.sh), vet, golangci-lint, controller-gen.
# Go's build cache keys a compiled package by its flags, so with one set a
# package both need (k8s.io/api, client-go, grpc...) compiles once, not once
# per tool. Static (no cgo) and -trimpath are what the images need anyway.
# `go test -race` needs cgo and sets CGO_ENABLED=1 itself.
export CGO_ENABLED=0
case " ${GOFLAGS:-} " in
*" -trimpath "*) ;;
*) export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath" ;;
esac
