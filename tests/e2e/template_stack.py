"""template.yaml deployed to LocalStack's CloudFormation, without what cannot run there.

The SAM template is transformed with the SAM translator (as `sam deploy` does), then the
Lambda functions and what only exists around them (event source mappings, the maintenance
schedule and state machine, the Glue database: LocalStack's free edition has neither
Lambda without Docker nor Glue) are removed; references to them become placeholders. What
remains — buckets and their policies, the S3 notification configuration, the queues with
their redrive policies, queue policies, the EventBridge rule, IAM roles, log groups,
alarms, dashboard — is created by CloudFormation from the template itself, and the
end-to-end tests run the real function binaries against it."""

import importlib.util
import json
import os
import re
import time
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parents[2]
# The SAM transform as `sam deploy` runs it, in one place: scripts/template_names.py.
_spec = importlib.util.spec_from_file_location("template_names", ROOT / "scripts" / "template_names.py")
template_names = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(template_names)
REMOVED_TYPES = ("AWS::Lambda::", "AWS::Scheduler::", "AWS::StepFunctions::", "AWS::Glue::")
ACCOUNT = template_names.ACCOUNT


def deployable(region):
    """The transformed template without the resources LocalStack cannot create."""
    out = template_names.transformed(str(ROOT / "template.yaml"), region)
    removed = {n for n, r in out["Resources"].items() if r["Type"].startswith(REMOVED_TYPES)}
    functions = {n: out["Resources"][n] for n in removed
                 if out["Resources"][n]["Type"] == "AWS::Lambda::Function"}
    full = json.loads(json.dumps(out))
    for n in removed:
        del out["Resources"][n]
    out = _replace_refs(out, removed)
    for r in out["Resources"].values():
        deps = r.get("DependsOn")
        if isinstance(deps, str):
            deps = [deps]
        if deps is not None:
            deps = [d for d in deps if d not in removed]
            if deps:
                r["DependsOn"] = deps
            else:
                r.pop("DependsOn")
    out["Functions"] = functions  # not template sections: deploy() takes them out
    out["Transformed"] = full  # everything, the removed resources included (iam.py)
    return out, sorted(removed)


def _replace_refs(node, removed):
    if isinstance(node, dict):
        if set(node) == {"Ref"} and node["Ref"] in removed:  # some are ARNs (state machine)
            return f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:removed-{node['Ref']}"
        if set(node) == {"Fn::GetAtt"}:
            target = node["Fn::GetAtt"]
            name = target[0] if isinstance(target, list) else target.split(".")[0]
            if name in removed:
                return f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:removed-{name}"
        if set(node) == {"Fn::Sub"}:
            sub = node["Fn::Sub"]
            pattern = re.compile(r"\$\{(" + "|".join(map(re.escape, removed)) + r")(\.[A-Za-z]+)?\}") if removed else None
            if isinstance(sub, str) and pattern:
                return {"Fn::Sub": pattern.sub(lambda m: f"removed-{m.group(1)}", sub)}
            if isinstance(sub, list) and pattern:
                return {"Fn::Sub": [pattern.sub(lambda m: f"removed-{m.group(1)}", sub[0]),
                                    _replace_refs(sub[1], removed)]}
        return {k: _replace_refs(v, removed) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace_refs(v, removed) for v in node]
    return node


class Resolver:
    """Values of the template's expressions in a deployed stack: what CloudFormation would
    give the functions (their environment), so that the functions run here exactly as the
    template configures them."""

    def __init__(self, template, parameters, resources, stack_name, region):
        self.t, self.resources, self.region = template, resources, region
        self.params = {k: v.get("Default", "") for k, v in template.get("Parameters", {}).items()}
        self.params.update(parameters or {})
        self.params.update({"AWS::StackName": stack_name, "AWS::Region": region,
                            "AWS::AccountId": ACCOUNT, "AWS::Partition": "aws",
                            "AWS::NoValue": None})

    def condition(self, name):
        return bool(self.value(self.t["Conditions"][name]))

    def arn(self, name):
        phys = self.resources[name]
        kind = self.t["Resources"][name]["Type"]
        if kind == "AWS::SQS::Queue":
            return f"arn:aws:sqs:{self.region}:{ACCOUNT}:{phys.rsplit('/', 1)[1]}"
        if kind == "AWS::S3::Bucket":
            return f"arn:aws:s3:::{phys}"
        if kind == "AWS::Lambda::Function":
            return f"arn:aws:lambda:{self.region}:{ACCOUNT}:function:{phys}"
        if kind in ("AWS::Events::Rule", "AWS::StepFunctions::StateMachine", "AWS::IAM::ManagedPolicy"):
            return phys if phys.startswith("arn:") else f"arn:aws:events:{self.region}:{ACCOUNT}:rule/{phys}"
        if kind == "AWS::IAM::Role":
            return f"arn:aws:iam::{ACCOUNT}:role/{phys}"
        raise NotImplementedError(kind)

    def transformed(self, **parameters):
        """A resolver of the whole transformed template — the resources removed for
        LocalStack included, each with the physical id AWS would give it (a function's
        name, a state machine's ARN) — for what exists around them (roles, policies);
        `parameters` override the stack's (what the policies would be with them)."""
        full = self.t["Transformed"]
        resources = dict(self.resources)
        for name, r in full["Resources"].items():
            if name in resources:
                continue
            if r["Type"] == "AWS::Lambda::Function":
                resources[name] = f"{self.params['AWS::StackName']}-{name}"
            elif r["Type"] == "AWS::StepFunctions::StateMachine":
                sm = self.value(r["Properties"].get("StateMachineName", name))
                resources[name] = f"arn:aws:states:{self.region}:{ACCOUNT}:stateMachine:{sm}"
        params = {k: v for k, v in self.params.items() if not k.startswith("AWS::")}
        out = Resolver(dict(full, Functions=self.t["Functions"]), params, resources,
                       self.params["AWS::StackName"], self.region)
        out.params = dict(self.params, **parameters)
        return out

    def value(self, node, local=None):
        local = local or {}
        if isinstance(node, list):
            return [self.value(v, local) for v in node]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            return {k: self.value(v, local) for k, v in node.items()}
        (fn, arg), = node.items()
        if fn == "Ref":
            return self.params[arg] if arg in self.params else self.resources[arg]
        if fn == "Fn::GetAtt":
            name, attr = arg if isinstance(arg, list) else arg.split(".", 1)
            assert attr == "Arn", attr
            return self.arn(name)
        if fn == "Fn::If":
            return self.value(arg[1] if self.condition(arg[0]) else arg[2], local)
        if fn == "Condition":
            return self.condition(arg)
        if fn == "Fn::Equals":
            a, b = self.value(arg, local)
            return str(a) == str(b)
        if fn == "Fn::Not":
            return not self.value(arg[0], local)
        if fn == "Fn::And":
            return all(self.value(a, local) for a in arg)
        if fn == "Fn::Or":
            return any(self.value(a, local) for a in arg)
        if fn == "Fn::Join":
            return arg[0].join(str(v) for v in self.value(arg[1], local))
        if fn == "Fn::Select":
            return self.value(arg[1], local)[int(arg[0])]
        if fn == "Fn::Split":
            return self.value(arg[1], local).split(arg[0])
        if fn == "Fn::Sub":
            text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
            names = dict(local, **{k: self.value(v, local) for k, v in extra.items()})

            def one(m):
                key = m.group(1)
                if key in names:
                    return str(names[key])
                if key.endswith(".Arn"):
                    return self.arn(key[:-4])
                return str(self.value({"Ref": key}))
            return re.sub(r"\$\{([^}]+)\}", one, text)
        return {fn: self.value(arg, local)}

    def environment(self, function):
        """The environment variables CloudFormation would give `function`."""
        variables = self.t["Functions"][function]["Properties"]["Environment"]["Variables"]
        return {k: str(self.value(v)) for k, v in variables.items()}


# The name property of the resource types whose physical id is their name.
NAME_PROPERTY = {"AWS::SQS::Queue": "QueueName", "AWS::S3::Bucket": "BucketName", "AWS::IAM::Role": "RoleName",
                 "AWS::Events::Rule": "Name", "AWS::Lambda::Function": "FunctionName",
                 "AWS::StepFunctions::StateMachine": "StateMachineName"}


def synthetic(parameters=None, stack_name="tributary-synthetic", region="us-east-1"):
    """A `Resolver` of the whole transformed template for a stack that is not deployed (no
    emulator): each resource with the physical id CloudFormation would give it — its name
    property resolved when it has one, `<stack>-<logical id>-<suffix>` otherwise (lower case
    for a bucket) — so that its policies can be resolved and evaluated as they would be in
    the account (ACCOUNT)."""
    full = template_names.transformed(str(ROOT / "template.yaml"), region)
    resolve = Resolver(full, parameters, {}, stack_name, region)
    resolve.params["AWS::StackId"] = (f"arn:aws:cloudformation:{region}:{ACCOUNT}:stack/{stack_name}/"
                                      "8c0e7bd0-1f2a-11ef-9f1d-0a1b2c3d4e5f")
    for name, r in full["Resources"].items():
        kind, props = r["Type"], r.get("Properties", {})
        own = NAME_PROPERTY.get(kind)
        phys = str(resolve.value(props[own])) if own in props else f"{stack_name}-{name}-1A2B3C4D5E6F"
        if kind == "AWS::SQS::Queue":
            phys = f"https://sqs.{region}.amazonaws.com/{ACCOUNT}/{phys}"
        elif kind == "AWS::S3::Bucket":
            phys = phys.lower()
        elif kind == "AWS::StepFunctions::StateMachine":
            phys = f"arn:aws:states:{region}:{ACCOUNT}:stateMachine:{phys}"
        resolve.resources[name] = phys
    return resolve


def _decide_conditions(body, resolver):
    """The template with its conditions decided for these parameters, as CloudFormation
    decides them: the branch of each `Fn::If`, without the resources and outputs whose
    condition is false. (LocalStack 4.9 refuses a reference to a resource left out by its
    condition even inside the `Fn::If` that guards it.)"""
    def walk(node):
        if isinstance(node, dict):
            if set(node) == {"Fn::If"}:
                c, yes, no = node["Fn::If"]
                return walk(yes if resolver.condition(c) else no)
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    out = dict(body)
    for section in ("Resources", "Outputs"):
        out[section] = {k: walk(v) for k, v in body.get(section, {}).items()
                        if "Condition" not in v or resolver.condition(v["Condition"])}
    return out


def deploy(endpoint, creds, region, name, parameters=None, timeout=240):
    """Create the stack; its outputs, physical resource ids and a [`Resolver`]."""
    body, _ = deployable(region)
    template = dict(body)
    body = _decide_conditions({k: v for k, v in body.items() if k not in ("Functions", "Transformed")},
                              Resolver(template, parameters, {}, name, region))
    cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name=region, **creds)
    cfn.create_stack(
        StackName=name, TemplateBody=json.dumps(body),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in (parameters or {}).items()],
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"])
    deadline = time.time() + timeout
    while time.time() < deadline:
        stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
        status = stack["StackStatus"]
        if status == "CREATE_COMPLETE":
            resources = {r["LogicalResourceId"]: r["PhysicalResourceId"]
                         for r in cfn.describe_stack_resources(StackName=name)["StackResources"]}
            outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
            return outputs, resources, Resolver(template, parameters, resources, name, region)
        if status.endswith("FAILED") or status.startswith("ROLLBACK"):
            events = cfn.describe_stack_events(StackName=name)["StackEvents"]
            reasons = [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in events
                       if "FAILED" in e["ResourceStatus"]]
            raise AssertionError(f"stack {name}: {status}: {reasons}")
        time.sleep(1)
    raise AssertionError(f"stack {name} not created in {timeout} s")
