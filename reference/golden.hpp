#pragma once
// Golden vectors: outputs of two independent public implementations (transformers' Qwen3-Next
// torch functions and flash-linear-attention's naive torch functions) on stored inputs, the
// anchor that nobody in this project wrote. Files: reference/golden/data/*.json, made by the
// scripts in reference/golden/ (README.md there: how to regenerate, and every convention
// difference between the libraries and docs/semantics.md). The peers compute in float32, so a case is a
// float32-accurate result, judged with the tolerance below, not an exact one.
#include <string>
#include <vector>

#include "core/implementation.hpp"
#include "core/problem.hpp"

namespace gdn::reference {

struct GoldenCase {
  std::string name, source /* library version + function */;
  Problem problem;  // in our packed form; GVA un-repeated; K-major states
  Inputs inputs;    // every value a float32 (both sides saw identical numbers)
  HostTensor<double> o, hT;  // the peer's float32 outputs, [T, HV, V] and [N, HV, K, V]
  double tolerance_o, tolerance_hT;  // bounds on golden_error (see golden_tolerance)
  // What the peer computed, so that a precision emulation of the same formulation
  // (emulate()) can be put beside it.
  Formulation formulation = Formulation::sequential;  // recurrent -> sequential, chunk -> chunked
  int chunk_size = 0;  // the peer's chunk size (0 for a recurrent one)
  std::string call;    // the exact call the generator made
  std::string file;    // the file it was read from
};

// Parses one golden file's text; `file` names it in every error. Throws std::runtime_error
// naming the file, the case and the field for any malformed content (not JSON, wrong format
// tag, missing field, wrong shape, non-float32 or non-finite number), and a message with the
// ProblemError's text when the problem or inputs fail gdn::validate. One GoldenCase per
// (stored problem, peer function).
std::vector<GoldenCase> parse_golden(const std::string& text, const std::string& file);
// Reads and parses one golden file from disk (errors as parse_golden's, and "cannot be opened").
std::vector<GoldenCase> load_golden(const std::string& path);

// One golden file: its name (as in reference/golden/data, or a path) and its bytes.
struct GoldenFile {
  std::string name;
  std::string text;
};
// The golden files built into this binary: reference/golden/data/*.json as they were when it was
// built (reference/golden/embed.cmake), sorted by name. The vectors travel with the binary, so
// a copied or installed binary judges the same cases from any folder, on any machine.
std::vector<GoldenFile> embedded_golden_files();
// Every *.json file in `dir`, sorted; throws std::runtime_error naming the folder when it is
// not a readable directory.
std::vector<std::string> golden_files(const std::string& dir);

// The environment variable that points conformance at another folder of golden files (for a
// regenerated set, before it is built in). Unset: the embedded files.
inline constexpr const char* kGoldenDirVariable = "GDN_GOLDEN_DIR";
// The golden cases conformance judges: those of the folder GDN_GOLDEN_DIR names when it is set
// (an error when it is empty, not a folder or holds no *.json file), else the embedded ones.
// *origin receives where they came from, for the report.
std::vector<GoldenCase> load_all_golden(std::string* origin);

// The metric the tolerances bound: for each (sequence, value head) block of the tensor (o rows
// of that sequence and head, or that state matrix), max |x - golden| / max |golden|, and the
// maximum over blocks (a block whose golden values are all zero is judged by max |x| alone).
// Normwise per block, because a peer's fp32 error scales with the size of that head's state,
// not with each element; a wrong convention (missing token, wrong scale, wrong gate order)
// changes a block by O(1) of its size.
double golden_error_o(const GoldenCase& golden, const HostTensor<double>& o);
double golden_error_hT(const GoldenCase& golden, const HostTensor<double>& hT);

// The tolerance model, u = 2^-24 (fp32 unit roundoff), L = the longest sequence:
//   tolerance = 8 u (sqrt(L (K + 8)) + Gamma)
// - The peers run the recurrence in fp32. Each step adds a few roundings per state element
//   (decay, the length-K dot product S^T k whose error grows like sqrt(K) u for independent
//   roundings, the subtraction, beta, the rank-one add: K + 8 collects them), and the output
//   read is another length-K dot product. With |k| <= 1 and 0 <= beta <= 2 the step map is
//   nonexpansive (semantics §2), so errors made at different steps add and never grow: independent
//   errors add like sqrt(L). This gives a relative RMS error of about u sqrt(L (K + 8)).
// - The factor 8 takes the RMS to the maximum over a block: a Gaussian's maximum over up to
//   1e5 elements stays below 4.5 sigma, and a factor of almost 2 is left for correlated errors.
// - Gamma is the chunk forms' own term: they take exp(gamma_i - gamma_j) from the cumulative
//   sums gamma of g inside a chunk, each rounded in fp32 with absolute error about u |gamma|;
//   the decay factors then carry a relative error u |gamma|, which for strong decay or a hard
//   reset (g = -1e4) exceeds the recurrent term. Gamma = max over chunks, heads and tokens of
//   |gamma_i| (cumulative from the chunk's start, chunks of the peer's size cut from each
//   sequence's start), 0 for recurrent peers.
double golden_tolerance(const Problem& problem, const Inputs& inputs, Formulation formulation,
                        int chunk_size);

}  // namespace gdn::reference
