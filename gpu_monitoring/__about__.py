__version__ = "0.2.0"

# What local mode needs beyond the Agent's own Python, by the module it provides: setup.py's
# `deps` extra, the Agent image and the check's "install it" messages all read these pins.
DEPS = {
    "pynvml": "nvidia-ml-py==13.615.71",
    "grpc": "grpcio==1.85.1",
}
