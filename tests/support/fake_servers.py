"""Small stdlib HTTP servers for the eval/bench bad-input tests: a fake SGLang front end and a non-SGLang site."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def sglang_payloads(architecture: str = "KimiK25ForConditionalGeneration", tokens=(1, 2, 3), model_path="/m/tiny"):
    """What SGLang's /model_info, /server_info, /v1/models and /tokenize answer (the fields the evals read)."""
    return {
        ("GET", "/model_info"): {
            "model_path": model_path,
            "served_model_name": model_path,
            "tokenizer_path": model_path,
            "is_generation": True,
            "model_type": "kimi_k25",
            "architectures": [architecture],
        },
        ("GET", "/server_info"): {
            "device": "cpu",
            "dtype": "float32",
            "speculative_algorithm": None,
            "internal_states": [{}],
        },
        ("GET", "/v1/models"): {"data": [{"id": model_path, "max_model_len": 4096}]},
        ("POST", "/tokenize"): {"tokens": list(tokens), "count": len(tokens)},
    }


@contextmanager
def serve(payloads: dict | None, api_key: str | None = None):
    """A server on a free port; ``payloads`` None answers every request with an HTML 404 page; with ``api_key``,
    a request without ``Authorization: Bearer <api_key>`` gets SGLang's HTTP 401."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, content_type: str, data: bytes):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _answer(self, method: str):
            if api_key is not None and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, "application/json", json.dumps({"error": "Unauthorized"}).encode())
                return
            body = None if payloads is None else payloads.get((method, self.path.split("?")[0]))
            if body is None:
                self._send(404, "text/html", b"<html><body><h1>404 Not Found</h1></body></html>")
                return
            self._send(200, "application/json", json.dumps(body).encode())

        def do_GET(self):  # noqa: N802
            self._answer("GET")

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            self.rfile.read(length)
            self._answer("POST")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
