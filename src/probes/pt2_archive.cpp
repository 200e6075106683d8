// The pt2 package's archive (pt2_archive.h): the records of a compiled model and the check of
// its compiled code (ELF) before it is mapped.
#include "probes/pt2_archive.h"

#include <caffe2/serialize/inline_container.h>
#include <elf.h>

#include <cstdint>
#include <cstring>

#include "autobatch/vocabulary/error.h"

namespace autobatch::detail {
namespace {

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

}  // namespace

void failPackage(const std::string& path, const std::string& what) {
  throw Error("model package '" + path + "': " + what);
}

std::vector<std::string> modelRecords(caffe2::serialize::PyTorchStreamReader& reader,
                                      const std::string& model) {
  const std::string folder = "data/aotinductor/" + model + "/";
  std::vector<std::string> out;
  for (const auto& name : reader.getAllRecords()) {
    if (name.starts_with(folder)) out.push_back(name);
  }
  return out;
}

void checkCompiledCode(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader) {
  for (const auto& name : reader.getAllRecords()) {
    if (!name.ends_with(".so")) continue;
    auto [data, size] = reader.getRecord(name);
    const std::string why = elfDamage(static_cast<const char*>(data.get()), size);
    if (!why.empty()) {
      failPackage(path, "expected whole compiled code, but " + name + " (" + std::to_string(size) +
                            " bytes) is damaged: " + why +
                            "; the package was cut short or altered: " +
                            "export it again with scripts/autobatch_export.py --format pt2");
    }
  }
}

}  // namespace autobatch::detail
