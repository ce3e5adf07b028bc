"""Sphinx configuration of the minitfm site: `python -m sphinx -W -b html docs build/docs`.

Everything the pages show is built here, offline: formulas are turned into MathML while the site
builds (no script typesets them in the reader's browser), the notebook is executed by a local
kernel, the command-line reference is the parsers' own --help, and nothing is loaded from the
network by any page (no CDN, no web font, no widget loader).
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))                         # minitfm itself, for the docstrings
sys.path.insert(0, str(Path(__file__).parent / "_ext"))
os.environ.setdefault("MINITFM_BACKEND", "numpy")     # the notebook and the docstrings: CPU

project = "minitfm"
author = "the minitfm authors"
copyright = "the minitfm authors, MIT licence"

extensions = [
    "myst_nb",              # Markdown pages and the executed notebook
    "mathml",               # docs/_ext/mathml.py: TeX -> MathML at build time
    "minitfm_docs",         # docs/_ext/minitfm_docs.py: docstrings, --help, the layer index
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
root_doc = "index"

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# --- offline: every network default turned off ------------------------------------------------
html_math_renderer = "mathml"       # not sphinx.ext.mathjax, whose mathjax_path is a CDN
nb_ipywidgets_js = {}               # MyST-NB would load require.js and the widget manager
nb_execution_mode = "force"         # the walkthrough runs on every build (a few seconds)
nb_execution_raise_on_error = True  # a failing cell fails the build
nb_execution_timeout = 120
nb_merge_streams = True

html_theme = "furo"                 # system fonts, no web font; its scripts ship with it
html_title = "minitfm"
html_static_path = ["_static"]
html_css_files = ["minitfm.css"]
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None

nitpicky = False
