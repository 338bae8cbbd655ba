"""The pipeline on the resources as template.yaml defines them: the template (SAM
transform, minus the functions and what exists only around them: template_stack.py) is
deployed to LocalStack's CloudFormation twice, side by side; DMS files land in the bucket
it made, its S3 notification configuration sends them to its queue, the function binaries
run with the environment the template gives them (resolved from the deployed stack:
queues, FIFO queue, dead-letter queue, configuration location), forward through its FIFO
queue, merge, and move an unreadable file to its dead-letter queue. The second stack, on
the first one's bucket, gets its files through its EventBridge rule. A change to the
template's queues, notifications, rule, outputs or function environment changes what this
test runs against.

Permissions: every request the function binaries send in these scenarios — merges through
both queues, the catalog, a file moved to the dead-letter queue, a file gone before its
merge, maintenance, a DMS reload — is recorded on its way to the emulators and evaluated
against the role template.yaml gives that function (iam.py), with what Lambda, its pollers
and the state machine do with the roles besides; calls that must be refused are; and every
action a role's statements grant is used by some call."""

import datetime
import json
import time
import uuid
from types import SimpleNamespace
from urllib.parse import urlparse

import decimal

import boto3
import dms
import iam
import pyarrow as pa
import pytest
import template_stack
from conftest import CREDS, ENDPOINT, REGION, Functions, Poller, read_table, record_timing, table_config
from test_catalog import with_column

GLUE_DB = "tributary_e2e_tmpl"
CONSUMER = "111111111111"


@pytest.fixture(scope="module")
def stacks(aws):
    """Two stacks of template.yaml side by side: the first creates its buckets; the second
    (an upper-case, long name) uses the first's raw bucket — the existing-bucket variant, an
    EventBridge rule instead of S3 notifications — and keeps its tables under delta/."""
    run = uuid.uuid4().hex[:6]
    creds = {k: v for k, v in CREDS.items() if k != "region_name"}
    start = time.time()
    out, res, resolve = template_stack.deploy(ENDPOINT, creds, REGION, f"tributary-e2e-{run}",
                                              {"GlueDatabase": GLUE_DB})
    out2, res2, resolve2 = template_stack.deploy(ENDPOINT, creds, REGION, f"Tributary-E2E-{run}-Second-Stack-With-A-Long-Name",
                                                 {"RawBucketName": out["RawBucket"], "TablesPrefix": "delta/",
                                                  "ConsumerAccountIds": CONSUMER})
    record_timing("template: two stacks created", time.time() - start, f"{len(res)} + {len(res2)} resources")
    # "Send notifications to Amazon EventBridge" on the existing bucket, as the template's
    # parameter description asks (keeping the first stack's queue notifications).
    notifications = aws.s3.get_bucket_notification_configuration(Bucket=out["RawBucket"])
    notifications.pop("ResponseMetadata", None)
    notifications["EventBridgeConfiguration"] = {}
    aws.s3.put_bucket_notification_configuration(Bucket=out["RawBucket"], NotificationConfiguration=notifications)
    return SimpleNamespace(out=out, res=res, resolve=resolve, out2=out2, res2=res2, resolve2=resolve2)


class Recorded:
    """The binaries of one function (its environment from the template) behind their own
    recording proxies (iam.Recorder) to LocalStack and to moto's Glue."""

    def __init__(self, resolve, function, log, glue=None):
        self.function = function
        self.recorders = [iam.Recorder(ENDPOINT)] + ([iam.Recorder(glue.client.meta.endpoint_url)] if glue else [])
        environment = resolve.environment(function)
        environment.update(AWS_ENDPOINT_URL=self.recorders[0].endpoint, AWS_ACCESS_KEY_ID="test",
                           AWS_SECRET_ACCESS_KEY="test", AWS_REGION=REGION,
                           # the configuration's ETag checked at every invocation (its HEAD recorded)
                           TRIBUTARY_CONFIG_CHECK_SECONDS="0",
                           # a retryable failure retried a second later (backed_off)
                           TRIBUTARY_RETRY_BASE_SECONDS="1")
        if glue:
            environment["AWS_ENDPOINT_URL_GLUE"] = self.recorders[1].endpoint
        self.environment = environment
        self.functions = Functions(None, None, environment=environment, log=log)

    def calls(self):
        return [c for r in self.recorders for c in r.take()]

    def stop(self):
        self.functions.stop()
        for r in self.recorders:
            r.stop()


def upload_config(aws, out, table, extra=""):
    """A configuration with `table`, where the stack's outputs say."""
    location = urlparse(out["ConfigLocation"])
    aws.s3.put_object(Bucket=location.netloc, Key=location.path.lstrip("/"),
                      Body=table_config(out["RawBucket"], out["CuratedBucket"], table, extra).encode())


def run_functions(aws, out, resolve, table, log, glue=None, extra=""):
    """Upload a configuration with `table` and start the merge function's binaries with the
    environment the template gives them, behind recording proxies."""
    upload_config(aws, out, table, extra)
    merge = Recorded(resolve, "MergeFunction", log, glue)
    assert merge.environment["TRIBUTARY_CONFIG"] == out["ConfigLocation"]
    assert merge.environment["TRIBUTARY_ROUTE_TO"] == out["TableQueueUrl"], merge.environment
    return merge


def drain(aws, out, resolve, functions, table, source, files, bad_keys=(), timeout=180):
    """Play Lambda's pollers on the stack's queue and FIFO queue until the table equals the
    source (and the bad files reached the dead-letter queue); returns the seconds taken and
    the keys dead-lettered."""
    route = Poller(aws, None, functions.functions, out["MergeQueueUrl"], out["MergeQueueArn"])
    fifo = Poller(aws, None, functions.functions, out["TableQueueUrl"], resolve.arn("TableQueue"))
    stack = SimpleNamespace(curated=out["CuratedBucket"])
    dead = []
    start = time.time()
    deadline = start + timeout
    while time.time() < deadline:
        moved = 0
        for poller in (route, fifo):
            messages = poller.receive(10, wait=0)
            if messages:
                poller.deliver(messages)
                moved += len(messages)
        for m in aws.sqs.receive_message(QueueUrl=out["DeadLetterQueueUrl"], MaxNumberOfMessages=10,
                                         WaitTimeSeconds=0).get("Messages", []):
            body = json.loads(m["Body"])  # (a moved message announces all its failed files)
            dead += [r["s3"]["object"]["key"] for r in body["Records"]] if "Records" in body else [body["detail"]["object"]["key"]]
            aws.sqs.delete_message(QueueUrl=out["DeadLetterQueueUrl"], ReceiptHandle=m["ReceiptHandle"])
        if not moved and set(bad_keys) <= set(dead) and read_table(stack, table)[1] == source.state():
            break
        if not moved:
            time.sleep(0.5)
    _, got = read_table(stack, table)
    assert got == source.state(), f"table has {len(got)} rows, source {len(source.state())}"
    return time.time() - start, sorted(dead)


def backed_off(aws, out, resolve, merge, prefix):
    """Upload a configuration that does not load and a file under `prefix` that no table of
    the one in force owns: its FIFO message fails retryably and is backed off with
    ChangeMessageVisibilityBatch on the table queue (its receipt handle, the delay of a first
    receive: TRIBUTARY_RETRY_BASE_SECONDS, 1 here); then the configuration is restored and
    the message, received again a second later, is done (the file is ignored). Returns the
    merge function's calls."""
    location = urlparse(out["ConfigLocation"])
    good = aws.s3.get_object(Bucket=location.netloc, Key=location.path.lstrip("/"))["Body"].read()
    aws.s3.put_object(Bucket=location.netloc, Key=location.path.lstrip("/"), Body=good + b"\n[[table]]\nname = 3\n")
    route = Poller(aws, None, merge.functions, out["MergeQueueUrl"], out["MergeQueueArn"])
    fifo = Poller(aws, None, merge.functions, out["TableQueueUrl"], resolve.arn("TableQueue"))
    aws.s3.put_object(Bucket=out["RawBucket"], Key=prefix + "LOAD00000001.parquet", Body=b"unread")
    calls, failed, deadline = [], [], time.time() + 60
    while not failed and time.time() < deadline:
        messages = route.receive(10, wait=0)
        if messages:
            route.deliver(messages)
        messages = fifo.receive(10, wait=1)
        if messages:
            failed = [m for m in messages if m["MessageId"] in fifo.deliver(messages)]
    calls += merge.calls()
    assert failed, "the file's FIFO message did not fail"
    changes = [json.loads(c.body) for c in calls if c.service == "sqs"
               and c.headers.get("x-amz-target") == "AmazonSQS.ChangeMessageVisibilityBatch"]
    entries = [e for c in changes for e in c["Entries"]]
    assert [urlparse(c["QueueUrl"]).path for c in changes] == [urlparse(out["TableQueueUrl"]).path], changes
    assert [(e["ReceiptHandle"], e["VisibilityTimeout"]) for e in entries] == [(failed[0]["ReceiptHandle"], 1)], entries
    assert merge.environment["TRIBUTARY_RETRY_BASE_SECONDS"] == "1"
    aws.s3.put_object(Bucket=location.netloc, Key=location.path.lstrip("/"), Body=good)
    deadline = time.time() + 60
    while time.time() < deadline:
        messages = fifo.receive(10, wait=1)
        if messages and not fifo.deliver(messages):
            break
    else:
        raise AssertionError("the backed-off message did not come back within a minute")
    return calls + merge.calls()


def forward_backed_off(aws, out, resolve, merge, key, body):
    """A merge-queue message whose forwarding to the FIFO queue fails is backed off on the
    merge queue (ChangeMessageVisibilityBatch there, the delay of a first receive): the FIFO
    queue is taken away (SendMessageBatch fails: no such queue), then made again with the
    same name and attributes, and the message forwarded and merged. Returns the merge
    function's calls."""
    read_only = {"QueueArn", "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp", "LastModifiedTimestamp"}
    attrs = aws.sqs.get_queue_attributes(QueueUrl=out["TableQueueUrl"], AttributeNames=["All"])["Attributes"]
    name = urlparse(out["TableQueueUrl"]).path.rsplit("/", 1)[-1]
    aws.sqs.delete_queue(QueueUrl=out["TableQueueUrl"])
    route = Poller(aws, None, merge.functions, out["MergeQueueUrl"], out["MergeQueueArn"])
    fifo = Poller(aws, None, merge.functions, out["TableQueueUrl"], resolve.arn("TableQueue"))
    try:
        aws.s3.put_object(Bucket=out["RawBucket"], Key=key, Body=body)
        failed, deadline = [], time.time() + 60
        while not failed and time.time() < deadline:
            messages = route.receive(10, wait=1)
            if messages:
                failed = [m for m in messages if m["MessageId"] in route.deliver(messages)]
        assert failed, "the forwarding did not fail"
    finally:
        url = aws.sqs.create_queue(QueueName=name, Attributes={k: v for k, v in attrs.items() if k not in read_only})["QueueUrl"]
        assert urlparse(url).path == urlparse(out["TableQueueUrl"]).path, url
    calls = merge.calls()
    changes = [json.loads(c.body) for c in calls if c.service == "sqs"
               and c.headers.get("x-amz-target") == "AmazonSQS.ChangeMessageVisibilityBatch"]
    entries = [e for c in changes for e in c["Entries"]]
    assert [urlparse(c["QueueUrl"]).path for c in changes] == [urlparse(out["MergeQueueUrl"]).path], changes
    assert [(e["ReceiptHandle"], e["VisibilityTimeout"]) for e in entries] == [(failed[0]["ReceiptHandle"], 1)], entries
    deadline, merged = time.time() + 60, False
    while not merged and time.time() < deadline:
        messages = route.receive(10, wait=1)
        if messages:
            assert not route.deliver(messages), "forwarding failed again"
        messages = fifo.receive(10, wait=0)
        if messages:
            assert not fifo.deliver(messages), "the forwarded file did not merge"
            merged = True
    assert merged, "the backed-off message was not forwarded within a minute"
    return calls + merge.calls()


def lambda_service_calls(resolve):
    """What AWS does with the function roles besides the binaries' own calls: the SQS
    pollers of the event source mappings (what Lambda's documentation lists:
    ReceiveMessage, DeleteMessage, GetQueueAttributes), the logs of the function's log
    group, and the state machine's tasks with its role.
    {role: [(action, resource, context, origin)]}."""
    t = resolve.transformed()
    res = t.t["Resources"]
    role_of = {t.resources[n]: r["Properties"]["Role"]["Fn::GetAtt"][0] for n, r in res.items()
               if r["Type"] == "AWS::Lambda::Function"}
    out = {}
    for name, r in res.items():
        if "Condition" in r and not t.condition(r["Condition"]):
            continue
        props = r["Properties"]
        if r["Type"] == "AWS::Lambda::EventSourceMapping":
            queue = t.value(props["EventSourceArn"])
            for action in ("ReceiveMessage", "DeleteMessage", "GetQueueAttributes"):
                out.setdefault(role_of[t.value(props["FunctionName"])], []).append(
                    (f"sqs:{action}", queue, {"aws:SecureTransport": "true"}, f"event source mapping {name}"))
        if r["Type"] == "AWS::Lambda::Function":
            group = t.value(props["LoggingConfig"]["LogGroup"])
            stream = f"arn:aws:logs:{REGION}:{template_stack.ACCOUNT}:log-group:{group}:log-stream:2026/01/01/[$LATEST]0"
            for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
                out.setdefault(role_of[t.resources[name]], []).append((action, stream, {}, f"Lambda's logs of {name}"))
        if r["Type"] == "AWS::StepFunctions::StateMachine":
            definition = json.dumps(props["Definition"]) if "Definition" in props else t.value(props["DefinitionString"])
            for k, v in props.get("DefinitionSubstitutions", {}).items():
                definition = definition.replace("${" + k + "}", str(t.value(v)))
            role = props["RoleArn"]["Fn::GetAtt"][0]
            for task in tasks(json.loads(definition)):
                if task["Resource"] == "arn:aws:states:::lambda:invoke":
                    call = ("lambda:InvokeFunction", task["Parameters"]["FunctionName"])
                elif task["Resource"] == "arn:aws:states:::aws-sdk:sfn:listExecutions":
                    call = ("states:ListExecutions", t.resources[name])  # $$.StateMachine.Id: itself
                else:
                    raise AssertionError(f"a state machine task not mapped to IAM: {task['Resource']}")
                out.setdefault(role, []).append((*call, {}, f"{name} task {task['Resource']}"))
    return out


def tasks(definition):
    for state in definition["States"].values():
        if state["Type"] == "Task":
            yield state
        if state["Type"] == "Map":
            yield from tasks(state.get("ItemProcessor") or state["Iterator"])


# A customer managed key's default key policy: IAM policies of the account decide (KMS
# allows nothing to an identity policy alone).
DEFAULT_KEY_POLICY = {"Version": "2012-10-17", "Statement": [
    {"Sid": "Enable IAM User Permissions", "Effect": "Allow",
     "Principal": {"AWS": f"arn:aws:iam::{template_stack.ACCOUNT}:root"}, "Action": "kms:*", "Resource": "*"}]}

# Granted for calls these scenarios do not make: (statement, action) -> why.
UNEXERCISED = {
    ("ReadWriteCuratedTables", "s3:AbortMultipartUpload"):
        "a multipart upload that fails is aborted (object_store); no upload fails here",
}


def check_permissions(aws, resolve, calls, refused, all_used=True, **parameters):
    """Every call in {role: [(action, resource, context, origin)]} is allowed by the role's
    policies as the template makes them (and the bucket policies of the stack); every one
    of `refused` {role: [(action, resource, context, why)]} is not; with `all_used`, every
    action of every Allow statement of the template's own policies of these roles is used
    by some call (or is in UNEXERCISED, with the reason). `parameters`: the stack's
    parameters overridden (the roles as they would be with them)."""
    t = resolve.transformed(**parameters)
    bucket_policies = {}
    for name, r in t.t["Resources"].items():
        if r["Type"] == "AWS::S3::Bucket" and name in t.resources:
            try:
                bucket_policies[t.resources[name]] = json.loads(
                    aws.s3.get_bucket_policy(Bucket=t.resources[name])["Policy"])
            except aws.s3.exceptions.ClientError:
                pass
    requests, index = [], []
    for kind, table in (("call", calls), ("refused", refused)):
        for role, items in table.items():
            policies = iam.role_policies(t, role)
            for action, resource, context, origin in items:
                bucket = resource.split(":::", 1)[1].split("/", 1)[0] if resource.startswith("arn:aws:s3:::") else None
                resource_policy = bucket_policies.get(bucket) or (
                    DEFAULT_KEY_POLICY if resource.startswith("arn:aws:kms:") else None)
                requests.append({"principal": t.arn(role) if role in t.resources else f"arn:aws:iam::{template_stack.ACCOUNT}:role/{role}",
                                 "action": action, "resource": resource, "account": template_stack.ACCOUNT,
                                 "context": context, "identityPolicies": policies,
                                 **({"resourcePolicy": resource_policy} if resource_policy else {})})
                index.append((kind, role, action, resource, context, origin))
    results = iam.evaluate(requests)
    problems, used = [], set()
    for (kind, role, action, resource, context, origin), r in zip(index, results):
        if r["result"] == "Error":
            problems.append(f"{role}: {action} {resource} {context}: the evaluator refuses the request: {r['errors']} ({origin})")
        elif kind == "call" and r["result"] != "Allowed":
            problems.append(f"{role}: {action} on {resource} {context} is {r['result']} ({origin})")
        elif kind == "refused" and r["result"] == "Allowed":
            problems.append(f"{role}: {action} on {resource} {context} is allowed, must not be ({origin})")
        for statement in r.get("allowedBy", []) if kind == "call" else []:
            used.add((statement, action))
    # Nothing granted that no call uses (the template's own policies; AWS managed ones are
    # what they are).
    for role in calls if all_used else ():
        for p in iam.role_policies(t, role):
            if p["name"] in iam.MANAGED:
                continue
            for i, s in enumerate(p["policy"]["Statement"]):
                if s["Effect"] != "Allow":
                    continue
                sid = s.get("Sid", str(i + 1))
                for action in [s["Action"]] if isinstance(s["Action"], str) else s["Action"]:
                    if (f"{p['name']}#{sid}", action) not in used and (sid, action) not in UNEXERCISED:
                        problems.append(f"{role}: {p['name']} statement {sid} grants {action}, which no call uses")
    assert not problems, "\n".join(problems)
    return len(requests)


def kms_requests(calls, key):
    """What S3 asks KMS on the caller's behalf for these S3 calls when the buckets are
    encrypted with `key` (SSE-KMS): a data key for every object write, decryption for every
    read — and for a multipart upload's parts."""
    out = []
    for c in calls:
        if c.service != "s3" or "/" not in c.path.lstrip("/"):
            continue
        origin = f"S3 with SSE-KMS: {c.method} {c.path}"
        if c.method == "GET":
            out.append(("kms:Decrypt", key, {}, origin))
        if c.method in ("PUT", "POST") and "x-amz-copy-source" not in c.headers:
            out.append(("kms:GenerateDataKey", key, {}, origin))
            if "uploads" in c.query or "uploadId" in c.query:
                out.append(("kms:Decrypt", key, {}, origin))
    return out


def recorded(calls, region=REGION):
    return iam.iam_requests(calls, region, template_stack.ACCOUNT)


def test_two_stacks_and_the_pipeline_through_the_templates_resources(aws, stacks, glue):
    out, res, resolve = stacks.out, stacks.res, stacks.resolve
    out2, res2, resolve2 = stacks.out2, stacks.res2, stacks.resolve2
    # (LocalStack names every dashboard "unknown": not a name of the template's.)
    shared = {r for r in set(res.values()) & set(res2.values()) if r != "unknown"}
    assert not shared, f"the stacks share resource names: {shared}"
    assert "ObjectCreatedRule" in res2 and "RawBucket" not in res2 and "RawBucket" in res
    assert out2["CuratedBucket"] == out2["CuratedBucket"].lower() and out2["RawBucket"] == out["RawBucket"]
    assert resolve2.environment("MergeFunction")["TRIBUTARY_TABLES_LOCATION"] == f"s3://{out2['CuratedBucket']}/delta/"
    # The outputs the README's commands use.
    for key in ("RawBucket", "CuratedBucket", "ConfigLocation", "MergeQueueUrl", "MergeQueueArn",
                "DeadLetterQueueUrl", "DeadLetterQueueArn", "TableQueueUrl", "MetricsNamespace"):
        assert out.get(key), (key, out)
    redrive = json.loads(aws.sqs.get_queue_attributes(
        QueueUrl=out["MergeQueueUrl"], AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == out["DeadLetterQueueArn"], redrive

    # The functions as the template configures them, on the stack's S3 notifications,
    # their requests recorded.
    catalog = f'[table.catalog]\ndatabase = "{GLUE_DB}"\ncreate_database = true\n'
    merge = run_functions(aws, out, resolve, "tmpl", "e2e-template-cargo-lambda.log", glue, catalog)
    maintenance = Recorded(resolve, "MaintenanceFunction", "e2e-template-maintenance.log", glue)
    try:
        source = dms.Source(seed=41)
        files = dms.seed_files(source, full_load_rows=1000, new_rows=40)
        prefix = "dms/tmpl/travel_details/"
        bad_key = prefix + "2022/10/26/20221026-0000000099.parquet"
        gone_key = prefix + "2022/10/26/20221026-0000000098.parquet"
        for key, body in files:
            aws.s3.put_object(Bucket=out["RawBucket"], Key=prefix + key, Body=body)
        aws.s3.put_object(Bucket=out["RawBucket"], Key=bad_key, Body=b"not parquet")
        # a file deleted before its merge: "not found" (S3 says so to a role that may list it)
        aws.s3.put_object(Bucket=out["RawBucket"], Key=gone_key, Body=files[-1][1])
        aws.s3.delete_object(Bucket=out["RawBucket"], Key=gone_key)
        elapsed, dead = drain(aws, out, resolve, merge, "tmpl", source, files, [bad_key, gone_key])
        assert dead == sorted([bad_key, gone_key]), dead
        record_timing("template resources: S3 -> queue -> FIFO -> merge", elapsed,
                      f"{len(files)} files + 2 failed (to the template's DLQ)")
        # Then route B's rows move to K, with a new column: an emptied partition (its
        # manifest deleted, its catalog partition removed) and a schema change (the
        # catalog entries updated).
        moved = source.update(lambda r: r["route_id"] == "B", route_id="K")
        aws.s3.put_object(Bucket=out["RawBucket"], Key=prefix + "2022/10/25/20221025-2120000000.parquet",
                          Body=with_column(moved, "fare", pa.decimal128(10, 2), decimal.Decimal("12.50")))
        drain(aws, out, resolve, merge, "tmpl", source, files)
        merge_calls = merge.calls()
        # A retryable failure backs its FIFO message off (a short visibility change, not the
        # queue's 5,400 s): a file no table owns while the newest configuration does not load.
        merge_calls += backed_off(aws, out, resolve, merge, prefix.replace("/tmpl/", "/nobody/"))
        # So is a merge-queue message whose forwarding fails (on the merge queue); the file
        # is delivered again (its contents: a re-delivery, nothing changes).
        key, body = files[-1]
        merge_calls += forward_backed_off(aws, out, resolve, merge, prefix + key, body)
        assert any(c.status == 404 and c.path.endswith(gone_key) for c in merge_calls), "the gone file was not read"

        # Maintenance as the state machine runs it, then a DMS reload (the full load written again).
        fm = maintenance.functions
        tables, error = fm.invoke("tributary-maintenance", {"list": True})
        assert error is None and tables["tables"] == ["tmpl"], tables
        payload, error = fm.invoke("tributary-maintenance", {"table": "tmpl"})
        assert error is None, payload
        for key, body in files[:2]:
            aws.s3.put_object(Bucket=out["RawBucket"], Key=prefix + key, Body=body)
        payload, error = fm.invoke("tributary-maintenance", {"reload": "tmpl"})
        assert error is None, payload
        maintenance_calls = maintenance.calls()
    finally:
        merge.stop()
        maintenance.stop()

    raw, curated = out["RawBucket"], out["CuratedBucket"]
    config = f"arn:aws:s3:::{curated}/config/tributary.toml"
    https = {"aws:SecureTransport": "true"}
    calls = lambda_service_calls(resolve)
    calls.setdefault("MergeFunctionRole", []).extend(recorded(merge_calls))
    calls.setdefault("MaintenanceFunctionRole", []).extend(recorded(maintenance_calls))
    for role, actions in (("MergeFunctionRole", {"s3:GetObject", "s3:PutObject", "s3:ListBucket", "sqs:SendMessage",
                                                  "glue:CreateTable"}),
                          ("MaintenanceFunctionRole", {"s3:GetObject", "s3:PutObject", "s3:ListBucket", "glue:GetTable"})):
        assert actions <= {a for a, *_ in calls[role]}, (role, {a for a, *_ in calls[role]})
    other_queue = f"arn:aws:sqs:{REGION}:{template_stack.ACCOUNT}:someone-elses-queue"
    refused = {
        "MergeFunctionRole": [
            ("s3:GetObject", f"arn:aws:s3:::{raw}/elsewhere/x.parquet", https, "a raw key outside RawPrefix"),
            ("s3:ListBucket", f"arn:aws:s3:::{raw}", dict(https, **{"s3:prefix": "elsewhere/"}), "listing outside RawPrefix"),
            ("s3:ListBucket", f"arn:aws:s3:::{raw}", https, "listing the whole raw bucket"),
            ("s3:PutObject", f"arn:aws:s3:::{raw}/dms/tmpl/travel_details/x.parquet", https, "writing raw files"),
            ("s3:PutObject", config, https, "rewriting its own configuration"),
            ("s3:DeleteObject", config, https, "deleting its own configuration"),
            ("s3:GetObject", f"arn:aws:s3:::{curated}/x", {"aws:SecureTransport": "false"}, "plain HTTP (the bucket policy)"),
            ("sqs:ReceiveMessage", other_queue, https, "another queue of the account"),
            ("sqs:DeleteMessage", other_queue, https, "another queue of the account"),
            ("sqs:SendMessage", resolve.arn("MergeQueue"), https, "its own source queue"),
            ("glue:CreateTable", f"arn:aws:glue:{REGION}:{template_stack.ACCOUNT}:database/other", https, "another database"),
            ("glue:DeleteTable", f"arn:aws:glue:{REGION}:{template_stack.ACCOUNT}:table/{GLUE_DB}/tmpl", https, "deleting entries"),
        ],
        "MaintenanceFunctionRole": [
            ("s3:PutObject", f"arn:aws:s3:::{raw}/dms/tmpl/travel_details/x.parquet", https, "writing raw files"),
            ("s3:PutObject", config, https, "rewriting its configuration"),
            ("sqs:SendMessage", resolve.arn("MergeDeadLetterQueue"), https, "queues are the merge's"),
            ("sqs:ReceiveMessage", resolve.arn("MergeQueue"), https, "queues are the merge's"),
        ],
        "MaintenanceStateMachineRole": [
            ("states:ListExecutions", f"arn:aws:states:{REGION}:{template_stack.ACCOUNT}:stateMachine:other", {}, "another state machine"),
        ],
    }
    start = time.time()
    n = check_permissions(aws, resolve, calls, refused)
    # With KmsKeyArn (the roles resolved with it; LocalStack's S3 calls no KMS): what S3
    # asks KMS on the functions' behalf for the same calls — and no other key.
    key = f"arn:aws:kms:{REGION}:{template_stack.ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    other = key.replace("1234abcd", "99999999")
    kms = {"MergeFunctionRole": kms_requests(merge_calls, key),
           "MaintenanceFunctionRole": kms_requests(maintenance_calls, key)}
    assert all(kms.values()), kms
    n += check_permissions(aws, resolve, kms, {r: [("kms:Decrypt", other, {}, "another key")] for r in kms},
                           all_used=False, KmsKeyArn=key)
    record_timing("template: permissions of every call", time.time() - start, f"{n} requests evaluated")


def test_the_second_stack_gets_the_existing_buckets_files_through_eventbridge(aws, stacks):
    """The existing-bucket variant: the second stack's EventBridge rule (bucket and prefix
    as the template filters them) delivers Object Created events to its queue, and its
    functions merge them into its curated bucket, under its TablesPrefix."""
    out, resolve = stacks.out2, stacks.resolve2
    merge = run_functions(aws, out, resolve, "tmplb", "e2e-template-b-cargo-lambda.log")
    try:
        source = dms.Source(seed=42)
        files = dms.seed_files(source, full_load_rows=500, new_rows=20)
        for key, body in files:
            aws.s3.put_object(Bucket=out["RawBucket"], Key=f"dms/tmplb/travel_details/{key}", Body=body)
        # outside RawPrefix: the rule does not forward it
        aws.s3.put_object(Bucket=out["RawBucket"], Key="elsewhere/tmplb/x.parquet", Body=b"x")
        elapsed, dead = drain(aws, out, resolve, merge, "tmplb", source, files)
        assert dead == [], dead
        record_timing("template, existing bucket: EventBridge -> queue -> FIFO -> merge", elapsed,
                      f"{len(files)} files")
        merge_calls = merge.calls()
    finally:
        merge.stop()

    # Under TablesPrefix=delta/: the curated bucket's other keys are neither written nor listed
    # by the functions, and consumer accounts read and list only the tables.
    curated = out["CuratedBucket"]
    https = {"aws:SecureTransport": "true"}
    calls = {"MergeFunctionRole": recorded(merge_calls)}
    refused = {"MergeFunctionRole": [
        ("s3:PutObject", f"arn:aws:s3:::{curated}/elsewhere/x", https, "outside TablesPrefix"),
        ("s3:ListBucket", f"arn:aws:s3:::{curated}", dict(https, **{"s3:prefix": "elsewhere/"}), "listing outside TablesPrefix"),
        ("s3:ListBucket", f"arn:aws:s3:::{curated}", https, "listing the whole curated bucket"),
    ]}
    check_permissions(aws, resolve, calls, refused, all_used=False)  # (the first test runs every path)
    check_consumers(aws, curated)


def check_consumers(aws, curated):
    """A consumer account's principal (its own policy allowing everything), against the
    curated bucket's policy: the tables readable and listable, nothing else."""
    policy = json.loads(aws.s3.get_bucket_policy(Bucket=curated)["Policy"])
    allow_all = [{"name": "consumer-admin", "policy": {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "*", "Resource": "*"}]}}]
    https = {"aws:SecureTransport": "true"}
    cases = [
        ("s3:GetObject", f"arn:aws:s3:::{curated}/delta/tmplb/_delta_log/00000000000000000000.json", https, "Allowed"),
        ("s3:ListBucket", f"arn:aws:s3:::{curated}", dict(https, **{"s3:prefix": "delta/tmplb/"}), "Allowed"),
        ("s3:GetBucketLocation", f"arn:aws:s3:::{curated}", https, "Allowed"),
        ("s3:GetObject", f"arn:aws:s3:::{curated}/config/tributary.toml", https, "denied"),
        ("s3:ListBucket", f"arn:aws:s3:::{curated}", dict(https, **{"s3:prefix": "config/"}), "denied"),
        ("s3:ListBucket", f"arn:aws:s3:::{curated}", https, "denied"),
        ("s3:PutObject", f"arn:aws:s3:::{curated}/delta/tmplb/x.parquet", https, "denied"),
        # tributary's internal tables: keys of deleted rows, every value a row had, staging.
        ("s3:GetObject", f"arn:aws:s3:::{curated}/delta/tmplb/_tributary_tombstones/_delta_log/00000000000000000000.json",
         https, "denied"),
        ("s3:GetObject", f"arn:aws:s3:::{curated}/delta/tmplb/_tributary_tombstones/part-00000-x.parquet", https, "denied"),
        ("s3:GetObject", f"arn:aws:s3:::{curated}/delta/h/_tributary_changes/part-00000-x.parquet", https, "denied"),
        ("s3:GetObject", f"arn:aws:s3:::{curated}/delta/tmplb/_tributary_widening.json", https, "denied"),
        ("s3:GetObject", f"arn:aws:s3:::{curated}/delta/tmplb/_symlink_format_manifest/manifest", https, "Allowed"),
        ("s3:GetObject", f"arn:aws:s3:::{curated}/delta/_tributary_cuts/dms.json", https, "Allowed"),
    ]
    results = iam.evaluate([{"principal": f"arn:aws:iam::{CONSUMER}:role/athena", "action": a, "resource": r,
                             "account": template_stack.ACCOUNT, "context": c, "identityPolicies": allow_all,
                             "resourcePolicy": policy} for a, r, c, _ in cases])
    wrong = [(a, r, c, want, got["result"]) for (a, r, c, want), got in zip(cases, results)
             if (got["result"] == "Allowed") != (want == "Allowed") or got["result"] == "Error"]
    assert not wrong, wrong


def emf_to_metrics(cloudwatch, log_text):
    """What CloudWatch Logs does with the Embedded Metric Format lines of a function's log
    (LocalStack does not): each document's metrics, once per dimension set, as PutMetricData
    at the document's timestamp. Returns the (namespace, name, dimensions, value) put."""
    put = []
    for line in log_text.splitlines():
        if not line.startswith("{"):
            continue
        doc = json.loads(line)
        if "_aws" not in doc:
            continue
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for dims in directive["Dimensions"]:
                for metric in directive["Metrics"]:
                    dimensions = [{"Name": d, "Value": str(doc[d])} for d in dims]
                    cloudwatch.put_metric_data(Namespace=directive["Namespace"], MetricData=[{
                        "MetricName": metric["Name"], "Dimensions": dimensions, "Unit": metric.get("Unit", "None"),
                        "Value": float(doc[metric["Name"]]),
                        "Timestamp": doc["_aws"]["Timestamp"] / 1000}])
                    put.append((directive["Namespace"], metric["Name"], tuple(dims), float(doc[metric["Name"]])))
    return put


def alarm_state_after_evaluation(cloudwatch, name, timeout=30):
    """The alarm's state once LocalStack has evaluated it on the metrics put so far. Its
    scheduler evaluates an alarm when the alarm is put, then every EvaluationPeriods x Period,
    so the template's definition is put again unchanged.

    Each evaluation looks back EvaluationPeriods + 2 periods ([int(now) - Period, int(now))
    each) and counts every datapoint there (CloudWatch weighs the most recent ones), so a
    datapoint weighs in LocalStack for 3 minutes with the template's 60-s period.

    It queries [int(now) - Period, int(now)) against datapoints stored at whole seconds, so a
    datapoint put in the second the evaluation runs in is not seen yet (the alarm would go to
    OK on "no datapoints"): the put waits for the next whole second after every datapoint
    put before this call."""
    time.sleep(1.05 - time.time() % 1)
    alarm = cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"][0]
    keep = ("AlarmName", "AlarmDescription", "ActionsEnabled", "OKActions", "AlarmActions",
            "InsufficientDataActions", "MetricName", "Namespace", "Statistic", "Dimensions", "Period",
            "EvaluationPeriods", "Threshold", "ComparisonOperator", "TreatMissingData")
    cloudwatch.put_metric_alarm(**{k: alarm[k] for k in keep if k in alarm})
    deadline = time.time() + timeout
    while time.time() < deadline:  # (put, it is "Unchecked" until evaluated)
        alarm = cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"][0]
        if not alarm["StateReason"].startswith("Unchecked"):
            return alarm
        time.sleep(0.5)
    return alarm


def test_a_dead_lettered_file_holds_the_cut_and_fires_the_templates_watermark_lag_alarm(aws, stacks):
    """The watermark lag alarm as the template defines it (deployed by CloudFormation): a CDC
    file moved to the dead-letter queue holds its table's watermark and its group's cut, the
    maintenance run's `WatermarkLagSeconds` (its EMF lines, put as CloudWatch Logs would)
    exceeds `WatermarkLagAlarmSeconds` and LocalStack's evaluation of the alarm goes to
    ALARM; while no run reports again (between two scheduled runs) it stays in ALARM; the
    file fixed and its message redriven, the next run's lag is under the threshold and the
    alarm goes to OK at that run."""
    out, res, resolve = stacks.out, stacks.res, stacks.resolve
    cloudwatch = boto3.client("cloudwatch", endpoint_url=ENDPOINT, **CREDS)
    threshold = float(resolve.value({"Ref": "WatermarkLagAlarmSeconds"}))
    alarm_name = res["WatermarkLagAlarm"]
    merge = run_functions(aws, out, resolve, "wmalarm", "e2e-template-alarm-cargo-lambda.log")
    maintenance = Recorded(resolve, "MaintenanceFunction", "e2e-template-alarm-maintenance.log")
    try:
        source = dms.Source(seed=43)
        prefix = "dms/wmalarm/travel_details/"
        now = datetime.datetime.now(datetime.timezone.utc)
        name = lambda ago: f"{now - ago:%Y/%m/%d/%Y%m%d-%H%M%S}000.parquet"
        load = source.insert_records(200)
        files = [("LOAD00000001.parquet", dms.parquet([(None, "2022-10-25 23:59:59.000000", *r[2:]) for r in load], False)),
                 (name(datetime.timedelta(hours=3)), dms.parquet(source.random_changes(20), True))]
        held = (name(datetime.timedelta(hours=2)), dms.parquet(source.random_changes(20), True))
        files.append((name(datetime.timedelta(minutes=5)), dms.parquet(source.random_changes(20), True)))
        for key, body in files:
            aws.s3.put_object(Bucket=out["RawBucket"], Key=prefix + key, Body=body)
        bad_key = prefix + held[0]
        aws.s3.put_object(Bucket=out["RawBucket"], Key=bad_key, Body=b"not parquet (yet)")
        route = Poller(aws, None, merge.functions, out["MergeQueueUrl"], out["MergeQueueArn"])
        fifo = Poller(aws, None, merge.functions, out["TableQueueUrl"], resolve.arn("TableQueue"))
        dead, deadline = [], time.time() + 120
        while not dead and time.time() < deadline:
            for p in (route, fifo):
                messages = p.receive(10, wait=0)
                if messages:
                    p.deliver(messages)
            dead = aws.sqs.receive_message(QueueUrl=out["DeadLetterQueueUrl"], MaxNumberOfMessages=10,
                                           WaitTimeSeconds=1).get("Messages", [])
        assert dead, "the unreadable file did not reach the dead-letter queue"
        assert bad_key in dead[0]["Body"], dead[0]["Body"]

        def run_maintenance():
            start = len(open(maintenance.functions.log.name).read())
            # the state machine's steps: each table, then the cuts
            for event in ({"table": "wmalarm"}, json.loads((template_stack.ROOT / "events" / "maintenance-cuts.json").read_text())):
                payload, error = maintenance.functions.invoke("tributary-maintenance", event)
                assert error is None and not payload["failed"], payload
            maintenance.functions.log.flush()
            time.sleep(0.5)
            put = emf_to_metrics(cloudwatch, open(maintenance.functions.log.name).read()[start:])
            return payload, [v for ns, n, dims, v in put
                             if ns == out["MetricsNamespace"] and n == "WatermarkLagSeconds" and dims == ()]

        cuts, lags = run_maintenance()
        group = cuts["watermarks"]["groups"][0]
        assert group["held_by"] == "wmalarm" and group["tables"][0]["held_by"]["file"].endswith(held[0]), group
        assert len(lags) == 1 and lags[0] > threshold, (lags, threshold)
        breached_at = time.time()
        alarm = alarm_state_after_evaluation(cloudwatch, alarm_name)
        assert alarm["StateValue"] == "ALARM", alarm
        assert json.loads(alarm["StateReasonData"])["recentDatapoints"] == [lags[0]], alarm["StateReasonData"]
        alarmed = alarm["StateUpdatedTimestamp"]
        # LocalStack evaluates the alarm every EvaluationPeriods x Period from its put, over
        # the last EvaluationPeriods + 2 periods: after `quiet`, one evaluation at least has
        # run with no datapoint in its range, as between two scheduled runs.
        every = alarm["Period"] * alarm["EvaluationPeriods"]
        quiet = alarm["Period"] * (alarm["EvaluationPeriods"] + 2) + every + 2

        # The redrive: the file written again, readable; its message moved back to the queue.
        aws.s3.put_object(Bucket=out["RawBucket"], Key=bad_key, Body=held[1])
        aws.sqs.send_message(QueueUrl=out["MergeQueueUrl"], MessageBody=dead[0]["Body"])
        aws.sqs.delete_message(QueueUrl=out["DeadLetterQueueUrl"], ReceiptHandle=dead[0]["ReceiptHandle"])
        stack = SimpleNamespace(curated=out["CuratedBucket"])
        deadline = time.time() + 120
        while time.time() < deadline and read_table(stack, "wmalarm")[1] != source.state():
            for p in (route, fifo):
                messages = p.receive(10, wait=0)
                if messages:
                    p.deliver(messages)
            time.sleep(0.2)
        assert read_table(stack, "wmalarm")[1] == source.state()
        # Between two scheduled runs no datapoint comes: the alarm keeps what the last run
        # said (the cut is held until a run says otherwise), it does not go to OK.
        time.sleep(max(0.0, breached_at + quiet - time.time()))
        alarm = cloudwatch.describe_alarms(AlarmNames=[alarm_name])["MetricAlarms"][0]
        assert (alarm["StateValue"], alarm["StateUpdatedTimestamp"]) == ("ALARM", alarmed), alarm
        cuts, lags = run_maintenance()
        group = cuts["watermarks"]["groups"][0]
        assert group["held_by"] is None and group["tables"][0]["caught_up"], group
        assert len(lags) == 1 and 0 <= lags[0] < threshold, (lags, threshold)
        # The run after the redrive ends the ALARM at the next evaluation (the alarm is not put
        # again: this is the transition ALARM -> OK an OKActions topic is sent).
        deadline = time.time() + 2 * every + 5
        while alarm["StateValue"] == "ALARM" and time.time() < deadline:
            time.sleep(1)
            alarm = cloudwatch.describe_alarms(AlarmNames=[alarm_name])["MetricAlarms"][0]
        assert alarm["StateValue"] == "OK", alarm
        assert json.loads(alarm["StateReasonData"])["recentDatapoints"] == [lags[0]], alarm["StateReasonData"]
    finally:
        merge.stop()
        maintenance.stop()
