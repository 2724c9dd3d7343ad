"""The admin key check: 401 without a key, 403 with a wrong one or none configured."""

from __future__ import annotations

import pytest
from fastapi import HTTPException
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from nanospec_server.admin.auth import check_admin_key, key_id, presented_key


def request_with(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def status_of(configured: str | None, presented: str | None) -> int:
    try:
        check_admin_key(configured, presented)
    except HTTPException as error:
        return error.status_code
    return 200


def test_statuses() -> None:
    assert status_of("k", None) == 401
    assert status_of("k", "wrong") == 403
    assert status_of("k", "k") == 200
    assert status_of(None, "k") == 403  # a server without a key refuses every change


@given(st.text(min_size=1), st.text(min_size=1))
def test_only_the_exact_key_passes(configured: str, presented: str) -> None:
    assert (status_of(configured, presented) == 200) == (configured == presented)


def test_key_id_never_contains_the_key() -> None:
    key = "a-long-admin-key-value"
    assert key not in key_id(key) and len(key_id(key)) == 8 and key_id(key) == key_id(key)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Authorization": "Bearer abc"}, "abc"),
        ({"Authorization": "bearer abc"}, "abc"),
        ({"Authorization": "Basic abc"}, None),
        ({"Authorization": "Bearer "}, None),
        # with SGLang's --api-key also set, Authorization carries that key
        ({"Authorization": "Bearer api", "X-Admin-Key": "admin"}, "admin"),
    ],
)
def test_presented_key(headers: dict[str, str], expected: str | None) -> None:
    assert presented_key(request_with(headers)) == expected
