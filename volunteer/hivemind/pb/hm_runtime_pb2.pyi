from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CompressionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[CompressionType]
    MEANSTD_16BIT: _ClassVar[CompressionType]
    FLOAT16: _ClassVar[CompressionType]
    QUANTILE_8BIT: _ClassVar[CompressionType]
    UNIFORM_8BIT: _ClassVar[CompressionType]
    BLOCKWISE_8BIT: _ClassVar[CompressionType]
NONE: CompressionType
MEANSTD_16BIT: CompressionType
FLOAT16: CompressionType
QUANTILE_8BIT: CompressionType
UNIFORM_8BIT: CompressionType
BLOCKWISE_8BIT: CompressionType

class ExpertUID(_message.Message):
    __slots__ = ("uid",)
    UID_FIELD_NUMBER: _ClassVar[int]
    uid: str
    def __init__(self, uid: _Optional[str] = ...) -> None: ...

class ExpertInfo(_message.Message):
    __slots__ = ("serialized_info",)
    SERIALIZED_INFO_FIELD_NUMBER: _ClassVar[int]
    serialized_info: bytes
    def __init__(self, serialized_info: _Optional[bytes] = ...) -> None: ...

class ExpertRequest(_message.Message):
    __slots__ = ("uid", "tensors", "metadata")
    UID_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    uid: str
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    metadata: bytes
    def __init__(self, uid: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class ExpertResponse(_message.Message):
    __slots__ = ("tensors", "metadata")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    metadata: bytes
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("buffer", "size", "requires_grad", "dtype", "compression", "chunks")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    buffer: bytes
    size: _containers.RepeatedScalarFieldContainer[int]
    requires_grad: bool
    dtype: str
    compression: CompressionType
    chunks: int
    def __init__(self, buffer: _Optional[bytes] = ..., size: _Optional[_Iterable[int]] = ..., requires_grad: _Optional[bool] = ..., dtype: _Optional[str] = ..., compression: _Optional[_Union[CompressionType, str]] = ..., chunks: _Optional[int] = ...) -> None: ...
