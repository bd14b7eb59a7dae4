"""``BizflySimulator``: the Bizfly Cloud Kubernetes Engine API on 127.0.0.1, for tests and the demo.

It assembles the state model, the token issuer, the catalog and the HTTP routes onto the shared
``JsonApiServer`` and adds the test helpers (in-process methods and ``/_sim/bizfly/...`` control routes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from simulators.bizfly.api import ROUTE_TOKEN, BizflyApi, CatalogSettings, error_body, state_errors
from simulators.bizfly.auth import TokenIssuer
from simulators.bizfly.scenario import parse_settings, populate
from simulators.bizfly.state import QUOTA_REASON, BizflyState
from simulators.common.clock import Clock, ManualClock
from simulators.common.faults import Fault, FaultInjector
from simulators.common.http import JsonApiServer, SimError, SimRequest, SimResponse
from simulators.common.request_log import RequestLog

DEFAULT_REGION = "HN"
DEFAULT_TOKEN_TTL = 3600.0


class BizflySimulator:
    """A Bizfly API simulator. ``clock`` defaults to a ``ManualClock`` so tests decide when time moves.

    ``region_spelling`` and ``token_ttl`` override the scenario (defaults ``"HN"`` and 3600 s); ``users``
    (email -> password) and ``app_credentials`` (id -> secret) override the scenario's account.
    """

    def __init__(
        self,
        scenario: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        port: int = 0,
        region_spelling: str | None = None,
        token_ttl: float | None = None,
        users: Mapping[str, str] | None = None,
        app_credentials: Mapping[str, str] | None = None,
    ) -> None:
        scenario = scenario or {}
        settings = parse_settings(scenario)
        self.clock: Clock = clock if clock is not None else ManualClock()
        self.faults = FaultInjector()
        self.requests = RequestLog()
        self.state = BizflyState(
            self.clock.now,
            vocabulary=settings.vocabulary,
            timings=settings.timings,
            delete_accepts_physical_id=settings.delete_accepts_physical_id,
            seed=settings.seed,
            shapes=settings.shapes,
            default_project=settings.project_id,
        )
        populate(self.state, scenario)
        self.tokens = TokenIssuer(
            self.clock.now,
            users=users if users is not None else settings.users,
            app_credentials=app_credentials if app_credentials is not None else settings.app_credentials,
            ttl=token_ttl if token_ttl is not None else settings.token_ttl or DEFAULT_TOKEN_TTL,
            projects=settings.projects,
            default_project=settings.project_id,
        )
        region = region_spelling or settings.catalog_region or DEFAULT_REGION
        self.catalog = CatalogSettings(region, settings.other_regions)
        self._server = JsonApiServer(
            error_body,
            port=port,
            clock=self.clock,
            faults=self.faults,
            requests=self.requests,
            on_advance=self.advance,
            state=self.snapshot,
        )
        # The base of the URLs the service catalog hands out: this server's own, unless a client reaches it
        # under another name (a test's interception proxy answering for the production host).
        self.catalog_base_url: str | None = None
        self._api = BizflyApi(
            self.state,
            self.tokens,
            self.catalog,
            lambda: self.catalog_base_url or self._server.url,
        )
        self._api.register(self._server)
        self._register_control_routes()
        if settings.rate_limit is not None:
            self._server.rate_limit(*settings.rate_limit)

    # ----- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> BizflySimulator:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> BizflySimulator:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL; also the ``api_url`` a client derives the catalog URL from."""
        return self._server.url

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def token_url(self) -> str:
        return f"{self.url}/api/token"

    @property
    def kubernetes_engine_url(self) -> str:
        """What the catalog advertises for the simulator's own region."""
        return f"{self.url}/api/kubernetes-engine"

    def rate_limit(self, per_second: float | None, burst: int = 1) -> None:
        self._server.rate_limit(per_second, burst)

    # ----- time -------------------------------------------------------------------------------------------
    def advance(self, seconds: float) -> float:
        """Move simulated time forward and apply every transition that became due; returns the new time."""
        advance = getattr(self.clock, "advance", None)
        if advance is None:
            raise TypeError(f"{type(self.clock).__name__} cannot be advanced")
        advance(seconds)
        self.state.reconcile()
        return self.clock.now()

    # ----- test helpers -----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        region, others = self.catalog.get()
        body = self.state.snapshot()
        body["catalog"] = {"region": region, "other_regions": list(others)}
        body["active_tokens"] = self.tokens.active_count()
        return body

    def node_refs(self, cluster_uid: str) -> list[dict[str, Any]]:
        """Name, ``providerID`` and labels of the Kubernetes Node behind each pool node."""
        return self.state.node_refs(cluster_uid)

    def fail_next_scale_up(self, pool_id: str, count: int = 1, reason: str = QUOTA_REASON) -> None:
        """The next ``count`` nodes the pool (id or name) creates end in the failed status, their creation
        failing with ``reason`` (Senlin: status_reason "Failed in creating server: <reason>.")."""
        self.state.fail_next_scale_up(pool_id, count, reason)

    def fail_health_check(self, node: str, reason: str | None = None) -> None:
        """A node that exists (id, physical_id or name) fails its health check: ERROR, "Check: Node is not
        ACTIVE." by default; it stays in the pool, not Ready."""
        self.state.fail_health_check(node, reason)

    def fail_recovery(self, node: str, reason: str = QUOTA_REASON) -> None:
        """A node that exists (id, physical_id or name) is recovered by recreating its server, which cannot
        be created: ERROR, "Failed in recovering node '<id>': Failed in creating server: <reason>."."""
        self.state.fail_recovery(node, reason)

    @property
    def project_id(self) -> str:
        """The account's default project (what a token is scoped to unless the login names another)."""
        return self.tokens.default_project

    def set_pool_labels_and_taints(self, pool_id: str, labels: dict[str, str], taints: list[dict[str, str]]) -> None:
        """Replace the labels and taints the pool (id or name) gives its nodes."""
        self.state.set_pool_labels_and_taints(pool_id, labels, taints)

    def set_node_status(self, node: str, status: str, reason: str | None = None) -> None:
        """Force the status of a node given by id, physical_id or name."""
        self.state.set_node_status(node, status, reason)

    def expire_tokens(self) -> int:
        """Expire every token issued so far; the next API call with one of them gets 401."""
        return self.tokens.expire_all()

    def revoke_token(self, token: str) -> bool:
        return self.tokens.revoke(token)

    def fail_token_endpoint(self, status: int = 500, times: int | None = 1, message: str | None = None) -> None:
        """Make ``POST /api/token`` answer ``status`` for the next ``times`` requests (None = until cleared)."""
        self.faults.add(Fault(route=ROUTE_TOKEN, method="POST", status=status, times=times, message=message))

    def set_catalog_regions(self, region: str, other_regions: Sequence[str] | None = None) -> None:
        """Spell the simulator's own region as ``region`` in the catalog (``HN``, ``hn``, ``HaNoi``...);
        ``other_regions`` are listed first, each with a Kubernetes Engine of its own that holds the clusters
        put in that region (``clusters[].region``)."""
        self.catalog.set(region, other_regions)

    # ----- control API ------------------------------------------------------------------------------------
    def _register_control_routes(self) -> None:
        server = self._server
        server.control_route("POST", "bizfly/fail-next-scale-up", self._control_fail_next_scale_up)
        server.control_route("POST", "bizfly/node-status", self._control_node_status)
        server.control_route("POST", "bizfly/fail-health-check", self._control_fail_health_check)
        server.control_route("POST", "bizfly/expire-tokens", self._control_expire_tokens)
        server.control_route("POST", "bizfly/catalog", self._control_catalog)
        server.control_route("GET", "bizfly/node-refs/{cluster_uid}", self._control_node_refs)

    @staticmethod
    def _control_body(request: SimRequest, *required: str) -> dict[str, Any]:
        body = request.body if isinstance(request.body, dict) else {}
        missing = [key for key in required if not body.get(key)]
        if missing:
            raise SimError(400, f"missing field(s): {', '.join(missing)}")
        return body

    def _control_fail_next_scale_up(self, request: SimRequest) -> SimResponse:
        body = self._control_body(request, "pool_id")
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise SimError(400, f"count must be a positive integer, got {count!r}")
        with state_errors():
            self.fail_next_scale_up(str(body["pool_id"]), count, str(body.get("reason", "Creation failed")))
        return SimResponse(200, {"ok": True})

    def _control_node_status(self, request: SimRequest) -> SimResponse:
        body = self._control_body(request, "node", "status")
        with state_errors():
            self.set_node_status(str(body["node"]), str(body["status"]), body.get("reason"))
        return SimResponse(200, {"ok": True})

    def _control_fail_health_check(self, request: SimRequest) -> SimResponse:
        body = self._control_body(request, "node")
        with state_errors():
            self.fail_health_check(str(body["node"]), body.get("reason"))
        return SimResponse(200, {"ok": True})

    def _control_expire_tokens(self, _request: SimRequest) -> SimResponse:
        return SimResponse(200, {"expired": self.expire_tokens()})

    def _control_catalog(self, request: SimRequest) -> SimResponse:
        body = self._control_body(request, "region")
        others = body.get("other_regions")
        self.set_catalog_regions(str(body["region"]), None if others is None else [str(r) for r in others])
        return SimResponse(200, {"ok": True})

    def _control_node_refs(self, request: SimRequest) -> SimResponse:
        with state_errors():
            return SimResponse(200, self.node_refs(request.params["cluster_uid"]))
