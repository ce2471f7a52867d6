#pragma once
// Anything that computes the operator and can be put under test: a reference, a CUDA kernel,
// an external library's outputs read back from case files. The property suite, the
// conformance run and the fuzzer are written once against this interface.
#include <memory>
#include <string>
#include <vector>

#include <stdexcept>

#include "core/gradients.hpp"
#include "core/problem.hpp"

namespace gdn {

// Which exact formulation an implementation follows: decides which precision-emulating
// reference gives its calibrated error baseline.
enum class Formulation { sequential, chunked };

class Implementation {
 public:
  virtual ~Implementation() = default;
  virtual std::string name() const = 0;
  virtual Formulation formulation() const = 0;
  virtual int chunk_size() const { return 64; }  // for Formulation::chunked
  // Whether it can run at all here (a CUDA kernel without a GPU cannot: its cases are
  // reported as skipped, never as passed). Fills *why when not.
  virtual bool available(std::string* why) const {
    (void)why;
    return true;
  }
  // Whether it supports this (valid) problem, e.g. K <= 256; fills *why when not.
  virtual bool supports(const Problem& problem, std::string* why) const {
    (void)problem;
    (void)why;
    return true;
  }
  // Runs on validated inputs; outputs widened to double. Throws ProblemError for bad input.
  virtual Outputs<double> run(const Problem& problem, const Inputs& inputs) = 0;
  // Bitwise-reproducible for the same inputs (kernels must be, §Standards).
  virtual bool deterministic() const { return true; }

  // The backward (docs/backward.md), for implementations that have one: the gradients of
  // L = <dO, o> + <dhT, hT> for the forward this implementation computes, widened to double.
  // Its formulation decides its calibrated baseline (oracle::emulate_backward); it need not be
  // the forward's (a kernel may recompute the forward sequentially inside its backward).
  virtual bool has_backward() const { return false; }
  virtual Formulation backward_formulation() const { return formulation(); }
  // Whether the backward supports this (valid) problem; fills *why when not. Called only when
  // has_backward().
  virtual bool supports_backward(const Problem& problem, std::string* why) const { return supports(problem, why); }
  // Runs on validated inputs and cotangents (oracle::validate_backward_inputs). Throws
  // ProblemError for bad input, std::logic_error when the implementation has no backward.
  virtual Gradients<double> backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& cotangents) {
    (void)problem;
    (void)inputs;
    (void)cotangents;
    throw std::logic_error(name() + " has no backward");
  }
};

}  // namespace gdn
