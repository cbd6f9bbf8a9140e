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
         "torch.ops.aten._scaled_dot_product_efficient_attention.default", "extern", 49),  # an ATen fallback is an extern call
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


def _call_body(code):
    """The lines of ``call()`` (plain text slicing, not the reader)."""
    lines = code.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("def call("))
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for ln in lines[start + 1:]:
        if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
            break
        body.append(ln)
    return body


def test_call_args_and_returns_match_torch_s_provenance(trace):
    """On real CPU output code: each returned buffer torch's kernels compute is passed to the call
    whose ``cppCodeToPost`` entry holds the post-grad node the post-grad graph returns at that place;
    a returned graph input is that input; every passed name is an input of ``call()`` or a buffer it
    made before the call."""
    checked = 0
    for c in trace.compiles:
        for code_art, post_art, map_art in zip(c.all("inductor_output_code"), c.all("inductor_post_grad_graph"),
                                               c.all("inductor_provenance_tracking_node_mappings"), strict=True):
            parsed = parse_output_code(code_art.payload)
            ret = next(ln for ln in post_art.payload.split("\n") if ln.strip().startswith("return ("))
            outs = [x.strip() for x in ret.strip()[len("return ("):-1].split(",") if x.strip()]
            assert len(parsed.returns) == len(outs)
            body = _call_body(code_art.payload)
            inputs = [x.strip() for x in body[0].split("=")[0].split(",") if x.strip()]
            made = {ln.strip().split(" = ")[0] for ln in body if ln.strip().startswith("buf") and " = " in ln}
            for call in parsed.calls:
                assert call.args and set(call.args) <= set(inputs) | made, call
                assert call.results == []  # CPU calls write into buffers they are passed
            to_post = map_art.payload.get("cppCodeToPost")
            for buf, node in zip(parsed.returns, outs, strict=True):
                if not buf.startswith("buf"):
                    assert buf == node and buf in inputs
                elif to_post:  # the forward (torch 2.13 leaves the backward's mapping empty)
                    writer = next(call for call in parsed.calls if buf in call.args)
                    assert node in to_post[writer.handle], (buf, node, writer.handle)
                    checked += 1
    assert checked >= 8
    first = parse_output_code(trace.compiles[0].all("inductor_output_code")[0].payload)
    assert [(c.handle, c.args) for c in first.calls] == [
        ("extern_kernels.addmm:1", ["primals_2", "primals_3", "primals_1", "buf0"]),
        ("cpp_fused_gelu_native_layer_norm_0:2", ["buf2", "buf4", "buf6", "buf0", "primals_4", "primals_5"]),
        ("extern_kernels.addmm:3", ["primals_7", "buf6", "primals_6", "buf7"])]
    # reinterpret_tensor(buf2, (32, 1), (1, 1), 0) is returned as the buffer it views
    assert first.returns == ["buf7", "primals_3", "primals_4", "primals_5", "primals_6", "buf0", "buf2", "buf4",
                             "buf6"]


TRITON_CALLS = '''# AOT ID: ['1_forward']
triton_poi_fused_add_0 = async_compile.triton('triton_poi_fused_add_0', \'\'\'
@triton.jit
def triton_poi_fused_add_0(in_ptr0, out_ptr0, ks0, xnumel, XBLOCK : tl.constexpr):
    pass
\'\'\', device_str='cuda')

async_compile.wait(globals())
del async_compile

def call(args):
    arg0_1, arg1_1, arg2_1 = args
    args.clear()
    s0 = arg0_1
    with torch.cuda._DeviceGuard(0):
        buf0 = empty_strided_cuda((s0, 16), (16, 1), torch.float32)
        # [Provenance debug handles] triton_poi_fused_add_0:1
        stream0 = get_raw_stream(0)
        triton_poi_fused_add_0.run(arg1_1, buf0, s0, 16*s0, stream=stream0)
        buf1 = empty_strided_cuda((s0, 8), (8, 1), torch.float32)
        # [Provenance debug handles] extern_kernels.mm:2
        extern_kernels.mm(buf0, reinterpret_tensor(arg2_1, (16, 8), (1, 16), 0), out=buf1)
        # [Provenance debug handles] extern_kernels.convolution:3
        buf2 = extern_kernels.convolution(buf1, arg2_1, None, stride=(1, 1), padding=(0, 0), groups=1)
        buf3 = buf2[0]
        # [Provenance debug handles] torch.ops.aten._foreach_add.List:4
        buf4, buf5 = torch.ops.aten._foreach_add.List([buf3, buf1], [arg1_1, 'x, (y)'])
    return (buf1, reinterpret_tensor(buf0, (16*s0, ), (1, ), 0), arg1_1, None, s0, buf5, )


def benchmark_compiled_module(args, times=10, repeat=10):
    return (buf9, )
'''


def test_triton_call_args_and_returns():
    parsed = parse_output_code(TRITON_CALLS)
    assert [(c.handle, c.args, c.results) for c in parsed.calls] == [
        # sizes (s0, 16*s0) and the stream are not tensors passed
        ("triton_poi_fused_add_0:1", ["arg1_1", "buf0"], []),
        # a view is its buffer; out= is a tensor passed
        ("extern_kernels.mm:2", ["buf0", "arg2_1", "buf1"], []),
        # an extern call that returns its buffer; keywords and None left out
        ("extern_kernels.convolution:3", ["buf1", "arg2_1"], ["buf2"]),
        # a list's tensors; a string is no tensor
        ("torch.ops.aten._foreach_add.List:4", ["buf3", "buf1", "arg1_1"], ["buf4", "buf5"])]
    # by place, as a kernel's signature matches them: one entry per positional argument, out= apart
    assert [(c.positional, c.out) for c in parsed.calls] == [
        (["arg1_1", "buf0", "", ""], ""), (["buf0", "arg2_1"], "buf1"), (["buf1", "arg2_1", ""], ""), (["", ""], "")]
    # one name per returned item, in order; "" for what names no tensor; the module-level function
    # after call() returns something else, which is not call()'s return
    assert parsed.returns == ["buf1", "buf0", "arg1_1", "", "", "buf5"]
    # the Runner form: call() as a method
    assert parse_output_code(TRITON).returns == ["buf4"]
    assert [c.args for c in parse_output_code(TRITON).calls] == [
        ["arg0_1", "buf0"], ["buf0", "arg0_1", "buf1"], ["buf1", "buf1", "buf1"], ["buf3", "buf4"]]


CUDA = Path(__file__).parent / "data" / "inductor_cuda.json"


def test_real_triton_output_code_calls_and_returns():
    """Triton output code Inductor wrote on an H200 (tests/data/inductor_cuda.json): each call's
    tensors are the call line's names that ``call()`` binds (its inputs, its buffers), in order; the
    returns are the ``return (...)`` line's items."""
    import json
    import re

    codes = json.loads(CUDA.read_text())["output_code"]
    for code in codes:
        parsed = parse_output_code(code)
        body = _call_body(code)
        bound = {x.strip() for x in body[0].split("=")[0].split(",") if x.strip()}
        bound |= {m.group(1) for ln in body if (m := re.match(r"\s*(buf\d+) = ", ln))}
        assert parsed.calls
        for call in parsed.calls:
            line = code.split("\n")[call.line - 1]
            words = re.findall(r"\b[A-Za-z_]\w*\b", line[line.index("(") + 1:])
            assert call.args == [w for w in words if w in bound], line
        ret = next(ln for ln in body if ln.strip().startswith("return ("))
        assert parsed.returns == re.findall(r"\b(buf\d+|primals_\d+|arg\d+_\d+)\b", ret)
    first = parse_output_code(codes[0])
    assert [(c.handle, c.kind, c.args) for c in first.calls] == [
        ("triton_per_fused_sin_sum_0:1", "triton", ["arg0_1", "buf0"]),
        ("triton_per_fused_exp_sin_sum_1:2", "triton", ["arg0_1", "buf1", "buf2"])]
    assert first.returns == ["buf0", "buf1", "buf2"]


def test_a_functional_collective_is_a_collective_call():
    """Inductor calls a DTensor collective as ``torch.ops._c10d_functional.all_reduce_.default``
    (the CPU output code of a tensor-parallel MLP, as torch 2.13 wrote it): one op, not a kernel."""
    code = '''
def call(self, args):
    primals_1, primals_7, primals_9 = args
    buf3 = empty_strided_cpu((4, 16), (16, 1), torch.float32)
    # Topologically Sorted Source Nodes: [linear_1], Original ATen: [aten.t, aten.div, aten.addmm]
    # [Provenance debug handles] extern_kernels.addmm:3
    extern_kernels.addmm(buf2, buf1, reinterpret_tensor(primals_7, (16, 16), (1, 16), 0), alpha=1, beta=1, out=buf3)
    del buf2
    # Topologically Sorted Source Nodes: [outputs_1], Original ATen: [_c10d_functional.all_reduce]
    # [Provenance debug handles] torch.ops._c10d_functional.all_reduce_.default:4
    torch.ops._c10d_functional.all_reduce_.default(buf3, 'sum', '0')
    return (buf3, primals_1, buf1, primals_7, )
'''
    out = parse_output_code(code)
    assert [(c.handle, c.kind) for c in out.calls] == [
        ("extern_kernels.addmm:3", "extern"), ("torch.ops._c10d_functional.all_reduce_.default:4", "collective")]
    ar = out.calls[1]
    assert ar.args == ["buf3"] and ar.aten == ["_c10d_functional.all_reduce"] and ar.source_nodes == ["outputs_1"]
