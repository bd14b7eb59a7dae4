"""``ScalewaySimulator``: the simulated Kapsule API as one object tests, benchmarks and the demo start."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from simulators.common.clock import Clock, ManualClock
from simulators.common.faults import Fault, FaultInjector
from simulators.common.http import JsonApiServer, SimError, SimRequest, SimResponse
from simulators.common.request_log import RequestLog
from simulators.scaleway.api import ScalewayApi, error_body, error_responder, rate_limit_headers_for
from simulators.scaleway.public_api import ScalewayPublicApi
from simulators.scaleway.scenarios import build_state
from simulators.scaleway.state import Behaviour, Node, Pool, ScalewaySimError, ScalewayState, ScenarioError


class ScalewaySimulator:
    def __init__(
        self,
        scenario: dict[str, Any] | None = None,
        clock: Clock | None = None,
        secret_key: str = "sim-secret-key",
        region: str = "fr-par",
        port: int = 0,
    ) -> None:
        self.clock: Clock = clock if clock is not None else ManualClock()
        self.secret_key = secret_key
        self.state: ScalewayState = build_state(self.clock, scenario, region)
        self.region = self.state.default_region
        self.api = ScalewayApi(self.state, secret_key)
        self.server = JsonApiServer(
            error_body,
            port=port,
            clock=self.clock,
            on_advance=self.advance,
            state=self.state.snapshot,
            rate_limit_headers=rate_limit_headers_for(self._error_shapes),
            error_response=error_responder(self._error_shapes),
        )
        self.api.register(self.server)
        ScalewayPublicApi(self.state, self.api).register(self.server)
        self._register_control_routes()

    def _error_shapes(self) -> str:
        return self.state.behaviour.error_shapes

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> ScalewaySimulator:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> ScalewaySimulator:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def faults(self) -> FaultInjector:
        return self.server.faults

    @property
    def requests(self) -> RequestLog:
        return self.server.requests

    @property
    def cluster_id(self) -> str:
        """The first cluster's id (most scenarios have exactly one)."""
        with self.state.lock:
            if not self.state.clusters:
                raise LookupError("the scenario has no cluster")
            return next(iter(self.state.clusters))

    # -- time ------------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> int:
        """Move the clock forward and apply every transition due by then; returns how many ran."""
        advance = getattr(self.clock, "advance", None)
        if advance is None:
            raise TypeError(f"{type(self.clock).__name__} cannot be advanced")
        advance(seconds)
        return self.state.run_due()

    # -- helpers for tests -------------------------------------------------------------------------------

    def add_pool(self, name: str, cluster_id: str | None = None, **options: Any) -> Pool:
        """Add a pool (see ``ScalewayState.add_pool`` for options); ``nodes`` defaults to ``size`` ready nodes."""
        return self.state.add_pool(cluster_id or self.cluster_id, name=name, **options)

    def remove_pool(self, pool_id: str) -> None:
        self.state.remove_pool(pool_id)

    def pool(self, pool_id: str) -> Pool:
        return self.state.pool(pool_id)

    def node(self, node_id: str) -> Node:
        return self.state.node(node_id)

    def nodes_of(self, pool_id: str) -> list[Node]:
        return self.state.nodes_of(pool_id)

    def node_refs(self, cluster_id: str | None = None, registered_only: bool = True) -> list[dict[str, Any]]:
        """Kubernetes-side view of the nodes: provider_id, name, labels (with hostname), annotations."""
        return self.state.node_refs(cluster_id or self.cluster_id, registered_only)

    def fail_next_scale_up(self, pool_id: str, mode: str = "creation_error", nodes: int | None = None) -> None:
        self.state.fail_next_scale_up(pool_id, mode, nodes)

    def lock_pool(self, pool_id: str) -> None:
        self.state.set_pool_status(pool_id, "locked")

    def upgrade_pool(self, pool_id: str) -> None:
        self.state.set_pool_status(pool_id, "upgrading")

    def release_pool(self, pool_id: str) -> None:
        """End a ``locked``/``upgrading`` hold; the status is recomputed from the nodes."""
        self.state.set_pool_status(pool_id, "ready")

    def set_autoscaling(self, pool_id: str, enabled: bool) -> None:
        self.state.edit_pool(pool_id, autoscaling=enabled)

    def set_node_status(self, node_id: str, status: str, error_message: str | None = None) -> None:
        self.state.set_node_status(node_id, status, error_message)

    def set_behaviour(self, **changes: Any) -> Behaviour:
        return self.state.set_behaviour(**changes)

    def inject(self, fault: Fault) -> None:
        self.faults.add(fault)

    def rate_limit(self, per_second: float | None, burst: int = 1) -> None:
        self.server.rate_limit(per_second, burst)

    # -- control API (under /_sim/) --------------------------------------------------------------------

    def _register_control_routes(self) -> None:
        control = self.server.control_route
        control("POST", "clusters/{cluster_id}/pools", self._control_add_pool)
        control("PATCH", "pools/{pool_id}", self._control_edit_pool)
        control("DELETE", "pools/{pool_id}", self._control_remove_pool)
        control("POST", "pools/{pool_id}/fail_next_scale_up", self._control_fail_next_scale_up)
        control("PATCH", "nodes/{node_id}", self._control_edit_node)
        control("PATCH", "behaviour", self._control_behaviour)
        control("GET", "clusters/{cluster_id}/node_refs", self._control_node_refs)

    @staticmethod
    def _body(request: SimRequest) -> dict[str, Any]:
        if request.body is None:
            return {}
        if not isinstance(request.body, dict):
            raise SimError(400, "body must be a JSON object")
        return request.body

    def _control(self, action: Any) -> SimResponse:
        try:
            return SimResponse(200, action())
        except ScalewaySimError as exc:
            raise SimError(404, str(exc)) from exc
        except (ValueError, TypeError, ScenarioError) as exc:
            raise SimError(400, str(exc)) from exc

    def _control_add_pool(self, request: SimRequest) -> SimResponse:
        options = dict(self._body(request))
        options["pool_id"] = options.pop("id", None)
        name = options.pop("name", None)
        if not name:
            raise SimError(400, "a pool needs a name")
        return self._control(lambda: self.state.add_pool(request.params["cluster_id"], name=name, **options).to_api())

    def _control_edit_pool(self, request: SimRequest) -> SimResponse:
        changes = self._body(request)
        return self._control(lambda: self.state.edit_pool(request.params["pool_id"], **changes).to_api())

    def _control_remove_pool(self, request: SimRequest) -> SimResponse:
        def remove() -> dict[str, Any]:
            self.state.remove_pool(request.params["pool_id"])
            return {}

        return self._control(remove)

    def _control_fail_next_scale_up(self, request: SimRequest) -> SimResponse:
        body = self._body(request)

        def arm() -> dict[str, Any]:
            self.state.fail_next_scale_up(
                request.params["pool_id"], body.get("mode", "creation_error"), body.get("nodes")
            )
            return {"pending": [list(item) for item in self.state.pool(request.params["pool_id"]).pending_failures]}

        return self._control(arm)

    def _control_edit_node(self, request: SimRequest) -> SimResponse:
        body = self._body(request)
        node_id = request.params["node_id"]

        def edit() -> dict[str, Any]:
            self.state.set_node_status(node_id, body["status"], body.get("error_message"))
            return self.state.node(node_id).to_api()

        if "status" not in body:
            raise SimError(400, 'body must be {"status": <node status>, "error_message": <optional>}')
        return self._control(edit)

    def _control_node_refs(self, request: SimRequest) -> SimResponse:
        registered_only = request.query.get("all", "false").lower() != "true"
        return self._control(lambda: self.state.node_refs(request.params["cluster_id"], registered_only))

    def _control_behaviour(self, request: SimRequest) -> SimResponse:
        changes = self._body(request)
        return self._control(lambda: asdict(self.state.set_behaviour(**changes)))
