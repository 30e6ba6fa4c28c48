"""`--repo [HOST/]OWNER/NAME=PATH` (and `--repo .`): the repositories checked out on this machine,
and where. Sent to the service when the orchestrator starts (`POST /machine`), so a start about a
repository is routed to a machine that has it; a message that names one runs COMMAND in its path.

`--repo .` reads the checkout the orchestrator runs in: its `origin` remote names the repository
(only the host and the path are taken from it: a token in a remote's URL goes nowhere).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from shared.wire.messages import DEFAULT_HOST, FULL_NAME, HOSTNAME, repository_key


class RepoSpecError(ValueError):
    """A `--repo` that names no repository, or a path that is not there (the message says why)."""


@dataclass(frozen=True)
class LocalRepo:
    hostname: str
    full_name: str
    path: Path

    @property
    def key(self) -> str:
        return repository_key(self.hostname, self.full_name)

    def wire(self) -> dict[str, str]:
        return {"hostname": self.hostname, "fullName": self.full_name}


def told(repositories: list[dict[str, str]], labels: list[str]) -> str:
    """What a machine told the service (`POST /machine`), as the orchestrator logs it and `whoami`
    prints it: `repositories acme/backend, gitlab.example.com/acme/web; labels gpu`."""
    names = [
        r["fullName"] if r.get("hostname") in (None, DEFAULT_HOST) else f"{r['hostname']}/{r['fullName']}"
        for r in repositories
    ]
    return f"repositories {', '.join(names) or 'none'}; labels {', '.join(labels) or 'none'}"


def parse(spec: str, cwd: Path) -> LocalRepo:
    """One `--repo` value: `[HOST/]OWNER/NAME=PATH` (HOST defaults to github.com), or `.`."""
    if spec.strip() == ".":
        return from_checkout(cwd)
    name, sep, where = spec.partition("=")
    if not sep or not where.strip():
        raise RepoSpecError(f"--repo {spec!r}: give [HOST/]OWNER/NAME=PATH, or . for this checkout")
    hostname, full_name = split_name(name.strip())
    path = Path(where.strip()).expanduser()
    path = (cwd / path if not path.is_absolute() else path).resolve()
    if not path.is_dir():
        raise RepoSpecError(f"--repo {spec!r}: {path} is not a directory")
    return LocalRepo(hostname, full_name, path)


def split_name(name: str) -> tuple[str, str]:
    """`[HOST/]OWNER/NAME` as (host, `owner/name`): a first part with a dot (or a port) is a host."""
    parts = name.strip("/").split("/")
    if len(parts) >= 3 and ("." in parts[0] or ":" in parts[0]):
        hostname, full_name = parts[0].lower(), "/".join(parts[1:])
    else:
        hostname, full_name = DEFAULT_HOST, "/".join(parts)
    full_name = full_name.removesuffix(".git")
    if not HOSTNAME.match(hostname) or not FULL_NAME.match(full_name):
        raise RepoSpecError(
            f"--repo {name!r}: not [HOST/]OWNER/NAME (e.g. acme/backend, gitlab.example.com/acme/web)"
        )
    return hostname, full_name


def from_checkout(cwd: Path) -> LocalRepo:
    """`--repo .`: the checkout `cwd` is in, named by its `origin` remote."""
    top = _git(cwd, "rev-parse", "--show-toplevel")
    if top is None:
        raise RepoSpecError("--repo .: run the orchestrator inside a git checkout")
    url = _git(cwd, "remote", "get-url", "origin")
    if url is None:
        raise RepoSpecError(f"--repo .: the checkout at {top} has no `origin` remote")
    hostname, full_name = from_remote(url)
    return LocalRepo(hostname, full_name, Path(top).resolve())


def from_remote(url: str) -> tuple[str, str]:
    """The host and `owner/name` a remote URL names: `git@host:owner/name.git`,
    `ssh://git@host[:port]/owner/name.git`, `https://[user@]host/owner/name[.git]`."""
    url = url.strip()
    scp = re.fullmatch(r"(?:[^@/\s]+@)?([^:/\s]+):(?!//)(.+)", url)
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http", "ssh", "git", "git+ssh", "ssh+git") or not parts.hostname:
            raise RepoSpecError(f"--repo .: origin {_shown(url)} is not a hosted repository")
        hostname, path = parts.hostname, parts.path
    elif scp is not None:
        hostname, path = scp.group(1), scp.group(2)
    else:
        raise RepoSpecError(f"--repo .: origin {_shown(url)} is not a hosted repository")
    full_name = path.strip("/").removesuffix(".git")
    if not HOSTNAME.match(hostname.lower()) or not FULL_NAME.match(full_name):
        raise RepoSpecError(f"--repo .: origin {_shown(url)} names no OWNER/NAME")
    return hostname.lower(), full_name


def _shown(url: str) -> str:
    """A remote URL as it may be printed: without the credentials some carry."""
    return re.sub(r"//[^/@]*@", "//", url)


def _git(cwd: Path, *args: str) -> str | None:
    git = shutil.which("git")
    if git is None:
        raise RepoSpecError("--repo .: git is not installed")
    r = subprocess.run([git, "-C", str(cwd), *args], capture_output=True, text=True, check=False, timeout=30)
    out = r.stdout.strip()
    return out if r.returncode == 0 and out else None
