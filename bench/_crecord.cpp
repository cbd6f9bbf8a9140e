// A minimal per-op recorder in C++ (bench/crecord.py's ``cext`` parts): one thread-local
// RecordFunction callback that records each ATen op at the level a TorchDispatchMode sees it (ops
// with a CompositeImplicitAutograd kernel are looked through, the callees of a recorded op are not
// recorded), with its inputs (a tensor as its TensorImpl address, dtype and sizes; a scalar as its
// value) and its output tensors, plus module scopes pushed and popped by Python module hooks.
// A spike: what fxviz's eager capture would cost per op if its recorder were C.
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <unordered_map>
#include <vector>

namespace {

struct Op {
  const char* name;
  int32_t scope;
  uint32_t in_begin, in_end, out_begin, out_end;
};

// a tensor: kind 1, impl, dtype, ndim, sizes...; a scalar int: kind 2, value; a double: kind 3, bits;
// a tensor list: kind 4, count, then its tensors; anything else: kind 0
std::vector<Op> ops;
std::vector<int64_t> in_data, out_data;
std::vector<int32_t> scope_parent, scope_module;  // per scope entry
int32_t cur_scope = -1;
int hidden = 0;  // recorded ops around the current one
std::unordered_map<const char*, bool> decomp_cache;
// a weak reference to every TensorImpl recorded: its memory (not its data) stays allocated until
// stop(), so no later tensor gets its address and a stale producer (torch.tensor() makes its
// tensor under ops a dispatch mode does not see)
std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> seen;
at::CallbackHandle handle = 0;

struct Ctx : at::ObserverContext {
  size_t index;
  explicit Ctx(size_t i) : index(i) {}
};

bool decomposes(const at::RecordFunction& fn) {
  const char* n = fn.name();
  auto it = decomp_cache.find(n);
  if (it != decomp_cache.end()) return it->second;
  bool d = false;
  auto op = fn.operator_name();
  if (op) {
    auto h = c10::Dispatcher::singleton().findOp(*op);
    if (h) d = h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  }
  decomp_cache.emplace(n, d);
  return d;
}

void put_tensor(std::vector<int64_t>& v, const at::Tensor& t) {
  // an undefined tensor, or a Python number the arg parser wrapped as a 0-dim tensor (fxviz
  // records it as a constant): no data-flow edge
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) { v.push_back(0); return; }
  v.push_back(1);
  v.push_back(reinterpret_cast<int64_t>(t.unsafeGetTensorImpl()));
  seen.emplace_back(t.getIntrusivePtr());
  v.push_back(static_cast<int64_t>(t.scalar_type()));
  auto s = t.sym_sizes();
  v.push_back(static_cast<int64_t>(s.size()));
  for (const auto& d : s) v.push_back(d.is_symbolic() ? -1 : d.as_int_unchecked());
}

void put(std::vector<int64_t>& v, const c10::IValue& x) {
  if (x.isTensor()) {
    put_tensor(v, x.toTensor());
  } else if (x.isInt()) {
    v.push_back(2); v.push_back(x.toInt());
  } else if (x.isDouble()) {
    double d = x.toDouble(); int64_t bits; std::memcpy(&bits, &d, sizeof bits);
    v.push_back(3); v.push_back(bits);
  } else if (x.isTensorList()) {
    auto l = x.toTensorList();
    v.push_back(4); v.push_back(static_cast<int64_t>(l.size()));
    for (const at::Tensor& t : l) put_tensor(v, t);
  } else {
    v.push_back(0);
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  // with the Python key excluded (inside torch.tensor()'s construction, say) a dispatch mode would
  // not see the op either
  if (hidden > 0 || decomposes(fn) || c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python))
    return nullptr;
  ++hidden;
  Op op{fn.name(), cur_scope, static_cast<uint32_t>(in_data.size()), 0, 0, 0};
  for (const auto& x : fn.inputs()) put(in_data, x);
  op.in_end = static_cast<uint32_t>(in_data.size());
  ops.push_back(op);
  return std::make_unique<Ctx>(ops.size() - 1);
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  --hidden;
  Op& op = ops[static_cast<Ctx*>(ctx)->index];
  op.out_begin = static_cast<uint32_t>(out_data.size());
  for (const auto& x : fn.outputs()) put(out_data, x);
  op.out_end = static_cast<uint32_t>(out_data.size());
}

void start(bool with_inputs) {
  seen.clear(); ops.clear(); in_data.clear(); out_data.clear(); scope_parent.clear(); scope_module.clear();
  cur_scope = -1; hidden = 0;
  handle = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                          .needsInputs(with_inputs)
                                          .needsOutputs(with_inputs)
                                          .scopes({at::RecordScope::FUNCTION}));
}

void push(int32_t module) {
  scope_parent.push_back(cur_scope);
  scope_module.push_back(module);
  cur_scope = static_cast<int32_t>(scope_parent.size()) - 1;
}

void pop() { cur_scope = scope_parent[cur_scope]; }

py::object decode(const std::vector<int64_t>& v, uint32_t b, uint32_t e) {
  py::list out;
  auto tensor = [&](uint32_t& i) -> py::object {
    if (v[i] == 0) { ++i; return py::none(); }
    int64_t impl = v[i + 1], dtype = v[i + 2], nd = v[i + 3];
    py::tuple sizes(nd);
    for (int64_t k = 0; k < nd; ++k) sizes[k] = v[i + 4 + k];
    i += 4 + nd;
    return py::make_tuple(impl, dtype, sizes);
  };
  for (uint32_t i = b; i < e;) {
    int64_t kind = v[i];
    if (kind == 1) {
      out.append(tensor(i));
    } else if (kind == 2) {
      out.append(py::int_(v[i + 1])); i += 2;
    } else if (kind == 3) {
      double d; std::memcpy(&d, &v[i + 1], sizeof d); out.append(py::float_(d)); i += 2;
    } else if (kind == 4) {
      int64_t n = v[i + 1]; i += 2; py::list l;
      for (int64_t k = 0; k < n; ++k) l.append(tensor(i));
      out.append(l);
    } else {
      out.append(py::none()); ++i;
    }
  }
  return py::tuple(out);
}

// Stop recording; return (ops, scope_parent, scope_module): one (name, scope, inputs, outputs) per op.
py::tuple stop() {
  at::removeCallback(handle);
  handle = 0;
  seen.clear();
  py::list out;
  for (const Op& op : ops) {
    out.append(py::make_tuple(op.name, op.scope, decode(in_data, op.in_begin, op.in_end),
                              decode(out_data, op.out_begin, op.out_end)));
  }
  return py::make_tuple(out, py::cast(scope_parent), py::cast(scope_module));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start, py::arg("with_inputs") = true);
  m.def("stop", &stop);
  m.def("push", &push);
  m.def("pop", &pop);
}
