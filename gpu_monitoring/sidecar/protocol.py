"""What the sidecar and the check agree on: paths, versions and limits of the unix-socket API."""

API_VERSION = 1
DEFAULT_SOCKET = "/var/run/gpu-monitoring/sidecar.sock"
DEFAULT_JOURNAL = "/var/lib/gpu-monitoring/journal"
SNAPSHOT_PATH = "/v1/snapshot"
EVENTS_PATH = "/v1/events"
HEALTH_PATH = "/healthz"
DEFAULT_EVENTS_LIMIT = 500
MAX_EVENTS_LIMIT = 1000
# The check reads at most this many pages of events per run; the rest wait for the next run.
MAX_EVENT_PAGES_PER_RUN = 20
