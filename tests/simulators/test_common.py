"""The shared simulator building blocks: clocks, faults, request log and the JSON API server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import requests

from simulators.common.clock import ManualClock, WallClock
from simulators.common.faults import Fault, FaultInjector, InvalidFault
from simulators.common.http import JsonApiServer, SimError, SimRequest, SimResponse, compile_pattern
from simulators.common.request_log import RecordedRequest, RequestLog


def cloud_error(status: int, message: str) -> dict:
    return {"message": message, "type": f"type_{status}"}


@pytest.fixture
def server(manual_clock: ManualClock) -> Iterator[JsonApiServer]:
    api = JsonApiServer(cloud_error, clock=manual_clock, state=lambda: {"widgets": 2})

    def get_widget(req: SimRequest) -> SimResponse:
        if req.params["widget_id"] == "missing":
            raise SimError(404, "widget not found")
        return SimResponse(200, {"id": req.params["widget_id"], "zone": req.params["zone"], "q": req.query})

    def echo(req: SimRequest) -> SimResponse:
        return SimResponse(201, {"echo": req.body}, {"X-Custom": "yes"})

    def broken(_req: SimRequest) -> SimResponse:
        raise RuntimeError("boom")

    api.route("GET", "/v1/zones/{zone}/widgets/{widget_id}", "get_widget", get_widget)
    api.route("POST", "/v1/echo", "echo", echo)
    api.route("GET", "/v1/broken", "broken", broken)
    api.start()
    yield api
    api.stop()


# -- clocks -------------------------------------------------------------------------------------


def test_manual_clock_moves_only_when_advanced() -> None:
    clock = ManualClock(start=100.0)
    assert clock.now() == 100.0
    assert clock.advance(2.5) == 102.5
    assert clock.now() == 102.5


def test_manual_clock_refuses_to_go_backwards() -> None:
    with pytest.raises(ValueError):
        ManualClock().advance(-1)


def test_manual_clock_is_consistent_under_concurrent_advances() -> None:
    clock = ManualClock(start=0.0)
    threads = [threading.Thread(target=lambda: [clock.advance(1) for _ in range(1000)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clock.now() == 8000.0


def test_wall_clock_advance_adds_an_offset() -> None:
    clock = WallClock(speed=1.0)
    before = clock.now()
    after = clock.advance(3600)
    assert after - before >= 3600


def test_wall_clock_runs_faster_with_speed() -> None:
    clock = WallClock(speed=1000.0)
    start = clock.now()
    real_start = time.monotonic()
    while time.monotonic() - real_start < 0.01:
        pass
    assert clock.now() - start >= 9.0  # at least 10 ms of real time at 1000x, minus float slack


def test_wall_clock_rejects_non_positive_speed() -> None:
    with pytest.raises(ValueError):
        WallClock(speed=0)


# -- faults -------------------------------------------------------------------------------------


def test_fault_applies_only_to_its_route_and_method() -> None:
    injector = FaultInjector()
    injector.add(Fault(route="list", method="GET", status=500))
    assert injector.match("other", "GET") is None
    assert injector.match("list", "POST") is None
    assert injector.match("list", "get") is not None


def test_fault_times_limits_how_often_it_applies() -> None:
    injector = FaultInjector()
    injector.add(Fault(route="*", status=503, times=2))
    assert injector.match("a", "GET") is not None
    assert injector.match("b", "GET") is not None
    assert injector.match("a", "GET") is None
    assert injector.active() == []


def test_fault_after_lets_requests_through_first() -> None:
    injector = FaultInjector()
    injector.add(Fault(route="list", status=500, after=2, times=1))
    assert [injector.match("list", "GET") is not None for _ in range(4)] == [False, False, True, False]


def test_fault_without_times_applies_until_cleared() -> None:
    injector = FaultInjector()
    injector.add(Fault(route="list", status=500))
    assert all(injector.match("list", "GET") is not None for _ in range(10))
    injector.clear()
    assert injector.match("list", "GET") is None


def test_a_fault_taken_back_ends_alone_and_others_stay() -> None:
    injector = FaultInjector()
    first, second = Fault(route="list", status=500), Fault(route="list", status=500)
    injector.add(first)
    injector.add(second)
    assert injector.remove(first)
    assert not injector.remove(first)
    assert injector.active() == [second] and injector.active()[0] is second
    assert injector.match("list", "GET") is second


def test_first_added_fault_wins() -> None:
    injector = FaultInjector()
    injector.add(Fault(route="list", status=500, times=1))
    injector.add(Fault(route="*", status=429, times=1))
    assert injector.match("list", "GET").status == 500
    assert injector.match("list", "GET").status == 429


@pytest.mark.parametrize(
    "data",
    [
        {"status": 500},
        {"route": "x", "status": 99},
        {"route": "x", "times": 0},
        {"route": "x", "after": -1},
        {"route": "x", "delay": -1},
        {"route": "x", "colour": "red"},
        ["not", "a", "dict"],
    ],
)
def test_invalid_fault_descriptions_are_rejected(data: object) -> None:
    with pytest.raises(InvalidFault):
        Fault.from_dict(data)


def test_fault_round_trips_through_a_dict() -> None:
    fault = Fault(route="list", method="GET", status=429, retry_after=3, times=2, headers={"X-A": "1"}, apply=True)
    assert Fault.from_dict(fault.to_dict()) == fault


# -- request log --------------------------------------------------------------------------------


def test_request_log_counts_and_filters_by_route_and_method() -> None:
    log = RequestLog()
    log.append(RecordedRequest(1.0, "GET", "/a", "a", status=200))
    log.append(RecordedRequest(2.0, "PATCH", "/b", "b", body={"size": 2}, status=200))
    log.append(RecordedRequest(3.0, "GET", "/b", "b", status=404))
    assert log.count() == 3
    assert log.count(route="b") == 2
    assert log.count(route="b", method="get") == 1
    assert [r.body for r in log.filter(method="PATCH")] == [{"size": 2}]
    log.clear()
    assert log.all() == []


# -- the server: routing ----------------------------------------------------------------------------


def test_route_pattern_extracts_path_parameters() -> None:
    match = compile_pattern("/k8s/v1/regions/{region}/pools/{pool_id}").match("/k8s/v1/regions/fr-par/pools/p-1")
    assert match is not None
    assert match.groupdict() == {"region": "fr-par", "pool_id": "p-1"}
    assert compile_pattern("/a/{x}").match("/a/b/c") is None


def test_server_listens_on_loopback(server: JsonApiServer) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.port > 0


def test_handler_gets_path_params_and_query(server: JsonApiServer, http: requests.Session) -> None:
    response = http.get(f"{server.url}/v1/zones/z1/widgets/w7?page=2&page=3&x=")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == {"id": "w7", "zone": "z1", "q": {"page": "2", "x": ""}}


def test_handler_status_and_headers_are_sent(server: JsonApiServer, http: requests.Session) -> None:
    response = http.post(f"{server.url}/v1/echo", json={"a": 1})
    assert response.status_code == 201
    assert response.headers["X-Custom"] == "yes"
    assert response.json() == {"echo": {"a": 1}}


def test_sim_error_uses_the_cloud_error_body(server: JsonApiServer, http: requests.Session) -> None:
    response = http.get(f"{server.url}/v1/zones/z1/widgets/missing")
    assert response.status_code == 404
    assert response.json() == {"message": "widget not found", "type": "type_404"}


def test_unknown_path_is_404_and_wrong_method_is_405(server: JsonApiServer, http: requests.Session) -> None:
    assert http.get(f"{server.url}/v2/nothing").status_code == 404
    response = http.delete(f"{server.url}/v1/echo")
    assert response.status_code == 405
    assert response.json()["type"] == "type_405"


def test_invalid_json_body_is_rejected_before_the_handler(server: JsonApiServer, http: requests.Session) -> None:
    response = http.post(f"{server.url}/v1/echo", data=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["type"] == "type_400"


def test_handler_crash_becomes_a_500_with_an_error_body(server: JsonApiServer, http: requests.Session) -> None:
    response = http.get(f"{server.url}/v1/broken")
    assert response.status_code == 500
    assert "boom" in response.json()["message"]


def test_body_on_a_get_is_accepted(server: JsonApiServer, http: requests.Session) -> None:
    response = http.get(f"{server.url}/v1/zones/z/widgets/w", data=b"{}", headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    assert server.requests.all()[-1].body == {}


# -- the server: request log ------------------------------------------------------------------------


def test_every_request_is_logged_with_route_status_headers_and_body(
    server: JsonApiServer, http: requests.Session, manual_clock: ManualClock
) -> None:
    http.post(f"{server.url}/v1/echo", json={"size": 3}, headers={"X-Auth-Token": "secret-value"})
    http.get(f"{server.url}/v1/zones/z/widgets/missing")
    http.get(f"{server.url}/nowhere")
    entries = server.requests.all()
    assert [(e.route, e.method, e.status) for e in entries] == [
        ("echo", "POST", 201),
        ("get_widget", "GET", 404),
        ("unknown", "GET", 404),
    ]
    assert entries[0].headers["x-auth-token"] == "secret-value"
    assert entries[0].body == {"size": 3}
    assert entries[0].at == manual_clock.now()


def test_request_log_is_readable_and_clearable_over_http(server: JsonApiServer, http: requests.Session) -> None:
    http.get(f"{server.url}/v1/zones/z/widgets/w?b=2&a=1")
    listed = http.get(f"{server.url}/_sim/requests").json()
    assert len(listed) == 1
    assert listed[0]["route"] == "get_widget"
    assert list(listed[0]["query"]) == ["a", "b"]
    assert http.get(f"{server.url}/_sim/requests?route=echo").json() == []
    assert http.delete(f"{server.url}/_sim/requests").status_code == 200
    assert server.requests.count() == 0


def test_control_requests_are_not_logged(server: JsonApiServer, http: requests.Session) -> None:
    http.get(f"{server.url}/_sim/state")
    http.get(f"{server.url}/_sim/requests")
    assert server.requests.count() == 0


# -- the server: faults -----------------------------------------------------------------------------


def test_status_fault_answers_with_cloud_error_and_retry_after(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="get_widget", status=503, retry_after=2.2, times=1))
    response = http.get(f"{server.url}/v1/zones/z/widgets/w")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "3"
    assert response.json()["type"] == "type_503"
    assert http.get(f"{server.url}/v1/zones/z/widgets/w").status_code == 200
    assert [e.status for e in server.requests.all()] == [503, 200]


def test_status_fault_can_carry_a_custom_body_and_headers(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="*", status=404, body={"status": 404}, headers={"X-Ratelimit-Remaining": "0"}))
    response = http.get(f"{server.url}/v1/zones/z/widgets/w")
    assert response.json() == {"status": 404}
    assert response.headers["X-Ratelimit-Remaining"] == "0"


def test_fault_for_another_method_does_not_apply(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="echo", method="GET", status=500))
    assert http.post(f"{server.url}/v1/echo", json={}).status_code == 201


def test_drop_fault_closes_the_connection_without_answering(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="echo", drop=True, times=1))
    with pytest.raises(requests.ConnectionError):
        http.post(f"{server.url}/v1/echo", json={"x": 1})
    assert server.requests.all()[-1].status == 0
    assert http.post(f"{server.url}/v1/echo", json={"x": 1}).status_code == 201


def test_malformed_fault_sends_200_with_invalid_json(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="get_widget", malformed=True, times=1))
    response = http.get(f"{server.url}/v1/zones/z/widgets/w")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    with pytest.raises(ValueError):
        response.json()


def test_content_type_fault_keeps_a_json_body_for_json_types(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="get_widget", content_type="application/json; charset=utf-8", times=1))
    response = http.get(f"{server.url}/v1/zones/z/widgets/w")
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert response.json()["id"] == "w"


def test_html_error_fault_sends_a_non_json_page(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="*", status=502, content_type="text/html", times=1))
    response = http.get(f"{server.url}/v1/zones/z/widgets/w")
    assert response.status_code == 502
    assert response.headers["Content-Type"] == "text/html"
    assert response.text.startswith("<html>")


def test_delay_fault_holds_the_answer_back(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="get_widget", delay=0.5, times=1))
    with pytest.raises(requests.Timeout):
        http.get(f"{server.url}/v1/zones/z/widgets/w", timeout=0.1)


def _counting_route(server: JsonApiServer) -> list[object]:
    """A write route that records every request it processed (the cloud's state change)."""
    applied: list[object] = []

    def write(req: SimRequest) -> SimResponse:
        applied.append(req.body)
        return SimResponse(200, {"applied": len(applied)})

    server.route("PATCH", "/v1/things/{thing_id}", "write_thing", write)
    return applied


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_apply_fault_processes_the_write_then_answers_an_error(
    server: JsonApiServer, http: requests.Session, status: int
) -> None:
    applied = _counting_route(server)
    server.faults.add(Fault(route="write_thing", status=status, apply=True, times=1))
    response = http.patch(f"{server.url}/v1/things/t1", json={"size": 4})
    assert response.status_code == status
    assert response.json() == cloud_error(status, f"injected fault ({status})")
    assert applied == [{"size": 4}]  # the change happened although the answer says it failed
    assert server.requests.count("write_thing", "PATCH") == 1


def test_apply_fault_can_drop_the_connection_after_the_change(server: JsonApiServer, http: requests.Session) -> None:
    applied = _counting_route(server)
    server.faults.add(Fault(route="write_thing", drop=True, apply=True, times=1))
    with pytest.raises(requests.ConnectionError):
        http.patch(f"{server.url}/v1/things/t1", json={"size": 5})
    assert applied == [{"size": 5}]


def test_the_request_log_says_whether_the_cloud_handled_each_request(
    server: JsonApiServer, http: requests.Session
) -> None:
    applied = _counting_route(server)
    server.faults.add(Fault(route="write_thing", drop=True, apply=True, times=1))
    server.faults.add(Fault(route="write_thing", status=503, times=1))
    with pytest.raises(requests.ConnectionError):
        http.patch(f"{server.url}/v1/things/t1", json={"size": 5})
    assert http.patch(f"{server.url}/v1/things/t1", json={"size": 6}).status_code == 503
    assert http.patch(f"{server.url}/v1/things/t1", json={"size": 7}).status_code == 200
    assert applied == [{"size": 5}, {"size": 7}]
    logged = [(r.status, r.handled) for r in server.requests.filter("write_thing")]
    # applied but never answered; refused by the fault without reaching the cloud; applied and answered
    assert logged == [(0, 200), (503, None), (200, 200)]
    assert all(r.received <= r.at for r in server.requests.all())


def test_apply_fault_with_a_delay_applies_at_once_and_answers_late(
    server: JsonApiServer, http: requests.Session
) -> None:
    applied = _counting_route(server)
    server.faults.add(Fault(route="write_thing", delay=0.5, apply=True, times=1))
    with pytest.raises(requests.Timeout):
        http.patch(f"{server.url}/v1/things/t1", json={"size": 6}, timeout=0.2)
    assert applied == [{"size": 6}]  # already applied when the client gave up


def test_a_plain_delay_fault_lands_the_change_only_after_the_delay(
    server: JsonApiServer, http: requests.Session
) -> None:
    applied = _counting_route(server)
    server.faults.add(Fault(route="write_thing", delay=0.5, times=1))
    with pytest.raises(requests.Timeout):
        http.patch(f"{server.url}/v1/things/t1", json={"size": 7}, timeout=0.2)
    assert applied == []
    deadline = time.monotonic() + 3
    while not applied and time.monotonic() < deadline:
        time.sleep(0.02)
    assert applied == [{"size": 7}]


def test_faults_are_managed_over_the_control_api(server: JsonApiServer, http: requests.Session) -> None:
    added = http.post(f"{server.url}/_sim/faults", json=[{"route": "echo", "status": 500}, {"route": "*", "times": 1}])
    assert added.status_code == 200
    assert len(http.get(f"{server.url}/_sim/faults").json()) == 2
    assert http.post(f"{server.url}/v1/echo", json={}).status_code == 500
    assert http.delete(f"{server.url}/_sim/faults").status_code == 200
    assert http.post(f"{server.url}/v1/echo", json={}).status_code == 201


def test_invalid_fault_over_the_control_api_is_a_400(server: JsonApiServer, http: requests.Session) -> None:
    response = http.post(f"{server.url}/_sim/faults", json={"route": "echo", "bogus": 1})
    assert response.status_code == 400
    assert "bogus" in response.json()["message"]
    assert server.faults.active() == []


def test_control_api_is_never_faulted(server: JsonApiServer, http: requests.Session) -> None:
    server.faults.add(Fault(route="*", status=500))
    assert http.get(f"{server.url}/_sim/state").json() == {"widgets": 2}


# -- the server: rate limit, advance ------------------------------------------------------------


def test_rate_limit_answers_429_with_retry_after_once_the_burst_is_spent(
    server: JsonApiServer, http: requests.Session
) -> None:
    server.rate_limit(per_second=0.01, burst=3)  # refills one token per 100 s: no refill during the test
    statuses = [http.get(f"{server.url}/v1/zones/z/widgets/w").status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]
    throttled = http.get(f"{server.url}/v1/zones/z/widgets/w")
    assert int(throttled.headers["Retry-After"]) >= 1
    assert throttled.json()["type"] == "type_429"
    assert server.requests.count() == 6
    server.rate_limit(None)
    assert http.get(f"{server.url}/v1/zones/z/widgets/w").status_code == 200


def test_rate_limit_is_not_applied_to_control_routes(server: JsonApiServer, http: requests.Session) -> None:
    server.rate_limit(per_second=0.01, burst=1)
    for _ in range(5):
        assert http.get(f"{server.url}/_sim/state").status_code == 200


def test_rate_limit_can_be_set_over_the_control_api(server: JsonApiServer, http: requests.Session) -> None:
    assert http.post(f"{server.url}/_sim/rate_limit", json={"per_second": 0.01, "burst": 1}).status_code == 200
    assert http.get(f"{server.url}/v1/zones/z/widgets/w").status_code == 200
    assert http.get(f"{server.url}/v1/zones/z/widgets/w").status_code == 429


def test_advance_moves_the_clock(server: JsonApiServer, http: requests.Session, manual_clock: ManualClock) -> None:
    before = manual_clock.now()
    response = http.post(f"{server.url}/_sim/advance", json={"seconds": 30})
    assert response.status_code == 200
    assert manual_clock.now() == before + 30
    assert response.json()["now"] == before + 30


@pytest.mark.parametrize("body", [{}, {"seconds": -1}, {"seconds": "x"}, {"seconds": True}])
def test_advance_rejects_bad_bodies(server: JsonApiServer, http: requests.Session, body: dict) -> None:
    assert http.post(f"{server.url}/_sim/advance", json=body).status_code == 400


def test_extra_control_routes_get_path_params(server: JsonApiServer, http: requests.Session) -> None:
    server.control_route("PATCH", "things/{thing_id}", lambda r: SimResponse(200, {"id": r.params["thing_id"]}))
    assert http.patch(f"{server.url}/_sim/things/t9", json={}).json() == {"id": "t9"}


def test_stop_releases_the_port(manual_clock: ManualClock) -> None:
    api = JsonApiServer(cloud_error, clock=manual_clock).start()
    url = api.url
    api.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/_sim/state", timeout=2)
