"""Scenarios for the bench: the shipped ones it reports on, and variants built from them.

Variants are written as YAML into a directory, as a user's own scenario would be, so the
simulator builds their proc root, kubelet and pod-resources answers the usual way.
"""

from pathlib import Path
from typing import Any, Dict, List

import yaml

from gpu_monitoring.simulator.scenario import resolve

# The driver of h100-no-fields refuses the field IDs that have dedicated functions.
FIELD_REFUSING = "h100-no-fields"
HEADLINE = ["dgx-h100", "hgx-b200", "a100-mig", "t4-shared", "legacy-driver", FIELD_REFUSING]
FIRST_PID = 10000


def headline() -> List[str]:
    return list(HEADLINE)


def scaled(directory: Path, gpus: int) -> str:
    """dgx-h100's GPUs repeated to `gpus`, without Kubernetes."""
    raw = _raw("dgx-h100")
    template = raw["devices"][:8]
    raw["devices"] = [dict(template[i % 8], pci_bus_id=_bus(i)) for i in range(gpus)]
    raw.pop("kubernetes", None)
    return _write(directory, f"h100-x{gpus}", raw)


def crowded(directory: Path, gpus: int, processes: int, pods: int) -> str:
    """Time-sliced H100s: `pods` pods hold one replica each and run `processes` processes between them."""
    raw = _raw("dgx-h100")
    pod_pids: Dict[int, List[int]] = {pod: [] for pod in range(pods)}
    for n in range(processes):
        pod_pids[n % pods].append(FIRST_PID + n)
    # Memory each process holds, so that all of them fit in the GPU as on a real node.
    memory_mib = max(1, min(900, 70000 * gpus // max(processes, 1)))
    devices = [dict(raw["devices"][0], pci_bus_id=_bus(i), processes=[]) for i in range(gpus)]
    for pod, pids in pod_pids.items():
        devices[pod % gpus]["processes"] += [{"pid": pid, "name": "python3", "memory_mib": memory_mib} for pid in pids]
    raw["devices"] = devices
    replicas = -(-pods // gpus)
    raw["kubernetes"] = {
        "advertised": [{"device": i, "resource": "nvidia.com/gpu.shared", "replicas": replicas} for i in range(gpus)],
        "pods": [_shared_pod(pod, pids, gpus) for pod, pids in pod_pids.items()],
    }
    return _write(directory, f"crowded-{gpus}g-{processes}p-{pods}pods", raw)


def mig(directory: Path, gpus: int) -> str:
    """`gpus` A100s each split into seven 1g.10gb instances (a100-mig's GPU 1), without Kubernetes."""
    raw = _raw("a100-mig")
    template = raw["devices"][1]
    raw["devices"] = [
        dict(template, pci_bus_id=_bus(i), mig=[_renumbered(m, FIRST_PID + 100 * i + slot)
                                                for slot, m in enumerate(template["mig"])])
        for i in range(gpus)
    ]
    raw.pop("kubernetes", None)
    return _write(directory, f"a100-mig-x{gpus}", raw)


def _shared_pod(pod: int, pids: List[int], gpus: int) -> Dict[str, Any]:
    return {
        "name": f"worker-{pod}",
        "namespace": f"team-{pod % 5}",
        "containers": [{"name": "main", "resource": "nvidia.com/gpu.shared",
                        "devices": [f"gpu:{pod % gpus}::{pod // gpus}"], "processes": pids}],
    }


def _renumbered(instance: Dict[str, Any], pid: int) -> Dict[str, Any]:
    """A MIG instance whose processes get pids of their own, so copies of a GPU share none."""
    processes = [dict(p, pid=pid) for p in instance.get("processes", [])[:1]]
    return dict(instance, processes=processes)


def _bus(index: int) -> str:
    # PCI domain 1: the scenario's NVSwitches and NICs keep their addresses in domain 0.
    return f"00000001:{index + 1:02X}:00.0"


def _raw(name: str) -> Dict[str, Any]:
    return yaml.safe_load(resolve(name).read_text())


def _write(directory: Path, name: str, raw: Dict[str, Any]) -> str:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)
