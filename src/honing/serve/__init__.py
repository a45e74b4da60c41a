"""`honing serve` (issue 20): an OpenAI-compatible HTTP server over honing's engine, with a request
batcher, bearer-token auth off loopback, the raw log store, /health and /metrics."""

from honing.serve.logstore import LogStore, read_records
from honing.serve.server import RunningServer, build_server, serve_forever, start_server

__all__ = ["LogStore", "RunningServer", "build_server", "read_records", "serve_forever", "start_server"]
