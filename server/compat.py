"""Where the two protocol generations differ (CA <= 1.34.1 and >= 1.35), in one place.

docs/reference/protocol.md, "Field generations by CA release": requests are read preferring the new fields and
falling back to the legacy ones; responses set both generations.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from protos import externalgrpc_pb2 as pb
from providers.errors import InvalidRequest

NANOS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class OptionsOverride:
    """Per-group NodeGroupGetOptions values from the config; None = keep the CA's default."""

    scale_down_utilization_threshold: float | None = None
    scale_down_gpu_utilization_threshold: float | None = None
    scale_down_unneeded_time: float | None = None  # seconds
    scale_down_unready_time: float | None = None
    max_node_provision_time: float | None = None
    zero_or_max_node_scaling: bool | None = None
    ignore_daemonsets_utilization: bool | None = None


# (override attribute, legacy meta.v1.Duration field, new google.protobuf.Duration field)
_DURATIONS = (
    ("scale_down_unneeded_time", "scaleDownUnneededTime", "scaleDownUnneededDuration"),
    ("scale_down_unready_time", "scaleDownUnreadyTime", "scaleDownUnreadyDuration"),
    ("max_node_provision_time", "MaxNodeProvisionTime", "MaxNodeProvisionDuration"),
)
_SCALARS = (
    ("scale_down_utilization_threshold", "scaleDownUtilizationThreshold"),
    ("scale_down_gpu_utilization_threshold", "scaleDownGpuUtilizationThreshold"),
    ("zero_or_max_node_scaling", "zeroOrMaxNodeScaling"),
    ("ignore_daemonsets_utilization", "ignoreDaemonSetsUtilization"),
)


def _read_duration(defaults: pb.NodeGroupAutoscalingOptions, legacy: str, new: str) -> int:
    """Nanoseconds from the request defaults: field 8/9/10 if present, else 3/4/5, else 0."""
    if defaults.HasField(new):
        value = getattr(defaults, new)
        return value.seconds * NANOS + value.nanos
    if defaults.HasField(legacy):
        return int(getattr(defaults, legacy).duration)
    return 0


def _set_duration(options: pb.NodeGroupAutoscalingOptions, legacy: str, new: str, nanos: int) -> None:
    getattr(options, legacy).SetInParent()
    getattr(options, legacy).duration = nanos
    target = getattr(options, new)
    target.SetInParent()
    target.seconds, target.nanos = divmod(nanos, NANOS)


def build_options(
    defaults: pb.NodeGroupAutoscalingOptions, override: OptionsOverride
) -> pb.NodeGroupAutoscalingOptionsResponse:
    """The CA's defaults with the configured values on top, every duration in both generations."""
    options = pb.NodeGroupAutoscalingOptions()
    for attr, field_name in _SCALARS:
        value = getattr(override, attr)
        setattr(options, field_name, getattr(defaults, field_name) if value is None else value)
    for attr, legacy, new in _DURATIONS:
        value = getattr(override, attr)
        nanos = _read_duration(defaults, legacy, new) if value is None else round(value * NANOS)
        _set_duration(options, legacy, new, nanos)
    response = pb.NodeGroupAutoscalingOptionsResponse()
    response.nodeGroupAutoscalingOptions.CopyFrom(options)
    return response


def _time(message: object) -> dt.datetime:
    seconds = getattr(message, "seconds", 0)
    try:
        return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        # A Timestamp outside what a datetime holds (year 1..9999) is a malformed request, not a crash.
        raise InvalidRequest(f"pricing timestamp {seconds}s since the epoch is out of range") from None


def pricing_window(
    request: pb.PricingNodePriceRequest | pb.PricingPodPriceRequest,
) -> tuple[dt.datetime, dt.datetime]:
    """Start and end: google.protobuf.Timestamp fields if present, else the legacy meta.v1.Time ones."""
    start = request.startTimestamp if request.HasField("startTimestamp") else request.startTime
    end = request.endTimestamp if request.HasField("endTimestamp") else request.endTime
    return _time(start), _time(end)


def pod_bytes(request: pb.PricingPodPriceRequest) -> bytes:
    return request.pod_bytes or request.pod


def template_response(node_bytes: bytes) -> pb.NodeGroupTemplateNodeInfoResponse:
    """Same raw Node bytes in field 1 (CA <= 1.34.1) and field 2 (CA >= 1.34.2)."""
    return pb.NodeGroupTemplateNodeInfoResponse(nodeInfo=node_bytes, nodeBytes=node_bytes)


def labels_of(node: pb.ExternalGrpcNode) -> Mapping[str, str]:
    return dict(node.labels)
