"""Every name template.yaml gives a resource must come from the stack name, so that a second
stack (another name, or the same name in another region) deploys beside the first, and must
fit its service's limit for every stack name up to MAX_STACK_NAME characters (the README's
promise). Names a user picks (the Glue database) and names CloudFormation generates are fine.
Usage: python scripts/template_names.py [template.yaml]   (run by `scripts/sam lint`)"""

import sys

from samtranslator.yaml_helper import yaml_parse

NAMED = {"BucketName", "QueueName", "TopicName", "LogGroupName", "DashboardName", "RoleName",
         "FunctionName", "StateMachineName", "TableName", "Name"}
# Names unique in the account across regions (the same stack name in two regions).
GLOBAL = {"DashboardName", "RoleName", "BucketName"}
# Resource types whose `Name` is not a resource name, or a name the user chooses.
NOT_NAMES = {"AWS::Glue::Database"}
# The longest stack name the template supports (README, "Deploy with AWS SAM"), and the
# longest region name, as they make derived names longest.
MAX_STACK_NAME = 64
MAX_REGION = 16
# Service limits of the names, per resource type and property.
LIMITS = {("AWS::SQS::Queue", "QueueName"): 80, ("AWS::SNS::Topic", "TopicName"): 256,
          ("AWS::Logs::LogGroup", "LogGroupName"): 512, ("AWS::CloudWatch::Dashboard", "DashboardName"): 255,
          ("AWS::Serverless::StateMachine", "Name"): 80, ("AWS::Events::Rule", "Name"): 64,
          ("AWS::IAM::Role", "RoleName"): 64, ("AWS::S3::Bucket", "BucketName"): 63}
# Names of event sources SAM turns into resources (a ScheduleV2's schedule: 64).
EVENT_LIMITS = {"ScheduleV2": 64, "Schedule": 64}


def longest(s):
    """The length of a Sub string with the longest stack and region names; None when it has
    another variable (of unknown length)."""
    rest = s.replace("${AWS::StackName}", "x" * MAX_STACK_NAME).replace("${AWS::Region}", "x" * MAX_REGION)
    return None if "${" in rest else len(rest)


def text(v):
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and "Fn::Sub" in v:
        sub = v["Fn::Sub"]
        return sub if isinstance(sub, str) else sub[0]
    if isinstance(v, dict) and "Ref" in v:
        return "Ref " + v["Ref"]
    return repr(v)


def check(path):
    t = yaml_parse(open(path).read())
    bad = []
    for rid, r in t["Resources"].items():
        props = r.get("Properties", {}) or {}
        if r["Type"] in NOT_NAMES:
            continue
        names = [(k, props[k], LIMITS.get((r["Type"], k))) for k in NAMED
                 if k in props and r["Type"] != "AWS::Serverless::Function"]
        for ev_id, ev in (props.get("Events") or {}).items():
            if "Name" in (ev.get("Properties") or {}):
                names.append((f"Events.{ev_id}.Name", ev["Properties"]["Name"], EVENT_LIMITS.get(ev.get("Type"))))
        for key, value, limit in names:
            if key == "FunctionName" and r["Type"] == "AWS::Lambda::EventSourceMapping":
                continue  # a reference, not a name
            s = text(value)
            if "AWS::StackName" not in s or (key in GLOBAL and "AWS::Region" not in s):
                bad.append(f"{rid}.{key} = {s!r}")
            elif limit is None:
                bad.append(f"{rid}.{key} = {s!r}: no length limit known for {r['Type']} {key} (add it to LIMITS)")
            elif longest(s) is None or longest(s) > limit:
                bad.append(f"{rid}.{key} = {s!r}: {longest(s)} characters with a {MAX_STACK_NAME}-character "
                           f"stack name, over the limit of {limit}")
    if bad:
        sys.exit("resource names (derived from the stack name, within their limits):\n  " + "\n  ".join(bad))
    print(f"{path}: every resource name is derived from the stack name and fits its limit "
          f"for stack names up to {MAX_STACK_NAME} characters")


if __name__ == "__main__":
    check(sys.argv[1] if len(sys.argv) > 1 else "template.yaml")
