"""What no emulator sees in template.yaml (run by `scripts/sam lint`):

- every SNS topic an alarm notifies is one CloudWatch can publish to: no KMS key, or a key
  of this template whose policy lets cloudwatch.amazonaws.com use kms:Decrypt and
  kms:GenerateDataKey* (CloudWatch cannot use the AWS managed alias/aws/sns: every alarm
  action would fail);
- no message can expire silently: every queue that has a dead-letter queue has an alarm on
  its oldest message's age whose threshold (a parameter's largest allowed value) is below
  the queue's retention, and each dead-letter queue keeps messages longer than its source;
- every queue, dead-letter queues included, has an alarm on its oldest message's age below
  its retention;
- the template's Rules refuse what must not deploy (evaluated here for parameter sets, as
  CloudFormation does before it creates anything): an existing curated bucket with the
  default TablesPrefix (the whole bucket: the functions could write and delete any object
  of a bucket that holds other data), AlarmEmail with AlarmTopicArn (one was ignored),
  an empty consumer account ID.
Usage: python scripts/template_checks.py [template.yaml]"""

import sys

from samtranslator.yaml_helper import yaml_parse


def ref(v):
    """The logical id a Ref / GetAtt points at, or None."""
    if isinstance(v, dict) and "Ref" in v:
        return v["Ref"]
    if isinstance(v, dict) and "Fn::GetAtt" in v:
        g = v["Fn::GetAtt"]
        return g[0] if isinstance(g, list) else g.split(".")[0]
    return None


def refs(node):
    """Every logical id referenced anywhere in `node`."""
    if isinstance(node, dict):
        r = ref(node)
        return ({r} if r else set()) | {x for v in node.values() for x in refs(v)}
    if isinstance(node, list):
        return {x for v in node for x in refs(v)}
    return set()


def grants_cloudwatch(key):
    actions = set()
    for s in key.get("Properties", {}).get("KeyPolicy", {}).get("Statement", []):
        services = (s.get("Principal") or {}).get("Service", [])
        services = [services] if isinstance(services, str) else services
        if s.get("Effect") == "Allow" and "cloudwatch.amazonaws.com" in services:
            a = s.get("Action", [])
            actions |= {a} if isinstance(a, str) else set(a)
    return "kms:*" in actions or {"kms:Decrypt", "kms:GenerateDataKey*"} <= actions


def evaluate(node, params):
    """A Rule's condition or assertion, for parameter values (the intrinsic functions Rules
    use here)."""
    if isinstance(node, dict):
        (fn, arg), = node.items()
        if fn == "Ref":
            return params[arg]
        if fn == "Fn::Equals":
            return evaluate(arg[0], params) == evaluate(arg[1], params)
        if fn == "Fn::Not":
            return not evaluate(arg[0], params)
        if fn == "Fn::And":
            return all(evaluate(a, params) for a in arg)
        if fn == "Fn::Or":
            return any(evaluate(a, params) for a in arg)
        if fn == "Fn::Contains":
            return evaluate(arg[1], params) in evaluate(arg[0], params)
        if fn == "Fn::Join":
            return arg[0].join(evaluate(arg[1], params) if not isinstance(arg[1], list)
                               else [evaluate(a, params) for a in arg[1]])
        raise ValueError(f"no evaluation of {fn} in Rules")
    return node


def refused(t, given):
    """The descriptions of the Rules' assertions that fail for these parameters (the others
    at their defaults)."""
    params = {k: (v.get("Default", "") if v.get("Type") != "CommaDelimitedList"
                  else [x for x in str(v.get("Default", "")).split(",") if x])
              for k, v in t.get("Parameters", {}).items()}
    params.update(given)
    out = []
    for name, rule in t.get("Rules", {}).items():
        if "RuleCondition" in rule and not evaluate(rule["RuleCondition"], params):
            continue
        out += [f"{name}: {a.get('AssertDescription', '')}" for a in rule["Assertions"]
                if not evaluate(a["Assert"], params)]
    return out


def check_rules(t):
    bad = []
    if refused(t, {}):
        bad.append(f"the defaults are refused: {refused(t, {})}")
    if not refused(t, {"CuratedBucketName": "existing-bucket"}):
        bad.append("an existing curated bucket with the default TablesPrefix (the whole bucket) deploys")
    if refused(t, {"CuratedBucketName": "existing-bucket", "TablesPrefix": "delta/"}):
        bad.append("an existing curated bucket with a TablesPrefix is refused")
    if not refused(t, {"AlarmEmail": "ops@example.com", "AlarmTopicArn": "arn:aws:sns:us-east-1:123456789012:t"}):
        bad.append("AlarmEmail and AlarmTopicArn together deploy (the topic would be ignored)")
    if not refused(t, {"ConsumerAccountIds": ["123456789012", ""]}):
        bad.append("ConsumerAccountIds with an empty entry deploys (S3 rejects the policy)")
    if refused(t, {"ConsumerAccountIds": ["123456789012", "210987654321"]}):
        bad.append("two consumer accounts are refused")
    return bad


def check(path):
    t = yaml_parse(open(path).read())
    res, params = t["Resources"], t.get("Parameters", {})
    bad = []
    topics = {r for a in res.values() if a["Type"] == "AWS::CloudWatch::Alarm"
              for k in ("AlarmActions", "OKActions", "InsufficientDataActions")
              for r in refs(a["Properties"].get(k)) if r in res and res[r]["Type"] == "AWS::SNS::Topic"}
    for name in sorted(topics):
        key = res[name]["Properties"].get("KmsMasterKeyId")
        if key is None:
            continue
        target = ref(key)
        if target in res and res[target]["Type"] == "AWS::KMS::Key" and grants_cloudwatch(res[target]):
            continue
        bad.append(f"{name}: alarms notify it, but CloudWatch cannot publish to it under KMS key {key!r} "
                   "(a key of this template whose policy grants cloudwatch.amazonaws.com kms:Decrypt and "
                   "kms:GenerateDataKey*, or none)")

    def number(v):
        if isinstance(v, dict) and "Ref" in v and v["Ref"] in params:
            p = params[v["Ref"]]
            return float(p.get("MaxValue", p.get("Default")))
        return float(v)
    age_alarms = {}
    for a in res.values():
        props = a["Properties"]
        if a["Type"] == "AWS::CloudWatch::Alarm" and props.get("MetricName") == "ApproximateAgeOfOldestMessage":
            for d in props.get("Dimensions", []):
                if d["Name"] == "QueueName" and ref(d["Value"]):
                    age_alarms.setdefault(ref(d["Value"]), []).append(number(props["Threshold"]))
    for name, q in sorted(res.items()):
        if q["Type"] != "AWS::SQS::Queue":
            continue
        retention = number(q["Properties"].get("MessageRetentionPeriod", 345600))
        if not any(th < retention for th in age_alarms.get(name, [])):
            bad.append(f"{name}: no alarm on ApproximateAgeOfOldestMessage below its retention ({retention:.0f} s): "
                       "a message could expire there unseen")
        redrive = q["Properties"].get("RedrivePolicy")
        if not redrive:
            continue
        dlq = ref(redrive["deadLetterTargetArn"])
        dlq_retention = number(res[dlq]["Properties"].get("MessageRetentionPeriod", 345600))
        if dlq_retention <= retention:
            bad.append(f"{name}: its dead-letter queue {dlq} keeps messages {dlq_retention:.0f} s, not longer "
                       f"than it does ({retention:.0f} s)")
    bad += check_rules(t)
    if bad:
        sys.exit("template checks:\n  " + "\n  ".join(bad))
    print(f"{path}: alarm topics publishable by CloudWatch ({len(topics)}); "
          "every queue's oldest message, dead-letter queues included, alarmed below its retention; "
          "the Rules refuse an existing curated bucket without a TablesPrefix, two alarm destinations "
          "and an empty consumer account ID")


if __name__ == "__main__":
    check(sys.argv[1] if len(sys.argv) > 1 else "template.yaml")
