# syntax=docker/dockerfile:1
# One small image with both binaries: qc-operator (the controller) and qc-worker (every worker pod).
# Static musl binaries on an empty base: no shell, no package manager, nothing in it but our code and CA roots.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
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
 && cargo build --release --locked --target "$target" --bin qc-operator --bin qc-worker \
 && mkdir -p /out \
 && cp "target/$target/release/qc-operator" "target/$target/release/qc-worker" /out/ \
 && echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /out/passwd \
 && echo 'nonroot:x:65532:' > /out/group

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /etc/passwd
COPY --from=build /out/group /etc/group
COPY --from=build /out/qc-operator /usr/local/bin/qc-operator
COPY --from=build /out/qc-worker /usr/local/bin/qc-worker
# The TLS stack reads the system roots from here (there is no other trust store in the image).
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# uid/gid 65532 ("nonroot"), numeric so runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/qc-operator"]
