"""A counting reverse proxy in front of an S3 endpoint (LocalStack): every request is forwarded
unchanged (tests/e2e/iam.py's recording proxy) and tallied by operation (LIST / GET / HEAD /
PUT / DELETE / POST) and by the key prefix it touched, so a benchmark can state how many S3
requests an invocation made and whether any of them reached outside the table it was given.

    proxy = CountingProxy("http://127.0.0.1:4566").start()
    ... point AWS_ENDPOINT_URL at proxy.endpoint ...
    proxy.take()  # -> list of (method, op, bucket, key_or_prefix), and resets
"""

import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from iam import Recorder  # noqa: E402


class CountingProxy(Recorder):
    def start(self):
        return self  # (serving since it was made)

    def take(self):
        out = []
        for c in super().take():
            parts = c.path.lstrip("/").split("/", 1)
            bucket, key = parts[0], urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
            if c.method == "GET" and not key and ("list-type" in c.query or "prefix" in c.query):
                op, key = "LIST", c.query.get("prefix", [""])[0]
            else:
                op = c.method
            out.append((c.method, op, bucket, key))
        return out
