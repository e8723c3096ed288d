"""Kubernetes attribution: which pod and container the kubelet gave each GPU."""

# Seconds the kubelet's pods, and pod-resources' devices, are kept before they are asked again
# (`pod_cache_ttl`): at the Agent's 15-second interval, every other run asks.
DEFAULT_TTL = 30.0
