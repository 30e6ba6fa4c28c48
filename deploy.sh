#!/usr/bin/env bash
# deploy.sh cloudrun|lambda|migrate [--dry-run]
# Not yet scripted (see the deploy issue). It will: deploy each functions-framework target as its own
# Cloud Run service (gcloud run deploy <name> --source . --function <target>) with a Cloud Scheduler
# job calling the sweep via OIDC; or build one Lambda zip and create one function per target with
# Function URLs and an EventBridge Scheduler schedule for the sweep; or run `devpilot migrate`.
set -euo pipefail
echo "deploy.sh: not implemented yet; see README 'Deploying' for the manual steps" >&2
exit 2
