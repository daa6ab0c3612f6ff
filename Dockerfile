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
# system, so the root file system can be read-only. CA certificates: the Kubernetes API is
# verified against the service account's (or kubeconfig's) CA and OTLP export uses the bundled
# webpki roots, but kube falls back to the system store for a kubeconfig without a CA, which the
# base's /etc/ssl/certs serves.
#
# Without Docker: `just image` (e2e/images/operator.sh) builds the same image as an OCI archive
# (target/images/operator.tar, localhost/multigres-operator:dev) for the real-node tests. It
# reads this file — the build stage's `cargo build -p` packages and `for handler in` list, and
# the final stage's LABEL, COPY destination, USER, EXPOSE and ENTRYPOINT/CMD — and refuses any
# other instruction in the final stage, so keep the final stage to those (or teach the script).
# The base below it makes from the host's files: the glibc/libgcc files the binaries load,
# CA certificates, nonroot (65532) in /etc/passwd and /etc/group, /tmp, and the base's config
# (PATH, SSL_CERT_FILE, WORKDIR /home/nonroot).

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
