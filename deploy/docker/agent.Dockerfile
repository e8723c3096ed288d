# Datadog Agent image with the gpu_monitoring check installed.
#
# Build from the repository root (the build context must be the repository root):
#
#   python -m pip wheel --no-deps -w dist .        # dist/ must hold exactly one datadog_gpu_monitoring wheel
#   docker build -f deploy/docker/agent.Dockerfile \
#       --build-arg AGENT_VERSION=7 \
#       -t registry.example.com/datadog-agent-gpu:0.1.0 .
#
# Use it with deploy/helm/datadog-values.yaml (agents.image.repository/tag). The check's config
# comes from the chart's datadog.confd; the example config is shipped next to it for reference.
ARG AGENT_VERSION=7
FROM gcr.io/datadoghq/agent:${AGENT_VERSION}

COPY dist/datadog_gpu_monitoring-*.whl /tmp/wheels/

# The Agent's embedded Python already has datadog-checks-base with its dependencies (and
# protobuf, PyYAML, requests), so our wheel goes in without dependencies; then the few it lacks.
# grpcio is installed normally: pip leaves it alone where the Agent already ships a good version.
RUN set -eu; \
    set -- /tmp/wheels/datadog_gpu_monitoring-*.whl; \
    if [ "$#" -ne 1 ]; then echo "expected one wheel in dist/, found: $*" >&2; exit 1; fi; \
    /opt/datadog-agent/embedded/bin/pip install --no-cache-dir --no-deps "$1"; \
    /opt/datadog-agent/embedded/bin/pip install --no-cache-dir "nvidia-ml-py>=12.535.77" "grpcio>=1.48"; \
    rm -rf /tmp/wheels; \
    /opt/datadog-agent/embedded/bin/python3 -c "import gpu_monitoring.check"

COPY conf.yaml.example /etc/datadog-agent/conf.d/gpu_monitoring.d/conf.yaml.example
