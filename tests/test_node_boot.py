"""The kernel's boot ID, read as procfs gives it."""

import os
import re

import pytest

from gpu_monitoring.node.boot import read_boot_id


def test_the_boot_id_is_the_uuid_the_kernel_gives(tmp_path):
    # `cat /proc/sys/kernel/random/boot_id`: one UUID and a newline.
    boot_id = tmp_path / "sys/kernel/random/boot_id"
    boot_id.parent.mkdir(parents=True)
    boot_id.write_text("2f8c0f4e-9a51-4c3b-8d57-0e6b2a1f93c4\n")

    assert read_boot_id(str(tmp_path)) == "2f8c0f4e-9a51-4c3b-8d57-0e6b2a1f93c4"


def test_no_boot_id_where_the_proc_root_has_none(tmp_path):
    assert read_boot_id(str(tmp_path)) is None
    assert read_boot_id(None) is None


@pytest.mark.skipif(not os.path.exists("/proc/sys/kernel/random/boot_id"), reason="no Linux procfs here")
def test_this_machines_boot_id_reads_as_a_uuid():
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", read_boot_id("/proc"))
