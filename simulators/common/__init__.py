"""Building blocks shared by the cloud simulators: clocks, fault injection, request log, HTTP server."""

from simulators.common.clock import Clock, ManualClock, WallClock
from simulators.common.faults import Fault, FaultInjector
from simulators.common.http import JsonApiServer, SimRequest, SimResponse
from simulators.common.request_log import RecordedRequest, RequestLog

__all__ = [
    "Clock",
    "Fault",
    "FaultInjector",
    "JsonApiServer",
    "ManualClock",
    "RecordedRequest",
    "RequestLog",
    "SimRequest",
    "SimResponse",
    "WallClock",
]
