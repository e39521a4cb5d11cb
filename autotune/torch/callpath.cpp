// The compiled call path of `torch.ops.autotune.*` on the CPU (autotune/torch/callpath.py builds and loads it).
//
// A call through a Python kernel costs ~40 us before any work (the dispatcher boxing the arguments into Python
// objects, the checks, the routing, the output's allocation, the DLPack conversion). This kernel, registered at
// the op's CPU and Autograd keys in place of the Python ones, replays decisions the Python dispatch made: the
// first call with given argument metadata (dtypes, shapes, strides, alignment, scalar values) runs the Python
// dispatch, which records what it did (which TVM function, each argument as a view of an input, a packed weight,
// a fresh output or the error flag) when the template says that the call's validity rests on metadata alone
// (`TorchBinding.replayable`: the kernel checks the data itself). Later calls with the same metadata build the
// DLTensors and call the TVM function through tvm-ffi's C ABI here, with no Python at all. Everything else (a
// first sight, a call the Python side declined to record, a packed weight that changed, gradients, other
// dispatch keys, a kernel that flags bad input or fails) goes to the Python kernels, which raise the errors.

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <tvm/ffi/c_api.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

enum Kind { INPUT = 0, PACKED = 1, FRESH = 2, FLAG = 3, SCALAR = 4 };

struct ArgSpec {
  int kind = INPUT;
  int index = 0;       // INPUT: the op argument it views; PACKED: index into Plan::packed
  int64_t delta = 0;   // INPUT: bytes from the input's data pointer; SCALAR: the integer passed
  std::vector<int64_t> sizes, strides;
  at::ScalarType scalar = at::kFloat;
  DLDataType dtype{};
};

struct OutSpec {
  int arg = 0;  // the FRESH argument holding it
  int64_t offset = 0;  // elements
  std::vector<int64_t> sizes, strides;
  bool whole = true;  // the argument itself, not a view of it
};

struct Guard {  // a packed weight holds while its source tensor is the same live tensor, version and address
  int input = 0;
  c10::TensorImpl* impl = nullptr;
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> weak;
  int64_t version = -1;
  const void* data = nullptr;
};

struct Plan {
  bool python = true;  // the Python dispatch decides every call of this metadata
  TVMFFIObjectHandle func = nullptr;
  std::vector<ArgSpec> args;
  std::vector<OutSpec> outs;
  std::vector<at::Tensor> packed;
  std::vector<Guard> guards;
  bool flag = false;
  Plan() = default;
  Plan(const Plan&) = delete;
  ~Plan() {
    if (func != nullptr) TVMFFIObjectDecRef(func);
  }
};

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

constexpr size_t kMaxKeys = 4096;   // serving traffic brings many shapes: bounded, like the registry's plans
constexpr size_t kMaxPlansPerKey = 64;  // packed-weight variants of one metadata (layers of one shape)
constexpr int kMaxArgs = 16;

struct OpState {
  std::string name;
  PyObject* impl = nullptr;      // (*args) -> output: the Python dispatch
  PyObject* record = nullptr;    // (*args) -> (output, spec or None)
  PyObject* autograd = nullptr;  // (keyset, *args) -> output: the Python kernel at the Autograd key
  std::mutex mu;
  std::unordered_map<Key, std::vector<std::shared_ptr<const Plan>>, KeyHash> plans;
  std::atomic<int64_t> replayed{0}, recorded{0}, python{0}, sent_to_autograd{0};
};

std::mutex g_mu;
std::vector<OpState*> g_ops;                          // never freed: the registrations live for the process
std::vector<std::unique_ptr<torch::Library>> g_libs;  // likewise

// ---- the metadata key ------------------------------------------------------------------------------------
bool add_key(const c10::IValue& v, Key& key) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      key.push_back(-1);
      return true;
    }
    if (t.layout() != c10::kStrided || !t.is_cpu()) return false;
    const int64_t dim = t.dim();
    key.push_back(1000 + static_cast<int64_t>(t.scalar_type()));
    key.push_back(dim);
    auto sizes = t.sizes();
    auto strides = t.strides();
    key.insert(key.end(), sizes.begin(), sizes.end());
    key.insert(key.end(), strides.begin(), strides.end());
    key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 63) |
                  (t.is_inference() ? 64 : 0));
    return true;
  }
  if (v.isNone()) {
    key.push_back(-2);
    return true;
  }
  if (v.isBool()) {
    key.push_back(-3 - static_cast<int64_t>(v.toBool()));
    return true;
  }
  if (v.isInt()) {
    key.push_back(-5);
    key.push_back(v.toInt());
    return true;
  }
  if (v.isDouble()) {
    double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    key.push_back(-6);
    key.push_back(bits);
    return true;
  }
  if (v.isString()) {
    const std::string& s = v.toStringRef();
    key.push_back(-7);
    key.push_back(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t word = 0;
      std::memcpy(&word, s.data() + i, std::min<size_t>(8, s.size() - i));
      key.push_back(word);
    }
    return true;
  }
  return false;  // lists and the rest: the Python dispatch serves them
}

int64_t version_of(const at::Tensor& t) {
  return t.is_inference() ? -1 : static_cast<int64_t>(t.unsafeGetTensorImpl()->version_counter().current_version());
}

bool guards_hold(const Plan& p, c10::ArrayRef<c10::IValue> args) {
  for (const Guard& g : p.guards) {
    const c10::IValue& v = args[g.input];
    if (!v.isTensor()) return false;
    const at::Tensor& t = v.toTensor();
    if (t.unsafeGetTensorImpl() != g.impl || g.weak->expired() || version_of(t) != g.version ||
        t.data_ptr() != g.data)
      return false;
  }
  return true;
}

// ---- replaying a plan ------------------------------------------------------------------------------------
DLDataType dl_dtype(at::ScalarType s, bool* ok) {
  *ok = true;
  switch (s) {
    case at::kFloat: return {kDLFloat, 32, 1};
    case at::kDouble: return {kDLFloat, 64, 1};
    case at::kHalf: return {kDLFloat, 16, 1};
    case at::kBFloat16: return {kDLBfloat, 16, 1};
    case at::kChar: return {kDLInt, 8, 1};
    case at::kShort: return {kDLInt, 16, 1};
    case at::kInt: return {kDLInt, 32, 1};
    case at::kLong: return {kDLInt, 64, 1};
    case at::kByte: return {kDLUInt, 8, 1};
    case at::kBool: return {kDLBool, 8, 1};
    default: *ok = false; return {};
  }
}

// Runs the plan; false where the Python dispatch must take the call (the kernel failed or flagged its input).
bool replay(const Plan& p, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& results) {
  alignas(64) thread_local int32_t flag[16];
  const int n = static_cast<int>(p.args.size());
  DLTensor dl[kMaxArgs];
  TVMFFIAny any[kMaxArgs];
  at::Tensor fresh[kMaxArgs];
  for (int i = 0; i < n; ++i) {
    const ArgSpec& s = p.args[i];
    if (s.kind == SCALAR) {  // an integer the call's metadata fixed (a CPU GEMM's number of tasks)
      any[i].type_index = kTVMFFIInt;
      any[i].zero_padding = 0;
      any[i].v_int64 = s.delta;
      continue;
    }
    void* data = nullptr;
    switch (s.kind) {
      case INPUT:
        data = static_cast<char*>(args[s.index].toTensor().data_ptr()) + s.delta;
        break;
      case PACKED:
        data = p.packed[s.index].data_ptr();
        break;
      case FRESH:
        fresh[i] = at::detail::empty_cpu(s.sizes, s.scalar, false, std::nullopt);
        data = fresh[i].data_ptr();
        break;
      case FLAG:
        flag[0] = 0;
        data = flag;
        break;
    }
    DLTensor& d = dl[i];
    d.data = data;
    d.device = {kDLCPU, 0};
    d.ndim = static_cast<int32_t>(s.sizes.size());
    d.dtype = s.dtype;
    d.shape = const_cast<int64_t*>(s.sizes.data());
    d.strides = const_cast<int64_t*>(s.strides.data());
    d.byte_offset = 0;
    any[i].type_index = kTVMFFIDLTensorPtr;
    any[i].zero_padding = 0;
    any[i].v_ptr = &dl[i];
  }
  TVMFFIAny result;
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  if (TVMFFIFunctionCall(p.func, any, n, &result) != 0) {
    TVMFFIObjectHandle err = nullptr;
    TVMFFIErrorMoveFromRaised(&err);
    if (err != nullptr) TVMFFIObjectDecRef(err);
    return false;
  }
  if (result.type_index >= kTVMFFIStaticObjectBegin && result.v_obj != nullptr)
    TVMFFIObjectDecRef(result.v_obj);
  if (p.flag && flag[0] != 0) return false;
  for (const OutSpec& o : p.outs) {
    if (o.whole)
      results.emplace_back(fresh[o.arg]);
    else
      results.emplace_back(fresh[o.arg].as_strided(o.sizes, o.strides, o.offset));
  }
  return true;
}

// ---- the Python side -------------------------------------------------------------------------------------
void call_python(PyObject* fn, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 const c10::DispatchKeySet* ks) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  py::gil_scoped_acquire gil;
  py::tuple pargs(n + (ks != nullptr ? 1 : 0));
  size_t j = 0;
  if (ks != nullptr) pargs[j++] = py::cast(*ks);
  for (auto& v : torch::jit::last(*stack, n)) pargs[j++] = torch::jit::toPyObject(v);
  torch::jit::drop(*stack, n);
  py::object out = py::reinterpret_borrow<py::object>(fn)(*pargs);
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->emplace_back(torch::jit::toIValue(out, returns[0].type()));
  } else {
    py::tuple outs = out.cast<py::tuple>();
    for (size_t i = 0; i < returns.size(); ++i) stack->emplace_back(torch::jit::toIValue(outs[i], returns[i].type()));
  }
}

std::shared_ptr<Plan> parse_plan(const py::handle& spec) {
  auto plan = std::make_shared<Plan>();
  if (spec.is_none()) return plan;
  py::tuple t = spec.cast<py::tuple>();
  auto func = reinterpret_cast<TVMFFIObjectHandle>(t[0].cast<uintptr_t>());
  for (auto a : t[1].cast<py::list>()) {
    py::tuple s = a.cast<py::tuple>();
    ArgSpec arg;
    arg.kind = s[0].cast<int>();
    arg.index = s[1].cast<int>();
    arg.delta = s[2].cast<int64_t>();
    arg.sizes = s[3].cast<std::vector<int64_t>>();
    arg.strides = s[4].cast<std::vector<int64_t>>();
    arg.scalar = s[5].cast<at::Tensor>().scalar_type();
    bool ok;
    arg.dtype = dl_dtype(arg.scalar, &ok);
    if (!ok || arg.sizes.size() != arg.strides.size()) return std::make_shared<Plan>();
    plan->flag = plan->flag || arg.kind == FLAG;
    plan->args.push_back(std::move(arg));
  }
  if (plan->args.size() > kMaxArgs) return std::make_shared<Plan>();
  for (auto o : t[2].cast<py::list>()) {
    py::tuple s = o.cast<py::tuple>();
    OutSpec out;
    out.arg = s[0].cast<int>();
    out.offset = s[1].cast<int64_t>();
    out.sizes = s[2].cast<std::vector<int64_t>>();
    out.strides = s[3].cast<std::vector<int64_t>>();
    const ArgSpec& a = plan->args.at(out.arg);
    if (a.kind != FRESH) return std::make_shared<Plan>();
    out.whole = out.offset == 0 && out.sizes == a.sizes && out.strides == a.strides;
    plan->outs.push_back(std::move(out));
  }
  for (auto w : t[3].cast<py::list>()) plan->packed.push_back(w.cast<at::Tensor>());
  for (auto g : t[4].cast<py::list>()) {
    py::tuple s = g.cast<py::tuple>();
    at::Tensor w = s[1].cast<at::Tensor>();
    Guard guard;
    guard.input = s[0].cast<int>();
    guard.impl = w.unsafeGetTensorImpl();
    guard.weak.emplace(w.getIntrusivePtr());
    guard.version = version_of(w);
    guard.data = w.data_ptr();
    plan->guards.push_back(std::move(guard));
  }
  TVMFFIObjectIncRef(func);
  plan->func = func;
  plan->python = false;
  return plan;
}

void record(OpState& s, const c10::OperatorHandle& op, torch::jit::Stack* stack, Key&& key) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  std::shared_ptr<Plan> plan;
  {
    py::gil_scoped_acquire gil;
    py::tuple pargs(n);
    size_t j = 0;
    for (auto& v : torch::jit::last(*stack, n)) pargs[j++] = torch::jit::toPyObject(v);
    py::tuple got = py::reinterpret_borrow<py::object>(s.record)(*pargs).cast<py::tuple>();
    plan = parse_plan(got[1]);
    torch::jit::drop(*stack, n);
    const auto& returns = schema.returns();
    if (returns.size() == 1) {
      stack->emplace_back(torch::jit::toIValue(got[0], returns[0].type()));
    } else {
      py::tuple outs = got[0].cast<py::tuple>();
      for (size_t i = 0; i < returns.size(); ++i)
        stack->emplace_back(torch::jit::toIValue(outs[i], returns[i].type()));
    }
  }
  s.recorded++;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.plans.size() >= kMaxKeys) s.plans.clear();
  auto& bucket = s.plans[std::move(key)];
  if (bucket.size() >= kMaxPlansPerKey) bucket.erase(bucket.begin());
  bucket.push_back(std::move(plan));
}

void dispatch(OpState& s, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  Key key;
  key.reserve(64);
  bool keyed = true;
  for (const auto& v : args) {
    if (!add_key(v, key)) {
      keyed = false;
      break;
    }
  }
  if (!keyed) {
    s.python++;
    return call_python(s.impl, op, stack, nullptr);
  }
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.plans.find(key);
    if (it != s.plans.end())
      for (const auto& p : it->second)
        if (guards_hold(*p, args)) {
          plan = p;
          break;
        }
  }
  if (!plan) return record(s, op, stack, std::move(key));
  if (!plan->python) {
    std::vector<c10::IValue> results;
    results.reserve(plan->outs.size());
    if (replay(*plan, args, results)) {
      s.replayed++;
      torch::jit::drop(*stack, n);
      for (auto& r : results) stack->push_back(std::move(r));
      return;
    }
  }
  s.python++;
  call_python(s.impl, op, stack, nullptr);  // raises what the kernel flagged, or runs PyTorch's implementation
}

struct Kernel final : c10::OperatorKernel {
  OpState* state;
  bool autograd;
  Kernel(OpState* s, bool a) : state(s), autograd(a) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (autograd) {  // the Python autograd kernel unless nothing needs a gradient and plain CPU lies below
      bool plain = (ks & c10::after_autograd_keyset) == c10::DispatchKeySet(c10::DispatchKey::CPU);
      if (plain && c10::GradMode::is_enabled()) {
        for (const auto& v : torch::jit::last(*stack, op.schema().arguments().size()))
          if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) {
            plain = false;
            break;
          }
      }
      if (!plain) {
        state->sent_to_autograd++;
        return call_python(state->autograd, op, stack, &ks);
      }
    }
    dispatch(*state, op, stack);
  }
};

void install(const std::string& name, py::object impl, py::object rec, py::object autograd) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* s = new OpState();
  s->name = name;
  s->impl = impl.release().ptr();  // kept for the process, as the registration is
  s->record = rec.release().ptr();
  s->autograd = autograd.release().ptr();
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "autotune", std::nullopt, __FILE__, __LINE__);
  for (bool autograd : {false, true}) {
    auto key = autograd ? c10::DispatchKey::Autograd : c10::DispatchKey::CPU;
    auto kernel = torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(s, autograd));
    lib->impl(name.c_str(), torch::dispatch(key, std::move(kernel)));
  }
  g_libs.push_back(std::move(lib));
  g_ops.push_back(s);
}

void invalidate() {
  std::vector<OpState*> ops;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ops = g_ops;
  }
  for (OpState* s : ops) {
    decltype(s->plans) old;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      old.swap(s->plans);
    }
  }  // the plans (their packed weights and function references) are released here, outside the locks
}

py::dict stats(const std::string& name) {
  py::dict out;
  std::lock_guard<std::mutex> lock(g_mu);
  for (OpState* s : g_ops) {
    if (s->name != name) continue;
    size_t plans = 0, python = 0;
    {
      std::lock_guard<std::mutex> l(s->mu);
      for (const auto& kv : s->plans)
        for (const auto& p : kv.second) (p->python ? python : plans)++;
    }
    out["replayed"] = s->replayed.load();
    out["recorded"] = s->recorded.load();
    out["python"] = s->python.load();
    out["autograd"] = s->sent_to_autograd.load();
    out["plans"] = plans;
    out["python_plans"] = python;
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The compiled call path of torch.ops.autotune.* on the CPU (autotune/torch/callpath.py).";
  m.def("install", &install, "Serve op `name` at the CPU and Autograd keys, falling back to the Python kernels");
  m.def("invalidate", &invalidate, "Forget every recorded plan (kernels were loaded or unloaded)");
  m.def("stats", &stats, "Counters of op `name`: calls replayed, recorded, sent to Python; plans held");
  m.attr("KINDS") = py::make_tuple("input", "packed", "fresh", "flag");
}
