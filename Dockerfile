# One image, three binaries: /manager (controller and webhook), /sidecar
# (the enforcement proxy the webhook injects) and /rls (Envoy's rate limit
# service, the opt-in config/components/rls). Not built on the development
# machines (no container engine there); reviewed by reading.

FROM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH
WORKDIR /workspace

# Dependencies first, so source edits reuse this layer.
COPY go.mod go.sum ./
RUN go mod download

COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/

# Static binaries (CGO off) for distroless/static; -trimpath keeps build paths
# out of the binaries.
# VERSION is the release the binaries report (make docker-build passes the
# VERSION file's).
ARG VERSION=devel
ENV CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH}
RUN ldflags="-s -w -X github.com/slidegate/slidegate/internal/version.Version=${VERSION}" && \
    go build -trimpath -ldflags="$ldflags" -o /out/manager ./cmd/manager && \
    go build -trimpath -ldflags="$ldflags" -o /out/sidecar ./cmd/sidecar && \
    go build -trimpath -ldflags="$ldflags" -o /out/rls ./cmd/rls

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /out/manager /manager
COPY --from=builder /out/sidecar /sidecar
COPY --from=builder /out/rls /rls
USER 65532:65532
ENTRYPOINT ["/manager"]
