"""The NVLink fabric a GPU belongs to, kept while it is out of it: its clique and cluster are tags of its
series (`gpu_clique_id`, `gpu_cluster_uuid`), and a GPU that leaves its fabric for a while (a fabric manager
restart, a GPU reset) must stay on the same series, so that what is grouped by clique sees it go unhealthy
and come back rather than a series that stops and another that starts. NVML gives the clique and cluster
only while registration is complete (nvml.h, nvmlGpuFabricInfo_v2: clusterUuid and cliqueId are valid when
state is NVML_GPU_FABRIC_STATE_COMPLETED). Kept as JSON in the Agent's persistent cache across restarts."""

import json
import logging
from typing import Dict, Iterable, Optional, Tuple

from gpu_monitoring.snapshot import Device

log = logging.getLogger(__name__)

Identity = Tuple[int, str]  # (clique ID, cluster UUID)


class FabricIdentities:
    def __init__(self, known: Optional[Dict[str, Identity]] = None) -> None:
        self._known: Dict[str, Identity] = dict(known or {})

    def fill(self, devices: Iterable[Device]) -> bool:
        """Gives each GPU out of its fabric the clique and cluster it was last seen in, and learns those of
        the GPUs in one; each change said once. Whether what is kept changed (then save `dumps()`). Only
        GPUs this run lists are kept."""
        known: Dict[str, Identity] = {}
        for device in (d for d in devices if d.uuid):
            before = self._known.get(device.uuid)
            if device.fabric_clique_id is not None and device.fabric_cluster_uuid is not None:
                known[device.uuid] = (device.fabric_clique_id, device.fabric_cluster_uuid)
                _tell(device, before, known[device.uuid])
            elif before is not None:
                device.fabric_clique_id, device.fabric_cluster_uuid = before
                known[device.uuid] = before
        changed = known != self._known
        self._known = known
        return changed

    def dumps(self) -> str:
        return json.dumps({uuid: list(identity) for uuid, identity in self._known.items()}, sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> "FabricIdentities":
        """What `dumps` wrote; empty where there is none or it cannot be read."""
        try:
            raw = json.loads(text) if text else {}
            return cls({str(uuid): (int(clique), str(cluster)) for uuid, (clique, cluster) in raw.items()})
        except (ValueError, TypeError, AttributeError):
            log.info("the GPUs' last known NVLink cliques cannot be read from the persistent cache; they are learnt "
                     "again as GPUs register")
            return cls()


def _tell(device: Device, before: Optional[Identity], now: Identity) -> None:
    if before != now:
        was = f" (was clique {before[0]} of cluster {before[1]})" if before else ""
        log.info("GPU %d (%s) is in NVLink clique %d of cluster %s%s", device.index, device.uuid, now[0], now[1], was)
