#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include "core/problem.hpp"
TEST_CASE("placeholder") { REQUIRE(gdn::Problem::packed({1,2},1,1,4,4).T == 3); }
