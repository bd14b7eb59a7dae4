"""Bizfly token issuance and checking (docs/reference/bizfly.md, "Authentication").

Tokens are opaque strings with an expiry on the simulator clock. Both spellings of the application
credential fields are accepted: gobizfly sends ``credential_id``/``credential_secret``, the Bizfly docs
name ``application_credential_id``/``application_credential_secret``.

Each token is scoped to a project (a Keystone project: 32 hexadecimal characters): the ``project_id`` of
the token request when the account has that project (else the login is refused), the account's default
project otherwise. The answer names it (``project_id``, ``project_name``), as the vendor client expects.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_USERS: Mapping[str, str] = {"user@example.com": "s3cret-password"}
DEFAULT_APP_CREDENTIALS: Mapping[str, str] = {"app-cred-id": "app-cred-secret"}
# The Bizfly docs say a token lives 4 h; the simulator default is shorter so expiry is cheap to reach.
DOCUMENTED_TOKEN_TTL = 4 * 3600.0


class AuthRejected(Exception):
    """Credentials or a token were refused; the API answers 401 with this message."""


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expires_at: float
    method: str
    principal: str  # the username or the application-credential id
    project_id: str = ""


class TokenIssuer:
    """Checks credentials, issues tokens and validates them against the clock."""

    def __init__(
        self,
        clock_now: Callable[[], float],
        *,
        users: Mapping[str, str] | None = None,
        app_credentials: Mapping[str, str] | None = None,
        ttl: float = 3600.0,
        projects: Mapping[str, str] | None = None,
        default_project: str = "",
    ) -> None:
        self._now = clock_now
        self._lock = threading.Lock()
        self._users = dict(DEFAULT_USERS if users is None else users)
        self._app_credentials = dict(DEFAULT_APP_CREDENTIALS if app_credentials is None else app_credentials)
        self.ttl = ttl
        self._tokens: dict[str, IssuedToken] = {}
        # project id -> name: the projects the account's users and credentials may act in.
        self.projects = dict(projects or {})
        self.default_project = default_project
        if default_project:
            self.projects.setdefault(default_project, "default")

    def issue(self, body: Any) -> IssuedToken:
        """Issue a token for a ``POST /api/token`` body, or raise ``AuthRejected``."""
        if not isinstance(body, dict):
            raise AuthRejected("The request you have made requires authentication.")
        method = body.get("auth_method")
        if method == "password":
            principal = self._check_password(body)
        elif method == "application_credential":
            principal = self._check_app_credential(body)
        else:
            # An unset auth_method is what upstream sends when it re-authenticates without stored
            # credentials; the answer is a 401 like any refused login.
            raise AuthRejected(f"Unsupported auth_method {method!r}")
        project = body.get("project_id") or self.default_project
        if self.projects and project not in self.projects:
            raise AuthRejected(f"The account has no project {project!r}")
        issued = IssuedToken(
            token="gAAAAA" + secrets.token_urlsafe(48),
            expires_at=self._now() + self.ttl,
            method=method,
            principal=principal,
            project_id=str(project),
        )
        with self._lock:
            self._tokens[issued.token] = issued
        return issued

    def _check_password(self, body: dict[str, Any]) -> str:
        username, password = body.get("username"), body.get("password")
        if not isinstance(username, str) or not isinstance(password, str) or not username or not password:
            raise AuthRejected("username and password are required for auth_method password")
        with self._lock:
            known = self._users.get(username)
        if known is None or not secrets.compare_digest(known, password):
            raise AuthRejected("Invalid username or password")
        return username

    def _check_app_credential(self, body: dict[str, Any]) -> str:
        credential_id = body.get("credential_id") or body.get("application_credential_id")
        secret = body.get("credential_secret") or body.get("application_credential_secret")
        if not isinstance(credential_id, str) or not isinstance(secret, str) or not credential_id or not secret:
            raise AuthRejected("credential id and secret are required for auth_method application_credential")
        if not self.app_credential_valid(credential_id, secret):
            raise AuthRejected("Invalid application credential")
        return credential_id

    def app_credential_valid(self, credential_id: str, secret: str) -> bool:
        with self._lock:
            known = self._app_credentials.get(credential_id)
        return known is not None and secrets.compare_digest(known, secret)

    def check(self, token: str | None) -> IssuedToken:
        """Return the token record if ``token`` is known and unexpired, else raise ``AuthRejected``."""
        if not token:
            raise AuthRejected("The request you have made requires authentication.")
        with self._lock:
            issued = self._tokens.get(token)
        if issued is None:
            raise AuthRejected("The request you have made requires authentication.")
        if issued.expires_at <= self._now():
            raise AuthRejected("The token has expired")
        return issued

    def expire_all(self) -> int:
        """Expire every token issued so far (the next call with any of them gets 401); returns how many."""
        now = self._now()
        with self._lock:
            for token, issued in self._tokens.items():
                if issued.expires_at > now:
                    self._tokens[token] = IssuedToken(token, now, issued.method, issued.principal, issued.project_id)
            return len(self._tokens)

    def revoke(self, token: str) -> bool:
        with self._lock:
            return self._tokens.pop(token, None) is not None

    def active_count(self) -> int:
        now = self._now()
        with self._lock:
            return sum(1 for t in self._tokens.values() if t.expires_at > now)
