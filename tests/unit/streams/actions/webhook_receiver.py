"""A real HTTP webhook receiver on 127.0.0.1 for the action tests: records every POST and answers
with a scripted status per path (e.g. 503 twice, then 200; or always 500)."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    body: dict
    headers: dict[str, str]


class WebhookReceiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.scripts: dict[str, list[int]] = defaultdict(list)  # path -> statuses to answer, in order
        self.always: dict[str, int] = {}  # path -> status answered every time
        self.delay_s = 0.0  # how long each answer takes (a slow gateway), after the request is recorded
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests answered at the same time
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.requests.append(Received(self.path, body, dict(self.headers.items())))
                    script = receiver.scripts.get(self.path)
                    status = script.pop(0) if script else receiver.always.get(self.path, 200)
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                try:
                    time.sleep(receiver.delay_s)
                finally:
                    with receiver._lock:
                        receiver.in_flight -= 1
                payload = json.dumps({"ok": status < 400}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def paths(self) -> list[str]:
        with self._lock:
            return [r.path for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
