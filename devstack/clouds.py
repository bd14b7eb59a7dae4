"""One server-config ``backends[]`` entry per simulated cloud, pointing a backend at a running simulator.

Every place that serves a simulator (the demo, the integration, reliability, conformance and benchmark
tests) builds its backend entry here, so a change to a cloud's config keys is made once.

Credentials go into the entry itself unless an environment variable is named for them (``*_env``):
the reliability tests pass secrets through the environment to check that they never leak.
"""

from __future__ import annotations

from typing import Any

from simulators.bizfly import DEFAULT_APP_CREDENTIALS, DEFAULT_USERS, BizflySimulator
from simulators.scaleway import ScalewaySimulator

BIZFLY_REGION = "HN"


def scaleway_backend(
    sim: ScalewaySimulator, name: str = "scw", *, secret_key_env: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The entry for the Scaleway simulator's first cluster; ``extra`` adds keys such as ``node_groups``."""
    secret: dict[str, str] = {"secret_key_env": secret_key_env} if secret_key_env else {"secret_key": sim.secret_key}
    return {
        "name": name,
        "type": "scaleway",
        "scaleway": {"cluster_id": sim.cluster_id, "region": sim.region, "api_url": sim.url, **secret},
        **extra,
    }


def bizfly_backend(
    sim: BizflySimulator,
    name: str = "bizfly",
    *,
    auth: str = "password",
    email: str | None = None,
    password: str | None = None,
    password_env: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The entry for the Bizfly simulator's first cluster.

    ``auth`` is "password" (the simulator's default user unless ``email`` and ``password`` or
    ``password_env`` name another) or "application_credential" (the simulator's default credential).
    """
    if auth == "password":
        user = email or next(iter(DEFAULT_USERS))
        if password_env:
            secret = {"password_env": password_env}
        else:
            secret = {"password": password if password is not None else DEFAULT_USERS[user]}
        credentials: dict[str, str] = {"auth_method": "password", "email": user, **secret}
    elif auth == "application_credential":
        cred_id, cred_secret = next(iter(DEFAULT_APP_CREDENTIALS.items()))
        credentials = {
            "auth_method": "application_credential",
            "app_credential_id": cred_id,
            "app_credential_secret": cred_secret,
        }
    else:
        raise ValueError(f"unknown Bizfly auth {auth!r}: use 'password' or 'application_credential'")
    return {
        "name": name,
        "type": "bizfly",
        "bizfly": {
            **credentials,
            "region": BIZFLY_REGION,
            "api_url": sim.url,
            "token_url": sim.token_url,
            "cluster_name": bizfly_cluster_uid(sim),
        },
        **extra,
    }


def bizfly_cluster_uid(sim: BizflySimulator) -> str:
    """The uid of the simulator's first cluster (what CLUSTER_NAME holds for a real cluster)."""
    return str(sim.snapshot()["clusters"][0]["uid"])
