# syntax=docker/dockerfile:1.7
#
# One image with the four handler binaries in /usr/local/bin; each Deployment of the Helm chart
# runs its own (`command: [/usr/local/bin/<handler>]`).
#
#   docker build -t <registry>/multigres-operator:<tag> .
#
# Build: the workspace needs protoc with the well-known types (etcd-client and our protos are
# compiled at build time). Cargo's registry and target directory are BuildKit cache mounts, so a
# rebuild after a source change recompiles only the workspace crates.
#
# Run: distroless (glibc and libgcc only: TLS is rustls with ring, no OpenSSL), no shell, as the
# unprivileged user 65532 the chart's securityContext expects; nothing is written to the file
# system, so the root file system can be read-only.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
      -p cluster-handler -p resource-handler -p data-handler -p webhook-server \
 && mkdir -p /out \
 && for handler in cluster-handler resource-handler data-handler webhook-server; do \
      cp "target/release/$handler" /out/; \
    done

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="multigres-operator" \
      org.opencontainers.image.description="Kubernetes operator for Multigres: cluster-handler, resource-handler, data-handler and webhook-server" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
# Health (gRPC) and metrics ports of the four handlers, and the admission HTTPS port.
EXPOSE 9441 9442 9443 9444 8081 8082 8083 8084 8443
ENTRYPOINT ["/usr/local/bin/cluster-handler"]
