from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BackendsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackendsResponse(_message.Message):
    __slots__ = ("backends",)
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    backends: _containers.RepeatedCompositeFieldContainer[BackendState]
    def __init__(self, backends: _Optional[_Iterable[_Union[BackendState, _Mapping]]] = ...) -> None: ...

class BackendState(_message.Message):
    __slots__ = ("name", "cloud", "healthy", "state", "summary", "last_error", "check", "groups", "snapshot_age_seconds", "consecutive_failures")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLOUD_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    name: str
    cloud: str
    healthy: bool
    state: str
    summary: str
    last_error: str
    check: str
    groups: int
    snapshot_age_seconds: float
    consecutive_failures: int
    def __init__(self, name: _Optional[str] = ..., cloud: _Optional[str] = ..., healthy: _Optional[bool] = ..., state: _Optional[str] = ..., summary: _Optional[str] = ..., last_error: _Optional[str] = ..., check: _Optional[str] = ..., groups: _Optional[int] = ..., snapshot_age_seconds: _Optional[float] = ..., consecutive_failures: _Optional[int] = ...) -> None: ...
