"""PCIe AER errors counted once from two records: the kernel's lines at once, sysfs's exact totals when a
function's turn to be read comes; errors its parent port reported are its link's."""

from gpu_monitoring.health.device_health import Health
from gpu_monitoring.health.pcie_aer import AerCounter, judge
from gpu_monitoring.snapshot import Event, NetworkPort, Node, PciFunction
from gpu_monitoring.status import Status

GPU, PORT = "0000:1b:00.0", "0000:1a:01.0"
GPU_BUS_ID, NIC_BUS_ID = "00000000:1B:00.0", "00000000:18:00.0"


def node(totals=None, nic_totals=None):
    return Node(pci_functions=[PciFunction(GPU, 0x030200, "gpu", 0x2330, "nvidia", PORT, totals)],
                network_ports=[NetworkPort("mlx5_0", 1, pci_address="0000:18:00.0", parent="0000:17:01.0",
                                           aer=nic_totals)])


def line(source, severity="corrected", reporter=PORT):
    bus_id = "0000" + source.upper() if len(source) == 12 else source
    return Event(None, "aer", 0, 1.0, pci_bus_id=bus_id, source="kernel", severity=severity, reporter=reporter)


def totals(corrected=0, nonfatal=0, fatal=0):
    return {"corrected": corrected, "nonfatal": nonfatal, "fatal": fatal}


def counted(counter, *args):
    found = counter.count(*args)
    counter.commit()
    return found


def test_lines_count_at_once_and_the_totals_add_only_what_they_left_out():
    counter = AerCounter()
    assert counted(counter, node(totals(3)), []) == {}  # the first read is where counting starts
    # Five errors, of which the kernel printed three lines (it rate-limits them); sysfs is not read this run.
    assert counted(counter, node(None), [line(GPU) for _ in range(3)]) == {GPU_BUS_ID: {"corrected": 3}}
    # The GPU's turn: its totals grew by 5, three of them counted already.
    assert counted(counter, node(totals(8)), []) == {GPU_BUS_ID: {"corrected": 2}}
    assert counted(counter, node(totals(8)), []) == {}


def test_without_the_kernels_lines_the_totals_alone_count():
    counter = AerCounter()
    counted(counter, node(totals(0, 0, 0)), [])
    assert counted(counter, node(None), []) == {}
    assert counted(counter, node(totals(0, 1, 1)), []) == {GPU_BUS_ID: {"nonfatal": 1, "fatal": 1}}


def test_errors_the_port_above_reported_are_the_links():
    counter = AerCounter()
    counted(counter, node(totals()), [])
    # The root port detected them itself: the GPU's own totals do not hold them.
    from_port = [line(PORT, "nonfatal", reporter=PORT)]
    assert counted(counter, node(totals()), from_port) == {GPU_BUS_ID: {"nonfatal": 1}}


def test_a_nics_errors_are_its_ports():
    counter = AerCounter()
    counted(counter, node(nic_totals=totals()), [])
    assert counted(counter, node(nic_totals=totals(fatal=1)), []) == {NIC_BUS_ID: {"fatal": 1}}


def test_a_run_that_failed_is_counted_again():
    counter = AerCounter()
    counted(counter, node(totals()), [])
    counter.count(node(totals(4)), [])  # never submitted
    assert counted(counter, node(totals(4)), []) == {GPU_BUS_ID: {"corrected": 4}}


def test_what_the_counts_say_of_health():
    health = Health()
    judge(health, {"corrected": 9})
    assert health.status == Status.OK  # a few corrected errors are a busy link's noise
    judge(health, {"corrected": 12, "nonfatal": 1})
    assert health.status == Status.WARNING and "12 corrected PCIe errors (AER)" in health.message
    judge(health, {"fatal": 1}, "port mlx5_0/1's NIC")
    assert health.status == Status.CRITICAL and "1 fatal uncorrectable PCIe error (AER) on port mlx5_0/1's NIC" \
        in health.message
