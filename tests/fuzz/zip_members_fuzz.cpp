// libFuzzer target for the zip member parser (src/vocabulary/zip_members.h): the input is read as a
// zip archive (a model file or the weights.pt inside a package), with the seeds
// tests/fuzz/corpus/zip_members/ (stored, deflated, zip64, a data descriptor).
//
// Properties checked (a violation aborts, which libFuzzer reports as a crash):
// - nothing throws, and no read leaves the input (ASan);
// - a listed member's name and figures come from inside the input: at most as many members as
//   the input holds 46-byte directory entries, the directory inside the input;
// - an archive called whole has every member's local header and data before its directory, and
//   a stored member's data has the CRC-32 the directory records (computed here independently);
// - zipLocalNames returns at most its limit, and names the first local header's member when the
//   input starts with one whose name is inside it.
// Built by scripts/fuzz.sh (CMake option AUTOBATCH_FUZZ, clang's -fsanitize=fuzzer).
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "vocabulary/zip_members.h"

namespace {

using autobatch::detail::ZipListing;

void check(bool ok, const char* property) {
  if (!ok) {
    std::fprintf(stderr, "property violated: %s\n", property);
    std::abort();
  }
}

void checkWhole(std::string_view input, const ZipListing& listing) {
  for (const auto& m : listing.members) {
    check(m.local_header_offset + 30 + m.name.size() <= listing.directory_offset,
          "a whole member's local header lies before the directory");
    if (m.method != 0) continue;
    const std::size_t name_bytes =
        static_cast<unsigned char>(input[m.local_header_offset + 26]) |
        (static_cast<std::size_t>(static_cast<unsigned char>(input[m.local_header_offset + 27]))
         << 8U);
    const std::size_t extra_bytes =
        static_cast<unsigned char>(input[m.local_header_offset + 28]) |
        (static_cast<std::size_t>(static_cast<unsigned char>(input[m.local_header_offset + 29]))
         << 8U);
    const std::uint64_t data = m.local_header_offset + 30 + name_bytes + extra_bytes;
    check(data + m.bytes <= listing.directory_offset, "a whole member's data lies before it");
    const auto crc = static_cast<std::uint32_t>(::crc32(
        0, reinterpret_cast<const Bytef*>(input.data() + data), static_cast<uInt>(m.bytes)));
    check(crc == m.crc32, "a whole stored member has its recorded CRC-32");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto archive = autobatch::detail::zipBytesOf(input);
  try {
    const ZipListing listing = autobatch::detail::listZipMembers(*archive);
    check(listing.members.size() <= size / 46, "no more members than directory entries fit");
    if (listing.damage.empty()) {
      check(listing.directory_offset <= size, "the directory starts inside the input");
      if (autobatch::detail::zipArchiveDamage(*archive).empty()) checkWhole(input, listing);
    }
    const auto names = autobatch::detail::zipLocalNames(*archive, 4);
    check(names.size() <= 4, "zipLocalNames keeps to its limit");
    if (size >= 30 && input.substr(0, 4) == std::string_view("PK\3\4", 4)) {
      const std::size_t name_bytes =
          static_cast<unsigned char>(input[26]) |
          (static_cast<std::size_t>(static_cast<unsigned char>(input[27])) << 8U);
      const std::size_t extra_bytes =
          static_cast<unsigned char>(input[28]) |
          (static_cast<std::size_t>(static_cast<unsigned char>(input[29])) << 8U);
      if (30 + name_bytes + extra_bytes <= size) {
        check(!names.empty() && names[0] == input.substr(30, name_bytes),
              "the first local header's name is read");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "the zip parser threw: %s\n", e.what());
    check(false, "nothing throws");
  }
  return 0;
}
