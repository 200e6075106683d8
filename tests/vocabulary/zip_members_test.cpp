// The zip member parser and its CRC-32 check (src/vocabulary/zip_members.h, issue 27 row 4) on
// archives built here byte by byte (PKWARE APPNOTE.TXT 6.3): stored, deflated, zip64, data
// descriptors, and every way of cutting or altering them. checkModelFile's words for a damaged file
// too.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/model_metadata.h"
#include "vocabulary/zip_members.h"

namespace autobatch::detail {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace zip_members_test {

struct Entry {
  std::string name;
  std::string data;          // uncompressed
  bool deflate = false;      // method 8 (raw deflate) instead of 0 (stored)
  bool descriptor = false;   // bit 3: CRC and sizes after the data, zeros in the local header
  std::uint16_t method = 0;  // when not 0 or 8: written as stored bytes with this method
  std::uint16_t flags = 0;   // extra flag bits (bit 0: encrypted)
};

void put16(std::string& out, std::uint64_t v) {
  out += static_cast<char>(v & 0xFFU);
  out += static_cast<char>((v >> 8U) & 0xFFU);
}
void put32(std::string& out, std::uint64_t v) {
  put16(out, v & 0xFFFFU);
  put16(out, (v >> 16U) & 0xFFFFU);
}
void put64(std::string& out, std::uint64_t v) {
  put32(out, v & 0xFFFFFFFFU);
  put32(out, v >> 32U);
}

std::uint32_t crcOf(const std::string& data) {
  return static_cast<std::uint32_t>(
      ::crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
}

std::string rawDeflate(const std::string& data) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&s, static_cast<uLong>(data.size())), '\0');
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  s.avail_in = static_cast<uInt>(data.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

// A zip archive of `entries` (APPNOTE 4.3.6). zip64: every size and offset in the zip64 extra
// field (0xFFFFFFFF in the headers) and a zip64 end record with its locator.
std::string buildZip(const std::vector<Entry>& entries, bool zip64 = false) {
  std::string out;
  std::string directory;
  for (const auto& e : entries) {
    const std::string stored = e.deflate ? rawDeflate(e.data) : e.data;
    const std::uint16_t method = e.deflate ? 8 : e.method;
    const auto flags = static_cast<std::uint16_t>(e.flags | (e.descriptor ? 8U : 0U));
    const std::uint64_t offset = out.size();
    std::string extra;
    if (zip64) {
      put16(extra, 1);
      put16(extra, 24);
      put64(extra, e.data.size());
      put64(extra, stored.size());
      put64(extra, offset);
    }
    put32(out, 0x04034b50);
    put16(out, 45);
    put16(out, flags);
    put16(out, method);
    put32(out, 0);
    put32(out, e.descriptor ? 0 : crcOf(e.data));
    put32(out, e.descriptor ? 0 : (zip64 ? 0xFFFFFFFFU : stored.size()));
    put32(out, e.descriptor ? 0 : (zip64 ? 0xFFFFFFFFU : e.data.size()));
    put16(out, e.name.size());
    put16(out, zip64 ? 20 : 0);
    out += e.name;
    if (zip64) out += extra.substr(0, 4 + 16).replace(2, 2, std::string("\x10\x00", 2));
    out += stored;
    if (e.descriptor) {
      put32(out, 0x08074b50);
      put32(out, crcOf(e.data));
      put32(out, stored.size());
      put32(out, e.data.size());
    }
    put32(directory, 0x02014b50);
    put16(directory, 45);
    put16(directory, 45);
    put16(directory, flags);
    put16(directory, method);
    put32(directory, 0);
    put32(directory, crcOf(e.data));
    put32(directory, zip64 ? 0xFFFFFFFFU : stored.size());
    put32(directory, zip64 ? 0xFFFFFFFFU : e.data.size());
    put16(directory, e.name.size());
    put16(directory, extra.size());
    put16(directory, 0);
    put16(directory, 0);
    put16(directory, 0);
    put32(directory, 0);
    put32(directory, zip64 ? 0xFFFFFFFFU : offset);
    directory += e.name + extra;
  }
  const std::uint64_t directory_offset = out.size();
  out += directory;
  if (zip64) {
    const std::uint64_t record = out.size();
    put32(out, 0x06064b50);
    put64(out, 44);
    put16(out, 45);
    put16(out, 45);
    put32(out, 0);
    put32(out, 0);
    put64(out, entries.size());
    put64(out, entries.size());
    put64(out, directory.size());
    put64(out, directory_offset);
    put32(out, 0x07064b50);
    put32(out, 0);
    put64(out, record);
    put32(out, 1);
  }
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, zip64 ? 0xFFFF : entries.size());
  put16(out, zip64 ? 0xFFFF : entries.size());
  put32(out, zip64 ? 0xFFFFFFFFU : directory.size());
  put32(out, zip64 ? 0xFFFFFFFFU : directory_offset);
  put16(out, 0);
  return out;
}

std::string text(std::size_t n, char seed) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<char>(seed + static_cast<char>(i % 23));
  return s;
}

const std::vector<Entry> kThree = {{"archive/data.pkl", text(300, 'a')},
                                   {"archive/code/model.py", text(5000, 'A'), true},
                                   {"archive/version", "3\n"}};

std::string damageOf(const std::string& zip) { return zipArchiveDamage(*zipBytesOf(zip)); }

TEST(ZipMembersTest, StoredAndDeflatedMembersListWithTheirCrcAndSizes) {
  // Catches a parser that reads the sizes' fields swapped, the CRC from the wrong offset, a
  // deflated member's CRC taken over its compressed bytes, or skips the comment and extra fields.
  const std::string zip = buildZip(kThree);
  const ZipListing listing = listZipMembers(*zipBytesOf(zip));
  ASSERT_EQ(listing.damage, "");
  ASSERT_EQ(listing.members.size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(listing.members[i].name, kThree[i].name);
    EXPECT_EQ(listing.members[i].bytes, kThree[i].data.size());
    EXPECT_EQ(listing.members[i].crc32, crcOf(kThree[i].data));
  }
  EXPECT_EQ(listing.members[1].method, 8);
  EXPECT_LT(listing.members[1].compressed_bytes, 5000U);  // really deflated
  EXPECT_EQ(listing.members[0].local_header_offset, 0U);
  EXPECT_EQ(damageOf(zip), "");
}

TEST(ZipMembersTest, EveryAlteredByteOfAStoredMemberIsNamedWithBothCrcs) {
  // Catches a check that samples the data (the 4-byte change ran), or compares the CRC
  // of the wrong member. Every byte of member 1's data, flipped in turn.
  const std::string zip = buildZip(kThree);
  const std::size_t data_at = 30 + kThree[0].name.size();
  for (std::size_t i = 0; i < kThree[0].data.size(); ++i) {
    std::string bad = zip;
    bad[data_at + i] = static_cast<char>(bad[data_at + i] ^ 0x5a);
    const std::string damage = damageOf(bad);
    EXPECT_EQ(damage.rfind("member 'archive/data.pkl' (300 bytes) has CRC-32 0x", 0), 0U) << i;
    EXPECT_NE(damage.find(", not the 0x"), std::string::npos) << damage;
  }
}

TEST(ZipMembersTest, AlteredDeflatedDataIsDamageWhateverItInflatesTo) {
  // Catches a check that skips deflated members or reports success when zlib stops early. Each
  // byte of member 2's deflated data zeroed: it inflates to other bytes, fails to inflate, or
  // inflates to another size; every case is named.
  const std::string zip = buildZip(kThree);
  const ZipListing listing = listZipMembers(*zipBytesOf(zip));
  const ZipMember& m = listing.members[1];
  const std::size_t data_at = m.local_header_offset + 30 + m.name.size();
  int changed = 0;
  for (std::size_t i = 0; i < m.compressed_bytes; ++i) {
    std::string bad = zip;
    if (bad[data_at + i] == '\0') continue;
    bad[data_at + i] = '\0';
    ++changed;
    EXPECT_EQ(damageOf(bad).rfind("member 'archive/code/model.py' (5000 bytes) ", 0), 0U) << i;
  }
  EXPECT_GT(changed, 10);
}

TEST(ZipMembersTest, EveryCutOfTheFileIsDamageAndTheLocalHeadersTellWhatIsLeft) {
  // Catches reads past the end of a cut file (ASan in scripts/sanitize.sh), a cut inside the
  // central directory or the end record taken as whole, and a local-header walk that counts a
  // member whose data is cut.
  const std::string zip = buildZip(kThree);
  const ZipListing whole = listZipMembers(*zipBytesOf(zip));
  for (std::size_t n = 0; n < zip.size(); ++n) {
    const std::string cut = zip.substr(0, n);
    EXPECT_NE(damageOf(cut), "") << n;
    std::size_t complete = 0;
    for (const auto& m : whole.members) {
      complete += m.local_header_offset + 30 + m.name.size() + m.compressed_bytes <= n ? 1 : 0;
    }
    const auto names = zipLocalNames(*zipBytesOf(cut), 10);
    // A header whose name is read counts even when its data is cut: at most one more.
    EXPECT_GE(names.size(), complete) << n;
    EXPECT_LE(names.size(), std::min<std::size_t>(complete + 1, 3)) << n;
  }
  EXPECT_EQ(damageOf(zip.substr(0, 21)),
            "it is 21 bytes, fewer than a zip archive's end record (22)");
  EXPECT_EQ(damageOf(zip.substr(0, 200)).rfind("it has no end-of-central-directory record", 0), 0U);
  EXPECT_EQ(zipLocalNames(*zipBytesOf(zip), 2).size(), 2U);  // the limit
}

TEST(ZipMembersTest, Zip64RecordsAndExtraFieldsGiveTheRealSizes) {
  // Catches a reader that takes 0xFFFFFFFF as a size or offset, misses the zip64 end record, or
  // reads the extra field's values in the wrong order.
  const std::string zip = buildZip(kThree, /*zip64=*/true);
  const ZipListing listing = listZipMembers(*zipBytesOf(zip));
  ASSERT_EQ(listing.damage, "");
  ASSERT_EQ(listing.members.size(), 3U);
  EXPECT_EQ(listing.members[1].bytes, 5000U);
  EXPECT_GT(listing.members[1].local_header_offset, 300U);
  EXPECT_EQ(damageOf(zip), "");
  EXPECT_EQ(zipLocalNames(*zipBytesOf(zip), 10).size(), 3U);
  // The locator pointing past its own place: no zip64 end record there.
  std::string bad = zip;
  const std::size_t locator = zip.size() - 22 - 20;
  bad[locator + 8] = static_cast<char>(0xF0);
  EXPECT_EQ(damageOf(bad).rfind("its zip64 end record (said to be at offset ", 0), 0U);
}

TEST(ZipMembersTest, DataDescriptorsTakeTheDirectorysFigures) {
  // Catches a check that reads CRC and sizes from a local header written before the data (zeros
  // with bit 3), which would call every streamed archive damaged.
  std::vector<Entry> entries = kThree;
  for (auto& e : entries) e.descriptor = true;
  const std::string zip = buildZip(entries);
  EXPECT_EQ(damageOf(zip), "");
  // The walk of local headers stops at the first member whose size it cannot know.
  EXPECT_EQ(zipLocalNames(*zipBytesOf(zip), 10).size(), 1U);
}

TEST(ZipMembersTest, ADamagedDirectoryIsNamedNotRead) {
  // Catches a reader that trusts the end record's counts and offsets: each altered field is
  // reported in words, with no read outside the file.
  const std::string zip = buildZip(kThree);
  const std::size_t end = zip.size() - 22;
  std::string more = zip;
  more[end + 10] = static_cast<char>(0xFF);  // 255 members: more than the directory holds
  EXPECT_NE(damageOf(more).find("its end record counts 255 members"), std::string::npos);
  std::string past = zip;
  past[end + 19] = 0x40;  // the directory's offset far past the end record
  EXPECT_NE(damageOf(past).find("does not lie before its end record"), std::string::npos);
  std::string unsigned_entry = zip;
  const std::size_t directory = listZipMembers(*zipBytesOf(zip)).directory_offset;
  unsigned_entry[directory] = 'X';
  EXPECT_EQ(damageOf(unsigned_entry), "its central directory's entry 1 (at offset " +
                                          std::to_string(directory) +
                                          ") is not an entry (no signature)");
  std::string split = zip;
  split[end + 4] = 1;
  EXPECT_NE(damageOf(split).find("split across disks"), std::string::npos);
}

TEST(ZipMembersTest, MembersThatDoNotMatchTheirDirectoryEntryAreNamed) {
  // Catches a check limited to the CRC: a local header of another member, sizes that differ from
  // the directory's, data reaching into the directory, and what LibTorch cannot read at all.
  const std::string zip = buildZip(kThree);
  std::string renamed = zip;
  renamed[30] = 'X';  // member 1's local name
  EXPECT_EQ(damageOf(renamed),
            "member 'archive/data.pkl' (300 bytes) has a local header that names "
            "'Xrchive/data.pkl' instead");
  const ZipListing listing = listZipMembers(*zipBytesOf(zip));
  ZipMember larger = listing.members[0];
  larger.compressed_bytes = larger.bytes = 301;
  EXPECT_NE(zipMemberDamage(*zipBytesOf(zip), listing, larger).find("has CRC-32"),
            std::string::npos);
  larger.compressed_bytes = larger.bytes = zip.size();
  EXPECT_NE(zipMemberDamage(*zipBytesOf(zip), listing, larger)
                .find("that run past the start of the central directory"),
            std::string::npos);
  ZipMember sizes = listing.members[0];
  sizes.bytes = 299;
  EXPECT_EQ(zipMemberDamage(*zipBytesOf(zip), listing, sizes),
            "is stored as 300 bytes, but its directory entry records 299 uncompressed");
  ZipMember deflated = listing.members[1];
  deflated.bytes = 4999;
  EXPECT_EQ(zipMemberDamage(*zipBytesOf(zip), listing, deflated),
            "inflates to more than the 4999 bytes its directory entry records");
  deflated.bytes = 5001;
  EXPECT_EQ(zipMemberDamage(*zipBytesOf(zip), listing, deflated),
            "inflates to 5000 bytes, but its directory entry records 5001");
  EXPECT_EQ(damageOf(buildZip({{"a", "xyz", false, false, 12}})),
            "member 'a' (3 bytes) uses compression method 12; LibTorch reads only stored (0) and "
            "deflated (8) members");
  EXPECT_EQ(damageOf(buildZip({{"a", "xyz", false, false, 0, 1}})),
            "member 'a' (3 bytes) is encrypted, which LibTorch does not read");
}

TEST(ZipMembersTest, AFileIsReadAsMemoryIs) {
  // Catches pread offsets off by the read so far, and a missing file or a folder taken as empty.
  const std::filesystem::path dir = std::filesystem::path(AUTOBATCH_TEST_TMP) / "zip_members";
  std::filesystem::create_directories(dir);
  const std::string zip = buildZip(kThree);
  std::ofstream(dir / "three.zip", std::ios::binary) << zip;
  const auto file = zipBytesOfFile((dir / "three.zip").string());
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->size(), zip.size());
  EXPECT_EQ(zipArchiveDamage(*file), "");
  EXPECT_EQ(zipBytesOfFile((dir / "missing.zip").string()), nullptr);
  EXPECT_EQ(zipBytesOfFile(dir.string()), nullptr);
}

std::string checkModelFileError(const std::string& name, const std::string& bytes) {
  const std::filesystem::path dir = std::filesystem::path(AUTOBATCH_TEST_TMP) / "zip_members";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    checkModelFile(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ZipMembersTest, CheckModelFileSaysWhichFormatIsDamagedAndNamesTheMember) {
  // Catches a truncated pt2 package called "expected a TorchScript archive" (issue 27 row 21):
  // the members left before the cut tell the format. Catches a damaged member left unnamed.
  const std::vector<Entry> package = {{"pkg/archive_format", "pt2"},
                                      {"pkg/data/aotinductor/model/x.wrapper.so", text(4000, '0')},
                                      {"pkg/data/autobatch/weights.pt", text(900, 'w')}};
  const std::string zip = buildZip(package);
  EXPECT_EQ(checkModelFileError("whole.pt2", zip), "");
  const std::string cut = checkModelFileError("cut.pt2", zip.substr(0, 3000));
  EXPECT_EQ(cut.rfind("model file '", 0), 0U);
  EXPECT_NE(cut.find(".pt2': package damaged: expected a whole zip archive"), std::string::npos)
      << cut;
  EXPECT_NE(cut.find("the file was cut short (what is left holds a pt2 package's members, from "
                     "'pkg/archive_format')"),
            std::string::npos)
      << cut;
  EXPECT_NE(cut.find("export it again with scripts/autobatch_export.py --format pt2"),
            std::string::npos);
  std::string altered = zip;
  altered[altered.find("0123")] = 'Z';
  const std::string crc = checkModelFileError("altered.pt2", altered);
  EXPECT_NE(crc.find("package damaged: expected a whole zip archive, every member as its central "
                     "directory records it, but member 'pkg/data/aotinductor/model/x.wrapper.so' "
                     "(4000 bytes) has CRC-32 0x"),
            std::string::npos)
      << crc;
  std::string script = buildZip(kThree);
  script[30 + kThree[0].name.size()] = 'Z';
  const std::string archive = checkModelFileError("altered.pt", script);
  EXPECT_NE(archive.find("archive damaged: expected a whole zip archive"), std::string::npos);
  EXPECT_NE(archive.find("member 'archive/data.pkl'"), std::string::npos);
  EXPECT_NE(archive.find("save it again with torch.jit.save"), std::string::npos);
}

}  // namespace zip_members_test
}  // namespace
}  // namespace autobatch::detail
