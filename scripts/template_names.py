"""Every name a deployed stack gives a resource must be unique to the stack, so that a second
stack (another name, or the same name in another region) deploys beside the first, and must
fit its service's limit for every stack name up to MAX_STACK_NAME characters (docs/deploy.md's
promise). Checked on the template as `sam deploy` sends it — transformed by the SAM
translator — because SAM names some resources itself: a ScheduleV2 event without a `Name`
becomes an `AWS::Scheduler::Schedule` named after its logical id, the same in every stack
(SAM issue #3109), which template.yaml alone does not show. A name is unique to the stack
when it is built from `${AWS::StackName}` (with `${AWS::Region}` for names unique across
regions) or from the stack id; names a user picks (the Glue database) and names
CloudFormation generates (no name property) are fine.
Usage: python scripts/template_names.py [template.yaml]   (run by `scripts/sam lint`)"""

import json
import os
import sys

from cfnlint.decode import decode_str
from samtranslator.translator.transform import transform

NAMED = {"BucketName", "QueueName", "TopicName", "LogGroupName", "DashboardName", "RoleName",
         "FunctionName", "StateMachineName", "TableName", "Name", "AlarmName", "ScheduleName",
         "GroupName", "PolicyName", "ManagedPolicyName", "KeyAlias", "AliasName"}
# Names unique in the account across regions (the same stack name in two regions).
GLOBAL = {"DashboardName", "RoleName", "BucketName", "ManagedPolicyName"}
# (type, property) pairs that refer to a resource rather than name one, and types whose
# names the user chooses.
REFERENCES = {("AWS::Lambda::EventSourceMapping", "FunctionName"),
              ("AWS::Lambda::Permission", "FunctionName"),
              ("AWS::Lambda::EventInvokeConfig", "FunctionName"),
              ("AWS::IAM::Policy", "PolicyName")}  # inline policies: scoped to their role
NOT_NAMES = {"AWS::Glue::Database"}
# The longest stack name the template supports (docs/deploy.md, "Deploy with AWS SAM"), the longest
# region name, and a stack id's UUID, as they make derived names longest.
MAX_STACK_NAME = 64
MAX_REGION = 16
STACK_UUID = 36
# Service limits of the names, per resource type and property.
LIMITS = {("AWS::SQS::Queue", "QueueName"): 80, ("AWS::SNS::Topic", "TopicName"): 256,
          ("AWS::Logs::LogGroup", "LogGroupName"): 512, ("AWS::CloudWatch::Dashboard", "DashboardName"): 255,
          ("AWS::StepFunctions::StateMachine", "StateMachineName"): 80, ("AWS::Events::Rule", "Name"): 64,
          ("AWS::IAM::Role", "RoleName"): 64, ("AWS::S3::Bucket", "BucketName"): 63,
          ("AWS::Scheduler::Schedule", "Name"): 64, ("AWS::Lambda::Function", "FunctionName"): 64,
          ("AWS::CloudWatch::Alarm", "AlarmName"): 255}
ACCOUNT = "000000000000"


class _Policies:
    """AWS managed policy names → ARNs (the translator asks IAM otherwise)."""

    def load(self):
        class Arns(dict):
            def __missing__(self, name):
                return f"arn:aws:iam::aws:policy/service-role/{name}"
        return Arns()


def transformed(path, region="us-east-1"):
    """The template as `sam deploy` sends it to CloudFormation."""
    os.environ.setdefault("AWS_DEFAULT_REGION", region)  # the translator reads it
    template, errors = decode_str(open(path).read())
    if errors:
        sys.exit(f"{path}: {errors}")
    template = json.loads(json.dumps(template))
    template.setdefault("Globals", {}).setdefault("Function", {})["CodeUri"] = "s3://placeholder/bootstrap.zip"
    for r in template["Resources"].values():
        if r["Type"] == "AWS::Serverless::Function":
            r["Properties"].pop("CodeUri", None)
    return transform(template, {"AWS::Region": region, "AWS::AccountId": ACCOUNT,
                                "AWS::Partition": "aws"}, _Policies())


def name_of(value):
    """(text, unique to the stack, unique across regions, longest length or None) of a name
    property's value."""
    variables = {}
    if isinstance(value, dict) and "Fn::Sub" in value:
        sub = value["Fn::Sub"]
        if isinstance(sub, list):
            sub, variables = sub[0], sub[1]
        text = sub
    elif isinstance(value, str):
        text = value
    else:
        return repr(value), False, False, None
    stack_id = [k for k, v in variables.items() if "AWS::StackId" in json.dumps(v)]
    rest = text.replace("${AWS::StackName}", "x" * MAX_STACK_NAME).replace("${AWS::Region}", "x" * MAX_REGION)
    for k in stack_id:
        rest = rest.replace("${" + k + "}", "x" * STACK_UUID)
    by_stack = "${AWS::StackName}" in text or any("${" + k + "}" in text for k in stack_id)
    # A stack id is unique across regions too; a stack name needs the region beside it.
    across_regions = any("${" + k + "}" in text for k in stack_id) or "${AWS::Region}" in text
    return text, by_stack, across_regions, None if "${" in rest else len(rest)


def problems(template):
    bad = []
    for rid, r in template["Resources"].items():
        if r["Type"] in NOT_NAMES:
            continue
        props = r.get("Properties", {}) or {}
        for key in sorted(NAMED & set(props)):
            if (r["Type"], key) in REFERENCES:
                continue
            text, by_stack, across_regions, length = name_of(props[key])
            limit = LIMITS.get((r["Type"], key))
            where = f"{rid} ({r['Type']}).{key} = {text!r}"
            if not by_stack or (key in GLOBAL and not across_regions):
                bad.append(f"{where}: not unique to the stack (build it from ${{AWS::StackName}} or the stack id)")
            elif limit is None:
                bad.append(f"{where}: no length limit known (add it to LIMITS)")
            elif length is None or length > limit:
                bad.append(f"{where}: {length} characters with a {MAX_STACK_NAME}-character stack name, "
                           f"over the limit of {limit}")
    return bad


def check(path):
    template = transformed(path)
    bad = problems(template)
    if bad:
        sys.exit("resource names of the transformed template (unique to the stack, within their limits):\n  "
                 + "\n  ".join(bad))
    named = sum(1 for r in template["Resources"].values()
                if NAMED & set(r.get("Properties", {}) or {}))
    print(f"{path}: every resource name of the transformed template ({named} named resources) is unique "
          f"to the stack and fits its limit for stack names up to {MAX_STACK_NAME} characters")


if __name__ == "__main__":
    check(sys.argv[1] if len(sys.argv) > 1 else "template.yaml")
