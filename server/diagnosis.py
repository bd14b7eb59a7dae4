"""What to check when a backend's cloud refuses it, named by the setting the operator must look at.

A cloud's 401, 403 or 404 says *that* something is wrong, not *which* of the operator's settings: the
secret key, the cluster id, the region, the Bizfly login. Each backend gets an ``Advisor`` built from
its validated settings and from where each came from (a key of the file, the variable a ``*_env`` key
names, or an upstream variable such as ``CLUSTER_ID``), so the sync log line, ``/readyz``, ``status``,
the Event and the answer to ``Refresh`` all say the same: the kind of failure and what to check.

The kinds (``Diagnosis.kind``, also the ``reason`` label of ``ca_externalgrpc_backend_unusable``):

``credentials``  the cloud refused the credentials (401) or their permissions (403)
``not_found``    the cluster (or the API path) does not exist: cluster id, region or API URL (404)
``rejected``     another 4xx: the cloud understood the request and refused it
``unreachable``  no answer, a 5xx or 429 after retries, a proxy or TLS failure: the network or the cloud
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from providers.backend import KIND_WORDS, Diagnosis
from providers.errors import CloudAuthFailed, CloudRequestRejected, http_status

KINDS = ("credentials", "not_found", "rejected", "unreachable")


class Advisor:
    """``diagnose(error)`` for one backend: the kind of failure and the settings to check."""

    def __init__(self, cloud: str, settings: Any, origins: Mapping[str, str]) -> None:
        self.cloud = cloud
        self.settings = settings
        self.origins = dict(origins)

    def _named(self, key: str, show_value: bool = True) -> str:
        where = self.origins.get(key, key)
        value = getattr(self.settings, key, "")
        if not show_value or value in (None, ""):
            return where
        return f"{where} = {value!r}"

    def _set(self, key: str) -> bool:
        """Whether the operator set ``key`` (in the file, through a ``*_env`` key, or a variable)."""
        return not self.origins.get(key, "(not set").endswith("(not set: the default)")

    def diagnose(self, err: BaseException) -> Diagnosis:
        status = http_status(err)
        if isinstance(err, CloudAuthFailed):
            return Diagnosis("credentials", self._credentials(status))
        if isinstance(err, CloudRequestRejected):
            if status == 404:
                return Diagnosis("not_found", self._where())
            return Diagnosis("rejected", f"{self._where()}; the cloud's message says what it refused")
        return Diagnosis("unreachable", self._network())

    # ------------------------------------------------------------------ per cloud
    def _credentials(self, status: int | None) -> str:
        if self.cloud == "scaleway":
            if status == 403 and getattr(self.settings, "public", False):
                return (
                    f"the permissions of the API key in {self._named('secret_key', False)}; its IAM policy needs "
                    f"KubernetesFullAccess and InstancesReadOnly on the project of {self._named('cluster_id')}"
                )
            if status == 403:
                return (
                    f"the permissions of the API key in {self._named('secret_key', False)}; its IAM policy "
                    f"must allow Kubernetes on the project of {self._named('cluster_id')}"
                )
            return (
                f"the key in {self._named('secret_key', False)}; it must be the secret key (a UUID) of an "
                "IAM API key, not its access key, and the key must not be expired or deleted"
            )
        if self.cloud == "bizfly":
            method = getattr(self.settings, "auth_method", "")
            if method == "application_credential":
                login = (
                    f"{self._named('app_credential_id')} and {self._named('app_credential_secret', False)} "
                    f"(auth_method from {self._named('auth_method', False)})"
                )
            else:
                login = (
                    f"{self._named('email')} and {self._named('password', False)} "
                    f"(auth_method from {self._named('auth_method', False)})"
                )
            project = "tenant_id" if self._set("tenant_id") and not self._set("project_id") else "project_id"
            extra = f", and {self._named(project)} when the account has several projects"
            if status == 403:
                return f"the Bizfly account's permissions on the cluster (the login is {login}{extra})"
            return f"the Bizfly login, {login}{extra}; and {self._named('token_url')}"
        return "the backend's credentials"

    def _where(self) -> str:
        if self.cloud == "scaleway":
            return (
                f"{self._named('cluster_id')} and {self._named('region')}; the cluster must exist in that region "
                f"(API {self._named('api_url')})"
            )
        if self.cloud == "bizfly":
            return (
                f"{self._named('cluster_name')} (the cluster UID, not its display name) and {self._named('region')}; "
                f"the cluster must exist in that region (API {self._named('api_url')})"
            )
        return "the cluster id and region"

    def _network(self) -> str:
        return (
            f"that the pod reaches {self._named('api_url')} (HTTPS_PROXY, NO_PROXY, DNS, a TLS-intercepting "
            "proxy's CA), and the cloud's status page; the server retries by itself"
        )


def origins(index: int, cloud: str, raw_cloud: Mapping[str, Any] | None, sources: Mapping[str, str]) -> dict[str, str]:
    """Where each setting of ``backends[index].<cloud>`` came from, as the operator would find it.

    ``sources`` maps a key to the upstream variable that set it (validation's record).
    """
    raw = raw_cloud or {}
    prefix = f"backends[{index}].{cloud}"
    found: dict[str, str] = {}
    keys = set(raw) | set(sources) | {k.removesuffix("_env") for k in raw if k.endswith("_env")}
    from server.config import CLOUD_MODELS

    model = CLOUD_MODELS.get(cloud)
    if model is not None:
        keys |= set(model.model_fields)
    for key in sorted(keys):
        if key in sources:
            found[key] = f"environment variable {sources[key]}"
        elif f"{key}_env" in raw:
            found[key] = f"{prefix}.{key}_env (variable {raw[f'{key}_env']})"
        elif key in raw:
            found[key] = f"{prefix}.{key}"
        else:
            found[key] = f"{prefix}.{key} (not set: the default)"
    return found


# ---------------------------------------------------------------------------- one report per backend


@dataclass(frozen=True, slots=True)
class BackendReport:
    """A backend's state, said once for /readyz, ``status`` (the Diagnostics service) and tests."""

    name: str
    cloud: str
    healthy: bool  # serving its groups and not refused by the cloud (or paused on a follower replica)
    state: str  # serving, not synced, stale, refused, paused
    summary: str  # the state with the last error and what to check (the Diagnostics service, the log)
    readiness: str  # the line /readyz prints for it: the state and why, in words, without any value
    last_error: str
    check: str
    groups: int
    age: float | None
    failures: int


#: what /readyz adds to a backend that is not serving: where the detail is (the probe port is unauthenticated,
#: so the settings to check and their values, the cloud's own message, stay off it)
DETAIL_ELSEWHERE = "(what to check: ca-externalgrpc status, or the log)"


def report(backend: Any) -> BackendReport:
    h = backend.health()
    name = backend.name
    check = f"; check {h.check}" if h.check and h.consecutive_failures else ""
    why = KIND_WORDS.get(h.kind, "the cloud sync failed") if h.consecutive_failures else ""
    if not h.synced:
        state, summary = "not synced", f"{name}: not synced yet ({h.last_error or 'first sync pending'}){check}"
        readiness = f"{name}: not synced yet: {why or 'first sync pending'}"
    elif h.stale:
        state = "stale"
        summary = f"{name}: snapshot {h.age:.0f}s old, Refresh answers UNAVAILABLE ({h.last_error}){check}"
        readiness = f"{name}: snapshot {h.age:.0f}s old, Refresh answers UNAVAILABLE: {why or 'no sync since'}"
    elif h.refused:
        state = "refused"
        summary = f"{name}: snapshot {h.age:.0f}s old, the cloud refuses it now ({h.last_error}){check}"
        readiness = f"{name}: snapshot {h.age:.0f}s old, the cloud refuses it now: {why}"
    else:
        state, summary = "serving", f"{name}: snapshot {h.age:.0f}s old"
        readiness = summary
    if why and state != "serving":
        readiness += " " + DETAIL_ELSEWHERE
    paused = bool(getattr(backend, "paused", False))
    if paused:
        state = "paused"
    return BackendReport(
        name=name,
        cloud=str(getattr(getattr(backend, "adapter", None), "cloud", "")),
        healthy=h.usable or paused,
        state=state,
        summary=summary,
        readiness=readiness,
        last_error=h.last_error,
        check=h.check if h.consecutive_failures else "",
        groups=len(backend.snapshot.groups),
        age=h.age,
        failures=h.consecutive_failures,
    )


class DiagnosticsService:
    """``ca_externalgrpc.v1.Diagnostics`` (protos/diagnostics.proto): what ``status`` reads."""

    def __init__(self, backends: Any) -> None:
        self.backends = tuple(backends)

    def Backends(self, request: Any, context: Any) -> Any:  # noqa: N802 - the RPC's name
        from protos import diagnostics_pb2 as dpb

        answer = dpb.BackendsResponse()
        for backend in self.backends:
            r = report(backend)
            state = answer.backends.add(
                name=r.name,
                cloud=r.cloud,
                healthy=r.healthy,
                state=r.state,
                summary=r.summary,
                last_error=r.last_error,
                check=r.check,
                groups=r.groups,
                consecutive_failures=r.failures,
            )
            if r.age is not None:
                state.snapshot_age_seconds = r.age
        return answer
