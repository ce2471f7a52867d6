#pragma once
// Catch2 glue for RapidCheck properties (like rc::prop of <rapidcheck/catch.h>), with a case
// count of our own: `cases` random cases per property (300 by default: RapidCheck's default of
// 100 is too few for the sizes and features a case mixes) unless the environment sets
// RC_PARAMS="max_success=N" (the sanitizer job runs fewer). Every other RC_PARAMS key (seed,
// max_size, reproduce, verbose_progress, ...) applies as RapidCheck documents it. On failure
// the message holds the seed, the shrunk case (Case prints problem, cu_seqlens, options and
// its data seed) and the property's own report; on success one line with the case count.
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>
#include <rapidcheck.h>

namespace gdn::fuzz {

inline int default_property_cases(int cases) {
  const char* env = std::getenv("RC_PARAMS");
  if (env != nullptr && std::strstr(env, "max_success") != nullptr)
    return rc::detail::configuration().testParams.maxSuccess;
  return cases;
}

template <class Testable>
void rc_section(const std::string& description, Testable&& testable, int cases = 300) {
  SECTION(description) {
    rc::detail::TestParams params = rc::detail::configuration().testParams;
    params.maxSuccess = default_property_cases(cases);
    rc::detail::TestMetadata metadata;
    metadata.id = description;
    metadata.description = description;
    const auto result = rc::detail::checkTestable(std::forward<Testable>(testable), metadata, params);
    if (result.template is<rc::detail::SuccessResult>()) {
      const auto success = result.template get<rc::detail::SuccessResult>();
      std::cout << "- " << description << ": " << success.numSuccess << " cases passed\n";
      SUCCEED();
    } else {
      std::ostringstream message;
      rc::detail::printResultMessage(result, message);
      INFO(description << "\n" << message.str() << "\n");
      FAIL();
    }
  }
}

}  // namespace gdn::fuzz
