// The pt2 model format (pt2_package.h, docs/formats.md).
#include "pt2_package.h"

#include <ATen/ops/empty.h>
#include <c10/util/ScopeExit.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner_cpu.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/version.h>

#include <elf.h>
#include <spdlog/spdlog.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "autobatch/error.h"
#include "autobatch/model_metadata.h"
#include "scratch_files.h"
#include "zip_members.h"

namespace autobatch::detail {
namespace {

using nlohmann::json;

constexpr const char* kMetadataKey = "autobatch";
constexpr const char* kWeightsRecord = "data/autobatch/weights.pt";
constexpr const char* kBatchRangeRecord = "data/autobatch/batch_range.json";
constexpr const char* kMemoryCheckRecord = "data/autobatch/memory_check.json";
// The accumulating model's gradient buffers: this prefix, then the stored parameter's name
// (scripts/autobatch_export.py, PT2_GRAD_PREFIX).
constexpr std::string_view kGradPrefix = "autobatch_grad.";
constexpr const char* kDamagedAdvice =
    "copy the file again, or export it again with scripts/autobatch_export.py --format pt2";
constexpr const char* kAdvice =
    "export the model with scripts/autobatch_export.py --format pt2 (or use the TorchScript "
    "format)";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("model package '" + path + "': " + what);
}

std::vector<std::string> stringList(const std::string& path, const json& doc, const char* key) {
  const auto it = doc.find(key);
  if (it == doc.end() || !it->is_array()) {
    fail(path, std::string("expected metadata \"") + key + "\" as a list of strings");
  }
  std::vector<std::string> out;
  for (const auto& item : *it) {
    if (!item.is_string()) {
      fail(path, std::string("expected metadata \"") + key + "\" as a list of strings");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

// Why the ELF image `bytes` (an entry of the package) would not load whole, or "" when every
// table and loaded segment its header names lies inside it (elf(5)). dlopen maps a cut-short
// file's segments past its end and the process dies of SIGBUS on first touch, before any error
// can be reported: LibTorch's loader does not check.
std::string elfDamage(const char* bytes, std::size_t size) {
  Elf64_Ehdr header{};
  if (size < sizeof(header) || std::memcmp(bytes, ELFMAG, SELFMAG) != 0) {
    return "it is not an ELF shared object";
  }
  std::memcpy(&header, bytes, sizeof(header));
  if (header.e_ident[EI_CLASS] != ELFCLASS64) return "it is not a 64-bit ELF shared object";
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (header.e_ident[EI_DATA] != ELFDATA2LSB) return "it is not little-endian, as this CPU is";
#endif
  if (header.e_type != ET_DYN) {
    return "it is not a shared object (ELF type " + std::to_string(header.e_type) + ")";
  }
#if defined(__x86_64__)
  constexpr std::uint16_t kThisMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr std::uint16_t kThisMachine = EM_AARCH64;
#else
  constexpr std::uint16_t kThisMachine = 0;  // not checked
#endif
  if (kThisMachine != 0 && header.e_machine != kThisMachine) {
    return "it is built for another machine (ELF machine " + std::to_string(header.e_machine) +
           ", this one is " + std::to_string(kThisMachine) + ")";
  }
  const auto inside = [&](std::uint64_t offset, std::uint64_t length) {
    return offset <= size && length <= size - offset;
  };
  const std::uint64_t program_table = std::uint64_t{header.e_phnum} * header.e_phentsize;
  if (header.e_phentsize < sizeof(Elf64_Phdr) || !inside(header.e_phoff, program_table)) {
    return "its program header table lies past its end";
  }
  int loaded = 0;
  for (std::uint16_t i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment{};
    std::memcpy(&segment, bytes + header.e_phoff + std::uint64_t{i} * header.e_phentsize,
                sizeof(segment));
    if (segment.p_type != PT_LOAD) continue;
    ++loaded;
    if (!inside(segment.p_offset, segment.p_filesz)) {
      return "segment " + std::to_string(i) + " (" + std::to_string(segment.p_filesz) +
             " bytes at offset " + std::to_string(segment.p_offset) + ") lies past its end";
    }
    if (segment.p_memsz < segment.p_filesz) {
      return "segment " + std::to_string(i) + " is smaller in memory than in the file";
    }
  }
  if (loaded == 0) return "it has no loadable segment";
  if (header.e_shoff != 0 &&
      !inside(header.e_shoff, std::uint64_t{header.e_shnum} * header.e_shentsize)) {
    return "its section header table lies past its end";
  }
  return "";
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
    fail(path, std::string(R"(expected "eager_batch1_error" in )") + kBatchRangeRecord +
                   " as the error's text or null, but it is blank; " + kAdvice);
  }
  return text;
}

// Checks every compiled library (.so) in the package before LibTorch's loader maps it.
void checkCompiledCode(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader) {
  for (const auto& name : reader.getAllRecords()) {
    if (!name.ends_with(".so")) continue;
    auto [data, size] = reader.getRecord(name);
    const std::string why = elfDamage(static_cast<const char*>(data.get()), size);
    if (!why.empty()) {
      fail(path, "expected whole compiled code, but " + name + " (" + std::to_string(size) +
                     " bytes) is damaged: " + why + "; the package was cut short or altered: " +
                     "export it again with scripts/autobatch_export.py --format pt2");
    }
  }
}

std::string shapeText(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return text + "]";
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

// Sends what the process writes to file descriptor 2 into a temporary file while it lives: the
// package's wrapper prints a failed call's text and c10 logs its exception there ("Exception in
// aoti_torch: ...", "Error: ... API call failed at ..."), which an out-of-memory trial, an expected
// outcome, must not put on the user's terminal. The CLI's own log writes to a copy of descriptor
// 2 taken at start, so its lines still reach the terminal.
class StderrCapture {
 public:
  StderrCapture() {
    std::cerr.flush();
    std::fflush(stderr);
    file_ = std::tmpfile();
    if (file_ == nullptr) return;
    saved_ = dup(2);
    if (saved_ < 0 || dup2(fileno(file_), 2) < 0) {
      if (saved_ >= 0) close(saved_);
      std::fclose(file_);
      file_ = nullptr;
    }
  }
  ~StderrCapture() { (void)finish(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Restores descriptor 2; returns what was written meanwhile.
  std::string finish() {
    if (file_ == nullptr) return {};
    std::cerr.flush();
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    std::string text;
    std::rewind(file_);
    std::array<char, 4096> chunk{};
    std::size_t n = 0;
    while ((n = std::fread(chunk.data(), 1, chunk.size(), file_)) > 0) text.append(chunk.data(), n);
    std::fclose(file_);
    file_ = nullptr;
    return text;
  }

 private:
  std::FILE* file_ = nullptr;
  int saved_ = -1;
};

std::string torchVersion() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// The records of compiled model `model` (names as the reader gives them, without the archive's
// folder): data/aotinductor/<model>/... The slash matters: LibTorch's loader took "model" to
// include "model2/".
std::vector<std::string> modelRecords(caffe2::serialize::PyTorchStreamReader& reader,
                                      const std::string& model) {
  const std::string folder = "data/aotinductor/" + model + "/";
  std::vector<std::string> out;
  for (const auto& name : reader.getAllRecords()) {
    if (name.starts_with(folder)) out.push_back(name);
  }
  return out;
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
    fail(path, expected + " (data/aotinductor/model/*_metadata.json), but it has none; " + kAdvice);
  }
  auto [data, size] = reader.getRecord(record);
  const auto* text = static_cast<const char*>(data.get());
  const json doc = json::parse(text, text + size, nullptr, false);
  if (!doc.is_object()) fail(path, expected + ", but " + record + " is not a JSON object");
  std::unordered_map<std::string, std::string> raw;
  for (const auto& [key, value] : doc.items()) {
    if (!value.is_string()) {
      fail(path, expected + ", but " + record + " gives \"" + key + "\" as " + value.type_name() +
                     ", not text");
    }
    raw[key] = value.get<std::string>();
  }
  return raw;
}

}  // namespace

// One compiled model of the package, run by LibTorch's CPU runner from its library (what
// AOTIModelPackageLoader wraps, without its extraction into /tmp).
class Pt2Model {
 public:
  explicit Pt2Model(const std::string& library_path)
      : runner_(std::make_unique<torch::inductor::AOTIModelContainerRunnerCpu>(library_path)) {}

  // The original names (fully qualified) of the model's constants.
  std::vector<std::string> constantFqns() const {
    std::vector<std::string> out;
    for (const auto& [name, fqn] : runner_->getConstantNamesToOriginalFQNs()) out.push_back(fqn);
    return out;
  }

  // Gives the model `constants` (by original name) as AOTIModelPackageLoader::load_constants does.
  void loadConstants(const std::unordered_map<std::string, at::Tensor>& constants,
                     bool check_full_update) {
    std::unordered_map<std::string, std::string> name_of;
    for (const auto& [name, fqn] : runner_->getConstantNamesToOriginalFQNs()) name_of[fqn] = name;
    std::unordered_map<std::string, at::Tensor> by_name;
    for (const auto& [fqn, tensor] : constants) {
      const auto it = name_of.find(fqn);
      if (it == name_of.end()) throw Error("model package: no constant named \"" + fqn + "\"");
      by_name.emplace(it->second, tensor);
    }
    runner_->update_constant_buffer(by_name, /*use_inactive=*/false, check_full_update,
                                    /*user_managed=*/true);
  }

  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) {
    return runner_->run(inputs);
  }

 private:
  std::unique_ptr<torch::inductor::AOTIModelContainerRunner> runner_;
};

namespace {

// The stored weights (data/autobatch/weights.pt, itself a zip archive written by torch.save),
// unpickled. A damaged archive is named as the package's own members are (zip_members.h); one
// LibTorch cannot read is a damaged package too, not a runtime error.
c10::IValue storedWeights(const std::string& path, std::string_view bytes) {
  const std::string damage = zipArchiveDamage(*zipBytesOf(bytes));
  if (!damage.empty()) {
    fail(path, std::string("package damaged: expected ") + kWeightsRecord +
                   " as a whole torch.save archive, but " + damage + "; " + kDamagedAdvice);
  }
  try {
    return torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    fail(path, std::string("package damaged: expected ") + kWeightsRecord +
                   " as a torch.save archive of name -> tensor, but LibTorch cannot read it (" +
                   message.substr(0, message.find('\n')) + "); " + kDamagedAdvice);
  }
}

// Loads compiled model `model` (its metadata name; `index` names its files): its library (and
// the JSON of the ATen calls beside it) is written into `folder` (a folder of ours under TMPDIR)
// and loaded from there. The caller removes the folder once the models are loaded: the library
// stays mapped, and no run, signal or crash after that leaves a file behind. `what` names the
// model in messages.
std::unique_ptr<Pt2Model> loadModel(const std::string& path,
                                    caffe2::serialize::PyTorchStreamReader& reader,
                                    ScratchFolder& folder, const std::string& model, int index,
                                    const std::string& what) {
  std::string library;
  for (const auto& name : modelRecords(reader, model)) {
    // Several: AOTInductor's own choice, the wrapper (Triton CPU adds kernel libraries).
    if (name.ends_with(".so") && (library.empty() || name.ends_with(".wrapper.so"))) {
      library = name;
    }
  }
  if (library.empty()) {
    fail(path, "package damaged: expected the compiled code of " + what + " (data/aotinductor/" +
                   model + "/*.so), but the package has none; export it " +
                   "again with scripts/autobatch_export.py --format pt2 (a package of C++ " +
                   "sources to compile at load time is not run)");
  }
  // Beside the library, the runner reads "<stem>.json" (the ATen kernels the package calls
  // through its proxy executor): the package's own, under the same stem.
  const std::string stem = "model" + std::to_string(index);
  const std::string calls = library.substr(0, library.size() - 3) + ".json";
  if (reader.hasRecord(calls)) {
    auto [data, size] = reader.getRecord(calls);
    folder.writeFile(stem + ".json", data.get(), size);
  }
  auto [data, size] = reader.getRecord(library);
  return std::make_unique<Pt2Model>(folder.writeFile(stem + ".so", data.get(), size));
}

}  // namespace

bool isAotiPackage(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    for (const auto& name : reader.getAllRecords()) {
      if (name.rfind("data/aotinductor/", 0) == 0) return true;
    }
  } catch (const std::exception&) {
  }
  return false;
}

bool isExportProgram(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    bool program = false;
    for (const auto& name : reader.getAllRecords()) {
      if (name.rfind("data/aotinductor/", 0) == 0) return false;
      program = program || name.rfind("models/", 0) == 0;
    }
    return program;
  } catch (const std::exception&) {
  }
  return false;
}

Pt2Metadata readPt2Metadata(const std::string& path) {
  // A whole archive first: every member's CRC-32 (LibTorch's reader checks none), so that a
  // damaged package is named as such before any of it is read.
  checkModelFile(path);
  std::unordered_map<std::string, std::string> raw;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    raw = aotiMetadata(path, reader);
  } catch (const c10::Error& e) {
    fail(path, std::string("expected an AOTInductor package with a model named \"model\", but its "
                           "metadata could not be read (") +
                   e.what_without_backtrace() + "); " + kAdvice);
  }
  const auto it = raw.find(kMetadataKey);
  if (it == raw.end()) {
    fail(path, std::string("expected a training-step package written by autobatch_export.py "
                           "--format pt2, but it has no \"autobatch\" metadata (an inference "
                           "package from aoti_compile_and_package has none); ") +
                   kAdvice);
  }
  const json doc = json::parse(it->second, nullptr, false);
  if (!doc.is_object() || stringField(doc, "format") != "pt2") {
    fail(path,
         std::string("expected the \"autobatch\" metadata as a JSON object with format pt2; ") +
             kAdvice);
  }
  Pt2Metadata m;
  for (const auto& text : stringList(path, doc, "inputs")) {
    for (auto& spec : parseInputSpecs(text)) m.inputs.push_back(std::move(spec));
  }
  for (const auto& text : stringList(path, doc, "targets")) {
    for (auto& spec : parseInputSpecs(text)) m.targets.push_back(std::move(spec));
  }
  if (m.inputs.empty()) fail(path, "expected at least one input in the metadata");
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
  const auto tensors = doc.find("tensors");
  if (tensors != doc.end()) {
    if (!tensors->is_object()) fail(path, R"(expected metadata "tensors" as an object)");
    for (const auto& [name, entry] : tensors->items()) {
      const auto shape = entry.is_object() ? entry.find("shape") : entry.end();
      if (!entry.is_object() || shape == entry.end() || !shape->is_array()) {
        fail(path, R"(expected metadata "tensors" entry ")" + name +
                       R"(" as {"shape": [...], "dtype": "..."})");
      }
      std::vector<std::int64_t> dims;
      for (const auto& d : *shape) {
        if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
          fail(path, R"(expected metadata "tensors" entry ")" + name +
                         R"(" to have a shape of sizes >= 0)");
        }
        dims.push_back(d.get<std::int64_t>());
      }
      m.tensors[name] = {std::move(dims), stringField(entry, "dtype")};
    }
  }
  const auto isa = raw.find("AOTI_CPU_ISA");
  if (isa != raw.end()) m.cpu_isa = isa->second;
  if (m.torch_version != torchVersion()) {
    fail(path, "expected a package built with torch " + torchVersion() +
                   " (this LibTorch), but it "
                   "was built with torch " +
                   (m.torch_version.empty() ? "<unknown>" : m.torch_version) +
                   "; export it again with this torch version");
  }
  if (m.precision != "fp32") {
    fail(path, "expected precision fp32 (the only one packages support yet), but got \"" +
                   m.precision + "\"");
  }
  const auto device = raw.find("AOTI_DEVICE_KEY");
  if (device != raw.end() && device->second != "cpu") {
    fail(path, "expected a CPU package, but it was compiled for \"" + device->second +
                   "\"; packages run on the CPU only for now");
  }
  const auto machine = raw.find("AOTI_MACHINE");
  struct utsname host {};
  if (machine != raw.end() && uname(&host) == 0 && machine->second != host.machine) {
    fail(path, "expected a package for this machine (" + std::string(host.machine) +
                   "), but it was compiled for " + machine->second + "; export it again here");
  }
  const std::string missing = missingIsa(m.cpu_isa);
  if (!missing.empty()) {
    fail(path, "expected a package this CPU can run, but it was compiled for " + m.cpu_isa +
                   " and this CPU lacks " + missing + "; export it again on this machine");
  }
  return m;
}

Pt2Package::Pt2Package(const std::string& path) : metadata_(readPt2Metadata(path)) {
  // The stored weights: a dict name -> tensor written by torch.save. All of the archive autobatch
  // reads is checked before LibTorch's loader unpacks and maps the compiled code (a damaged
  // package fails before it leaves a folder in /tmp).
  std::map<std::string, at::Tensor> stored;
  {
    caffe2::serialize::PyTorchStreamReader reader(path);
    checkCompiledCode(path, reader);
    if (!reader.hasRecord(kWeightsRecord)) {
      fail(path, std::string("expected the weights at ") + kWeightsRecord +
                     ", but there are none; " + kAdvice);
    }
    if (reader.hasRecord(kBatchRangeRecord)) {
      auto [range_data, range_size] = reader.getRecord(kBatchRangeRecord);
      const auto* text = static_cast<const char*>(range_data.get());
      const json range = json::parse(text, text + range_size, nullptr, false);
      const std::string problem = batchRangeProblem(range);
      if (!problem.empty()) {
        fail(path,
             std::string("expected ") + kBatchRangeRecord +
                 R"( as {"low": N, "high": M or null, "eager_batch1_error": text or null}, but )" +
                 problem + "; " + kAdvice);
      }
      if (range.contains("eager_batch1_error") && range["eager_batch1_error"].is_string()) {
        metadata_.eager_batch1_error =
            eagerErrorText(path, range["eager_batch1_error"].get<std::string>());
      }
      metadata_.batch_low = range["low"].get<std::int64_t>();
      if (range.contains("high") && range["high"].is_number_integer()) {
        metadata_.batch_high = range["high"].get<std::int64_t>();
        if (metadata_.batch_high < metadata_.batch_low) {
          fail(path, std::string("expected ") + kBatchRangeRecord + " with high >= low, but got " +
                         std::to_string(metadata_.batch_low) + " to " +
                         std::to_string(metadata_.batch_high) + "; " + kAdvice);
        }
      }
    }
    if (reader.hasRecord(kMemoryCheckRecord)) {
      auto [check_data, check_size] = reader.getRecord(kMemoryCheckRecord);
      const auto* text = static_cast<const char*>(check_data.get());
      const json check = json::parse(text, text + check_size, nullptr, false);
      const std::string problem = memoryCheckProblem(check);
      if (!problem.empty()) {
        fail(path, std::string("expected ") + kMemoryCheckRecord +
                       R"( as {"status": "passed", "over" or "not-run", "reason": text or null, )"
                       R"("rows": [...]}, but )" +
                       problem + "; " + kAdvice);
      }
      metadata_.memory_check = check["status"].get<std::string>();
      if (check.contains("reason") && check["reason"].is_string()) {
        metadata_.memory_check_reason = oneLine(check["reason"].get<std::string>());
      }
      for (const json& row : check["rows"]) {
        metadata_.memory_check_rows.push_back({row["batch"].get<std::int64_t>(),
                                               row["eager_peak_bytes"].get<std::int64_t>(),
                                               row["package_peak_bytes"].get<std::int64_t>()});
      }
    }
    auto [data, size] = reader.getRecord(kWeightsRecord);
    const auto* bytes = static_cast<const char*>(data.get());
    const c10::IValue value = storedWeights(path, std::string_view(bytes, size));
    if (!value.isGenericDict()) fail(path, "expected the stored weights as a dict of tensors");
    for (const auto& entry : value.toGenericDict()) {
      if (!entry.key().isString() || !entry.value().isTensor()) {
        fail(path, "expected the stored weights as a dict of name -> tensor");
      }
      stored[entry.key().toStringRef()] = entry.value().toTensor();
    }
    // The compiled code, loaded from a folder of ours under TMPDIR that is removed at the end of
    // this block however it ends (the libraries stay mapped): LibTorch's loader extracted into
    // /tmp whatever TMPDIR said, and left the folder on every exit that skipped its destructor.
    ScratchFolder folder("autobatch-pt2-");
    loader_ = loadModel(path, reader, folder, "model", 0, R"(its model "model")");
    if (!metadata_.accumulate_model.empty()) {
      const std::string what = R"(the model its metadata names in "accumulate_model" (")" +
                               metadata_.accumulate_model + "\")";
      try {
        accumulate_loader_ = loadModel(path, reader, folder, metadata_.accumulate_model, 1, what);
      } catch (const c10::Error& e) {
        const std::string message = e.what_without_backtrace();
        fail(path, "expected " + what + ", but LibTorch could not load it (" +
                       message.substr(0, message.find('\n')) +
                       "); the package is damaged: export it again with "
                       "scripts/autobatch_export.py --format pt2");
      }
    }
  }
  // What the compiled code reads: each tensor in the shape and dtype it had at export, laid out
  // contiguously. Another shape would be read (or written) out of bounds.
  for (auto& [name, tensor] : stored) {
    const auto it = metadata_.tensors.find(name);
    if (it != metadata_.tensors.end()) {
      const auto& [shape, dtype] = it->second;
      const std::string got_dtype = c10::toString(tensor.scalar_type());
      if (tensor.sizes() != c10::IntArrayRef(shape) || (!dtype.empty() && got_dtype != dtype)) {
        fail(path, "expected the stored tensor \"" + name + "\" as " + dtype + " " +
                       shapeText(shape) + " (what the compiled code reads), but " + kWeightsRecord +
                       " holds " + got_dtype + " " + shapeText(tensor.sizes().vec()) +
                       "; the package is damaged: export it again with "
                       "scripts/autobatch_export.py --format pt2");
      }
    }
    if (!tensor.is_contiguous()) tensor = tensor.contiguous();
  }
  // Tied copies read the stored tensor of their group's first name.
  std::map<std::string, std::string> owner_name;
  for (const auto& group : metadata_.tied) {
    for (std::size_t i = 1; i < group.size(); ++i) owner_name[group[i]] = group[0];
  }
  const auto stored_name = [&](const std::string& name) {
    const auto it = owner_name.find(name);
    return it == owner_name.end() ? name : it->second;
  };
  std::unordered_map<std::string, at::Tensor> constants;
  // The stored tensor a compiled model's constant reads (`model`: which of the two, for errors).
  const auto constant = [&](const std::string& name, const char* model) {
    const auto it = stored.find(stored_name(name));
    if (it == stored.end()) {
      fail(path, std::string("expected a stored tensor for the ") + model + " constant \"" + name +
                     "\", but there is none; " + kAdvice);
    }
    return it->second;
  };
  for (const auto& name : loader_->constantFqns()) {
    constants[name] = constant(name, "package's");
  }
  std::map<std::string, std::size_t> index;
  for (const auto& name : metadata_.parameters) {
    const std::string owner = stored_name(name);
    if (index.contains(owner)) continue;
    const auto it = stored.find(owner);
    if (it == stored.end()) fail(path, "expected a stored tensor for parameter \"" + owner + "\"");
    it->second.set_requires_grad(true);
    index[owner] = parameters_.size();
    parameters_.push_back(it->second);
  }
  for (const auto& name : metadata_.buffers) {
    const auto it = stored.find(name);
    if (it != stored.end()) buffers_.push_back(it->second);
  }
  for (const auto& name : metadata_.gradients) {
    const auto it = index.find(stored_name(name));
    if (it == index.end()) fail(path, "expected gradient \"" + name + "\" to name a parameter");
    gradient_owners_.push_back(it->second);
  }
  loader_->loadConstants(constants, /*check_full_update=*/true);
  if (!accumulate_loader_) return;
  // The same step, adding each gradient into a buffer: the weights now, the buffers (the
  // parameters' .grad tensors) at every call.
  std::unordered_map<std::string, at::Tensor> weights;
  for (const auto& name : accumulate_loader_->constantFqns()) {
    if (name.starts_with(kGradPrefix)) {
      const auto it = index.find(name.substr(kGradPrefix.size()));
      if (it == index.end()) {
        fail(path, "expected the accumulating model's buffer \"" + name +
                       "\" to name a stored parameter; " + kAdvice);
      }
      // A slot: a tensor laid out as the parameter whose storage owns nothing; each call points
      // it at the parameter's .grad and loads it again. LibTorch 2.11's AOTI runtime keeps an
      // alias of every user-managed tensor it is given and never frees it
      // (aoti_runtime/utils.h, MaybeOwningAtenTensorHandle), and reads a constant's data pointer
      // when it is loaded (ConstantHandle): given the .grad tensors themselves, their memory
      // would stay held after every trial. Given a slot, what stays is the alias of the slot
      // (one at::Tensor of 8 bytes per parameter and call, outside the budget).
      const at::Tensor& parameter = parameters_[it->second];
      c10::Storage storage(c10::Storage::use_byte_size_t(), parameter.nbytes(),
                           c10::DataPtr(parameter.data_ptr(), parameter.device()),
                           /*allocator=*/nullptr, /*resizable=*/false);
      at::Tensor slot = at::empty({0}, parameter.options().requires_grad(false))
                            .set_(storage, 0, parameter.sizes(), parameter.strides());
      weights[name] = slot;
      accumulate_into_.push_back({name, it->second, storage, slot});
      continue;
    }
    weights[name] = constant(name, "accumulating model's");
  }
  // One buffer per trained parameter: a frozen one (requires_grad off at export) gets no
  // gradient and no buffer.
  std::vector<std::size_t> trained = gradient_owners_;
  std::ranges::sort(trained);
  trained.erase(std::unique(trained.begin(), trained.end()), trained.end());
  std::vector<std::size_t> buffered;
  for (const auto& slot : accumulate_into_) buffered.push_back(slot.parameter);
  std::ranges::sort(buffered);
  if (buffered != trained) {
    fail(path, "expected one gradient buffer per trained parameter in the accumulating model (" +
                   std::to_string(trained.size()) + "), but it has " +
                   std::to_string(accumulate_into_.size()) +
                   " that do not match; the package is damaged or was not written by this "
                   "autobatch_export.py: export it again with --format pt2");
  }
  accumulate_loader_->loadConstants(weights, /*check_full_update=*/true);
  for (auto& slot : accumulate_into_) pointSlot(slot.storage, nullptr);
}

bool Pt2Package::canAccumulate() const {
  if (!accumulate_loader_) return false;
  // The compiled code writes the buffer as laid out at export: the parameter's layout.
  return std::ranges::all_of(accumulate_into_, [this](const Slot& slot) {
    const at::Tensor& parameter = parameters_[slot.parameter];
    const at::Tensor& grad = parameter.grad();
    return grad.defined() && grad.sizes() == parameter.sizes() &&
           grad.strides() == parameter.strides() && grad.scalar_type() == parameter.scalar_type() &&
           grad.device() == parameter.device();
  });
}

at::Tensor Pt2Package::runAccumulating(const std::vector<at::Tensor>& inputs) {
  std::unordered_map<std::string, at::Tensor> pointed;
  for (auto& slot : accumulate_into_) {
    pointSlot(slot.storage, parameters_[slot.parameter].grad().data_ptr());
    pointed[slot.name] = slot.tensor;
  }
  // Pointed back at nothing however the call ends: a slot left on a freed .grad would be written
  // by a later call that forgot to point it.
  const auto unpoint = c10::make_scope_exit([this] {
    for (auto& slot : accumulate_into_) pointSlot(slot.storage, nullptr);
  });
  accumulate_loader_->loadConstants(pointed, /*check_full_update=*/false);
  std::vector<at::Tensor> outputs = call(*accumulate_loader_, inputs);
  if (outputs.size() != 1) {
    throw Error(
        "model package: expected the loss alone from the accumulating model's call, but "
        "got " +
        std::to_string(outputs.size()) + " outputs");
  }
  return outputs[0];
}

Pt2Package::~Pt2Package() = default;

std::string Pt2Package::batchOutOfRange(std::int64_t batch) const {
  const std::int64_t low = metadata_.batch_low <= 2 ? 1 : metadata_.batch_low;
  const std::int64_t high = metadata_.batch_high;
  if (batch >= low && (high == 0 || batch <= high)) return "";
  return "the package was compiled for micro-batches " + std::to_string(low) + " to " +
         (high == 0 ? std::string("any") : std::to_string(high)) +
         " (Inductor's guards on the batch at export; it computes wrong values outside them), "
         "not " +
         std::to_string(batch) + "; export at an example batch near the sizes to search";
}

std::string Pt2Package::eagerStepError(std::int64_t batch) const {
  if (batch != 1 || metadata_.eager_batch1_error.empty()) return "";
  return metadata_.eager_batch1_error +
         " (the model's eager step raised this at micro-batch 1 when it was exported; the compiled "
         "package would run it, the eager training job would not)";
}

void Pt2Package::pointSlot(c10::Storage& storage, void* data) {
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(c10::DataPtr(data, storage.device()));
}

std::vector<at::Tensor> Pt2Package::run(const std::vector<at::Tensor>& inputs) {
  return call(*loader_, inputs);
}

std::vector<at::Tensor> Pt2Package::call(Pt2Model& loader, const std::vector<at::Tensor>& inputs) {
  StderrCapture capture;
  std::vector<at::Tensor> outputs;
  try {
    outputs = loader.run(inputs);
  } catch (...) {
    const std::string text = capture.finish();
    if (!text.empty()) spdlog::debug("package call wrote to stderr:\n{}", text);
    throw;
  }
  const std::string text = capture.finish();
  if (!text.empty()) spdlog::debug("package call wrote to stderr:\n{}", text);
  return outputs;
}

}  // namespace autobatch::detail
