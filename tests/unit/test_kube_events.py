"""The pure parts of the Kubernetes Events feature: the token bucket, aggregation, which outcomes make an
Event and what it says. The writer itself is tested on the real API server (tests/kube/test_events.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from providers.config_errors import ConfigError
from providers.errors import (
    ChangeOutcomeUnknown,
    CloudRequestRejected,
    CloudUnavailable,
    InvalidDelta,
    NodeNotInGroup,
    SizeLimitExceeded,
)
from providers.model import NodeRef
from server.config import parse
from server.kube.events import (
    FAILED_SCALE_UP,
    FAILED_TO_DELETE_NODE,
    MAX_MESSAGE,
    SCALED_UP_GROUP,
    EventBook,
    EventSpec,
    TokenBucket,
    scale_event,
)
from server.logs import clear_registered_secrets, register_secret
from server.service import ScaleAction

FAILURE = EventSpec(FAILED_SCALE_UP, "Warning", "IncreaseSize of pool-a by 1 failed: 503", "IncreaseSize")


def book(burst: int = 3, refill: float = 10.0, window: float = 600.0) -> EventBook:
    return EventBook(burst, refill, window, "ca-externalgrpc-status")


def write_all(events: EventBook, now: float) -> list[tuple[str, int]]:
    """What the writer would do now: create (no name yet) or patch, with the count it would send."""
    done = []
    for series in events.due(now):
        done.append(("patch" if series.name else "create", series.count))
        events.written(series, series.name or f"e{len(events.series)}.{now}", series.count)
    return done


# ------------------------------------------------------------------------------------ token bucket
def test_the_bucket_gives_burst_tokens_then_one_per_refill_interval() -> None:
    bucket = TokenBucket(burst=3, refill_interval=10.0, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.next_token_at(0.0) == pytest.approx(10.0)
    assert not bucket.take(9.9)
    assert bucket.take(10.0)
    assert not bucket.take(10.0)


def test_the_bucket_never_holds_more_than_burst() -> None:
    bucket = TokenBucket(burst=2, refill_interval=1.0, now=0.0)
    assert sum(bucket.take(1000.0) for _ in range(10)) == 2


# ------------------------------------------------------------------------------------ aggregation
def test_a_repeat_within_the_window_grows_the_count_of_the_same_event() -> None:
    events = book()
    events.record(FAILURE, wall=100.0, now=0.0)
    assert write_all(events, 0.0) == [("create", 1)]
    events.record(FAILURE, wall=101.0, now=1.0)
    events.record(FAILURE, wall=102.0, now=2.0)
    assert write_all(events, 2.0) == [("patch", 3)]
    (series,) = events.series.values()
    assert (series.first_seen, series.last_seen) == (100.0, 102.0)


def test_a_repeat_after_the_window_is_a_new_event() -> None:
    events = book(window=60.0)
    events.record(FAILURE, wall=0.0, now=0.0)
    write_all(events, 0.0)
    events.record(FAILURE, wall=61.0, now=61.0)
    assert write_all(events, 61.0) == [("create", 1)]


def test_a_new_message_while_the_bucket_is_empty_is_dropped_but_repeats_are_kept_for_later() -> None:
    events = book(burst=2, refill=10.0)
    specs = [EventSpec(FAILED_SCALE_UP, "Warning", f"by {i} failed", "IncreaseSize") for i in range(3)]
    assert events.record(specs[0], 0.0, 0.0) is not None
    assert events.record(specs[1], 0.0, 0.0) is not None
    assert events.record(specs[2], 0.0, 0.0) is None  # a third distinct Event: no token, dropped
    assert write_all(events, 0.0) == [("create", 1), ("create", 1)]
    for _ in range(5):
        assert events.record(specs[0], 1.0, 1.0) is not None  # repeats wait, counted
    assert write_all(events, 1.0) == []
    assert events.next_due_at(1.0) == pytest.approx(10.0)
    assert write_all(events, 10.0) == [("patch", 6)]


def test_reasons_have_buckets_of_their_own() -> None:
    events = book(burst=1)
    other = EventSpec(SCALED_UP_GROUP, "Normal", "Scaled up pool-a by 1", "IncreaseSize")
    assert events.record(FAILURE, 0.0, 0.0) is not None
    assert events.record(other, 0.0, 0.0) is not None


def test_a_flapping_cloud_is_written_at_most_burst_plus_refills_times_with_exact_counts() -> None:
    burst, refill = 5, 2.0
    events = book(burst=burst, refill=refill)
    writes, dropped, occurrences = 0, 0, 0
    now = 0.0
    while now < 60.0:  # one failure every 50 ms for a minute, in 7 distinct messages
        spec = EventSpec(FAILED_SCALE_UP, "Warning", f"by {occurrences % 7} failed", "IncreaseSize")
        occurrences += 1
        if events.record(spec, now, now) is None:
            dropped += 1
        writes += len(write_all(events, now))
        now += 0.05
    assert writes <= burst + 60.0 / refill + 1
    while (due := events.next_due_at(now)) is not None:  # the pending repeats drain as tokens come
        now = due
        writes += len(write_all(events, now))
    assert sum(s.count for s in events.series.values()) + dropped == occurrences
    assert writes <= burst + now / refill + 1


def test_a_refused_write_forgets_the_series_so_a_later_occurrence_starts_anew() -> None:
    events = book()
    series = events.record(FAILURE, 0.0, 0.0)
    assert series is not None
    events.due(0.0)
    events.failed(series)
    assert events.record(FAILURE, 1.0, 1.0) is not None
    assert write_all(events, 1.0) == [("create", 1)]


def test_a_replica_that_stops_leading_drops_only_what_it_has_not_written() -> None:
    events = book(burst=1)
    assert events.record(FAILURE, 0.0, 0.0) is not None
    assert write_all(events, 0.0) == [("create", 1)]
    events.record(FAILURE, 1.0, 1.0)
    events.record(FAILURE, 2.0, 2.0)  # two repeats wait for the next token
    assert events.drop_unwritten() == 2
    assert events.drop_unwritten() == 0 and write_all(events, 60.0) == []


# ------------------------------------------------------------------------------------ which outcomes
def action(kind: str, error: Exception | None = None, **extra: object) -> ScaleAction:
    fields: dict[str, object] = {"delta": 2, "nodes": (), "target": 5, **extra}
    return ScaleAction("scw", "pool-a", kind, error=error, **fields)  # type: ignore[arg-type]


def test_a_success_is_a_normal_event_naming_the_group_and_the_new_target() -> None:
    spec = scale_event(action("increase"))
    assert spec is not None
    assert (spec.reason, spec.type, spec.action) == (SCALED_UP_GROUP, "Normal", "IncreaseSize")
    assert "pool-a" in spec.message and "by 2" in spec.message and "target size now 5" in spec.message


@pytest.mark.parametrize(
    "error",
    [InvalidDelta("delta must be positive"), SizeLimitExceeded("beyond max"), NodeNotInGroup("not ours")],
)
def test_a_request_the_server_refuses_itself_is_no_event(error: Exception) -> None:
    assert scale_event(action("increase", error)) is None


def test_a_cloud_failure_is_a_warning_with_the_clouds_reason_and_no_secret() -> None:
    register_secret("s3cr3t-token-value")
    try:
        spec = scale_event(action("increase", CloudRequestRejected("403: token s3cr3t-token-value is denied", 403)))
    finally:
        clear_registered_secrets()
    assert spec is not None
    assert (spec.reason, spec.type) == (FAILED_SCALE_UP, "Warning")
    assert "is denied" in spec.message and "s3cr3t-token-value" not in spec.message


def test_an_unconfirmed_change_is_not_called_failed() -> None:
    spec = scale_event(action("increase", ChangeOutcomeUnknown("the answer was lost")))
    assert spec is not None and "not confirmed" in spec.message and "failed" not in spec.message


def test_a_deletion_names_its_nodes_and_relates_a_single_node() -> None:
    nodes = tuple(NodeRef(f"scaleway://instance/fr-par-1/{i}", f"node-{i}") for i in range(12))
    spec = scale_event(action("delete", CloudUnavailable("503"), nodes=nodes))
    assert spec is not None and spec.reason == FAILED_TO_DELETE_NODE
    assert "node-0" in spec.message and "and 2 more" in spec.message and spec.related_node == ""
    single = scale_event(action("delete", nodes=nodes[:1]))
    assert single is not None and single.related_node == "node-0"


def test_a_huge_error_is_cut_to_a_message_the_api_server_accepts() -> None:
    spec = scale_event(action("decrease", CloudUnavailable("x" * 10_000)))
    assert spec is not None and len(spec.message) <= MAX_MESSAGE


# ------------------------------------------------------------------------------------ configuration
def _config_with(kubernetes: object) -> dict[str, object]:
    backend = {"name": "scw", "type": "scaleway", "scaleway": {"cluster_id": CLUSTER_ID, "secret_key": KEY}}
    return {"listen": "127.0.0.1:8086", "backends": [backend], "kubernetes": kubernetes}


CLUSTER_ID = "11111111-2222-4333-8444-555555555555"
KEY = "0f0e0d0c-0b0a-4908-8706-050403020100"


def test_the_example_of_the_events_docs_is_a_valid_config() -> None:
    reference = Path(__file__).resolve().parents[2] / "docs" / "reference" / "kubernetes-features.md"
    text = reference.read_text().split("## Events", 1)[1]
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    events = parse(_config_with(yaml.safe_load(block)["kubernetes"]), env={"SCW_REGION": "fr-par"}).kubernetes.events
    assert events.enabled and (events.burst, events.refill_interval) == (25, 10.0)
    assert (events.aggregation_window, events.status_interval) == (600.0, 10.0)


@pytest.mark.parametrize(
    ("events", "key"),
    [
        ({"burst": 0}, "burst"),
        ({"refill_interval": "0s"}, "refill_interval"),
        ({"object_name": "Not A Name"}, "object_name"),
        ({"aggregation_window": 10}, "aggregation_window"),
    ],
)
def test_a_bad_events_setting_is_refused_naming_its_key(events: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(_config_with({"events": {"enabled": True, **events}}), env={"SCW_REGION": "fr-par"})
    assert f"kubernetes.events.{key}" in str(refused.value)


def test_a_repeat_waiting_for_a_token_past_the_window_keeps_its_count() -> None:
    events = book(burst=1, refill=100.0, window=10.0)
    events.record(FAILURE, 0.0, 0.0)
    assert write_all(events, 0.0) == [("create", 1)]
    events.record(FAILURE, 5.0, 5.0)  # waits for a token (the next one comes at 100 s)
    events.record(FAILURE, 50.0, 50.0)  # past the window, but the Event still has an unwritten occurrence
    assert write_all(events, 100.0) == [("patch", 3)]


def test_the_server_without_kubernetes_features_never_loads_the_kubernetes_client() -> None:
    # The hooks the Events use live in the servicer; loading it (and the app) must not pull the client in.
    probe = "import sys, server.app, server.service; print('kubernetes' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
