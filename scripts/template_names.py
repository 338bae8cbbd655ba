"""Every name template.yaml gives a resource must come from the stack name, so that a second
stack (another name, or the same name in another region) deploys beside the first. Names a
user picks (the Glue database) and names CloudFormation generates are fine.
Usage: python scripts/template_names.py [template.yaml]   (run by `scripts/sam lint`)"""

import sys

from samtranslator.yaml_helper import yaml_parse

NAMED = {"BucketName", "QueueName", "TopicName", "LogGroupName", "DashboardName", "RoleName",
         "FunctionName", "StateMachineName", "TableName", "Name"}
# Names unique in the account across regions (the same stack name in two regions).
GLOBAL = {"DashboardName", "RoleName", "BucketName"}
# Resource types whose `Name` is not a resource name, or a name the user chooses.
NOT_NAMES = {"AWS::Glue::Database"}


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
        names = [(k, props[k]) for k in NAMED if k in props and r["Type"] != "AWS::Serverless::Function"]
        for ev_id, ev in (props.get("Events") or {}).items():
            if "Name" in (ev.get("Properties") or {}):
                names.append((f"Events.{ev_id}.Name", ev["Properties"]["Name"]))
        for key, value in names:
            if key == "FunctionName" and r["Type"] == "AWS::Lambda::EventSourceMapping":
                continue  # a reference, not a name
            s = text(value)
            if "AWS::StackName" not in s or (key in GLOBAL and "AWS::Region" not in s):
                bad.append(f"{rid}.{key} = {s!r}")
    if bad:
        sys.exit("names not derived from the stack name:\n  " + "\n  ".join(bad))
    print(f"{path}: every resource name is derived from the stack name")


if __name__ == "__main__":
    check(sys.argv[1] if len(sys.argv) > 1 else "template.yaml")
