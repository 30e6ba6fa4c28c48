"""Signing people in, without a database: PKCE (RFC 7636), the typed codes, the authorize link."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

from shared.fleet.enroll import CODE_ALPHABET, new_user_code, normal_code, show_code
from shared.fleet.signin import authorize_url, s256, verifier_for
from shared.plumbing.settings import Settings


def test_s256_is_rfc_7636s() -> None:
    # RFC 7636, Appendix B
    assert (
        s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    )


def test_the_services_verifier_is_a_pkce_verifier_of_its_browser_only() -> None:
    a, b = verifier_for("browser-a"), verifier_for("browser-b")
    assert re.fullmatch(r"[A-Za-z0-9._~-]{43,128}", a) and a != b and verifier_for("browser-a") == a


def test_codes_are_easy_to_read_aloud_and_to_type() -> None:
    codes = {new_user_code() for _ in range(200)}
    assert len(codes) == 200 and all(len(c) == 8 and set(c) <= set(CODE_ALPHABET) for c in codes)
    assert not set(CODE_ALPHABET) & set("AEIOUY0123456789")  # no words, no 0/O or 1/I to misread
    assert show_code("BCDFGHJK") == "BCDF-GHJK"
    for typed in ("BCDF-GHJK", "bcdf-ghjk", " bcdf ghjk ", "BcDfGhJk"):
        assert normal_code(typed) == "BCDFGHJK", typed
    for typed in ("", "BCDF-GHJ", "BCDF-GHJKL", "BCDF-GHJA", "BCDF-GHJ1", "BCDF_GHJK"):
        assert normal_code(typed) is None, typed


def test_the_authorize_link_asks_for_a_person_with_pkce() -> None:
    settings = Settings(
        LINEAR_CLIENT_ID="app", LINEAR_CLIENT_SECRET="app-secret", DEVPILOT_PUBLIC_URL="https://d.example/"
    )
    url = urlsplit(authorize_url(settings, "the-state", "browser-a"))
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert f"{url.scheme}://{url.netloc}{url.path}" == "https://linear.app/oauth/authorize"
    assert q == {
        "client_id": "app",
        "redirect_uri": "https://d.example/enroll/callback",
        "response_type": "code",
        "scope": "read",
        "state": "the-state",
        "actor": "user",
        "code_challenge": s256(verifier_for("browser-a")),
        "code_challenge_method": "S256",
        "prompt": "consent",
    }


def test_the_signin_client_is_its_own_or_the_apps_never_half_of_each() -> None:
    app = {
        "LINEAR_CLIENT_ID": "app",
        "LINEAR_CLIENT_SECRET": "app-secret",
        "DEVPILOT_PUBLIC_URL": "https://d",
    }
    assert Settings(**app).signin_client == ("app", "app-secret")
    own = Settings(**app, LINEAR_SIGNIN_CLIENT_ID="people", LINEAR_SIGNIN_CLIENT_SECRET="people-secret")
    assert own.signin_client == ("people", "people-secret") and own.signin_enabled
    half = Settings(**app, LINEAR_SIGNIN_CLIENT_ID="people")
    assert half.signin_client is None and not half.signin_enabled
    assert not Settings(LINEAR_CLIENT_ID="app", LINEAR_CLIENT_SECRET="s").signin_enabled  # no public URL
