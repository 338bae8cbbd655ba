#!/usr/bin/env python3
"""Measure a function binary's cold start the way Lambda sees it: a minimal Lambda Runtime
API on loopback, the binary started with AWS_LAMBDA_RUNTIME_API pointing at it, the time
from exec to its first `GET /runtime/invocation/next` (init), then one invocation with the
given event (first-invocation duration). Repeats and reports the median.

usage: lambda_init.py BINARY EVENT_JSON [--runs N] [--env K=V ...]
"""
import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
import time


def measure(binary, event, env):
    marks = {}
    done = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.endswith("/runtime/invocation/next"):
                if "init" not in marks:
                    marks["init"] = time.perf_counter()
                    body = json.dumps(event).encode()
                    self.send_response(200)
                    self.send_header("Lambda-Runtime-Aws-Request-Id", "bench-1")
                    self.send_header("Lambda-Runtime-Deadline-Ms", str(int(time.time() * 1000) + 900_000))
                    self.send_header("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:bench")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    marks["sent"] = time.perf_counter()
                else:
                    done.wait(5)  # hold the second poll until we stop
                    self.send_response(500)
                    self.end_headers()

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            marks["response"] = self.rfile.read(length).decode()
            marks["done"] = time.perf_counter()
            marks["error"] = "/error" in self.path
            self.send_response(202)
            self.end_headers()
            done.set()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    full_env = dict(os.environ, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{server.server_address[1]}",
                    AWS_LAMBDA_FUNCTION_NAME="bench", AWS_LAMBDA_FUNCTION_MEMORY_SIZE="2048",
                    AWS_LAMBDA_FUNCTION_VERSION="$LATEST", **env)
    start = time.perf_counter()
    proc = subprocess.Popen([binary], env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ok = done.wait(300)
    proc.kill()
    proc.wait()
    server.shutdown()
    if not ok or "init" not in marks:
        raise RuntimeError("the function did not complete an invocation")
    return (marks["init"] - start) * 1000, (marks["done"] - marks["sent"]) * 1000, marks["error"], marks["response"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("event")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--env", action="append", default=[])
    a = ap.parse_args()
    env = dict(kv.split("=", 1) for kv in a.env)
    event = json.load(open(a.event))
    inits, firsts = [], []
    for _ in range(a.runs):
        init, first, error, response = measure(a.binary, event, env)
        if error:
            print(f"invocation failed: {response}", file=sys.stderr)
            sys.exit(1)
        inits.append(init)
        firsts.append(first)
    print(json.dumps({"binary": a.binary, "runs": a.runs,
                      "init_ms_median": round(statistics.median(inits), 1),
                      "init_ms": [round(x, 1) for x in inits],
                      "first_invocation_ms_median": round(statistics.median(firsts), 1),
                      "last_response": response[:200]}))


if __name__ == "__main__":
    main()
