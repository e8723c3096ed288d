"""`gpu-monitoring status`'s verdict on a check run: can this install read what it monitors?

An install works when every `*.can_connect` service check (NVML, the sidecar, the kubelet) is
OK or WARNING; a WARNING (a permission, events unavailable, one GPU unreadable) is printed with
the summary but does not fail it. A run that raised, or sent no service check at all, read nothing.
"""

from typing import Dict, List, Tuple

from gpu_monitoring.health.service_checks import Status

OK = 0
NOT_WORKING = 1  # 2 is argparse's usage error, and the CLI's for a configuration it refuses
CAN_CONNECT = ".can_connect"


def any_critical(report: Dict[str, list]) -> bool:
    """Whether a service check of the run is CRITICAL: a GPU, the node, or what the check reads from."""
    return any(check["status"] == Status.CRITICAL.name for check in report["service_checks"])


def verdict(report: Dict[str, list], errors: List[str]) -> Tuple[int, str]:
    """The exit status and the line that explains it."""
    down = [check for check in report["service_checks"]
            if check["name"].endswith(CAN_CONNECT) and check["status"] == Status.CRITICAL.name]
    if down:
        reasons = "; ".join(f"{check['name']} is CRITICAL: {check['message']}" for check in down)
        return NOT_WORKING, f"Status: NOT WORKING: {reasons}"
    if errors:
        return NOT_WORKING, f"Status: NOT WORKING: the check failed: {'; '.join(errors)}"
    if not report["service_checks"]:
        return NOT_WORKING, "Status: NOT WORKING: the check read nothing and sent no service check"
    warnings = sum(check["status"] != Status.OK.name for check in report["service_checks"])
    return OK, "Status: OK" + (f" ({warnings} service checks not OK: see above)" if warnings else "")
