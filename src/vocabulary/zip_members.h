// zip_members.h (internal) — the members of a zip archive as its central directory lists them, and
// whether each member's data is whole: its CRC-32 and sizes against what the directory records.
// Both model formats are zip archives (TorchScript: torch.jit.save; pt2: AOTInductor's package).
// LibTorch's reader (miniz, built without its CRC checks) reads a member whatever its bytes are:
// a package whose compiled code was altered ran, crashed (SIGSEGV) or trapped (issue 27, row 4).
// LibTorch-free, so that the parser is fuzzed (tests/fuzz/zip_members_fuzz.cpp).
//
// Format: PKWARE's APPNOTE.TXT 6.3 (4.3.7 local file header, 4.3.12 central directory header,
// 4.3.14-4.3.16 zip64 end of central directory record and locator, end of central directory
// record; 4.4.4 general purpose bit flag: bit 0 encrypted, bit 3 data descriptor; 4.4.5 methods
// 0 stored and 8 deflated; 4.5.3 the zip64 extended information extra field). CRC-32 is zlib's
// crc32 (the polynomial APPNOTE 4.4.7 names, 0xEDB88320 reflected); deflated data is inflated by
// zlib, as the CRC is over the uncompressed bytes.
//
// Every read is bounds-checked against the archive's size: a damaged or hostile archive gives a
// reason in words, never a read outside it. Thread safety: the functions share no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace autobatch::detail {

/// Where an archive's bytes come from: a file (read with pread, never mapped: a file cut short
/// while mapped would end the process with SIGBUS) or memory (tests, fuzzing, an archive inside
/// an archive).
class ZipBytes {
 public:
  virtual ~ZipBytes() = default;
  /// The archive's size, in bytes.
  virtual std::uint64_t size() const = 0;
  /// Copies `n` bytes at `offset` into `into`; false when they are not all inside the archive
  /// (or cannot be read), and then `into` holds nothing useful.
  virtual bool read(std::uint64_t offset, std::size_t n, unsigned char* into) const = 0;
};

/// The bytes of the file at `path`, or nullptr when it cannot be opened (errno tells why).
std::unique_ptr<ZipBytes> zipBytesOfFile(const std::string& path);

/// `bytes` as an archive; they must outlive the result (not copied).
std::unique_ptr<ZipBytes> zipBytesOf(std::string_view bytes);

/// One member, as the central directory records it (APPNOTE 4.3.12; zip64 values applied).
struct ZipMember {
  std::string name;
  std::uint16_t flags = 0;   ///< general purpose bit flag (bit 0 encrypted, bit 3 descriptor)
  std::uint16_t method = 0;  ///< 0 stored, 8 deflated; others are not read by LibTorch
  std::uint32_t crc32 = 0;   ///< CRC-32 of the uncompressed data
  std::uint64_t compressed_bytes = 0;
  std::uint64_t bytes = 0;  ///< uncompressed size
  std::uint64_t local_header_offset = 0;
};

/// The central directory: every member, where the directory starts, or why it cannot be read.
struct ZipListing {
  std::vector<ZipMember> members;
  /// Offset of the central directory's first byte: no member's data may reach past it.
  std::uint64_t directory_offset = 0;
  /// Why the directory is not whole, as a clause ("the file ends 120 bytes into ..."); "" when
  /// it is. Then members holds those read before the fault.
  std::string damage;
};

/// Reads the central directory of `archive` (end record found in the last 65,557 bytes, zip64
/// record when the end record says so). Never throws for any content; a directory that names
/// more members than its size can hold, lies past the end of the file, or ends inside an entry
/// is damage.
ZipListing listZipMembers(const ZipBytes& archive);

/// Why `member`'s data in `archive` is not what `listing`'s directory records, as a clause after
/// the member's name ("has CRC-32 0x00000000, not the 0x1a2b3c4d its central directory
/// records"); "" when it is whole. Checks its local header (signature, the
/// same name), that its data lies before the central directory, the sizes, and the CRC-32 over
/// the uncompressed data (deflated data is inflated in 1 MiB pieces). Encrypted members and
/// methods other than stored and deflated are damage too (LibTorch reads neither). Reads the
/// member's bytes once; never throws for any content (std::bad_alloc aside).
std::string zipMemberDamage(const ZipBytes& archive, const ZipListing& listing,
                            const ZipMember& member);

/// The first damaged thing in `archive`: the directory ("its central directory ...") or the first
/// member whose data is not whole ("member 'NAME' ..."), as a clause; "" when every member is
/// whole. Reads every member once.
std::string zipArchiveDamage(const ZipBytes& archive);

/// The names in the local headers from the start of `archive`, read one after another while
/// each header and its data lie inside the file (at most `limit`): what a file whose central
/// directory is gone (cut short) still holds. Stops at a member with a data descriptor whose
/// sizes are not in its header. Never throws for any content.
std::vector<std::string> zipLocalNames(const ZipBytes& archive, std::size_t limit);

}  // namespace autobatch::detail
