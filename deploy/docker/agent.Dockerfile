# Datadog Agent image with the gpu_monitoring check installed.
#
# Tag it <AGENT_VERSION>-gpumon<version of this project>, e.g. 7.81.1-gpumon0.2.0: the Agent
# release it builds on, then ours. deploy/helm/datadog-values*.yaml name it as agents.image.tag
# (the Agent release, which the Datadog chart reads to choose features) and agents.image.tagSuffix.
#
# Build from the repository root (the build context must be the repository root):
#
#   python -m pip wheel --no-deps -w dist .        # dist/ must hold exactly one datadog_gpu_monitoring wheel
#   docker build -f deploy/docker/agent.Dockerfile \
#       -t registry.example.com/datadog-agent-gpu:7.81.1-gpumon0.2.0 .
#
# With another --build-arg AGENT_VERSION, change both tags (image and agents.image.tag) with it.

# The Datadog chart's default Agent release (chart 3.240.0).
ARG AGENT_VERSION=7.81.1
FROM gcr.io/datadoghq/agent:${AGENT_VERSION}

# Local mode's packages, pinned to what the tests run (gpu_monitoring/__about__.py DEPS); sidecar
# mode needs nothing the Agent lacks.
ARG NVIDIA_ML_PY=nvidia-ml-py==13.615.71
ARG GRPCIO=grpcio==1.85.1

COPY dist/datadog_gpu_monitoring-*.whl /tmp/wheels/

# The wheel goes in the way Datadog documents for community integrations in containers: the Agent
# pip-installs it without dependencies under its constraints file and copies the example config
# (datadog_checks/gpu_monitoring/data/) to conf.d/gpu_monitoring.d/. Local mode's packages go
# through the same constraints file, so the build fails rather than replace a package the Agent
# pins. The smoke test imports the check the way the Agent loads it, and local mode's packages.
RUN set -eu; \
    set -- /tmp/wheels/datadog_gpu_monitoring-*.whl; \
    if [ "$#" -ne 1 ]; then echo "expected one wheel in dist/, found: $*" >&2; exit 1; fi; \
    agent integration install -r -w "$1"; \
    /opt/datadog-agent/embedded/bin/pip install --no-cache-dir \
        --constraint /opt/datadog-agent/final_constraints-py3.txt "${NVIDIA_ML_PY}" "${GRPCIO}"; \
    rm -rf /tmp/wheels; \
    test -f /etc/datadog-agent/conf.d/gpu_monitoring.d/conf.yaml.example; \
    /opt/datadog-agent/embedded/bin/python3 -c "import datadog_checks.gpu_monitoring, pynvml, grpc"
