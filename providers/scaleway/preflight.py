"""``validate --online`` for Kapsule: read-only proof of the key, the cluster, the region and the endpoints.

The checks every mode shares come first (docs/reference/scaleway.md, "Checking a backend before deploying it"):

1. The secret key's shape, before anything is sent: an access key (``SCW`` and 17 letters or digits, the
   key's public name) pasted in its place is refused without a call.
2. ``GET /k8s/v1/regions/{region}/clusters/{cluster_id}`` on the public API, with the backend's own client
   transport: 401 is the key, 403 its permissions, 404 naming the cluster is a cluster that is not in that
   region; the other Kapsule regions are then asked for the same cluster, so a right cluster id with the
   wrong region is told apart from a wrong id. This is a documented read that any key allowed to manage the
   cluster may make, so it also tells a wrong key apart from a key the private endpoints refuse. A 403 names
   the permission sets the backend's mode needs.

Then the checks of the backend's mode (``MODE_CHECKS[mode]``), given a ``ModeCheck``: the endpoints that
mode calls, the pools that become node groups and who else scales them, all through the adapter's own
listing (``ScalewayAdapter.list_groups``), so what is reported is what the server will serve:

- ``private``: the autoscaler endpoints; every pool with autoscaling on is a group, which Kapsule's managed
  autoscaler also scales (a warning); a refusal there names ``mode`` and the public mode.
- ``public``: the public pool and node endpoints and, for each zone the groups are in, the Instance product
  catalog; the adapter's ``ConfiguredPools`` decides the groups, with the config's bounds, and each entry of
  ``scaleway.pools`` it does not serve as written (no such pool, two of that name, autoscaling on) is a
  problem of ``pools.<entry>``; a 403 on the catalog names InstancesReadOnly.

A mode adds its checks by putting a function in ``MODE_CHECKS`` under its ``mode`` value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.errors import CloudAuthFailed, CloudRequestRejected, DomainError, http_status
from providers.http_transport import HttpTransport
from providers.model import CloudListing, GroupState
from providers.preflight import GroupSummary, Preflight
from providers.scaleway.adapter import ScalewayAdapter
from providers.scaleway.client import PRIVATE_ROUTES, PUBLIC_ROUTES, SERVER_TYPES_ROUTE, Pool
from providers.scaleway.config import ScalewayConfig
from providers.scaleway.templates import instance_type

# The public API's cluster read (scaleway-sdk-go k8s/v1 GetCluster).
CLUSTER_ROUTE = "/k8s/v1/regions/{region}/clusters/{cluster_id}"
# Every region the Scaleway SDK knows (scaleway-sdk-go scw.AllRegions).
KAPSULE_REGIONS = ("fr-par", "nl-ams", "pl-waw", "it-mil")
# The SDK's own shapes of the two halves of an API key (scaleway-sdk-go validation/is.go).
ACCESS_KEY = re.compile(r"^SCW[A-Z0-9]{17}$")
SECRET_KEY = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
KEY_CONSOLE = "Scaleway console > IAM > API keys"
DEFAULT_MODE = "private"
MANAGED_AUTOSCALER = "Kapsule's managed autoscaler (autoscaling is on)"


@dataclass(frozen=True)
class ModeCheck:
    """What a mode's checks get once the shared ones passed."""

    adapter: ScalewayAdapter  # built from the backend's config, writes refused
    cluster: Mapping[str, Any]  # the public API's answer for the configured cluster
    run: Preflight  # where the checks report (proved, group, problem, warn, not_checked)


def _transport(adapter: ScalewayAdapter) -> HttpTransport:
    return adapter.client.transport


def _get_cluster(adapter: ScalewayAdapter, region: str, run: Preflight) -> Any:
    path = CLUSTER_ROUTE.format(region=region, cluster_id=adapter.config.cluster_id)
    return _transport(adapter).request("GET", path, endpoint=CLUSTER_ROUTE, deadline=run.deadline).body


def preflight(adapter: ScalewayAdapter, run: Preflight) -> None:
    """``CloudType.preflight`` of Kapsule: the shared checks, then those of the backend's mode."""
    config = adapter.config
    if ACCESS_KEY.match(config.secret_key):
        run.problem(
            "secret_key",
            "an access key (SCW and 17 more letters or digits) is set, not the secret key; nothing was sent to the API",
            f"set the secret key of that API key (a UUID, shown once when the key was made: {KEY_CONSOLE})",
        )
        return
    cluster = _find_cluster(adapter, run)
    if cluster is None:
        return
    mode = str(getattr(config, "mode", "") or DEFAULT_MODE)
    check = MODE_CHECKS.get(mode)
    if check is None:
        run.problem("mode", f"validate --online has no checks for mode {mode!r}", "report this as a bug")
        return
    check(ModeCheck(adapter, cluster, run))


def _find_cluster(adapter: ScalewayAdapter, run: Preflight) -> Mapping[str, Any] | None:
    config = adapter.config
    try:
        body = _get_cluster(adapter, config.region, run)
    except CloudAuthFailed as err:
        _refused_key(config, http_status(err), run)
        return None
    except CloudRequestRejected as err:
        if err.status == 404:
            _not_found(adapter, err, run)
        else:
            run.problem(
                "cluster_id",
                f"the public API refused to read the cluster ({err})",
                "check cluster_id and region against the Scaleway console",
            )
        return None
    except DomainError as err:
        _unreachable(config.api_url, err, run)
        return None
    cluster = body if isinstance(body, Mapping) else {}
    run.proved(
        f"the key reads cluster {config.cluster_id} ({cluster.get('name', '?')}, {cluster.get('status', '?')}, "
        f"Kubernetes {cluster.get('version', '?')}) in {config.region}: GET {CLUSTER_ROUTE}"
    )
    return cluster


def _refused_key(config: ScalewayConfig, status: int | None, run: Preflight) -> None:
    if status == 403:
        needs = (
            "KubernetesFullAccess and InstancesReadOnly on the cluster's Project (the public mode changes pools and "
            "reads the Instance product catalog)"
            if config.public
            else "KubernetesFullAccess on the cluster's Project"
        )
        run.problem(
            "secret_key",
            f"this key may not read Kubernetes clusters (403 permissions_denied on GET {CLUSTER_ROUTE})",
            f"give the key's IAM user or application a policy with {needs}",
        )
        return
    shape = "" if SECRET_KEY.match(config.secret_key) else "; it is not shaped like a secret key (a UUID) either"
    run.problem(
        "secret_key",
        f"the Scaleway API refused this key (401 denied_authentication: no such key, or it was deleted or "
        f"has expired){shape}",
        f"set the secret key (a UUID) of a current IAM API key ({KEY_CONSOLE})",
    )


def _not_found(adapter: ScalewayAdapter, err: CloudRequestRejected, run: Preflight) -> None:
    """A 404 for the cluster: another region may hold it; else the region, the id or the URL is wrong."""
    config = adapter.config
    others = (region for region in KAPSULE_REGIONS if region != config.region)
    elsewhere = next((region for region in others if _exists_in(adapter, region, run)), None)
    if elsewhere is not None:
        run.problem(
            "region", f"cluster {config.cluster_id} is in {elsewhere}, not in {config.region}", f"set it to {elsewhere}"
        )
        return
    if config.region not in KAPSULE_REGIONS:
        run.problem(
            "region",
            f"{config.region!r} is not a Kapsule region (the API answered 404 for it; the regions are "
            f"{', '.join(KAPSULE_REGIONS)})",
            "set it to the cluster's region (Scaleway console > Kubernetes > the cluster)",
        )
        return
    if (err.body or {}).get("resource") in ("cluster", "k8s_cluster"):
        run.problem(
            "cluster_id",
            f"no cluster {config.cluster_id} in {', '.join(KAPSULE_REGIONS)} for this key (404 not_found)",
            "copy the cluster ID from the Scaleway console (Kubernetes > the cluster); a cluster of another Project "
            "needs a key with access to that Project",
        )
        return
    run.problem(
        "api_url",
        f"{config.api_url} answered 404 without a Scaleway error for {CLUSTER_ROUTE}: it is not the Scaleway API",
        "leave api_url unset (https://api.scaleway.com) or point it at the Scaleway API",
    )


def _exists_in(adapter: ScalewayAdapter, region: str, run: Preflight) -> bool:
    try:
        _get_cluster(adapter, region, run)
    except DomainError:
        return False
    return True


def _unreachable(api_url: str, err: DomainError, run: Preflight) -> None:
    run.problem(
        "api_url",
        f"no usable answer from {api_url} ({err})",
        "check api_url, the network path from here and HTTPS_PROXY/NO_PROXY",
    )


# ---------------------------------------------------------------------------- the private mode


def private_mode(check: ModeCheck) -> None:
    """The private autoscaler endpoints (docs/reference/scaleway.md, "Endpoints used") through the adapter's own
    listing, so the pools reported are the node groups the server will serve: every pool with autoscaling on."""
    adapter, run = check.adapter, check.run
    config = adapter.config
    listing = _listing(check, _refused_private)
    if listing is None:
        return
    run.proved(
        f"the private autoscaler endpoints answer: GET {PRIVATE_ROUTES.pools} and GET {PRIVATE_ROUTES.nodes} "
        f"({len(listing.groups)} pools with autoscaling on, {_nodes(listing)} in them)"
    )
    for group in listing.groups:
        run.group(_summary(group, MANAGED_AUTOSCALER))
    if listing.groups:
        run.warn(
            "Kapsule's managed autoscaler acts on every pool whose autoscaling is on, and those are the pools the "
            "private mode serves: two autoscalers would set their sizes. To be their only autoscaler, use mode: "
            "public on pools with autoscaling off"
        )
    else:
        run.warn(f"no pool of cluster {config.cluster_id} has autoscaling on: the CA will see no node group")
    _writes_not_checked(adapter, run)


def _refused_private(check: ModeCheck, err: CloudAuthFailed | CloudRequestRejected) -> None:
    status = http_status(err)
    answer = f"answered {status}" if status else f"refused ({err})"
    check.run.problem(
        "mode",
        f"this key cannot use Kapsule's private autoscaler endpoints (GET {PRIVATE_ROUTES.pools} {answer}), "
        "though it reads the cluster through the public API",
        "set mode: public, the self-managed mode on Kapsule's public API",
    )


# ---------------------------------------------------------------------------- the public mode


def public_mode(check: ModeCheck) -> None:
    """The public pool and node endpoints and the Instance product catalog (docs/reference/scaleway.md, "Public
    mode") through the adapter's own listing: its ``ConfiguredPools`` selection decides the node groups, with the
    config's bounds, and each entry of ``scaleway.pools`` it does not serve as written is a problem."""
    adapter, run = check.adapter, check.run
    listing = _listing(check, _refused_public)
    if listing is None:
        return
    named = len(adapter.config.pools)
    run.proved(
        f"the public pool and node endpoints answer: GET {PUBLIC_ROUTES.pools} and GET {PUBLIC_ROUTES.nodes} "
        f"({len(listing.groups)} of the {named} pools named in scaleway.pools are node groups, {_nodes(listing)} "
        "in them)"
    )
    for finding in adapter.findings:
        run.problem(f"pools.{finding.key}", finding.problem, finding.fix)
    for group in listing.groups:
        run.group(_summary(group))
    _catalog(check, listing)
    _writes_not_checked(adapter, run)


def _refused_public(check: ModeCheck, err: CloudAuthFailed | CloudRequestRejected) -> None:
    if isinstance(err, CloudAuthFailed):
        _refused_key(check.adapter.config, http_status(err), check.run)
        return
    check.run.problem(
        "cluster_id",
        f"the public API refused to list the cluster's pools or nodes ({err})",
        "check cluster_id and region against the Scaleway console",
    )


def _catalog(check: ModeCheck, listing: CloudListing) -> None:
    """The product catalog of each zone the groups are in, as the listing read it (``CatalogCache``): it
    answered, or why not (one line for all the zones one cause stopped); a group whose node type it lacks
    gets no template or price."""
    adapter, run = check.adapter, check.run
    catalog = adapter.catalog
    if catalog is None:
        return
    pools = [group.cloud_data for group in listing.groups if isinstance(group.cloud_data, Pool)]
    zones = sorted({pool.zone for pool in pools})
    for zone in zones:
        if zone not in catalog.failures:
            types = catalog.types(zone, run.deadline)  # the copy the listing read: no call
            run.proved(
                f"the Instance product catalog answers for {zone}: GET {SERVER_TYPES_ROUTE} ({len(types)} "
                "commercial types)"
            )
    failed = {zone: catalog.failures[zone] for zone in zones if zone in catalog.failures}
    denied = [zone for zone, err in failed.items() if isinstance(err, CloudAuthFailed) and http_status(err) == 403]
    if denied:
        run.problem(
            "secret_key",
            f"this key may not read the Instance product catalog of {', '.join(denied)} (403 permissions_denied on "
            f"GET {SERVER_TYPES_ROUTE}), where the public mode finds each node type's CPUs, memory, GPUs and price",
            "add InstancesReadOnly on the cluster's Project to the key's IAM policy (next to KubernetesFullAccess)",
        )
    other = next((err for zone, err in failed.items() if zone not in denied), None)
    if isinstance(other, CloudAuthFailed):
        _refused_key(adapter.config, http_status(other), run)
    elif other is not None:
        _unreachable(adapter.config.api_url, other, run)
    for group in listing.groups:
        pool = group.cloud_data
        if isinstance(pool, Pool) and group.template is None and pool.zone not in failed:
            run.warn(
                f"the product catalog of {pool.zone} has no {instance_type(pool.node_type)}, the node type of pool "
                f"{pool.name!r}: the CA gets no template for it (no scale-from-zero unless node_groups.{group.id}."
                "template gives one) and no price"
            )


# ---------------------------------------------------------------------------- what the modes share


def _listing(
    check: ModeCheck, refused: Callable[[ModeCheck, CloudAuthFailed | CloudRequestRejected], None]
) -> CloudListing | None:
    """The adapter's own listing, as the server makes it; a 401 is the key, another refusal the mode's to name."""
    adapter, run = check.adapter, check.run
    try:
        return adapter.list_groups(run.deadline)
    except (CloudAuthFailed, CloudRequestRejected) as err:
        if http_status(err) == 401:
            _refused_key(adapter.config, 401, run)
        else:
            refused(check, err)
    except DomainError as err:
        _unreachable(adapter.config.api_url, err, run)
    return None


def _nodes(listing: CloudListing) -> str:
    count = sum(len(group.instances) for group in listing.groups)
    return f"{count} node{'' if count == 1 else 's'}"


def _summary(group: GroupState, also_scaled_by: str = "") -> GroupSummary:
    return GroupSummary(group.id, group.name, group.min_size, group.max_size, group.target_size, also_scaled_by)


def _writes_not_checked(adapter: ScalewayAdapter, run: Preflight) -> None:
    routes = adapter.client.routes
    run.not_checked(
        f"the writes the server makes (PATCH {routes.pool}, DELETE {routes.node}): "
        "validate --online never writes; the key's IAM policy must allow them (KubernetesFullAccess)"
    )


#: the checks of each ``mode`` (the ``scaleway:`` key), after the shared ones passed
MODE_CHECKS: dict[str, Callable[[ModeCheck], None]] = {DEFAULT_MODE: private_mode, "public": public_mode}
