"""`gpu-monitoring status`'s verdict on a check run: can this install read what it monitors, and is
what it monitors healthy?

An install works when every `*.can_connect` service check (NVML, the sidecar, the kubelet, DCGM) is
OK or WARNING; a WARNING (a permission, events unavailable, one GPU unreadable) is printed with the
summary but does not fail it. A run that raised, or sent no service check at all, read nothing. An
install that works can still find a GPU (`device.health`) or the node (`node.health`) CRITICAL;
with `connect_only` that is left to the summary.
"""

from typing import Any, Dict, List, Tuple

from gpu_monitoring.cli.run_by_run import where
from gpu_monitoring.status import Status

OK = 0
NOT_WORKING = 1  # 2 is argparse's usage error, and the CLI's for a configuration it refuses
CRITICAL_FOUND = 3  # `check`'s too: a script reads the same number from both
CAN_CONNECT = ".can_connect"
# Of several instances' verdicts, the one a script must act on first: an install that does not work.
PRECEDENCE = (OK, CRITICAL_FOUND, NOT_WORKING)


def any_critical(report: Dict[str, Any]) -> bool:
    """Whether a service check of the run is CRITICAL: a GPU, the node, or what the check reads from."""
    return any(check["status"] == Status.CRITICAL.name for check in report["service_checks"])


def worse(one: int, other: int) -> int:
    return max(one, other, key=PRECEDENCE.index)


def verdict(report: Dict[str, Any], errors: List[str], connect_only: bool = False) -> Tuple[int, str]:
    """The exit status and the line that explains it."""
    checks = report["service_checks"]
    critical = [check for check in checks if check["status"] == Status.CRITICAL.name]
    down = [check for check in critical if check["name"].endswith(CAN_CONNECT)]
    if down:
        reasons = "; ".join(f"{check['name']} is CRITICAL: {check['message']}" for check in down)
        return NOT_WORKING, f"Status: NOT WORKING: {reasons}"
    if errors:
        return NOT_WORKING, f"Status: NOT WORKING: the check failed: {'; '.join(errors)}"
    if not checks:
        return NOT_WORKING, "Status: NOT WORKING: the check read nothing and sent no service check"
    if critical and not connect_only:
        judged = ", ".join(where(check) for check in critical)
        return CRITICAL_FOUND, f"Status: CRITICAL: the install works, and these are CRITICAL: {judged} (see above)"
    not_ok = sum(check["status"] != Status.OK.name for check in checks)
    if not not_ok:
        return OK, "Status: OK"
    return OK, f"Status: OK ({not_ok} service check{'s' if not_ok > 1 else ''} not OK: see above)"
