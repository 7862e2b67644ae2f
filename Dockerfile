# syntax=docker/dockerfile:1
#
# Parley on the CPU. Two images from this file:
#
#   docker build -t parley:cpu .                       # default (last stage): cgo, OpenBLAS and
#                                                      # the C kernels; backends cpu and go
#   docker build --target static -t parley:static .    # -tags nocgo, one static binary on
#                                                      # distroless; backend go
#
#   docker run -p 8080:8080 -v "$PWD/models:/models" parley:cpu
#   docker run -p 8080:8080 -e PARLEY_MODEL=hf://owner/repo/file.gguf parley:cpu
#
# The server loads /models/model.gguf unless PARLEY_MODEL names other files (hf:// names are
# downloaded into PARLEY_CACHE, /models/cache). Both images run as uid 10001, as Dockerfile.cuda's
# does, so that one model cache volume serves all three.

# GO_VERSION of the Go toolchain image.
ARG GO_VERSION=1.26
# The default image's OpenBLAS is the one the build links against: one Debian release for both.

# DEBIAN_VERSION of the Go image and of the default image's base.
ARG DEBIAN_VERSION=bookworm

# build compiles the default binary: cgo, linked against Debian's OpenBLAS.
FROM golang:${GO_VERSION}-${DEBIAN_VERSION} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libopenblas-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ENV CGO_ENABLED=1
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/parley ./cmd/parley \
 && mkdir -p /out/models/cache

# build-static compiles the pure-Go binary: no cgo, statically linked.
FROM golang:${GO_VERSION}-${DEBIAN_VERSION} AS build-static
WORKDIR /src
COPY . .
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -tags nocgo -trimpath -ldflags="-s -w" -o /out/parley ./cmd/parley \
 && mkdir -p /out/models/cache

# No HEALTHCHECK in the static image: nothing in it could run one (Kubernetes probes /health itself).

# static is the pure-Go image: the binary, CA certificates (hf:// downloads) and tzdata, no shell.
FROM gcr.io/distroless/static-debian12:nonroot AS static
COPY --from=build-static /out/parley /usr/local/bin/parley
COPY --from=build-static --chown=10001:10001 /out/models /models
ENV PARLEY_HOST=0.0.0.0 \
    PARLEY_PORT=8080 \
    PARLEY_MODEL=/models/model.gguf \
    PARLEY_CACHE=/models/cache
USER 10001:10001
WORKDIR /models
VOLUME ["/models"]
EXPOSE 8080/tcp
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/parley"]
CMD ["serve"]

# The default image's HEALTHCHECK (for docker and compose; Kubernetes ignores it and probes /health
# itself) asks /health with bash alone, so the image carries no HTTP client.

# runtime is the default image: Debian's OpenBLAS (the pthread build), CA certificates, the binary.
FROM debian:${DEBIAN_VERSION}-slim AS runtime
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libopenblas0-pthread ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/parley parley
COPY --from=build /out/parley /usr/local/bin/parley
COPY --from=build --chown=10001:10001 /out/models /models
ENV PARLEY_HOST=0.0.0.0 \
    PARLEY_PORT=8080 \
    PARLEY_MODEL=/models/model.gguf \
    PARLEY_CACHE=/models/cache
USER 10001:10001
WORKDIR /home/parley
VOLUME ["/models"]
EXPOSE 8080/tcp
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${PARLEY_PORT:-8080} && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && read -r _ code _ <&3 && [ \"$code\" = 200 ]"]
ENTRYPOINT ["/usr/local/bin/parley"]
CMD ["serve"]
