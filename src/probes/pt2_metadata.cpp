// The pt2 package's metadata (pt2_package.h readPt2Metadata, pt2_metadata.h): the "autobatch"
// metadata, the batch range and the memory check, read without loading the compiled code.
#include "probes/pt2_metadata.h"

#include <caffe2/serialize/inline_container.h>
#include <sys/utsname.h>
#include <torch/version.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/model_metadata.h"
#include "probes/pt2_archive.h"

namespace autobatch::detail {
namespace {

using nlohmann::json;

std::vector<std::string> stringList(const std::string& path, const json& doc, const char* key) {
  const auto it = doc.find(key);
  if (it == doc.end() || !it->is_array()) {
    failPackage(path, std::string("expected metadata \"") + key + "\" as a list of strings");
  }
  std::vector<std::string> out;
  for (const auto& item : *it) {
    if (!item.is_string()) {
      failPackage(path, std::string("expected metadata \"") + key + "\" as a list of strings");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

// What is wrong with batch_range.json's document, naming the field and its value (cut at 80
// characters), or "" when it is well formed: "low" an integer >= 1, "high" an integer or null or
// absent, "eager_batch1_error" text or null or absent.
std::string batchRangeProblem(const json& range) {
  if (range.is_discarded()) return "it is not JSON";
  if (!range.is_object()) return "it is " + std::string(range.type_name()) + ", not an object";
  const auto shown = [&](const char* key) {
    std::string text = range[key].dump();
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    return std::string("\"") + key + "\" is " + text;
  };
  if (!range.contains("low")) return R"("low" is missing)";
  if (!range["low"].is_number_integer() || range["low"].get<std::int64_t>() < 1) {
    return shown("low") + " (expected an integer >= 1)";
  }
  if (range.contains("high") && !range["high"].is_null() && !range["high"].is_number_integer()) {
    return shown("high") + " (expected an integer or null)";
  }
  if (range.contains("eager_batch1_error") && !range["eager_batch1_error"].is_null() &&
      !range["eager_batch1_error"].is_string()) {
    return shown("eager_batch1_error") + " (expected text or null)";
  }
  return "";
}

// What is wrong with memory_check.json's document, or "" when it is well formed: "status" one of
// "passed", "over", "not-run"; "reason" text or null; "rows" a list of {"batch",
// "eager_peak_bytes", "package_peak_bytes"}, each a positive integer.
std::string memoryCheckProblem(const json& check) {
  if (check.is_discarded()) return "it is not JSON";
  if (!check.is_object()) return "it is " + std::string(check.type_name()) + ", not an object";
  const auto shown = [](const char* key, const json& value) {
    std::string text = value.dump();
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    return std::string("\"") + key + "\" is " + text;
  };
  if (!check.contains("status")) return R"("status" is missing)";
  const json& status = check["status"];
  if (!status.is_string() || (status != "passed" && status != "over" && status != "not-run")) {
    return shown("status", status) + R"( (expected "passed", "over" or "not-run"))";
  }
  if (check.contains("reason") && !check["reason"].is_null() && !check["reason"].is_string()) {
    return shown("reason", check["reason"]) + " (expected text or null)";
  }
  if (!check.contains("rows") || !check["rows"].is_array()) return R"("rows" is not a list)";
  for (const json& row : check["rows"]) {
    for (const char* key : {"batch", "eager_peak_bytes", "package_peak_bytes"}) {
      if (!row.is_object() || !row.contains(key) || !row[key].is_number_integer() ||
          row[key].get<std::int64_t>() < 1) {
        return std::string("a row's \"") + key + "\" is missing or not a positive integer";
      }
    }
  }
  return "";
}

// Text from the package for a one-line report: control characters (a NUL would cut it, escapes
// would reach the terminal) become spaces, and more than kMaxChars is cut.
std::string oneLine(std::string text) {
  constexpr std::size_t kMaxChars = 1000;
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "... (cut)";
  return text;
}

// batch_range.json's "eager_batch1_error", one line (oneLine). Blank text is a damaged package:
// autobatch_export.py writes "ExceptionType: message" or null.
std::string eagerErrorText(const std::string& path, std::string text) {
  text = oneLine(std::move(text));
  if (text.find_first_not_of(' ') == std::string::npos) {
    failPackage(path, std::string(R"(expected "eager_batch1_error" in )") + kBatchRangeRecord +
                          " as the error's text or null, but it is blank; " + kAdvice);
  }
  return text;
}

std::string stringField(const json& doc, const char* key) {
  const auto it = doc.find(key);
  return it != doc.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// What this CPU lacks of the instruction sets a package was compiled for ("" when nothing).
std::string missingIsa(const std::string& isa) {
  std::string missing;
  const auto need = [&](const char* token, bool have) {
    if (isa.find(token) != std::string::npos && !have)
      missing += std::string(missing.empty() ? "" : ", ") + token;
  };
#if defined(__x86_64__)
  need("AVX512", __builtin_cpu_supports("avx512f") != 0);
  need("AVX2", __builtin_cpu_supports("avx2") != 0);
  for (const char* other : {"NEON", "SVE", "VSX", "ZVECTOR"}) need(other, false);  // other CPUs
#endif
  return missing;
}

std::string torchVersion() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// AOTInductor's metadata of compiled model "model" ("<wrapper>_metadata.json" beside its code, a
// JSON object of texts), read from the archive as LibTorch's load_metadata_from_package does, but
// without extracting it into a folder of /tmp (which that call leaves behind when it throws).
std::unordered_map<std::string, std::string> aotiMetadata(
    const std::string& path, caffe2::serialize::PyTorchStreamReader& reader) {
  std::string record;
  for (const auto& name : modelRecords(reader, "model")) {
    if (name.ends_with("_metadata.json") && !record.ends_with("wrapper_metadata.json")) {
      record = name;
    }
  }
  const std::string expected =
      R"(expected an AOTInductor package with a model named "model" and its metadata)";
  if (record.empty()) {
    failPackage(
        path, expected + " (data/aotinductor/model/*_metadata.json), but it has none; " + kAdvice);
  }
  auto [data, size] = reader.getRecord(record);
  const auto* text = static_cast<const char*>(data.get());
  const json doc = json::parse(text, text + size, nullptr, false);
  if (!doc.is_object()) failPackage(path, expected + ", but " + record + " is not a JSON object");
  std::unordered_map<std::string, std::string> raw;
  for (const auto& [key, value] : doc.items()) {
    if (!value.is_string()) {
      failPackage(path, expected + ", but " + record + " gives \"" + key + "\" as " +
                            value.type_name() + ", not text");
    }
    raw[key] = value.get<std::string>();
  }
  return raw;
}

// AOTInductor's metadata of the package's model "model", read after the whole archive is checked
// (every member's CRC-32, which LibTorch's reader checks none of), so that a damaged package is
// named as such before any of it is read.
std::unordered_map<std::string, std::string> rawMetadata(const std::string& path) {
  checkModelFile(path);
  std::unordered_map<std::string, std::string> raw;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    raw = aotiMetadata(path, reader);
  } catch (const c10::Error& e) {
    failPackage(path,
                std::string("expected an AOTInductor package with a model named \"model\", but its "
                            "metadata could not be read (") +
                    e.what_without_backtrace() + "); " + kAdvice);
  }
  return raw;
}

// The "autobatch" entry of `raw`, parsed: a JSON object with format pt2.
json autobatchDocument(const std::string& path,
                       const std::unordered_map<std::string, std::string>& raw) {
  const auto it = raw.find(kMetadataKey);
  if (it == raw.end()) {
    failPackage(path,
                std::string("expected a training-step package written by autobatch_export.py "
                            "--format pt2, but it has no \"autobatch\" metadata (an inference "
                            "package from aoti_compile_and_package has none); ") +
                    kAdvice);
  }
  json doc = json::parse(it->second, nullptr, false);
  if (!doc.is_object() || stringField(doc, "format") != "pt2") {
    failPackage(
        path,
        std::string("expected the \"autobatch\" metadata as a JSON object with format pt2; ") +
            kAdvice);
  }
  return doc;
}

// Metadata "tensors": each stored tensor's shape and dtype, when the package lists them.
void readTensorLayouts(const std::string& path, const json& doc, Pt2Metadata& m) {
  const auto tensors = doc.find("tensors");
  if (tensors == doc.end()) return;
  if (!tensors->is_object()) failPackage(path, R"(expected metadata "tensors" as an object)");
  for (const auto& [name, entry] : tensors->items()) {
    const auto shape = entry.is_object() ? entry.find("shape") : entry.end();
    if (!entry.is_object() || shape == entry.end() || !shape->is_array()) {
      failPackage(path, R"(expected metadata "tensors" entry ")" + name +
                            R"(" as {"shape": [...], "dtype": "..."})");
    }
    std::vector<std::int64_t> dims;
    for (const auto& d : *shape) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
        failPackage(path, R"(expected metadata "tensors" entry ")" + name +
                              R"(" to have a shape of sizes >= 0)");
      }
      dims.push_back(d.get<std::int64_t>());
    }
    m.tensors[name] = {std::move(dims), stringField(entry, "dtype")};
  }
}

// The fields of the "autobatch" metadata document.
Pt2Metadata parseMetadataDocument(const std::string& path, const json& doc) {
  Pt2Metadata m;
  for (const auto& text : stringList(path, doc, "inputs")) {
    for (auto& spec : parseInputSpecs(text)) m.inputs.push_back(std::move(spec));
  }
  for (const auto& text : stringList(path, doc, "targets")) {
    for (auto& spec : parseInputSpecs(text)) m.targets.push_back(std::move(spec));
  }
  if (m.inputs.empty()) failPackage(path, "expected at least one input in the metadata");
  m.loss = parseLossKind(stringField(doc, "loss").empty() ? "mean" : stringField(doc, "loss"));
  m.gradients = stringList(path, doc, "gradients");
  m.parameters = stringList(path, doc, "parameters");
  m.buffers = stringList(path, doc, "buffers");
  const auto tied = doc.find("tied");
  if (tied != doc.end() && tied->is_array()) {
    for (const auto& group : *tied) {
      std::vector<std::string> names;
      for (const auto& name : group) {
        if (name.is_string()) names.push_back(name.get<std::string>());
      }
      if (names.size() >= 2) m.tied.push_back(std::move(names));
    }
  }
  m.torch_version = stringField(doc, "torch");
  m.precision = stringField(doc, "precision");
  m.accumulate_model = stringField(doc, "accumulate_model");
  m.eager_kernels = doc.contains("eager_kernels") && doc["eager_kernels"].is_array();
  readTensorLayouts(path, doc, m);
  return m;
}

// That this process can run the package: this LibTorch's torch version, fp32, a CPU package for
// this machine and an instruction set this CPU has.
void checkRunsHere(const std::string& path, const Pt2Metadata& m,
                   const std::unordered_map<std::string, std::string>& raw) {
  if (m.torch_version != torchVersion()) {
    failPackage(path, "expected a package built with torch " + torchVersion() +
                          " (this LibTorch), but it "
                          "was built with torch " +
                          (m.torch_version.empty() ? "<unknown>" : m.torch_version) +
                          "; export it again with this torch version");
  }
  if (m.precision != "fp32") {
    failPackage(path, "expected precision fp32 (the only one packages support yet), but got \"" +
                          m.precision + "\"");
  }
  const auto device = raw.find("AOTI_DEVICE_KEY");
  if (device != raw.end() && device->second != "cpu") {
    failPackage(path, "expected a CPU package, but it was compiled for \"" + device->second +
                          "\"; packages run on the CPU only for now");
  }
  const auto machine = raw.find("AOTI_MACHINE");
  struct utsname host {};
  if (machine != raw.end() && uname(&host) == 0 && machine->second != host.machine) {
    failPackage(path, "expected a package for this machine (" + std::string(host.machine) +
                          "), but it was compiled for " + machine->second +
                          "; export it again here");
  }
  const std::string missing = missingIsa(m.cpu_isa);
  if (!missing.empty()) {
    failPackage(path, "expected a package this CPU can run, but it was compiled for " + m.cpu_isa +
                          " and this CPU lacks " + missing + "; export it again on this machine");
  }
}

// A JSON record of the archive, parsed (discarded, not thrown, when it is not JSON).
json jsonRecord(caffe2::serialize::PyTorchStreamReader& reader, const char* name) {
  auto [data, size] = reader.getRecord(name);
  const auto* text = static_cast<const char*>(data.get());
  return json::parse(text, text + size, nullptr, false);
}

}  // namespace

Pt2Metadata readPt2Metadata(const std::string& path) {
  const std::unordered_map<std::string, std::string> raw = rawMetadata(path);
  const json doc = autobatchDocument(path, raw);
  Pt2Metadata m = parseMetadataDocument(path, doc);
  const auto isa = raw.find("AOTI_CPU_ISA");
  if (isa != raw.end()) m.cpu_isa = isa->second;
  checkRunsHere(path, m, raw);
  return m;
}

void readBatchRange(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader,
                    Pt2Metadata& metadata) {
  if (!reader.hasRecord(kBatchRangeRecord)) return;
  const json range = jsonRecord(reader, kBatchRangeRecord);
  const std::string problem = batchRangeProblem(range);
  if (!problem.empty()) {
    failPackage(
        path, std::string("expected ") + kBatchRangeRecord +
                  R"( as {"low": N, "high": M or null, "eager_batch1_error": text or null}, but )" +
                  problem + "; " + kAdvice);
  }
  if (range.contains("eager_batch1_error") && range["eager_batch1_error"].is_string()) {
    metadata.eager_batch1_error =
        eagerErrorText(path, range["eager_batch1_error"].get<std::string>());
  }
  metadata.batch_low = range["low"].get<std::int64_t>();
  if (range.contains("high") && range["high"].is_number_integer()) {
    metadata.batch_high = range["high"].get<std::int64_t>();
    if (metadata.batch_high < metadata.batch_low) {
      failPackage(path, std::string("expected ") + kBatchRangeRecord +
                            " with high >= low, but got " + std::to_string(metadata.batch_low) +
                            " to " + std::to_string(metadata.batch_high) + "; " + kAdvice);
    }
  }
}

void readMemoryCheck(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader,
                     Pt2Metadata& metadata) {
  if (!reader.hasRecord(kMemoryCheckRecord)) return;
  const json check = jsonRecord(reader, kMemoryCheckRecord);
  const std::string problem = memoryCheckProblem(check);
  if (!problem.empty()) {
    failPackage(path,
                std::string("expected ") + kMemoryCheckRecord +
                    R"( as {"status": "passed", "over" or "not-run", "reason": text or null, )"
                    R"("rows": [...]}, but )" +
                    problem + "; " + kAdvice);
  }
  metadata.memory_check = check["status"].get<std::string>();
  if (check.contains("reason") && check["reason"].is_string()) {
    metadata.memory_check_reason = oneLine(check["reason"].get<std::string>());
  }
  for (const json& row : check["rows"]) {
    metadata.memory_check_rows.push_back({row["batch"].get<std::int64_t>(),
                                          row["eager_peak_bytes"].get<std::int64_t>(),
                                          row["package_peak_bytes"].get<std::int64_t>()});
  }
}

}  // namespace autobatch::detail
