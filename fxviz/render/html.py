"""The interactive HTML report: one self-contained file, openable offline in any browser.

The graph's view-model (:mod:`fxviz.render.viewmodel`: what is shown) is embedded in a jinja2 template
together with the script bundle built from ``web/`` (``scripts/build_web.sh``), which lays the
graph out with dagre and draws it (where it is shown).

    >>> html = to_html(graph, "report.html")      # also returns the text
    >>> graph._repr_html_()                        # the same report, isolated in an iframe

Safety: every string from the model (module names, op targets, error messages) reaches the page only
as JSON inside a ``<script type="application/json">`` block, with ``<``, ``>`` and ``&`` escaped, and
the script writes it with ``textContent``; a module named ``</script><img onerror=...>`` shows as text.
"""

from __future__ import annotations

import json
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from fxviz.errors import RenderError
from fxviz.ir import Graph
from fxviz.render.files import write_text
from fxviz.render.viewmodel import DEFAULT_BUDGET, VIEW_MODEL_VERSION, headline, view_model

__all__ = ["BUNDLE_DIR", "VIEW_MODEL_VERSION", "headline", "in_frame", "json_for_script", "page", "repr_html",
           "split_view_model", "to_html", "view_model"]

#: Where ``scripts/build_web.sh`` writes the bundle (``report.js``, ``report.css``).
BUNDLE_DIR = Path(__file__).parent / "static"
_TEMPLATE_DIR = Path(__file__).parent / "templates"
def json_for_script(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``</script>``, no ``<!--``,
    no HTML entities, no JavaScript line separators, whatever the model's names contain."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (
        text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


@lru_cache(maxsize=1)
def _bundle() -> tuple[str, str]:
    js_path, css_path = BUNDLE_DIR / "report.js", BUNDLE_DIR / "report.css"
    if not js_path.is_file() or not css_path.is_file():
        raise RenderError(
            f"the HTML report's script bundle is missing ({js_path}): in a source checkout run "
            "scripts/build_web.sh (Node.js >= 18 and npm); an installed fxviz carries it, so "
            "reinstall it from a wheel or sdist made by `python -m build`"
        )
    js = js_path.read_text(encoding="utf-8")
    if "</script" in js.lower():  # esbuild escapes it; a bundle that does not would end the tag
        raise RenderError(f"{js_path} contains '</script': rebuild it with scripts/build_web.sh")
    return js, css_path.read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATE_DIR)), autoescape=True,
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
    )
    return env.get_template("report.html.j2")


def split_view_model(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The view-model in two parts: what the first view needs, and what only the details panel
    and a change of colouring read (each node's attributes, each box's boundary, the values of
    every overlay but the one the report opens with), ``{"nodes": {"a", "al"}, "boundaries":
    [[ins, outs], ...], "overlays": {name: {"nodes", "groups"}}}``.

    The page writes the second part after the first and draws its first view while it still
    reads it: at 100,000 nodes that is 10 of 19 MB. The script merges it back in when the page
    has read it (``mergeLater`` in ``web/src/model.js``); a page without it has everything in
    the first.
    """
    values = ("nodes", "groups")  # in this order: the file is the same on every run
    later_overlays = {o["name"]: {k: o[k] for k in values} for o in data["overlays"] if o["name"] != data["overlay"]}
    first = {
        **data,
        "nodes": {k: v for k, v in data["nodes"].items() if k not in ("a", "al")},
        "groups": [{k: v for k, v in g.items() if k not in ("ins", "outs")} for g in data["groups"]],
        "overlays": [o if o["name"] not in later_overlays else {k: v for k, v in o.items() if k not in values}
                     for o in data["overlays"]],
    }
    boundaries = [[g.get("ins", []), g.get("outs", [])] for g in data["groups"]]
    attrs = {k: data["nodes"][k] for k in ("a", "al")}
    return first, {"nodes": attrs, "boundaries": boundaries, "overlays": later_overlays}


#: How many rows of each table the page writes as plain HTML (the script draws them all).
STATIC_ROWS = 500


def page(data_json: str, later_json: str = "null", *, title: str, heading: str = "", analysis: dict[str, Any] | None = None,
         panels: list[dict[str, Any]] | None = None, notes: list[str] | None = None) -> str:
    """The report's page (script, styles, the data in its two blocks) around data already made
    safe for a script element (:func:`json_for_script`): a graph's view-model, or the diff page's
    (:mod:`fxviz.render.diffpage`), which the same script draws side by side.

    ``heading`` (what the page is of: the model's name), ``analysis`` and ``panels`` (the
    view-model's answer and tables, :mod:`fxviz.render.panels`; ``notes``, the capture's): the page also writes them as
    plain HTML (escaped), which the script replaces by the
    interactive ones, so that a page whose script is off or failed still says its answer and
    lists its findings (the first :data:`STATIC_ROWS` rows of each table)."""
    js, css = _bundle()
    return _template().render(title=title, data_json=data_json, later_json=later_json, js=js, css=css,
                              heading=heading, analysis=analysis, panels=panels or [], notes=notes or [],
                              static_rows=STATIC_ROWS)


def to_html(
    graph: Graph,
    path: str | os.PathLike[str] | None = None,
    *,
    title: str | None = None,
    budget: int = DEFAULT_BUDGET,
    overlay: str | None = None,
) -> str:
    """Render ``graph`` as one self-contained HTML report; write it to ``path`` if given.

    ``budget`` is how many boxes and nodes the first view shows before it leaves modules
    collapsed (the user expands the rest); ``overlay`` names the overlay the report opens coloured
    by (``"flops"``, ``"params"``; :mod:`fxviz.passes.overlays`). Returns the HTML text. Raises
    :class:`~fxviz.errors.RenderError` when the script bundle was not built, ``overlay`` is not one
    of the graph's, or ``path`` cannot be written.
    """
    first, later = split_view_model(view_model(graph, budget=budget, overlay=overlay))
    text = page(json_for_script(first), json_for_script(later), title=title or f"{graph.name or 'model'} — fxviz",
                heading=graph.name or "model", analysis=first["analysis"], panels=first["panels"], notes=first["notes"])
    if path is not None:
        write_text(path, text, what="HTML report")
    return text


def repr_html(graph: Graph, *, height: int = 640) -> str:
    """The report for a notebook cell (``Graph._repr_html_``): the whole file in an ``<iframe
    srcdoc>``, so two reports in one notebook share no ids, styles or scripts. ``sandbox`` lets
    the script run but gives it no access to the notebook page.

    The attribute is single-quoted and only ``&``, ``'``, ``<`` and ``>`` are escaped: the report is
    mostly JSON, whose double quotes a double-quoted attribute would turn into ``&quot;`` (six
    bytes each), and the notebook file stores the cell as JSON again. This way a displayed report
    adds about 1.1 times the standalone file to the notebook, where full escaping added 1.45."""
    return in_frame(to_html(graph), height=height)


def in_frame(doc: str, *, height: int = 640) -> str:
    """A whole page in an isolated ``<iframe srcdoc>`` for a notebook cell (see :func:`repr_html`)."""
    frame_id = f"fxviz-{uuid.uuid4().hex[:12]}"
    srcdoc = doc.replace("&", "&amp;").replace("'", "&#39;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        f'<iframe id="{frame_id}" class="fxviz-report" sandbox="allow-scripts allow-downloads" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #ccc;border-radius:4px" '
        f"srcdoc='{srcdoc}'></iframe>"
    )
