"""Kubernetes attribution: which pod and container the kubelet gave each GPU."""
