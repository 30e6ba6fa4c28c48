"""A browser for sign-in tests: httpx that follows redirects one by one (every answer kept, for
header checks), keeps cookies as a browser does, and can stop before the loopback redirect."""

from __future__ import annotations

from http.cookiejar import Cookie, CookieJar, DefaultCookiePolicy
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit
from urllib.request import Request

import httpx


class LoopbackIsSecure(DefaultCookiePolicy):
    """Browsers treat http://127.0.0.1 as a secure context: Secure (and so `__Host-`) cookies are
    kept and sent there. http.cookiejar would send them over https only."""

    def return_ok_secure(self, cookie: Cookie, request: Request) -> bool:
        return urlsplit(request.get_full_url()).hostname == "127.0.0.1" or bool(
            super().return_ok_secure(cookie, request)
        )


class _Headers:
    """What http.cookiejar reads of an answer: its Set-Cookie headers."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp

    def info(self) -> _Headers:
        return self

    def get_all(self, name: str, default: list[str] | None = None) -> list[str]:
        return self.resp.headers.get_list(name) or (default or [])


class Browser:
    """Cookies are kept here, not by httpx: httpx copies a client's cookies into a jar of the
    default policy for every request, which drops a Secure cookie bound for http://127.0.0.1."""

    def __init__(self) -> None:
        self.jar = CookieJar(policy=LoopbackIsSecure())
        self.http = httpx.Client(timeout=30)
        self.history: list[httpx.Response] = []  # every answer, redirects included

    def request(self, method: str, url: str, data: dict[str, str] | None = None) -> httpx.Response:
        ask = Request(url, method=method)
        self.jar.add_cookie_header(ask)
        headers = {k: v for k, v in ask.header_items() if k.lower() == "cookie"}
        resp = self.http.request(method, url, data=data, headers=headers)
        self.jar.extract_cookies(_Headers(resp), ask)  # type: ignore[arg-type]
        self.history.append(resp)
        return resp

    def go(
        self, url: str, *, method: str = "GET", data: dict[str, str] | None = None, stop_at: str = ""
    ) -> httpx.Response:
        """Request `url` and follow its redirects (a 302/303 continues as a GET), as a browser does;
        with `stop_at`, the redirect to an address starting with it is not followed (the last
        answer, the redirect, is returned)."""
        resp = self.request(method, url, data)
        while resp.is_redirect:
            nxt = urljoin(str(resp.url), resp.headers["Location"])
            if stop_at and nxt.startswith(stop_at):
                return resp
            resp = self.request("GET", nxt)
        return resp

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)

    def cookies(self) -> list[Cookie]:
        return list(self.jar)

    def close(self) -> None:
        self.http.close()


def query(url: str) -> dict[str, Any]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def form_fields(html: str) -> dict[str, str]:
    """The hidden fields of a page's form (name -> value), as a browser would submit them."""
    import re

    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html))
