"""Whether a dcgm-exporter page still tells the present.

DCGM samples its fields every 30 s by default, and dcgm-exporter serves the latest sample of each;
when DCGM stops updating (its host engine stuck, a GPU it lost), the exporter goes on serving the
last values as if they were new. A value is not trusted past three sample periods:

- where the exporter writes timestamps, a sample older than that is left out;
- dcgm-exporter normally writes none, so a page is judged by its heartbeat fields (the energy
  counter, power draw: exposition.HEARTBEAT), which move at every sample of a powered GPU, busy or
  idle. A page whose heartbeat has stood still that long is stale as a whole. A page without
  either field is not judged this way: an idle GPU's activity reads 0 at every sample, the same
  as a stuck one's.
"""

import time
from typing import Callable, List, Optional, Tuple

from gpu_monitoring.dcgm.exposition import Page, Sample

SAMPLE_PERIOD = 30.0
STALE_AFTER = 3 * SAMPLE_PERIOD


class Freshness:
    """Remembers the heartbeat of the last page of one exporter and since when it has not moved.
    `clock` (monotonic) and `wall` (epoch seconds, as the exposition's timestamps) are the time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._wall = wall
        self._heartbeat: Optional[Tuple[float, ...]] = None
        self._moved_at = 0.0

    def fresh(self, page: Page) -> Tuple[List[Sample], Optional[str]]:
        """The samples to trust, and why none are, where that is because they are stale."""
        now = self._clock()
        if page.heartbeat != self._heartbeat:
            self._heartbeat, self._moved_at = page.heartbeat, now
        elif page.heartbeat and now - self._moved_at > STALE_AFTER:
            return [], (f"its values have not changed for over {STALE_AFTER:g}s (DCGM samples every "
                        f"{SAMPLE_PERIOD:g}s by default): DCGM no longer updates them")
        oldest = self._wall() - STALE_AFTER
        samples = [s for s in page.samples if s.timestamp is None or s.timestamp >= oldest]
        if page.samples and not samples:
            return [], f"its newest values are more than {STALE_AFTER:g}s old (DCGM samples every {SAMPLE_PERIOD:g}s)"
        return samples, None
