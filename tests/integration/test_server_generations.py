"""Both protocol generations against one server: CA <= 1.34.1 (old fields) and CA >= 1.35 (new fields).

Each generation's schema is compiled in a separate process (tests/generations/client.py), so the
answers are decoded exactly as a client of that generation would decode them, and requests are built
with only the fields that generation sends (docs/reference/protocol.md, "Field generations by CA release").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devstack.harness import running_stack
from protos import k8s_core_v1_pb2 as k8s
from tests.integration.test_server_rpcs import GENERAL, OPTIONS, SCENARIO, SMALL

ROOT = Path(__file__).resolve().parents[2]


def run(generation: str, address: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.generations.client", generation, address],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("generations")
    with running_stack(tmp, scaleway=SCENARIO, backend_extra={"scw": {"node_groups": OPTIONS}}) as stack:
        yield stack.address


def test_old_generation_reads_the_template_from_field_1(address):
    [answer] = run("old", address, [{"rpc": "NodeGroupTemplateNodeInfo", "request": {"id": GENERAL}}])
    node = answer["response"]["nodeInfo"]
    assert node["status"]["allocatable"]["pods"]["string"]
    assert node["metadata"]["labels"]["team"] == "web"


def test_new_generation_reads_the_template_from_field_2(address):
    [answer] = run("new", address, [{"rpc": "NodeGroupTemplateNodeInfo", "request": {"id": GENERAL}}])
    import base64

    node = k8s.Node.FromString(base64.b64decode(answer["response"]["nodeBytes"]))
    assert node.status.allocatable["pods"].string


def test_old_generation_options_come_back_in_nanosecond_durations(address):
    request = {
        "id": SMALL,
        "defaults": {
            "scaleDownUtilizationThreshold": 0.5,
            "scaleDownUnneededTime": {"duration": str(600 * 10**9)},
            "scaleDownUnreadyTime": {"duration": str(1200 * 10**9)},
            "MaxNodeProvisionTime": {"duration": str(900 * 10**9)},
        },
    }
    [answer] = run("old", address, [{"rpc": "NodeGroupGetOptions", "request": request}])
    options = answer["response"]["nodeGroupAutoscalingOptions"]
    assert int(options["scaleDownUnneededTime"]["duration"]) == 120 * 10**9  # configured 2m
    assert int(options["scaleDownUnreadyTime"]["duration"]) == 1200 * 10**9  # CA default kept
    assert int(options["MaxNodeProvisionTime"]["duration"]) == 900 * 10**9
    assert options["scaleDownUtilizationThreshold"] == pytest.approx(0.3)


def test_new_generation_options_come_back_as_protobuf_durations(address):
    request = {
        "id": SMALL,
        "defaults": {
            "scaleDownUtilizationThreshold": 0.5,
            "scaleDownUnneededDuration": "600s",
            "scaleDownUnreadyDuration": "1200s",
            "MaxNodeProvisionDuration": "900s",
        },
    }
    [answer] = run("new", address, [{"rpc": "NodeGroupGetOptions", "request": request}])
    options = answer["response"]["nodeGroupAutoscalingOptions"]
    assert options["scaleDownUnneededDuration"] == "120s"
    assert options["scaleDownUnreadyDuration"] == "1200s"
    assert options["MaxNodeProvisionDuration"] == "900s"


def test_unconfigured_options_are_an_empty_answer_for_both_generations(address):
    for generation in ("old", "new"):
        [answer] = run(generation, address, [{"rpc": "NodeGroupGetOptions", "request": {"id": GENERAL}}])
        assert answer["response"] == {} and answer["bytes"] == ""


def test_pricing_accepts_each_generations_request_fields(address):
    node = {"name": "t", "labels": {"k8s.scaleway.com/pool": GENERAL}}
    old = run(
        "old",
        address,
        [
            {
                "rpc": "PricingNodePrice",
                "request": {"node": node, "startTime": {"seconds": "0"}, "endTime": {"seconds": "3600"}},
            },
            {"rpc": "PricingPodPrice", "request": {"pod": {"metadata": {"name": "p"}}}},
        ],
    )
    new = run(
        "new",
        address,
        [
            {
                "rpc": "PricingNodePrice",
                "request": {
                    "node": node,
                    "startTimestamp": "1970-01-01T00:00:00Z",
                    "endTimestamp": "1970-01-01T01:00:00Z",
                },
            },
            {"rpc": "PricingPodPrice", "request": {"pod_bytes": ""}},
        ],
    )
    assert old[0]["response"]["price"] == pytest.approx(new[0]["response"]["price"])
    assert old[0]["response"]["price"] > 0
    assert "response" in old[1] and "response" in new[1]


def test_unimplemented_template_is_never_ok_with_empty_bytes(address):
    for generation in ("old", "new"):
        [answer] = run(generation, address, [{"rpc": "NodeGroupTemplateNodeInfo", "request": {"id": "unknown"}}])
        assert answer.get("code") == "NOT_FOUND"
