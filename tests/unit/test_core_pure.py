"""Unit tests of pure protocol logic: generated code freshness, option generations, Node encoding."""

import subprocess
import sys

from protos import externalgrpc_pb2 as pb
from protos import k8s_core_v1_pb2 as k8s
from providers.model import NodeTemplate, Taint
from server import compat
from server.node_encoding import encode_template, is_valid_quantity


def test_generated_protobuf_code_is_current():
    result = subprocess.run([sys.executable, "-m", "server.protogen", "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_options_fill_both_generations_from_legacy_defaults():
    defaults = pb.NodeGroupAutoscalingOptions(scaleDownUtilizationThreshold=0.5)
    defaults.scaleDownUnneededTime.duration = 600 * 10**9
    opts = compat.build_options(
        defaults, compat.OptionsOverride(max_node_provision_time=900)
    ).nodeGroupAutoscalingOptions
    assert opts.scaleDownUtilizationThreshold == 0.5
    assert opts.scaleDownUnneededTime.duration == 600 * 10**9 and opts.scaleDownUnneededDuration.seconds == 600
    assert opts.MaxNodeProvisionTime.duration == 900 * 10**9 and opts.MaxNodeProvisionDuration.seconds == 900
    assert opts.HasField("scaleDownUnreadyTime") and opts.HasField("scaleDownUnreadyDuration")


def test_options_prefer_new_generation_defaults():
    defaults = pb.NodeGroupAutoscalingOptions()
    defaults.scaleDownUnneededTime.duration = 1
    defaults.scaleDownUnneededDuration.seconds = 42
    opts = compat.build_options(defaults, compat.OptionsOverride()).nodeGroupAutoscalingOptions
    assert opts.scaleDownUnneededTime.duration == 42 * 10**9


def test_template_bytes_decode_as_node_in_both_fields():
    tmpl = NodeTemplate({"kubernetes.io/os": "linux"}, (Taint("k", "v", "NoSchedule"),), {"cpu": "2"}, {"cpu": "1800m"})
    raw = encode_template("g1", tmpl)
    response = compat.template_response(raw)
    assert response.nodeInfo == response.nodeBytes == raw
    node = k8s.Node.FromString(raw)
    assert node.status.allocatable["pods"].string == "110"
    assert node.status.capacity["cpu"].string == "2"
    assert node.spec.taints[0].effect == "NoSchedule"
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_quantity_validation_rejects_go_unparseable_strings():
    assert is_valid_quantity("1500m") and is_valid_quantity("16Gi") and is_valid_quantity("110")
    assert not is_valid_quantity("") and not is_valid_quantity("2 GB") and not is_valid_quantity("2GB")
