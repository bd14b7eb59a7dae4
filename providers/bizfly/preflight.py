"""``validate --online`` for Bizfly: read-only proof of the login, the project, the endpoint and the cluster.

Each step is one of the backend's own calls, in the order the server makes them (docs/reference/bizfly.md,
"Checking a backend before deploying it"), so the first that fails names its setting:

1. the login (``POST <token_url>``): a refusal is the credentials, unless the same login without
   ``project_id`` works, which makes it the project;
2. the Kubernetes Engine endpoint: ``kubernetes_engine_url``, else the service catalog's entry for the region
   (no entry: the region, naming those the catalog offers);
3. the cluster and its worker pools, through the adapter's own listing (``GET <k8s>/_/{cluster}``, then each
   autoscaled pool): the node groups the server will serve. On a 404 for the cluster, the project's cluster
   list (``GET <k8s>/_/``) tells a wrong endpoint apart from a wrong UID, the other regions' endpoints are
   asked for the cluster (a right UID with the wrong region), and a display name is recognised.

The token request is the one POST; nothing else is sent but GETs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.bizfly.adapter import BizflyAdapter, PoolData
from providers.bizfly.client import BizflyClient
from providers.bizfly.config import PASSWORD, catalog_url, default_token_url
from providers.bizfly.regions import region_code, same_region
from providers.errors import CloudAuthFailed, CloudRequestRejected, DomainError, http_status
from providers.preflight import GroupSummary, Preflight

BKE_AUTOSCALER = "BKE's own cluster-autoscaler (autoscaling is enabled)"


def preflight(adapter: BizflyAdapter, run: Preflight) -> None:
    """``CloudType.preflight`` of Bizfly."""
    if not _login(adapter.client, run):
        return
    engine = _endpoint(adapter.client, run)
    if engine is not None:
        _groups(adapter, engine, run)


def _login(client: BizflyClient, run: Preflight) -> bool:
    config = client.config
    try:
        client.tokens.token(run.deadline)
    except CloudAuthFailed as err:
        if config.project_id and _login_works_without_project(client, run):
            run.problem(
                "project_id",
                f"the login works, but Bizfly refuses it for project {config.project_id} ({_answer(err)}): the "
                "account has no such project",
                "set it to a project of the account (Bizfly dashboard > projects), or leave it unset for the "
                "account's default project",
            )
        elif config.auth_method == PASSWORD:
            run.problem(
                _login_key(client),
                f"Bizfly refused the password login of {config.email!r} ({_answer(err)})",
                f"check it and {run.setting('email')} (the account's login e-mail and password)",
            )
        else:
            run.problem(
                _login_key(client),
                f"Bizfly refused the login of application credential {config.app_credential_id!r} ({_answer(err)})",
                f"check it and {run.setting('app_credential_id')} (Bizfly dashboard > application credentials)",
            )
        return False
    except DomainError as err:
        # The token URL follows api_url unless it was set: name the setting that made it.
        follows = config.token_url == default_token_url(config.api_url)
        run.problem(
            "api_url" if follows else "token_url",
            f"the login at {config.token_url} got no token ({err})",
            "point it at Bizfly's API (https://manage.bizflycloud.vn, the default)"
            if follows
            else "leave token_url unset (it follows api_url) or point it at Bizfly's token endpoint",
        )
        return False
    run.proved(
        f"the {config.auth_method} login works: POST {config.token_url} (project {client.tokens.project_id or '?'})"
    )
    return True


def _login_works_without_project(client: BizflyClient, run: Preflight) -> bool:
    """The same credentials, logging in to the account's default project (one more token request)."""
    other = BizflyClient(client.config.model_copy(update={"project_id": "", "tenant_id": ""}))
    try:
        other.tokens.token(run.deadline)
    except DomainError:
        return False
    finally:
        other.close()
    return True


def _endpoint(client: BizflyClient, run: Preflight) -> str | None:
    config = client.config
    if config.kubernetes_engine_url:
        return config.kubernetes_engine_url
    catalog = catalog_url(config.api_url)
    try:
        engines = client.kubernetes_engines(run.deadline)
    except DomainError as err:
        run.problem(
            "api_url",
            f"the service catalog at {catalog} did not answer ({err})",
            "leave api_url unset (https://manage.bizflycloud.vn) or fix it, or set kubernetes_engine_url",
        )
        return None
    url = next((url for region, url in engines if same_region(region, config.region) and url), None)
    if url is None:
        offered = ", ".join(region for region, _ in engines) or "none"
        run.problem(
            "region",
            f"the service catalog offers no Kubernetes Engine in {config.region!r} (it offers: {offered})",
            "set it to the cluster's region, one of those",
        )
        return None
    run.proved(f"the service catalog names the Kubernetes Engine of {config.region} at {url}: GET {catalog}")
    return url


def _login_key(client: BizflyClient) -> str:
    return "password" if client.config.auth_method == PASSWORD else "app_credential_secret"


def _engine_setting(client: BizflyClient) -> str:
    return "kubernetes_engine_url" if client.config.kubernetes_engine_url else "api_url"


def _cluster_not_found(client: BizflyClient, engine: str, run: Preflight) -> None:
    config = client.config
    try:
        listed = client.list_clusters(run.deadline)
        clusters = listed.get("clusters") if isinstance(listed, Mapping) else None
        if not isinstance(clusters, list):
            raise CloudRequestRejected("the answer has no 'clusters' list")
    except DomainError as err:
        run.problem(
            _engine_setting(client),
            f"{engine} does not answer like Bizfly's Kubernetes Engine (GET {engine}/_/: {err})",
            "leave it to the service catalog (unset kubernetes_engine_url) or fix it",
        )
        return
    elsewhere = _region_holding_the_cluster(client, run)
    if elsewhere:
        run.problem(
            "region",
            f"cluster {config.cluster_name} is in region {elsewhere}, not in {region_code(config.region)}",
            f"set it to {elsewhere}",
        )
        return
    entries = [c for c in clusters if isinstance(c, Mapping)]
    named = next((c for c in entries if c.get("name") == config.cluster_name and c.get("uid")), None)
    if named is not None:
        run.problem(
            "cluster_name",
            f"{config.cluster_name!r} is the display name of cluster {named['uid']}; the API takes the UID",
            f"set it to {named['uid']}",
        )
        return
    present = ", ".join(f"{c.get('uid')} ({c.get('name')})" for c in entries) or "none"
    run.problem(
        "cluster_name",
        f"no cluster {config.cluster_name} in project {client.tokens.project_id or '?'} in "
        f"{region_code(config.region)} (404; "
        f"the project's clusters there: {present})",
        "set it to the cluster UID from the Bizfly dashboard; for a cluster of another project, set project_id",
    )


def _region_holding_the_cluster(client: BizflyClient, run: Preflight) -> str:
    """The short code of another region whose Kubernetes Engine has the cluster, "" when none (or no catalog)."""
    config = client.config
    if config.kubernetes_engine_url:
        return ""
    try:
        engines = client.kubernetes_engines(run.deadline)
    except DomainError:
        return ""
    for region, url in engines:
        if not url or same_region(region, config.region):
            continue
        try:
            client.get_cluster_at(url, run.deadline)
        except DomainError:
            continue
        return region_code(region)
    return ""


def _groups(adapter: BizflyAdapter, engine: str, run: Preflight) -> None:
    """The cluster and its worker pools through the adapter's own listing: the node groups the server serves."""
    client, config = adapter.client, adapter.config
    try:
        listing = adapter.list_groups(run.deadline)
    except CloudAuthFailed as err:
        if http_status(err) == 403:
            run.problem(
                "project_id",
                f"the account may not read cluster {config.cluster_name} in project {client.tokens.project_id} "
                f"({_answer(err)})",
                "set it to the cluster's project, or give the login access to it",
            )
        else:
            run.problem(_login_key(client), f"the Kubernetes Engine refused the login's token ({err})", "check it")
        return
    except CloudRequestRejected as err:
        if err.status == 404:
            _cluster_not_found(client, engine, run)
        else:
            run.problem("cluster_name", f"the Kubernetes Engine refused to read the cluster ({err})", "check it")
        return
    except DomainError as err:
        run.problem(
            _engine_setting(client),
            f"the Kubernetes Engine at {engine} did not answer ({err})",
            "check the URL, the network path and HTTPS_PROXY/NO_PROXY",
        )
        return
    run.proved(
        f"cluster {config.cluster_name} is in project {client.tokens.project_id or '?'}: GET {engine}/_/{{cluster}} "
        f"and GET {engine}/_/{{cluster}}/{{pool}} for its {len(listing.groups)} pools with autoscaling enabled"
    )
    for group in listing.groups:
        data = group.cloud_data
        name = str(data.pool.get("name") or "") if isinstance(data, PoolData) else ""
        run.group(GroupSummary(group.id, name, group.min_size, group.max_size, group.target_size, BKE_AUTOSCALER))
    if listing.groups:
        run.warn(
            "BKE installs its own cluster-autoscaler for the pools with autoscaling enabled, the pools this server "
            "serves: two autoscalers would set their sizes. Make sure BKE's no longer runs for this cluster"
        )
    else:
        run.warn(f"no worker pool of cluster {config.cluster_name} has autoscaling enabled: the CA will see no group")
    run.not_checked(
        "the writes the server makes (PATCH <k8s>/_/{cluster}/{pool}, DELETE <k8s>/_/{cluster}/{pool}/{node}): "
        "validate --online never writes"
    )


def _answer(err: Any) -> str:
    status = http_status(err)
    return f"{status}" if status else str(err)
