"""COMMAND's environment: what it needs and what the person passes on purpose, nothing else.

An agent runs code it did not write (a repository's tests, its build, whatever the model decides);
the orchestrator's own environment holds whatever the shell it was started from held: the
operator's admin token, a database URL, cloud credentials. So COMMAND does not inherit it. It gets
the variables of its message and conversation (`DEVPILOT_*`, set by the orchestrator), the
basics a program needs to run (search path, home, user, locale, terminal, temporary folder, proxy
and certificate settings), and the names given with `--pass-env` (an agent's own API key, say).
Buildkite's job environment is the model: a job gets its own variables, not the agent's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# Passed as they are: what a process expects to find, and no credential of anyone's.
BASICS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "TMPDIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
BASIC_PREFIXES = ("LC_",)  # the locale's categories


def for_command(environ: Mapping[str, str], passed: Iterable[str], own: Mapping[str, str]) -> dict[str, str]:
    """COMMAND's whole environment: the basics and the `--pass-env` names found in `environ`, then
    the orchestrator's own `DEVPILOT_*` for this message (which win). The directory this
    orchestrator's console scripts are in goes first on PATH, so `devpilot-orchestrator activity`
    is found from COMMAND however the orchestrator was started (a virtualenv not activated)."""
    names = set(passed)
    env = {k: v for k, v in environ.items() if k in BASICS or k.startswith(BASIC_PREFIXES) or k in names}
    scripts = Path(sys.executable).parent
    if (scripts / "devpilot-orchestrator").exists():
        path = env.get("PATH", os.defpath)
        if str(scripts) not in path.split(os.pathsep):
            env["PATH"] = os.pathsep.join([str(scripts), path])
    env.update(own)
    return env
