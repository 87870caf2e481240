# The origin's container image. It builds offline: nothing is pulled. `make
# image` first builds the static binary (bin/sluice, CGO_ENABLED=0: modernc's
# SQLite needs no cgo) and stages build/image/ (passwd and group naming the
# non-root user, the build machine's CA bundle, an empty /data and /tmp),
# then buildah copies both into an empty image:
#
#   make image                      # buildah, docker format (for HEALTHCHECK)
#   scripts/image-check sluice:latest
#
# HEALTHCHECK exists only in the docker image format; in OCI format buildah
# and podman drop it, so build with --format docker.
FROM scratch

ARG VERSION=dev
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="sluice origin: webhook delivery that keeps every subscriber's rate" \
      org.opencontainers.image.version="${VERSION}"

# Root-owned: /etc (passwd, group, CA bundle) and /tmp (mode 1777, for
# SQLite's temporary files).
COPY build/image/rootfs/ /
# The user's own: the volume's mount point, so a fresh named volume is
# writable by it.
COPY --chown=65532:65532 build/image/data/ /data/
COPY bin/sluice /sluice

USER 65532:65532
# From /, serve's default --db (./data/sluice.db) is in the volume too.
WORKDIR /
VOLUME /data
EXPOSE 8080

# No shell or curl in the image: the binary checks itself. `sluice health`
# GETs <url>/healthz (200 when the database answers) and exits 0; any other
# exit is unhealthy. It assumes the default port below: change both together.
HEALTHCHECK --interval=30s --timeout=10s --start-period=10s --retries=3 \
  CMD ["/sluice", "health", "--url", "http://127.0.0.1:8080"]

ENTRYPOINT ["/sluice", "serve"]
CMD ["--addr", "0.0.0.0:8080", "--db", "/data/sluice.db"]
