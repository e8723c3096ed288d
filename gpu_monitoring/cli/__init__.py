"""The `gpu-monitoring` command line and what it prints."""
