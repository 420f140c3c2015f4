# syntax=docker/dockerfile:1
# quiver-broker image. Build from the repository root:
#   docker build -f docker/quiver-broker.Dockerfile -t ghcr.io/quiver-mq/quiver-broker:0.1.0 .

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir across builds; the binary is copied out of the
# cached target dir because it is not part of the image layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p quiver-broker --bin quiver-broker \
    && install -D -m 0755 target/release/quiver-broker /out/quiver-broker \
    && install -d -m 0750 /out/data

# distroless/cc has glibc and libgcc (what a Rust binary links) and nothing else: no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="quiver-broker" \
      org.opencontainers.image.description="RocketMQ-4.x-compatible persistent message broker" \
      org.opencontainers.image.source="https://github.com/quiver-mq/quiver" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/quiver-broker /usr/local/bin/quiver-broker
# The store directory exists and belongs to the runtime user even without a mounted volume.
COPY --from=builder --chown=65532:65532 /out/data /var/lib/quiver
# Numeric so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
# Remoting (4.x clients, name server), gRPC (5.x clients, on by default), HTTP.
EXPOSE 10911 8081 8080
VOLUME ["/var/lib/quiver"]
ENTRYPOINT ["/usr/local/bin/quiver-broker"]
CMD ["--data-dir", "/var/lib/quiver", "--listen", "0.0.0.0:10911", "--http-listen", "0.0.0.0:8080"]
