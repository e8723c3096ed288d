__version__ = "0.2.0"

# What local mode needs beyond the Agent's own Python, by the module it provides: setup.py's
# `deps` and `sidecar` extras, the Agent image and the check's "install it" messages all read these pins.
DEPS = {
    "pynvml": "nvidia-ml-py==13.615.71",
    "grpc": "grpcio==1.85.1",
}

# What the sidecar needs besides DEPS, running on a Python of its own (setup.py's `sidecar` extra):
# protobuf for the pod-resources API (and, with --simulate, the simulated node's server of it).
# Pinned to the version the tests run.
SIDECAR_DEPS = {
    "google.protobuf": "protobuf==7.35.1",
}
