"""A node-group override that names no group the cloud reports is logged after the first sync."""

from __future__ import annotations

import logging

import pytest

from devstack.harness import running_stack
from server.group_overrides import UnmatchedOverrideCheck
from simulators.scaleway import demo_scenario


def test_an_override_for_an_unknown_group_is_named_in_a_warning_after_the_first_sync(
    tmp_path, caplog: pytest.LogCaptureFixture
):
    scenario = demo_scenario()
    real = scenario["clusters"][0]["pools"][0]["id"]
    node_groups = {
        real: {"options": {"scale_down_unneeded_time": "5m"}},
        "f41fcb28-typo": {"template": {"labels": {"disk": "ssd"}}},
    }
    extra = {"scw": {"node_groups": node_groups}}
    with (
        caplog.at_level(logging.WARNING, logger="server.group_overrides"),
        running_stack(tmp_path, scaleway=scenario, backend_extra=extra) as stack,
    ):
        assert real in stack.groups()
        [check] = [c for c in stack.backend("scw").listeners if isinstance(c, UnmatchedOverrideCheck)]
        assert check.unmatched == ("f41fcb28-typo",)
        stack.sync()  # later syncs do not repeat it
    warnings = [r.getMessage() for r in caplog.records if r.name == "server.group_overrides"]
    assert len(warnings) == 1, warnings
    assert "f41fcb28-typo" in warnings[0] and "backend scw" in warnings[0] and real in warnings[0]
    assert real not in warnings[0].split("(its groups")[0]


def test_no_warning_when_every_override_matches(tmp_path, caplog: pytest.LogCaptureFixture):
    scenario = demo_scenario()
    real = scenario["clusters"][0]["pools"][0]["id"]
    extra = {"scw": {"node_groups": {real: {"options": {"zero_or_max_node_scaling": False}}}}}
    with (
        caplog.at_level(logging.WARNING, logger="server.group_overrides"),
        running_stack(tmp_path, scaleway=scenario, backend_extra=extra) as stack,
    ):
        [check] = [c for c in stack.backend("scw").listeners if isinstance(c, UnmatchedOverrideCheck)]
        assert check.unmatched == ()
    assert not [r for r in caplog.records if r.name == "server.group_overrides"]
