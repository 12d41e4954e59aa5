"""The openai engine's server as a start-up check sees it: the key header, and ``/models`` (the
server up, the key taken, the model served), each failure one line naming the setting.

Apart from ``engine`` and ``exact`` so that both check alike without importing each other.
"""

from __future__ import annotations

import os
from typing import Any

import httpx


def auth_headers(spec: Any) -> dict[str, str]:
    """The request headers that carry the key in ``api_key_env`` (none when unset or empty)."""
    key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


def check_endpoint(client: httpx.Client, spec: Any) -> dict[str, Any]:
    """The server's ``/models``: up (``base_url``), taking the key (``api_key_env``) and serving the
    model (``model``). Returns the model's entry there.

    Raises:
        ValueError: one line naming the setting.
    """
    base = spec.base_url.rstrip("/")
    try:
        models = client.get(f"{base}/models")
    except httpx.HTTPError as exc:
        raise ValueError(f"base_url: no server answers at {base} ({type(exc).__name__}: {exc}); start it or fix base_url") from None
    if models.status_code in (401, 403):
        where = f"${spec.api_key_env}" if spec.api_key_env else "api_key_env"
        said = "refused the key in" if client.headers.get("Authorization") else "needs a key; set"
        raise ValueError(f"api_key_env: the server at {base} {said} {where} (HTTP {models.status_code})")
    if models.status_code != 200:
        raise ValueError(f"base_url: {base}/models answered HTTP {models.status_code}: {models.text[:200]}")
    entries = {str(m.get("id")): m for m in models.json().get("data", [])}
    if spec.model not in entries:
        raise ValueError(f"model: the server at {base} does not serve {spec.model!r}; it serves {', '.join(entries) or 'nothing'}")
    return entries[spec.model]
