"""What the simulator's HTTP servers (the kubelet's, dcgm-exporter's) share: serving on a thread of
their own, stopping promptly, and a `behaviour` that makes them misbehave on purpose."""

import threading
from http.server import ThreadingHTTPServer
from typing import Optional, Tuple

# How often the accept loop looks for stop(): bounds how long stopping takes.
POLL_INTERVAL = 0.1


class ThreadedServer:
    """Subclasses name their BEHAVIOURS and `thread_name`, and pass their server to `_serve`."""

    BEHAVIOURS: Tuple[str, ...] = ("ok",)
    thread_name = "server"

    def __init__(self, behaviour: str = "ok"):
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self.behaviour = behaviour

    @property
    def behaviour(self) -> str:
        return self._behaviour

    @behaviour.setter
    def behaviour(self, value: str) -> None:
        if value not in self.BEHAVIOURS:
            raise ValueError(f"behaviour must be one of {', '.join(self.BEHAVIOURS)}; got {value!r}")
        self._behaviour = value
        self._behaviour_changed(value)

    def _behaviour_changed(self, value: str) -> None:
        """What a subclass does the moment its behaviour is set."""

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError(f"the {self.thread_name} server is not started")
        return self._httpd.server_address[1]

    def _serve(self, httpd: ThreadingHTTPServer) -> None:
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": POLL_INTERVAL},
                                        name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = self._thread = None
