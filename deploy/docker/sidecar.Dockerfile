# gpu-monitoring node sidecar (`gpu-monitoring sidecar`), deployed by the
# deploy/helm/gpu-monitoring-sidecar chart or run by hand with the NVIDIA container runtime.
#
# Build from the repository root (the build context must be the repository root):
#
#   docker build -f deploy/docker/sidecar.Dockerfile \
#       -t registry.example.com/gpu-monitoring-sidecar:0.2.0 .
#
# Try it without a GPU:
#
#   docker run -d --name gpu-sidecar registry.example.com/gpu-monitoring-sidecar:0.2.0 --simulate dgx-h100
#   docker exec gpu-sidecar gpu-monitoring healthz --socket /var/run/gpu-monitoring/sidecar.sock
#
# libnvidia-ml is not in the image: the NVIDIA container runtime mounts the host driver's copy.
#
# The kernel's log (--kernel-log auto: /dev/kmsg) needs the host's device in the container and,
# where kernel.dmesg_restrict is 1 (Ubuntu 22.04 and later, RHEL), CAP_SYSLOG, which the image's
# user (10001) cannot hold: a container's added capabilities reach uid 0 only. By hand:
#
#   docker run --user 0 --cap-drop ALL --cap-add SYSLOG --device /dev/kmsg:/dev/kmsg:r ...
#
# or pass --kernel-log none. The chart runs the sidecar as uid 0 and adds SYSLOG itself.

# --- builder: the wheel, from the sources only (no local venv or build output gets in) ---
FROM python:3.12-slim AS builder
WORKDIR /src
COPY setup.py pyproject.toml README.md ./
COPY gpu_monitoring ./gpu_monitoring
COPY datadog_checks ./datadog_checks
RUN python -m pip wheel --no-cache-dir --no-deps -w /dist .

# --- runtime ---
FROM python:3.12-slim
ARG VERSION=0.2.0
LABEL org.opencontainers.image.title="gpu-monitoring-sidecar" \
      org.opencontainers.image.description="Node sidecar for the gpu_monitoring Datadog Agent check: owns NVML, journals GPU events, serves snapshots on a unix socket" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="BSD-3-Clause"

ENV PATH=/opt/gpu-monitoring/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=utility

COPY --from=builder /dist/ /tmp/wheels/
# The `sidecar` extra: the sidecar owns NVML (nvidia-ml-py) and reads the kubelet's pod-resources API
# (grpcio, protobuf). Not the Agent's base package: the sidecar imports nothing of it.
RUN set -eu; \
    set -- /tmp/wheels/datadog_gpu_monitoring-*.whl; \
    python -m venv /opt/gpu-monitoring; \
    /opt/gpu-monitoring/bin/pip install --no-cache-dir "$1[sidecar]"; \
    rm -rf /tmp/wheels; \
    groupadd --system --gid 10001 gpu-monitoring; \
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpu-monitoring; \
    install -d -o 10001 -g 10001 -m 0755 /var/run/gpu-monitoring; \
    install -d -o 10001 -g 10001 -m 0700 /var/lib/gpu-monitoring; \
    gpu-monitoring sidecar --help >/dev/null; \
    python -c "import pynvml, grpc, importlib.util as u; assert u.find_spec('datadog_checks.base') is None"

USER 10001:10001
ENTRYPOINT ["gpu-monitoring", "sidecar"]
