"""What the library gives with a typical mistake made, for the diagnosis of a wrong array
(:mod:`minitfm.learn.diagnose`). Host-only code.

For one case of a check: each named mistake of the exercise (:class:`~minitfm.learn.mistakes.
Mistake`, an edit of the library's own code) made on the case's inputs; the share of each term
of the derivation in the right result (the right result less the result with the term left
out), from which the diagnosis finds a term with the wrong sign or a constant off; two named
mistakes made at once, computed only when nothing else fits; for a layer, its cache's fields read
in one another's places, and the case's masks as regions (where the padding mask hides keys,
where dropout dropped elements, the padding rows of a loss)."""

from __future__ import annotations

import functools
import itertools

import numpy

from minitfm.learn import diagnose, source
from minitfm.learn.locate import Region

__all__ = ["edited", "Alternatives", "mask_regions", "cache_regions", "regroup_renamed",
           "cache_of", "field_swaps"]


@functools.lru_cache(maxsize=None)
def _plain(module: str, name: str) -> str:
    return source.plain_source(module, name)


def edited(module, mistakes) -> dict:
    """name -> the library's function of ``module`` with the ``mistakes``' edits made in it, in
    order, each compiled in a copy of the module's namespace (LookupError where an edit's text is
    not there exactly once)."""
    texts: dict[str, str] = {}
    for mistake in mistakes:
        text = texts.get(mistake.function) or _plain(module.__name__, mistake.function)
        if text.count(mistake.old) != 1:
            raise LookupError(f"{module.__name__}.{mistake.function} has "
                              f"{text.count(mistake.old)} copies of {mistake.old!r}")
        texts[mistake.function] = text.replace(mistake.old, mistake.new)
    functions = {}
    for name, text in texts.items():
        namespace = dict(vars(module))
        exec(compile(text, f"<{module.__name__}.{name}, edited>", "exec"), namespace)
        functions[name] = namespace[name.split(".")[-1]]
    return functions


class Alternatives:
    """One case's results with each named mistake made. ``run(mistakes)``: the results (name ->
    array) of the library with those mistakes made, or None where they do not apply to the case
    (a pre-LN mistake in a post-LN case); ``extra``: label -> results of other mistakes (the
    wrong cache field); ``pairs``: whether two mistakes at once are tried (when nothing else
    fits); ``regions``: the case's masks (:class:`~minitfm.learn.locate.Region`); ``same``: how
    near two results are equal (float32 results summed in another order are not equal to the
    last bit)."""

    def __init__(self, run, mistakes, extra=None, pairs=True, regions=(),
                 same=diagnose.EQUAL_WITHIN):
        self.run, self.mistakes, self.regions = run, tuple(mistakes), list(regions)
        self.same = same
        self.extra, self.pairs = dict(extra or {}), pairs
        self._singles = self._paired = self._fits = None

    @property
    def singles(self) -> dict:
        """label -> the results with that mistake made (computed when first asked)."""
        if self._singles is None:
            found = {m.label: self._tried([m]) for m in self.mistakes}
            self._singles = {k: v for k, v in {**found, **self.extra}.items() if v is not None}
        return self._singles

    def _tried(self, mistakes):
        try:
            with numpy.errstate(all="ignore"):
                return self.run(mistakes)
        except Exception:           # a mistake that does not apply to this case
            return None

    def _pair_results(self) -> dict:
        """label -> results of two mistakes made at once (not two terms: the diagnosis finds
        those from the terms' shares)."""
        if self._paired is None:
            self._paired = {}
            for one, two in itertools.combinations(self.mistakes, 2):
                if one.term and two.term or one.old == two.old:
                    continue
                found = self._tried([one, two])
                if found is not None:
                    self._paired[f"two mistakes at once: {one.label}; and {two.label}"] = found
        return self._paired

    def _fitting(self, yours: dict) -> set:
        """The labels of the mistakes whose results are all of ``yours`` (where they can be
        compared): a mistake that gives one of the learner's arrays but not the others is only
        named where nothing else fits."""
        if self._fits is None:
            self._fits = {label for label, found in self.singles.items()
                          if self._fit(found, yours)}
        return self._fits

    def _fit(self, found: dict, yours: dict) -> bool:
        return all(diagnose.equal(yours[n], a, self.same)
                   for n, a in found.items() if _same_shape(yours.get(n), a))

    def about(self, name: str, right, yours: dict) -> dict:
        """The keywords of :func:`~minitfm.learn.diagnose.diagnose` for result ``name`` (its
        right value ``right``; ``yours``: all of the learner's results)."""
        def more():
            return {label: found.get(name) for label, found in self._pair_results().items()
                    if self._fit(found, yours)}
        terms = [diagnose.Term(m.term, m.about, right - self.singles[m.label][name])
                 for m in self.mistakes if m.term and m.label in self.singles
                 and _same_shape(self.singles[m.label].get(name), right)]
        fits = self._fitting(yours)
        return dict(mistakes={label: found.get(name) for label, found in self.singles.items()
                              if label in fits},
                    partly={label: found.get(name) for label, found in self.singles.items()
                            if label not in fits},
                    terms=terms, more=more if self.pairs else None, regions=self.regions,
                    same=self.same)


def _same_shape(a, b) -> bool:
    return getattr(a, "shape", None) == getattr(b, "shape", ())


# ---- regions ---------------------------------------------------------------------------------

def mask_regions(specs: dict, arrays: dict) -> list[Region]:
    """The keys (or positions) each additive padding mask of a case hides, and those it shows
    (``specs``: the case's array specs, "mask: b kv")."""
    found = []
    for name, spec in specs.items():
        if not isinstance(spec, str) or not spec.startswith("mask:") or name not in arrays:
            continue
        axes = tuple(spec.rpartition(":")[2].split())
        mask = numpy.asarray(arrays[name])
        hidden = mask.reshape(mask.shape[0], -1) < 0                        # (b, keys)
        what = "keys" if axes[-1] == "kv" else "positions"
        found += [Region(f"where the padding mask hides {what}", hidden, axes),
                  Region(f"where the padding mask shows {what}", ~hidden, axes)]
    return found


def cache_regions(paths: dict) -> list[Region]:
    """Regions of a cache's masks (``paths``: path -> array, every array reachable from it):
    dropout's keep masks (bool), and a loss's keep (1.0 on a row, 0.0 on a padding row)."""
    found = []
    for path, a in paths.items():
        if not path.endswith("keep") or not isinstance(a, numpy.ndarray) or not a.ndim:
            continue
        if a.dtype == bool:
            found += [Region(f"where the dropout dropped the element ({path} False)", ~a),
                      Region(f"where the dropout kept the element ({path} True)", a)]
        elif a.ndim == 1 and set(numpy.unique(a)) <= {0.0, 1.0}:
            found += [Region(f"on the padding rows (where {path} is 0)", a == 0),
                      Region(f"off the padding rows (where {path} is 1)", a == 1)]
    return found


# ---- gradients under one another's names ------------------------------------------------------

def _renamed(name: str, other: str) -> tuple | None:
    """Where two dotted names differ in one part only ("0.ln1.gamma", "0.ln2.gamma"): that
    part's place and the two values; else None."""
    mine, theirs = name.split("."), other.split(".")
    differ = [i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y]
    if len(mine) != len(theirs) or len(mine) < 2 or len(differ) != 1:
        return None
    return differ[0], mine[differ[0]], theirs[differ[0]]


def _pattern(names: list[str], place: int, value: str) -> str:
    """The names with their part ``place`` set to ``value``, the parts where they differ
    starred: "enc.0.*", "*.ln1.*"."""
    parts = [name.split(".") for name in names]
    shown = [value if i == place else parts[0][i] if len({p[i] for p in parts}) == 1 else "*"
             for i in range(len(parts[0]))]
    after = shown[place + 1:]
    return ".".join(shown[:place + 1] + (["*"] if "*" in after else after))


def _under(name: str, names: list[str], place: int) -> bool:
    """Whether ``name`` has the parts all ``names`` share, at ``place`` too."""
    parts, theirs = name.split("."), [n.split(".") for n in names]
    return len(parts) == len(theirs[0]) and all(
        parts[i] == theirs[0][i] for i in range(len(parts))
        if i == place or len({p[i] for p in theirs}) == 1)


def regroup_renamed(items, mine: dict, right: dict) -> None:
    """Where wrong gradients are the right ones of other parameters whose names differ in one
    part (a layer's index counting the other way, ln2's gradients returned as ln1's), one
    diagnosis for them all in place of each one's ("it is the right gradient of ..."), when it
    holds for every wrong gradient of those names: whose gradients sit under which names."""
    found: dict = {}
    for item in items:
        a = mine.get(item.name)
        if item.ok or not str(item.diagnosis).startswith(diagnose.OTHER_GRADIENT):
            continue
        for other, r in right.items():
            moved = _renamed(item.name, other)
            if moved and getattr(r, "shape", None) == a.shape \
                    and diagnose.distance(a, r) < diagnose.EQUAL_WITHIN:
                found.setdefault(moved, []).append(item.name)
                break
    named = {name for names in found.values() for name in names}
    wrong = [item.name for item in items if not item.ok]
    if len(named) < 2 or any(_under(name, names, place) and name not in named for name in wrong
                             for (place, _, _), names in found.items()):
        return
    parts = [f"{_pattern(names, place, value)} holds the gradients of "
             f"{_pattern(names, place, other)}" for (place, value, other), names in found.items()]
    words = ("gradients under other names, each right for the name it came from: " +
             ", ".join(parts))
    for item in items:
        if item.name in named:
            item.diagnosis = words


# ---- a cache's fields in one another's places --------------------------------------------------

def cache_of(args) -> tuple:
    """The first named-tuple argument of a call (its cache), and where it is."""
    for i, a in enumerate(args):
        if isinstance(a, tuple) and hasattr(a, "_fields"):
            return i, a
    return None, None


def _field_swapped(fn, use: str, instead: str):
    """The library's ``fn`` reading its cache's field ``use`` in place of ``instead``."""
    def run(*args, **kwargs):
        i, cache = cache_of(args)
        if cache is not None and hasattr(cache, use) and hasattr(cache, instead):
            args = list(args)
            args[i] = cache._replace(**{instead: getattr(cache, use)})
        return fn(*args, **kwargs)
    return run


def field_swaps(library, caches: dict) -> dict:
    """label -> {name: the library's function ``name`` reading one field of its cache in place
    of another of the same shape}, for each function's cache in ``caches`` (name -> cache)."""
    found = {}
    for name, cache in caches.items():
        fields = [f for f in cache._fields if getattr(getattr(cache, f), "ndim", 0) > 0]
        for use, instead in itertools.permutations(fields, 2):
            a, b = getattr(cache, use), getattr(cache, instead)
            if a.shape != b.shape or a is b or numpy.array_equal(a, b):
                continue
            label = (f"it reads cache.{use} where cache.{instead} belongs (the wrong cache "
                     f"field)")
            found[label] = {name: _field_swapped(getattr(library, name), use, instead)}
    return found
