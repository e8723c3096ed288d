"""A simulated NVML driver beneath the unmodified pynvml bindings (see `library`), and the node around it
(`node`): scenarios (`scenario`), their clock (`clock`), and what stands in for sysfs, /proc, the kubelet,
pod-resources and dcgm-exporter."""
