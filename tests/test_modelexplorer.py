"""Model Explorer's graph JSON names ops and module classes as torch records them (and as Model
Explorer's own PyTorch adapter writes them): ``aten.view`` / ``Tensor.view``, not a bare ``view``;
``torch.nn.modules.linear.Linear``, not ``Linear``. Checked against torch.export's own record of the
same model (its nodes' targets, ``torch_fn`` and ``nn_module_stack``)."""

from __future__ import annotations

import torch

import fxviz
from fxviz.render.modelexplorer import to_model_explorer


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x).view(2, 2, 2)).sum()


def test_model_explorer_labels_ops_and_classes_by_the_qualified_names_torch_records() -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(2, 4)
    ep = torch.export.export(model, (x,))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    # torch's record: each op's overload packet (Model Explorer's adapter's label), the torch-level
    # call it came from, the class of the module it ran in
    packets = [str(n.target.overloadpacket) for n in calls]
    torch_fns = [n.meta["torch_fn"][1] for n in calls]
    classes = {path: cls for n in calls for path, cls in n.meta.get("nn_module_stack", {}).values() if path}
    assert packets == ["aten.linear", "aten.view", "aten.relu", "aten.sum"]
    assert classes == {"fc": "torch.nn.modules.linear.Linear"}

    exported = fxviz.capture(model, (x,), method="export")
    graph = to_model_explorer(exported)["graphs"][0]
    assert [n["label"] for n in graph["nodes"] if n["id"] in {c.name for c in exported.ops}] == packets
    assert graph["groupNodeAttributes"]["fc"]["class"] == classes["fc"]

    eager = fxviz.capture(model, (x,), method="eager")
    graph = to_model_explorer(eager)["graphs"][0]
    ops = {c.name for c in eager.ops}
    labels = [n["label"] for n in graph["nodes"] if n["id"] in ops]
    assert labels == ["torch.nn.functional.linear", "Tensor.view", "torch.relu", "Tensor.sum"]
    # each names, qualified, the very function torch recorded the call of ("method_descriptor.sum")
    assert [label.rsplit(".", 1)[1] for label in labels] == [fn.rsplit(".", 1)[1] for fn in torch_fns]
    spaces = {"torch": torch, "Tensor": torch.Tensor}
    for label in labels:
        head, *rest = label.split(".")
        obj = spaces[head]
        for part in rest:
            obj = getattr(obj, part)
        assert callable(obj), label
    assert graph["groupNodeAttributes"]["fc"]["class"] == classes["fc"]
    # the nodes that are not ops keep their own names
    by_id = {n["id"]: n for n in graph["nodes"]}
    assert by_id["fc.weight"]["label"] == "weight" and by_id["x"]["label"] == "x"
