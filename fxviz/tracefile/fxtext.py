"""Read a graph payload of torch's structured trace (``print_readable`` text) into an fxviz Graph.

Dynamo's ``dynamo_output_graph``, Inductor's ``before_pre_grad_graph``/``after_pre_grad_graph``,
AOT Autograd's ``aot_joint_graph``/``aot_forward_graph``/``aot_backward_graph`` and Inductor's
``before_post_grad_graph``/``inductor_post_grad_graph`` are all printed by
``GraphModule.print_readable``: one statement per fx node, e.g.::

    # File: /tmp/model.py:7 in forward, code: return self.b(x)
    addmm: "f32[32, 64][64, 1]cpu" = torch.ops.aten.addmm.default(primals_2, primals_3, permute);  primals_2 = None
    var_mean = torch.ops.aten.var_mean.correction(addmm, [1], correction = 0, keepdim = True)
    getitem_1: "f32[32, 1][1, 1]cpu" = var_mean[1];  var_mean = None

Each assignment becomes one node (a ``getitem`` too: it reads output ``i`` of its multi-output op,
whose outputs it fills in), named as torch named it, so node names meet torch's provenance records
(``postToPre``, ``cppCodeToPost``). Targets are spelled as fxviz spells captured ops
(``aten.addmm.default``, ``mylib::op.default``, ``higher_order.cond``, ``Tensor.view``,
``operator.add``). Placeholders come from the signature (or, in the joint graph, from annotated
declarations), the output from ``return``. The strides of the annotations go to
``attrs["strides"]`` (one list per output). Nested graphs (``class submod_0``, the bodies of
higher-order ops) are read the same way into ``Graph.annotations["subgraphs"]`` (name ->
``Graph.to_dict()``), and a note says so. No torch; nothing is executed. A statement that cannot be
read raises :class:`~fxviz.tracefile.errors.TraceFileError` naming the line.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from fxviz.ir import Graph, Node, Ref, SourceLoc, TensorMeta
from fxviz.tracefile.code import split_args
from fxviz.tracefile.errors import TraceFileError

DTYPES = {
    "f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
    "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "u16": "uint16", "u32": "uint32",
    "u64": "uint64", "b8": "bool", "c32": "complex32", "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "f8e4m3fnuz": "float8_e4m3fnuz",
    "f8e5m2fnuz": "float8_e5m2fnuz", "f8e8m0fnu": "float8_e8m0fnu",
}
#: fx prints these operator.* calls as infix expressions.
BINARY = {
    "+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod", "@": "matmul",
    "**": "pow", "==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "&": "and_",
    "|": "or_", "^": "xor", "<<": "lshift", ">>": "rshift",
}
UNARY = {"-": "neg", "~": "invert", "not ": "not_"}
TORCH_NAMESPACES = frozenset({"aten", "prims", "quantized"})

_CLASS = re.compile(r"^(\s*)class (\w+|<lambda>)\(.*\):\s*$")  # inference graphs print as <lambda>
_DEF = re.compile(r"^(\s*)def forward\(")
_ASSIGN = re.compile(r'^(\w+)(?:\s*:\s*"([^"]*)")?\s*=\s*(.*)$')
_DECLARE = re.compile(r'^(\w+)\s*:\s*"([^"]*)"\s*(?:#\s*(.*))?$')
_FILE = re.compile(r"^#\s*File:\s*(.*?):(\d+) in ([^,]*), code: (.*)$")
_DELETE = re.compile(r";\s+(?:\w+\s*=\s*)+None\s*$")
_TENSOR = re.compile(r"^([a-z0-9]+)\[(.*?)\](?:\[(.*?)\])?(.*)$")
_SYM = re.compile(r"^Sym\((.*)\)$")
_DTENSOR = re.compile(r"^DTensor\(([a-z0-9]+\[[^\]]*\](?:\[[^\]]*\])?[^,\s]*),.*\)$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_INDEX = re.compile(r"^(\w+)\[(-?\d+)\]$")
_SUBSCRIPT = re.compile(r"^(\w+)\[(.*)\]$", re.DOTALL)
_CALLEE = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$", re.DOTALL)
_INFIX = re.compile(r"^(\S+) (" + "|".join(re.escape(o) for o in sorted(BINARY, key=len, reverse=True))
                    + r") (\S+)$")
_ATTR = re.compile(r"^(\w+)\.(\w+)$")
# an in-place operator node (Dynamo's ``operator.iadd``, ``operator.setitem``): fx prints the statement,
# then names the node after it: ``b += y;  b_1: "f32[3, 4]" = b``, ``b[0] = 1.0;  setitem = b``
_INPLACE = re.compile(r'^(\w+)(\[.*\])? (' + "|".join(re.escape(o) for o in sorted(BINARY, key=len, reverse=True))
                      + r')?= (.*);  (\w+)(?:\s*:\s*"([^"]*)")? = \1$', re.DOTALL)


def parse_graph(text: str, *, name: str) -> Graph:
    """The fxviz Graph of one ``print_readable`` graph payload; ``name`` becomes the Graph's name
    and names the graph in errors."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        raise TraceFileError(f"{name}: the graph text is empty")
    if _CLASS.match(lines[start]) is None:
        if _DEF.match(lines[start]) is None:
            raise _error(name, start, lines[start], "expected 'class ...(torch.nn.Module):'")
        return _Reader(name, lines).graph(start, len(lines))
    return _read_class(name, lines, start)[0]


def _error(name: str, i: int, line: str, what: str) -> TraceFileError:
    text = line.strip()
    text = text if len(text) <= 120 else text[:117] + "..."
    return TraceFileError(f"{name}: line {i + 1}: {what}: {text!r}")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _read_class(name: str, lines: list[str], start: int) -> tuple[Graph, int]:
    """The class at ``start``: its forward as a Graph called ``name`` (nested classes, called by
    their class names, in its annotations); the index of the first line after the class."""
    own = _indent(lines[start])
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > own
                                or lines[end].lstrip().startswith("#")):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    subgraphs: dict[str, Any] = {}
    forward: tuple[int, int] | None = None
    i = start + 1
    while i < end:
        line = lines[i]
        m = _CLASS.match(line)
        if m is not None:
            sub, i = _read_class(m.group(2), lines, i)
            subgraphs[m.group(2)] = sub.to_dict()
            continue
        if _DEF.match(line) is not None:
            j = i + 1
            while j < end and (not lines[j].strip() or _indent(lines[j]) > _indent(line)
                               or lines[j].lstrip().startswith(("#", ")"))):
                j += 1
            forward = (i, j)
            i = j
            continue
        i += 1
    if forward is None:
        raise _error(name, start, lines[start], "a graph class without 'def forward('")
    graph = _Reader(name, lines).graph(*forward)
    if subgraphs:
        graph.annotations["subgraphs"] = subgraphs
        graph.notes.append(f"{len(subgraphs)} nested graph(s) (higher-order op bodies or submodules)"
                           f" in annotations['subgraphs']: {', '.join(subgraphs)}")
    return graph, end


class _Reader:
    def __init__(self, name: str, lines: list[str]) -> None:
        self.name = name
        self.lines = lines
        self.placeholders: list[Node] = []
        self.ops: list[Node] = []
        self.output: Node | None = None
        self.by_name: dict[str, Node] = {}
        self.declared = False  # the joint graph declares its placeholders in the body
        self.unnamed: set[str] = set()  # signature arguments no ``l_x_ = L_x_`` statement renamed
        self.sig_ann: dict[str, str | None] = {}
        self.source: SourceLoc | None = None

    def graph(self, start: int, end: int) -> Graph:
        body = self._signature(start, end)
        i = body
        while i < end:
            line = self.lines[i]
            s = line.strip()
            if not s:
                i += 1
                continue
            if s.startswith("#"):
                self._comment(s)
                i += 1
                continue
            if s.startswith("return"):
                i = self._return(i, end)
                continue
            self._statement(i, s)
            i += 1
        if self.declared:  # the joint graph's arguments are pytrees of the declared placeholders
            self.placeholders = [n for n in self.placeholders if n.name not in self.unnamed]
        nodes = [*self.placeholders, *self.ops, *([self.output] if self.output else [])]
        return Graph(name=self.name, nodes=nodes, method="tracefile")

    # -- the signature --------------------------------------------------------------------------
    def _signature(self, start: int, end: int) -> int:
        """Read ``def forward(self, a: "ann", ...):`` (one line or one argument per line); the
        index of the first body line."""
        i = start
        parts: list[str] = []
        while i < end:
            line = self.lines[i]
            parts.append(line)
            i += 1
            if line.rstrip().endswith("):") or re.search(r"\)\s*(->.*)?:\s*$", line.split("#")[0]):
                break
        else:
            raise _error(self.name, start, self.lines[start], "the signature never closes")
        entries: list[tuple[str, str | None]] = []
        if len(parts) == 1:
            inner = parts[0].strip()[len("def forward("):]
            inner = inner[:inner.rfind(")")]
            entries = [(x.strip(), None) for x in split_args(inner)]
        else:
            for p in parts[1:-1]:
                code, _, comment = p.partition("  #")
                if code.strip():
                    entries.append((code.strip().rstrip(","), comment.strip() or None))
        for text, note in entries:
            # an unquoted annotation is a Python type (Dynamo's ``mesh : torch...DeviceMesh``): no tensor
            m = re.match(r'^\*{0,2}(\w+)\s*(?::\s*(?:"([^"]*)"|[A-Za-z_][\w.]*))?$', text)
            if m is None:
                raise _error(self.name, start, text, "cannot read this argument")
            if m.group(1) != "self":
                self._placeholder(m.group(1), m.group(1), m.group(2), note, start)
                self.unnamed.add(m.group(1))
                self.sig_ann[m.group(1)] = m.group(2)
        return i

    # -- statements -----------------------------------------------------------------------------
    def _comment(self, s: str) -> None:
        m = _FILE.match(s)
        if m is not None:
            self.source = SourceLoc(m.group(1), int(m.group(2)), m.group(3).strip(), m.group(4))
        elif s.startswith("# No stacktrace found"):
            self.source = None

    def _placeholder(self, name: str, target: str, ann: str | None, comment: str | None,
                     i: int) -> None:
        self.placeholders.append(self._named(self._make(name, target, ann, comment, i)))

    def _make(self, name: str, target: str, ann: str | None, comment: str | None, i: int) -> Node:
        kind: Any = "input"
        stack: tuple[tuple[str, int], ...] = ()
        attrs: dict[str, Any] = {}
        state = _state_name(target)
        if state is not None:
            kind = "parameter" if state[0] == "parameters" else "buffer"
            attrs["placeholder"] = target
            target = state[1]
            owner = target.rpartition(".")[0]
            stack = ((owner, 0),) if owner else ()
        outputs, strides = self._meta(ann, i)
        if strides:
            attrs["strides"] = strides
        if comment:
            attrs["aot"] = comment
        return Node(name, kind, target=target, stack=stack, outputs=outputs, attrs=attrs)

    def _rename(self, arg: str, name: str, ann: str | None, i: int) -> None:
        """``name = arg``: the placeholder of signature argument ``arg`` is called ``name``."""
        self.unnamed.discard(arg)
        old = self.by_name.pop(arg)
        node = self._make(name, arg, ann or self.sig_ann.get(arg), old.attrs.get("aot"), i)
        self.placeholders[self.placeholders.index(old)] = self._named(node)

    def _named(self, node: Node) -> Node:
        if node.name in self.by_name:
            raise TraceFileError(f"{self.name}: the name {node.name!r} is assigned twice")
        self.by_name[node.name] = node
        return node

    def _meta(self, ann: str | None, i: int) -> tuple[tuple[TensorMeta, ...], list[Any]]:
        if not ann:
            return (), []
        read = _annotation(ann)
        if read is None:
            raise _error(self.name, i, ann, "cannot read this annotation")
        metas, strides = read
        return metas, [list(s) if s is not None else None for s in strides] if any(
            s is not None for s in strides) else []

    def _statement(self, i: int, s: str) -> None:
        if "fx_pytree.tree_flatten_spec(" in s or re.match(r"^\w+(\s*,\s*\w+)*\s*,\s*=", s):
            return  # the joint graph's unpacking of its (primals, tangents) pytree
        if (inplace := _INPLACE.match(_DELETE.sub("", s).strip())) is not None:
            self._inplace(i, inplace)
            return
        m = _ASSIGN.match(s)
        if m is None:
            d = _DECLARE.match(s)
            if d is None:
                raise _error(self.name, i, s, "cannot read this statement")
            self.declared = True
            self._placeholder(d.group(1), d.group(1), d.group(2), d.group(3), i)
            return
        lhs, ann, rhs = m.group(1), m.group(2), m.group(3)
        rhs = _DELETE.sub("", rhs).strip()
        if rhs in self.unnamed:  # Dynamo: ``l_x_ = L_x_`` names the placeholder
            self._rename(rhs, lhs, ann, i)
            return
        outputs, strides = self._meta(ann, i)
        attrs: dict[str, Any] = {}
        if strides:
            attrs["strides"] = strides
        target, inputs = self._rhs(i, s, rhs, attrs)
        node = Node(lhs, "op", target=target, inputs=tuple(inputs), outputs=outputs,
                    source=self.source, attrs=attrs)
        if target.startswith("self.") and "(" not in rhs:  # a get_attr: a constant or a body
            node.kind = "constant"
            node.target = target[len("self."):]
        if target == "operator.getitem" and len(outputs) == 1:
            self._fill_output(self.by_name[inputs[0].node], inputs[0].index, outputs[0])
        self.ops.append(self._named(node))

    def _inplace(self, i: int, m: re.Match[str]) -> None:
        """``b += y;  b_1 = b`` (node ``b_1``, ``operator.iadd(b, y)``) or ``b[0] = v;  setitem = b``
        (``operator.setitem(b, 0, v)``): one node, named as torch named it."""
        target, index, op, value, name, ann = m.groups()
        fn = "setitem" if index else "i" + BINARY[op].rstrip("_")
        args = f"{target}, {index[1:-1]}, {value}" if index else f"{target}, {value}"
        outputs, strides = self._meta(ann, i)
        attrs: dict[str, Any] = {"args": args, **({"strides": strides} if strides else {})}
        self.ops.append(self._named(Node(name, "op", target=f"operator.{fn}", inputs=(Ref(target), *self._refs(
            args.split(",", 1)[1])), outputs=outputs, source=self.source, attrs=attrs)))

    def _fill_output(self, src: Node, index: int, meta: TensorMeta) -> None:
        """A multi-output op (printed without an annotation) learns output ``index`` from the
        annotation of the ``getitem`` that reads it."""
        if src.attrs.get("strides") is not None and len(src.outputs) > index:
            return  # annotated itself
        outs = list(src.outputs)
        while len(outs) <= index:
            outs.append(TensorMeta((), "object"))
        outs[index] = meta
        src.outputs = tuple(outs)

    def _rhs(self, i: int, s: str, rhs: str, attrs: dict[str, Any]) -> tuple[str, list[Ref]]:
        m = _INDEX.match(rhs)
        if m is not None and m.group(1) in self.by_name:
            src, index = self.by_name[m.group(1)], int(m.group(2))
            attrs["index"] = index
            return "operator.getitem", [Ref(src.name, index)]
        m = _SUBSCRIPT.match(rhs)
        if m is not None and m.group(1) in self.by_name and _balanced(m.group(2)):
            attrs["args"] = m.group(2)  # slices, None, Ellipsis: ``x[(slice(None, None, None), 0)]``
            return "operator.getitem", [Ref(m.group(1)), *self._refs(m.group(2))]
        m = _CALLEE.match(rhs)
        if m is not None and _balanced(m.group(2)):
            callee, args = m.group(1), m.group(2)
            if args.strip():
                attrs["args"] = args
            inputs = self._refs(args)
            head, _, method = callee.rpartition(".")
            if head in self.by_name:  # a method of a value: ``x.view(...)``
                return f"Tensor.{method}", [Ref(head), *inputs]
            return _target(callee), inputs
        m = _INFIX.match(rhs)
        if m is not None:
            attrs["args"] = rhs
            return f"operator.{BINARY[m.group(2)]}", self._refs(rhs)
        for op, fn in UNARY.items():
            if rhs.startswith(op) and _NAME.fullmatch(rhs[len(op):].strip()):
                return f"operator.{fn}", self._refs(rhs)
        m = _ATTR.match(rhs)
        if m is not None:
            if m.group(1) == "self":
                return f"self.{m.group(2)}", []
            if m.group(1) in self.by_name:
                attrs["attr"] = m.group(2)
                return "builtins.getattr", [Ref(m.group(1))]
        raise _error(self.name, i, s, "cannot read this assignment")

    def _refs(self, args: str) -> list[Ref]:
        names = _NAME.findall(_STRINGS.sub("", args))
        return [Ref(n) for n in names if n in self.by_name]

    def _return(self, i: int, end: int) -> int:
        parts: list[str] = []
        comments: list[str] = []
        depth = 0
        j = i
        while j < end:
            code, _, comment = self.lines[j].partition("#")
            parts.append(code)
            if comment.strip() and j > i:
                comments.append(comment.strip())
            depth += code.count("(") + code.count("[") - code.count(")") - code.count("]")
            j += 1
            if depth <= 0:
                break
        text = " ".join(parts).strip()[len("return"):]
        attrs: dict[str, Any] = {}
        if comments:
            attrs["aot"] = comments
        self.output = Node("output", "output", inputs=tuple(self._refs(text)), attrs=attrs)
        return j


_STATE = re.compile(r"_(modules|parameters|buffers)_")


def _state_name(placeholder: str) -> tuple[str, str] | None:
    """Dynamo's name of a parameter or buffer it lifted (``L_self_modules_ln_parameters_weight_``)
    -> (``parameters``, the state-dict name ``ln.weight``); None for any other argument."""
    if not (placeholder.startswith("L_") and placeholder.endswith("_")):
        return None
    parts = _STATE.split(placeholder[2:-1])
    if len(parts) < 3 or parts[-2] not in ("parameters", "buffers"):
        return None
    return parts[-2], ".".join(parts[2::2])


def _balanced(args: str) -> bool:
    depth = 0
    for ch in _STRINGS.sub("", args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


#: torch's C bindings as fxviz names them (``torch.overrides.resolve_name``): prefix -> (public
#: module, prefix of the function's name to drop).
_PRIVATE = {
    "torch._C._nn.": ("torch.nn.functional.", ""),
    "torch._C._linalg.": ("torch.linalg.", "linalg_"),
    "torch._C._special.": ("torch.special.", "special_"),
    "torch._C._fft.": ("torch.fft.", "fft_"),
    "torch._C._VariableFunctions.": ("torch.", ""),
}


def _target(callee: str) -> str:
    """``torch.ops.aten.addmm.default`` -> ``aten.addmm.default``; ``torch.ops.mylib.op.default`` ->
    ``mylib::op.default``; ``torch.ops.higher_order.cond`` -> ``higher_order.cond``; other
    callees (``torch._C._nn.linear``, ``torch.nn.functional.gelu``) as printed."""
    if not callee.startswith("torch.ops."):
        for prefix, (public, strip) in _PRIVATE.items():
            if callee.startswith(prefix):  # how torch.overrides.resolve_name spells it
                return public + callee[len(prefix):].removeprefix(strip)
        return callee
    rest = callee[len("torch.ops."):]
    ns, _, op = rest.partition(".")
    if ns in TORCH_NAMESPACES or ns == "higher_order" or not op:
        return rest
    return f"{ns}::{op}"


def _dim(text: str) -> int | str:
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else text


_ONE_TENSOR = re.compile(r"^[a-z0-9]+\[[^\]]*\](?:\[[^\]]*\])?[^,\s]*$")


@lru_cache(maxsize=65536)
def _annotation(ann: str) -> tuple[tuple[TensorMeta, ...], tuple[tuple[int | str, ...] | None, ...]] | None:
    """The outputs an annotation describes (one per comma-separated part) and their strides;
    None when a part cannot be read. Annotations repeat: the result is cached."""
    parts = [ann] if _ONE_TENSOR.match(ann) else split_args(ann)
    metas: list[TensorMeta] = []
    strides: list[tuple[int | str, ...] | None] = []
    for part in parts:
        meta, stride = _tensor_meta(part.strip())
        if meta is None:
            return None
        metas.append(meta)
        strides.append(tuple(stride) if stride is not None else None)
    return tuple(metas), tuple(strides)


def _dims(text: str) -> list[str]:
    return text.split(",") if "(" not in text else split_args(text)


def _tensor_meta(ann: str) -> tuple[TensorMeta | None, list[int | str] | None]:
    """``f32[32, 64][64, 1]cpu`` -> (TensorMeta((32, 64), "float32", "cpu"), [64, 1]);
    ``Sym(s0)`` -> an int scalar whose value is ``s0``."""
    m = _SYM.match(ann)
    if m is not None:
        value = m.group(1)
        dtype = ("bool" if value in ("True", "False") else "float"
                 if value.startswith(("zf", "f")) or re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", value)
                 else "int")
        return TensorMeta((), dtype, "", value), None
    m = _DTENSOR.match(ann)  # ``DTensor(f32[32, 16][16, 1]cpu, S(0))``: the global tensor (placements dropped)
    if m is not None:
        return _tensor_meta(m.group(1))
    m = _TENSOR.match(ann)
    if m is None:
        return None, None
    dtype = DTYPES.get(m.group(1), m.group(1))
    shape = tuple(_dim(d) for d in _dims(m.group(2)) if d.strip())
    stride = [_dim(d) for d in _dims(m.group(3)) if d.strip()] if m.group(3) is not None else None
    return TensorMeta(shape, dtype, m.group(4).strip()), stride
