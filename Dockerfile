# kafka-census: one image for every mode of the Helm chart (capture as a DaemonSet or a broker
# sidecar, the proxy) and for one-off use (replay, api-table).
#
#   docker build -t kafka-census:0.1.0 .          # the image the chart defaults to (values.yaml)
#   docker run --rm kafka-census:0.1.0 api-table --removed-only
#   docker run --rm --network host --cap-drop ALL --cap-add NET_RAW --security-opt no-new-privileges \
#       --entrypoint kafka-census-capture kafka-census:0.1.0 \
#       capture -i any --listener PLAINTEXT=9092 --http 127.0.0.1:9595      # live capture, as UID 10001
#
# Needs BuildKit (Docker 23 or later, buildah 1.33 or later): the launcher's source is a heredoc.
#
# Capabilities. Live capture opens an AF_PACKET socket, which needs CAP_NET_RAW; everything
# else (proxy, replay, serving) needs no capability at all. The image runs as UID 10001, and a
# non-root process keeps no capability across exec: Kubernetes adds `capabilities.add` to the
# bounding, permitted and effective sets of the container's first process (containerd, CRI-O),
# but sets no ambient capabilities (kubernetes/kubernetes#56374), so the exec of a program
# without file capabilities clears them. The capability therefore comes from one file:
#   - /opt/kafka-census/bin/kafka-census-capture, a small C launcher (source below), is the only
#     file in the image with a file capability: cap_net_raw=p. Under no_new_privs
#     (`allowPrivilegeEscalation: false`) the kernel still grants a file capability that the
#     process already holds in its permitted set, which `capabilities.add: [NET_RAW]` gives it;
#     without NET_RAW there the launcher gets nothing.
#   - The launcher raises CAP_NET_RAW into the ambient set and executes the venv's interpreter,
#     isolated (-I), on a fixed program: `kafka-census capture ARGS` and nothing else, with an
#     environment of KAFKA_CENSUS_* settings only (an exec that keeps ambient capabilities is not
#     a secure exec: the dynamic loader would honour LD_PRELOAD).
#   - The interpreter carries no capability: run by anything else in the image, it has none. The
#     ENTRYPOINT `kafka-census` runs on it with every capability dropped (the proxy's mode).
#   - No file in the image is setuid or setgid (the base image's su, mount, passwd... are
#     stripped), and the build fails if any other file carries a capability.

# Pinned by tag and by the digest of its multi-architecture index (linux/amd64 and arm64).
FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
# The compiled hot path (setup.py: Cython, pinned in pyproject.toml's build requirements) needs a
# C compiler here; the runtime image gets the built venv only. Every runtime dependency ships a
# manylinux wheel (pcapy-ng's bundles libpcap), so no libpcap-dev.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY capture/ capture/
COPY exporter/ exporter/
COPY pipeline/ pipeline/
# The build fails unless every hot-path module runs compiled.
RUN python -m venv /opt/kafka-census \
 && /opt/kafka-census/bin/pip install /src \
 && /opt/kafka-census/bin/pip uninstall --yes pip setuptools \
 && cd / && /opt/kafka-census/bin/python -c "import capture, sys; sys.exit(capture.hot_path() != 'compiled' and f'hot path: {capture.native_modules()}')" \
 && /opt/kafka-census/bin/kafka-census --version

# The capture launcher, compiled apart so that the runtime image has no compiler. Same base
# image, so the same glibc. tests/deploy/test_image.py compiles this very source with the same flags.
FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS launcher
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY <<"EOF" /src/kafka-census-capture.c
/*
 * kafka-census-capture: runs `kafka-census capture ARGS...` with CAP_NET_RAW, and nothing else.
 *
 * The image's only file with a capability (cap_net_raw=p, see the Dockerfile). It keeps
 * CAP_NET_RAW alone in its permitted and inheritable sets, raises it into the ambient set (which
 * an exec of a file without capabilities keeps) and executes the interpreter isolated (-I: no
 * PYTHON* variables, no user site, no script or current directory on sys.path) on a fixed
 * program, with an environment of KAFKA_CENSUS_* settings and nothing else: an exec that keeps
 * ambient capabilities is not a secure exec, so the dynamic loader would honour LD_PRELOAD.
 * Without CAP_NET_RAW to pass on (not in the container's `capabilities.add`, or the file lost
 * its capability) it says so and runs the capture anyway, which then fails with its own error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef KC_PYTHON /* the tests build it against their own interpreter */
#define KC_PYTHON "/opt/kafka-census/bin/python"
#endif
#define KC_PROGRAM "import sys; from exporter.cli.main import main; sys.exit(main(sys.argv[1:]))"
#define KC_SETTINGS "KAFKA_CENSUS_"

extern char **environ;

static int pass_on_net_raw(void)
{
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    const int at = CAP_TO_INDEX(CAP_NET_RAW);
    const __u32 bit = CAP_TO_MASK(CAP_NET_RAW);

    if (syscall(SYS_capget, &head, data) != 0)
        return -1;
    if (!(data[at].permitted & bit)) {
        errno = EPERM;
        return -1;
    }
    memset(data, 0, sizeof data); /* NET_RAW alone: permitted and inheritable, none effective */
    data[at].permitted = data[at].inheritable = bit;
    if (syscall(SYS_capset, &head, data) != 0)
        return -1;
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
        return -1;
    return prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_RAW, 0, 0);
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "capture") != 0) {
        fputs("kafka-census-capture: runs `kafka-census capture [OPTIONS]` only; "
              "for anything else run kafka-census\n", stderr);
        return 2;
    }
    if (pass_on_net_raw() != 0)
        fprintf(stderr, "warning: kafka-census-capture: no CAP_NET_RAW to pass on (%s): the container "
                "needs `capabilities: {add: [NET_RAW]}` and this file its capability cap_net_raw=p\n",
                strerror(errno));

    size_t count = 0;
    for (char **e = environ; e && *e; e++)
        count++;
    char **env = calloc(count + 3, sizeof *env);
    char **args = calloc((size_t)argc + 6, sizeof *args);
    if (!env || !args) {
        fputs("kafka-census-capture: out of memory\n", stderr);
        return 1;
    }
    size_t n = 0;
    env[n++] = "PATH=/opt/kafka-census/bin:/usr/local/bin:/usr/bin:/bin";
    env[n++] = "LANG=C.UTF-8";
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, KC_SETTINGS, strlen(KC_SETTINGS)) == 0)
            env[n++] = *e;
    env[n] = NULL;

    int a = 0;
    args[a++] = KC_PYTHON;
    args[a++] = "-I"; /* isolated */
    args[a++] = "-B"; /* no bytecode files (read-only root) */
    args[a++] = "-u"; /* unbuffered, as PYTHONUNBUFFERED, which -I ignores */
    args[a++] = "-c";
    args[a++] = KC_PROGRAM;
    for (int i = 1; i < argc; i++) /* after -c: the program's arguments, never the interpreter's */
        args[a++] = argv[i];
    args[a] = NULL;
    execve(KC_PYTHON, args, env);
    fprintf(stderr, "kafka-census-capture: cannot execute %s: %s\n", KC_PYTHON, strerror(errno));
    return 127;
}
EOF
RUN gcc -std=c11 -O2 -Wall -Wextra -Werror -fstack-protector-strong -D_FORTIFY_SOURCE=2 -fPIE -pie -Wl,-z,relro,-z,now -o /kafka-census-capture /src/kafka-census-capture.c

FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
LABEL org.opencontainers.image.title="kafka-census" \
      org.opencontainers.image.description="Who is connected to a Kafka cluster, with which client software, and what breaks on upgrade" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kafka-census/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/kafka-census /opt/kafka-census
COPY --from=launcher /kafka-census-capture /opt/kafka-census/bin/kafka-census-capture
# No setuid or setgid file (the base image's su, mount, passwd, chage...): nothing in the image
# gains privileges on exec but the launcher.
RUN find / -xdev -perm /6000 -type f -exec chmod a-s {} + \
 && test -z "$(find / -xdev -perm /6000 -type f)" \
 && chmod 0755 /opt/kafka-census/bin/kafka-census-capture \
 && kafka-census --version
# The capability is set here, in the final stage, because COPY --from does not carry the
# security.capability xattr on every builder (moby/buildkit#2250, kaniko#2866), and last,
# because a later write or chown of the file would clear it. The script writes what
# `setcap cap_net_raw=p FILE` writes (so the runtime image needs no libcap2-bin), then fails the
# build if any other file of the image carries a capability.
RUN python3 - / /opt/kafka-census/bin/kafka-census-capture <<"EOF"
import os
import struct
import sys

root, launcher = sys.argv[1], sys.argv[2]
# struct vfs_cap_data (linux/capability.h): VFS_CAP_REVISION_2 without VFS_CAP_FLAGS_EFFECTIVE
# (the launcher raises what it needs), permitted = 1 << CAP_NET_RAW (13), inheritable = 0.
os.setxattr(launcher, "security.capability", struct.pack("<5I", 0x02000000, 1 << 13, 0, 0, 0))
capable = []
for directory, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(directory, d))]  # as find -xdev
    for name in files:
        path = os.path.join(directory, name)
        if not os.path.islink(path) and "security.capability" in os.listxattr(path):
            capable.append(path)
if capable != [launcher]:
    sys.exit(f"files with a capability: {capable}; expected only {launcher}")
EOF
# Numeric, so that Kubernetes' runAsNonRoot can verify it without a passwd entry.
USER 10001:10001
# /metrics, /healthz, /readyz and the REST API (the chart's http.port).
EXPOSE 9595
ENTRYPOINT ["kafka-census"]
CMD ["--help"]
