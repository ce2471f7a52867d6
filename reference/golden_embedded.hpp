#pragma once
// The golden files as built into the binary: generated at build time by
// reference/golden/embed.cmake from reference/golden/data/*.json (reference/CMakeLists.txt).
// Read them through embedded_golden_files() (golden.hpp), not directly.
#include <cstddef>

namespace gdn::reference::embedded {

struct EmbeddedFile {
  const char* name;           // the file's name, e.g. "fla.json"
  const char* const* chunks;  // its bytes in chunk_count literals of chunk_bytes (the last shorter)
  std::size_t chunk_count;
  std::size_t chunk_bytes;
  std::size_t size;           // total bytes
};

extern const EmbeddedFile files[];
extern const std::size_t file_count;

}  // namespace gdn::reference::embedded
