"""A kernel's CUDA C source as host C++ for ``cuda_host.h``: what changes, and what is refused.

Host-only code (it reads and writes text). Every change keeps the source's lines where they are,
so that the compiler's messages and the host execution's faults name the kernel's own lines:

- a pointer type ``T*`` (parameters, locals) becomes ``minitfm::gptr<T>``, a pointer that knows
  the array it points into, so that every element read or written is checked;
- ``__shared__ T name[A][B];`` becomes ``static minitfm::shared<T, A, B> name("name");``: one copy
  for the block under way (blocks run one after another), garbage at the start of each block;
- each use of a ``__shared__`` scalar ``name`` becomes ``name()``, its element with the line of
  the use (a read or a write of it is checked, and named, as an array's element is);
- each loop's condition ``c`` (``for``, ``while``, a ``do``'s ``while``) becomes
  ``minitfm::tick(line, !!(c))``, an empty one ``minitfm::tick(line, true)``: a launch with a
  time limit stops a loop that never ends, naming its line (a loop made of recursion or
  ``goto`` is not seen: the caller's own limit on the process stops it);
- each ``__device__`` function (not a kernel) takes the line of its call as a last parameter
  with a default, ``minitfm::call_site(__builtin_LINE())``, and keeps the call on the thread's
  record while it runs: a fault inside it is named at the kernel's line that called it;
- the two PTX conversions of ``minitfm.speed.fused.HALF_CONVERSIONS`` (``cvt.f32.f16``,
  ``cvt.rn.f16.f32``) become calls of the header's bit-exact host conversions; any other inline
  PTX is refused.

What else is refused, or left out, before anything is compiled: :mod:`minitfm.cudahost.refused`.
The source is read as text by :mod:`minitfm.cudahost.scan`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from minitfm.cudahost import refused
from minitfm.cudahost.scan import (Unsupported, blank_comments, blank_strings, edited, line_of,
                                   matching, split_top)

__all__ = ["Unsupported", "Param", "HostSource", "rewrite", "DTYPES", "blank_comments"]


# C types a kernel's parameters may have, with the NumPy type CuPy's arguments must then have
DTYPES = {"bool": "bool", "char": "int8", "signed char": "int8", "unsigned char": "uint8",
          "short": "int16", "unsigned short": "uint16", "int": "int32", "unsigned int": "uint32",
          "long": "int64", "long long": "int64", "unsigned long": "uint64",
          "unsigned long long": "uint64", "float": "float32", "double": "float64",
          "size_t": "uint64", "int8_t": "int8", "uint8_t": "uint8", "int16_t": "int16",
          "uint16_t": "uint16", "int32_t": "int32", "uint32_t": "uint32", "int64_t": "int64",
          "uint64_t": "uint64"}

WARP_OPERATIONS = re.compile(r"\b(__syncthreads|__syncwarp|__shfl\w*|__ballot_sync|__any_sync|"
                             r"__all_sync)\b")

# the inline PTX of minitfm.speed.fused.HALF_CONVERSIONS, as host calls: template -> (output
# constraint, input constraint, the header's function)
PTX = {"cvt.f32.f16 %0, %1;": ("=f", "h", "minitfm::cvt_f32_f16"),
       "cvt.rn.f16.f32 %0, %1;": ("=h", "f", "minitfm::cvt_rn_f16_f32")}


class Param(NamedTuple):
    name: str
    ctype: str          # canonical C type of the value, or of what the pointer points to
    pointer: bool
    const: bool         # a pointer to const
    dtype: str          # the NumPy type the argument must have (of its elements, for an array)
    text: str           # the type as written, without the name (``const float``, ``int``)


class HostSource(NamedTuple):
    text: str                        # host C++ (without the header's #include)
    kernels: dict                    # name -> tuple of Param, in order
    fibers: bool                     # barriers or warp operations: the threads must be fibers
    bodies: dict                     # name -> (first line, last line) of the kernel's body


def canonical(words: str, typedefs: dict) -> str:
    """``unsigned`` -> ``unsigned int``, ``long int`` -> ``long``, a typedef -> what it names;
    qualifiers dropped."""
    kept = [w for w in words.split() if w not in ("const", "volatile", "__restrict__", "signed")
            or (w == "signed" and "char" in words)]
    text = " ".join(kept)
    text = typedefs.get(text, text)
    text = re.sub(r"\b(short|long|long long) int\b", r"\1", text)
    if text == "unsigned":
        text = "unsigned int"
    return text


def _typedefs(text: str) -> dict:
    found = {}
    for m in re.finditer(r"\btypedef\s+([\w\s]+?)\s+(\w+)\s*;", text):
        found[m.group(2)] = canonical(m.group(1), found)
    return found


def _rewrite_asm(text: str) -> str:
    out, last = [], 0
    for m in re.finditer(r"\basm\s*(?:volatile\s*)?\(", text):
        if m.start() < last:
            continue
        close = matching(text, m.end() - 1)
        inside = text[m.end():close]
        parts = inside.split(":")
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', parts[0])).strip()
        template = re.sub(r"\s+", " ", template.strip("{} "))
        where = f"line {line_of(text, m.start())}"
        if template not in PTX:
            raise Unsupported(f"{where}: inline PTX `{template}` is not modelled by the host "
                              f"execution (it knows {' and '.join(PTX)})")
        out_constraint, in_constraint, function = PTX[template]
        operands = [re.fullmatch(r'\s*"([^"]*)"\s*\((.*)\)\s*', p, re.S) for p in parts[1:3]]
        if len(parts) != 3 or None in operands or \
                [o.group(1) for o in operands] != [out_constraint, in_constraint]:
            raise Unsupported(f"{where}: inline PTX `{template}` with operands other than "
                              f'"{out_constraint}" and "{in_constraint}"')
        semicolon = re.match(r"\s*;", text[close + 1:])
        end = close + 1 + (semicolon.end() if semicolon else 0)
        call = f"({operands[0].group(2)}) = {function}({operands[1].group(2)});"
        statement = text[m.start():end]
        out += [text[last:m.start()], call, "\n" * statement.count("\n")]
        last = end
    return "".join(out) + text[last:]


def _rewrite_shared(text: str) -> str:
    def replace(m: re.Match) -> str:
        body = m.group(1)
        where = f"line {line_of(text, m.start())}"
        words = re.match(r"\s*((?:\w+\s+)*?\w+)\s+(?=\w+\s*(?:\[|,|;|$))", body + ";")
        if not words:
            raise Unsupported(f"{where}: cannot read the __shared__ declaration `{body.strip()}`")
        type_text, declarators = words.group(1), body[words.end():]
        decls = []
        for declarator in declarators.split(","):
            d = re.fullmatch(r"\s*(\w+)\s*((?:\[[^\]]+\]\s*)*)", declarator)
            if not d or "=" in declarator:
                raise Unsupported(f"{where}: cannot read the __shared__ declarator "
                                  f"`{declarator.strip()}` (a name with constant sizes, no "
                                  f"initialiser)")
            dims = re.findall(r"\[([^\]]+)\]", d.group(2))
            args = "".join(f", {dim.strip()}" for dim in dims)
            decls.append(f'static minitfm::shared<{type_text}{args}> {d.group(1)}'
                         f'("{d.group(1)}");')
        return " ".join(decls) + "\n" * body.count("\n")
    return re.sub(r"\b__shared__\b([^;]*);", replace, text)


# a condition that declares a variable (`while (int k = next())`): left as it is
DECLARES = re.compile(r"\s*(?:const\s+)?[A-Za-z_][\w:]*(?:<[^;]*>)?[\s*&]+[A-Za-z_]\w*\s*"
                      r"(?:=(?!=)|\{)")


def _instrument_loops(text: str) -> str:
    """Every ``for`` and ``while`` (a ``do``'s too): the condition ``c`` becomes
    ``minitfm::tick(line, !!(c))`` (``!!``: the condition's own conversion to bool), an empty
    one ``minitfm::tick(line, true)``: a loop that never ends is stopped at its time limit, and
    named by its line (the ``for``'s or ``while``'s)."""
    code = blank_strings(text)
    edits = []
    for m in re.finditer(r"\b(for|while)\s*\(", code):
        opening = m.end() - 1
        closing = matching(code, opening)
        parts = split_top(code, opening + 1, closing, ";")
        if m.group(1) == "for" and len(parts) != 3:
            continue                                  # a range-based for: it ends
        start, end = parts[1] if m.group(1) == "for" else parts[0]
        line = line_of(code, m.start())
        if not code[start:end].strip():
            edits.append((start, start, f" minitfm::tick({line}, true)"))
        elif not DECLARES.match(code[start:end]):
            edits += [(start, start, f"minitfm::tick({line}, !!("), (end, end, "))")]
    return edited(text, edits)


def _parameter_types(code: str, start: int, end: int) -> tuple:
    """The types of the parameters in ``code[start:end]``, their names and defaults dropped:
    a declaration and its definition give the same."""
    types = []
    for a, b in split_top(code, start, end, ","):
        words = re.sub(r"\s*([*&])\s*", r" \1 ", code[a:b].split("=")[0])
        words = re.sub(r"\s+", " ", words).strip()
        words = re.sub(r"(?<=[\w*&>\]] )(?!(?:int|float|double|char|short|long|unsigned|signed|"
                       r"bool|void|const|volatile)\b)[A-Za-z_]\w*$", "", words).strip()
        types.append(words.replace(" ", ""))
    return tuple(t for t in types if t not in ("", "void"))


# words that a parenthesis follows in a declaration's head without naming a function
NOT_FUNCTIONS = {"operator", "__attribute__", "__align__", "__declspec", "alignas", "decltype"}


def _instrument_helpers(text: str) -> str:
    """Every ``__device__`` function but the kernels gets a last parameter, ``minitfm::call_site
    minitfm_call = minitfm::call_site(__builtin_LINE())`` (the default in its first declaration
    only), which a call fills with its own line (a type no argument converts to: an overload
    with one more parameter stays the one a call picks), and its definition a guard that keeps
    the call on the thread's record of calls under way: a fault inside the function is named
    at the kernel's line that called it.
    Operators, destructors, ``constexpr`` functions, functions with a ``...`` or an initialiser
    list are left as they are."""
    code = blank_strings(text)
    edits, declared = [], set()
    for m in re.finditer(r"\b__device__\b", code):
        head = re.match(r"[^;{}()=]*?(~?\b[A-Za-z_]\w*)\s*(<[^;{}()]*>)?\s*\(", code[m.end():])
        if not head:
            continue                                  # a __device__ variable, or a lambda
        name, opening = head.group(1), m.end() + head.end() - 1
        closing = matching(code, opening)
        after = re.match(r"(?:\s|const\b|noexcept\b|->[^;{]*)*([;{])", code[closing + 1:])
        begins = max(code.rfind(c, 0, m.start()) for c in ";{}") + 1
        prefix = code[begins:opening]
        parameters = code[opening + 1:closing]
        if (not after or name.startswith("~") or name in NOT_FUNCTIONS
                or re.search(r"\b(?:constexpr|operator|__global__)\b", prefix)
                or "..." in parameters
                or any(not re.match(r"\s*[A-Za-z_]", code[a:b]) for a, b in
                       split_top(code, opening + 1, closing, ",") if code[a:b].strip())):
            continue
        key = (name, _parameter_types(code, opening + 1, closing))
        default = key not in declared and not re.search(r"\btemplate\s*<\s*>", prefix)
        declared.add(key)
        parameter = "minitfm::call_site minitfm_call" + (
            " = minitfm::call_site(__builtin_LINE())" if default else "")
        if re.fullmatch(r"\s*(?:void\s*)?", parameters):
            edits.append((opening + 1, closing, parameter))
        else:
            edits.append((closing, closing, f", {parameter}"))
        if after.group(1) == "{":
            brace = closing + 1 + after.end() - 1
            edits.append((brace + 1, brace + 1,
                          f' minitfm::call_guard minitfm_call_guard(minitfm_call, "{name}");'))
    return edited(text, edits)


# what may stand before a name used in an expression (else the name is being declared)
BEFORE_AN_EXPRESSION = {"return", "case", "else", "do", "sizeof", "throw", "new", "delete"}


def _rewrite_shared_scalars(text: str) -> str:
    """Each use of a ``__shared__`` scalar (``static minitfm::shared<T> name``, as
    :func:`_rewrite_shared` writes it) after its declaration, to the end of the block that
    declares it, becomes ``name()``: the element, with the line of the use (an array's element
    has its line from its index; a scalar's reads and writes have no call of their own)."""
    code = blank_strings(text)
    edits = []
    for m in re.finditer(r'\bstatic minitfm::shared<[\w\s]+> (\w+)\("[^"]*"\);', code):
        name, depth, end = m.group(1), 0, len(code)
        for i in range(m.start() - 1, -1, -1):
            if code[i] == "}":
                depth += 1
            elif code[i] == "{":
                if depth == 0:
                    end = matching(code, i, "{}")
                    break
                depth -= 1
        uses = re.compile(rf"(?<![\w.])(?<!->)(?<!::){name}\b(?!\s*\()")
        for use in uses.finditer(code, m.end(), end):
            before = re.search(r"([A-Za-z_]\w*)\s*$", code[max(0, use.start() - 40):use.start()])
            if before and before.group(1) not in BEFORE_AN_EXPRESSION:
                raise Unsupported(f"line {line_of(code, use.start())}: `{before.group(1)} {name}` "
                                  f"declares a name the __shared__ variable {name} already has "
                                  f"(line {line_of(code, m.start())}): give it another")
            edits.append((use.end(), use.end(), "()"))
    return edited(text, edits)


def _rewrite_pointers(text: str, typedefs: dict) -> str:
    names = sorted(set(DTYPES) | set(typedefs) | {"unsigned", "signed char"},
                   key=lambda t: (-len(t.split()), -len(t)))
    alternation = "|".join(r"\s+".join(map(re.escape, t.split())) for t in names)
    pattern = re.compile(rf"(?<![\w.>])((?:(?:const|volatile)\s+)*(?:{alternation})(?:\s+const)?)"
                         rf"\s*\*\s*(?:__restrict__\s*)?(?=[A-Za-z_])")
    return pattern.sub(lambda m: f"minitfm::gptr<{m.group(1)}> ", text)


def _kernels(text: str, typedefs: dict) -> tuple[dict, dict]:
    """name -> its parameters, and name -> the lines its body spans (its braces'), of every
    ``__global__`` function."""
    kernels, bodies = {}, {}
    code = blank_strings(text)
    for m in re.finditer(r"\b__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(",
                         text):
        name, close = m.group(1), matching(text, m.end() - 1)
        where = f"line {line_of(text, m.start())}: kernel {name}"
        params = []
        for p in filter(None, (s.strip() for s in text[m.end():close].split(","))):
            d = re.fullmatch(r"((?:\w+\s+)*?\w+)\s*(\*)?\s*(?:__restrict__\s*)?(\w+)", p)
            if p == "void" and not params:
                continue
            if not d:
                raise Unsupported(f"{where}: cannot read the parameter `{p}` (a scalar or a "
                                  f"pointer to one)")
            ctype = canonical(d.group(1), typedefs)
            if ctype not in DTYPES:
                raise Unsupported(f"{where}: parameter `{p}` has type {ctype}, which the host "
                                  f"execution does not pass (it passes {', '.join(DTYPES)})")
            const = d.group(2) is not None and re.search(r"\bconst\b", d.group(1)) is not None
            text_type = d.group(1) if d.group(2) else re.sub(r"\bconst\s+", "", d.group(1))
            params.append(Param(d.group(3), ctype, d.group(2) is not None, const, DTYPES[ctype],
                                text_type.strip()))
        kernels[name] = tuple(params)
        body = re.match(r"[^;{]*\{", code[close + 1:])
        if body:
            opening = close + body.end()
            bodies[name] = (line_of(code, opening), line_of(code, matching(code, opening, "{}")))
    return kernels, bodies


def rewrite(source: str) -> HostSource:
    """``source`` (a CUDA C translation unit, as CuPy's RawKernel takes it) as host C++."""
    text = refused.blank_includes(blank_comments(source))
    refused.refuse_unmodelled(text)
    typedefs = _typedefs(text)
    kernels, bodies = _kernels(text, typedefs)
    if not kernels:
        raise Unsupported("no __global__ function: a kernel is `extern \"C\" __global__ void "
                          "name(...)`")
    text = _rewrite_asm(text)
    text = _instrument_loops(text)
    text = _instrument_helpers(text)
    text = _rewrite_shared(text)
    text = _rewrite_shared_scalars(text)
    text = _rewrite_pointers(text, typedefs)
    return HostSource(text, kernels, WARP_OPERATIONS.search(text) is not None, bodies)


def wrappers(host: HostSource) -> str:
    """For each kernel, ``minitfm_launch_<name>(config, args, fault)``: the loader's entry, which
    runs the kernel on a grid, each thread calling it with the arguments (an array as its
    ``minitfm::Region``, a scalar as a pointer to its value), and names the lines of its body
    (a fault in a function it calls is named at the call)."""
    out = []
    for name, params in host.kernels.items():
        first, last = host.bodies.get(name, (0, 0))
        args = ", ".join(
            f"minitfm::gptr<{p.text}>((const minitfm::Region*)a[{i}])" if p.pointer
            else f"*({p.text}*)a[{i}]" for i, p in enumerate(params))
        out.append(f"static void minitfm_body_{name}(void** a) {{ {name}({args}); }}\n"
                   f'extern "C" int minitfm_launch_{name}(const minitfm::Config* c, void** a, '
                   f"minitfm::Fault* f) {{\n"
                   f"    return minitfm::launch(c, a, f, minitfm_body_{name}, {first}, {last});"
                   f"\n}}\n")
    return "".join(out)
