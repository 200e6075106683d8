// The pt2 model format (pt2_package.h, docs/formats.md): the package's compiled code loaded with
// its stored weights, and its calls. Its metadata is read in pt2_metadata.cpp, the archive's
// shared records and checks are in pt2_archive.cpp.
#include "probes/pt2_package.h"

#include <ATen/ops/empty.h>
#include <c10/util/ScopeExit.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner_cpu.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "autobatch/vocabulary/error.h"
#include "memory/scratch_files.h"
#include "memory/stderr_capture.h"
#include "probes/pt2_archive.h"
#include "probes/pt2_metadata.h"
#include "vocabulary/zip_members.h"

namespace autobatch::detail {
namespace {

// The accumulating model's gradient buffers: this prefix, then the stored parameter's name
// (scripts/autobatch_export.py, PT2_GRAD_PREFIX).
constexpr std::string_view kGradPrefix = "autobatch_grad.";

std::string shapeText(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return text + "]";
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
    failPackage(path, std::string("package damaged: expected ") + kWeightsRecord +
                          " as a whole torch.save archive, but " + damage + "; " + kDamagedAdvice);
  }
  try {
    return torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    failPackage(path,
                std::string("package damaged: expected ") + kWeightsRecord +
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
    failPackage(path, "package damaged: expected the compiled code of " + what +
                          " (data/aotinductor/" + model +
                          "/*.so), but the package has none; export it " +
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

namespace {

// The stored weights as a dict name -> tensor, read after the rest of the archive autobatch reads
// is checked.
std::map<std::string, at::Tensor> readStoredTensors(
    const std::string& path, caffe2::serialize::PyTorchStreamReader& reader) {
  auto [data, size] = reader.getRecord(kWeightsRecord);
  const auto* bytes = static_cast<const char*>(data.get());
  const c10::IValue value = storedWeights(path, std::string_view(bytes, size));
  if (!value.isGenericDict()) failPackage(path, "expected the stored weights as a dict of tensors");
  std::map<std::string, at::Tensor> stored;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      failPackage(path, "expected the stored weights as a dict of name -> tensor");
    }
    stored[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return stored;
}

// The package's second model, the one its metadata names in "accumulate_model" (null when none);
// a library LibTorch cannot load is a damaged package.
std::unique_ptr<Pt2Model> loadAccumulateModel(const std::string& path,
                                              caffe2::serialize::PyTorchStreamReader& reader,
                                              ScratchFolder& folder, const Pt2Metadata& metadata) {
  if (metadata.accumulate_model.empty()) return nullptr;
  const std::string what = R"(the model its metadata names in "accumulate_model" (")" +
                           metadata.accumulate_model + "\")";
  try {
    return loadModel(path, reader, folder, metadata.accumulate_model, 1, what);
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    failPackage(path, "expected " + what + ", but LibTorch could not load it (" +
                          message.substr(0, message.find('\n')) +
                          "); the package is damaged: export it again with "
                          "scripts/autobatch_export.py --format pt2");
  }
}

// What the compiled code reads: each tensor in the shape and dtype it had at export, laid out
// contiguously. Another shape would be read (or written) out of bounds.
void checkStoredLayouts(const std::string& path, const Pt2Metadata& metadata,
                        std::map<std::string, at::Tensor>& stored) {
  for (auto& [name, tensor] : stored) {
    const auto it = metadata.tensors.find(name);
    if (it != metadata.tensors.end()) {
      const auto& [shape, dtype] = it->second;
      const std::string got_dtype = c10::toString(tensor.scalar_type());
      if (tensor.sizes() != c10::IntArrayRef(shape) || (!dtype.empty() && got_dtype != dtype)) {
        failPackage(path, "expected the stored tensor \"" + name + "\" as " + dtype + " " +
                              shapeText(shape) + " (what the compiled code reads), but " +
                              kWeightsRecord + " holds " + got_dtype + " " +
                              shapeText(tensor.sizes().vec()) +
                              "; the package is damaged: export it again with "
                              "scripts/autobatch_export.py --format pt2");
      }
    }
    if (!tensor.is_contiguous()) tensor = tensor.contiguous();
  }
}

}  // namespace

// The stored tensors by name, and the name each tied copy reads (its group's first name).
class Pt2StoredTensors {
 public:
  Pt2StoredTensors(std::string path, std::map<std::string, at::Tensor> stored,
                   const std::vector<std::vector<std::string>>& tied)
      : path_(std::move(path)), stored_(std::move(stored)) {
    for (const auto& group : tied) {
      for (std::size_t i = 1; i < group.size(); ++i) owner_name_[group[i]] = group[0];
    }
  }

  // The stored name `name` reads: itself, or its tied group's first name.
  std::string storedName(const std::string& name) const {
    const auto it = owner_name_.find(name);
    return it == owner_name_.end() ? name : it->second;
  }

  // The stored tensor a compiled model's constant reads (`model`: which of the two, for errors).
  at::Tensor constant(const std::string& name, const char* model) const {
    const auto it = stored_.find(storedName(name));
    if (it == stored_.end()) {
      failPackage(path_, std::string("expected a stored tensor for the ") + model + " constant \"" +
                             name + "\", but there is none; " + kAdvice);
    }
    return it->second;
  }

  // The stored tensor of `name` itself (no tied lookup); null when there is none.
  at::Tensor* find(const std::string& name) {
    const auto it = stored_.find(name);
    return it == stored_.end() ? nullptr : &it->second;
  }

 private:
  std::string path_;
  std::map<std::string, at::Tensor> stored_;
  std::map<std::string, std::string> owner_name_;
};

Pt2Package::Pt2Package(const std::string& path) : metadata_(readPt2Metadata(path)) {
  // The stored weights: a dict name -> tensor written by torch.save. All of the archive autobatch
  // reads is checked before LibTorch's loader unpacks and maps the compiled code (a damaged
  // package fails before it leaves a folder in /tmp).
  std::map<std::string, at::Tensor> stored;
  {
    caffe2::serialize::PyTorchStreamReader reader(path);
    checkCompiledCode(path, reader);
    if (!reader.hasRecord(kWeightsRecord)) {
      failPackage(path, std::string("expected the weights at ") + kWeightsRecord +
                            ", but there are none; " + kAdvice);
    }
    readBatchRange(path, reader, metadata_);
    readMemoryCheck(path, reader, metadata_);
    stored = readStoredTensors(path, reader);
    // The compiled code, loaded from a folder of ours under TMPDIR that is removed at the end of
    // this block however it ends (the libraries stay mapped): LibTorch's loader extracted into
    // /tmp whatever TMPDIR said, and left the folder on every exit that skipped its destructor.
    ScratchFolder folder("autobatch-pt2-");
    loader_ = loadModel(path, reader, folder, "model", 0, R"(its model "model")");
    accumulate_loader_ = loadAccumulateModel(path, reader, folder, metadata_);
  }
  checkStoredLayouts(path, metadata_, stored);
  Pt2StoredTensors tensors(path, std::move(stored), metadata_.tied);
  std::unordered_map<std::string, at::Tensor> constants;
  for (const auto& name : loader_->constantFqns()) {
    constants[name] = tensors.constant(name, "package's");
  }
  const std::map<std::string, std::size_t> index = bindParameters(path, tensors);
  loader_->loadConstants(constants, /*check_full_update=*/true);
  if (accumulate_loader_) bindAccumulating(path, tensors, index);
}

std::map<std::string, std::size_t> Pt2Package::bindParameters(const std::string& path,
                                                              Pt2StoredTensors& tensors) {
  std::map<std::string, std::size_t> index;
  for (const auto& name : metadata_.parameters) {
    const std::string owner = tensors.storedName(name);
    if (index.contains(owner)) continue;
    at::Tensor* parameter = tensors.find(owner);
    if (parameter == nullptr) {
      failPackage(path, "expected a stored tensor for parameter \"" + owner + "\"");
    }
    parameter->set_requires_grad(true);
    index[owner] = parameters_.size();
    parameters_.push_back(*parameter);
  }
  for (const auto& name : metadata_.buffers) {
    if (at::Tensor* buffer = tensors.find(name)) buffers_.push_back(*buffer);
  }
  for (const auto& name : metadata_.gradients) {
    const auto it = index.find(tensors.storedName(name));
    if (it == index.end())
      failPackage(path, "expected gradient \"" + name + "\" to name a parameter");
    gradient_owners_.push_back(it->second);
  }
  return index;
}

// The same step, adding each gradient into a buffer: the weights now, the buffers (the
// parameters' .grad tensors) at every call.
void Pt2Package::bindAccumulating(const std::string& path, const Pt2StoredTensors& tensors,
                                  const std::map<std::string, std::size_t>& index) {
  std::unordered_map<std::string, at::Tensor> weights;
  for (const auto& name : accumulate_loader_->constantFqns()) {
    if (!name.starts_with(kGradPrefix)) {
      weights[name] = tensors.constant(name, "accumulating model's");
      continue;
    }
    const auto it = index.find(name.substr(kGradPrefix.size()));
    if (it == index.end()) {
      failPackage(path, "expected the accumulating model's buffer \"" + name +
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
  }
  checkGradientBuffers(path);
  accumulate_loader_->loadConstants(weights, /*check_full_update=*/true);
  for (auto& slot : accumulate_into_) pointSlot(slot.storage, nullptr);
}

// One buffer per trained parameter: a frozen one (requires_grad off at export) gets no gradient
// and no buffer.
void Pt2Package::checkGradientBuffers(const std::string& path) const {
  std::vector<std::size_t> trained = gradient_owners_;
  std::ranges::sort(trained);
  trained.erase(std::unique(trained.begin(), trained.end()), trained.end());
  std::vector<std::size_t> buffered;
  for (const auto& slot : accumulate_into_) buffered.push_back(slot.parameter);
  std::ranges::sort(buffered);
  if (buffered != trained) {
    failPackage(path,
                "expected one gradient buffer per trained parameter in the accumulating model (" +
                    std::to_string(trained.size()) + "), but it has " +
                    std::to_string(accumulate_into_.size()) +
                    " that do not match; the package is damaged or was not written by this "
                    "autobatch_export.py: export it again with --format pt2");
  }
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
