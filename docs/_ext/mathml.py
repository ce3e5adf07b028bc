"""A Sphinx math renderer that writes MathML while the site builds.

Sphinx's default renderer puts the TeX into the page and loads MathJax from a CDN to typeset it
in the reader's browser. Here each formula is converted once, at build time, by latex2mathml (a
pure-Python package), and the page carries MathML, which browsers draw natively: no script, no
font download, nothing fetched. A formula the converter cannot read fails the build.
"""

import re

from docutils import nodes
from sphinx.errors import ExtensionError
from latex2mathml.converter import convert


def _mathml(self, node, latex: str, display: str) -> str:
    # latex2mathml reads "array" but not "aligned": an aligned block is an array of alternating
    # right- and left-aligned columns, as in amsmath
    latex = latex.strip().replace(r"\begin{aligned}", r"\begin{array}{rlrlrlrl}")
    latex = latex.replace(r"\end{aligned}", r"\end{array}")
    try:
        mathml = convert(latex, display=display)
    except Exception as error:      # any parse error: name the formula and where it is
        raise ExtensionError(f"{node.source}:{node.line}: cannot convert {latex!r} to MathML: "
                             f"{error}") from error
    # a command the converter passed through, or an alignment mark it did not understand
    unknown = re.findall(r">(\\[A-Za-z]+|&amp;|&)<", mathml)
    if unknown:
        raise ExtensionError(f"{node.source}:{node.line}: {', '.join(unknown)} in {latex!r} is "
                             "not TeX that latex2mathml knows")
    return mathml


def visit_inline(self, node):
    self.body.append(f'<span class="math notranslate">{_mathml(self, node, node.astext(), "inline")}'
                     '</span>')
    raise nodes.SkipNode


def visit_block(self, node):
    latex = node.astext()
    number = ""
    if node.get("number"):
        number = (f'<span class="eqno">({node["number"]})'
                  + self.add_permalink_ref(node, "Link to this equation") + "</span>")
    ids = " ".join(node.get("ids", []))
    parts = [p for p in latex.split("\n\n") if p.strip()]       # Sphinx's own block convention
    self.body.append(f'<div class="math notranslate math-block" id="{ids}">' if ids
                     else '<div class="math notranslate math-block">')
    self.body.append(number)
    for part in parts:
        self.body.append(_mathml(self, node, part, "block"))
    self.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", (visit_inline, None), (visit_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
