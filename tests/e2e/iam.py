"""Permissions proven against the functions' real calls (LocalStack and moto enforce no IAM).

`Recorder` is an HTTP proxy between a function binary and an emulator: it forwards every
request and records it with its response status. `iam_requests` turns each recorded request
into what AWS authorises for it — the IAM action, the resource ARN(s) and the condition keys
the request carries (`s3:prefix` of a listing…) — plus what S3 checks besides: a read of a
missing key is answered 404 (the function's "not found") only to a principal allowed to list
that key (`s3:ListBucket` with the key as `s3:prefix`), otherwise 403 ("permission denied").
A request of a kind not mapped here fails the test, so that a new call is never waved
through. `evaluate` runs the requests through @cloud-copilot/iam-simulate (tests/e2e/iam/,
installed by scripts/e2e): AWS's evaluation logic (explicit denies, identity and resource
policies, every condition operator), with actions, ARNs and condition keys checked against
AWS's IAM reference data — not a matcher of ours that could share our mistakes.

`role_policies` gives a role's policies as template.yaml makes them, resolved for a deployed
stack (template_stack.Resolver), with the AWS managed policies SAM attaches."""

import collections
import http.client
import json
import re
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

ROOT = Path(__file__).resolve().parents[2]
SIMULATOR = ROOT / "tests" / "e2e" / "iam"

# The AWS managed policies SAM attaches (documents as AWS publishes them).
MANAGED = {
    "AWSLambdaBasicExecutionRole": [
        {"Effect": "Allow", "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": "*"}],
    "AWSLambdaSQSQueueExecutionRole": [
        {"Effect": "Allow", "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes",
                                       "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": "*"}],
}

Call = collections.namedtuple("Call", "service method path query headers body status")


class Recorder:
    """An HTTP proxy to `upstream` (http://host:port) that records every request."""

    def __init__(self, upstream):
        target = urlparse(upstream)
        self.calls, self.lock = [], threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self):
                body = self._body()
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length")}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=300)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                scope = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", self.headers.get("Authorization", ""))
                url = urlparse(self.path)
                with recorder.lock:
                    recorder.calls.append(Call(scope.group(1) if scope else "?", self.command, url.path,
                                               parse_qs(url.query, keep_blank_values=True),
                                               {k.lower(): v for k, v in self.headers.items()}, body, resp.status))
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("connection", "transfer-encoding", "keep-alive"):
                        continue
                    if k.lower() == "content-length" and self.command != "HEAD":
                        continue
                    self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self):
        with self.lock:
            calls, self.calls = self.calls, []
        return calls

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Unmapped(AssertionError):
    pass


def _s3(call, region, account):
    parts = unquote(call.path).lstrip("/").split("/", 1)
    bucket, key = parts[0], (parts[1] if len(parts) > 1 else "")
    q, m = call.query, call.method
    ctx = {"aws:SecureTransport": "true"}  # a function calls AWS over HTTPS
    bucket_arn, object_arn = f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/{key}"
    if not key:
        if m == "GET" and "location" in q:
            return [("s3:GetBucketLocation", bucket_arn, ctx)]
        if m == "GET" and not set(q) - {"list-type", "prefix", "delimiter", "max-keys", "continuation-token",
                                         "start-after", "encoding-type", "fetch-owner", "marker"}:
            listing = dict(ctx)
            for k in ("prefix", "delimiter", "max-keys"):
                if k in q:
                    listing[f"s3:{k}"] = q[k][0]
            return [("s3:ListBucket", bucket_arn, listing)]
        if m == "HEAD" and not q:
            return [("s3:ListBucket", bucket_arn, ctx)]
        if m == "POST" and "delete" in q:  # DeleteObjects: each key is a DeleteObject
            keys = [e.text for e in ET.fromstring(call.body).iter() if e.tag.endswith("Key")]
            return [("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{k}", ctx) for k in keys]
    else:
        if m in ("GET", "HEAD") and not set(q) - {"partNumber", "versionId"}:
            out = [("s3:GetObject", object_arn, ctx)]
            if call.status == 404:  # what S3 checks before it says "not found"
                out.append(("s3:ListBucket", bucket_arn, dict(ctx, **{"s3:prefix": key})))
            return out
        if m == "PUT" and (not q or set(q) == {"partNumber", "uploadId"}):
            out = [("s3:PutObject", object_arn, ctx)]
            if "x-amz-copy-source" in call.headers:
                out.append(("s3:GetObject", "arn:aws:s3:::" + unquote(call.headers["x-amz-copy-source"]).lstrip("/"), ctx))
            return out
        if m == "POST" and ("uploads" in q or "uploadId" in q):
            return [("s3:PutObject", object_arn, ctx)]
        if m == "DELETE" and "uploadId" in q:
            return [("s3:AbortMultipartUpload", object_arn, ctx)]
        if m == "DELETE" and not q:
            return [("s3:DeleteObject", object_arn, ctx)]
    raise Unmapped(f"S3 request not mapped to IAM: {m} {call.path} {q}")


SQS_ACTIONS = {"SendMessage": "SendMessage", "SendMessageBatch": "SendMessage", "ReceiveMessage": "ReceiveMessage",
               "DeleteMessage": "DeleteMessage", "DeleteMessageBatch": "DeleteMessage",
               "ChangeMessageVisibility": "ChangeMessageVisibility",
               "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
               "GetQueueAttributes": "GetQueueAttributes", "GetQueueUrl": "GetQueueUrl"}


def queue_arn(url, region, account):
    path = urlparse(url).path.strip("/").split("/")
    return f"arn:aws:sqs:{region}:{path[-2] if len(path) > 1 else account}:{path[-1]}"


def _sqs(call, region, account):
    target = call.headers.get("x-amz-target", "")
    op = target.split(".", 1)[1] if target.startswith("AmazonSQS.") else None
    if op in SQS_ACTIONS:
        body = json.loads(call.body or b"{}")
        return [(f"sqs:{SQS_ACTIONS[op]}", queue_arn(body["QueueUrl"], region, account), {"aws:SecureTransport": "true"})]
    raise Unmapped(f"SQS request not mapped to IAM: {target or call.path}")


# Data Catalog operations are authorised on the catalog, the database and the table
# (AWS Glue, "Specifying AWS Glue resource ARNs").
GLUE = {"CreateDatabase": ("DatabaseInput.Name", None), "GetTable": ("DatabaseName", "Name"),
        "CreateTable": ("DatabaseName", "TableInput.Name"), "UpdateTable": ("DatabaseName", "TableInput.Name"),
        "GetPartitions": ("DatabaseName", "TableName"), "BatchCreatePartition": ("DatabaseName", "TableName"),
        "BatchDeletePartition": ("DatabaseName", "TableName"),
        "BatchUpdatePartition": ("DatabaseName", "TableName")}


def _glue(call, region, account):
    target = call.headers.get("x-amz-target", "")
    op = target.split(".", 1)[1] if target.startswith("AWSGlue.") else None
    if op not in GLUE:
        raise Unmapped(f"Glue request not mapped to IAM: {target or call.path}")
    body = json.loads(call.body or b"{}")

    def field(path):
        v = body
        for p in path.split("."):
            v = v[p]
        return v
    db_field, table_field = GLUE[op]
    db = field(db_field)
    base = f"arn:aws:glue:{region}:{account}"
    resources = [f"{base}:catalog", f"{base}:database/{db}"]
    if table_field:
        resources.append(f"{base}:table/{db}/{field(table_field)}")
    ctx = {"aws:SecureTransport": "true"}
    return [(f"glue:{op}", r, ctx) for r in resources]


def iam_requests(calls, region, account):
    """(action, resource, context, origin) for every recorded call."""
    out = []
    for c in calls:
        mapper = {"s3": _s3, "sqs": _sqs, "glue": _glue}.get(c.service)
        if mapper is None:
            raise Unmapped(f"a call to an unexpected service ({c.service}): {c.method} {c.path}")
        origin = f"{c.method} {c.path} -> {c.status}" + (f" ({c.headers['x-amz-target']})" if "x-amz-target" in c.headers else "")
        out += [(a, r, ctx, origin) for a, r, ctx in mapper(c, region, account)]
    return out


def role_policies(resolve, role):
    """The role's policies as the transformed template gives them, resolved for the stack:
    [{"name", "policy"}] (inline, customer managed ones of the template, AWS managed)."""
    props = resolve.t["Resources"][role]["Properties"]
    out = [{"name": p["PolicyName"], "policy": resolve.value(p["PolicyDocument"])} for p in props.get("Policies", [])]
    for arn in props.get("ManagedPolicyArns", []):
        if isinstance(arn, dict) and set(arn) == {"Ref"} and arn["Ref"] in resolve.t["Resources"]:
            doc = resolve.t["Resources"][arn["Ref"]]["Properties"]["PolicyDocument"]
            out.append({"name": arn["Ref"], "policy": resolve.value(doc)})
            continue
        name = resolve.value(arn).rsplit("/", 1)[1]
        out.append({"name": name, "policy": {"Version": "2012-10-17", "Statement": MANAGED[name]}})
    for p in out:  # what Fn::If / AWS::NoValue leave out
        p["policy"]["Statement"] = [s for s in p["policy"]["Statement"] if s is not None]
    return out


def simulator_ready():
    """The evaluator's node modules (scripts/e2e installs them)."""
    assert shutil.which("node"), "node is needed for the permission test (tests/e2e/iam/)"
    assert (SIMULATOR / "node_modules" / "@cloud-copilot" / "iam-simulate").is_dir(), \
        "tests/e2e/iam/node_modules missing: run scripts/e2e (it runs npm ci there)"


def evaluate(requests):
    """Decisions for [{principal, action, resource, account, context, identityPolicies,
    resourcePolicy?}]: [{"result", "allowedBy"}], in order."""
    simulator_ready()
    out = subprocess.run(["node", str(SIMULATOR / "simulate.mjs")], input=json.dumps({"requests": requests}),
                         capture_output=True, text=True, check=False, cwd=SIMULATOR, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)
