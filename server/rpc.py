"""One unary call, from request bytes to (status, details, answer bytes), whichever engine serves it.

Both serving engines run every CloudProvider call that Python answers through ``Dispatcher.call``:
the grpcio engine (server/grpcio_engine.py) from its raw-bytes handlers, the native engine
(server/native_front.py) from the Rust front's ``dispatch`` callback. So decoding, the error mapping,
metrics and logging are one code path, and none of it imports grpcio: with the native engine the
process never loads it (about 15 MiB of RSS, docs/explanation/performance.md "Memory").

The steps of a call:

1. count it started (``grpc_server_started_total``) and start the clock;
2. decode the request; bytes that are not a valid message answer INVALID_ARGUMENT naming the expected
   type (grpcio itself would answer INTERNAL "Exception deserializing request!");
3. run the servicer method, which answers or raises ``Abort`` (server/service.py maps domain errors);
4. serialize the answer; one larger than ``MAX_ANSWER_BYTES`` answers RESOURCE_EXHAUSTED, as grpcio
   does with its send limit;
5. count the code and the time (``grpc_server_handled_total``, ``grpc_server_handling_seconds``).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from google.protobuf.message import Message

log = logging.getLogger("server.rpc")

#: the largest answer either engine sends (the CA's client accepts up to its own, larger, limit)
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class Code(enum.IntEnum):
    """The gRPC status codes, with gRPC's numbers and names (grpc.StatusCode without importing grpcio)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class Abort(Exception):
    """Raised by a servicer method: answer ``code`` with ``details`` instead of a message."""

    def __init__(self, code: Code, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class CallContext(Protocol):
    """What a servicer method may ask of its call; grpcio's ServicerContext has it too."""

    def time_remaining(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class NativeCallContext:
    """The context of a call the native front hands to Python."""

    timeout: float | None  # seconds left of the client's deadline when the front called Python
    received: float  # time.monotonic() then
    metadata: tuple[tuple[str, str], ...] = ()
    peer_address: str = ""

    def time_remaining(self) -> float | None:
        if self.timeout is None:
            return None
        return max(0.0, self.timeout - (time.monotonic() - self.received))

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def peer(self) -> str:
        return self.peer_address


#: counts one call: (code, seconds); see ``Metrics.rpc_observer``
Observer = Callable[[Code, float], None]
Answer = tuple[Code, str, bytes]


@dataclass(frozen=True, slots=True)
class UnaryMethod:
    service: str
    name: str
    request_type: type[Message]
    handler: Callable[[Any, CallContext], Message]
    started: Callable[[], None]
    observe: Observer

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


class Dispatcher:
    """Every unary method Python serves, by full path (``/package.Service/Method``)."""

    def __init__(self, methods: Sequence[UnaryMethod]) -> None:
        self.methods: Mapping[str, UnaryMethod] = {m.path: m for m in methods}

    def call(self, path: str, data: bytes, context: CallContext) -> Answer:
        method = self.methods.get(path)
        if method is None:
            return Code.UNIMPLEMENTED, "Method not found!", b""
        method.started()
        start = time.perf_counter()
        code, details, body = _run(method, data, context)
        method.observe(code, time.perf_counter() - start)
        return code, details, body

    def native(self, path: str, data: bytes, timeout: float | None, metadata: Any, peer: str) -> Answer:
        """The native front's ``dispatch`` callback."""
        context = NativeCallContext(timeout, time.monotonic(), tuple(metadata), peer)
        return self.call(path, data, context)


def _run(method: UnaryMethod, data: bytes, context: CallContext) -> Answer:
    request = method.request_type()
    try:
        request.ParseFromString(data)
    except Exception as err:  # any decode failure is the client's bytes, not our bug
        why = (str(err) or type(err).__name__)[:200]
        expected = method.request_type.DESCRIPTOR.full_name
        return Code.INVALID_ARGUMENT, f"the request bytes are not a valid {expected} message ({why})", b""
    try:
        answer = method.handler(request, context)
    except Abort as abort:
        return abort.code, abort.details, b""
    except Exception:  # the servicer maps its own failures; this is a bug past it
        log.exception("unexpected failure", extra={"grpc_method": method.name})
        return Code.UNKNOWN, "Exception calling application", b""
    body = answer.SerializeToString()
    if len(body) > MAX_ANSWER_BYTES:
        return Code.RESOURCE_EXHAUSTED, f"the answer is {len(body)} bytes, more than {MAX_ANSWER_BYTES}", b""
    return Code.OK, "", body


def service_methods(
    service: ServiceDescriptor,
    servicer: object,
    observer_for: Callable[[str, str], tuple[Callable[[], None], Observer]],
) -> list[UnaryMethod]:
    """A ``UnaryMethod`` per method of ``service``, each served by the servicer's method of that name."""
    methods = []
    for m in service.methods:
        started, observe = observer_for(service.full_name, m.name)
        methods.append(
            UnaryMethod(
                service.full_name,
                m.name,
                message_factory.GetMessageClass(m.input_type),
                getattr(servicer, m.name),
                started,
                observe,
            )
        )
    return methods


@dataclass(frozen=True)
class ReflectionData:
    """What the native front needs to answer gRPC server reflection (``Front.set_reflection``)."""

    services: list[str]
    files: list[tuple[str, bytes, list[str]]]  # (name, serialized FileDescriptorProto, imported names)
    symbols: dict[str, str]  # fully-qualified symbol -> the file that defines it


def reflection_data(services: Sequence[ServiceDescriptor]) -> ReflectionData:
    """The files defining ``services`` and every file they import, with the symbols each defines."""
    files: dict[str, FileDescriptor] = {}
    pending = [s.file for s in services]
    while pending:
        file = pending.pop()
        if file.name in files:
            continue
        files[file.name] = file
        pending.extend(file.dependencies)
    symbols: dict[str, str] = {}
    out = []
    for name, file in files.items():
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        out.append((name, proto.SerializeToString(), [d.name for d in file.dependencies]))
        prefix = f"{proto.package}." if proto.package else ""
        for message in proto.message_type:
            _message_symbols(prefix + message.name, message, name, symbols)
        for enum_type in proto.enum_type:
            symbols[prefix + enum_type.name] = name
        for service in proto.service:
            symbols[prefix + service.name] = name
            for method in service.method:
                symbols[f"{prefix}{service.name}.{method.name}"] = name
    return ReflectionData([s.full_name for s in services], out, symbols)


def _message_symbols(full: str, message: descriptor_pb2.DescriptorProto, file: str, symbols: dict[str, str]) -> None:
    symbols[full] = file
    for field in message.field:
        symbols[f"{full}.{field.name}"] = file
    for nested in message.nested_type:
        _message_symbols(f"{full}.{nested.name}", nested, file, symbols)
    for enum_type in message.enum_type:
        symbols[f"{full}.{enum_type.name}"] = file
