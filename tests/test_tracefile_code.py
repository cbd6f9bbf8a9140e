"""fxviz.tracefile.code.parse_output_code against torch's own provenance records of the same compile.

Oracles from torch (tests/data/traces/train.log, a real Inductor trace on CPU): the provenance
handles of the calls equal the keys of ``cppCodeToPost`` in the same compile's
``inductor_provenance_tracking_node_mappings`` (forward; torch 2.13 leaves the backward's mapping
empty) and the keys of ``inductor_provenance_tracking_kernel_stack_traces`` (forward and backward);
the kernels defined are exactly the non-extern kernels those records name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fxviz.tracefile import read_trace
from fxviz.tracefile.code import parse_output_code

TRACE = Path(__file__).parent / "data" / "traces" / "train.log"


@pytest.fixture(scope="module")
def trace():
    return read_trace(TRACE)


def code_and_records(trace):
    """(compile id, output code payload, node mappings, stack traces) per compiled graph."""
    out = []
    for c in trace.compiles:
        codes = c.all("inductor_output_code")
        maps = c.all("inductor_provenance_tracking_node_mappings")
        stacks = c.all("inductor_provenance_tracking_kernel_stack_traces")
        assert len(codes) == len(maps) == len(stacks)
        out += [(c.compile_id, a.payload, m.payload, s.payload)
                for a, m, s in zip(codes, maps, stacks, strict=True)]
    return out


def test_handles_and_kernels_match_torch_s_provenance(trace):
    graphs = code_and_records(trace)
    assert [(cid, parse_output_code(code).part) for cid, code, _, _ in graphs] == [
        ("0/0", "forward"), ("0/1", "forward"), ("0/1", "backward")]
    forward_mappings = 0
    for _cid, code, mappings, stacks in graphs:
        parsed = parse_output_code(code)
        handles = [c.handle for c in parsed.calls]
        assert handles == list(stacks)  # in call order, as torch numbered them
        if "cppCodeToPost" in mappings:
            forward_mappings += 1
            assert handles == list(mappings["cppCodeToPost"])
        names = {h.rpartition(":")[0] for h in stacks}
        assert {k.name for k in parsed.kernels} == {n for n in names
                                                    if not n.startswith("extern_kernels.")}
        for call in parsed.calls:
            assert call.name == call.handle.rpartition(":")[0]
            assert call.kind == ("extern" if call.name.startswith("extern_kernels.") else "cpp")
            # the call's line is the statement right below its handle comment
            lines = code.split("\n")
            assert lines[call.line - 2].strip() == f"# [Provenance debug handles] {call.handle}"
            assert lines[call.line - 1].strip().startswith(call.name + "(")
        for k in parsed.kernels:
            assert k.kind == "cpp"
            assert code.split("\n")[k.line - 1].startswith(f"{k.name} = async_compile.cpp_pybinding(")
            assert k.source.startswith("#include") and k.source.rstrip().endswith("}")
            assert 'extern "C"' in k.source and "'''" not in k.source
    assert forward_mappings == 2


def test_source_nodes_and_aten_of_extern_calls(trace):
    code = trace.compiles[1].all("inductor_output_code")[1].payload
    calls = parse_output_code(code).calls
    mm = calls[0]
    assert (mm.name, mm.source_nodes, mm.aten) == ("extern_kernels.mm", ["linear_1", "permute_2", "mm"],
                                                   ["aten.t", "aten.mm"])
    # CPU kernels carry no Source Nodes comment: nothing is invented for them
    fused = next(c for c in calls if c.kind == "cpp")
    assert fused.source_nodes == [] and fused.aten == []


TRITON = '''# AOT ID: ['3_inference']
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()


# kernel path: /tmp/torchinductor_u/ab/cabc.py
# Topologically Sorted Source Nodes: [add, relu], Original ATen: [aten.add, aten.relu]
# Source node to ATen node mapping:
#   add => add
#   relu => relu
triton_poi_fused_add_relu_0 = async_compile.triton('triton_poi_fused_add_relu_0', \'\'\'
import triton

@triton.jit
def triton_poi_fused_add_relu_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
\'\'\', device_str='cuda')


# kernel path: /tmp/torchinductor_u/cd/ccd.py
# Topologically Sorted Source Nodes: [linear], Original ATen: [aten.addmm]
triton_tem_fused_addmm_1 = async_compile.triton('triton_tem_fused_addmm_1', \'\'\'
@triton.jit
def triton_tem_fused_addmm_1(arg_A, arg_B, out_ptr0):
    pass
\'\'\', device_str='cuda')

triton_red_fused_sum_2 = async_compile.multi_kernel('triton_red_fused_sum_2', [
    triton_red_fused_sum_2_0,
    triton_red_fused_sum_2_1,
])

async_compile.wait(globals())
del async_compile

class Runner:
    def call(self, args):
        arg0_1, = args
        with torch.cuda._DeviceGuard(0):
            buf0 = empty_strided_cuda((4, 8), (8, 1), torch.float32)
            # Topologically Sorted Source Nodes: [add, relu], Original ATen: [aten.add, aten.relu]
            # [Provenance debug handles] triton_poi_fused_add_relu_0:1
            stream0 = get_raw_stream(0)
            triton_poi_fused_add_relu_0.run(arg0_1, buf0, 32, stream=stream0)
            # [Provenance debug handles] triton_tem_fused_addmm_1:2
            triton_tem_fused_addmm_1.run(buf0, arg0_1, buf1, 1, 1, 1, stream=stream0)
            # Topologically Sorted Source Nodes: [sdpa], Original ATen: [aten._scaled_dot_product_efficient_attention]
            # [Provenance debug handles] torch.ops.aten._scaled_dot_product_efficient_attention.default:3
            buf2 = torch.ops.aten._scaled_dot_product_efficient_attention.default(buf1, buf1, buf1, None, False)
            buf3 = buf2[0]
            triton_red_fused_sum_2.run(buf3, buf4, 8, 4, stream=stream0)
        return (buf4, )
'''


def test_triton_template_multi_kernel_and_fallback_calls():
    parsed = parse_output_code(TRITON)
    assert parsed.part == "inference"
    assert [(k.name, k.kind, k.line) for k in parsed.kernels] == [
        ("triton_poi_fused_add_relu_0", "triton", 11), ("triton_tem_fused_addmm_1", "template", 22),
        ("triton_red_fused_sum_2", "other", 28)]
    poi = parsed.kernels[0]
    assert poi.source.startswith("import triton") and poi.source.endswith("tl.program_id(0) * XBLOCK")
    assert (poi.source_nodes, poi.aten) == (["add", "relu"], ["aten.add", "aten.relu"])
    assert parsed.kernels[2].source == ""
    assert [(c.handle, c.name, c.kind, c.line) for c in parsed.calls] == [
        ("triton_poi_fused_add_relu_0:1", "triton_poi_fused_add_relu_0", "triton", 44),
        ("triton_tem_fused_addmm_1:2", "triton_tem_fused_addmm_1", "triton", 46),
        ("torch.ops.aten._scaled_dot_product_efficient_attention.default:3",
         "torch.ops.aten._scaled_dot_product_efficient_attention.default", "other", 49),
        ("", "triton_red_fused_sum_2", "other", 51)]
    # the template's call has no Source Nodes comment: its definition's comment is used
    assert parsed.calls[1].source_nodes == ["linear"] and parsed.calls[1].aten == ["aten.addmm"]
    assert parsed.calls[2].source_nodes == ["sdpa"]
    assert parsed.calls[3].source_nodes == []


def test_code_module_imports_no_torch():
    code = ("import sys, fxviz.tracefile.code; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_handle_whose_call_is_not_recognised_still_names_a_call():
    text = ("def call(args):\n"
            "    # [Provenance debug handles] my_custom_op.default:1\n"
            "    buf0 = something_else(args)\n"
            "    # [Provenance debug handles] extern_kernels.mm:2\n"
            "    extern_kernels.mm(buf0, buf0, out=buf1)\n"
            "    return (buf1, )\n")
    calls = parse_output_code(text).calls
    assert [(c.handle, c.name, c.kind, c.line) for c in calls] == [
        ("my_custom_op.default:1", "my_custom_op.default", "other", 3),
        ("extern_kernels.mm:2", "extern_kernels.mm", "extern", 5)]
