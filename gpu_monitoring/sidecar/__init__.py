"""The node sidecar: owns NVML, journals its events and serves them over a unix socket."""
