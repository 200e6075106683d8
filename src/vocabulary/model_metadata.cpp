#include "autobatch/vocabulary/model_metadata.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <string>

#include "autobatch/vocabulary/error.h"
#include "vocabulary/zip_members.h"

namespace autobatch {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view origin, const std::string& expected,
                       const std::string& got) {
  throw Error(std::string(origin) + ": " + std::string(kModelMetadataFile) + ": expected " +
              expected + ", but got " + got);
}

// A short description of a JSON value for messages. Arrays and objects are summarised, never
// dumped: dump() recurses once per nesting level, and an archive is untrusted input.
std::string describe(const json& value) {
  if (value.is_array() || value.is_object()) {
    return std::string(value.type_name()) + " of " + std::to_string(value.size()) +
           (value.is_array() ? " element(s)" : " key(s)");
  }
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) {
    std::size_t cut = 77;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0U) == 0x80U) --cut;  // UTF-8
    text = text.substr(0, cut) + "...";
  }
  return std::string(value.type_name()) + " " + text;
}

std::int64_t integerField(std::string_view origin, const json& object, const char* key,
                          std::int64_t fallback, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  if (!it->is_number_integer())
    fail(origin, where + "." + key + " to be an integer", describe(*it));
  return it->get<std::int64_t>();
}

InputSpec parseInputObject(std::string_view origin, const json& item, const std::string& where) {
  for (const auto& [key, value] : item.items()) {
    if (key != "shape" && key != "dtype" && key != "low" && key != "high") {
      fail(origin, where + " keys among shape, dtype, low, high", "'" + key + "'");
    }
  }
  // Re-use the text parser's checks: build the spec text and parse it.
  const auto shape = item.find("shape");
  if (shape == item.end() || !shape->is_array()) {
    fail(origin, where + ".shape as a list of positive integers ([] for a scalar sample)",
         shape == item.end() ? std::string("no \"shape\"") : describe(*shape));
  }
  std::string text;
  const auto dtype = item.find("dtype");
  if (dtype != item.end()) {
    if (!dtype->is_string()) fail(origin, where + ".dtype as a string", describe(*dtype));
    // Parsed on its own: spliced into the spec text, "int64:4" would read as a dtype and a shape.
    try {
      text += std::string(toString(parseDType(dtype->get<std::string>()))) + ":";
    } catch (const Error& e) {
      fail(origin, where + ".dtype to be a known dtype", std::string("an error: ") + e.what());
    }
  }
  if (shape->empty()) text += "scalar";
  for (std::size_t i = 0; i < shape->size(); ++i) {
    const json& d = (*shape)[i];
    if (!d.is_number_integer()) fail(origin, where + ".shape of integers", describe(*shape));
    if (i > 0) text += 'x';
    text += std::to_string(d.get<std::int64_t>());
  }
  const bool has_range = item.contains("low") || item.contains("high");
  if (has_range) {
    const std::int64_t low = integerField(origin, item, "low", 0, where);
    const std::int64_t high = integerField(origin, item, "high", 2, where);
    text += ":" + std::to_string(low) + "..<" + std::to_string(high);
  }
  try {
    return parseInputSpec(text);
  } catch (const Error& e) {
    fail(origin, where + " to be a valid input", std::string("an error: ") + e.what());
  }
}

// True when `name` is a member of an AOTInductor package ("<archive>/data/aotinductor/...").
bool isPackageMember(std::string_view name) {
  constexpr std::string_view kCode = "data/aotinductor/";
  return name.starts_with(kCode) ||
         name.find(std::string("/") + std::string(kCode)) != std::string_view::npos;
}

// Throws when the zip archive at `path` is not whole (zip_members.h). The message says which
// format it is from its members (those before the cut, when the directory is gone): a truncated
// package was once blamed as "expected a TorchScript archive".
void checkWholeArchive(const std::string& path) {
  const auto bytes = detail::zipBytesOfFile(path);
  if (!bytes) return;  // opened just before: a file that vanished is LibTorch's to report
  const detail::ZipListing listing = detail::listZipMembers(*bytes);
  std::string damage = listing.damage;
  std::vector<std::string> names;
  for (const auto& member : listing.members) names.push_back(member.name);
  if (damage.empty()) {
    damage = detail::zipArchiveDamage(*bytes);
    if (damage.empty()) return;
  } else {
    names = detail::zipLocalNames(*bytes, 1000);
  }
  const bool package = std::ranges::any_of(names, isPackageMember);
  std::string held;
  if (!listing.damage.empty() && !names.empty()) {
    std::string first = names.front().substr(0, 200);
    for (char& c : first) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    held = package ? " (what is left holds a pt2 package's members, from '" + first + "')"
                   : " (what is left holds " + std::to_string(names.size()) +
                         " whole member(s), from '" + first + "')";
  }
  throw Error("model file '" + path + "': " + (package ? "package" : "archive") +
              " damaged: expected a whole zip archive, every member as its central directory "
              "records it, but " +
              damage + held +
              (listing.damage.empty() ? " (the file was altered after it was written)" : "") +
              "; copy the file again, or " +
              (package ? "export it again with scripts/autobatch_export.py --format pt2"
                       : "save it again with torch.jit.save (or scripts/autobatch_export.py)"));
}

}  // namespace

ModelMetadata parseModelMetadata(std::string_view json_text, std::string_view origin) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for numbers beyond a double ("1e400").
    fail(origin, "valid JSON", std::string("a parse error: ") + e.what());
  }
  if (!doc.is_object()) fail(origin, "a JSON object with an \"inputs\" list", describe(doc));
  for (const auto& [key, value] : doc.items()) {
    if (key != "version" && key != "inputs" && key != "loss") {
      fail(origin, "keys among version, inputs, loss", "'" + key + "'");
    }
  }
  if (const auto v = doc.find("version"); v != doc.end()) {
    if (!v->is_number_integer() || v->get<std::int64_t>() != 1) {
      fail(origin, "\"version\": 1 (the only schema version this autobatch knows)", describe(*v));
    }
  }
  const auto inputs = doc.find("inputs");
  if (inputs == doc.end() || !inputs->is_array() || inputs->empty()) {
    fail(origin, "\"inputs\" as a non-empty list (one entry per forward argument)",
         inputs == doc.end() ? std::string("no \"inputs\"") : describe(*inputs));
  }
  ModelMetadata metadata;
  for (std::size_t i = 0; i < inputs->size(); ++i) {
    const json& item = (*inputs)[i];
    const std::string where = "inputs[" + std::to_string(i) + "]";
    if (item.is_string()) {
      try {
        metadata.inputs.push_back(parseInputSpec(item.get<std::string>()));
      } catch (const Error& e) {
        fail(origin, where + " to be a valid input spec", std::string("an error: ") + e.what());
      }
    } else if (item.is_object()) {
      metadata.inputs.push_back(parseInputObject(origin, item, where));
    } else {
      fail(origin, where + " as a spec string or an object", describe(item));
    }
  }
  if (const auto loss = doc.find("loss"); loss != doc.end()) {
    if (!loss->is_string()) fail(origin, "\"loss\" as a string", describe(*loss));
    try {
      metadata.loss = parseLossKind(loss->get<std::string>());
    } catch (const Error& e) {
      fail(origin, "a known \"loss\"", std::string("an error: ") + e.what());
    }
  }
  return metadata;
}

std::string toJson(const ModelMetadata& metadata) {
  json doc;
  doc["version"] = 1;
  doc["inputs"] = json::array();
  for (const auto& spec : metadata.inputs) {
    json item;
    item["shape"] = spec.sample_shape;
    item["dtype"] = std::string(toString(spec.dtype));
    if (isIntegral(spec.dtype)) {
      item["low"] = spec.low;
      item["high"] = spec.high;
    }
    doc["inputs"].push_back(item);
  }
  if (metadata.loss) doc["loss"] = std::string(toString(*metadata.loss));
  return doc.dump();
}

std::pair<std::vector<InputSpec>, LossKind> resolveInputs(
    const std::vector<InputSpec>& explicit_inputs, std::optional<LossKind> explicit_loss,
    const std::optional<ModelMetadata>& metadata, std::string_view model_path) {
  std::vector<InputSpec> inputs = explicit_inputs;
  if (inputs.empty() && metadata) inputs = metadata->inputs;
  if (inputs.empty()) {
    throw Error("model '" + std::string(model_path) +
                "': expected input specs, but got none (no --input given and the archive has no " +
                std::string(kModelMetadataFile) +
                "); either pass one --input per forward argument (e.g. --input 3x224x224, or "
                "TrainingSpec::inputs), or save the model with them: torch.jit.save(m, path, "
                "_extra_files={\"autobatch/inputs.json\": json.dumps({\"inputs\": [\"3x224x224\"], "
                "\"loss\": \"mean\"})})");
  }
  LossKind loss = LossKind::kMean;
  if (explicit_loss) {
    loss = *explicit_loss;
  } else if (metadata && metadata->loss) {
    loss = *metadata->loss;
  }
  return {std::move(inputs), loss};
}

void checkModelFile(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string what =
      "model file '" + path +
      "': expected a TorchScript archive (torch.jit.save) or a pt2 training-step package "
      "(scripts/autobatch_export.py --format pt2)";
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw Error(what + ", but it does not exist");
  if (fs::is_directory(status)) throw Error(what + ", but it is a directory");
  if (!fs::is_regular_file(status)) throw Error(what + ", but it is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(what + ", but it cannot be read (" + std::strerror(errno) + ")");
  }
  std::array<char, 4> magic{};
  in.read(magic.data(), magic.size());
  const auto got = in.gcount();
  if (got == 0) throw Error(what + ", but it is empty (0 bytes)");
  if (got < 4 || magic != std::array<char, 4>{'P', 'K', '\3', '\4'}) {
    throw Error(
        what +
        ", but it is not a zip archive (both formats are zip archives, starting with 'PK'); " +
        std::string(kExportAdvice));
  }
  checkWholeArchive(path);
}

}  // namespace autobatch
