// Zip members and their CRC-32 (zip_members.h; PKWARE APPNOTE.TXT 6.3).
#include "vocabulary/zip_members.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <optional>

namespace autobatch::detail {
namespace {

constexpr std::uint32_t kLocalSignature = 0x04034b50;         // APPNOTE 4.3.7
constexpr std::uint32_t kCentralSignature = 0x02014b50;       // 4.3.12
constexpr std::uint32_t kZip64EndSignature = 0x06064b50;      // 4.3.14
constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;  // 4.3.15
constexpr std::uint32_t kEndSignature = 0x06054b50;           // 4.3.16
constexpr std::size_t kLocalHeaderBytes = 30;
constexpr std::size_t kCentralHeaderBytes = 46;
constexpr std::size_t kEndBytes = 22;
constexpr std::size_t kZip64LocatorBytes = 20;
constexpr std::size_t kZip64EndBytes = 56;
constexpr std::uint64_t kMaxComment = 0xFFFF;
constexpr std::uint32_t kZip64Marker32 = 0xFFFFFFFF;
constexpr std::uint16_t kZip64Marker16 = 0xFFFF;
constexpr std::uint16_t kZip64ExtraId = 0x0001;  // 4.5.3
constexpr std::uint16_t kFlagEncrypted = 1U << 0U;
constexpr std::uint16_t kFlagDescriptor = 1U << 3U;
constexpr std::uint16_t kStored = 0;
constexpr std::uint16_t kDeflated = 8;
constexpr std::size_t kPiece = std::size_t{1} << 20U;  // bytes read or inflated at a time

std::uint16_t u16(const unsigned char* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8U));
}

std::uint32_t u32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8U) |
         (static_cast<std::uint32_t>(p[2]) << 16U) | (static_cast<std::uint32_t>(p[3]) << 24U);
}

std::uint64_t u64(const unsigned char* p) {
  return static_cast<std::uint64_t>(u32(p)) | (static_cast<std::uint64_t>(u32(p + 4)) << 32U);
}

std::string hex32(std::uint32_t value) {
  std::array<char, 16> text{};
  std::snprintf(text.data(), text.size(), "0x%08x", value);
  return text.data();
}

// A name for messages: control characters shown as '?', cut at 200 characters.
std::string shown(std::string_view name) {
  std::string out(name.substr(0, 200));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return name.size() > 200 ? out + "..." : out;
}

class FileBytes final : public ZipBytes {
 public:
  FileBytes(int fd, std::uint64_t size) : fd_(fd), size_(size) {}
  ~FileBytes() override { ::close(fd_); }
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  std::uint64_t size() const override { return size_; }
  bool read(std::uint64_t offset, std::size_t n, unsigned char* into) const override {
    if (offset > size_ || n > size_ - offset) return false;
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, into + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      done += static_cast<std::size_t>(got);
    }
    return true;
  }

 private:
  int fd_;
  std::uint64_t size_;
};

class MemoryBytes final : public ZipBytes {
 public:
  explicit MemoryBytes(std::string_view bytes) : bytes_(bytes) {}
  std::uint64_t size() const override { return bytes_.size(); }
  bool read(std::uint64_t offset, std::size_t n, unsigned char* into) const override {
    if (offset > bytes_.size() || n > bytes_.size() - offset) return false;
    std::copy_n(bytes_.data() + offset, n, reinterpret_cast<char*>(into));
    return true;
  }

 private:
  std::string_view bytes_;
};

// The end of central directory's figures (4.3.16, or 4.3.14 when zip64).
struct End {
  std::uint64_t offset = 0;  // of the record that ends the directory (zip64 record when present)
  std::uint64_t entries = 0;
  std::uint64_t directory_bytes = 0;
  std::uint64_t directory_offset = 0;
};

// Finds the end record in the last 65,557 bytes (the record and a comment of at most 65,535
// bytes): the last signature whose comment ends inside the file.
std::optional<std::uint64_t> findEndRecord(const ZipBytes& archive) {
  const std::uint64_t size = archive.size();
  const std::uint64_t window = std::min<std::uint64_t>(size, kEndBytes + kMaxComment);
  std::vector<unsigned char> tail(static_cast<std::size_t>(window));
  if (!archive.read(size - window, tail.size(), tail.data())) return std::nullopt;
  for (std::size_t at = tail.size() - kEndBytes + 1; at-- > 0;) {
    if (u32(&tail[at]) != kEndSignature) continue;
    if (at + kEndBytes + u16(&tail[at + 20]) <= tail.size()) return size - window + at;
  }
  return std::nullopt;
}

// Reads the end records into `end`; returns why they cannot be read, or "".
std::string readEnd(const ZipBytes& archive, End& end) {
  const std::uint64_t size = archive.size();
  if (size < kEndBytes) {
    return "it is " + std::to_string(size) + " bytes, fewer than a zip archive's end record (22)";
  }
  const auto at = findEndRecord(archive);
  if (!at) {
    return "it has no end-of-central-directory record in its last " +
           std::to_string(std::min<std::uint64_t>(size, kEndBytes + kMaxComment)) +
           " bytes, where every zip archive ends: the file was cut short";
  }
  std::array<unsigned char, kEndBytes> record{};
  archive.read(*at, record.size(), record.data());
  if (u16(&record[4]) != 0 || u16(&record[6]) != 0) {
    return "it is one part of an archive split across disks, which LibTorch does not read";
  }
  end = {*at, u16(&record[10]), u32(&record[12]), u32(&record[16])};
  std::array<unsigned char, kZip64LocatorBytes> locator{};
  const bool zip64 = u16(&record[10]) == kZip64Marker16 || u32(&record[12]) == kZip64Marker32 ||
                     u32(&record[16]) == kZip64Marker32;
  const bool has_locator = *at >= kZip64LocatorBytes &&
                           archive.read(*at - kZip64LocatorBytes, locator.size(), locator.data()) &&
                           u32(locator.data()) == kZip64LocatorSignature;
  if (!has_locator) {
    return zip64 ? "its end record asks for a zip64 end record, but there is no zip64 locator "
                   "before it"
                 : "";
  }
  const std::uint64_t record64_at = u64(&locator[8]);
  const std::uint64_t record64_limit = *at - kZip64LocatorBytes;  // the record lies before it
  std::array<unsigned char, kZip64EndBytes> record64{};
  if (record64_limit < record64.size() || record64_at > record64_limit - record64.size() ||
      !archive.read(record64_at, record64.size(), record64.data()) ||
      u32(record64.data()) != kZip64EndSignature) {
    return "its zip64 end record (said to be at offset " + std::to_string(record64_at) +
           ") is not there";
  }
  end = {record64_at, u64(&record64[32]), u64(&record64[40]), u64(&record64[48])};
  return "";
}

// The zip64 extended information (4.5.3) of a central directory entry: replaces the 32-bit
// fields that hold 0xFFFFFFFF, in the order uncompressed, compressed, offset. Returns false when a
// replaced field is missing.
bool applyZip64(const unsigned char* extra, std::size_t extra_bytes, ZipMember& m) {
  const bool need_size = m.bytes == kZip64Marker32;
  const bool need_compressed = m.compressed_bytes == kZip64Marker32;
  const bool need_offset = m.local_header_offset == kZip64Marker32;
  if (!need_size && !need_compressed && !need_offset) return true;
  std::size_t at = 0;
  while (at + 4 <= extra_bytes) {
    const std::uint16_t id = u16(extra + at);
    const std::size_t length = u16(extra + at + 2);
    if (at + 4 + length > extra_bytes) return false;
    if (id == kZip64ExtraId) {
      const unsigned char* field = extra + at + 4;
      std::size_t left = length;
      for (auto [need, value] :
           {std::pair{need_size, &m.bytes}, std::pair{need_compressed, &m.compressed_bytes},
            std::pair{need_offset, &m.local_header_offset}}) {
        if (!need) continue;
        if (left < 8) return false;
        *value = u64(field);
        field += 8;
        left -= 8;
      }
      return true;
    }
    at += 4 + length;
  }
  return false;
}

// Reads entry `index` at `at` (inside the directory, which ends at `directory_end`) into `m`;
// advances `at`. Returns why it cannot be read, or "".
std::string readEntry(const ZipBytes& archive, std::uint64_t& at, std::uint64_t directory_end,
                      std::uint64_t index, ZipMember& m) {
  const std::string which = "its central directory's entry " + std::to_string(index + 1);
  std::array<unsigned char, kCentralHeaderBytes> header{};
  if (directory_end - at < header.size() || !archive.read(at, header.size(), header.data())) {
    return which + " runs past the directory's end";
  }
  if (u32(header.data()) != kCentralSignature) {
    return which + " (at offset " + std::to_string(at) + ") is not an entry (no signature)";
  }
  const std::size_t name_bytes = u16(&header[28]);
  const std::size_t extra_bytes = u16(&header[30]);
  const std::size_t comment_bytes = u16(&header[32]);
  const std::uint64_t entry_bytes = header.size() + name_bytes + extra_bytes + comment_bytes;
  if (directory_end - at < entry_bytes) return which + " runs past the directory's end";
  std::vector<unsigned char> rest(name_bytes + extra_bytes);
  if (!archive.read(at + header.size(), rest.size(), rest.data())) {
    return which + " cannot be read";
  }
  m.name.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(name_bytes));
  m.flags = u16(&header[8]);
  m.method = u16(&header[10]);
  m.crc32 = u32(&header[16]);
  m.compressed_bytes = u32(&header[20]);
  m.bytes = u32(&header[24]);
  m.local_header_offset = u32(&header[42]);
  if (!applyZip64(rest.data() + name_bytes, extra_bytes, m)) {
    return which + " ('" + shown(m.name) +
           "') records its sizes as zip64 but has no whole zip64 extra field";
  }
  at += entry_bytes;
  return "";
}

// CRC-32 and size of the bytes that [offset, offset + compressed) inflate to, stopping past
// `limit` bytes. Returns why they do not inflate, or "".
std::string inflated(const ZipBytes& archive, std::uint64_t offset, std::uint64_t compressed,
                     std::uint64_t limit, std::uint32_t& crc, std::uint64_t& total) {
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK)
    return "could not be inflated (zlib did not start)";
  std::vector<unsigned char> in(
      static_cast<std::size_t>(std::min<std::uint64_t>(compressed, kPiece)));
  std::vector<unsigned char> out(kPiece);
  std::uint64_t read = 0;
  int status = Z_OK;
  std::string why;
  while (status != Z_STREAM_END && why.empty()) {
    if (stream.avail_in == 0) {
      if (read == compressed) {
        why = "has deflated data that ends before the deflate stream does";
        break;
      }
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(compressed - read, kPiece));
      if (!archive.read(offset + read, n, in.data())) {
        why = "cannot be read";
        break;
      }
      read += n;
      stream.next_in = in.data();
      stream.avail_in = static_cast<uInt>(n);
    }
    stream.next_out = out.data();
    stream.avail_out = static_cast<uInt>(out.size());
    status = inflate(&stream, Z_NO_FLUSH);
    const std::size_t produced = out.size() - stream.avail_out;
    crc = static_cast<std::uint32_t>(::crc32(crc, out.data(), static_cast<uInt>(produced)));
    total += produced;
    const bool stuck = status == Z_BUF_ERROR && produced == 0 && stream.avail_in > 0;
    if (stuck || (status != Z_OK && status != Z_STREAM_END && status != Z_BUF_ERROR)) {
      why = std::string("has deflated data that does not inflate (zlib: ") +
            (stream.msg != nullptr ? stream.msg : "error " + std::to_string(status)) + ")";
    } else if (total > limit) {
      why = "inflates to more than the " + std::to_string(limit) +
            " bytes its directory entry records";
    }
  }
  inflateEnd(&stream);
  return why;
}

// CRC-32 of the `n` stored bytes at `offset`; false when they cannot be read.
bool storedCrc(const ZipBytes& archive, std::uint64_t offset, std::uint64_t n, std::uint32_t& crc) {
  std::vector<unsigned char> piece(static_cast<std::size_t>(std::min<std::uint64_t>(n, kPiece)));
  for (std::uint64_t done = 0; done < n;) {
    const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(n - done, kPiece));
    if (!archive.read(offset + done, size, piece.data())) return false;
    crc = static_cast<std::uint32_t>(::crc32(crc, piece.data(), static_cast<uInt>(size)));
    done += size;
  }
  return true;
}

}  // namespace

std::unique_ptr<ZipBytes> zipBytesOfFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    const int saved = S_ISREG(info.st_mode) ? errno : EINVAL;
    ::close(fd);
    errno = saved;
    return nullptr;
  }
  return std::make_unique<FileBytes>(fd, static_cast<std::uint64_t>(info.st_size));
}

std::unique_ptr<ZipBytes> zipBytesOf(std::string_view bytes) {
  return std::make_unique<MemoryBytes>(bytes);
}

ZipListing listZipMembers(const ZipBytes& archive) {
  ZipListing listing;
  End end;
  listing.damage = readEnd(archive, end);
  if (!listing.damage.empty()) return listing;
  listing.directory_offset = end.directory_offset;
  if (end.directory_offset > end.offset ||
      end.directory_bytes > end.offset - end.directory_offset) {
    listing.damage = "its central directory (" + std::to_string(end.directory_bytes) +
                     " bytes at offset " + std::to_string(end.directory_offset) +
                     ") does not lie before its end record (at offset " +
                     std::to_string(end.offset) + ")";
    return listing;
  }
  if (end.entries > end.directory_bytes / kCentralHeaderBytes) {
    listing.damage = "its end record counts " + std::to_string(end.entries) +
                     " members, more than its " + std::to_string(end.directory_bytes) +
                     "-byte central directory can hold";
    return listing;
  }
  std::uint64_t at = end.directory_offset;
  const std::uint64_t directory_end = end.directory_offset + end.directory_bytes;
  for (std::uint64_t i = 0; i < end.entries; ++i) {
    ZipMember m;
    listing.damage = readEntry(archive, at, directory_end, i, m);
    if (!listing.damage.empty()) return listing;
    listing.members.push_back(std::move(m));
  }
  return listing;
}

std::string zipMemberDamage(const ZipBytes& archive, const ZipListing& listing,
                            const ZipMember& member) {
  std::array<unsigned char, kLocalHeaderBytes> header{};
  if (member.local_header_offset > listing.directory_offset ||
      listing.directory_offset - member.local_header_offset < header.size() ||
      !archive.read(member.local_header_offset, header.size(), header.data()) ||
      u32(header.data()) != kLocalSignature) {
    return "has no local header at offset " + std::to_string(member.local_header_offset) +
           ", where its directory entry points";
  }
  const std::size_t name_bytes = u16(&header[26]);
  const std::uint64_t data_offset =
      member.local_header_offset + header.size() + name_bytes + u16(&header[28]);
  std::string local_name(name_bytes, '\0');
  if (!archive.read(member.local_header_offset + header.size(), name_bytes,
                    reinterpret_cast<unsigned char*>(local_name.data())) ||
      local_name != member.name) {
    return "has a local header that names '" + shown(local_name) + "' instead";
  }
  if (data_offset > listing.directory_offset ||
      member.compressed_bytes > listing.directory_offset - data_offset) {
    return "has " + std::to_string(member.compressed_bytes) + " bytes of data at offset " +
           std::to_string(data_offset) + " that run past the start of the central directory (" +
           std::to_string(listing.directory_offset) + ")";
  }
  if ((member.flags & kFlagEncrypted) != 0) return "is encrypted, which LibTorch does not read";
  std::uint32_t crc = 0;
  std::uint64_t total = 0;
  if (member.method == kStored) {
    if (member.compressed_bytes != member.bytes) {
      return "is stored as " + std::to_string(member.compressed_bytes) +
             " bytes, but its directory entry records " + std::to_string(member.bytes) +
             " uncompressed";
    }
    if (!storedCrc(archive, data_offset, member.bytes, crc)) return "cannot be read";
    total = member.bytes;
  } else if (member.method == kDeflated) {
    std::string why =
        inflated(archive, data_offset, member.compressed_bytes, member.bytes, crc, total);
    if (!why.empty()) return why;
    if (total != member.bytes) {
      return "inflates to " + std::to_string(total) + " bytes, but its directory entry records " +
             std::to_string(member.bytes);
    }
  } else {
    return "uses compression method " + std::to_string(member.method) +
           "; LibTorch reads only stored (0) and deflated (8) members";
  }
  if (crc != member.crc32) {
    return "has CRC-32 " + hex32(crc) + ", not the " + hex32(member.crc32) +
           " its central directory records";
  }
  return "";
}

std::string zipArchiveDamage(const ZipBytes& archive) {
  const ZipListing listing = listZipMembers(archive);
  if (!listing.damage.empty()) return listing.damage;
  for (const auto& member : listing.members) {
    const std::string why = zipMemberDamage(archive, listing, member);
    if (!why.empty()) {
      return "member '" + shown(member.name) + "' (" + std::to_string(member.bytes) + " bytes) " +
             why;
    }
  }
  return "";
}

std::vector<std::string> zipLocalNames(const ZipBytes& archive, std::size_t limit) {
  std::vector<std::string> names;
  std::uint64_t at = 0;
  std::array<unsigned char, kLocalHeaderBytes> header{};
  while (names.size() < limit && archive.read(at, header.size(), header.data()) &&
         u32(header.data()) == kLocalSignature) {
    const std::size_t name_bytes = u16(&header[26]);
    const std::size_t extra_bytes = u16(&header[28]);
    std::vector<unsigned char> rest(name_bytes + extra_bytes);
    if (!archive.read(at + header.size(), rest.size(), rest.data())) break;
    ZipMember m;
    m.name.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(name_bytes));
    m.compressed_bytes = u32(&header[18]);
    m.bytes = u32(&header[22]);
    names.push_back(m.name);
    // A local zip64 extra field holds both sizes (4.5.3).
    if (!applyZip64(rest.data() + name_bytes, extra_bytes, m)) break;
    if ((u16(&header[6]) & kFlagDescriptor) != 0 && m.compressed_bytes == 0) break;
    const std::uint64_t data = at + header.size() + rest.size();
    if (m.compressed_bytes > archive.size() - data) break;
    at = data + m.compressed_bytes;
  }
  return names;
}

}  // namespace autobatch::detail
