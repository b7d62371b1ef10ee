from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PersistentConnectionRequest(_message.Message):
    __slots__ = ("callId", "callUnary", "unaryResponse", "cancel")
    CALLID_FIELD_NUMBER: _ClassVar[int]
    CALLUNARY_FIELD_NUMBER: _ClassVar[int]
    UNARYRESPONSE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    callId: bytes
    callUnary: CallUnaryRequest
    unaryResponse: CallUnaryResponse
    cancel: Cancel
    def __init__(self, callId: _Optional[bytes] = ..., callUnary: _Optional[_Union[CallUnaryRequest, _Mapping]] = ..., unaryResponse: _Optional[_Union[CallUnaryResponse, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ...) -> None: ...

class CallUnaryRequest(_message.Message):
    __slots__ = ("peer", "proto", "data")
    PEER_FIELD_NUMBER: _ClassVar[int]
    PROTO_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    peer: bytes
    proto: str
    data: bytes
    def __init__(self, peer: _Optional[bytes] = ..., proto: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class CallUnaryResponse(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: bytes
    error: bytes
    def __init__(self, response: _Optional[bytes] = ..., error: _Optional[bytes] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RPCError(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...
