"""A counting reverse proxy in front of an S3 endpoint (LocalStack): every request is forwarded
unchanged and tallied by operation (LIST / GET / HEAD / PUT / DELETE / POST) and by the key
prefix it touched, so a benchmark can state how many S3 requests an invocation made and
whether any of them reached outside the table it was given.

    proxy = CountingProxy("http://127.0.0.1:4566").start()
    ... point AWS_ENDPOINT_URL at proxy.endpoint ...
    proxy.take()  # -> list of (method, op, bucket, key_or_prefix), and resets
"""

import http.client
import http.server
import threading
import urllib.parse


class CountingProxy:
    def __init__(self, upstream):
        u = urllib.parse.urlsplit(upstream)
        self.upstream = (u.hostname, u.port or 80)
        self.lock = threading.Lock()
        self.seen = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunk = self.rfile.read(size)
                        self.rfile.readline()
                        if size == 0:
                            return out
                        out += chunk
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _forward(self):
                body = self._body()
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
                parts = url.path.lstrip("/").split("/", 1)
                bucket, key = parts[0], urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
                if self.command == "GET" and not key and ("list-type" in query or "prefix" in query):
                    op, key = "LIST", query.get("prefix", [""])[0]
                else:
                    op = self.command
                with proxy.lock:
                    proxy.seen.append((self.command, op, bucket, key))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "content-length")}
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=300)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def take(self):
        with self.lock:
            out, self.seen = self.seen, []
        return out

    def stop(self):
        self.server.shutdown()
