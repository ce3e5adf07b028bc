"""What the host execution refuses in a kernel's source, or leaves out, before anything is compiled
(:func:`minitfm.cudahost.rewrite.rewrite` asks it first). Host-only code (it reads text).

An ``#include`` of ``assert.h`` or ``cassert`` (the header defines ``assert``, as a device's
failing assert stops the launch) or of a standard header the header includes already
(``INCLUDED``) becomes a blank line. Any other ``#include`` is refused, naming the line and the
file: NVRTC compiles a kernel without this machine's files, and a file included here could be
anything (a device that never ends, a folder).

Refused by name, before anything is compiled, rather than run wrongly (as is inline PTX other
than the half conversions, by the rewrite): dynamic shared memory (``extern __shared__``),
``__constant__`` memory, the atomics the header lacks, and the CUDA intrinsics it does not model
(``UNMODELLED``: fences between blocks, clocks, warp matching and reductions, cooperative
groups, textures).
"""

from __future__ import annotations

import re

from minitfm.cudahost.scan import Unsupported, line_of

__all__ = ["MODELLED", "ATOMICS", "UNMODELLED", "INCLUDED", "blank_includes",
           "refuse_unmodelled"]

# the header's own: everything a kernel may call whose name starts with two underscores
MODELLED = {"__syncthreads", "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
            "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync", "__threadfence_block",
            "__int_as_float", "__float_as_int", "__uint_as_float", "__float_as_uint",
            "__longlong_as_double", "__double_as_longlong", "__expf", "__logf", "__fdividef",
            "__frcp_rn", "__fsqrt_rn", "__saturatef", "__float2int_rn", "__float2int_rz",
            "__popc", "__popcll", "__clz", "__ffs", "__ldg", "__launch_bounds__",
            "__builtin_expect", "__forceinline__", "__restrict__", "__trap"}
ATOMICS = {"atomicAdd", "atomicSub", "atomicExch", "atomicMax", "atomicMin", "atomicAnd",
           "atomicOr", "atomicXor", "atomicCAS"}
UNMODELLED = {
    "__threadfence": "it orders memory between blocks, which run one after another here",
    "__threadfence_system": "it orders memory between blocks and the host",
    "__activemask": "which lanes are active together is the device's scheduling",
    "__nanosleep": "time on the device is not modelled", "clock": "the device's clock",
    "clock64": "the device's clock",
    "__syncthreads_count": "not modelled yet", "__syncthreads_and": "not modelled yet",
    "__syncthreads_or": "not modelled yet"}
# the headers a kernel may include: the header defines assert, and includes the others
INCLUDED = {"assert.h", "cassert", "math.h", "cmath", "stdint.h", "cstdint"}
INCLUDE = re.compile(r"^[ \t]*#[ \t]*(?:include|include_next|import|embed)\b(?:\\\n|[^\n])*",
                     re.M)


def blank_includes(text: str) -> str:
    """``text`` (comments already blank) with each ``#include`` of ``INCLUDED`` blank (its
    newlines kept); :class:`Unsupported` for any other, naming its line and the file."""
    def blank(m: re.Match) -> str:
        directive = re.sub(r"\\\n", "", m.group(0)).strip()
        named = re.search(r"[<\"]([^>\"]*)[>\"]", directive)
        if named and named.group(1).strip() in INCLUDED:
            return re.sub(r"[^\n]", " ", m.group(0))
        what = f"the file {named.group(1)}" if named else "a file a macro names"
        raise Unsupported(f"line {line_of(text, m.start())}: `{directive}` includes {what}, which "
                          f"the host execution does not read: a kernel here is its file alone, "
                          f"as NVRTC compiles it without this machine's files (it may include "
                          f"{', '.join(f'<{h}>' for h in sorted(INCLUDED))}); paste what you need "
                          f"from that file into this one")
    return INCLUDE.sub(blank, text)


def refuse_unmodelled(text: str) -> None:
    dynamic = re.search(r"\bextern\s+__shared__\b", text)
    if dynamic:
        raise Unsupported(f"line {line_of(text, dynamic.start())}: dynamic shared memory (extern "
                          f"__shared__) is not modelled: declare the array with its size")
    constant = re.search(r"\b__constant__\b", text)
    if constant:
        raise Unsupported(f"line {line_of(text, constant.start())}: __constant__ memory is not "
                          f"modelled")
    for m in re.finditer(r"\b(atomic\w+|__\w+|clock64|clock)\s*\(", text):
        name = m.group(1)
        if name.startswith("atomic") and name not in ATOMICS:
            raise Unsupported(f"line {line_of(text, m.start())}: {name} is not modelled by the "
                              f"host execution (it has {', '.join(sorted(ATOMICS))})")
        if name in UNMODELLED:
            raise Unsupported(f"line {line_of(text, m.start())}: {name} is not modelled by the "
                              f"host execution: {UNMODELLED[name]}")
        if name.startswith("__") and name not in MODELLED and not re.search(
                rf"\b{name}\s*\([^;{{}}]*\)\s*\{{", text):       # not one of the source's own
            raise Unsupported(f"line {line_of(text, m.start())}: {name} is not modelled by the "
                              f"host execution")
