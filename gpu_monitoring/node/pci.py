"""The NVIDIA functions on the PCI bus: `<sysfs_root>/bus/pci/devices/<domain:bus:device.function>/`.

Each function's directory holds `vendor`, `device` and `class` (kernel Documentation/PCI/sysfs-pci.rst),
which drivers/pci/pci-sysfs.c writes as "0x%04x" and "0x%06x" ("0x10de", "0x2330", "0x030200"), and a
`driver` link to `bus/pci/drivers/<name>` while a driver is bound, none otherwise.
"""

import os
from typing import Dict, List, Optional, Tuple

from gpu_monitoring.node.kernel_files import SysfsUnavailable, read_value
from gpu_monitoring.node.pci_links import AerTurns, aer_paths, parent_port, read_aer
from gpu_monitoring.snapshot import PciFunction

DEVICES_DIRECTORY = ("bus", "pci", "devices")
NVIDIA = 0x10DE
# By the base class and subclass (the class code without its programming interface), as the PCI
# SIG's code and ID assignment specification numbers them: 03/00 VGA and 03/02 3D controllers are
# GPUs, 06/80 "other bridge" is how an NVSwitch presents itself, 04/03 is an HD Audio function.
_KINDS = {0x0300: "gpu", 0x0302: "gpu", 0x0680: "nvswitch", 0x0403: "audio"}
# The driver a GPU handed to a virtual machine is bound to, and the one a GPU of this host's runs on.
PASSED_TO_VM = "vfio-pci"
NVIDIA_DRIVER = "nvidia"


Identity = Tuple[int, Optional[int], Optional[int], Optional[str]]  # vendor, class code, device ID, parent port


class PciReader:
    """Reads the NVIDIA functions under one sysfs root, run after run.

    A function's vendor, class, device ID and parent port are the hardware's: read once per function, the
    first time its address is listed. Cost of a run after that: one listing of the PCI device directory
    (a node has some 20 to 300 functions), a readlink of `driver` per NVIDIA function, since a driver
    can be bound or unbound at any time, and a GPU's three AER counter files one run in AER_EVERY.
    """

    def __init__(self, sysfs_root: str) -> None:
        self._directory = os.path.join(sysfs_root, *DEVICES_DIRECTORY)
        self._identities: Dict[str, Optional[Identity]] = {}
        self._aer = AerTurns()

    def read(self) -> List[PciFunction]:
        """The NVIDIA functions, by address. SysfsUnavailable where the PCI device directory cannot be
        listed. A function that vanishes while it is read (hot-unplug) is left out."""
        try:
            names = os.listdir(self._directory)
        except OSError as e:
            raise SysfsUnavailable(f"cannot list {self._directory}: {e.strerror or e}") from e
        self._identities = {name: self._identity(name) for name in names}
        self._aer.next_run()
        nvidia = sorted((name, identity) for name, identity in self._identities.items()
                        if identity is not None and identity[0] == NVIDIA)
        functions = [self._function(name, identity, self._aer.due(position))
                     for position, (name, identity) in enumerate(nvidia)]
        return sorted((f for f in functions if f is not None), key=lambda f: f.address)

    def _identity(self, name: str) -> Optional[Identity]:
        """The function's vendor, class and device ID; None where it cannot be read (gone, unreadable)."""
        known = self._identities.get(name)
        if known is not None:
            return known
        path = os.path.join(self._directory, name)
        vendor = _hex(read_value(os.path.join(path, "vendor")))
        if vendor != NVIDIA:
            return None if vendor is None else (vendor, None, None, None)
        class_code = _hex(read_value(os.path.join(path, "class")))
        if class_code is None:
            return None
        return vendor, class_code, _hex(read_value(os.path.join(path, "device"))), parent_port(path)

    def _function(self, name: str, identity: Identity, aer_due: bool) -> Optional[PciFunction]:
        path = os.path.join(self._directory, name)
        try:
            driver: Optional[str] = os.path.basename(os.readlink(os.path.join(path, "driver")))
        except OSError:
            # No driver bound, or the function went since it was listed: only the first is a GPU to tell.
            if not os.path.isdir(path):
                return None
            driver = None
        _, class_code, device_id, parent = identity
        kind = _KINDS.get(class_code >> 8, "other")
        # A GPU's link errors are judged; an NVSwitch's and an audio function's are not read.
        aer = read_aer(aer_paths(path)) if kind == "gpu" and aer_due else None
        return PciFunction(name.lower(), class_code, kind, device_id, driver, parent, aer)


def _hex(text: Optional[str]) -> Optional[int]:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None
