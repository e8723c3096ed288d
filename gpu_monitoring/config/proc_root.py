"""Where the host's /proc is read when no option says: the check's `proc_root` and the sidecar's `--proc-root`."""

import os


def default_proc_root() -> str:
    """Mounted at /host/proc in the Agent's container, else this machine's own (in the sidecar's
    container, which shares the host's PID namespace, the host's)."""
    return "/host/proc" if os.path.isdir("/host/proc") else "/proc"
