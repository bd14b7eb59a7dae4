"""One server-config ``backends[]`` entry per simulated cloud, pointing a backend at a running simulator;
and the variables the CA's in-tree provider for that cloud reads, pointing it at the same simulator.

Every place that serves a simulator (the demo, the integration, reliability, conformance and benchmark
tests) builds its backend entry here, so a change to a cloud's config keys is made once; every place that
runs an in-tree provider (the migration scenario, the benchmark's and the differential's upstream example
server) takes its variables from here.

Credentials go into the entry itself unless an environment variable is named for them (``*_env``):
the reliability tests pass secrets through the environment to check that they never leak.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulators.bizfly import DEFAULT_APP_CREDENTIALS, DEFAULT_USERS, BizflySimulator
from simulators.scaleway import ScalewaySimulator

BIZFLY_REGION = "HN"


def scaleway_backend(
    sim: ScalewaySimulator,
    name: str = "scw",
    *,
    secret_key_env: str | None = None,
    settings: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The entry for the Scaleway simulator's first cluster; ``settings`` adds keys to its ``scaleway:``
    mapping (``mode``, ``pools``), ``extra`` keys to the entry (``node_groups``, ``sync``)."""
    secret: dict[str, str] = {"secret_key_env": secret_key_env} if secret_key_env else {"secret_key": sim.secret_key}
    return {
        "name": name,
        "type": "scaleway",
        "scaleway": {
            "cluster_id": sim.cluster_id,
            "region": sim.region,
            "api_url": sim.url,
            **secret,
            **(settings or {}),
        },
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


def scaleway_in_tree_env(sim: ScalewaySimulator) -> dict[str, str]:
    """What the in-tree Scaleway provider reads (``CLUSTER_ID``, ``SCW_*``) for the simulator's first cluster."""
    return {
        "CLUSTER_ID": sim.cluster_id,
        "SCW_SECRET_KEY": sim.secret_key,
        "SCW_REGION": sim.region,
        "SCW_API_URL": sim.url,
    }


def bizfly_in_tree_env(sim: BizflySimulator) -> dict[str, str]:
    """What the in-tree Bizfly provider reads (``BIZFLYCLOUD_*``, ``CLUSTER_NAME``) for the simulator's first
    cluster, with the simulator's default user. No URL: the in-tree client logs in at the production host
    whatever it is told, so the caller adds what makes that host reach the simulator (an interception
    proxy's variables, tests/support/https_intercept.py)."""
    user, password = next(iter(DEFAULT_USERS.items()))
    return {
        "BIZFLYCLOUD_AUTH_METHOD": "password",
        "BIZFLYCLOUD_EMAIL": user,
        "BIZFLYCLOUD_PASSWORD": password,
        "CLUSTER_NAME": bizfly_cluster_uid(sim),
    }
