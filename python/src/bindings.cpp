// gdn_testbed._core: the C++ core of gdn-testbed for Python (pybind11). Every concept is the
// C++ one: the Problem and its validation, the generator and case spaces, the references and
// emulations, the oracle's metrics, budgets and verdicts, case files, the fuzz campaign and the
// shrinker. This file only converts: numpy arrays (float64, or long double for the f80
// references) to and from HostTensor, JSON between nlohmann::json and Python (as text: the
// Python layer parses it with json.loads), and a Python kernel into a gdn::Implementation.
// The Python-facing API (argument names, defaults, torch) lives in python/gdn_testbed/.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/campaign.hpp"
#include "cli/judge_file.hpp"
#include "cli/output.hpp"
#include "cli/registry_all.hpp"
#include "cli/shrink.hpp"
#include "core/implementation.hpp"
#include "core/problem.hpp"
#include "fuzz/backward_properties.hpp"
#include "fuzz/sample.hpp"
#include "oracle/backward_budget.hpp"
#include "oracle/budget.hpp"
#include "oracle/case_file.hpp"
#include "oracle/metrics.hpp"
#include "reference/backward.hpp"
#include "reference/backward_chunked.hpp"
#include "reference/chunked.hpp"
#include "reference/emulate.hpp"
#include "reference/operand_model.hpp"
#include "reference/precision.hpp"
#include "reference/sequential.hpp"

namespace py = pybind11;
using namespace gdn;

namespace {

// ---- errors ---------------------------------------------------------------------------------

// gdn_testbed.ProblemError(ValueError): argument and rule as attributes.
PyObject* g_problem_error = nullptr;

[[noreturn]] void value_error(const std::string& message) { throw py::value_error(message); }

// ---- JSON <-> Python (through text; the Python layer turns it into dicts) -------------------

py::object json_to_py(const nlohmann::json& j) {
  // Leaked on purpose: a static py::object would be released after the interpreter is gone.
  static py::object* loads = new py::object(py::module_::import("json").attr("loads"));
  return (*loads)(cli::dump_json(j, -1));
}

nlohmann::json py_to_json(const py::handle& object) {
  static py::object* dumps = new py::object(py::module_::import("json").attr("dumps"));
  const std::string text = py::str((*dumps)(object, py::arg("allow_nan") = false));
  return nlohmann::json::parse(text);
}

// ---- enums as the names the case files use --------------------------------------------------

DType dtype_of(const std::string& text, const char* argument) {
  DType d;
  if (!parse_dtype(text, &d)) value_error(std::string(argument) + " must be f64, f32, bf16 or f16, got '" + text + "'");
  return d;
}

Formulation formulation_of(const std::string& text) {
  if (text == "chunked") return Formulation::chunked;
  if (text == "sequential") return Formulation::sequential;
  value_error("formulation must be 'chunked' or 'sequential', got '" + text + "'");
}

const char* formulation_name(Formulation f) { return f == Formulation::chunked ? "chunked" : "sequential"; }

oracle::BudgetOptions budget_of(const std::string& text) {
  oracle::BudgetOptions b;
  std::string error;
  if (!oracle::parse_budget(text, &b, &error)) value_error("budget: " + error);
  return b;
}

// ---- arrays ---------------------------------------------------------------------------------

template <class T>
py::array_t<T> to_numpy(const HostTensor<T>& t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  py::array_t<T> a(shape);
  if (t.numel() > 0) std::memcpy(a.mutable_data(), t.data(), sizeof(T) * static_cast<std::size_t>(t.numel()));
  return a;
}

template <class T>
py::object to_numpy_or_none(const HostTensor<T>& t) {
  if (!t.defined()) return py::none();
  return to_numpy(t);
}

// Any array-like that converts to float64 without loss of meaning (numpy does the conversion).
HostTensor<double> tensor_from(const std::string& name, const py::handle& object) {
  py::array_t<double, py::array::c_style | py::array::forcecast> a;
  try {
    a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(object);
  } catch (const py::error_already_set&) {
  }
  if (!a) value_error("'" + name + "' must be an array of numbers (numpy, or a torch tensor through gdn_testbed)");
  Shape shape(a.shape(), a.shape() + a.ndim());
  if (shape.empty()) value_error("'" + name + "' must have at least one axis, got a scalar");
  HostTensor<double> t(shape);
  if (t.numel() > 0) std::memcpy(t.data(), a.data(), sizeof(double) * static_cast<std::size_t>(t.numel()));
  return t;
}

template <class T>
py::dict outputs_to_py(const Outputs<T>& o) {
  py::dict d;
  d["o"] = to_numpy_or_none(o.o);
  d["hT"] = to_numpy_or_none(o.hT);
  d["intermediate"] = to_numpy_or_none(o.intermediate);
  return d;
}

// {"o": ..., "hT": ..., "intermediate": ...}; None or absent entries stay undefined.
Outputs<double> outputs_from_py(const py::handle& object) {
  if (!py::isinstance<py::dict>(object)) value_error("outputs must be a dict with 'o' (and 'hT', 'intermediate')");
  py::dict d = py::reinterpret_borrow<py::dict>(object);
  Outputs<double> out;
  for (auto item : d) {
    const std::string key = py::str(item.first);
    if (key != "o" && key != "hT" && key != "intermediate")
      value_error("outputs: unknown key '" + key + "' (expected o, hT, intermediate)");
    if (item.second.is_none()) continue;
    HostTensor<double> t = tensor_from(key, item.second);
    if (key == "o") out.o = std::move(t);
    else if (key == "hT") out.hT = std::move(t);
    else out.intermediate = std::move(t);
  }
  if (!out.o.defined()) value_error("outputs: 'o' is required");
  return out;
}

py::dict inputs_to_py(const Problem& p, const Inputs& in) {
  py::dict d;
  d["cu_seqlens"] = py::array_t<std::int64_t>(static_cast<py::ssize_t>(p.cu_seqlens.size()), p.cu_seqlens.data());
  d["q"] = to_numpy(in.q);
  d["k"] = to_numpy(in.k);
  d["v"] = to_numpy(in.v);
  auto put = [&](const char* name, const HostTensor<double>& t) {
    if (t.defined()) d[name] = to_numpy(t);
  };
  put(p.decay_name(), in.g);  // "alpha" with linear gates
  put("beta", in.beta);
  put("a", in.a);
  put("b", in.b);
  put("A_log", in.A_log);
  put("dt_bias", in.dt_bias);
  put("h0", in.h0);
  if (p.uses_state_cache())
    d["state_indices"] = py::array_t<std::int32_t>(static_cast<py::ssize_t>(in.state_indices.size()),
                                                   in.state_indices.data());
  return d;
}

// The storage dtype of each input (the case-file format's: docs/case_files.md).
DType input_storage_dtype(const Problem& p, const std::string& name) {
  if (name == "q" || name == "k" || name == "v") return p.input_dtype;
  if (name == "g" || name == "alpha" || name == "beta" || name == "a" || name == "b") return p.gate_dtype;
  if (name == "h0") return p.state_dtype;
  return DType::f32;  // A_log, dt_bias
}

// Validates against the problem (shapes, finiteness, indices: gdn::validate) and checks that
// every value is exactly representable in its storage dtype (the Inputs contract: references,
// emulations and kernels must all see the same numbers).
Inputs inputs_from_py(const Problem& p, const py::handle& object) {
  if (!py::isinstance<py::dict>(object)) value_error("inputs must be a dict of arrays (q, k, v, g, beta, ...)");
  py::dict d = py::reinterpret_borrow<py::dict>(object);
  Inputs in;
  for (auto item : d) {
    const std::string key = py::str(item.first);
    if (item.second.is_none()) continue;
    if (key == "cu_seqlens") {
      const auto cu = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(item.second);
      if (!cu || cu.ndim() != 1 || std::vector<std::int64_t>(cu.data(), cu.data() + cu.size()) != p.cu_seqlens)
        throw ProblemError("cu_seqlens", "the inputs' cu_seqlens must equal the problem's");
      continue;
    }
    if (key == "state_indices") {
      const auto idx = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(item.second);
      if (!idx || idx.ndim() != 1) throw ProblemError("state_indices", "must be a 1-D array of integers");
      for (py::ssize_t i = 0; i < idx.size(); ++i) {
        const std::int64_t x = idx.data()[i];
        if (x < INT32_MIN || x > INT32_MAX) throw ProblemError("state_indices", "values must fit int32");
        in.state_indices.push_back(static_cast<std::int32_t>(x));
      }
      continue;
    }
    // The direct decay is "g", or "alpha" with linear gates: the other name is refused, so a
    // log-space g is never read as alpha (or the reverse).
    if ((key == "g" || key == "alpha") && key != p.decay_name())
      throw ProblemError(key, std::string("this problem's decay tensor is '") + p.decay_name() + "' (gate_space " +
                                  gate_space_name(p.gate_space) + ", gate_mode " +
                                  (p.gate_mode == GateMode::direct ? "direct" : "fused") + ")");
    HostTensor<double>* slot = key == "q"         ? &in.q
                               : key == "k"       ? &in.k
                               : key == "v"       ? &in.v
                               : key == "g"       ? &in.g
                               : key == "alpha"   ? &in.g
                               : key == "beta"    ? &in.beta
                               : key == "a"       ? &in.a
                               : key == "b"       ? &in.b
                               : key == "A_log"   ? &in.A_log
                               : key == "dt_bias" ? &in.dt_bias
                               : key == "h0"      ? &in.h0
                                                  : nullptr;
    if (slot == nullptr)
      value_error("inputs: unknown tensor '" + key +
                  "' (expected q, k, v, g or alpha, beta, a, b, A_log, dt_bias, h0, state_indices, cu_seqlens)");
    *slot = tensor_from(key, item.second);
  }
  validate(p, in);
  for (const char* name : {"q", "k", "v", "g", "beta", "a", "b", "A_log", "dt_bias", "h0"}) {
    const std::string n = name;
    const HostTensor<double>& t = n == "q"       ? in.q
                                  : n == "k"     ? in.k
                                  : n == "v"     ? in.v
                                  : n == "g"     ? in.g
                                  : n == "beta"  ? in.beta
                                  : n == "a"     ? in.a
                                  : n == "b"     ? in.b
                                  : n == "A_log" ? in.A_log
                                  : n == "dt_bias" ? in.dt_bias
                                                   : in.h0;
    const std::string shown = n == "g" ? std::string(p.decay_name()) : n;
    const DType dtype = input_storage_dtype(p, shown);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const double x = t[i];
      if (std::isfinite(x) && reference::round_to(dtype, x) != x)
        throw ProblemError(shown, std::string("must hold values exactly representable in ") + dtype_name(dtype) +
                                  " (its storage dtype); element " + index_string(t.shape(), i) + " is " +
                                  std::to_string(x) + " (round it first: gdn_testbed.round_to)");
    }
  }
  return in;
}

// ---- the Problem ----------------------------------------------------------------------------

Problem problem_from_py_dict(const py::handle& d) {
  try {
    return oracle::problem_from_json(py_to_json(d));
  } catch (const oracle::CaseFileError& e) {
    value_error(std::string("problem: ") + e.what());
  }
}

// ---- fuzz: a Python kernel as an Implementation ---------------------------------------------

// Calls back into the Python kernel object (gdn_testbed.kernel.Kernel): its _gdn_run(problem,
// inputs dict of float64 arrays) returns the outputs dict of float64 arrays, its
// _gdn_supports(problem) None or the reason it does not support the problem. An exception in
// supports() is reported by run() (an ERROR verdict naming it), since evaluate() asks supports()
// outside its error handling.
class PythonImplementation final : public Implementation {
 public:
  PythonImplementation(py::object kernel, std::string name, Formulation formulation, int chunk_size,
                       bool deterministic)
      : kernel_(std::move(kernel)),
        name_(std::move(name)),
        formulation_(formulation),
        chunk_size_(chunk_size),
        deterministic_(deterministic) {}
  ~PythonImplementation() override {
    py::gil_scoped_acquire gil;
    kernel_ = py::object();
  }
  std::string name() const override { return name_; }
  Formulation formulation() const override { return formulation_; }
  int chunk_size() const override { return chunk_size_; }
  bool deterministic() const override { return deterministic_; }
  bool supports(const Problem& problem, std::string* why) const override {
    py::gil_scoped_acquire gil;
    supports_error_.clear();
    try {
      py::object reason = kernel_.attr("_gdn_supports")(problem);
      if (reason.is_none()) return true;
      if (why) *why = py::str(reason);
      return false;
    } catch (const py::error_already_set& e) {
      supports_error_ = std::string("supports() raised: ") + e.what();
      return true;
    }
  }
  Outputs<double> run(const Problem& problem, const Inputs& inputs) override {
    py::gil_scoped_acquire gil;
    if (!supports_error_.empty()) throw std::runtime_error(supports_error_);
    py::object result = kernel_.attr("_gdn_run")(problem, inputs_to_py(problem, inputs));
    return outputs_from_py(result);
  }

 private:
  py::object kernel_;
  std::string name_;
  Formulation formulation_;
  int chunk_size_;
  bool deterministic_;
  mutable std::string supports_error_;
};

// Ctrl-C during a campaign: the first finishes the case (and stops a shrink) and ends the run
// with its failures saved and its summary written, as gdn-testbed fuzz does; the second leaves
// at once. Python's own handler is put back when the campaign ends.
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) {
  if (g_interrupted.load()) std::_Exit(130);
  g_interrupted.store(true);
}

struct SignalGuard {
  using Handler = void (*)(int);
  Handler previous_int, previous_term;
  SignalGuard() {
    g_interrupted.store(false);
    previous_int = std::signal(SIGINT, on_interrupt);
    previous_term = std::signal(SIGTERM, on_interrupt);
  }
  ~SignalGuard() {
    std::signal(SIGINT, previous_int == SIG_ERR ? SIG_DFL : previous_int);
    std::signal(SIGTERM, previous_term == SIG_ERR ? SIG_DFL : previous_term);
  }
};

template <class T>
T get_or(const py::dict& d, const char* key, T fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  return d[key].cast<T>();
}

// options: seed, seconds, cases, out, budget (str or None), shrink, max_failures,
// stop_at_first, progress, space (JSON text), command, binary, shrink_evaluations,
// shrink_seconds, results (path or None).
py::dict run_fuzz(py::object kernel, const py::dict& o) {
  oracle::RegistryEntry entry;
  std::optional<oracle::BudgetOptions> budget;
  if (!get_or<std::string>(o, "budget", "").empty()) budget = budget_of(o["budget"].cast<std::string>());
  if (py::isinstance<py::str>(kernel)) {
    const oracle::RegistryEntry* found = cli::default_registry().find(kernel.cast<std::string>());
    if (!found) value_error("kernel: no registered implementation '" + kernel.cast<std::string>() + "'");
    entry = *found;
  } else {
    const std::string name = kernel.attr("name").cast<std::string>();
    const Formulation formulation = formulation_of(kernel.attr("formulation").cast<std::string>());
    const int chunk_size = kernel.attr("chunk_size").cast<int>();
    const bool deterministic = kernel.attr("deterministic").cast<bool>();
    entry.name = name;
    entry.description = "Python kernel";
    entry.make = [kernel, name, formulation, chunk_size, deterministic] {
      py::gil_scoped_acquire gil;
      return std::make_unique<PythonImplementation>(kernel, name, formulation, chunk_size, deterministic);
    };
  }
  const fuzz::CaseSpace space = fuzz::case_space_from_json(nlohmann::json::parse(o["space"].cast<std::string>()));
  cli::FuzzOptions options;
  options.implementations = {&entry};
  options.budget = budget;
  options.seed = get_or<std::uint64_t>(o, "seed", 1);
  options.seconds = get_or<double>(o, "seconds", 0.0);
  options.cases = get_or<std::int64_t>(o, "cases", 0);
  options.out_dir = get_or<std::string>(o, "out", "gdn-fuzz-out");
  options.shrink = get_or<bool>(o, "shrink", true);
  options.max_saved_failures = get_or<int>(o, "max_failures", 10);
  options.stop_at_first_failure = get_or<bool>(o, "stop_at_first", false);
  options.shrink_options.max_evaluations = get_or<int>(o, "shrink_evaluations", 400);
  options.shrink_options.max_seconds = get_or<double>(o, "shrink_seconds", 20.0);
  options.progress = get_or<bool>(o, "progress", true) ? &std::cerr : nullptr;
  options.command = get_or<std::string>(o, "command", "");
  options.binary = get_or<std::string>(o, "binary", "python3 -m gdn_testbed");
  options.generator = [space](std::uint64_t seed) { return fuzz::sample_case(seed, space); };
  options.interrupted = &g_interrupted;
  if (options.seconds <= 0 && options.cases <= 0) value_error("fuzz needs a limit: seconds > 0 or cases > 0");

  cli::FuzzResult result;
  {
    SignalGuard guard;
    result = cli::run_fuzz(options);
  }
  const nlohmann::json json = result.to_json(options);
  const std::string results = get_or<std::string>(o, "results", "");
  if (!results.empty()) cli::write_text_file(results, cli::dump_json(json));
  py::dict out;
  out["json"] = json_to_py(json);
  py::list verdicts, originals;
  for (const cli::FuzzFailure& f : result.failures) {
    verdicts.append(f.verdict);
    originals.append(f.original_verdict);
  }
  out["verdicts"] = verdicts;
  out["original_verdicts"] = originals;
  return out;
}

// ---- chunk traces ---------------------------------------------------------------------------

template <class Scalar>
py::array_t<Scalar> matrix_to_numpy(const reference::Matrix<Scalar>& m) {
  py::array_t<Scalar> a({static_cast<py::ssize_t>(m.rows()), static_cast<py::ssize_t>(m.cols())});
  if (m.size() > 0) std::memcpy(a.mutable_data(), m.data(), sizeof(Scalar) * static_cast<std::size_t>(m.size()));
  return a;
}

template <class Scalar>
py::list trace_to_py(const reference::ChunkTrace<Scalar>& trace) {
  py::list records;
  for (const auto& r : trace.records) {
    py::dict d;
    d["sequence"] = r.sequence;
    d["head"] = r.head;
    d["chunk"] = r.chunk;
    d["begin"] = r.begin;
    d["length"] = r.length;
    py::array_t<Scalar> gamma(static_cast<py::ssize_t>(r.gamma.size()));
    for (Eigen::Index i = 0; i < r.gamma.size(); ++i) gamma.mutable_data()[i] = r.gamma(i);
    d["gamma"] = gamma;
    d["A"] = matrix_to_numpy(r.A);
    d["T"] = matrix_to_numpy(r.T);
    d["W"] = matrix_to_numpy(r.W);
    d["U"] = matrix_to_numpy(r.U);
    d["Vnew"] = matrix_to_numpy(r.Vnew);
    d["S0"] = matrix_to_numpy(r.S0);
    d["S_end"] = matrix_to_numpy(r.S_end);
    records.append(d);
  }
  return records;
}

template <class Scalar>
py::object chunked_impl(const Problem& p, const Inputs& in, int chunk_size, bool trace) {
  if (!trace) return outputs_to_py(reference::chunked<Scalar>(p, in, chunk_size));
  reference::ChunkTrace<Scalar> t;
  auto out = reference::chunked<Scalar>(p, in, chunk_size, &t);
  return py::make_tuple(outputs_to_py(out), trace_to_py(t));
}

// ---- case files -----------------------------------------------------------------------------

template <class T>
py::dict gradients_to_py(const Gradients<T>& g);
Gradients<double> gradients_from_py(const py::handle& object);
py::dict backward_to_py(const BackwardInputs& b);

// {"dO": ..., "dhT": ... or None} as a case file holds them: the rules are the writer's
// (encode_case refuses what the reader would, with the case file's words).
BackwardInputs case_backward_from_py(const py::handle& object) {
  if (!py::isinstance<py::dict>(object)) value_error("backward must be a dict with 'dO' (and 'dhT')");
  BackwardInputs b;
  for (auto item : py::reinterpret_borrow<py::dict>(object)) {
    const std::string key = py::str(item.first);
    if (key != "dO" && key != "dhT") value_error("backward: unknown key '" + key + "' (expected dO, dhT)");
    if (!item.second.is_none()) (key == "dO" ? b.dO : b.dhT) = tensor_from(key, item.second);
  }
  if (!b.dO.defined()) value_error("backward: 'dO' is required");
  return b;
}

py::dict case_file_to_py(const oracle::CaseFile& c) {
  py::dict d;
  d["problem"] = c.problem;
  d["inputs"] = inputs_to_py(c.problem, c.inputs);
  d["outputs"] = c.outputs ? py::object(outputs_to_py(*c.outputs)) : py::object(py::none());
  d["metadata"] = py::cast(c.metadata);
  py::dict settings;
  settings["formulation"] = formulation_name(c.settings.formulation);
  settings["chunk_size"] = c.settings.chunk_size;
  settings["budget"] = c.settings.budget ? py::object(py::str(c.settings.budget->describe())) : py::object(py::none());
  d["settings"] = settings;
  d["backward"] = c.backward ? py::object(backward_to_py(*c.backward)) : py::object(py::none());
  d["gradients"] = c.gradients ? py::object(gradients_to_py(*c.gradients)) : py::object(py::none());
  return d;
}

oracle::CaseFile case_file_from_py(const Problem& p, const py::handle& inputs, const py::handle& outputs,
                                   const std::map<std::string, std::string>& metadata,
                                   const py::handle& backward, const py::handle& gradients) {
  oracle::CaseFile c;
  c.problem = p;
  c.inputs = inputs_from_py(p, inputs);
  if (!outputs.is_none()) c.outputs = outputs_from_py(outputs);
  c.metadata = metadata;
  if (!backward.is_none()) c.backward = case_backward_from_py(backward);
  if (!gradients.is_none()) c.gradients = gradients_from_py(gradients);
  return c;
}

oracle::CaseLimits limits_of(std::uint64_t max_bytes, std::uint64_t max_work) {
  oracle::CaseLimits l;
  if (max_bytes) l.max_bytes = max_bytes;
  if (max_work) l.max_work = max_work;
  return l;
}

const oracle::RegistryEntry* find_entry(const std::string& name) { return cli::default_registry().find(name); }

// ---- the backward ---------------------------------------------------------------------------

template <class T>
py::dict gradients_to_py(const Gradients<T>& g) {
  py::dict d;
  g.for_each([&](const char* name, const HostTensor<T>& t) {
    if (t.defined()) d[name] = to_numpy(t);
  });
  return d;
}

// {"dq": ..., "dk": ..., ...}: None entries stay undefined; unknown keys are an error.
Gradients<double> gradients_from_py(const py::handle& object) {
  if (!py::isinstance<py::dict>(object))
    value_error("gradients must be a dict of arrays (dq, dk, dv, dg, dbeta, da, db, dA_log, ddt_bias, dh0)");
  py::dict d = py::reinterpret_borrow<py::dict>(object);
  Gradients<double> g;
  for (auto item : d) {
    const std::string key = py::str(item.first);
    bool known = false;
    g.for_each([&](const char* name, HostTensor<double>& t) {
      if (key != name) return;
      known = true;
      if (!item.second.is_none()) t = tensor_from(key, item.second);
    });
    if (!known)
      value_error("gradients: unknown key '" + key + "' (expected dq, dk, dv, dg, dbeta, da, db, dA_log, ddt_bias, dh0)");
  }
  return g;
}

// {"dO": ..., "dhT": ... or None}, checked (validate_backward_inputs: shapes, scope, dO
// representable in the input dtype, dhT in fp32).
BackwardInputs backward_from_py(const Problem& p, const Inputs& in, const py::handle& object) {
  if (!py::isinstance<py::dict>(object)) value_error("backward must be a dict with 'dO' (and 'dhT')");
  py::dict d = py::reinterpret_borrow<py::dict>(object);
  BackwardInputs b;
  for (auto item : d) {
    const std::string key = py::str(item.first);
    if (key != "dO" && key != "dhT") value_error("backward: unknown key '" + key + "' (expected dO, dhT)");
    if (item.second.is_none()) continue;
    (key == "dO" ? b.dO : b.dhT) = tensor_from(key, item.second);
  }
  oracle::validate_backward_inputs(p, in, b);
  return b;
}

py::dict backward_to_py(const BackwardInputs& b) {
  py::dict d;
  d["dO"] = to_numpy_or_none(b.dO);
  d["dhT"] = to_numpy_or_none(b.dhT);
  return d;
}

template <class Scalar>
py::object sequential_backward_impl(const Problem& p, const Inputs& in, const BackwardInputs& b, bool magnitudes) {
  if (!magnitudes) return gradients_to_py(reference::sequential_backward<Scalar>(p, in, b));
  Gradients<Scalar> m;
  Gradients<Scalar> g = reference::sequential_backward<Scalar>(p, in, b, &m);
  return py::make_tuple(gradients_to_py(g), gradients_to_py(m));
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "gdn-testbed's C++ core (use the gdn_testbed package, not this module)";

  static py::exception<ProblemError> problem_error(m, "ProblemError", PyExc_ValueError);
  g_problem_error = problem_error.ptr();
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ProblemError& e) {
      py::object error = py::reinterpret_borrow<py::object>(g_problem_error)(e.what());
      error.attr("argument") = e.argument();
      error.attr("rule") = e.rule();
      PyErr_SetObject(g_problem_error, error.ptr());
    } catch (const oracle::CaseFileError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  // ---- Problem ----
  py::class_<Problem>(m, "Problem", "One gated-delta-rule problem (core/problem.hpp); validate() is the one check.",
                     py::module_local())
      .def(py::init<>())
      .def_readwrite("cu_seqlens", &Problem::cu_seqlens)
      .def_readwrite("T", &Problem::T)
      .def_readwrite("H", &Problem::H)
      .def_readwrite("HV", &Problem::HV)
      .def_readwrite("K", &Problem::K)
      .def_readwrite("V", &Problem::V)
      .def_readwrite("scale", &Problem::scale)
      .def_readwrite("use_qk_l2norm", &Problem::use_qk_l2norm)
      .def_readwrite("has_h0", &Problem::has_h0)
      .def_readwrite("has_hT", &Problem::has_hT)
      .def_readwrite("state_slots", &Problem::state_slots)
      .def_readwrite("store_intermediate_states", &Problem::store_intermediate_states)
      .def_readwrite("allow_negative_eigenvalues", &Problem::allow_negative_eigenvalues)
      .def_property(
          "state_layout", [](const Problem& p) { return std::string(state_layout_name(p.state_layout)); },
          [](Problem& p, const std::string& s) {
            if (s == "k_major") p.state_layout = StateLayout::k_major;
            else if (s == "v_major") p.state_layout = StateLayout::v_major;
            else value_error("state_layout must be 'k_major' or 'v_major', got '" + s + "'");
          })
      .def_property(
          "input_dtype", [](const Problem& p) { return std::string(dtype_name(p.input_dtype)); },
          [](Problem& p, const std::string& s) { p.input_dtype = dtype_of(s, "input_dtype"); })
      .def_property(
          "gate_dtype", [](const Problem& p) { return std::string(dtype_name(p.gate_dtype)); },
          [](Problem& p, const std::string& s) { p.gate_dtype = dtype_of(s, "gate_dtype"); })
      .def_property(
          "state_dtype", [](const Problem& p) { return std::string(dtype_name(p.state_dtype)); },
          [](Problem& p, const std::string& s) { p.state_dtype = dtype_of(s, "state_dtype"); })
      .def_property(
          "gate_space", [](const Problem& p) { return std::string(gate_space_name(p.gate_space)); },
          [](Problem& p, const std::string& s) {
            if (!parse_gate_space(s, &p.gate_space)) value_error("gate_space must be 'log' or 'linear', got '" + s + "'");
          })
      .def_property_readonly("decay_name", &Problem::decay_name,
                             "The direct decay tensor's name: 'g', or 'alpha' with linear gates.")
      .def_property(
          "gate_mode", [](const Problem& p) { return std::string(p.gate_mode == GateMode::fused ? "fused" : "direct"); },
          [](Problem& p, const std::string& s) {
            if (s == "direct") p.gate_mode = GateMode::direct;
            else if (s == "fused") p.gate_mode = GateMode::fused;
            else value_error("gate_mode must be 'direct' or 'fused', got '" + s + "'");
          })
      .def_property_readonly("N", &Problem::N)
      .def_property_readonly("group_size", &Problem::group_size)
      .def_property_readonly("effective_scale", &Problem::effective_scale)
      .def_property_readonly("uses_state_cache", &Problem::uses_state_cache)
      .def("seq_len", &Problem::seq_len)
      .def("seq_begin", &Problem::seq_begin)
      .def_property_readonly("q_shape", &Problem::q_shape)
      .def_property_readonly("v_shape", &Problem::v_shape)
      .def_property_readonly("gate_shape", &Problem::gate_shape)
      .def_property_readonly("head_param_shape", &Problem::head_param_shape)
      .def_property_readonly("state_shape", &Problem::state_shape)
      .def_property_readonly("intermediate_shape", &Problem::intermediate_shape)
      .def("validate", &Problem::validate, "Raises ProblemError (argument, rule) on the first broken rule.")
      .def("describe", &Problem::describe)
      .def("__repr__", [](const Problem& p) { return "Problem(" + p.describe() + ")"; })
      .def("to_json", [](const Problem& p) { return oracle::problem_to_json(p).dump(); },
           "The case file's gdn.problem object (docs/case_files.md) as JSON text.")
      .def("__copy__", [](const Problem& p) { return p; })
      .def("__deepcopy__", [](const Problem& p, py::dict) { return p; })
      .def("__eq__", [](const Problem& a, const Problem& b) {
        return oracle::problem_to_json(a) == oracle::problem_to_json(b);
      });
  m.def("problem_from_dict", &problem_from_py_dict,
        "Strict: every key of the case file's gdn.problem, types checked, then validate().");

  // ---- inputs, generator, spaces ----
  m.def("validate_inputs", [](const Problem& p, const py::dict& inputs) { return inputs_to_py(p, inputs_from_py(p, inputs)); },
        "Checks inputs against the problem (shapes, finiteness, indices, representability); returns them as float64.");
  m.def("round_to", [](const std::string& dtype, py::array_t<double, py::array::c_style | py::array::forcecast> a) {
    const DType d = dtype_of(dtype, "dtype");
    py::array_t<double> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
    for (py::ssize_t i = 0; i < a.size(); ++i) out.mutable_data()[i] = reference::round_to(d, a.data()[i]);
    return out;
  });
  // Every option, zero_key_tail too (to_json leaves it out at 0, as case files written before it).
  m.def("default_input_options", [] {
    nlohmann::json j = fuzz::to_json(fuzz::InputOptions{});
    j["zero_key_tail"] = fuzz::InputOptions{}.zero_key_tail;
    return j.dump();
  });
  m.def("make_inputs", [](const Problem& p, const std::string& options, std::uint64_t seed) {
    p.validate();
    const fuzz::InputOptions o = fuzz::input_options_from_json(nlohmann::json::parse(options));
    return inputs_to_py(p, fuzz::make_inputs(p, o, seed));
  });
  m.def("space_normalize", [](const std::string& text) {
    return fuzz::to_json(fuzz::case_space_from_json(nlohmann::json::parse(text))).dump();
  });
  m.def("draw_case", [](std::uint64_t seed, const std::string& space) {
    const fuzz::Case c = fuzz::draw_case(seed, fuzz::case_space_from_json(nlohmann::json::parse(space)));
    return py::make_tuple(c.problem, fuzz::to_json(c.options).dump(), c.seed);
  });
  m.def("sample_case", [](std::uint64_t seed, const std::string& space) {
    const fuzz::GeneratedCase g = fuzz::sample_case(seed, fuzz::case_space_from_json(nlohmann::json::parse(space)));
    return py::make_tuple(g.problem, inputs_to_py(g.problem, g.inputs), g.generator.dump());
  });
  m.def("case_seed", &cli::case_seed);

  // ---- references and emulations ----
  m.def("sequential", [](const Problem& p, const py::dict& inputs, const std::string& precision) -> py::object {
    const Inputs in = inputs_from_py(p, inputs);
    if (precision == "f64") return outputs_to_py(reference::sequential<double>(p, in));
    if (precision == "f80") return outputs_to_py(reference::sequential<long double>(p, in));
    if (precision == "f32") return outputs_to_py(reference::sequential<float>(p, in));
    value_error("precision must be f64, f80 or f32, got '" + precision + "'");
  });
  m.def("chunked", [](const Problem& p, const py::dict& inputs, int chunk_size, const std::string& precision,
                      bool trace) -> py::object {
    if (chunk_size < 1) value_error("chunk_size must be >= 1, got " + std::to_string(chunk_size));
    const Inputs in = inputs_from_py(p, inputs);
    if (precision == "f64") return chunked_impl<double>(p, in, chunk_size, trace);
    if (precision == "f80") return chunked_impl<long double>(p, in, chunk_size, trace);
    if (precision == "f32") return chunked_impl<float>(p, in, chunk_size, trace);
    value_error("precision must be f64, f80 or f32, got '" + precision + "'");
  });
  m.def("emulate", [](const Problem& p, const py::dict& inputs, const std::string& formulation, int chunk_size) {
    if (chunk_size < 1) value_error("chunk_size must be >= 1, got " + std::to_string(chunk_size));
    return outputs_to_py(reference::emulate(p, inputs_from_py(p, inputs), formulation_of(formulation), chunk_size));
  });
  m.def("emulate_operands", [](const Problem& p, const py::dict& inputs, const std::string& rounding) {
    reference::OperandRounding r;
    if (rounding == "split") r = reference::OperandRounding::split;
    else if (rounding == "single") r = reference::OperandRounding::single;
    else if (rounding == "split_state") r = reference::OperandRounding::split_state;
    else if (rounding == "split_state_pv") r = reference::OperandRounding::split_state_pv;
    else if (rounding == "s0_once") r = reference::OperandRounding::s0_once;
    else if (rounding == "single_qk") r = reference::OperandRounding::single_qk;
    else if (rounding == "split_all") r = reference::OperandRounding::split_all;
    else if (rounding == "split_all_p_once") r = reference::OperandRounding::split_all_p_once;
    else value_error("rounding must be split, single, split_state, split_state_pv, s0_once, single_qk, split_all or split_all_p_once, got '" + rounding + "'");
    return outputs_to_py(reference::emulate_operands(p, inputs_from_py(p, inputs), r));
  });

  // ---- oracle ----
  py::class_<oracle::Verdict>(m, "Verdict", "The oracle's verdict (oracle/budget.hpp): never a bare boolean.",
                              py::module_local())
      .def_property_readonly("status", [](const oracle::Verdict& v) { return std::string(oracle::status_name(v.status)); })
      .def_property_readonly("passed", &oracle::Verdict::passed)
      .def_property_readonly("failed", &oracle::Verdict::failed)
      .def_readonly("case_name", &oracle::Verdict::case_name)
      .def_readonly("problem", &oracle::Verdict::problem)
      .def_readonly("implementation", &oracle::Verdict::implementation)
      .def_readonly("budget", &oracle::Verdict::budget)
      .def_readonly("message", &oracle::Verdict::message)
      .def_readonly("seconds", &oracle::Verdict::seconds)
      .def_property_readonly("worst_margin", &oracle::Verdict::worst_margin)
      .def_property_readonly("worst_check",
                             [](const oracle::Verdict& v) -> py::object {
                               const oracle::Check* c = v.worst_check();
                               return c ? json_to_py(oracle::to_json(*c)) : py::none();
                             })
      .def_property_readonly("checks",
                             [](const oracle::Verdict& v) {
                               py::list l;
                               for (const auto& c : v.checks) l.append(json_to_py(oracle::to_json(c)));
                               return l;
                             })
      .def("summary", &oracle::Verdict::summary)
      .def("details", &oracle::Verdict::details)
      .def("to_json", [](const oracle::Verdict& v) { return oracle::to_json(v).dump(); },
           "The verdict as the CLI writes it (JSON text).")
      .def("__repr__", [](const oracle::Verdict& v) { return "<Verdict " + v.summary() + ">"; });

  m.def("judge", [](const Problem& p, const py::dict& inputs, const py::dict& actual, const std::string& formulation,
                    int chunk_size, const std::string& budget, const std::string& oracle_precision,
                    const std::string& case_name, const std::string& implementation) {
    const Inputs in = inputs_from_py(p, inputs);
    const Outputs<double> out = outputs_from_py(actual);
    const oracle::BudgetOptions b = budget_of(budget);
    if (oracle_precision != "f64" && oracle_precision != "f80")
      value_error("oracle must be f64 or f80, got '" + oracle_precision + "'");
    oracle::CaseContext context(case_name, p, in,
                                oracle_precision == "f80" ? oracle::CaseContext::Oracle::f80
                                                          : oracle::CaseContext::Oracle::f64);
    return oracle::evaluate_outputs(implementation, formulation_of(formulation), chunk_size, context, out, b);
  });
  m.def("judge_against", [](const Problem& p, const py::dict& inputs, const py::dict& reference, const py::dict& actual,
                            py::object baseline, const std::string& formulation, const std::string& budget,
                            int chunk_size) {
    const Inputs in = inputs_from_py(p, inputs);
    const Outputs<double> ref = outputs_from_py(reference), out = outputs_from_py(actual);
    std::optional<Outputs<double>> base;
    if (!baseline.is_none()) base = outputs_from_py(baseline);
    return oracle::judge(p, &in, ref, out, base ? &*base : nullptr, formulation_of(formulation), budget_of(budget),
                         chunk_size);
  });
  m.def("compare", [](const Problem& p, const py::dict& inputs, const std::string& tensor, py::object reference,
                      py::object actual) {
    const Inputs in = inputs_from_py(p, inputs);
    oracle::OutputTensor t;
    if (tensor == "o") t = oracle::OutputTensor::o;
    else if (tensor == "hT") t = oracle::OutputTensor::hT;
    else if (tensor == "intermediate") t = oracle::OutputTensor::intermediate;
    else value_error("tensor must be o, hT or intermediate, got '" + tensor + "'");
    return oracle::to_json(oracle::compare(p, &in, t, tensor_from("reference", reference), tensor_from("actual", actual)))
        .dump();
  });
  m.def("budget_describe", [](const std::string& text) { return budget_of(text).describe(); });
  m.def("analytic_relative_bound", [](const Problem& p, const py::dict& inputs, const std::string& formulation,
                                      int chunk_size, bool long_double) {
    return oracle::analytic_relative_bound(p, inputs_from_py(p, inputs), formulation_of(formulation), chunk_size,
                                           long_double);
  });
  m.def("max_abs_allowance", [](const std::string& budget, const Problem& p, const py::dict& inputs,
                                const py::dict& exact, const std::string& formulation, int chunk_size) {
    const oracle::Allowance a = oracle::max_abs_allowance(budget_of(budget), p, inputs_from_py(p, inputs),
                                                          outputs_from_py(exact), formulation_of(formulation), chunk_size);
    py::dict d;
    d["o"] = a.o;
    d["hT"] = a.hT;
    d["intermediate"] = a.intermediate;
    return d;
  });
  m.def("verdicts_json", [](const std::string& command, const std::vector<oracle::Verdict>& verdicts) {
    return cli::verdicts_json(command, verdicts).dump();
  });
  m.def("junit_xml", &cli::junit_xml);
  m.def("write_text_file", &cli::write_text_file, "Atomic (temporary file + rename).");

  // ---- registered implementations (the references and planted faults) ----
  m.def("implementations", [] {
    py::list l;
    for (const auto& e : cli::default_registry().entries()) {
      py::dict d;
      d["name"] = e.name;
      d["description"] = e.description;
      d["budget"] = e.default_budget.describe();
      d["gpu"] = e.gpu;
      l.append(d);
    }
    return l;
  });
  m.def("run_implementation", [](const std::string& name, const Problem& p, const py::dict& inputs) {
    const oracle::RegistryEntry* e = find_entry(name);
    if (!e) value_error("no registered implementation '" + name + "'");
    auto impl = e->make();
    return outputs_to_py(impl->run(p, inputs_from_py(p, inputs)));
  });

  // ---- case files ----
  m.def("read_case_file", [](const std::string& path, std::uint64_t max_bytes, std::uint64_t max_work) {
    return case_file_to_py(oracle::read_case_file(path, limits_of(max_bytes, max_work)));
  });
  m.def("decode_case", [](const py::bytes& data, const std::string& what, std::uint64_t max_bytes, std::uint64_t max_work) {
    const std::string s = data;
    return case_file_to_py(oracle::decode_case(reinterpret_cast<const std::uint8_t*>(s.data()), s.size(), what,
                                               limits_of(max_bytes, max_work)));
  });
  // backward ({"dO", "dhT"}) and gradients ({"dq", ...}) may be None: gdn-case/2 when given.
  m.def("write_case_file", [](const std::string& path, const Problem& p, const py::dict& inputs, py::object outputs,
                              const std::map<std::string, std::string>& metadata, py::object backward,
                              py::object gradients) {
    oracle::write_case_file(path, case_file_from_py(p, inputs, outputs, metadata, backward, gradients));
  }, py::arg("path"), py::arg("problem"), py::arg("inputs"), py::arg("outputs"), py::arg("metadata"),
     py::arg("backward") = py::none(), py::arg("gradients") = py::none());
  m.def("encode_case", [](const Problem& p, const py::dict& inputs, py::object outputs,
                          const std::map<std::string, std::string>& metadata, py::object backward,
                          py::object gradients) {
    const auto bytes = oracle::encode_case(case_file_from_py(p, inputs, outputs, metadata, backward, gradients));
    return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }, py::arg("problem"), py::arg("inputs"), py::arg("outputs"), py::arg("metadata"),
     py::arg("backward") = py::none(), py::arg("gradients") = py::none());
  m.def("judge_case_file", [](const std::string& path, const std::string& budget) {
    std::optional<oracle::BudgetOptions> b;
    if (!budget.empty()) b = budget_of(budget);
    return cli::judge_case_file(path, b, find_entry);
  });

  // ---- the backward (core/gradients.hpp, reference/backward*.hpp, oracle/backward_budget.hpp) ----
  m.def("make_backward_inputs", [](const Problem& p, std::uint64_t seed) {
    p.validate();
    return backward_to_py(fuzz::make_backward_inputs(p, seed));
  });
  m.def("backward_space", [](const std::string& space) {
    return fuzz::to_json(fuzz::backward_space(fuzz::case_space_from_json(nlohmann::json::parse(space)))).dump();
  });
  m.def("sequential_backward", [](const Problem& p, const py::dict& inputs, const py::dict& backward,
                                  const std::string& precision, bool term_magnitudes) -> py::object {
    const Inputs in = inputs_from_py(p, inputs);
    const BackwardInputs b = backward_from_py(p, in, backward);
    if (precision == "f64") return sequential_backward_impl<double>(p, in, b, term_magnitudes);
    if (precision == "f80") return sequential_backward_impl<long double>(p, in, b, term_magnitudes);
    if (precision == "f32") return sequential_backward_impl<float>(p, in, b, term_magnitudes);
    value_error("precision must be f64, f80 or f32, got '" + precision + "'");
  });
  m.def("chunked_backward", [](const Problem& p, const py::dict& inputs, const py::dict& backward, int chunk_size,
                               const std::string& precision) -> py::object {
    if (chunk_size < 1) value_error("chunk_size must be >= 1, got " + std::to_string(chunk_size));
    const Inputs in = inputs_from_py(p, inputs);
    const BackwardInputs b = backward_from_py(p, in, backward);
    if (precision == "f64") return gradients_to_py(reference::chunked_backward<double>(p, in, b, chunk_size));
    if (precision == "f80") return gradients_to_py(reference::chunked_backward<long double>(p, in, b, chunk_size));
    if (precision == "f32") return gradients_to_py(reference::chunked_backward<float>(p, in, b, chunk_size));
    value_error("precision must be f64, f80 or f32, got '" + precision + "'");
  });
  m.def("emulate_backward", [](const Problem& p, const py::dict& inputs, const py::dict& backward,
                               const std::string& formulation, int chunk_size, const std::string& baseline) {
    if (chunk_size < 1) value_error("chunk_size must be >= 1, got " + std::to_string(chunk_size));
    if (baseline != "emulation" && baseline != "operands_single")
      value_error("baseline must be emulation or operands_single, got '" + baseline + "'");
    const Formulation f = formulation_of(formulation);
    if (baseline == "operands_single" && f != Formulation::chunked)
      value_error("baseline operands_single: the backward's operand model is of the chunked form, got formulation '" +
                  formulation + "'");
    const Inputs in = inputs_from_py(p, inputs);
    const BackwardInputs b = backward_from_py(p, in, backward);
    return gradients_to_py(baseline == "emulation" ? oracle::emulate_backward(p, in, b, f, chunk_size)
                                                   : oracle::emulate_backward_operands(p, in, b, chunk_size));
  });
  m.def("judge_backward", [](const Problem& p, const py::dict& inputs, const py::dict& backward, const py::dict& actual,
                             const std::string& formulation, int chunk_size, const std::string& budget,
                             const std::string& oracle_precision, const std::string& case_name,
                             const std::string& implementation, py::object first) {
    const Inputs in = inputs_from_py(p, inputs);
    BackwardInputs b = backward_from_py(p, in, backward);
    const Gradients<double> x = gradients_from_py(actual);
    const oracle::BudgetOptions options = budget_of(budget);
    if (oracle_precision != "f64" && oracle_precision != "f80")
      value_error("oracle must be f64 or f80, got '" + oracle_precision + "'");
    const Formulation f = formulation_of(formulation);
    if (f == Formulation::chunked && chunk_size < 1) value_error("chunk_size must be >= 1, got " + std::to_string(chunk_size));
    std::optional<Gradients<double>> first_run;
    if (!first.is_none()) first_run = gradients_from_py(first);
    if (options.model == oracle::BudgetModel::bitwise && !first_run)
      value_error("budget bitwise compares two runs: pass the first run's gradients as first=");
    oracle::BackwardContext context(case_name, p, in, std::move(b),
                                    oracle_precision == "f80" ? oracle::BackwardContext::Oracle::f80
                                                              : oracle::BackwardContext::Oracle::f64);
    return oracle::evaluate_gradients(implementation, f, chunk_size, context, x, options,
                                      first_run ? &*first_run : nullptr);
  });
  m.def("backward_error_verdict", [](const Problem& p, const std::string& budget, const std::string& case_name,
                                     const std::string& implementation, const std::string& message) {
    oracle::Verdict v;
    v.case_name = case_name;
    v.problem = p.describe();
    v.implementation = implementation;
    v.budget = budget_of(budget).describe();
    v.status = oracle::Status::error;
    v.message = message;
    return v;
  }, "An ERROR verdict for a backward kernel that failed before returning gradients.");
  m.def("backward_tensors", [](const Problem& p) {
    std::vector<std::string> names;
    for (oracle::OutputTensor t : oracle::gradient_tensors(p)) names.push_back(oracle::output_tensor_name(t));
    return names;
  });

  // ---- the fuzz campaign and the shrinker ----
  m.def("run_fuzz", &run_fuzz);
  m.def("shrink", [](const Problem& p, const py::dict& inputs, py::function still_fails, int max_evaluations,
                     double max_seconds) {
    cli::ShrinkOptions so;
    so.max_evaluations = max_evaluations;
    so.max_seconds = max_seconds;
    const cli::ConcreteCase start{p, inputs_from_py(p, inputs)};
    const cli::ShrinkResult r = cli::shrink(
        start, [&](const cli::ConcreteCase& c) { return still_fails(c.problem, inputs_to_py(c.problem, c.inputs)).cast<bool>(); },
        so);
    py::dict d;
    d["problem"] = r.smallest.problem;
    d["inputs"] = inputs_to_py(r.smallest.problem, r.smallest.inputs);
    d["evaluations"] = r.evaluations;
    d["accepted"] = r.accepted;
    d["seconds"] = r.seconds;
    d["stopped_early"] = r.stopped_early;
    d["steps"] = r.steps;
    return d;
  });
  m.def("build_versions", [] { return cli::build_versions().dump(); });
}
