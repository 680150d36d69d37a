# kafka-census: one image for every mode of the Helm chart (capture as a DaemonSet or a broker
# sidecar, the proxy) and for one-off use (replay, api-table).
#
#   docker build -t kafka-census:0.1.0 .          # the image the chart defaults to (values.yaml)
#   docker run --rm kafka-census:0.1.0 api-table --removed-only
#   docker run --rm --network host kafka-census:0.1.0 \
#       capture -i any --listener PLAINTEXT=9092 --http 127.0.0.1:9595      # fails: no NET_RAW, see below
#   docker run --rm --network host --entrypoint kafka-census-netraw kafka-census:0.1.0 \
#       capture -i any --listener PLAINTEXT=9092 --http 127.0.0.1:9595      # works as UID 10001
#
# Capabilities. Live capture opens an AF_PACKET socket, which needs CAP_NET_RAW; everything
# else (proxy, replay, serving) needs no capability at all. The image runs as UID 10001, and a
# non-root process gets no capability from the container runtime: Kubernetes adds
# `capabilities.add` only to the bounding set, and has no API for ambient capabilities
# (kubernetes/kubernetes#56374, KEP PR kubernetes/enhancements#2757; containerd#5668 was
# closed). So the capability has to come from the file being executed:
#   - /opt/kafka-census/bin/python-netraw is a copy of the interpreter carrying the file
#     capability cap_net_raw=ep, and /opt/kafka-census/bin/kafka-census-netraw is the same CLI
#     as `kafka-census` run by that interpreter. The chart's capture modes (daemonset, sidecar)
#     run it, with `capabilities: {drop: [ALL], add: [NET_RAW]}` (NET_RAW must be in the
#     bounding set, or the kernel refuses to execute a binary whose capability it cannot grant:
#     "operation not permitted" at start) and `allowPrivilegeEscalation: true` (no_new_privs
#     would silently ignore the file capability; the escalation it allows is bounded by that
#     bounding set: NET_RAW and nothing else).
#   - The ENTRYPOINT `kafka-census` runs on the plain interpreter: the proxy mode runs it with
#     every capability dropped and allowPrivilegeEscalation: false (Pod Security "restricted").
# Only this one copy of the interpreter is capable; /usr/local/bin/python3.11 is not.

# Pinned by tag and by the digest of its multi-architecture index (linux/amd64 and arm64).
FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# pyproject.toml pins every runtime dependency; all of them ship manylinux wheels (pcapy-ng's
# bundles libpcap), so no compiler and no libpcap-dev are needed.
COPY pyproject.toml README.md ./
COPY capture/ capture/
COPY exporter/ exporter/
COPY pipeline/ pipeline/
RUN python -m venv /opt/kafka-census \
 && /opt/kafka-census/bin/pip install /src \
 && /opt/kafka-census/bin/pip uninstall --yes pip setuptools \
 && /opt/kafka-census/bin/kafka-census --version

FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
LABEL org.opencontainers.image.title="kafka-census" \
      org.opencontainers.image.description="Who is connected to a Kafka cluster, with which client software, and what breaks on upgrade" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kafka-census/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/kafka-census /opt/kafka-census
# The capability is set here, in the final stage, because COPY --from does not carry the
# security.capability xattr on every builder (moby/buildkit#2250, kaniko#2866). The one-liner
# writes exactly what `setcap cap_net_raw=ep FILE` writes (struct vfs_cap_data, linux/capability.h:
# VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, permitted = 1 << CAP_NET_RAW (13)), so the
# runtime image needs no libcap2-bin.
# Last, because a later write or chown of the file would clear the capability.
RUN cp "$(readlink -f /opt/kafka-census/bin/python)" /opt/kafka-census/bin/python-netraw \
 && printf '#!/opt/kafka-census/bin/python-netraw\nimport sys\nfrom exporter.cli import main\nsys.exit(main())\n' \
      > /opt/kafka-census/bin/kafka-census-netraw \
 && chmod 0755 /opt/kafka-census/bin/python-netraw /opt/kafka-census/bin/kafka-census-netraw \
 && kafka-census --version \
 && python3 -c 'import os, struct, sys; os.setxattr(sys.argv[1], "security.capability", struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0))' /opt/kafka-census/bin/python-netraw
# Numeric, so that Kubernetes' runAsNonRoot can verify it without a passwd entry.
USER 10001:10001
# /metrics, /healthz, /readyz and the REST API (the chart's http.port).
EXPOSE 9595
ENTRYPOINT ["kafka-census"]
CMD ["--help"]
