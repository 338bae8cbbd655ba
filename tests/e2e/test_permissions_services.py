"""What AWS services do with the template's queue policies and service roles — which
LocalStack cannot show (it enforces no IAM, and runs neither DMS nor EventBridge Scheduler)
— evaluated like the functions' calls (iam.py: @cloud-copilot/iam-simulate, AWS's
evaluation logic) on the template as SAM transforms it, resolved for a stack that is not
deployed (template_stack.synthetic): no emulator needed (#44).

- Queue policies: S3 and EventBridge (cross-service principals) may send to the queues the
  template routes them to (a bucket's notifications; a rule's targets and dead-letter
  queue), for the source the template names there (`aws:SourceArn`) in the stack's account
  (`aws:SourceAccount`); every other queue, source, account, and a request without a source
  (what an unconditioned grant would let through), is refused.
- The DMS target role (`CreateDmsRole`): the calls DMS documents for an S3 target
  ("Prerequisites for using Amazon S3 as a target": s3:PutObject, s3:DeleteObject,
  s3:PutObjectTagging, s3:ListBucket; with `KmsKeyArn`, what S3 asks KMS on its behalf)
  allowed under RawPrefix, refused elsewhere; assumable by DMS for this account only.
- The maintenance schedule's role (made by SAM): states:StartExecution on the state machine
  the schedule targets, nothing else.

Every grant of these roles is used by a documented call, and every check is run again on
mutated policies (a condition dropped, a resource widened to "*"): each mutation must make
some decision wrong, so that no case is one any policy passes."""

import collections
import copy

import iam
import pytest
import template_stack
from conftest import REGION
from test_template import DEFAULT_KEY_POLICY

ACCOUNT = template_stack.ACCOUNT
OTHER = "111111111111"
STACK = "tributary-perm"
HTTPS = {"aws:SecureTransport": "true"}
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
VARIANTS = {
    "new raw bucket": {},  # S3 notifications to the merge queue
    "existing raw bucket": {"RawBucketName": "existing-dms-bucket"},  # the EventBridge rule
}

# Found by this test, not fixed here (#44): the merge queue's RawBucketNotifications statement
# lets S3 send for any bucket of the account (aws:SourceArn ArnLike arn:aws:s3:::* — the
# bucket's generated name cannot be named before it exists; with an existing raw bucket the
# statement is left out since). Those cases are held by
# test_s3_sends_to_the_merge_queue_only_for_the_routed_bucket (strict xfail); once the
# statement is narrowed it fails: then set this to None and delete that test.
S3_ANY_BUCKET = ("s3.amazonaws.com", "MergeQueue")

Case = collections.namedtuple("Case", "why want request")


def request(principal, action, resource, context=None, identity=(), resource_policy=None):
    return {"principal": principal, "action": action, "resource": resource, "account": ACCOUNT,
            "context": context or {}, "identityPolicies": list(identity),
            **({"resourcePolicy": resource_policy} if resource_policy else {})}


def live(t):
    """The resources the stack has with its parameters (their Condition true)."""
    return {n: r for n, r in t.t["Resources"].items() if "Condition" not in r or t.condition(r["Condition"])}


def resolved(t, doc):
    doc = t.value(doc)
    doc["Statement"] = [s for s in doc["Statement"] if s is not None]  # (Fn::If to AWS::NoValue)
    return doc


def services(statement):
    p = statement.get("Principal", {})
    s = p.get("Service", []) if isinstance(p, dict) else []
    return [s] if isinstance(s, str) else s


def output(t, name):
    return t.value(t.t["Outputs"][name]["Value"])


def evaluate(*case_sets):
    """The evaluator's results for each list of cases, in one run."""
    results = iam.evaluate([c.request for cases in case_sets for c in cases])
    out = []
    for cases in case_sets:
        out.append(results[:len(cases)])
        results = results[len(cases):]
    return out


def wrong(cases, results):
    return [f"{c.why}: {r['result']}, must be {c.want}" + (f" ({r['errors']})" if r["result"] == "Error" else "")
            for c, r in zip(cases, results)
            if r["result"] == "Error" or (r["result"] == "Allowed") != (c.want == "Allowed")]


def check_mutations(mutations, evaluated, undetected=()):
    """Each mutation [(what, cases)] with its results must make some decision wrong (and none
    an evaluator error), except those named in `undetected`."""
    missed, errors = [], []
    for (what, cases), results in zip(mutations, evaluated):
        errors += [f"{what}: {c.why}: {r['errors']}" for c, r in zip(cases, results) if r["result"] == "Error"]
        if not wrong(cases, results):
            missed.append(what)
    assert not errors, "\n".join(errors)
    assert sorted(missed) == sorted(undetected), \
        f"mutations no case tells apart from the template: {missed}; expected: {list(undetected)}"
    assert len(mutations) > len(undetected), "no mutation checked"


# ------------------------------------------------------------------ queue policies

def queue_policies(t):
    """{queue logical id: (policy logical id, resolved policy document)}."""
    out = {}
    for name, r in live(t).items():
        if r["Type"] == "AWS::SQS::QueuePolicy":
            for q in r["Properties"]["Queues"]:
                assert set(q) == {"Ref"}, q
                assert q["Ref"] not in out, f"two policies for {q['Ref']} (SQS keeps one)"
                out[q["Ref"]] = (name, resolved(t, r["Properties"]["PolicyDocument"]))
    return out


def routes(t):
    """(service principal, queue logical id, source ARN) of every delivery the template sets
    up: a bucket's queue notifications, a rule's targets and their dead-letter queues."""
    queues = {t.arn(n): n for n, r in live(t).items() if r["Type"] == "AWS::SQS::Queue"}
    out = set()
    for name, r in live(t).items():
        props = r.get("Properties", {})
        if r["Type"] == "AWS::S3::Bucket":
            notifications = props.get("NotificationConfiguration", {})
            assert set(notifications) <= {"QueueConfigurations"}, f"{name}: notifications not mapped here"
            for c in notifications.get("QueueConfigurations", []):
                out.add(("s3.amazonaws.com", queues[t.value(c["Queue"])], t.arn(name)))
        if r["Type"] == "AWS::Events::Rule":
            for target in props["Targets"]:
                for arn in (target["Arn"], target.get("DeadLetterConfig", {}).get("Arn")):
                    if arn:
                        assert t.value(arn) in queues, f"{name}: a target that is not a queue of the template"
                        out.add(("events.amazonaws.com", queues[t.value(arn)], t.arn(name)))
    return out


def queue_cases(t, policies):
    """sqs:SendMessage by S3 and EventBridge to every queue of the stack, for the sources
    each service sends: Allowed exactly for the template's routes in the stack's account.
    (case, gap): gap marks the cases S3_ANY_BUCKET names."""
    raw = f"arn:aws:s3:::{output(t, 'RawBucket')}"
    rules = [t.arn(n) for n, r in live(t).items() if r["Type"] == "AWS::Events::Rule"] \
        or [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{STACK}-ObjectCreatedRule-1A2B3C4D5E6F"]  # (none: a likely name)
    sources = {  # (aws:SourceArn, aws:SourceAccount, what) as the service sends them
        "s3.amazonaws.com": [(raw, ACCOUNT, "the raw bucket"),
                             (raw, OTHER, "the raw bucket's name in another account"),
                             ("arn:aws:s3:::someone-elses-bucket", OTHER, "a bucket of another account"),
                             ("arn:aws:s3:::another-bucket-of-the-account", ACCOUNT, "another bucket of the account")],
        "events.amazonaws.com": [(rule, ACCOUNT, f"the stack's rule {rule}") for rule in rules] + [
            (rules[0].replace(f":{ACCOUNT}:", f":{OTHER}:"), OTHER, "the rule's name in another account"),
            (f"arn:aws:events:{REGION}:{ACCOUNT}:rule/another-rule", ACCOUNT, "another rule of the account")],
    }
    named = {p for _, doc in policies.values() for s in doc["Statement"] for p in services(s)}
    assert named <= set(sources), f"queue policies grant services this test does not know: {named - set(sources)}"
    routed = routes(t)
    out = []
    for q in (n for n, r in live(t).items() if r["Type"] == "AWS::SQS::Queue"):
        policy = policies.get(q, (None, None))[1]
        for p, items in sources.items():
            for source, account, what in items:
                want = "Allowed" if (p, q, source) in routed and account == ACCOUNT else "Denied"
                gap = S3_ANY_BUCKET == (p, q) and account == ACCOUNT and want == "Denied"
                out.append((Case(f"{p} -> {q} for {what}", want,
                                 request(p, "sqs:SendMessage", t.arn(q),
                                         {"aws:SourceArn": source, "aws:SourceAccount": account},
                                         resource_policy=policy)), gap))
            out.append((Case(f"{p} -> {q} without a source (what an unconditioned grant allows)", "Denied",
                             request(p, "sqs:SendMessage", t.arn(q), resource_policy=policy)), False))
    return out


def condition_mutations(policies):
    """(what, policies) with one Allow statement for a service weakened: its Condition
    dropped, or one of its condition keys."""
    for q, (name, doc) in policies.items():
        for i, s in enumerate(doc["Statement"]):
            if s["Effect"] != "Allow" or not services(s):
                continue
            sid = s.get("Sid", str(i + 1))
            drops = [("every condition", None)] + [(f"{op} {key}", (op, key))
                                                   for op, keys in s.get("Condition", {}).items() for key in keys]
            for what, drop in drops:
                mutated = copy.deepcopy(policies)
                statement = mutated[q][1]["Statement"][i]
                if drop is None:
                    statement.pop("Condition", None)
                else:
                    op, key = drop
                    del statement["Condition"][op][key]
                    if not statement["Condition"][op]:
                        del statement["Condition"][op]
                yield f"{name} {sid} without {what}", mutated


@pytest.mark.parametrize("variant", VARIANTS)
def test_queue_policies_let_s3_and_eventbridge_send_only_where_the_template_routes_them(variant):
    """S3 and EventBridge may send to the template's routes only, for its sources in its account."""
    t = template_stack.synthetic(VARIANTS[variant], STACK, REGION)
    policies = queue_policies(t)
    routed = routes(t)
    assert routed, "the template routes no events to a queue"
    expected_routes = ({("s3.amazonaws.com", "MergeQueue", t.arn("RawBucket"))} if variant == "new raw bucket" else
                       {("events.amazonaws.com", q, t.arn("ObjectCreatedRule")) for q in ("MergeQueue", "MergeDeadLetterQueue")})
    assert routed == expected_routes, routed  # (what this test has been read against)
    cases = [c for c, gap in queue_cases(t, policies) if not gap]
    mutations = [(what, [c for c, gap in queue_cases(t, m) if not gap]) for what, m in condition_mutations(policies)]
    results, *mutated = evaluate(cases, *(c for _, c in mutations))
    problems = wrong(cases, results)
    assert not problems, "\n".join(problems)
    assert {c.why for c in cases if c.want == "Allowed"}, "no route allowed"
    # Each condition decides some case — but the raw bucket statement's aws:SourceArn (any
    # bucket), which only S3_ANY_BUCKET's cases could tell (once it is narrowed, this fails:
    # see S3_ANY_BUCKET).
    gap = S3_ANY_BUCKET and variant == "new raw bucket"
    check_mutations(mutations, mutated,
                    ["MergeQueuePolicy RawBucketNotifications without ArnLike aws:SourceArn"] if gap else [])


@pytest.mark.parametrize("variant", [
    pytest.param("new raw bucket", marks=pytest.mark.xfail(
        strict=True, reason="template.yaml MergeQueuePolicy, statement RawBucketNotifications: aws:SourceArn "
                            "ArnLike arn:aws:s3:::* lets S3 send for any bucket of the account")),
    # Fixed: with an existing raw bucket (EventBridge) the statement is not in the policy.
    "existing raw bucket",
])
def test_s3_sends_to_the_merge_queue_only_for_the_routed_bucket(variant):
    """S3 may send to the merge queue for the bucket the template routes there, no other."""
    t = template_stack.synthetic(VARIANTS[variant], STACK, REGION)
    cases = [c for c, gap in queue_cases(t, queue_policies(t)) if gap]
    assert cases
    results, = evaluate(cases)
    problems = wrong(cases, results)
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ service roles

def bucket_policies(t):
    return {t.value(r["Properties"]["Bucket"]): resolved(t, r["Properties"]["PolicyDocument"])
            for r in live(t).values() if r["Type"] == "AWS::S3::BucketPolicy"}


def resource_policy(t, resource):
    """The policy of the resource a request is on: a bucket policy of the stack, a key's
    default key policy (the account's IAM policies decide)."""
    if resource.startswith("arn:aws:s3:::"):
        return bucket_policies(t).get(resource.split(":::", 1)[1].split("/", 1)[0])
    if resource.startswith("arn:aws:kms:"):
        return DEFAULT_KEY_POLICY
    return None


def role_cases(t, role, policies, calls, refused):
    """[(action, resource, context, why)] of the role: calls Allowed, refused Denied."""
    principal = t.arn(role)
    return [Case(f"{role}: {why}: {a} {r} {c}", want, request(principal, a, r, c, policies, resource_policy(t, r)))
            for want, items in (("Allowed", calls), ("Denied", refused)) for a, r, c, why in items]


def trust_cases(t, role, trust, allowed, refused):
    """sts:AssumeRole on the role by services [(service, aws:SourceAccount or None, why)]."""
    out = []
    for want, items in (("Allowed", allowed), ("Denied", refused)):
        for service, account, why in items:
            out.append(Case(f"{role} trust: {why}", want, request(
                service, "sts:AssumeRole", t.arn(role), {"aws:SourceAccount": account} if account else {},
                resource_policy=trust)))
    return out


def check_role(t, role, calls, refused, trusted, untrusted, undetected_trust=()):
    """The role's calls allowed and refused ones denied; its trust policy; every action of its
    Allow statements used by a call; each statement widened to every resource, and each trust
    condition dropped, caught by some case."""
    policies = iam.role_policies(t, role)
    trust = resolved(t, t.t["Resources"][role]["Properties"]["AssumeRolePolicyDocument"])
    cases = role_cases(t, role, policies, calls, refused)
    trusts = trust_cases(t, role, trust, trusted, untrusted)
    mutations = []
    for p, policy in enumerate(policies):
        for i, s in enumerate(policy["policy"]["Statement"]):
            if s["Effect"] == "Allow" and s["Resource"] != "*":
                widened = copy.deepcopy(policies)
                widened[p]["policy"]["Statement"][i]["Resource"] = "*"
                mutations.append((f"{policy['name']} statement {i + 1} on every resource",
                                  role_cases(t, role, widened, calls, refused)))
    for i, s in enumerate(trust["Statement"]):
        if "Condition" in s:
            loose = copy.deepcopy(trust)
            del loose["Statement"][i]["Condition"]
            mutations.append((f"trust statement {i + 1} without its condition",
                              trust_cases(t, role, loose, trusted, untrusted)))
    results, trust_results, *mutated = evaluate(cases, trusts, *(c for _, c in mutations))
    problems = wrong(cases, results) + wrong(trusts, trust_results)
    assert not problems, "\n".join(problems)
    used = {(statement, c.request["action"]) for c, r in zip(cases, results) if c.want == "Allowed"
            for statement in r["allowedBy"]}
    for policy in policies:
        for i, s in enumerate(policy["policy"]["Statement"]):
            actions = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
            unused = [a for a in actions if (f"{policy['name']}#{s.get('Sid', str(i + 1))}", a) not in used]
            assert s["Effect"] != "Allow" or not unused, f"{role}: {policy['name']} grants {unused}, which no call uses"
    check_mutations(mutations, mutated, undetected_trust)


DMS_VARIANTS = {
    "the stack's raw bucket": {"CreateDmsRole": "true"},
    "an existing raw bucket, a KMS key, another prefix": {"CreateDmsRole": "true", "RawBucketName": "existing-dms-bucket",
                                                          "RawPrefix": "cdc/", "KmsKeyArn": KEY},
}


@pytest.mark.parametrize("variant", DMS_VARIANTS)
def test_the_dms_role_makes_the_calls_dms_documents_for_an_s3_target_under_the_raw_prefix_only(variant):
    """The DMS role allows DMS's documented S3-target calls under RawPrefix and nothing elsewhere."""
    t = template_stack.synthetic(DMS_VARIANTS[variant], STACK, REGION)
    assert "DmsTargetRole" in live(t), "CreateDmsRole=true makes no role"
    assert t.value(t.t["Outputs"]["DmsServiceAccessRoleArn"]["Value"]) == t.arn("DmsTargetRole")
    raw, curated, prefix = output(t, "RawBucket"), output(t, "CuratedBucket"), t.params["RawPrefix"]
    # A full load file and a CDC file (DatePartitionEnabled) of a table, as DMS names them.
    keys = [f"{prefix}sales/customers/LOAD00000001.csv", f"{prefix}sales/customers/2024/05/01/20240501-120000000.csv"]
    calls = [(a, f"arn:aws:s3:::{raw}/{k}", HTTPS, "DMS writes a file")
             for k in keys for a in ("s3:PutObject", "s3:PutObjectTagging", "s3:DeleteObject")]
    calls += [("s3:ListBucket", f"arn:aws:s3:::{raw}", HTTPS, "DMS lists the bucket"),
              ("s3:ListBucket", f"arn:aws:s3:::{raw}", dict(HTTPS, **{"s3:prefix": prefix}), "DMS lists its folder")]
    if t.condition("HasKmsKey"):  # what S3 asks KMS on DMS's behalf (SSE-KMS bucket default, multipart)
        calls += [("kms:GenerateDataKey", KEY, {}, "S3 with SSE-KMS: a write"),
                  ("kms:Decrypt", KEY, {}, "S3 with SSE-KMS: a multipart upload")]
    refused = [
        ("s3:PutObject", f"arn:aws:s3:::{raw}/elsewhere/x.csv", HTTPS, "writing outside RawPrefix"),
        ("s3:DeleteObject", f"arn:aws:s3:::{raw}/elsewhere/x.csv", HTTPS, "deleting outside RawPrefix"),
        ("s3:GetObject", f"arn:aws:s3:::{raw}/{keys[0]}", HTTPS, "reading (not a call DMS documents)"),
        ("s3:PutBucketPolicy", f"arn:aws:s3:::{raw}", HTTPS, "changing the raw bucket's policy"),
        ("s3:PutObject", f"arn:aws:s3:::{curated}/config/tributary.toml", HTTPS, "the configuration"),
        ("s3:DeleteObject", f"arn:aws:s3:::{curated}/orders/_delta_log/00000000000000000000.json", HTTPS, "a table"),
        ("s3:ListBucket", f"arn:aws:s3:::{curated}", HTTPS, "listing the curated bucket"),
        ("sqs:SendMessage", t.arn("MergeQueue"), HTTPS, "the merge queue"),
    ]
    if raw in bucket_policies(t):
        refused.append(("s3:PutObject", f"arn:aws:s3:::{raw}/{keys[0]}", {"aws:SecureTransport": "false"},
                        "plain HTTP (the raw bucket's policy)"))
    if t.condition("HasKmsKey"):
        refused.append(("kms:Decrypt", KEY.replace("1234abcd", "99999999"), {}, "another key"))
    check_role(t, "DmsTargetRole", calls, refused,
               trusted=[("dms.amazonaws.com", ACCOUNT, "DMS for this account")],
               untrusted=[("dms.amazonaws.com", OTHER, "DMS for another account (confused deputy)"),
                          ("dms.amazonaws.com", None, "DMS without a source account"),
                          ("lambda.amazonaws.com", ACCOUNT, "another service")])


def schedules(t):
    """(schedule, role, target ARN) of the stack's schedules."""
    out = [(n, r["Properties"]["Target"]["RoleArn"]["Fn::GetAtt"][0], t.value(r["Properties"]["Target"]["Arn"]))
           for n, r in live(t).items() if r["Type"] == "AWS::Scheduler::Schedule"]
    assert out, "no schedule in the transformed template"
    for name, _, target in out:  # the call a schedule makes depends on its target's kind
        assert target.startswith(f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:"), f"{name}: target not mapped: {target}"
    return out


def test_the_schedule_role_starts_only_the_maintenance_state_machine():
    """The schedule's role allows states:StartExecution on its state machine and nothing else."""
    t = template_stack.synthetic({}, STACK, REGION)
    for name, role, target in schedules(t):
        assert target == t.arn("MaintenanceStateMachine"), (name, target)
        machine = target.rsplit(":", 1)[1]
        other = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine"
        check_role(t, role, [("states:StartExecution", target, {}, f"{name} starts its target")], [
            ("states:StartExecution", f"{other}:{machine}-other", {}, "a state machine named like it"),
            ("states:StartExecution", f"{other}:another-stack-maintenance", {}, "another stack's state machine"),
            ("states:StopExecution", f"arn:aws:states:{REGION}:{ACCOUNT}:execution:{machine}:run-1", {}, "stopping a run"),
            ("lambda:InvokeFunction", t.arn("MaintenanceFunction"), {}, "the maintenance function directly"),
        ], trusted=[("scheduler.amazonaws.com", ACCOUNT, "EventBridge Scheduler")],
            untrusted=[("lambda.amazonaws.com", ACCOUNT, "another service"),
                       ("scheduler.amazonaws.com", OTHER, "the scheduler for another account"),
                       ("scheduler.amazonaws.com", None, "without a source account")])


def test_the_schedule_role_is_assumable_by_the_scheduler_for_this_account_only():
    """EventBridge Scheduler may assume the schedule's role only for schedules of this account."""
    t = template_stack.synthetic({}, STACK, REGION)
    for _, role, _ in schedules(t):
        trust = resolved(t, t.t["Resources"][role]["Properties"]["AssumeRolePolicyDocument"])
        cases = trust_cases(t, role, trust, [], [("scheduler.amazonaws.com", OTHER, "the scheduler for another account"),
                                                 ("scheduler.amazonaws.com", None, "without a source account")])
        results, = evaluate(cases)
        problems = wrong(cases, results)
        assert not problems, "\n".join(problems)
