"""Reading the report's view-model in tests: a page holds it in two blocks
(``fxviz.render.html.split_view_model``), which :func:`page_data` merges back as the page's
script does; its nodes are columns (``fxviz.render.html``'s ``_node_columns``), which
:func:`node_rows` gives back one dict per node, with the keys the columns have (``n`` name, ``l``
label, ``k`` kind, ``o`` family, ``t`` target, ``g`` box, ``i`` inputs, ``out`` metas, and, where a
node has them, ``s`` source, ``np`` parameters, ``a`` attributes, ``e`` error)."""

from __future__ import annotations

import json
import re
from typing import Any

#: A page's data blocks: the first (what the first view needs), the second (the rest).
FIRST = re.compile(r'(<script type="application/json" id="fxviz-data">)(.*?)(</script>)', re.S)
LATER = re.compile(r'<script type="application/json" id="fxviz-later">(.*?)</script>', re.S)


def page_data(text: str) -> dict[str, Any]:
    """The view-model of a report page, its two blocks merged (``mergeLater`` in
    ``web/src/model.js``: what the first block has stays)."""
    first = FIRST.search(text)
    assert first is not None
    data: dict[str, Any] = json.loads(first.group(2))
    later = LATER.search(text)
    if later is not None and "diff" not in data:
        rest = json.loads(later.group(1))
        for k, v in rest["nodes"].items():
            data["nodes"].setdefault(k, v)
        for g, (ins, outs) in zip(data["groups"], rest["boundaries"], strict=True):
            if ins:
                g.setdefault("ins", ins)
            if outs:
                g.setdefault("outs", outs)
        for ov in data["overlays"]:
            if "nodes" not in ov and ov["name"] in rest["overlays"]:
                ov.update(rest["overlays"][ov["name"]])
    return data


def names(data: dict[str, Any]) -> list[str]:
    """The node names of a view-model, in node order."""
    return list(data["nodes"]["n"])


def node_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of a view-model, one dict each."""
    cols = data["nodes"]
    out: list[dict[str, Any]] = []
    at_in = at_out = at_attrs = 0
    attrs = cols["a"].encode("utf-16-le")  # lengths count UTF-16 code units, as the script does
    for k, name in enumerate(cols["n"]):
        kind, family, label, target = data["ops"][cols["f"][k]]
        row: dict[str, Any] = {"n": name, "l": label, "k": kind, "o": family, "g": cols["g"][k],
                               "t": name if target == 1 else target or "",
                               "i": cols["i"][at_in:at_in + cols["ni"][k]], "out": cols["out"][at_out:at_out + cols["no"][k]]}
        at_in += cols["ni"][k]
        at_out += cols["no"][k]
        if cols["s"][k] >= 0:
            row["s"] = cols["s"][k]
        if cols["np"][k]:
            row["np"] = cols["np"][k]
        if cols["al"][k]:
            row["a"] = json.loads(attrs[2 * at_attrs:2 * (at_attrs + cols["al"][k])].decode("utf-16-le"))
        at_attrs += cols["al"][k]
        if str(k) in cols["e"]:
            row["e"] = cols["e"][str(k)]
        out.append(row)
    return out
