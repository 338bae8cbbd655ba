"""End-to-end fixtures: LocalStack S3 + SQS set up through the AWS API as a deployment
would, moto's server for the Glue Data Catalog (LocalStack's free edition has no Glue), the
real function binaries under `cargo lambda watch`, and a driver that plays Lambda's SQS
poller (receive, invoke with a real SQS event, delete per partial-batch response, let
failed messages be redriven to the dead-letter queue)."""

import collections
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = os.environ.get("LOCALSTACK_ENDPOINT", "http://127.0.0.1:4566")
REGION = "us-east-1"
CREDS = dict(aws_access_key_id="test", aws_secret_access_key="test", region_name=REGION)
TIMINGS = []
TABLES = ["seed", "twice", "reverse", "burst", "bad", "csvgz", "hist", "histonly", "cat", "big", "known", "cdf"]
GLUE_DATABASE = "tributary_e2e"
# Glue entries for the table and its history table (the database created on first use).
CATALOG_TABLE = """[table.catalog]
database = "{database}"
create_database = true
[table.history]
target = "s3://{curated}/delta/cat_history"
"""
# A history (SCD type 2) table beside the current table.
HISTORY_TABLE = """[table.history]
target = "s3://{curated}/delta/hist_history"
start_column = "valid_from"
end_column = "valid_to"
current_column = "iscurrent"
"""
# DMS CSV endpoint (DataFormat=csv, CompressionType=GZIP, no header): files are *.csv.gz.
CSV_TABLE = """format = "csv"
[table.csv]
header = false
columns = [
  { name = "update_ts_dms", type = "string" }, { name = "schema_name", type = "string" },
  { name = "table_name", type = "string" }, { name = "trip_id", type = "int32" },
  { name = "tstamp", type = "timestamp_ntz" }, { name = "route_id", type = "string" },
  { name = "destination", type = "string" }, { name = "source_location", type = "string" },
]
"""


def record_timing(scenario, seconds, detail=""):
    TIMINGS.append((scenario, seconds, detail))


def pytest_terminal_summary(terminalreporter):
    if not TIMINGS:
        return
    terminalreporter.section("end-to-end timings (upload of the first file → rows visible)")
    for scenario, seconds, detail in TIMINGS:
        terminalreporter.write_line(f"{scenario:<34} {seconds:7.2f} s  {detail}")
    out = Path(os.environ.get("E2E_TIMINGS", ROOT / "target" / "e2e-timings.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{"scenario": s, "seconds": round(t, 3), "detail": d} for s, t, d in TIMINGS], indent=2))


@pytest.fixture(scope="session")
def aws():
    return SimpleNamespace(
        s3=boto3.client("s3", endpoint_url=ENDPOINT, **CREDS),
        sqs=boto3.client("sqs", endpoint_url=ENDPOINT, **CREDS),
    )


def table_config(raw, curated, name, extra=""):
    return f"""
[[table]]
name = "{name}"
source = "s3://{raw}/dms/{name}/travel_details/"
target = "s3://{curated}/delta/{name}"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
{extra}
"""


@pytest.fixture(scope="session")
def stack(aws):
    run = uuid.uuid4().hex[:8]
    raw, curated = f"tributary-raw-{run}", f"tributary-curated-{run}"
    for b in (raw, curated):
        aws.s3.create_bucket(Bucket=b)
    dlq_url = aws.sqs.create_queue(QueueName=f"tributary-dlq-{run}")["QueueUrl"]
    dlq_arn = aws.sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue_url = aws.sqs.create_queue(
        QueueName=f"tributary-merge-{run}",
        Attributes={
            "VisibilityTimeout": "3",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"}),
        },
    )["QueueUrl"]
    queue_arn = aws.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    aws.sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"},
                       "Action": "sqs:SendMessage", "Resource": queue_arn,
                       "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{raw}"}}}],
    })})
    # One writer per table: notifications under fifo/ go to a standard "route" queue whose
    # messages the merge function forwards to a FIFO queue (table = message group); files it
    # cannot merge are moved to a dead queue at once (TRIBUTARY_DEAD_LETTER_TO).
    attrs = lambda url: aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    route_url = aws.sqs.create_queue(QueueName=f"tributary-route-{run}", Attributes={"VisibilityTimeout": "3"})["QueueUrl"]
    route_arn = attrs(route_url)
    fifo_dlq_url = aws.sqs.create_queue(QueueName=f"tributary-dlq-{run}.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    fifo_url = aws.sqs.create_queue(QueueName=f"tributary-merge-{run}.fifo", Attributes={
        "FifoQueue": "true", "VisibilityTimeout": "3",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": attrs(fifo_dlq_url), "maxReceiveCount": "3"}),
    })["QueueUrl"]
    dead_url = aws.sqs.create_queue(QueueName=f"tributary-dead-{run}")["QueueUrl"]
    aws.sqs.set_queue_attributes(QueueUrl=route_url, Attributes={"Policy": json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"},
                       "Action": "sqs:SendMessage", "Resource": route_arn,
                       "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{raw}"}}}],
    })})
    aws.s3.put_bucket_notification_configuration(Bucket=raw, NotificationConfiguration={
        "QueueConfigurations": [
            {"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*"],
             "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "dms/"}]}}},
            {"QueueArn": route_arn, "Events": ["s3:ObjectCreated:*"],
             "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "fifo/"}]}}},
        ],
    })
    extra = {"csvgz": CSV_TABLE, "hist": HISTORY_TABLE.format(curated=curated),
             "histonly": HISTORY_TABLE.format(curated=curated).replace("hist_history", "histonly_history"),
             "cat": CATALOG_TABLE.format(curated=curated, database=GLUE_DATABASE),
             "burst": f'[table.catalog]\ndatabase = "{GLUE_DATABASE}"\ncreate_database = true\n',
             # large files: merged in slices of 50k rows (and, with TRIBUTARY_SPILL_MB=0.4 below,
             # streamed to a temporary file instead of memory)
             "big": "slice_rows = 50000\n",
             "cdf": "change_data_feed = true\n",
             # the smaller file settings, read back by Python deltalake (pyarrow) below
             "reverse": 'parquet_compression = "zstd"\norder_key_encoding = "delta"\n'}
    config = "".join(table_config(raw, curated, t, extra.get(t, "")) for t in TABLES)
    # "histonly" keeps only its history table: no `target`.
    config = config.replace(f'target = "s3://{curated}/delta/histonly"\n', "")
    config += table_config(raw, curated, "serial").replace(f"s3://{raw}/dms/serial/", f"s3://{raw}/fifo/serial/")
    aws.s3.put_object(Bucket=curated, Key="config/tributary.toml", Body=config.encode())
    return SimpleNamespace(raw=raw, curated=curated, queue_url=queue_url, queue_arn=queue_arn,
                           dlq_url=dlq_url, config=f"s3://{curated}/config/tributary.toml",
                           route_url=route_url, route_arn=route_arn, fifo_url=fifo_url,
                           fifo_arn=attrs(fifo_url), fifo_dlq_url=fifo_dlq_url, dead_url=dead_url)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GlueProxy:
    """A TCP proxy between the functions and the Glue emulator: counts the Glue API calls
    that pass (by their `X-Amz-Target` header, independently of tributary's own count) and
    can play an outage (every connection cut)."""

    TARGET = re.compile(rb"x-amz-target:\s*awsglue\.(\w+)", re.I)

    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.calls = collections.Counter()
        self.down = False
        self.conns = []
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def total(self):
        with self.lock:
            return sum(self.calls.values())

    def set_down(self, down):
        with self.lock:
            self.down = down
            if down:
                for c in self.conns:
                    try:
                        c.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                self.conns.clear()

    def _accept(self):
        while True:
            client, _ = self.server.accept()
            with self.lock:
                if self.down:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self.upstream)
                except OSError:
                    client.close()
                    continue
                self.conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src, dst, count):
        tail = b""
        try:
            while data := src.recv(65536):
                if count:
                    buf = tail + data
                    end = 0
                    for m in self.TARGET.finditer(buf):
                        with self.lock:
                            self.calls[m.group(1).decode()] += 1
                        end = m.end()
                    tail = buf[max(end, len(buf) - 200):]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture(scope="session")
def glue():
    """moto's server (Glue) on a free port, behind a GlueProxy; `client` talks to moto
    directly (its calls are not counted)."""
    exe = shutil.which("moto_server")
    assert exe, "moto_server not found: scripts/e2e installs it (tests/e2e/requirements.txt)"
    port = free_port()
    (ROOT / "target").mkdir(exist_ok=True)
    log = open(ROOT / "target" / "e2e-moto.log", "w")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).read()
            break
        except Exception:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"moto_server did not start; see {log.name}")
            time.sleep(0.3)
    proxy = GlueProxy(port)
    yield SimpleNamespace(
        client=boto3.client("glue", endpoint_url=f"http://127.0.0.1:{port}", **CREDS),
        proxy=proxy, endpoint=f"http://127.0.0.1:{proxy.port}", database=GLUE_DATABASE)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)
    log.close()


class Functions:
    """The function binaries under `cargo lambda watch` (its Lambda runtime API emulator)."""

    def __init__(self, stack, glue, environment=None, log="e2e-cargo-lambda.log", release=False, concurrency=8):
        """`environment` (a dict): the functions' environment instead of the one for `stack`
        (passed in a file: values may contain commas)."""
        self.port = free_port()
        env = dict(os.environ)
        env_vars = "" if environment is not None else ",".join([
            f"AWS_ENDPOINT_URL={ENDPOINT}", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
            f"AWS_REGION={REGION}", f"TRIBUTARY_CONFIG={stack.config}",
            f"AWS_ENDPOINT_URL_GLUE={glue.endpoint}", "TRIBUTARY_SPILL_MB=0.4",
            f"TRIBUTARY_ROUTE_TO={stack.fifo_url}", f"TRIBUTARY_ROUTE_FROM={stack.route_arn}",
            f"TRIBUTARY_DEAD_LETTER_TO={stack.dead_url}",
            # configuration uploads in force at the next invocation (test_reload.py)
            "TRIBUTARY_CONFIG_CHECK_SECONDS=0",
            # retryable failures retried after 1, 3, 9 s (the queues' timeout is 3 s): the
            # tests that wait for redeliveries and dead-lettering keep their pace
            "TRIBUTARY_RETRY_BASE_SECONDS=1",
        ])
        (ROOT / "target").mkdir(exist_ok=True)
        self.log = open(ROOT / "target" / log, "w")
        env_args = ["--env-var", env_vars]
        if environment is not None:
            env_file = ROOT / "target" / (log + ".env")
            quoted = {k: '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for k, v in environment.items()}
            env_file.write_text("".join(f"{k}={v}\n" for k, v in quoted.items()))
            env_args = ["--env-file", str(env_file)]
        self.proc = subprocess.Popen(
            ["cargo", "lambda", "watch", "--ignore-changes", "-A", "127.0.0.1", "-P", str(self.port),
             "--concurrency", str(concurrency), *(["--release"] if release else []), *env_args],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"cargo lambda watch exited; see {self.log.name}")
                time.sleep(0.5)
        raise RuntimeError("cargo lambda watch did not start listening")

    def invoke(self, function, event, timeout=600):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/2015-03-31/functions/{function}/invocations",
            data=json.dumps(event).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read()
                error = resp.headers.get("X-Amz-Function-Error")
        except urllib.error.HTTPError as e:  # cargo lambda answers a function error with 500
            body, error = e.read(), "Unhandled"
        payload = json.loads(body) if body else None
        return payload, error

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except Exception:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture(scope="session")
def functions(stack, glue):
    f = Functions(stack, glue)
    # First invocations start (and if needed build) the functions.
    payload, error = f.invoke("tributary-merge", {"Records": []})
    assert error is None, payload
    yield f
    f.stop()


class Poller:
    """Plays Lambda's SQS event source mapping with ReportBatchItemFailures."""

    def __init__(self, aws, stack, functions, queue_url=None, queue_arn=None):
        self.aws, self.stack, self.functions = aws, stack, functions
        self.queue_url = queue_url or stack.queue_url
        self.queue_arn = queue_arn or stack.queue_arn
        self.invocations = 0

    def receive(self, max_messages=10, wait=1):
        r = self.aws.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=max_messages, WaitTimeSeconds=wait,
            AttributeNames=["All"])
        return r.get("Messages", [])

    def event(self, messages):
        return {"Records": [{
            "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
            "attributes": m.get("Attributes", {}), "messageAttributes": {},
            "md5OfBody": m["MD5OfBody"], "eventSource": "aws:sqs",
            "eventSourceARN": self.queue_arn, "awsRegion": REGION,
        } for m in messages]}

    def deliver(self, messages, times=1):
        """Invoke with these messages (`times` times), delete those not reported failed."""
        failed = set()
        for _ in range(times):
            payload, error = self.functions.invoke("tributary-merge", self.event(messages))
            self.invocations += 1
            if error:  # the whole batch failed: nothing is deleted
                return {m["MessageId"] for m in messages}
            failed |= {f["itemIdentifier"] for f in payload.get("batchItemFailures", [])}
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            self.aws.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)])
        return failed

    def run_until(self, condition, timeout=180, times=1, batch=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            messages = self.receive(batch)
            if messages:
                self.deliver(messages, times)
            elif condition():
                return True
        return condition()

    def deliver_concurrently(self, messages, workers, per_invocation):
        chunks = [messages[i:i + per_invocation] for i in range(0, len(messages), per_invocation)]
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            failed = set().union(*pool.map(self.deliver, chunks))
        return failed


@pytest.fixture(scope="session")
def poller(aws, stack, functions):
    return Poller(aws, stack, functions)


def storage_options():
    return {"AWS_ENDPOINT_URL": ENDPOINT, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": REGION}


def read_table(stack, name):
    """The curated table read back from S3 by another Delta reader (Python deltalake)."""
    try:
        dt = DeltaTable(f"s3://{stack.curated}/delta/{name}", storage_options=storage_options())
    except Exception:
        return None, {}
    t = dt.to_pyarrow_table(columns=["trip_id", "route_id", "destination", "source_location"]).to_pylist()
    return dt, {r["trip_id"]: (r["route_id"], r["destination"], r["source_location"]) for r in t}


def duckdb_reads(aws, stack, name, expected, tmp):
    """The curated table as DuckDB's delta extension reads it (readers.py: no code shared
    with delta-rs), downloaded from the emulator: every row, and every key found by a
    filter on it (file skipping by the log's statistics). `None` when it agrees, else why."""
    from readers import connect, rows
    root = Path(tmp) / name
    prefix = f"delta/{name}/"
    for page in aws.s3.get_paginator("list_objects_v2").paginate(Bucket=stack.curated, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if rel.startswith(("_symlink_format_manifest/", "_tributary_")):
                continue
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            aws.s3.download_file(stack.curated, obj["Key"], str(dest))
    con = connect()
    got = {r[0]: tuple(r[1:]) for r in rows(con, root, "trip_id, route_id, destination, source_location")}
    if got != expected:
        return f"DuckDB reads {len(got)} rows, the source has {len(expected)}; " \
               f"missing {len(set(expected) - set(got))}, extra {len(set(got) - set(expected))}"
    keys = sorted(expected)
    for k in keys[:: max(1, len(keys) // 25)] + keys[-1:]:
        found = rows(con, root, "trip_id", f"trip_id = {k}")
        if found != [(k,)]:
            return f"DuckDB's filter trip_id = {k} finds {found}"
    return None


def read_history(stack, name):
    """The history table read back by another Delta reader: (trip_id, destination, valid_from,
    valid_to, iscurrent) rows, times as ISO text."""
    try:
        dt = DeltaTable(f"s3://{stack.curated}/delta/{name}_history", storage_options=storage_options())
    except Exception:
        return []
    rows = dt.to_pyarrow_table(columns=["trip_id", "destination", "valid_from", "valid_to", "iscurrent"]).to_pylist()
    iso = lambda t: None if t is None else t.strftime("%Y-%m-%d %H:%M:%S.%f")
    return sorted((r["trip_id"], r["destination"], iso(r["valid_from"]), iso(r["valid_to"]), r["iscurrent"]) for r in rows)


def catalog_partitions(glue, name):
    """The partition values registered for a Glue entry."""
    pages = glue.client.get_paginator("get_partitions").paginate(DatabaseName=glue.database, TableName=name)
    return {tuple(p["Values"]) for page in pages for p in page["Partitions"]}


def manifests_exact(aws, stack, name):
    """Every manifest lists exactly the live files of its partition; none for empty ones."""
    dt, _ = read_table(stack, name)
    live = set(dt.file_uris())
    prefix = f"delta/{name}/_symlink_format_manifest/"
    listed = set()
    pages = aws.s3.get_paginator("list_objects_v2").paginate(Bucket=stack.curated, Prefix=prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            partition = obj["Key"][len(prefix):].rsplit("/", 1)[0]
            body = aws.s3.get_object(Bucket=stack.curated, Key=obj["Key"])["Body"].read().decode()
            uris = [u for u in body.splitlines() if u]
            if not uris:
                return False, f"empty manifest {obj['Key']}"
            for u in uris:
                if f"/{partition}/" not in u:
                    return False, f"{u} listed under {partition}"
            listed |= set(uris)
    return listed == live, f"manifests {len(listed)} files, table {len(live)} files"
