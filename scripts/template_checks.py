"""What no emulator sees in template.yaml (run by `scripts/sam lint`):

- every SNS topic an alarm notifies is one CloudWatch can publish to: no KMS key, or a key
  of this template whose policy lets cloudwatch.amazonaws.com use kms:Decrypt and
  kms:GenerateDataKey* (CloudWatch cannot use the AWS managed alias/aws/sns: every alarm
  action would fail);
- no message can expire silently: every queue that has a dead-letter queue has an alarm on
  its oldest message's age whose threshold (a parameter's largest allowed value) is below
  the queue's retention, and each dead-letter queue keeps messages longer than its source.
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
        redrive = q["Properties"].get("RedrivePolicy") if q["Type"] == "AWS::SQS::Queue" else None
        if not redrive:
            continue
        retention = number(q["Properties"].get("MessageRetentionPeriod", 345600))
        if not any(th < retention for th in age_alarms.get(name, [])):
            bad.append(f"{name}: no alarm on ApproximateAgeOfOldestMessage below its retention ({retention:.0f} s): "
                       "a message could expire there unseen")
        dlq = ref(redrive["deadLetterTargetArn"])
        dlq_retention = number(res[dlq]["Properties"].get("MessageRetentionPeriod", 345600))
        if dlq_retention <= retention:
            bad.append(f"{name}: its dead-letter queue {dlq} keeps messages {dlq_retention:.0f} s, not longer "
                       f"than it does ({retention:.0f} s)")
    if bad:
        sys.exit("template checks:\n  " + "\n  ".join(bad))
    print(f"{path}: alarm topics publishable by CloudWatch ({len(topics)}); "
          "every queue's oldest message alarmed below its retention")


if __name__ == "__main__":
    check(sys.argv[1] if len(sys.argv) > 1 else "template.yaml")
