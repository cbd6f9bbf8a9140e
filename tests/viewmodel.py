"""Reading the report's view-model in tests: its nodes are columns (``fxviz.render.html``'s
``_node_columns``); :func:`node_rows` gives them back one dict per node, with the keys the columns
have (``n`` name, ``l`` label, ``k`` kind, ``o`` family, ``t`` target, ``g`` box, ``i`` inputs,
``out`` metas, and, where a node has them, ``s`` source, ``np`` parameters, ``a`` attributes,
``e`` error)."""

from __future__ import annotations

import json
from typing import Any


def names(data: dict[str, Any]) -> list[str]:
    """The node names of a view-model, in node order."""
    return list(data["nodes"]["n"])


def node_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of a view-model, one dict each."""
    cols = data["nodes"]
    out: list[dict[str, Any]] = []
    at_in = at_out = 0
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
        if cols["a"][k] is not None:
            row["a"] = json.loads(cols["a"][k])
        if str(k) in cols["e"]:
            row["e"] = cols["e"][str(k)]
        out.append(row)
    return out
