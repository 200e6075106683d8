// --fleet's sizes: the GPU table and the list parser (autobatch/workflows/fleet.h).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"
#include "autobatch/workflows/fleet.h"

namespace autobatch {
namespace {

std::string trimmed(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return "";
  const auto last = text.find_last_not_of(" \t");
  return std::string(text.substr(first, last - first + 1));
}

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string gpuKeys() {
  std::string keys;
  for (const auto& g : fleetGpus()) keys += (keys.empty() ? "" : ", ") + std::string(g.key);
  return keys;
}

// One item: a GPU key, else a size with its unit.
FleetSize fleetItem(const std::string& item) {
  const std::string key = lowercase(item);
  for (const auto& g : fleetGpus()) {
    if (g.key == key) return {std::string(g.key), g.total_bytes, std::string(g.source)};
  }
  if (item.empty() || std::isdigit(static_cast<unsigned char>(item.front())) == 0) {
    throw Error(fmt::format(
        "--fleet: expected sizes with a unit (24GiB, 40GB) or GPU names ({}), but got '{}'; "
        "give its total memory as a size instead",
        gpuKeys(), item));
  }
  const std::int64_t bytes = parseBytes(item, "--fleet");
  if (bytes <= 0) {
    throw Error("--fleet: expected sizes > 0, but got '" + item + "'; leave it out of the list");
  }
  return {item, bytes, "given"};
}

}  // namespace

const std::vector<FleetGpu>& fleetGpus() {
  // totalGlobalMem as CUDA's deviceQuery prints it ("Total amount of global memory: ... bytes"),
  // or torch.cuda.get_device_properties().total_memory, read from the public source named.
  static const std::vector<FleetGpu> table = {
#include "workflows/fleet_gpus.inc"
  };
  return table;
}

std::vector<FleetSize> parseFleet(const std::string& text) {
  std::vector<FleetSize> sizes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string::npos ? text.size() : comma;
    const std::string item = trimmed(std::string_view(text).substr(start, end - start));
    if (item.empty()) {
      throw Error(
          "--fleet: expected a comma-separated list of sizes or GPU names such as "
          "16GiB,24GiB,a100-40gb,h100-80gb, but got '" +
          text + "' (an empty item); remove the extra comma");
    }
    FleetSize size = fleetItem(item);
    for (const auto& s : sizes) {
      if (s.bytes == size.bytes) {
        throw Error(
            fmt::format("--fleet: expected distinct sizes, but '{}' and '{}' are both {} "
                        "bytes; give each size once",
                        s.name, size.name, size.bytes));
      }
    }
    sizes.push_back(std::move(size));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sizes;
}

}  // namespace autobatch
