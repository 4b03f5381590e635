# The leafbus image: the dispenser (the entrypoint) and bench, as static binaries on an
# empty base. Build: docker build -t leafbus .   (docker-compose.yml builds it for you)

# Build stage: the Go release go.mod asks for, on Alpine. Module downloads are their own
# layer, so editing code does not download them again.
FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO off: a static binary that runs on scratch. -trimpath keeps build paths out of it.
ENV CGO_ENABLED=0
# The version and revision `dispenser version` prints, stamped as make release stamps its
# binaries: the build context holds no .git, so the toolchain cannot. make image passes
# them from git; left empty, the binaries say "(devel)".
ARG VERSION=""
ARG REVISION=""
ENV LDFLAGS="-s -w -X github.com/leafbus/leafbus/internal/buildinfo.linkVersion=${VERSION} -X github.com/leafbus/leafbus/internal/buildinfo.linkRevision=${REVISION}"
RUN go build -trimpath -ldflags="$LDFLAGS" -o /out/dispenser ./cmd/dispenser \
 && go build -trimpath -ldflags="$LDFLAGS" -o /out/bench ./cmd/bench \
 && mkdir -p /out/data

# Run stage: nothing but the binaries, the CA roots (a tls:// server with a public
# certificate then needs no --tls-ca) and a data directory the non-root user owns;
# a named volume mounted on /data starts with that ownership.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/dispenser /out/bench /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
WORKDIR /data
# The worker-ID cache file lives here (--data-dir); keep it across restarts.
ENV LEAFBUS_DATA_DIR=/data
VOLUME ["/data"]
ENTRYPOINT ["/usr/local/bin/dispenser"]
