from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResultType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOT_FOUND: _ClassVar[ResultType]
    FOUND_REGULAR: _ClassVar[ResultType]
    FOUND_DICTIONARY: _ClassVar[ResultType]
NOT_FOUND: ResultType
FOUND_REGULAR: ResultType
FOUND_DICTIONARY: ResultType

class NodeInfo(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    def __init__(self, node_id: _Optional[bytes] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("auth", "peer", "validate")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_FIELD_NUMBER: _ClassVar[int]
    auth: bytes
    peer: NodeInfo
    validate: bool
    def __init__(self, auth: _Optional[bytes] = ..., peer: _Optional[_Union[NodeInfo, _Mapping]] = ..., validate: _Optional[bool] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("auth", "peer", "dht_time", "available")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    DHT_TIME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    auth: bytes
    peer: NodeInfo
    dht_time: float
    available: bool
    def __init__(self, auth: _Optional[bytes] = ..., peer: _Optional[_Union[NodeInfo, _Mapping]] = ..., dht_time: _Optional[float] = ..., available: _Optional[bool] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("auth", "keys", "subkeys", "values", "expiration_time", "in_cache", "peer")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SUBKEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    EXPIRATION_TIME_FIELD_NUMBER: _ClassVar[int]
    IN_CACHE_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    auth: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    subkeys: _containers.RepeatedScalarFieldContainer[bytes]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    expiration_time: _containers.RepeatedScalarFieldContainer[float]
    in_cache: _containers.RepeatedScalarFieldContainer[bool]
    peer: NodeInfo
    def __init__(self, auth: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., subkeys: _Optional[_Iterable[bytes]] = ..., values: _Optional[_Iterable[bytes]] = ..., expiration_time: _Optional[_Iterable[float]] = ..., in_cache: _Optional[_Iterable[bool]] = ..., peer: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class StoreResponse(_message.Message):
    __slots__ = ("auth", "store_ok", "peer")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    STORE_OK_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    auth: bytes
    store_ok: _containers.RepeatedScalarFieldContainer[bool]
    peer: NodeInfo
    def __init__(self, auth: _Optional[bytes] = ..., store_ok: _Optional[_Iterable[bool]] = ..., peer: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class FindRequest(_message.Message):
    __slots__ = ("auth", "keys", "peer")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    auth: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    peer: NodeInfo
    def __init__(self, auth: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., peer: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class FindResult(_message.Message):
    __slots__ = ("type", "value", "expiration_time", "nearest_node_ids", "nearest_peer_ids")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPIRATION_TIME_FIELD_NUMBER: _ClassVar[int]
    NEAREST_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    NEAREST_PEER_IDS_FIELD_NUMBER: _ClassVar[int]
    type: ResultType
    value: bytes
    expiration_time: float
    nearest_node_ids: _containers.RepeatedScalarFieldContainer[bytes]
    nearest_peer_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, type: _Optional[_Union[ResultType, str]] = ..., value: _Optional[bytes] = ..., expiration_time: _Optional[float] = ..., nearest_node_ids: _Optional[_Iterable[bytes]] = ..., nearest_peer_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class FindResponse(_message.Message):
    __slots__ = ("auth", "results", "peer")
    AUTH_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    auth: bytes
    results: _containers.RepeatedCompositeFieldContainer[FindResult]
    peer: NodeInfo
    def __init__(self, auth: _Optional[bytes] = ..., results: _Optional[_Iterable[_Union[FindResult, _Mapping]]] = ..., peer: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...
