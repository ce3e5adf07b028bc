"""The kind of a serialized sentencepiece model, read from its bytes: "BPE" (what
:func:`minitfm.data.vocab.train_vocab` trains), "unigram", "word" or "character".

sentencepiece's Python module reads models but not the kind a model records
(``ModelProto.trainer_spec.model_type``), and its protocol-buffer classes need a package minitfm
does not depend on: the two fields are read here by hand, from protocol buffers' wire format
(a field is a varint key, number << 3 | wire type, then its value).
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["model_kind"]

# sentencepiece's TrainerSpec.ModelType: the number stored in a model, and the kind in words
_MODEL_KINDS = {1: "unigram", 2: "BPE", 3: "word", 4: "character"}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The protocol-buffer varint at ``data[at:]``, and the position after it."""
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(number, value)`` of each field of a protocol-buffer message: an int for a varint, the
    bytes of a length-delimited field; 32- and 64-bit fields are stepped over as bytes."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            length, at = _varint(data, at)
            value, at = data[at:at + length], at + length
        elif wire in (1, 5):
            value, at = data[at:at + (8 if wire == 1 else 4)], at + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"wire type {wire}")
        yield number, value


def _model_type(model: bytes) -> int | None:
    """The model type a serialized sentencepiece model records (``ModelProto.trainer_spec``,
    field 2; its ``model_type``, field 3; unigram, 1, where it is left out), or None where the
    bytes do not say."""
    try:
        spec = next((v for n, v in _fields(model) if n == 2 and isinstance(v, bytes)), None)
        if spec is None:
            return None
        return next((v for n, v in _fields(spec) if n == 3 and isinstance(v, int)), 1)
    except (IndexError, ValueError):
        return None


def model_kind(model: bytes) -> str:
    """The kind of the serialized sentencepiece ``model``, in words ("unknown kind of" where its
    bytes do not say)."""
    return _MODEL_KINDS.get(_model_type(model), "unknown kind of")
