"""Schemathesis hooks (SCHEMATHESIS_HOOKS=st_hooks): the check that no
token acts beyond its scope. ST_SCOPE is the scope of the token the run
sends (admin, exec, read; none: a token the daemon never issued)."""

from __future__ import annotations

import os
from typing import Any

import schemathesis

RANK = {"read": 1, "exec": 2, "admin": 3}


@schemathesis.check
def token_within_scope(ctx: Any, response: Any, case: Any) -> bool | None:
    """No request acts beyond its credentials: without an Authorization
    header nothing is served (no 2xx); with a token below the operation's
    scope the answer is 403; with a token the daemon never issued, 401. A
    method the route does not have may say 405 first (it serves nothing)."""
    scope = os.environ.get("ST_SCOPE", "admin")
    need = case.operation.definition.raw.get("x-scope", "admin")
    code = response.status_code
    label = f"{case.method} {case.operation.path}"
    sent = response.request.headers.get("Authorization")
    if code == 405:
        return None
    if not sent:
        if 200 <= code < 300:
            raise AssertionError(f"served without a token: {code} for {label}")
        return None
    if scope == "none":
        if code != 401:
            raise AssertionError(f"unknown token served: {code} for {label}")
    elif RANK[scope] < RANK[need] and code != 403:
        raise AssertionError(f"{scope} token on a {need} operation {label}: {code}, want 403")
    return None
