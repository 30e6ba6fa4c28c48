#!/usr/bin/env bash
# deploy.sh cloudrun|lambda|migrate [--dry-run] — deploy devpilot-dispatch from this checkout.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
  cat <<'USAGE'
usage: ./deploy.sh cloudrun|lambda|migrate [--dry-run] [--shape=routes|api]

  cloudrun   one Cloud Run service per target (gcloud run deploy <name> --source . --function <target>),
             secrets from Secret Manager, and a Cloud Scheduler job (every minute) that calls the
             sweep service with an OIDC token of a dedicated service account (Cloud Run Invoker on
             the sweep service only). The sweep takes no unauthenticated calls; every other service
             allows them, since the app checks bearer tokens and Linear signatures.
  lambda     one zip (Linux wheels), one Lambda function per target (handler functions.aws.<target>),
             a Function URL each (AuthType NONE; AWS_IAM for the sweep), a logs-only execution role,
             and an EventBridge Scheduler schedule (rate 1 minute) invoking the sweep function.
  migrate    devpilot migrate against MIGRATE_DATABASE_URL (else DATABASE_URL). Use the direct or
             session-mode connection here (Supabase: port 5432), the transaction pooler (6543) for
             the functions.

  --dry-run  print every command or API call, in order, and change nothing.
  --shape=routes (default) one function per route; --shape=api one function serving every route by
             path (the `api` target), plus the sweep on its own for the scheduler.

Settings (environment):
  cloudrun:  GCP_PROJECT, GCP_REGION, and Secret Manager secret names holding the values:
             SECRET_DATABASE_URL (default devpilot-database-url),
             SECRET_LINEAR_WEBHOOK_SECRET (default devpilot-linear-webhook-secret),
             SECRET_ADMIN_TOKEN (default devpilot-admin-token);
             optional SECRET_DATABASE_LISTEN_URL, SECRET_ENCRYPTION_KEYS (DEVPILOT_ENCRYPTION_KEYS),
             SECRET_LINEAR_CLIENT_ID, SECRET_LINEAR_CLIENT_SECRET (the Linear OAuth app),
             SECRET_LINEAR_SIGNIN_CLIENT_ID, SECRET_LINEAR_SIGNIN_CLIENT_SECRET (people's sign-in),
             DEVPILOT_PUBLIC_URL, DEVPILOT_TRANSACTION_POOLER=1 (behind a pooler),
             DEVPILOT_LOG_EMPTY_POLLS=1 (a log line for every poll, even one that finds nothing).
  lambda:    AWS_REGION, DATABASE_URL, LINEAR_WEBHOOK_SECRET, DEVPILOT_ADMIN_TOKEN (AWS credentials as
             boto3 finds them); optional DATABASE_LISTEN_URL, DEVPILOT_TRANSACTION_POOLER, SUPABASE_*,
             DEVPILOT_ENCRYPTION_KEYS, LINEAR_CLIENT_ID, LINEAR_CLIENT_SECRET, LINEAR_SIGNIN_CLIENT_ID,
             LINEAR_SIGNIN_CLIENT_SECRET, DEVPILOT_PUBLIC_URL,
             DEVPILOT_LOG_EMPTY_POLLS.
  migrate:   MIGRATE_DATABASE_URL or DATABASE_URL.
It is idempotent: a second run updates what the first created.
USAGE
}

target=${1:-}
shift || true
dry=0
shape=routes
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    --shape=routes|--shape=api) shape=${arg#--shape=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "deploy.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
  esac
done

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python

run() {  # print in a dry run, execute otherwise
  if [ "$dry" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

need() {
  local missing=()
  for v in "$@"; do [ -n "${!v:-}" ] || missing+=("$v"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "deploy.sh $target: missing settings: ${missing[*]} (see ./deploy.sh --help)" >&2
    exit 2
  fi
}

# The deployed rows of the one route table, as "<target> <public|scheduler>" lines.
mapfile -t ROUTE_LINES < <("$PY" -m functions.routes --deployed --shape "$shape")

shown() {  # a shell line: printed as is in a dry run (paste it and it runs), evaluated otherwise
  if [ "$dry" = 1 ]; then echo "$1"; else eval "$1"; fi
}

cloudrun() {
  need GCP_PROJECT GCP_REGION
  [ "$dry" = 1 ] || command -v gcloud >/dev/null || { echo "deploy.sh cloudrun: gcloud not found" >&2; exit 2; }
  local p=$GCP_PROJECT r=$GCP_REGION
  local sa_name=devpilot-sweep-invoker
  local sa="$sa_name@$p.iam.gserviceaccount.com"
  local runtime_name=devpilot-runtime
  local runtime="$runtime_name@$p.iam.gserviceaccount.com"
  # Secret Manager secrets mounted as environment variables: NAME=secret (values never printed).
  local -a mounts=(
    "DATABASE_URL=${SECRET_DATABASE_URL:-devpilot-database-url}"
    "LINEAR_WEBHOOK_SECRET=${SECRET_LINEAR_WEBHOOK_SECRET:-devpilot-linear-webhook-secret}"
    "DEVPILOT_ADMIN_TOKEN=${SECRET_ADMIN_TOKEN:-devpilot-admin-token}"
  )
  [ -n "${SECRET_DATABASE_LISTEN_URL:-}" ] && mounts+=("DATABASE_LISTEN_URL=$SECRET_DATABASE_LISTEN_URL")
  [ -n "${SECRET_ENCRYPTION_KEYS:-}" ] && mounts+=("DEVPILOT_ENCRYPTION_KEYS=$SECRET_ENCRYPTION_KEYS")
  [ -n "${SECRET_LINEAR_CLIENT_ID:-}" ] && mounts+=("LINEAR_CLIENT_ID=$SECRET_LINEAR_CLIENT_ID")
  [ -n "${SECRET_LINEAR_CLIENT_SECRET:-}" ] && mounts+=("LINEAR_CLIENT_SECRET=$SECRET_LINEAR_CLIENT_SECRET")
  [ -n "${SECRET_LINEAR_SIGNIN_CLIENT_ID:-}" ] && mounts+=("LINEAR_SIGNIN_CLIENT_ID=$SECRET_LINEAR_SIGNIN_CLIENT_ID")
  [ -n "${SECRET_LINEAR_SIGNIN_CLIENT_SECRET:-}" ] && mounts+=("LINEAR_SIGNIN_CLIENT_SECRET=$SECRET_LINEAR_SIGNIN_CLIENT_SECRET")
  local secrets="" m
  for m in "${mounts[@]}"; do secrets+="${secrets:+,}$m:latest"; done
  local envs="DEVPILOT_TRANSACTION_POOLER=${DEVPILOT_TRANSACTION_POOLER:-0}"
  [ -n "${DEVPILOT_PUBLIC_URL:-}" ] && envs+=",DEVPILOT_PUBLIC_URL=$DEVPILOT_PUBLIC_URL"
  [ -n "${DEVPILOT_LOG_EMPTY_POLLS:-}" ] && envs+=",DEVPILOT_LOG_EMPTY_POLLS=$DEVPILOT_LOG_EMPTY_POLLS"

  run gcloud services enable run.googleapis.com cloudbuild.googleapis.com cloudscheduler.googleapis.com \
    secretmanager.googleapis.com --project "$p"
  # The services run as their own service account, which may read exactly the secrets they mount.
  if [ "$dry" = 1 ] || ! gcloud iam service-accounts describe "$runtime" --project "$p" >/dev/null 2>&1; then
    run gcloud iam service-accounts create "$runtime_name" --project "$p" \
      --display-name "devpilot functions (reads its own secrets)"
  fi
  for m in "${mounts[@]}"; do
    run gcloud secrets add-iam-policy-binding "${m#*=}" --project "$p" \
      --member "serviceAccount:$runtime" --role roles/secretmanager.secretAccessor
  done
  local line t exposure
  for line in "${ROUTE_LINES[@]}"; do
    read -r t exposure <<<"$line"
    local name="devpilot-${t//_/-}"
    local auth=--allow-unauthenticated extra_env=$envs
    if [ "$exposure" = scheduler ]; then
      auth=--no-allow-unauthenticated
      # Cloud Run verified the scheduler's OIDC token before the request reaches the app.
      extra_env="$envs,DEVPILOT_SWEEP_PLATFORM_AUTH=1"
    fi
    run gcloud run deploy "$name" --source . --function "$t" --base-image python312 \
      --region "$r" --project "$p" --set-build-env-vars GOOGLE_FUNCTION_SOURCE=functions/main.py \
      --service-account "$runtime" --set-secrets "$secrets" --set-env-vars "$extra_env" $auth --quiet
  done
  if [ "$dry" = 1 ] || ! gcloud iam service-accounts describe "$sa" --project "$p" >/dev/null 2>&1; then
    run gcloud iam service-accounts create "$sa_name" --project "$p" \
      --display-name "devpilot sweep scheduler (Cloud Run Invoker on devpilot-sweep only)"
  fi
  run gcloud run services add-iam-policy-binding devpilot-sweep --region "$r" --project "$p" \
    --member "serviceAccount:$sa" --role roles/run.invoker
  local verb=create
  if [ "$dry" = 0 ] && gcloud scheduler jobs describe devpilot-sweep --location "$r" --project "$p" >/dev/null 2>&1; then
    verb=update
  fi
  local where
  where="--region $(printf %q "$r") --project $(printf %q "$p")"
  shown "SWEEP_URL=\$(gcloud run services describe devpilot-sweep $where --format='value(status.url)')"
  shown "gcloud scheduler jobs $verb http devpilot-sweep --location $(printf %q "$r") --project $(printf %q "$p") --schedule '* * * * *' --uri \"\$SWEEP_URL/\" --http-method POST --oidc-service-account-email $(printf %q "$sa") --oidc-token-audience \"\$SWEEP_URL\""
  # The endpoints map devpilot-orchestrator --endpoints takes (each route's own service URL).
  local name_target fmt="" vals=""
  if [ "$shape" = api ]; then  # one service: every route by path under its URL
    shown "URL_api=\$(gcloud run services describe devpilot-api $where --format='value(status.url)')"
  fi
  for name_target in claim:claim ack:ack release:release activities:activities realtimeToken:realtime_token plan:plan machine:machine; do
    local svc="devpilot-${name_target#*:}"
    svc=${svc//_/-}
    if [ "$shape" = api ]; then
      local path=${name_target#*:}
      fmt+="${fmt:+, }\"${name_target%%:*}\": \"%s/${path//_/-}\""
      vals+=" \"\$URL_api\""
      continue
    fi
    shown "URL_${name_target%%:*}=\$(gcloud run services describe $svc $where --format='value(status.url)')"
    fmt+="${fmt:+, }\"${name_target%%:*}\": \"%s/\""
    vals+=" \"\$URL_${name_target%%:*}\""
  done
  local file=${ENDPOINTS_FILE:-devpilot-endpoints.json}
  echo "endpoints (devpilot-orchestrator --endpoints $file; also DEVPILOT_ENDPOINTS for the functions):"
  shown "printf '{$fmt}\\n'$vals | tee $(printf %q "$file")"
}

case "$target" in
  cloudrun) cloudrun ;;
  lambda)
    args=()
    [ "$dry" = 1 ] && args+=(--dry-run)
    args+=(--shape "$shape")
    need AWS_REGION DATABASE_URL LINEAR_WEBHOOK_SECRET DEVPILOT_ADMIN_TOKEN
    "$PY" -m infra.aws_lambda "${args[@]}"  # prints its API calls itself in a dry run
    ;;
  migrate)
    url=${MIGRATE_DATABASE_URL:-${DATABASE_URL:-}}
    [ -n "$url" ] || { echo "deploy.sh migrate: missing settings: MIGRATE_DATABASE_URL or DATABASE_URL" >&2; exit 2; }
    if [ "$dry" = 1 ]; then echo "DATABASE_URL=<MIGRATE_DATABASE_URL> $PY -m devpilot migrate"
    else DATABASE_URL=$url "$PY" -m devpilot migrate; fi
    ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) echo "deploy.sh: unknown target '$target' (cloudrun, lambda or migrate)" >&2; exit 2 ;;
esac
