"""Execute every notebook in notebooks/ with nbclient (kernel "python3", registered from the venv by
the set-up) and check what its cells show, not only that they ran. The committed notebooks keep
their outputs cleared.

The kernel and the report bundle are fixtures (tests/conftest.py): missing, the notebook tests
skip with the command that installs them, and fail the run under CI=true."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def text_of(cell: Any) -> str:
    """Everything a cell printed or displayed as text (streams, text/plain, images as markup). A
    stream is one text however the kernel flushed it: ``print(n, "bytes")`` can arrive as two
    outputs, ``"16384"`` and ``" bytes"``, when the kernel flushes between the writes (a loaded machine)."""
    parts: list[str] = []
    last = None
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            if last is not None and last.output_type == "stream" and last.name == o.name:
                parts[-1] += o.text
            else:
                parts.append(o.text)
        elif o.output_type in ("display_data", "execute_result"):
            parts.append(o.data.get("text/plain", ""))
            parts.append(o.data.get("image/svg+xml", ""))
        elif o.output_type == "error":
            parts.append(f"{o.ename}: {o.evalue}")
        last = o
    return "\n".join(parts)


def html_of(cell: Any) -> str:
    return "\n".join(o.data.get("text/html", "") for o in cell.get("outputs", []) if "data" in o)


def by_tag(nb: Any) -> dict[str, Any]:
    return {t: c for c in nb.cells for t in c.get("metadata", {}).get("tags", [])}


def test_notebooks_are_committed_without_outputs() -> None:
    """Read as plain JSON (nbformat 4), so that this check needs no Jupyter and runs in every tier."""
    assert NOTEBOOKS, "notebooks/ holds no notebook"
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert nb["nbformat"] == 4
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                assert c["outputs"] == [] and c["execution_count"] is None, f"{path.name}: clear the outputs"


@pytest.fixture(scope="module")
def quickstart(notebook_kernel: str, bundle: Path) -> dict[str, Any]:
    import nbclient
    import nbformat

    path = next(p for p in NOTEBOOKS if p.name == "quickstart.ipynb")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=notebook_kernel, timeout=120,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, if a cell fails
    return by_tag(nb)


@pytest.mark.notebook
def test_quickstart_training_step_counts_the_saved_activations(quickstart: dict[str, Any]) -> None:
    """Linear(16, 64)-GELU-Linear(64, 8) on a 32x16 input: autograd keeps the first Linear's output
    and the GELU's output, 32x64 float32 each (16,384 bytes; parameters and the input cost none)."""
    text = text_of(quickstart["train-tree"])
    assert text.startswith("16384 bytes saved for the backward")
    assert "grad of 0.weight" in text and "8.0 KiB" in text


@pytest.mark.notebook
def test_quickstart_sharded_mlp_shows_its_all_reduce_in_the_rowwise_layer(quickstart: dict[str, Any]) -> None:
    """Colwise then rowwise Linear over 8 ranks: one all_reduce of the (4, 16) float32 partial sums
    (256 bytes per rank), in layer 2, and the graph unbroken from input to output."""
    text = text_of(quickstart["sharded-tree"])
    assert "collectives on" in text and "(8 ranks): 1, 256 bytes per rank" in text
    assert "_c10d_functional::all_reduce" in text and "constant" not in text



@pytest.mark.notebook
def test_quickstart_redistribution_is_nodes_with_placements(quickstart: dict[str, Any]) -> None:
    """The model's own ``redistribute`` (to ``R``), ``to_local`` and ``full_tensor`` on a Shard(0)
    input of 32 x 16 float32 over 8 ranks: two all-gathers of a 4 x 16 shard (256 bytes per rank
    each), one in each call that ran it, as many as CommDebugMode counts on the same factory."""
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    import fxviz
    from fxviz.torchbridge.distributed import fake_world
    from tests.test_distributed import waited

    cell = quickstart["redistribute-tree"]
    text = text_of(cell)
    assert "collectives on group" in text and "(8 ranks): 2, 512 bytes per rank" in text
    rows = [line.split(maxsplit=1) for line in text.splitlines() if line.split()[:1] in (
        ["redistribute"], ["to_local"], ["full_tensor"])]
    assert rows == [["redistribute", "R     ['all_gather']"], ["to_local", "[]"], ["full_tensor", "['all_gather']"]]
    space: dict[str, Any] = {"torch": torch, "fxviz": fxviz}
    exec(cell.source.partition("\nred = ")[0], space)  # the cell's factory, run by torch alone
    with fake_world(8):
        model, args = space["redistributed"]()
        with CommDebugMode() as mode:
            waited(model(*args))
    assert {str(op): n for op, n in mode.get_comm_counts().items() if n} == {
        "c10d_functional.all_gather_into_tensor": 2}

@pytest.mark.notebook
def test_quickstart_cnn_tree_shows_the_parallel_branches(quickstart: dict[str, Any]) -> None:
    text = text_of(quickstart["cnn-tree"])
    assert "CoolCNN  captured by torch.export" in text
    assert "2 parallel branches" in text and "initial_conv (Conv2d)" in text and "parallel_conv (Conv2d)" in text


def srcdoc(frame: str) -> str:
    """The report inside a notebook's iframe, unescaped: the standalone file."""
    m = re.search(r"srcdoc='([^']*)'", frame)
    assert m is not None, frame[:200]
    return html.unescape(m.group(1))


@pytest.mark.notebook
def test_quickstart_reports_are_isolated_iframes(quickstart: dict[str, Any]) -> None:
    frames = [html_of(quickstart[t]) for t in ("cnn-report", "gpt2-report", "partial-report")]
    for frame in frames:
        assert frame.startswith('<iframe id="fxviz-') and 'class="fxviz-report"' in frame
        assert "<script" not in frame and "</script" not in frame  # nothing runs in the notebook's page
        assert 'id="fxviz-data"' in srcdoc(frame)  # the report itself, inside srcdoc
    assert len({f.split('"')[1] for f in frames}) == 3  # one id per report
    assert "GPT2LMHeadModel" in srcdoc(frames[1])


@pytest.mark.notebook
def test_quickstart_a_displayed_report_adds_little_more_than_the_file(quickstart: dict[str, Any]) -> None:
    """The notebook stores each output as a JSON string: what a report adds to the .ipynb is that
    string, at most ~1.2 times the standalone report (srcdoc's full escaping made it 1.45)."""
    for tag in ("cnn-report", "gpt2-report", "partial-report"):
        frame = html_of(quickstart[tag])
        stored = len(json.dumps(frame, ensure_ascii=False).encode())
        standalone = len(srcdoc(frame).encode())
        assert stored <= 1.2 * standalone, (tag, stored / standalone)


@pytest.mark.notebook
def test_quickstart_print_shows_the_tree_once(quickstart: dict[str, Any]) -> None:
    cell = quickstart["cnn-tree"]
    assert text_of(cell).count("CoolCNN  captured by torch.export") == 1
    assert [o.output_type for o in cell.outputs] == ["stream"]  # rich did not display it a second time


@pytest.mark.notebook
def test_quickstart_repr_is_short_and_the_flops_overlay_is_a_column(quickstart: dict[str, Any]) -> None:
    text = text_of(quickstart["gpt2-flops"])
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("<fxviz.Graph 'GPT2LMHeadModel' by export: ") and " ops, " in lines[0]
    assert len(lines[0]) < 120
    assert "FLOPs" in lines[1] and re.search(r"\d\.\dK FLOP", text)  # the header names it, lines carry values


@pytest.mark.notebook
def test_quickstart_svg(quickstart: dict[str, Any]) -> None:
    svg = text_of(quickstart["cnn-svg"])
    assert "<svg" in svg and "initial_conv" in svg and "cluster" in svg


@pytest.mark.notebook
def test_quickstart_transformers_tree_folds_the_blocks(quickstart: dict[str, Any]) -> None:
    text = text_of(quickstart["gpt2-tree"])
    assert "export" in text and "GPT2LMHeadModel" in text
    assert "h.0-1" in text and "×2" in text


@pytest.mark.notebook
def test_quickstart_partial_graph_shows_the_error(quickstart: dict[str, Any]) -> None:
    text = text_of(quickstart["partial-tree"])
    assert "the model raised: RuntimeError" in text
    assert "captured by the eager tracer (partial)" in text and "encoder (Sequential)" in text
    assert "✗ RuntimeError: shape '[-1, 3]' is invalid" in text
    frame = html.unescape(html_of(quickstart["partial-report"]))
    assert "shape '[-1, 3]' is invalid for input of size 32" in frame  # the error banner's data


@pytest.fixture(scope="module")
def compilers(notebook_kernel: str, bundle: Path) -> dict[str, Any]:
    import nbclient
    import nbformat

    path = next(p for p in NOTEBOOKS if p.name == "compilers.ipynb")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=notebook_kernel, timeout=300,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return by_tag(nb)


@pytest.mark.notebook
def test_compilers_pipeline_names_the_pass_and_node_that_diverge(compilers: dict[str, Any]) -> None:
    lines = text_of(compilers["pipeline"]).splitlines()
    assert [ln.split()[1] for ln in lines[:3]] == ["export", "decompose", "swap_add_for_sub"]
    assert float(lines[1].split()[-1]) == 0.0 and float(lines[2].split()[-1]) > 0.01  # decompose exact, swap not
    assert lines[3] == "first divergence: stage 2 (swap_add_for_sub) at sub (node add) in the model itself at examples.py:29: that node's max abs error 5.31"


@pytest.mark.notebook
def test_compilers_compile_map_finds_the_item_break(compilers: dict[str, Any]) -> None:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text_of(compilers["compile"]))
    assert text.startswith("2 graphs, 1 break (1 cause), 86% of ops compiled (6/7)")
    item = next(ln for ln in text.splitlines() if "item" in ln and "data-dependent" in ln)
    assert item.rstrip().endswith("0 %")  # the op behind the break ran eagerly
    assert "Tensor.item()" in text or ".item()" in text  # the breaks panel under the tree


@pytest.mark.notebook
def test_compilers_numerics_names_where_bfloat16_error_is_born(compilers: dict[str, Any]) -> None:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text_of(compilers["numerics"]))
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert "all within what bfloat16 is expected to give" in lines[0]  # the default tolerance
    assert re.match(r"\w+ \(torch\.\w+\) in .* at examples\.py:\d+", lines[1])  # at one rounding's worth
    assert "error vs dtype:bfloat16" in text and "rel RMS" in text
    page = html.unescape(html_of(compilers["numerics-report"]))
    assert '"name": "error"' in page or '"name":"error"' in page  # the report carries the error overlay
