// syncscope's compiled kernel for DDP's bucket all-reduces (see syncscope/capture/native/__init__.py).
//
// Registered at the Autograd key of c10d::allreduce_, in front of syncscope's Python kernel
// (which then sits at ADInplaceOrView). A call that is a DDP bucket all-reduce as the Python
// kernel would record it (issued straight from the autograd engine's entry frame, inside a
// backward the recorder saw, every precondition below true) is recorded here: the same
// "coll" record, in the same order, handed to the same sink, with no Python frame. Any other
// call, or any doubt, goes on to the Python kernel, which records it as before.
//
// Also here: GradSampler, the copy of a gradient fingerprint's samples at an optimizer step
// (syncscope/capture/fingerprint.py), one call where torch takes one per gradient and one more.

#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/Dtype.h>

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Python objects, owned while a target is set (set_target / clear_target, under the GIL).
struct Target {
  PyObject* recorder = nullptr;  // the one listening Recorder
  PyObject* engine_code = nullptr;  // torch.autograd.graph._engine_run_backward.__code__
  PyObject* unbox_work = nullptr;  // torch._C._distributed_c10d.Work.unbox
  int64_t clock_offset = 0;  // the recorder's: wall ns = CLOCK_MONOTONIC ns + offset
};

Target g_target;
std::atomic<bool> g_enabled{false};  // a target is set and no unrecorded() block is open
std::atomic<int64_t> g_recorded{0};  // calls recorded here (the rest went to Python)
std::unique_ptr<torch::Library> g_library;
std::array<PyObject*, static_cast<size_t>(c10::ScalarType::NumOptions)> g_dtype_names{};

// interned attribute names
PyObject* s_muted;
PyObject* s_closed;
PyObject* s_step_depth;
PyObject* s_bwd_depth;
PyObject* s_trace;
PyObject* s_dist_info;
PyObject* s_content_hits;
PyObject* s_pg_cache;
PyObject* s_ddp_modules;
PyObject* s_data;
PyObject* s_works;
PyObject* s_lock;
PyObject* s_seq;
PyObject* s_bucket;
PyObject* s_window_activity;
PyObject* s_sink;
PyObject* s_buffer;
PyObject* s_poll_works;
PyObject* s_acquire;
PyObject* s_release;
PyObject* v_coll;
PyObject* v_all_reduce;
PyObject* v_allreduce_;
PyObject* v_backward;
PyObject* v_ddp;
PyObject* v_torch;
PyObject* v_empty;

int64_t monotonic_ns() {  // Python's time.perf_counter_ns on Linux
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// An attribute of the recorder (a new reference, or nullptr with no error set).
PyObject* attr(PyObject* obj, PyObject* name) {
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == nullptr) {
    PyErr_Clear();
  }
  return value;
}

// -1: unknown (the caller falls back), else the attribute's truth.
int truth(PyObject* obj, PyObject* name) {
  PyObject* value = attr(obj, name);
  if (value == nullptr) {
    return -1;
  }
  int result = PyObject_IsTrue(value);
  Py_DECREF(value);
  if (result < 0) {
    PyErr_Clear();
  }
  return result;
}

// -1: unknown, else the attribute as a non-negative int.
long long integer(PyObject* obj, PyObject* name) {
  PyObject* value = attr(obj, name);
  if (value == nullptr) {
    return -1;
  }
  long long result = PyLong_Check(value) ? PyLong_AsLongLong(value) : -1;
  Py_DECREF(value);
  if (result < 0) {
    PyErr_Clear();
    return -1;
  }
  return result;
}

// Whether the thread's innermost Python frame is the autograd engine's entry: the
// collective comes from the C++ engine itself (DDP's reducer), no Python between.
bool from_engine() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (frame == nullptr) {
    return false;  // a thread with no Python frame: the Python kernel decides
  }
  PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
  bool engine = reinterpret_cast<PyObject*>(code) == g_target.engine_code;
  Py_DECREF(code);
  return engine;
}

PyObject* dtype_name(c10::ScalarType type) {
  auto index = static_cast<size_t>(type);
  if (index >= g_dtype_names.size()) {
    return nullptr;
  }
  return g_dtype_names[index];  // nullptr: a dtype Python did not name (the caller falls back)
}

// What the fast path needs to know before the call, with the GIL held. False: fall back.
struct Before {
  PyObject* group_name = nullptr;  // new reference
  bool ddp = false;
};

bool check_before(const torch::jit::Stack& stack, Before& before) {
  PyObject* rec = g_target.recorder;
  if (rec == nullptr || !from_engine()) {
    return false;
  }
  // Recorder.listening, phase "backward" (not "optimizer"), no --trace, the default group's
  // facts already noted, no content hits left to clear
  if (truth(rec, s_muted) != 0 || truth(rec, s_closed) != 0 || integer(rec, s_step_depth) != 0 ||
      integer(rec, s_bwd_depth) <= 0 || truth(rec, s_dist_info) != 1 ||
      truth(rec, s_content_hits) != 0) {
    return false;
  }
  PyObject* trace = attr(rec, s_trace);
  if (trace == nullptr) {
    return false;
  }
  bool traced = trace != Py_None;
  Py_DECREF(trace);
  if (traced) {
    return false;
  }
  // the group was met before (its "pg" event is written by the Python path)
  const c10::IValue& group = stack[1];
  if (!group.isCustomClass()) {
    return false;
  }
  auto pg = group.toCustomClass<c10d::ProcessGroup>();
  PyObject* name = PyUnicode_FromString(pg->getGroupName().c_str());
  if (name == nullptr) {
    PyErr_Clear();
    return false;
  }
  PyObject* cache = attr(rec, s_pg_cache);
  int known = cache != nullptr && PyDict_Check(cache) ? PyDict_Contains(cache, name) : 0;
  Py_XDECREF(cache);
  if (known != 1) {
    PyErr_Clear();
    Py_DECREF(name);
    return false;
  }
  // issuer "ddp" while the recorder knows a DDP module (ddp_modules' own dict)
  PyObject* modules = attr(rec, s_ddp_modules);
  PyObject* data = modules != nullptr ? attr(modules, s_data) : nullptr;
  before.ddp = data != nullptr && PyDict_Check(data) && PyDict_Size(data) > 0;
  Py_XDECREF(data);
  Py_XDECREF(modules);
  before.group_name = name;
  return true;
}

// The payload of the op's tensors: (bytes, dtype of the first, all floating point).
struct Payload {
  int64_t bytes = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool floating = true;
  bool any = false;
};

Payload payload_of(const c10::IValue& tensors) {
  Payload p;
  for (const c10::IValue& item : tensors.toListRef()) {
    const at::Tensor& t = item.toTensor();
    p.bytes += t.numel() * static_cast<int64_t>(t.element_size());
    if (!p.any) {
      p.dtype = t.scalar_type();
      p.any = true;
    }
    p.floating = p.floating && t.is_floating_point();
  }
  p.floating = p.floating && p.any;
  return p;
}

// The "coll" record, held as Recorder.on_collective and Recorder.hold would hold it, and the
// work watched as Recorder._watch would. False: nothing was recorded (the error cleared).
bool record(const Before& before, const Payload& p, int64_t t0, int64_t t1,
            const c10::IValue& work) {
  PyObject* rec = g_target.recorder;
  // a synchronous predecessor finished before this issue: Recorder.poll_works(at=t0)
  if (truth(rec, s_works) == 1) {
    PyObject* at = PyLong_FromLongLong(t0);
    PyObject* polled = PyObject_CallMethodOneArg(rec, s_poll_works, at);
    Py_DECREF(at);
    if (polled == nullptr) {
      PyErr_Clear();
    }
    Py_XDECREF(polled);
  }
  PyObject* dtype = p.any ? dtype_name(p.dtype) : v_empty;
  if (dtype == nullptr) {
    return false;
  }
  PyObject* lock = attr(rec, s_lock);
  if (lock == nullptr) {
    return false;
  }
  PyObject* got = PyObject_CallMethodNoArgs(lock, s_acquire);
  Py_XDECREF(got);
  if (got == nullptr) {
    PyErr_Clear();
    Py_DECREF(lock);
    return false;
  }
  bool ok = false;
  PyObject* seq = attr(rec, s_seq);
  PyObject* record = nullptr;
  PyObject* watched = nullptr;
  do {
    if (seq == nullptr || !PyLong_Check(seq)) {
      break;
    }
    long long current = PyLong_AsLongLong(seq);
    PyObject* next_seq = current >= 0 ? PyLong_FromLongLong(current + 1) : nullptr;
    if (next_seq == nullptr || PyObject_SetAttr(rec, s_seq, next_seq) < 0) {
      Py_XDECREF(next_seq);
      break;
    }
    Py_DECREF(next_seq);
    PyObject* bucket = Py_None;
    Py_INCREF(bucket);
    if (before.ddp && p.floating) {  // a gradient bucket (as on_collective numbers them)
      long long index = integer(rec, s_bucket);
      if (index < 0) {
        Py_DECREF(bucket);
        break;
      }
      PyObject* following = PyLong_FromLongLong(index + 1);
      int set = PyObject_SetAttr(rec, s_bucket, following);
      Py_DECREF(following);
      if (set < 0) {
        Py_DECREF(bucket);
        break;
      }
      Py_DECREF(bucket);
      bucket = PyLong_FromLongLong(index);
    }
    PyObject_SetAttr(rec, s_window_activity, Py_True);
    PyObject* issuer = before.ddp ? v_ddp : v_torch;
    PyObject* start = PyLong_FromLongLong(t0);
    PyObject* end = PyLong_FromLongLong(t1);
    PyObject* bytes = PyLong_FromLongLong(p.bytes);
    if (start != nullptr && end != nullptr && bytes != nullptr) {
      record = PyTuple_Pack(17, v_coll, seq, start, end, v_all_reduce, v_allreduce_, bytes, dtype,
                            before.group_name, v_backward, issuer, v_empty, bucket, Py_False,
                            Py_False, Py_False, Py_None);
    }
    Py_XDECREF(start);
    Py_XDECREF(end);
    Py_XDECREF(bytes);
    Py_DECREF(bucket);
    if (record == nullptr) {
      break;
    }
    PyObject* sink = attr(rec, s_sink);
    PyObject* held = sink != nullptr ? PyObject_CallMethodOneArg(sink, s_buffer, record) : nullptr;
    Py_XDECREF(sink);
    if (held == nullptr) {
      break;
    }
    Py_DECREF(held);
    ok = true;
    g_recorded.fetch_add(1, std::memory_order_relaxed);
    // Recorder._watch(work, seq): the Work as torch's Python class
    if (work.isCustomClass()) {
      PyObject* script_object = torch::jit::toPyObject(work).release().ptr();
      PyObject* py_work = PyObject_CallOneArg(g_target.unbox_work, script_object);
      Py_DECREF(script_object);
      PyObject* works = py_work != nullptr ? attr(rec, s_works) : nullptr;
      if (works != nullptr && PyList_Check(works)) {
        watched = PyTuple_Pack(2, seq, py_work);
        if (watched != nullptr) {
          PyList_Append(works, watched);
        }
      }
      Py_XDECREF(works);
      Py_XDECREF(py_work);
    }
  } while (false);
  if (PyErr_Occurred()) {
    PyErr_Clear();
  }
  Py_XDECREF(watched);
  Py_XDECREF(record);
  Py_XDECREF(seq);
  PyObject* released = PyObject_CallMethodNoArgs(lock, s_release);
  Py_XDECREF(released);
  Py_DECREF(lock);
  if (PyErr_Occurred()) {
    PyErr_Clear();
  }
  return ok;
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  Before before;
  bool fast = false;
  if (g_enabled.load(std::memory_order_acquire) && Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    fast = g_enabled.load(std::memory_order_relaxed) && check_before(*stack, before);
  }
  if (!fast) {  // the Python kernel, one key below, decides and records
    at::AutoDispatchBelowAutograd guard;
    op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    return;
  }
  Payload p = payload_of((*stack)[0]);
  int64_t t0 = monotonic_ns();
  {
    at::AutoDispatchBelowADInplaceOrView guard;  // past the Python kernel too
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  int64_t t1 = monotonic_ns();
  py::gil_scoped_acquire gil;
  if (g_target.recorder != nullptr) {
    int64_t offset = g_target.clock_offset;
    const c10::IValue& work = stack->size() > 1 ? (*stack)[1] : c10::IValue();
    record(before, p, t0 + offset, t1 + offset, work);
  }
  Py_XDECREF(before.group_name);
}

PyObject* intern(const char* s) {
  return PyUnicode_InternFromString(s);
}

void init_names() {
  if (s_muted != nullptr) {
    return;
  }
  s_muted = intern("muted");
  s_closed = intern("_closed");
  s_step_depth = intern("step_depth");
  s_bwd_depth = intern("bwd_depth");
  s_trace = intern("trace");
  s_dist_info = intern("dist_info");
  s_content_hits = intern("_content_hits");
  s_pg_cache = intern("_pg_cache");
  s_ddp_modules = intern("ddp_modules");
  s_data = intern("data");
  s_works = intern("_works");
  s_lock = intern("_lock");
  s_seq = intern("seq");
  s_bucket = intern("bucket");
  s_window_activity = intern("_window_activity");
  s_sink = intern("sink");
  s_buffer = intern("buffer");
  s_poll_works = intern("poll_works");
  s_acquire = intern("acquire");
  s_release = intern("release");
  v_coll = intern("coll");
  v_all_reduce = intern("all_reduce");
  v_allreduce_ = intern("allreduce_");
  v_backward = intern("backward");
  v_ddp = intern("ddp");
  v_torch = intern("torch");
  v_empty = intern("");
}

void clear_target() {
  g_enabled.store(false, std::memory_order_release);
  Py_CLEAR(g_target.recorder);
  Py_CLEAR(g_target.engine_code);
  Py_CLEAR(g_target.unbox_work);
}

// The recorder the kernel records for (None: every call goes to the Python kernel).
void set_target(py::object recorder, py::object engine_code, py::object unbox_work,
                int64_t clock_offset) {
  init_names();
  clear_target();
  if (recorder.is_none()) {
    return;
  }
  g_target.recorder = recorder.inc_ref().ptr();
  g_target.engine_code = engine_code.inc_ref().ptr();
  g_target.unbox_work = unbox_work.inc_ref().ptr();
  g_target.clock_offset = clock_offset;
  g_enabled.store(true, std::memory_order_release);
}

// Each torch.dtype's name as events write it ("float32"), from Python's str(dtype).
void set_dtype_names(py::dict names) {
  for (auto item : names) {
    PyObject* dtype = item.first.ptr();
    if (!THPDtype_Check(dtype) || !PyUnicode_Check(item.second.ptr())) {
      continue;
    }
    auto index = static_cast<size_t>(reinterpret_cast<THPDtype*>(dtype)->scalar_type);
    if (index < g_dtype_names.size() && g_dtype_names[index] == nullptr) {
      g_dtype_names[index] = item.second.inc_ref().ptr();
    }
  }
}

// Off while an unrecorded() block is open in any thread (its collectives are nobody's).
void set_enabled(bool enabled) {
  g_enabled.store(enabled && g_target.recorder != nullptr, std::memory_order_release);
}

void register_kernel() {
  if (g_library) {
    return;
  }
  g_library = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d",
                                               c10::DispatchKey::Autograd, __FILE__, __LINE__);
  g_library->impl("allreduce_", torch::CppFunction::makeFromBoxedFunction<&kernel>());
}

void unregister_kernel() {
  clear_target();
  g_library.reset();
}

bool registered() {
  return static_cast<bool>(g_library);
}

int64_t recorded() {
  return g_recorded.load(std::memory_order_relaxed);
}

// The fingerprint's samples of one share of an optimizer's gradients (see
// syncscope/capture/fingerprint.py): for each parameter, its gradient's elements
// offset + i * step (i < size; step 0: the whole gradient), copied into one new tensor, byte
// for byte what torch.cat of the as_strided views makes, without a dispatcher call per view.
// take() returns None where the Python path must decide: a gradient missing, sparse, a
// tensor subclass (DTensor), not contiguous, of another size, not on the CPU, needing grad,
// with a lazy conjugate or negative bit, or not all float32 or all float64.
class GradSampler {
 public:
  GradSampler(std::vector<at::Tensor> params, std::vector<int64_t> sizes,
              std::vector<int64_t> steps)
      : params_(std::move(params)), sizes_(std::move(sizes)), steps_(std::move(steps)) {
    TORCH_CHECK(params_.size() == sizes_.size() && params_.size() == steps_.size(),
                "GradSampler: one size and one step per parameter");
    for (size_t i = 0; i < params_.size(); ++i) {
      numels_.push_back(params_[i].numel());
      // every sample within the parameter: take() then only checks the gradient's size
      TORCH_CHECK(sizes_[i] >= 0 && steps_[i] >= 0 &&
                      (sizes_[i] == 0 || (sizes_[i] - 1) * std::max<int64_t>(steps_[i], 1) <
                                             numels_[i]),
                  "GradSampler: a sample beyond its parameter");
    }
  }

  std::optional<at::Tensor> take() const {
    if (params_.empty()) {
      return std::nullopt;
    }
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    int64_t total = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& g = params_[i].grad();
      if (!g.defined() || g.layout() != c10::kStrided || !g.is_cpu() || g.requires_grad() ||
          g.is_conj() || g.is_neg() || g.key_set().has(c10::DispatchKey::Python) ||
          g.numel() != numels_[i] || !g.is_contiguous()) {
        return std::nullopt;
      }
      c10::ScalarType type = g.scalar_type();
      if ((type != c10::ScalarType::Float && type != c10::ScalarType::Double) ||
          (dtype != c10::ScalarType::Undefined && type != dtype)) {
        return std::nullopt;
      }
      dtype = type;
      total += sizes_[i];
    }
    at::Tensor out = at::empty({total}, at::TensorOptions().dtype(dtype));
    if (dtype == c10::ScalarType::Float) {
      gather<float>(out);
    } else {
      gather<double>(out);
    }
    return out;
  }

 private:
  template <typename T>
  void gather(at::Tensor& out) const {
    T* dst = out.data_ptr<T>();
    for (size_t i = 0; i < params_.size(); ++i) {
      const T* src = params_[i].grad().const_data_ptr<T>();
      int64_t size = sizes_[i];
      int64_t step = steps_[i] > 0 ? steps_[i] : 1;
      if (step == 1) {
        std::memcpy(dst, src, static_cast<size_t>(size) * sizeof(T));
      } else {
        for (int64_t j = 0; j < size; ++j) {
          dst[j] = src[j * step];
        }
      }
      dst += size;
    }
  }

  std::vector<at::Tensor> params_;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> steps_;
  std::vector<int64_t> numels_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_kernel", &register_kernel);
  m.def("unregister_kernel", &unregister_kernel);
  m.def("registered", &registered);
  m.def("recorded", &recorded);
  m.def("set_target", &set_target);
  m.def("set_enabled", &set_enabled);
  m.def("set_dtype_names", &set_dtype_names);
  py::class_<GradSampler>(m, "GradSampler")
      .def(py::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<int64_t>>())
      .def("take", &GradSampler::take);
}
