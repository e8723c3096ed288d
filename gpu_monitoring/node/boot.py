"""The kernel's boot ID: `<proc_root>/sys/kernel/random/boot_id`, a UUID the kernel makes once per boot
(kernel Documentation/admin-guide/sysctl/kernel.rst, "random"), so a reboot changes it."""

import os
from typing import Optional

from gpu_monitoring.node.kernel_files import read_value

BOOT_ID = ("sys", "kernel", "random", "boot_id")


def read_boot_id(proc_root: Optional[str]) -> Optional[str]:
    """The boot ID ("5f0ab4c2-..."); None without a proc root or where the file cannot be read.
    Cost: one read of a one-line file."""
    if not proc_root:
        return None
    return read_value(os.path.join(proc_root, *BOOT_ID))
