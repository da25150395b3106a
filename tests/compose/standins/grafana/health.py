"""Grafana stand-in: answers GET /api/health on :3000, 404 for anything else."""

import http.server
import json
import signal
import sys


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/api/health"
        body = json.dumps({"database": "ok", "standin": True} if ok else {}).encode()
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


# PID 1 in its container: without a handler SIGTERM is ignored, and `docker stop` would wait
# for its timeout and SIGKILL (the real Grafana stops on SIGTERM).
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
http.server.ThreadingHTTPServer(("0.0.0.0", 3000), Health).serve_forever()
