"""An OpenAI-compatible chat server on 127.0.0.1 for integration tests: each POST to
/v1/chat/completions is answered by `reply(request)`, which gives the message's content (a
string, or None for a reply with no text) or an HTTP status (an int) to fail with. The last
message of every request is kept in `prompts`."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable


class _Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def do_POST(self):  # noqa: N802 (the stdlib's name)
    request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or "{}")
    self.server.prompts.append((request.get("messages") or [{}])[-1].get("content"))
    content = self.server.reply(request)
    if isinstance(content, int):
      self.send_response(content)
      self.end_headers()
      return
    body = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}]})
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body.encode())


class ChatServer(http.server.ThreadingHTTPServer):
  """Serves in a daemon thread from construction until `close()`."""

  daemon_threads = True

  def __init__(self, reply: Callable[[dict], str | int | None]):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.reply, self.prompts = reply, []
    threading.Thread(target=self.serve_forever, daemon=True).start()

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_port}"

  def close(self) -> None:
    self.shutdown()
    self.server_close()
