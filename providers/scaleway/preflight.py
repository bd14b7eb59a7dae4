"""``validate --online`` for Kapsule: read-only proof of the key, the cluster, the region and the endpoints.

The checks every mode shares come first (docs/reference/scaleway.md, "Checking a backend before deploying it"):

1. The secret key's shape, before anything is sent: an access key (``SCW`` and 17 letters or digits, the
   key's public name) pasted in its place is refused without a call.
2. ``GET /k8s/v1/regions/{region}/clusters/{cluster_id}`` on the public API, with the backend's own client
   transport: 401 is the key, 403 its permissions, 404 naming the cluster is a cluster that is not in that
   region; the other Kapsule regions are then asked for the same cluster, so a right cluster id with the
   wrong region is told apart from a wrong id. This is a documented read that any key allowed to manage the
   cluster may make, so it also tells a wrong key apart from a key the private endpoints refuse.

Then the checks of the backend's mode (``MODE_CHECKS[mode]``), given a ``ModeCheck``: the endpoints that
mode calls, the pools that become node groups and who else scales them. The private mode's are here; a mode
adds its own by putting a function in ``MODE_CHECKS`` under its ``mode`` value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from providers.errors import CloudAuthFailed, CloudRequestRejected, DomainError, http_status
from providers.http_transport import HttpTransport
from providers.model import CloudListing
from providers.preflight import GroupSummary, Preflight
from providers.scaleway.adapter import ScalewayAdapter
from providers.scaleway.client import PRIVATE_ROUTES, Pool

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
        _refused_key(config.secret_key, http_status(err), run)
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


def _refused_key(secret_key: str, status: int | None, run: Preflight) -> None:
    if status == 403:
        run.problem(
            "secret_key",
            f"this key may not read Kubernetes clusters (403 permissions_denied on GET {CLUSTER_ROUTE})",
            "give the key's IAM user or application a policy with KubernetesFullAccess on the cluster's Project",
        )
        return
    shape = "" if SECRET_KEY.match(secret_key) else "; it is not shaped like a secret key (a UUID) either"
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
    listing = _private_listing(adapter, run)
    if listing is None:
        return
    nodes = sum(len(group.instances) for group in listing.groups)
    run.proved(
        f"the private autoscaler endpoints answer: GET {PRIVATE_ROUTES.pools} and GET {PRIVATE_ROUTES.nodes} "
        f"({len(listing.groups)} pools with autoscaling on, {nodes} nodes in them)"
    )
    for group in listing.groups:
        pool = group.cloud_data
        name = pool.name if isinstance(pool, Pool) else ""
        run.group(GroupSummary(group.id, name, group.min_size, group.max_size, group.target_size, MANAGED_AUTOSCALER))
    if listing.groups:
        run.warn(
            "Kapsule's managed autoscaler acts on every pool whose autoscaling is on, and those are the pools the "
            "private mode serves: two autoscalers would set their sizes. To be their only autoscaler, use mode: "
            "public on pools with autoscaling off"
        )
    else:
        run.warn(f"no pool of cluster {config.cluster_id} has autoscaling on: the CA will see no node group")
    run.not_checked(
        f"the writes the server makes (PATCH {PRIVATE_ROUTES.pool}, DELETE {PRIVATE_ROUTES.node}): "
        "validate --online never writes; the key's IAM policy must allow them (KubernetesFullAccess)"
    )


def _private_listing(adapter: ScalewayAdapter, run: Preflight) -> CloudListing | None:
    config = adapter.config
    try:
        return adapter.list_groups(run.deadline)
    except (CloudAuthFailed, CloudRequestRejected) as err:
        status = http_status(err)
        if status == 401:
            _refused_key(config.secret_key, status, run)
            return None
        answer = f"answered {status}" if status else f"refused ({err})"
        run.problem(
            "mode",
            f"this key cannot use Kapsule's private autoscaler endpoints (GET {PRIVATE_ROUTES.pools} {answer}), "
            "though it reads the cluster through the public API",
            "set mode: public, the self-managed mode on Kapsule's public API",
        )
    except DomainError as err:
        _unreachable(config.api_url, err, run)
    return None


#: the checks of each ``mode`` (the ``scaleway:`` key), after the shared ones passed
MODE_CHECKS: dict[str, Callable[[ModeCheck], None]] = {DEFAULT_MODE: private_mode}
