# syntax=docker/dockerfile:1
# One small image, one binary under two names: qc-operator (the controller) and qc-worker (every worker pod), a
# symlink to it (qc-operator runs as the worker when started under that name; docs/image.md).
# Static musl binaries on an empty base: no shell, no package manager, nothing in it but our code and CA roots.
#
# Build arguments (docs/image.md; scripts/image passes them):
#   BUILD_IMAGE  the Rust toolchain image of the build stage (default: the official rust image below)
#   BINARIES     the stage the final image takes its files from: `build` (compile here, the default) or
#                `prebuilt` (bin/qc-operator, the bin/qc-worker symlink, passwd, group and CA roots already made, in
#                prebuilt/ of the context)
#   BASE_IMAGE   the final stage's base (default: scratch, which needs no registry)
#   VERSION, REVISION, SOURCE   OCI labels

ARG RUST_VERSION=1.95
ARG BUILD_IMAGE=rust:${RUST_VERSION}-slim-bookworm
ARG BASE_IMAGE=scratch
ARG BINARIES=build

FROM ${BUILD_IMAGE} AS build
# musl-tools: the C parts of the TLS stack (aws-lc-sys, ring) compile with musl-gcc.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# Native build for the platform being built: buildx runs one build per --platform.
RUN case "$(uname -m)" in \
      x86_64) echo x86_64-unknown-linux-musl ;; \
      aarch64) echo aarch64-unknown-linux-musl ;; \
      *) echo "unsupported architecture: $(uname -m)" >&2; exit 1 ;; \
    esac > /rust-target \
 && rustup target add "$(cat /rust-target)"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(cat /rust-target)" \
 && cargo build --release --locked --target "$target" --bin qc-operator \
 && mkdir -p /out/bin \
 && cp "target/$target/release/qc-operator" /out/bin/ \
 && ln -s qc-operator /out/bin/qc-worker \
 && cp /etc/ssl/certs/ca-certificates.crt /out/ca-certificates.crt \
 && echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /out/passwd \
 && echo 'nonroot:x:65532:' > /out/group

# The same files, made outside (scripts/image: a host build with the musl target). Only used with
# --build-arg BINARIES=prebuilt; builders skip the stage otherwise.
FROM scratch AS prebuilt
COPY prebuilt/ /out/

FROM ${BINARIES} AS binaries

FROM ${BASE_IMAGE}
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="queue-consumer-operator" \
      org.opencontainers.image.description="Kubernetes operator that runs Amazon SQS consumers: qc-operator and qc-worker" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binaries /out/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=binaries /out/passwd /etc/passwd
COPY --from=binaries /out/group /etc/group
# qc-operator and the qc-worker symlink to it (a directory's copy keeps the link).
COPY --from=binaries /out/bin/ /usr/local/bin/
# The TLS stack reads the system roots from here (there is no other trust store in the image).
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# uid/gid 65532 ("nonroot"), numeric so runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/qc-operator"]
