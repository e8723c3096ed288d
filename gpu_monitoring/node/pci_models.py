"""The product NVML would name a GPU by, from its PCI device ID, for a GPU NVML does not list.

A GPU that never came up in the driver has no NVML name, yet the node pays for it: its price is its
model's. The IDs are NVIDIA's (vendor 0x10de) as the PCI ID repository lists them
(https://pci-ids.ucw.cz/read/PC/10de) and as `lspci -n` shows them; the names are the product names
NVML gives those boards (nvmlDeviceGetName), the names `hourly_price` is keyed by. A GPU of an ID
not listed here is priced as the node's other GPUs are where it shares their ID.
"""

from typing import Dict, Optional

PCI_MODELS: Dict[int, str] = {
    0x1DB5: "Tesla V100-SXM2-32GB",
    0x1EB8: "Tesla T4",
    0x20B0: "NVIDIA A100-SXM4-40GB",
    0x20B2: "NVIDIA A100-SXM4-80GB",
    0x20B5: "NVIDIA A100 80GB PCIe",
    0x20B7: "NVIDIA A30",
    0x20F1: "NVIDIA A100-PCIE-40GB",
    0x2236: "NVIDIA A10",
    0x2330: "NVIDIA H100 80GB HBM3",
    0x2331: "NVIDIA H100 PCIe",
    0x2335: "NVIDIA H200",
    0x2342: "NVIDIA GH200 480GB",
    0x26B5: "NVIDIA L40",
    0x26B9: "NVIDIA L40S",
    0x27B8: "NVIDIA L4",
    0x2901: "NVIDIA B200",
}


def model_of(device_id: Optional[int]) -> Optional[str]:
    return PCI_MODELS.get(device_id) if device_id is not None else None
