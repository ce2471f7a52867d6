#include "cuda/tests/chunked_testbed.hpp"

#include "fuzz/sample.hpp"

namespace gdn::cuda::chunked_testbed {

Case random_case(std::mt19937_64& rng, double work_cap) {
  fuzz::CaseSpace space = fuzz::CaseSpace::chunked_prefill();
  space.max_work = work_cap;
  space.min_work = work_cap / 64;
  return fuzz::draw_case(rng(), space);
}

}  // namespace gdn::cuda::chunked_testbed
