"""A minitfm model as a safetensors file, and back.

safetensors (Hugging Face's format) is a JSON header and the raw bytes of each tensor: any tool
reads it without minitfm and without unpickling anything. The file holds

- every parameter under its minitfm name ("enc.0.attn.w_qkv", "dec.ln.gamma", "emb"; the names
  are documented in models/translator.py and models/lm.py), in its own dtype, bytes unchanged, so a round trip is
  bit-exact;
- string metadata: ``format`` ("minitfm"), ``kind`` (which model), ``config`` (the config as
  JSON), ``step``, ``extra`` (JSON), ``vocab_id`` and, where the checkpoint has one, the
  serialized tokenizer (``vocab_model``, base64): what translating or sampling needs.

:func:`import_file` turns such a file back into a minitfm checkpoint (``.npz``) holding weights
only: it translates, samples and starts a fine-tuning run, but cannot resume training, which
needs the optimizer's moments. Every read goes through :func:`source.check_loadable`.
"""

from __future__ import annotations

import base64
import json
import os
import re

import numpy

from minitfm import checkpoint, files
from minitfm.export.source import ExportError, Loaded, check_loadable

FORMAT = "minitfm"


def _library():
    try:
        import safetensors.numpy
    except ImportError:
        raise ExportError("safetensors files need the safetensors package: "
                          "pip install -e '.[export]' (or pip install safetensors)") from None
    return safetensors.numpy


def metadata(loaded: Loaded) -> dict[str, str]:
    """The string metadata written into the file's header."""
    meta = {"format": FORMAT, "kind": loaded.kind,
            "config": json.dumps(loaded.config.to_dict(), sort_keys=True),
            "step": str(int(loaded.step)), "extra": json.dumps(loaded.extra, sort_keys=True),
            "vocab_id": json.dumps(loaded.vocab_id)}
    if loaded.vocab_model is not None:
        meta["vocab_model"] = base64.b64encode(loaded.vocab_model).decode("ascii")
    return meta


def export(loaded: Loaded, path: str) -> None:
    """Write ``loaded``'s parameters and metadata to the file ``path``. The library's own error
    for a failed write (``SafetensorError``, "... (os error 28)") is raised as the ``OSError``
    it reports, so that it is told as every failed write is (``files.replacing``)."""
    tensors = {name: numpy.ascontiguousarray(value) for name, value in loaded.params.items()}
    library = _library()
    try:
        library.save_file(tensors, path, metadata=metadata(loaded))
    except Exception as exc:                            # SafetensorError: not an OSError
        code = re.search(r"os error (\d+)", str(exc))
        if code is None:
            raise ExportError(f"safetensors could not write the file: {exc}") from exc
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), path) from exc


def read(path: str) -> Loaded:
    """The checked model of a safetensors file written by :func:`export`."""
    _library()                                          # a clear error first, without the extra
    from safetensors import safe_open
    trouble = files.link_trouble(path)
    if trouble is not None:
        raise ExportError(f"{path} is {trouble}: point it at a safetensors file written by "
                          f"`python -m minitfm.export --to safetensors`, or give the file itself")
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in f.keys()}
    except FileNotFoundError:
        raise ExportError(f"{path} does not exist") from None
    except Exception as exc:                            # the library's own error types vary
        raise ExportError(f"{path} is not a readable safetensors file: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise ExportError(f"{path} holds no minitfm model (its metadata has format "
                          f"{meta.get('format')!r}): only files written by "
                          f"`python -m minitfm.export --to safetensors` can be imported")
    try:
        ckpt = checkpoint.Checkpoint(
            path=path, params=arrays, step=int(meta["step"]), config=json.loads(meta["config"]),
            vocab_id=json.loads(meta["vocab_id"]),
            vocab_model=(base64.b64decode(meta["vocab_model"], validate=True)
                         if "vocab_model" in meta else None),
            extra=json.loads(meta["extra"]), kind=meta["kind"])
    except (KeyError, ValueError, TypeError) as exc:
        raise ExportError(f"{path}: damaged minitfm metadata ({type(exc).__name__}: {exc})") \
            from exc
    return check_loadable(ckpt)


def import_file(path: str, out: str) -> Loaded:
    """Write the model of the safetensors file ``path`` as a minitfm checkpoint ``out``
    (weights only, no optimizer state). ``out`` is written atomically by checkpoint.save."""
    loaded = read(path)
    checkpoint.save(out, loaded.params, step=loaded.step, config=loaded.config.to_dict(),
                    vocab_id=loaded.vocab_id, vocab_model=loaded.vocab_model,
                    extra=loaded.extra, kind=loaded.kind)
    return loaded
