"""The NVIDIA functions on the PCI bus, read from sysfs trees recorded from real command output."""

import os
import shutil

import pytest

from gpu_monitoring.node.kernel_files import SysfsUnavailable
from gpu_monitoring.node.pci import PciReader
from gpu_monitoring.snapshot import PciFunction

from .sysfs_support import materialize

HGX_NVSWITCHES = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
HGX_GPUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]


def test_an_hgx_node_shows_its_gpus_and_nvswitches_and_nothing_of_other_vendors(tmp_path):
    functions = read_pci(str(materialize("hgx-h100-pci.txt", tmp_path)))

    # Each behind a port of its own, as the recorded links lay them out: the port is its link's other end.
    assert functions == (
        [PciFunction(address, 0x068000, "nvswitch", 0x22A3, "nvidia", _port(address, "04", n))
         for n, address in enumerate(HGX_NVSWITCHES, 1)]
        + [PciFunction(address, 0x030200, "gpu", 0x2330, "nvidia", _port(address)) for address in HGX_GPUS]
    )


def _port(address, bus=None, device=1):
    """The recording's root port above a function: bus - 1, device 1 (the NVSwitches' share bus 04)."""
    return f"0000:{bus or f'{int(address[5:7], 16) - 1:02x}'}:{device:02x}.0"


def test_each_function_has_its_kind_and_the_driver_that_holds_it(tmp_path):
    functions = read_pci(str(materialize("mixed-pci.txt", tmp_path)))

    assert functions == [
        PciFunction("0000:21:00.0", 0x030200, "gpu", 0x26B9, "vfio-pci", "0000:20:01.1"),
        PciFunction("0000:41:00.0", 0x030200, "gpu", 0x2331, None, "0000:40:01.1"),
        PciFunction("0000:c1:00.0", 0x030000, "gpu", 0x1E30, "nvidia", "0000:c0:01.1"),
        PciFunction("0000:c1:00.1", 0x040300, "audio", 0x10F7, "snd_hda_intel", "0000:c0:01.1"),
        PciFunction("0000:c1:00.2", 0x0C0330, "other", 0x1AD6, "xhci_hcd", "0000:c0:01.1"),
        PciFunction("0000:c1:00.3", 0x0C8000, "other", 0x1AD7, "nvidia-gpu", "0000:c0:01.1"),
    ]


# kernel Documentation/ABI/testing/sysfs-bus-pci-devices-aer: a line per error type, then the total.
AER_FILES = {
    "aer_dev_correctable": "RxErr 12\nBadTLP 0\nBadDLLP 3\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\n"
                           "HeaderOF 0\nTOTAL_ERR_COR 15\n",
    "aer_dev_nonfatal": "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 1\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\n"
                        "MalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\n"
                        "AtomicOpBlocked 0\nTLPBlockedErr 0\nTOTAL_ERR_NONFATAL 1\n",
    "aer_dev_fatal": "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\n"
                     "MalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\n"
                     "TLPBlockedErr 0\nTOTAL_ERR_FATAL 0\n",
}


def test_a_gpus_aer_totals_are_read_where_the_kernel_has_them(tmp_path):
    root = materialize("hgx-h100-pci.txt", tmp_path)
    for name, text in AER_FILES.items():
        (root / "bus/pci/devices/0000:1b:00.0" / name).write_text(text)
    (root / "bus/pci/devices/0000:05:00.0/aer_dev_correctable").write_text(AER_FILES["aer_dev_correctable"])

    by_address = {f.address: f.aer for f in read_pci(str(root))}

    assert by_address["0000:1b:00.0"] == {"corrected": 15, "nonfatal": 1, "fatal": 0}
    assert by_address["0000:43:00.0"] is None  # a kernel without the files (before 5.1, or AER off)
    assert by_address["0000:05:00.0"] is None  # an NVSwitch's link is not judged here


def test_a_function_gone_between_listing_and_reading_is_left_out(tmp_path):
    root = materialize("mixed-pci.txt", tmp_path)
    # Hot-unplug removes the function's directory under /sys/devices; its bus link goes a moment later.
    shutil.rmtree(os.path.realpath(root / "bus/pci/devices/0000:41:00.0"))

    addresses = [f.address for f in read_pci(str(root))]

    assert addresses == ["0000:21:00.0", "0000:c1:00.0", "0000:c1:00.1", "0000:c1:00.2", "0000:c1:00.3"]


def test_a_function_whose_class_cannot_be_read_is_left_out_and_the_others_stay(tmp_path):
    root = materialize("hgx-h100-pci.txt", tmp_path)
    (root / "bus/pci/devices/0000:1b:00.0/class").unlink()

    addresses = [f.address for f in read_pci(str(root))]

    assert addresses == HGX_NVSWITCHES + HGX_GPUS[1:]


def test_a_bus_without_nvidia_functions_lists_none(tmp_path):
    (tmp_path / "bus/pci/devices").mkdir(parents=True)

    assert read_pci(str(tmp_path)) == []


def test_a_sysfs_root_without_a_pci_bus_is_unavailable_and_says_where_and_why(tmp_path):
    missing = tmp_path / "host-sys"

    with pytest.raises(SysfsUnavailable) as raised:
        read_pci(str(missing))

    assert str(missing / "bus/pci/devices") in str(raised.value)
    assert "No such file or directory" in str(raised.value)


def read_pci(root):
    return PciReader(root).read()


def test_a_functions_identity_is_read_once_and_its_driver_every_run(tmp_path):
    root = materialize("mixed-pci.txt", tmp_path)
    reader = PciReader(str(root))
    first = {f.address: f for f in reader.read()}
    unbound = next(address for address, f in first.items() if f.kind == "gpu" and f.driver is None)
    function = root / "bus" / "pci" / "devices" / unbound
    (function / "class").unlink()  # no longer read: the identity is the hardware's
    (function / "driver").symlink_to("../../../bus/pci/drivers/nvidia")
    again = {f.address: f for f in reader.read()}
    assert again[unbound].driver == "nvidia" and again[unbound].kind == "gpu"
