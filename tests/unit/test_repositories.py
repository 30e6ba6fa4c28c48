"""Naming repositories, without a database: `--repo` and remote URLs as the orchestrator reads them,
a person's pick as routing reads it, and the digest that tells alike machines apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.repositories import RepoSpecError, from_remote, parse, split_name
from shared.delivery.repository_choice import Candidate, match
from shared.fleet.machines import normalise, shape
from shared.wire.messages import Repository


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("git@github.com:acme/backend.git", ("github.com", "acme/backend")),
        ("https://github.com/acme/backend", ("github.com", "acme/backend")),
        ("https://ci:s3cret@GitHub.com/acme/backend.git/", ("github.com", "acme/backend")),
        ("ssh://git@gitlab.example.com:2222/group/sub/web.git", ("gitlab.example.com", "group/sub/web")),
    ],
)
def test_a_remote_names_its_host_and_owner_name(url: str, named: tuple[str, str]) -> None:
    assert from_remote(url) == named


@pytest.mark.parametrize(
    "url", ["/srv/git/backend.git", "file:///srv/git/backend.git", "https://github.com/backend"]
)
def test_a_remote_that_names_no_hosted_repository_is_refused_without_its_credentials(url: str) -> None:
    with pytest.raises(RepoSpecError) as refused:
        from_remote(url.replace("https://", "https://ci:s3cret@"))
    assert "s3cret" not in str(refused.value)


def test_repo_names_default_to_github_and_a_dotted_first_part_is_a_host(tmp_path: Path) -> None:
    assert split_name("acme/backend") == ("github.com", "acme/backend")
    assert split_name("GitLab.Example.com/acme/web.git") == ("gitlab.example.com", "acme/web")
    assert split_name("acme/sub/web") == ("github.com", "acme/sub/web")
    for bad in ("backend", "acme/back end", "/"):
        with pytest.raises(RepoSpecError):
            split_name(bad)
    got = parse(f"acme/backend={tmp_path}", Path("/"))
    assert (got.key, got.path) == ("github.com/acme/backend", tmp_path)
    for bad in ("acme/backend", f"acme/backend={tmp_path / 'missing'}", "acme/backend="):
        with pytest.raises(RepoSpecError):
            parse(bad, tmp_path)


def test_the_digest_is_equal_exactly_for_the_same_repositories_and_labels() -> None:
    def digest(repos: list[tuple[str, str]], labels: list[str]) -> str:
        r, lb = normalise([Repository(h, n) for h, n in repos], labels)
        return shape([x.key for x in r], lb)

    same = digest([("github.com", "acme/web"), ("github.com", "acme/backend")], ["GPU"])
    assert same == digest([("GitHub.com", "Acme/Backend.git"), ("github.com", "acme/web")], ["gpu", "gpu"])
    assert same != digest([("github.com", "acme/web")], ["gpu"])
    assert same != digest([("github.com", "acme/web"), ("github.com", "acme/backend")], [])
    assert digest([("github.com", "acme/web")], []) != digest([], ["acme/web"])
    assert digest([], []) == ""  # what a machine that said nothing has


def test_a_pick_is_read_by_label_key_owner_name_or_a_unique_name() -> None:
    cands = [
        Candidate(Repository(hostname="github.com", full_name="acme/backend")),
        Candidate(Repository(hostname="github.com", full_name="acme/web")),
        Candidate(Repository(hostname="gitlab.example.com", full_name="acme/web")),
    ]
    assert match(cands, "acme/backend") is cands[0]
    assert match(cands, " ACME/Backend ") is cands[0]
    assert match(cands, "backend") is cands[0]
    assert match(cands, "https://github.com/acme/backend.git") is cands[0]
    assert match(cands, "gitlab.example.com/acme/web") is cands[2]
    assert match(cands, "acme/web") is cands[1]  # the label of github.com's, exactly
    assert match(cands, "web") is None  # two are called so
    assert match(cands, "acme/mobile") is None and match(cands, "") is None
