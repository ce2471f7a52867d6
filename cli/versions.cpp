// build_versions (cli/campaign.hpp): its own file so that the fuzz targets can link it without
// the campaign.
#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "cli/campaign.hpp"
#include "gdn_revision.hpp"  // GDN_GIT_REVISION, written at build time (cli/revision.cmake)

namespace gdn::cli {

nlohmann::json build_versions() {
  nlohmann::json v;
  v["gdn-testbed"] = GDN_GIT_REVISION;
  v["compiler"] = __VERSION__;
  v["eigen"] = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
               std::to_string(EIGEN_MINOR_VERSION);
  v["nlohmann_json"] = std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." + std::to_string(NLOHMANN_JSON_VERSION_MINOR) +
                       "." + std::to_string(NLOHMANN_JSON_VERSION_PATCH);
  return v;
}

}  // namespace gdn::cli
