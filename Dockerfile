# syntax=docker/dockerfile:1
# The operator image: one static binary, run as non-root, on distroless/static.
# The same image is the controller (`sandboxrun-operator run`) AND the holder container of every
# SandboxRun pod: the pod builder runs `/usr/local/bin/sandboxrun-operator holder …` and the drain
# execs `/usr/local/bin/sandboxrun-operator pack <path>` by that absolute path (`run
# --holder-binary`'s default; never a PATH lookup, so no file a workload writes can stand in).
#
#   docker build -t ghcr.io/iterion/sandboxrun-operator:dev .

ARG RUST_VERSION=1.95
ARG TARGET=x86_64-unknown-linux-musl

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
ARG TARGET
# musl-tools: a C compiler for the musl target (ring, zstd-sys and aws-lc-sys compile C).
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add "${TARGET}"
ENV CC_x86_64_unknown_linux_musl=musl-gcc \
    CARGO_TERM_COLOR=never
WORKDIR /src
# The whole crate (see .dockerignore): Cargo.toml may declare bench/test targets whose files must
# exist for cargo to load the manifest at all. Dependencies are cached by BuildKit cache mounts
# rather than a stub-crate layer, which would break on every new declared target. build.rs links
# the binary in link/hot-symbols.txt's order with the toolchain's rust-lld (hack/code-order.sh).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release --target "${TARGET}" --bin sandboxrun-operator \
 && cp "target/${TARGET}/release/sandboxrun-operator" /sandboxrun-operator
# Fail the build if the binary is not static: distroless/static has no libc to load it.
RUN if ldd /sandboxrun-operator 2>/dev/null | grep -q '=>'; then echo "not a static binary" >&2; exit 1; fi

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=builder /sandboxrun-operator /usr/local/bin/sandboxrun-operator
# 65532 = distroless "nonroot". The chart and config/manager also set runAsUser 65532; the holder
# container runs as the workload's uid instead (the pod builder sets it), which is fine: the
# binary is world-executable and needs nothing else from the image.
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["sandboxrun-operator"]
CMD ["run"]
