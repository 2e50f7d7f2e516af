"""An ASGI app served by a real uvicorn on a free loopback port, in a thread, for the gateway tests
(the fake upstream engine and the gateway itself are served the same way)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

import uvicorn


class ServedApp:
    """``with ServedApp(app) as served: served.url`` — started on enter, stopped on exit."""

    def __init__(self, app: object, what: str = "app") -> None:
        self.what = what
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError(f"{self.what} did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


__all__ = ["ServedApp"]
