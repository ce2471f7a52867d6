// The backward's property suite (backward_properties.hpp) on the two double backward
// references: the sequential adjoint, and the chunked form at C = 1, 16, 64 and a random C per
// case. 200 random cases per property and implementation (RC_PARAMS="max_success=N" overrides;
// the sanitizer job runs 25), drawn from the one generator restricted to the backward's space
// and to moderate sizes, so that the suite stays within seconds.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "fuzz/backward_properties.hpp"
#include "fuzz/catch_properties.hpp"

namespace {

using namespace gdn;

fuzz::CaseSpace space(int chunk_size) {
  fuzz::CaseSpace s = fuzz::backward_space(fuzz::CaseSpace::chunked(chunk_size));
  s.max_K = 64;
  s.max_V = 64;
  s.max_work = 1.5e5;
  return s;
}

void run_suite(const fuzz::BackwardImplementation& impl, int chunk_size) {
  for (const fuzz::BackwardProperty& property : fuzz::all_backward_properties())
    fuzz::rc_section(impl.name + ": " + property.name, [&]() {
      const fuzz::Case c = *fuzz::gen_case(space(chunk_size));
      fuzz::rc_require(property.check(impl, c));
    }, 200);
}

}  // namespace

TEST_CASE("backward properties: sequential backward reference", "[properties][backward]") {
  run_suite(fuzz::sequential_backward_reference(), 64);
}

TEST_CASE("backward properties: chunked backward reference, C = 1", "[properties][backward][chunked]") {
  run_suite(fuzz::chunked_backward_reference(1), 1);
}

TEST_CASE("backward properties: chunked backward reference, C = 16", "[properties][backward][chunked]") {
  run_suite(fuzz::chunked_backward_reference(16), 16);
}

TEST_CASE("backward properties: chunked backward reference, C = 64", "[properties][backward][chunked]") {
  run_suite(fuzz::chunked_backward_reference(64), 64);
}

TEST_CASE("backward properties: chunked backward reference, random C per case", "[properties][backward][chunked]") {
  for (const fuzz::BackwardProperty& property : fuzz::all_backward_properties())
    fuzz::rc_section("reference.chunked_backward.f64.random_C: " + property.name, [&]() {
      const int C = *rc::gen::inRange(1, 130);
      const fuzz::Case c = *fuzz::gen_case(space(C));
      fuzz::rc_require(property.check(fuzz::chunked_backward_reference(C), c));
    }, 200);
}
