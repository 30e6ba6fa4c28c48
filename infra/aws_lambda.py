"""Deploy devpilot-dispatch to AWS Lambda with boto3: one zip, one function per target, Function
URLs, a least-privilege execution role, and an EventBridge Scheduler schedule for the sweep.

Idempotent: every resource is looked up first and updated when it exists, created when not.
`--dry-run` prints every API call, in order, and makes none.

    python -m infra.aws_lambda [--dry-run] [--zip PATH] [--skip-dependencies]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from functions.routes import deployed_targets

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "devpilot"
# Every deployed row of the one route table; all are public URLs (the app checks bearer tokens and
# Linear signatures) except scheduler-only routes, which IAM guards.
TARGETS = tuple(t for t, _ in deployed_targets())
PUBLIC = tuple(t for t, exposure in deployed_targets() if exposure == "public")
# The zip is built for the Python that builds it (3.11 or newer, as pyproject.toml requires; each is
# a Lambda runtime): its wheels are that version's, and so is its bytecode, compiled at build time.
# Lambda's /var/task is read-only, so a module shipped without bytecode for the runtime's version
# is compiled again at every cold start, a cost that grows with the code and its dependencies.
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
RUNTIME = f"python{PYTHON}"
LAMBDA_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}
SCHEDULER_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "scheduler.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}
NOT_FOUND = ("ResourceNotFoundException", "NoSuchEntity", "NoSuchEntityException")
REQUIRED = ("AWS_REGION", "DATABASE_URL", "LINEAR_WEBHOOK_SECRET", "DEVPILOT_ADMIN_TOKEN")
PASSED_THROUGH = (
    "DATABASE_LISTEN_URL",
    "DEVPILOT_TRANSACTION_POOLER",
    "DEVPILOT_LEASE_SECONDS",
    "DEVPILOT_MAX_ATTEMPTS",
    "SUPABASE_URL",
    "SUPABASE_ANON_KEY",
    "SUPABASE_JWT_SECRET",
    "SUPABASE_JWT_PRIVATE_KEY",
    "SUPABASE_JWT_KID",
    "DEVPILOT_ENCRYPTION_KEYS",
    "LINEAR_CLIENT_ID",
    "LINEAR_CLIENT_SECRET",
    "LINEAR_SIGNIN_CLIENT_ID",
    "LINEAR_SIGNIN_CLIENT_SECRET",
    "DEVPILOT_PUBLIC_URL",
    "DEVPILOT_LOG_EMPTY_POLLS",
)


# Values never printed, dry run or not (the plan shows "<secret>" in their place).
SECRETS = (
    "DATABASE_URL",
    "DATABASE_LISTEN_URL",
    "LINEAR_WEBHOOK_SECRET",
    "DEVPILOT_ADMIN_TOKEN",
    "LINEAR_CLIENT_SECRET",
    "LINEAR_SIGNIN_CLIENT_SECRET",
    "DEVPILOT_ENCRYPTION_KEYS",
    "SUPABASE_JWT_SECRET",
    "SUPABASE_JWT_PRIVATE_KEY",
)
# deploy.sh's endpoints map: route name (as devpilot-orchestrator --endpoints takes it) -> target.
ENDPOINT_NAMES = {
    "claim": "claim",
    "ack": "ack",
    "release": "release",
    "activities": "activities",
    "realtimeToken": "realtime_token",
    "plan": "plan",
    "machine": "machine",
}


def _redacted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<secret>" if k in SECRETS else _redacted(v) for k, v in value.items()}
    return value


def function_name(target: str) -> str:
    return f"{PREFIX}-{target.replace('_', '-')}"


# Lambda writes a START and a REPORT line of its own for every invocation, billed as log ingestion
# like ours: an idle fleet polling every few seconds makes billions of invocations a month
# (bench/README.md). At system level WARN they are not written (Duration and Errors stay in
# CloudWatch's metrics); the JSON format is what lets Lambda read our lines' "level".
LOGGING = {"LogFormat": "JSON", "ApplicationLogLevel": "INFO", "SystemLogLevel": "WARN"}


@dataclass
class Plan:
    """Records (and unless dry) makes each AWS call, in order."""

    dry_run: bool
    clients: dict[str, Any] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def call(self, service: str, op: str, **kwargs: Any) -> Any:
        shown = {k: ("<zip bytes>" if k == "ZipFile" else _redacted(v)) for k, v in kwargs.items()}
        self.calls.append(f"{service}.{op} {json.dumps(shown, sort_keys=True, default=str)}")
        if self.dry_run:
            print(self.calls[-1])
            return None
        return getattr(self.clients[service], op)(**kwargs)

    def exists(self, service: str, op: str, **kwargs: Any) -> Any:
        """A read used to decide create vs update; a dry run assumes nothing exists yet."""
        if self.dry_run:
            return None
        from botocore.exceptions import ClientError

        try:
            return getattr(self.clients[service], op)(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in NOT_FOUND:
                return None
            raise


def build_zip(out: Path, *, skip_dependencies: bool = False) -> Path:
    """The project code plus Linux wheels of its dependencies, as one deployment zip."""
    build = Path(tempfile.mkdtemp(prefix="devpilot-lambda-"))
    try:
        if not skip_dependencies:
            deps = _dependencies()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--target",
                    str(build),
                    "--platform",
                    "manylinux2014_x86_64",
                    "--implementation",
                    "cp",
                    "--python-version",
                    PYTHON,
                    "--only-binary=:all:",
                    "--no-compile",  # compiled below, in the mode a read-only deployment needs
                    *deps,
                ],
                check=True,
            )
        for package in ("shared", "functions"):
            shutil.copytree(ROOT / package, build / package, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "infra" / "migrations", build / "infra" / "migrations")
        shutil.copytree(ROOT / "infra" / "supabase", build / "infra" / "supabase")
        shutil.copy(ROOT / "infra" / "__init__.py", build / "infra" / "__init__.py")  # the schema's package
        _compile(build)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(build.rglob("*")):
                if path.is_file():
                    z.write(path, path.relative_to(build))
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return out


def _compile(build: Path) -> None:
    """Bytecode for every module in the zip, for this Python. Unchecked hash-based .pyc (PEP 552):
    never compared with its source, whose modification time the zip does not keep exactly, so the
    runtime uses it as it is. Our own code must compile; a dependency's file that does not (a test
    or an example written for another Python) is left to be compiled if it is ever imported."""
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    ours = ("shared", "functions", "infra")
    for package in ours:
        if not compileall.compile_dir(build / package, quiet=1, invalidation_mode=mode):
            raise RuntimeError(f"{package}/ did not compile for Python {PYTHON}")
    for top in sorted(build.iterdir()):
        if top.is_dir() and top.name not in ours:
            compileall.compile_dir(top, quiet=2, workers=0, invalidation_mode=mode)
        elif top.suffix == ".py":
            compileall.compile_file(top, quiet=2, invalidation_mode=mode)


def _dependencies() -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # pgserver is the laptop's embedded database; a deployment always has DATABASE_URL.
    return [d for d in project["dependencies"] if not d.startswith("pgserver")]


def environment(env: dict[str, str]) -> dict[str, str]:
    out = {k: env[k] for k in REQUIRED if k != "AWS_REGION"}
    out.update({k: env[k] for k in PASSED_THROUGH if env.get(k)})
    return out


def deploy(
    env: dict[str, str], zip_bytes: bytes, plan: Plan, account_id: str, shape: str = "routes"
) -> dict[str, Any]:
    region = env["AWS_REGION"]
    exec_role = f"{PREFIX}-lambda-execution"
    sched_role = f"{PREFIX}-scheduler-invoke-sweep"
    exec_arn = f"arn:aws:iam::{account_id}:role/{exec_role}"
    sched_arn = f"arn:aws:iam::{account_id}:role/{sched_role}"
    sweep_arn = f"arn:aws:lambda:{region}:{account_id}:function:{function_name('sweep')}"

    # Execution role: CloudWatch logs only; the functions reach Postgres over the network.
    logs = f"arn:aws:logs:{region}:{account_id}:log-group:/aws/lambda/{PREFIX}-*"
    _role(
        plan,
        exec_role,
        LAMBDA_TRUST,
        "devpilot-dispatch functions: logs only",
        "write-own-logs",
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": [logs, f"{logs}:*"],
        },
    )

    variables = environment(env)
    urls: dict[str, str] = {}
    targets = deployed_targets(shape)
    public = {t for t, exposure in targets if exposure == "public"}
    for target, _ in targets:
        name = function_name(target)
        config: dict[str, Any] = {
            "FunctionName": name,
            "Runtime": RUNTIME,
            "Role": exec_arn,
            "Handler": f"functions.aws.{target}",
            "Timeout": 30 if target == "claim" else 15,
            "MemorySize": 512,
            "Environment": {"Variables": variables},
            "LoggingConfig": LOGGING,
        }
        if plan.exists("lambda", "get_function", FunctionName=name) is None:
            _create_function(plan, Code={"ZipFile": zip_bytes}, Publish=True, **config)
        else:
            plan.call("lambda", "update_function_code", FunctionName=name, ZipFile=zip_bytes, Publish=True)
            _wait_updated(plan, name)
            plan.call("lambda", "update_function_configuration", **config)
        auth = "NONE" if target in public else "AWS_IAM"
        existing = plan.exists("lambda", "get_function_url_config", FunctionName=name)
        if existing is None:
            made = plan.call("lambda", "create_function_url_config", FunctionName=name, AuthType=auth)
        else:
            made = plan.call("lambda", "update_function_url_config", FunctionName=name, AuthType=auth)
        if target in public:
            _allow_public_url(plan, name)
        if made:
            urls[target] = made["FunctionUrl"]

    # The scheduler's role may invoke the sweep function and nothing else.
    _role(
        plan,
        sched_role,
        SCHEDULER_TRUST,
        "EventBridge Scheduler: invoke the devpilot sweep",
        "invoke-sweep",
        {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": sweep_arn},
    )
    schedule = {
        "Name": f"{PREFIX}-sweep",
        "ScheduleExpression": "rate(1 minute)",
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "Target": {
            "Arn": sweep_arn,
            "RoleArn": sched_arn,
            "Input": json.dumps({"source": "devpilot.scheduler", "action": "sweep"}),
        },
        "State": "ENABLED",
    }
    if plan.exists("scheduler", "get_schedule", Name=schedule["Name"]) is None:
        plan.call("scheduler", "create_schedule", **schedule)
    else:
        plan.call("scheduler", "update_schedule", **schedule)
    return {"urls": urls, "executionRole": exec_arn, "schedulerRole": sched_arn}


def _role(
    plan: Plan, name: str, trust: dict[str, Any], description: str, policy: str, allows: dict[str, Any]
) -> None:
    """The IAM role `name` (made when missing, trusted by `trust`) with one inline policy `policy`
    that allows what `allows` says and nothing else (put again on every deploy)."""
    if plan.exists("iam", "get_role", RoleName=name) is None:
        plan.call(
            "iam",
            "create_role",
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps(trust),
            Description=description,
        )
    plan.call(
        "iam",
        "put_role_policy",
        RoleName=name,
        PolicyName=policy,
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [allows]}),
    )


def _allow_public_url(plan: Plan, name: str) -> None:
    """A public Function URL needs both permissions since October 2025: InvokeFunctionUrl (for auth
    type NONE) and InvokeFunction, the latter only when invoked through the Function URL."""
    grants = (
        ("public-function-url", {"Action": "lambda:InvokeFunctionUrl", "FunctionUrlAuthType": "NONE"}),
        ("public-function-url-invoke", {"Action": "lambda:InvokeFunction", "InvokedViaFunctionUrl": True}),
    )
    for sid, grant in grants:
        try:
            plan.call("lambda", "add_permission", FunctionName=name, StatementId=sid, Principal="*", **grant)
        except Exception as exc:  # already granted by an earlier run: keep it
            if "ResourceConflictException" not in type(exc).__name__ + str(exc):
                raise


def _create_function(plan: Plan, **config: Any) -> Any:
    """A new execution role takes a few seconds to be usable by Lambda ("The role defined for the
    function cannot be assumed by Lambda"): retry that, and only that, for up to a minute."""
    for attempt in range(12):
        try:
            return plan.call("lambda", "create_function", **config)
        except Exception as exc:
            if "cannot be assumed" not in str(exc) or attempt == 11:
                raise
            time.sleep(5)
    return None


def _wait_updated(plan: Plan, name: str) -> None:
    if plan.dry_run:
        return
    client = plan.clients["lambda"]
    # Older botocore or moto: no waiter, and the update is synchronous there.
    with contextlib.suppress(Exception):
        client.get_waiter("function_updated_v2").wait(FunctionName=name)


def missing_settings(env: dict[str, str]) -> list[str]:
    return [k for k in REQUIRED if not env.get(k)]


def main(
    argv: list[str] | None = None,
    *,
    clients: dict[str, Any] | None = None,
    printer: Callable[[str], None] = print,
) -> int:
    parser = argparse.ArgumentParser(prog="deploy.sh lambda")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--zip", type=Path, help="use this deployment zip instead of building one")
    parser.add_argument("--skip-dependencies", action="store_true", help="zip only the project code")
    parser.add_argument(
        "--shape",
        choices=["routes", "api"],
        default="routes",
        help="a function per route, or one for every route",
    )
    args = parser.parse_args(argv)
    env = dict(os.environ)
    missing = missing_settings(env)
    if missing:
        printer(f"deploy.sh lambda: missing settings: {', '.join(missing)} (see ./deploy.sh --help)")
        return 2
    if args.zip:
        zip_bytes = args.zip.read_bytes()
    elif args.dry_run:
        zip_bytes = b""
        printer(
            "build: pip install --platform manylinux2014_x86_64 --only-binary=:all: "
            f"--python-version {PYTHON} --no-compile --target <build> {' '.join(_dependencies())}; "
            "compile every module (unchecked-hash .pyc); zip shared/ functions/ infra/"
        )
    else:
        out = Path(tempfile.mkdtemp()) / "devpilot-lambda.zip"
        zip_bytes = build_zip(out, skip_dependencies=args.skip_dependencies).read_bytes()
    plan = Plan(dry_run=args.dry_run)
    account = "<account-id>"
    if not args.dry_run:
        import boto3

        region = env["AWS_REGION"]
        plan.clients = clients or {
            s: boto3.client(s, region_name=region) for s in ("iam", "lambda", "scheduler")
        }
        if clients is None:
            account = boto3.client("sts", region_name=region).get_caller_identity()["Account"]
        else:
            account = clients["sts"].get_caller_identity()["Account"] if "sts" in clients else "123456789012"
    result = deploy(env, zip_bytes, plan, account, args.shape)
    targets = [t for t, _ in deployed_targets(args.shape)]
    urls = result["urls"] if not args.dry_run else {t: f"<{function_name(t)} url>" for t in targets}
    for target, url in sorted(urls.items()):
        printer(f"{target}: {url}")
    if args.shape == "api":  # one URL: every route by path under it
        paths = {
            "claim": "claim",
            "ack": "ack",
            "release": "release",
            "activities": "activities",
            "realtimeToken": "realtime-token",
            "plan": "plan",
            "machine": "machine",
        }
        endpoints = {name: urls["api"].rstrip("/") + "/" + path for name, path in paths.items()}
    else:
        endpoints = {name: urls[t] for name, t in ENDPOINT_NAMES.items() if t in urls}
    path = Path(env.get("ENDPOINTS_FILE") or "devpilot-endpoints.json")
    if not args.dry_run:
        path.write_text(json.dumps(endpoints, indent=2) + "\n")
    printer(
        f"endpoints (devpilot-orchestrator --endpoints {path}; also DEVPILOT_ENDPOINTS for the functions):"
    )
    printer(json.dumps(endpoints))
    return 0


if __name__ == "__main__":
    sys.exit(main())
