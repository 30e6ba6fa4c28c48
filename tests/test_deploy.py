"""Deploy paths: Lambda end to end under moto (mock_aws); Cloud Run from --dry-run and, for real, against
a gcloud stand-in (tests/helpers/gcloud_standin.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from functions.routes import ROUTES

ROOT = Path(__file__).parent.parent
ENV = {
    "AWS_REGION": "us-east-1",
    "DATABASE_URL": "postgresql://app@db.example:6543/postgres",
    "LINEAR_WEBHOOK_SECRET": "lin-secret",
    "DEVPILOT_ADMIN_TOKEN": "adm-token",
    "DEVPILOT_TRANSACTION_POOLER": "1",
    "DEVPILOT_LOG_EMPTY_POLLS": "1",
}
# What the deploy must cover: every deployed row of the one route table.
TARGETS = tuple(r.name for r in ROUTES if r.deployed)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    import boto3
    from moto import mock_aws

    for k, v in {
        **ENV,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        yield {s: boto3.client(s, region_name="us-east-1") for s in ("iam", "lambda", "scheduler", "sts")}


@pytest.fixture(scope="module")
def code_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from infra.aws_lambda import build_zip

    return build_zip(tmp_path_factory.mktemp("zip") / "code.zip", skip_dependencies=True)


def test_zip_holds_the_code_and_migrations(code_zip: Path) -> None:
    names = set(zipfile.ZipFile(code_zip).namelist())
    assert {
        "functions/aws.py",
        "functions/main.py",
        "shared/queries/queue.sql",
        "shared/delivery/queue.py",
        "infra/migrations/0001_dispatch_core.sql",
        "infra/supabase/0001_realtime.sql",
        "infra/__init__.py",
    } <= names
    # Bytecode for the runtime (this Python, PEP 3147 tag), built with the zip: never a stale local
    # __pycache__, and every module of ours has it.
    tag = sys.implementation.cache_tag
    pycs = {n for n in names if n.endswith(".pyc")}
    assert pycs and all(n.endswith(f".{tag}.pyc") for n in pycs), sorted(pycs)[:5]
    for source in (n for n in names if n.endswith(".py")):
        folder, _, module = source.rpartition("/")
        assert f"{folder}/__pycache__/{module[:-3]}.{tag}.pyc" in pycs, source


def test_the_zip_runs_its_compiled_code_without_looking_at_the_sources(
    code_zip: Path, tmp_path: Path
) -> None:
    """Lambda's /var/task is read-only: code without bytecode for the runtime would be compiled
    again at every cold start. The zip's bytecode is used as it is (unchecked hash, PEP 552: the
    zip keeps no exact modification time to compare): here a source changed after the build is
    not even read."""
    task = tmp_path / "task"
    zipfile.ZipFile(code_zip).extractall(task)
    (task / "shared" / "delivery" / "queue.py").write_text("raise SystemExit('compiled at start')\n")
    r = subprocess.run(
        [
            sys.executable,
            "-B",
            "-c",
            "import functions.main as m, shared.delivery.queue as q; m.claim; print(q.__file__)",
        ],
        cwd=task,
        env={**os.environ, "PYTHONPATH": str(task)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(task / "shared" / "delivery" / "queue.py")


def test_lambda_deploy_creates_then_updates(
    aws: dict[str, Any], code_zip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.aws_lambda import function_name, main

    endpoints_file = tmp_path / "endpoints.json"
    monkeypatch.setenv("ENDPOINTS_FILE", str(endpoints_file))
    out: list[str] = []
    assert main(["--zip", str(code_zip)], clients=aws, printer=out.append) == 0
    lam, iam, sched = aws["lambda"], aws["iam"], aws["scheduler"]
    functions = {f["FunctionName"]: f for f in lam.list_functions()["Functions"]}
    assert set(functions) == {function_name(t) for t in TARGETS}
    for t in TARGETS:
        f = functions[function_name(t)]
        # The zip's wheels and bytecode are this Python's, and so is the runtime.
        assert (
            f["Handler"] == f"functions.aws.{t}"
            and f["Runtime"] == f"python{sys.version_info[0]}.{sys.version_info[1]}"
        )
        assert f["Role"].endswith(":role/devpilot-lambda-execution")
        env = f["Environment"]["Variables"]
        assert env["DATABASE_URL"] == ENV["DATABASE_URL"] and env["DEVPILOT_ADMIN_TOKEN"] == "adm-token"
        assert env["LINEAR_WEBHOOK_SECRET"] == "lin-secret" and env["DEVPILOT_TRANSACTION_POOLER"] == "1"
        assert env["DEVPILOT_LOG_EMPTY_POLLS"] == "1"
        url = lam.get_function_url_config(FunctionName=function_name(t))
        assert url["AuthType"] == ("AWS_IAM" if t == "sweep" else "NONE")
    url_lines = [line for line in out if ": https://" in line]
    assert len(url_lines) == len(TARGETS) and all(".lambda-url." in line for line in url_lines)
    for t in TARGETS:  # a public Function URL needs both permissions; the sweep's is IAM-only
        policy = json.loads(lam.get_policy(FunctionName=function_name(t))["Policy"]) if t != "sweep" else None
        if policy is not None:
            actions = {st["Action"] for st in policy["Statement"]}
            assert actions == {"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"}  # (conditions: dry run)
    printed = "\n".join(out)
    for secret in ("adm-token", "lin-secret", ENV["DATABASE_URL"]):
        assert secret not in printed
    endpoints = json.loads(endpoints_file.read_text())
    assert set(endpoints) == {"claim", "ack", "release", "activities", "realtimeToken", "plan", "machine"}
    assert (
        json.dumps(endpoints) in printed and endpoints["claim"] == functions["devpilot-claim"]["FunctionUrl"]
        if "FunctionUrl" in functions["devpilot-claim"]
        else True
    )

    role = iam.get_role(RoleName="devpilot-lambda-execution")["Role"]
    assert "lambda.amazonaws.com" in str(role["AssumeRolePolicyDocument"])
    assert iam.list_attached_role_policies(RoleName="devpilot-lambda-execution")["AttachedPolicies"] == []
    assert iam.list_role_policies(RoleName="devpilot-lambda-execution")["PolicyNames"] == ["write-own-logs"]
    logs = iam.get_role_policy(RoleName="devpilot-lambda-execution", PolicyName="write-own-logs")[
        "PolicyDocument"
    ]
    [stmt] = logs["Statement"]
    assert set(stmt["Action"]) == {"logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"}
    assert all("/aws/lambda/devpilot-" in r for r in stmt["Resource"])
    invoke = iam.get_role_policy(RoleName="devpilot-scheduler-invoke-sweep", PolicyName="invoke-sweep")
    statement = invoke["PolicyDocument"]["Statement"]
    assert statement == [
        {
            "Effect": "Allow",
            "Action": "lambda:InvokeFunction",
            "Resource": functions["devpilot-sweep"]["FunctionArn"],
        }
    ]

    schedule = sched.get_schedule(Name="devpilot-sweep")
    assert schedule["ScheduleExpression"] == "rate(1 minute)"
    assert schedule["Target"]["Arn"] == functions["devpilot-sweep"]["FunctionArn"]
    assert schedule["Target"]["RoleArn"].endswith(":role/devpilot-scheduler-invoke-sweep")

    # a second run updates in place
    os.environ["DEVPILOT_LEASE_SECONDS"] = "90"
    try:
        assert main(["--zip", str(code_zip)], clients=aws, printer=out.append) == 0
    finally:
        del os.environ["DEVPILOT_LEASE_SECONDS"]
    again = lam.list_functions()["Functions"]
    assert len(again) == len(TARGETS)
    assert all(f["Environment"]["Variables"]["DEVPILOT_LEASE_SECONDS"] == "90" for f in again)
    assert len(sched.list_schedules()["Schedules"]) == 1
    assert len([r for r in iam.list_roles()["Roles"] if r["RoleName"].startswith("devpilot-")]) == 2


def run_deploy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("GCP_", "AWS_", "SECRET_")) and k not in ENV
    }
    return subprocess.run(
        ["bash", str(ROOT / "deploy.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=120,
    )


def test_cloudrun_dry_run_plan() -> None:
    r = run_deploy("cloudrun", "--dry-run", env={"GCP_PROJECT": "acme-prod", "GCP_REGION": "europe-west1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    deploys = [line for line in lines if line.startswith("gcloud run deploy ")]
    assert len(deploys) == len(TARGETS)
    assert not any("DEVPILOT_LOG_EMPTY_POLLS" in d for d in deploys)  # (off unless asked for)
    asked = run_deploy(
        "cloudrun",
        "--dry-run",
        env={"GCP_PROJECT": "acme-prod", "GCP_REGION": "europe-west1", "DEVPILOT_LOG_EMPTY_POLLS": "1"},
    )
    asked_deploys = [line for line in asked.stdout.splitlines() if line.startswith("gcloud run deploy ")]
    assert len(asked_deploys) == len(TARGETS)
    assert all("DEVPILOT_LOG_EMPTY_POLLS=1" in d for d in asked_deploys)
    for t in TARGETS:
        [line] = [d for d in deploys if f" --function {t} " in d]
        assert f"gcloud run deploy devpilot-{t.replace('_', '-')} --source . " in line
        assert "--set-secrets DATABASE_URL=devpilot-database-url:latest" in line
        assert ("--no-allow-unauthenticated" in line) == (t == "sweep")
        assert ("--allow-unauthenticated" in line) == (t != "sweep")
    sa = "devpilot-sweep-invoker@acme-prod.iam.gserviceaccount.com"
    assert any(line.startswith("gcloud iam service-accounts create devpilot-sweep-invoker") for line in lines)
    [binding] = [line for line in lines if line.startswith("gcloud run services add-iam-policy-binding")]
    assert (
        "devpilot-sweep" in binding and f"serviceAccount:{sa}" in binding and "roles/run.invoker" in binding
    )
    [job] = [line for line in lines if line.startswith("gcloud scheduler jobs create http devpilot-sweep")]
    assert f"--oidc-service-account-email {sa}" in job and "--schedule '* * * * *'" in job
    runtime = "devpilot-runtime@acme-prod.iam.gserviceaccount.com"
    grants = [line for line in lines if line.startswith("gcloud secrets add-iam-policy-binding")]
    assert {g.split()[3] for g in grants} == {
        "devpilot-database-url",
        "devpilot-linear-webhook-secret",
        "devpilot-admin-token",
    }
    assert all(f"serviceAccount:{runtime}" in g and "roles/secretmanager.secretAccessor" in g for g in grants)
    assert all(f"--service-account {runtime}" in d for d in deploys)


def test_cloudrun_plan_runs_as_printed(tmp_path: Path) -> None:
    """The scheduler job and the endpoints map, pasted from the dry run into a shell, run: a fake
    gcloud records its arguments and answers service URLs."""
    r = run_deploy("cloudrun", "--dry-run", env={"GCP_PROJECT": "acme-prod", "GCP_REGION": "europe-west1"})
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SWEEP_URL="))
    pasted = [line for line in lines[start:] if not line.startswith("endpoints (")]
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2 $3" = "run services describe" ]; then echo "https://$4.example"; exit 0; fi\n'
        'printf "%s\\n" "$@" > "$(dirname "$0")/../scheduler-args"\n'
    )
    fake.chmod(0o755)
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(pasted)],
        cwd=tmp_path,
        env={"PATH": f"{fake.parent}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    args = (tmp_path / "scheduler-args").read_text().splitlines()
    assert args[args.index("--schedule") + 1] == "* * * * *"
    assert args[args.index("--uri") + 1] == "https://devpilot-sweep.example/"
    assert args[args.index("--oidc-token-audience") + 1] == "https://devpilot-sweep.example"
    endpoints = json.loads((tmp_path / "devpilot-endpoints.json").read_text())
    assert endpoints["claim"] == "https://devpilot-claim.example/"
    assert endpoints["realtimeToken"] == "https://devpilot-realtime-token.example/"


def test_cloudrun_deploy_twice_updates_in_place(tmp_path: Path) -> None:
    """The real run (not the dry run) against a gcloud stand-in that keeps what it creates and
    refuses what gcloud refuses: the second deploy adds a revision to every service, creates no
    second account and updates the scheduler job instead of creating it again."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests/helpers/gcloud_standin.py"} "$@"\n')
    gcloud.chmod(0o755)
    state = tmp_path / "gcloud.json"
    env = {
        "GCP_PROJECT": "acme-prod",
        "GCP_REGION": "europe-west1",
        "GCLOUD_STANDIN_STATE": str(state),
        "ENDPOINTS_FILE": str(tmp_path / "endpoints.json"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    first = run_deploy("cloudrun", env=env)
    assert first.returncode == 0, first.stderr
    endpoints = json.loads((tmp_path / "endpoints.json").read_text())
    second = run_deploy("cloudrun", env=env)
    assert second.returncode == 0, second.stderr
    assert json.loads((tmp_path / "endpoints.json").read_text()) == endpoints
    assert endpoints["claim"] == "https://devpilot-claim-abc123.a.run.app/"

    world = json.loads(state.read_text())
    services = {f"devpilot-{t.replace('_', '-')}": t for t in TARGETS}
    assert {name: s["function"] for name, s in world["services"].items()} == services
    assert all(s["revisions"] == 2 for s in world["services"].values())  # updated, not duplicated
    assert sorted(world["accounts"]) == [
        "devpilot-runtime@acme-prod.iam.gserviceaccount.com",
        "devpilot-sweep-invoker@acme-prod.iam.gserviceaccount.com",
    ]
    verbs = [c[2] for c in world["calls"] if c[:2] == ["scheduler", "jobs"] and c[2] != "describe"]
    assert verbs == ["create", "update"]
    assert world["jobs"]["devpilot-sweep"] == {
        "uri": "https://devpilot-sweep-abc123.a.run.app/",
        "updates": 1,
    }
    creates = [c for c in world["calls"] if c[:3] == ["iam", "service-accounts", "create"]]
    assert len(creates) == 2  # one per account, both on the first run


def test_lambda_dry_run_prints_the_calls_in_order() -> None:
    r = run_deploy("lambda", "--dry-run", env=ENV)
    assert r.returncode == 0, r.stderr
    calls = [
        line.split()[0]
        for line in r.stdout.splitlines()
        if line.startswith(("iam.", "lambda.", "scheduler."))
    ]
    assert calls[0] == "iam.create_role" and calls[-1] == "scheduler.create_schedule"
    assert calls.count("lambda.create_function") == len(TARGETS)
    # Lambda's own START and REPORT lines per invocation are not written (billed like ours; the
    # moto run above checks the setting's shape against botocore's model, moto keeps no copy).
    creates = [line for line in r.stdout.splitlines() if line.startswith("lambda.create_function ")]
    for line in creates:
        config = json.loads(line.split(" ", 1)[1])["LoggingConfig"]
        assert config == {"LogFormat": "JSON", "ApplicationLogLevel": "INFO", "SystemLogLevel": "WARN"}
    assert calls.count("lambda.create_function_url_config") == len(TARGETS)
    assert calls.count("lambda.add_permission") == 2 * (len(TARGETS) - 1)  # both, on every public URL
    grants = [line for line in r.stdout.splitlines() if line.startswith("lambda.add_permission")]
    assert (
        sum('"FunctionUrlAuthType": "NONE"' in g and "InvokeFunctionUrl" in g for g in grants)
        == len(TARGETS) - 1
    )
    assert (
        sum('"InvokedViaFunctionUrl": true' in g and '"lambda:InvokeFunction"' in g for g in grants)
        == len(TARGETS) - 1
    )
    for secret in ("adm-token", "lin-secret", ENV["DATABASE_URL"]):  # the plan shows no secret
        assert secret not in r.stdout and secret not in r.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("nope",), {}, "unknown target"),
        (("cloudrun", "--dry-run"), {}, "missing settings: GCP_PROJECT GCP_REGION"),
        (("lambda",), {"AWS_REGION": "us-east-1"}, "missing settings: DATABASE_URL"),
        (("migrate",), {}, "MIGRATE_DATABASE_URL or DATABASE_URL"),
    ],
)
def test_bad_invocations_fail_before_touching_anything(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    r = run_deploy(*args, env=env)
    assert r.returncode != 0 and message in r.stderr
    assert "gcloud " not in r.stdout and "create_" not in r.stdout


def test_migrate_target_migrates(db_url: str) -> None:
    r = run_deploy("migrate", env={"MIGRATE_DATABASE_URL": db_url})
    assert r.returncode == 0, r.stderr
    assert "schema up to date" in r.stdout


@pytest.mark.heavy
def test_zip_with_linux_wheels(tmp_path: Path) -> None:
    from infra.aws_lambda import build_zip

    names = set(zipfile.ZipFile(build_zip(tmp_path / "full.zip")).namelist())
    assert any(n.startswith("psycopg_binary") for n in names) and any(
        n.startswith("apig_wsgi") for n in names
    )
    # The dependencies' bytecode is the runtime's too (not the building pip's own choice).
    assert f"psycopg/__pycache__/__init__.{sys.implementation.cache_tag}.pyc" in names


def test_the_api_shape_deploys_one_url_for_every_route_and_the_sweep_apart() -> None:
    r = run_deploy(
        "cloudrun", "--dry-run", "--shape=api", env={"GCP_PROJECT": "acme-prod", "GCP_REGION": "europe-west1"}
    )
    assert r.returncode == 0, r.stderr
    deploys = [line for line in r.stdout.splitlines() if line.startswith("gcloud run deploy ")]
    assert [d.split()[3] for d in deploys] == ["devpilot-api", "devpilot-sweep"]
    assert "--allow-unauthenticated" in deploys[0] and "--no-allow-unauthenticated" in deploys[1]
    r = run_deploy("lambda", "--dry-run", "--shape=api", env=ENV)
    assert r.returncode == 0, r.stderr
    created = [line for line in r.stdout.splitlines() if line.startswith("lambda.create_function ")]
    assert ['"functions.aws.api"' in c for c in created] == [
        True,
        False,
    ] and '"functions.aws.sweep"' in created[1]
    endpoints = json.loads(r.stdout.strip().splitlines()[-1])
    assert endpoints["claim"].endswith("/claim") and endpoints["realtimeToken"].endswith("/realtime-token")
