"""The pure parts of the change journal (server/kube/journal.py): keys, entries, error wording."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from typing import Any

import pytest

from providers.deadline import RESPONSE_MARGIN, Deadline
from server.kube.journal import (
    READ_SHARE,
    RECORD_SHARE,
    UNCHANGED,
    BackendJournal,
    Entry,
    _age,
    _api_date,
    _network_reason,
    _timed_out,
    entry_key,
)
from server.logs import clear_registered_secrets, register_secret

CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def test_a_plain_backend_and_group_id_make_a_readable_key() -> None:
    assert entry_key("scw", "b1b1b1b1-0000-4000-8000-000000000001") == "scw.b1b1b1b1-0000-4000-8000-000000000001"


@pytest.mark.parametrize("group", ["pool/with/slashes", "ünïcode", "x" * 400, "a b", ""])
def test_any_group_id_makes_a_valid_and_distinct_configmap_key(group: str) -> None:
    key = entry_key("bizfly", group)
    assert CONFIGMAP_KEY.match(key), key
    assert key != entry_key("bizfly", group + "2") and key != entry_key("other", group)


def test_an_entry_survives_its_json_form_and_says_when_in_words() -> None:
    entry = Entry("id1", "scw", "pool-1", "increase", 2, 4, "unknown", 1796300000.5, "replica-a", "timed out")
    text = entry.to_json()
    assert Entry.from_json(text) == entry
    assert json.loads(text)["recorded_at"] == "2026-12-03T12:13:20Z"


def test_an_entrys_age_is_the_api_servers_time_between_its_record_and_its_read() -> None:
    read_at = _api_date({"Date": "Thu, 03 Dec 2026 12:15:20 GMT"})
    assert read_at == 1796300120.0
    entry = Entry("id1", "scw", "pool-1", "increase", 2, 4, "unknown", 1796000000.0, "replica-a", api_time=1796300000.0)
    assert _age(entry, read_at) == 120.0  # the writer's own clock (since) plays no part
    assert _age(replace(entry, api_time=None), read_at) == 0.0  # an older writer: taken as just recorded
    assert _age(entry, None) == 0.0 and _api_date({}) is None and _api_date({"date": "garbage"}) is None
    assert Entry.from_json(entry.to_json()).api_time == 1796300000.0


def test_the_journal_calls_before_the_cloud_call_leave_it_its_share_of_the_deadline() -> None:
    deadline = Deadline.after(5.0)
    usable = 5.0 - RESPONSE_MARGIN
    read_by = BackendJournal._budget(deadline, READ_SHARE) - time.monotonic()
    assert usable / 3 - 0.05 < read_by <= usable / 3
    # What is left after a read that took all its share: the record gets half, the cloud call the rest.
    record_by = BackendJournal._budget(Deadline.after(5.0 - usable / 3), RECORD_SHARE) - time.monotonic()
    assert usable / 3 - 0.05 < record_by <= usable / 3
    assert BackendJournal._budget(Deadline.after(0.1), READ_SHARE) <= time.monotonic() + 0.001  # nothing left


@pytest.mark.parametrize("text", ["not json", "{}", '{"id": "x"}', '{"id": 1, "base": "two"}'])
def test_a_damaged_entry_is_refused_with_a_parse_error(text: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        Entry.from_json(text)


def test_a_refused_connection_is_named_in_the_systems_words() -> None:
    wrapped = OSError(
        "HTTPSConnectionPool(host='127.0.0.1', port=1): Max retries exceeded (Caused by NewConnectionError("
        "\"HTTPSConnection(host='127.0.0.1', port=1): Failed to establish a new connection: [Errno 111] "
        'Connection refused"))'
    )
    assert _network_reason(wrapped) == "Connection refused"
    assert _network_reason(TimeoutError("read timed out")) == "TimeoutError: read timed out"


class _QueuedSettles:
    """Stands in for the Journal's background queue: keeps what would be sent to the API server."""

    def __init__(self) -> None:
        self.settles: list[Any] = []

    def settle_later(self, settle: Any) -> None:
        self.settles.append(settle)


def test_the_reason_of_an_unknown_outcome_is_stored_with_secrets_masked() -> None:
    register_secret("t0ps3cr3t-value-1234")
    try:
        queue = _QueuedSettles()
        journal = BackendJournal(queue, "scw")  # type: ignore[arg-type]
        journal._current["pool-1"] = "id1"
        journal.mark_unknown("pool-1", "PATCH answered 504: upstream echoed X-Auth-Token t0ps3cr3t-value-1234")
        entry = Entry("id1", "scw", "pool-1", "increase", 2, 4, "in-flight", 1796300000.0, "replica-a")
        (settle,) = queue.settles
        stored = settle.change(entry.to_json())
        assert "t0ps3cr3t" not in stored
        assert Entry.from_json(stored).state == "unknown"
        # Another entry (a newer change of the group) is left as it is.
        assert settle.change(replace(entry, id="id2").to_json()) is UNCHANGED
    finally:
        clear_registered_secrets()


def test_a_read_timeout_from_the_client_reads_as_no_answer_in_time() -> None:
    # The client's read timeout and our own wait share one budget; either may fire first, and both mean
    # the API server did not answer in time (not that it could not be reached).
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, NewConnectionError, ReadTimeoutError

    read = ReadTimeoutError(None, "/api", "Read timed out. (read timeout=1.5)")  # type: ignore[arg-type]
    assert _timed_out(read)
    assert _timed_out(MaxRetryError(None, "/api", ConnectTimeoutError("timed out")))  # type: ignore[arg-type]
    assert _timed_out(TimeoutError("timed out"))
    refused = NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")  # type: ignore[arg-type]
    assert not _timed_out(MaxRetryError(None, "/api", refused))  # type: ignore[arg-type]
    assert not _timed_out(OSError("Connection reset by peer"))
