"""Every functions-framework target, for `functions-framework --source functions/main.py --target X`
and Cloud Run's `--function X`. Each target is also importable from its own module."""

from __future__ import annotations

import sys
from pathlib import Path

# functions-framework loads this file by path; make the repo root importable for `shared`.
_root = str(Path(__file__).resolve().parent.parent)
if _root not in sys.path:
    sys.path.insert(0, _root)

from functions.ack import ack  # noqa: E402
from functions.claim import claim  # noqa: E402
from functions.dashboard import dashboard  # noqa: E402
from functions.healthz import healthz  # noqa: E402
from functions.linear_credentials import linear_credentials  # noqa: E402
from functions.metrics import metrics  # noqa: E402
from functions.orchestrators import orchestrators  # noqa: E402
from functions.realtime_token import realtime_token  # noqa: E402
from functions.release import release  # noqa: E402
from functions.sweep import sweep  # noqa: E402
from functions.web import setup_logging  # noqa: E402
from functions.webhook import webhook  # noqa: E402

setup_logging()

TARGETS = {
    "webhook": webhook,
    "claim": claim,
    "ack": ack,
    "release": release,
    "sweep": sweep,
    "orchestrators": orchestrators,
    "realtime_token": realtime_token,
    "healthz": healthz,
    "metrics": metrics,
    "dashboard": dashboard,
    "linear_credentials": linear_credentials,
}
__all__ = ["TARGETS", *TARGETS]
