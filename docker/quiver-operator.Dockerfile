# syntax=docker/dockerfile:1
# quiver-operator image. Build from the repository root:
#   docker build -f docker/quiver-operator.Dockerfile -t ghcr.io/quiver-mq/quiver-operator:0.1.0 .

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir across builds; the binary is copied out of the
# cached target dir because it is not part of the image layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p quiver-operator --bin quiver-operator \
    && install -D -m 0755 target/release/quiver-operator /out/quiver-operator

# distroless/cc has glibc and libgcc (what a Rust binary links) and nothing else: no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="quiver-operator" \
      org.opencontainers.image.description="Kubernetes operator for Quiver brokers and consumer groups" \
      org.opencontainers.image.source="https://github.com/quiver-mq/quiver" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/quiver-operator /usr/local/bin/quiver-operator
# Numeric so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/quiver-operator"]
CMD ["--http-listen", "0.0.0.0:8080"]
