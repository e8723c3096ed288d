"""The NVIDIA functions on the PCI bus: `<sysfs_root>/bus/pci/devices/<domain:bus:device.function>/`.

Each function's directory holds `vendor`, `device` and `class` (kernel Documentation/PCI/sysfs-pci.rst),
which drivers/pci/pci-sysfs.c writes as "0x%04x" and "0x%06x" ("0x10de", "0x2330", "0x030200"), and a
`driver` link to `bus/pci/drivers/<name>` while a driver is bound, none otherwise.
"""

import os
from typing import List, Optional

from ..snapshot import PciFunction
from . import SysfsUnavailable, read_value

DEVICES_DIRECTORY = ("bus", "pci", "devices")
NVIDIA = 0x10DE
# By the base class and subclass (the class code without its programming interface), as the PCI
# SIG's code and ID assignment specification numbers them: 03/00 VGA and 03/02 3D controllers are
# GPUs, 06/80 "other bridge" is how an NVSwitch presents itself, 04/03 is an HD Audio function.
_KINDS = {0x0300: "gpu", 0x0302: "gpu", 0x0680: "nvswitch", 0x0403: "audio"}


def read_pci_functions(sysfs_root: str) -> List[PciFunction]:
    """The NVIDIA functions under `sysfs_root`, by address. SysfsUnavailable where its PCI device
    directory cannot be listed. A function that vanishes while it is read (hot-unplug) is left out.

    Cost: one directory listing and one read of `vendor` per function (a node has some 20 to 300),
    then for each NVIDIA function two reads and a readlink.
    """
    directory = os.path.join(sysfs_root, *DEVICES_DIRECTORY)
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise SysfsUnavailable(f"cannot list {directory}: {e.strerror or e}") from e
    functions = [_function(os.path.join(directory, name), name) for name in names]
    return sorted((f for f in functions if f is not None), key=lambda f: f.address)


def _function(path: str, name: str) -> Optional[PciFunction]:
    if _hex(read_value(os.path.join(path, "vendor"))) != NVIDIA:
        return None
    # The link is read before `class`, so that a function reported without a driver was still
    # there after: a directory gone between the two reads is not taken for an unbound GPU.
    driver = _driver(path)
    class_code = _hex(read_value(os.path.join(path, "class")))
    if class_code is None:
        return None
    device_id = _hex(read_value(os.path.join(path, "device")))
    return PciFunction(name.lower(), class_code, _KINDS.get(class_code >> 8, "other"), device_id, driver)


def _driver(path: str) -> Optional[str]:
    try:
        return os.path.basename(os.readlink(os.path.join(path, "driver")))
    except OSError:
        return None


def _hex(text: Optional[str]) -> Optional[int]:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None
