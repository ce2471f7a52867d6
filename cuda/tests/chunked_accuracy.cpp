// Accuracy of the chunked prefill against its peers on the same inputs, with the oracle's
// metrics against the double reference (reference::sequential<double>).
//
//   cuda_chunked_accuracy cases DIR
//       writes the accuracy cases as gdn-case/1 files (inputs only) into DIR, for the peers'
//       adapters (reports/adapters/gdn_adapter.py --impl fla.chunk --out-dir PEER_DIR DIR);
//   cuda_chunked_accuracy judge DIR OUT.json [--peer NAME=PEER_DIR]... [--commit TEXT] [--command TEXT]
//       runs this kernel on each case of DIR, reads each peer's outputs from its PEER_DIR (same
//       file names; a missing file or a file without outputs, e.g. a case the peer does not
//       support, is reported as missing under the peer's key), and writes, per case, the rel_rms
//       and max_abs of o and hT of this kernel and of its design's CPU model
//       (model.chunked.split_all), for bf16 / fp16 of its ChunkedRounding::single mode and of
//       that design's model (model.chunked.single), of every peer (key "peer.NAME", NAME in
//       "implementation", with the library versions its adapter recorded) and of the fp32
//       chunked emulation, all against the exact outputs, with the device, the date, what was
//       built (--commit) and how it was run (--command), atomically.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cuda/implementations/chunked_implementation.hpp"
#include "fuzz/inputs.hpp"
#include "oracle/case_file.hpp"
#include "oracle/metrics.hpp"
#include "reference/emulate.hpp"
#include "reference/operand_model.hpp"
#include "reference/sequential.hpp"

using namespace gdn;
using nlohmann::json;

namespace {

struct AccuracyCase {
  std::string name;
  Problem problem;
};

std::vector<AccuracyCase> accuracy_cases() {
  std::vector<AccuracyCase> out;
  // The varlen shape of the accuracy claim: uneven lengths, chunk edges, long ones.
  const std::vector<std::int64_t> lengths{1, 17, 64, 65, 300, 1000, 2500};
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    Problem p = Problem::packed(lengths, 4, 8, 128, 128);
    p.input_dtype = dtype;
    p.gate_dtype = DType::f32;
    p.use_qk_l2norm = true;
    p.has_h0 = true;
    p.has_hT = true;
    out.push_back({std::string("varlen_") + dtype_name(dtype), p});
  }
  // Production heads (Qwen3-Next: H = 16, HV = 32) on shorter sequences.
  Problem q = Problem::packed({1, 64, 65, 300, 1000}, 16, 32, 128, 128);
  q.input_dtype = DType::bf16;
  q.gate_dtype = DType::f32;
  q.use_qk_l2norm = true;
  q.has_h0 = true;
  q.has_hT = true;
  out.push_back({"qwen3next_varlen_bf16", q});
  return out;
}

constexpr std::uint64_t kSeed = 4;

json metrics_json(const Problem& p, const Inputs& in, const Outputs<double>& exact, const Outputs<double>& x) {
  json j;
  auto one = [&](oracle::OutputTensor t, const HostTensor<double>& ref, const HostTensor<double>& v) {
    if (!v.defined() || v.shape() != ref.shape()) return json{{"missing", true}};
    const oracle::TensorMetrics m = oracle::compare(p, &in, t, ref, v);
    return json{{"rel_rms", m.rel_rms}, {"max_abs", m.max_abs_error}, {"max_abs_ref", m.max_abs_ref},
                {"nonfinite", m.nonfinite_mismatches}};
  };
  j["o"] = one(oracle::OutputTensor::o, exact.o, x.o);
  if (p.has_hT) j["hT"] = one(oracle::OutputTensor::hT, exact.hT, x.hT);
  return j;
}

int write_cases(const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const AccuracyCase& c : accuracy_cases()) {
    oracle::CaseFile file;
    file.problem = c.problem;
    file.inputs = fuzz::make_inputs(c.problem, fuzz::InputOptions{}, kSeed);
    file.metadata["gdn.case_name"] = "chunked_accuracy/" + c.name;
    file.metadata["gdn.generator"] =
        json{{"seed", std::to_string(kSeed)}, {"input_options", {{"regime", "mild"}, {"beta_max", 1.0},
                                                                 {"unit_keys", true}, {"state_scale", 0.5},
                                                                 {"padding_fraction", 0.0}}}}
            .dump();
    oracle::write_case_file(dir + "/" + c.name + ".safetensors", file);
    std::printf("wrote %s/%s.safetensors (%s)\n", dir.c_str(), c.name.c_str(), c.problem.describe().c_str());
  }
  return 0;
}

struct Peer {
  std::string name, dir;
};

// NAME=DIR, both non-empty.
Peer parse_peer(const std::string& spec) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw std::invalid_argument("--peer: expected NAME=DIR (e.g. fla.chunk[triton]=/tmp/acc_fla), got '" + spec + "'");
  return {spec.substr(0, eq), spec.substr(eq + 1)};
}

int judge(const std::string& dir, const std::vector<Peer>& peers, const std::string& out_path,
          const std::string& commit, const std::string& command) {
  cuda::ChunkedPrefillKernel kernel;
  cuda::ChunkedOptions single_options;
  single_options.rounding = cuda::ChunkedRounding::single;
  cuda::ChunkedPrefillKernel single(single_options);
  json report;
  cudaDeviceProp prop{};
  if (cuda::device_available() && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) report["device"] = prop.name;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  report["date"] = date;
  report["commit"] = commit;
  report["command"] = command;
  report["metric"] = "oracle::compare against reference::sequential<double>: rel_rms = rms(x - exact) / rms(exact)";
  report["cases"] = json::array();
  for (const AccuracyCase& c : accuracy_cases()) {
    const std::string path = dir + "/" + c.name + ".safetensors";
    const oracle::CaseFile file = oracle::read_case_file(path);
    const Problem& p = file.problem;
    const Inputs& in = file.inputs;
    const Outputs<double> exact = reference::sequential<double>(p, in);
    const Outputs<double> emulation = reference::emulate(p, in, Formulation::chunked, cuda::kChunkSize);
    json entry;
    entry["name"] = c.name;
    entry["problem"] = p.describe();
    entry["emulation_chunked_fp32"] = metrics_json(p, in, exact, emulation);
    entry["gdn.cuda.chunked_prefill"] = metrics_json(p, in, exact, kernel.run(p, in));
    entry["model.chunked.split_all"] =
        metrics_json(p, in, exact, reference::emulate_operands(p, in, reference::OperandRounding::split_all));
    if (single.supports(p, nullptr)) {
      entry["gdn.cuda.chunked_prefill.single"] = metrics_json(p, in, exact, single.run(p, in));
      entry["model.chunked.single"] =
          metrics_json(p, in, exact, reference::emulate_operands(p, in, reference::OperandRounding::single));
    }
    for (const Peer& peer : peers) {
      const std::string key = "peer." + peer.name;
      const std::string peer_path = peer.dir + "/" + c.name + ".safetensors";
      if (!std::filesystem::exists(peer_path)) {
        entry[key] = json{{"missing", peer_path}};
        continue;
      }
      const oracle::CaseFile out = oracle::read_case_file(peer_path);
      if (!out.outputs) {
        entry[key] = json{{"missing", "no outputs in " + peer_path}};
        continue;
      }
      entry[key] = metrics_json(p, in, exact, *out.outputs);
      entry[key]["implementation"] = peer.name;
      entry[key]["adapter_name"] = out.meta("gdn.implementation");
      entry[key]["versions"] = out.meta("gdn.versions");
    }
    std::cout << entry.dump() << std::endl;
    report["cases"].push_back(entry);
  }
  const std::string temp = out_path + ".tmp";
  {
    std::ofstream out(temp);
    out << report.dump(2) << "\n";
    if (!out.flush()) throw std::runtime_error("cannot write " + temp);
  }
  if (std::rename(temp.c_str(), out_path.c_str()) != 0) throw std::runtime_error("cannot rename " + temp + " to " + out_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Accuracy of the chunked prefill beside its peers on the same inputs"};
  app.require_subcommand(1);
  std::string dir, out_path, commit, command;
  std::vector<std::string> peer_specs;
  CLI::App* cases = app.add_subcommand("cases", "write the accuracy cases (inputs only) into DIR");
  cases->add_option("DIR", dir, "output folder")->required();
  CLI::App* judge_command = app.add_subcommand("judge", "run the kernel on DIR's cases and judge it beside the peers");
  judge_command->add_option("DIR", dir, "the cases (from `cases`)")->required();
  judge_command->add_option("OUT", out_path, "the JSON to write")->required();
  judge_command->add_option("--peer", peer_specs, "NAME=DIR: a peer's outputs, same file names (repeatable)");
  judge_command->add_option("--commit", commit, "what was built (recorded in the JSON)");
  judge_command->add_option("--command", command, "how it was run (recorded in the JSON)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (cases->parsed()) return write_cases(dir);
    std::vector<Peer> peers;
    for (const std::string& spec : peer_specs) peers.push_back(parse_peer(spec));
    return judge(dir, peers, out_path, commit, command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_chunked_accuracy: %s\n", e.what());
    return 1;
  }
}
