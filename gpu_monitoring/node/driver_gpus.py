"""The NVIDIA kernel driver's own record of its GPUs: `<proc root>/driver/nvidia/gpus/<bus id>/information`.

It names a GPU that NVML no longer can. The driver keeps the entry of every GPU it probed until it
unloads, and writes its "GPU UUID" line from the UUID it cached when it first read it
(open-gpu-kernel-modules, nv-procfs.c: nv_procfs_read_gpu_info prints rm_get_gpu_uuid, which
RmGetGpuUuidRaw answers from nv_uuid_cache), so the line outlives the GPU falling off the bus.
A file reads, one fact a line ("Key: <tabs> value"):

    Model:           NVIDIA H100 PCIe
    GPU UUID:        GPU-53afcb87-8952-5274-aab6-21edb280140b
    Bus Location:    0000:38:00.0
    Device Minor:    2
"""

import functools
import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from gpu_monitoring import snapshot

log = logging.getLogger(__name__)

GPUS_DIRECTORY = ("driver", "nvidia", "gpus")
# nv-procfs.c writes "%04x:%02x:%02x.%x"; NVML writes a bus ID "%08X:%02X:%02X.0" (nvml.h,
# NVML_DEVICE_PCI_BUS_ID_FMT). Both are read here, and a driver's is written as NVML's.
_BUS_ID = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")
MAX_FILE_BYTES = 4096  # the file is a dozen short lines


@dataclass(frozen=True)
class DriverGpu:
    pci_bus_id: str  # as NVML writes it
    uuid: Optional[str]
    name: Optional[str]
    minor_number: Optional[int]


@functools.lru_cache(maxsize=4096)
def nvml_bus_id(text: str) -> Optional[str]:
    """A PCI bus ID in NVML's form, from the driver's or NVML's; None if it is neither. Remembered: a node's
    few dozen functions are asked after every run."""
    match = _BUS_ID.fullmatch(text.strip())
    if match is None:
        return None
    domain, bus, slot, function = (int(part, 16) for part in match.groups())
    return f"{domain:08X}:{bus:02X}:{slot:02X}.{function:X}"


def read_driver_gpus(proc_root: Optional[str]) -> List[DriverGpu]:
    """The GPUs the driver probed, by PCI bus ID; none without a proc root or without the driver's
    directory there (no driver loaded, or the host's /proc not mounted there)."""
    if not proc_root:
        return []
    directory = os.path.join(proc_root, *GPUS_DIRECTORY)
    try:
        names = os.listdir(directory)
    except OSError as e:
        log.debug("no driver record of GPUs at %s: %s", directory, e)
        return []
    found = []
    for name in names:
        facts = _facts(os.path.join(directory, name, "information"))
        bus_id = nvml_bus_id(facts.get("Bus Location", name))
        if bus_id is not None:
            found.append(DriverGpu(bus_id, _uuid(facts.get("GPU UUID")), facts.get("Model"), _number(facts)))
    return sorted(found, key=lambda gpu: gpu.pci_bus_id)


def driver_gpu_bus_ids(proc_root: Optional[str]) -> Optional[List[str]]:
    """The PCI bus IDs (NVML's form) of the GPUs the driver set up, by its directories' names alone (one
    listing a run, no file read); None where the directory cannot be listed (no driver loaded, or the
    host's /proc is not there)."""
    if not proc_root:
        return None
    try:
        names = os.listdir(os.path.join(proc_root, *GPUS_DIRECTORY))
    except OSError:
        return None
    return sorted(bus_id for bus_id in map(nvml_bus_id, names) if bus_id is not None)


def name_lost_devices(devices: List[snapshot.Device], gpus: List[DriverGpu]) -> None:
    """Fill in what NVML could not tell of a GPU (UUID, name, bus ID, minor number) from the driver's record.

    A GPU whose bus ID is known is found by it. One whose bus ID is unknown too (NVML gave no handle for
    it, or its handle answers nothing) is found by its index: NVML numbers GPUs in ascending PCI bus ID
    order (the order CUDA_DEVICE_ORDER=PCI_BUS_ID gives, to match nvidia-smi), but nvml.h promises no
    order, so this is done only where the driver lists as many GPUs as NVML counts and every GPU whose
    bus ID NVML gave sits at its index in that order.
    """
    if len(gpus) == len(devices) and all(
        device.pci_bus_id is None or nvml_bus_id(device.pci_bus_id) == gpus[device.index].pci_bus_id
        for device in devices
    ):
        for device in devices:
            if device.pci_bus_id is None:
                device.pci_bus_id = gpus[device.index].pci_bus_id
    by_bus_id: Dict[str, DriverGpu] = {gpu.pci_bus_id: gpu for gpu in gpus}
    for device in devices:
        gpu = by_bus_id.get(nvml_bus_id(device.pci_bus_id or ""))
        if gpu is not None:
            device.uuid = device.uuid or gpu.uuid
            device.name = device.name or gpu.name
            device.minor_number = gpu.minor_number if device.minor_number is None else device.minor_number


def _facts(path: str) -> Dict[str, str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(MAX_FILE_BYTES)
    except OSError as e:
        log.debug("cannot read %s: %s", path, e)
        return {}
    facts = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            facts[key.strip()] = value.strip()
    return facts


def _uuid(text: Optional[str]) -> Optional[str]:
    # The driver leaves the line out when it has no UUID for the GPU (nv-procfs.c).
    return text if text and text.startswith("GPU-") else None


def _number(facts: Dict[str, str]) -> Optional[int]:
    minor = facts.get("Device Minor", "")
    return int(minor) if minor.isdigit() else None
