// The process-wide memory limits (cgroup v1 / v2 discovery, need against limit) and the guard, on
// fake /proc and /sys/fs/cgroup trees written under a temporary folder. LibTorch-free.
#include "memory/process_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace autobatch::detail {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace process_memory_test {

namespace fs = std::filesystem;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
// What cgroup v1 shows for "no limit": PAGE_COUNTER_MAX pages of 4 KiB.
constexpr const char* kV1Unlimited = "9223372036854771712";

class ProcessMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tree_root = fs::path(AUTOBATCH_TEST_TMP) /
                ("process_memory_" +
                 std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                 "_" + std::to_string(getpid()));
    fs::remove_all(tree_root);
    fs::create_directories(tree_root);
  }
  void TearDown() override { fs::remove_all(tree_root); }

  // Writes `text` to root + `path` (an absolute path of the fake tree).
  void write(const std::string& path, const std::string& text) const {
    const fs::path file = tree_root.string() + path;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  // A cgroup folder's limit and usage files: v1 (memory.limit_in_bytes, memory.usage_in_bytes)
  // or v2 (memory.max, memory.current).
  void writeV1(const std::string& dir, const std::string& limit, const std::string& usage) const {
    write(dir + "/memory.limit_in_bytes", limit);
    write(dir + "/memory.usage_in_bytes", usage);
  }
  void writeV2(const std::string& dir, const std::string& max, const std::string& current) const {
    write(dir + "/memory.max", max);
    write(dir + "/memory.current", current);
  }
  std::string root() const { return tree_root.string(); }

  fs::path tree_root;
};

// A v1 cgroup level at `dir` with `limit_bytes`, as readCgroupMemoryLimits() would give it.
CgroupMemoryLimit v1Level(const std::string& dir, std::int64_t limit_bytes) {
  CgroupMemoryLimit level;
  level.version = 1;
  level.dir = dir;
  level.limit_bytes = limit_bytes;
  return level;
}

// mountinfo lines as the kernel writes them.
const std::string kV1MemoryMount =
    "40 30 0:35 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
const std::string kV1CpuMount =
    "39 30 0:34 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
const std::string kRootMount = "22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/a\n";

// The case found on this machine kind: the process sits in a nested v1 cgroup; reading the mount's
// top folder only (as autobatch did) finds no limit, and the process is killed at the limit.
TEST_F(ProcessMemoryTest, CgroupV1NestedPathIsFollowedToItsLimit) {
  writeV1("/sys/fs/cgroup/memory", kV1Unlimited, "9000000000");
  writeV1("/sys/fs/cgroup/memory/process_api", kV1Unlimited, "8000000000");
  const std::string job = "/sys/fs/cgroup/memory/process_api/f075";
  write(job + "/memory.limit_in_bytes", "1610612736\n");
  write(job + "/memory.usage_in_bytes", "300000000\n");
  write(job + "/memory.stat",
        "cache 70000000\nrss 200000000\nmapped_file 1\ninactive_file 2\nactive_file 3\n"
        "hierarchical_memory_limit 1610612736\ntotal_cache 70000000\ntotal_rss 200000000\n"
        "total_mapped_file 10000000\ntotal_inactive_file 20000000\ntotal_active_file 50000000\n");
  const auto levels = readCgroupMemoryLimits("5:cpu,cpuacct:/\n4:memory:/process_api/f075\n0::/\n",
                                             kRootMount + kV1CpuMount + kV1MemoryMount, root());
  ASSERT_EQ(levels.size(), 1U);
  EXPECT_EQ(levels[0].version, 1);
  EXPECT_EQ(levels[0].dir, job);
  EXPECT_EQ(levels[0].limit_bytes, 1610612736);
  EXPECT_EQ(levels[0].usage_bytes, 300000000);
  EXPECT_EQ(levels[0].file_bytes, 70000000);  // the total_ (hierarchical) keys, not the local ones
  EXPECT_EQ(levels[0].mapped_file_bytes, 10000000);
  // Unmapped page cache (70 MB - 10 MB mapped) is reclaimed before a kill.
  EXPECT_EQ(levels[0].needBytes(), 300000000 - 60000000);
  EXPECT_EQ(levels[0].headroomBytes(), 1610612736 - 240000000);
  EXPECT_EQ(levels[0].usageFile(), job + "/memory.usage_in_bytes");
  EXPECT_EQ(levels[0].describe(), "cgroup v1 memory.limit_in_bytes 1610612736 (" + job + ")");
}

// Docker on cgroup v1 without a cgroup namespace: /proc/self/cgroup names /docker/<id>, and the
// container's mount shows that cgroup as its top folder (mountinfo root field).
TEST_F(ProcessMemoryTest, ContainerMountShowsItsOwnCgroupAsTheTop) {
  writeV1("/sys/fs/cgroup/memory", "2147483648", "1073741824");
  const auto levels = readCgroupMemoryLimits(
      "4:memory:/docker/0123abcd\n",
      "40 30 0:35 /docker/0123abcd /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
      root());
  ASSERT_EQ(levels.size(), 1U);
  EXPECT_EQ(levels[0].dir, "/sys/fs/cgroup/memory");
  EXPECT_EQ(levels[0].limit_bytes, 2147483648);
  EXPECT_EQ(levels[0].needBytes(), 1073741824);  // no memory.stat: nothing taken off
}

// cgroup v2: the job's own memory.max is "max", its parent's is set; both levels are read,
// innermost first, and a tighter inner limit comes first.
TEST_F(ProcessMemoryTest, CgroupV2EveryLevelUpToTheMountIsRead) {
  const std::string mount = "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
  writeV2("/sys/fs/cgroup/user.slice", "4294967296\n", "1000\n");
  writeV2("/sys/fs/cgroup/user.slice/job-3", "max\n", "900\n");
  writeV2("/sys/fs/cgroup/user.slice/job-3/step", "1073741824\n", "800000000\n");
  write("/sys/fs/cgroup/user.slice/job-3/step/memory.stat",
        "anon 500000000\nfile 300000000\nactive_file 100000000\ninactive_file 200000000\n"
        "file_mapped 50000000\n");
  const auto levels =
      readCgroupMemoryLimits("0::/user.slice/job-3/step\n", kRootMount + mount, root());
  ASSERT_EQ(levels.size(), 2U);
  EXPECT_EQ(levels[0].version, 2);
  EXPECT_EQ(levels[0].dir, "/sys/fs/cgroup/user.slice/job-3/step");
  EXPECT_EQ(levels[0].needBytes(), 800000000 - (300000000 - 50000000));
  EXPECT_EQ(levels[0].usageFile(), "/sys/fs/cgroup/user.slice/job-3/step/memory.current");
  EXPECT_EQ(levels[0].describe(),
            "cgroup memory.max 1073741824 (/sys/fs/cgroup/user.slice/job-3/step)");
  EXPECT_EQ(levels[1].dir, "/sys/fs/cgroup/user.slice");
  EXPECT_EQ(levels[1].limit_bytes, 4294967296);
}

// cgroup v2's memory.high (systemd MemoryHigh=): above it the kernel throttles the cgroup instead
// of killing it, and a training step there runs far slower than measured. It is a limit of its own
// when lower than memory.max (or with memory.max "max"), and left out when not lower.
TEST_F(ProcessMemoryTest, CgroupV2MemoryHighBelowMaxIsALimitOfItsOwn) {
  const std::string mount = "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
  const std::string top = "/sys/fs/cgroup";
  writeV2(top + "/job.slice", "max\n", "1000\n");
  write(top + "/job.slice/memory.high", "3221225472\n");  // only memory.high: 3 GiB
  writeV2(top + "/job.slice/run", "2147483648\n", "600000000\n");
  write(top + "/job.slice/run/memory.high", "1610612736\n");  // lower than memory.max
  write(top + "/job.slice/run/memory.stat", "active_file 100000000\nfile_mapped 40000000\n");
  writeV2(top + "/job.slice/run/step", "1073741824\n", "500000000\n");
  write(top + "/job.slice/run/step/memory.high", "1073741824\n");  // equal: memory.max applies
  const auto levels =
      readCgroupMemoryLimits("0::/job.slice/run/step\n", kRootMount + mount, root());
  ASSERT_EQ(levels.size(), 4U);
  EXPECT_FALSE(levels[0].high);
  EXPECT_EQ(levels[0].dir, top + "/job.slice/run/step");
  EXPECT_EQ(levels[0].limit_bytes, 1073741824);
  EXPECT_FALSE(levels[1].high);
  EXPECT_EQ(levels[1].limit_bytes, 2147483648);
  EXPECT_TRUE(levels[2].high);
  EXPECT_EQ(levels[2].dir, top + "/job.slice/run");
  EXPECT_EQ(levels[2].limit_bytes, 1610612736);
  EXPECT_EQ(levels[2].needBytes(), 600000000 - 60000000);  // the same usage as memory.max's entry
  EXPECT_EQ(levels[2].limitFile(), top + "/job.slice/run/memory.high");
  EXPECT_EQ(levels[2].usageFile(), top + "/job.slice/run/memory.current");
  EXPECT_EQ(levels[2].describe(), "cgroup memory.high 1610612736 (" + top + "/job.slice/run)");
  EXPECT_TRUE(levels[3].high);
  EXPECT_EQ(levels[3].dir, top + "/job.slice");
  EXPECT_EQ(levels[3].limit_bytes, 3221225472);
}

// The guard over memory.high: refused like memory.max, and the message says what passing it does.
TEST_F(ProcessMemoryTest, GuardKeepsUnderMemoryHighAndSaysItThrottles) {
  const std::string mount = "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  writeV2("/sys/fs/cgroup/job", "max\n", std::to_string(200 * kMiB));
  write("/sys/fs/cgroup/job/memory.high", std::to_string(1024 * kMiB));
  write("/sys/fs/cgroup/job/memory.stat", "active_file 0\n");
  auto levels = readCgroupMemoryLimits("0::/job\n", kRootMount + mount, root());
  ASSERT_EQ(levels.size(), 1U);
  ASSERT_TRUE(levels[0].high);
  levels[0].dir = root() + levels[0].dir;  // the guard opens the files by their folder
  auto guard = ProcessMemoryGuard::forCgroups(levels);
  ASSERT_NE(guard, nullptr);
  EXPECT_TRUE(guard->admits(700 * kMiB));   // 200 + 700 <= 1024 - 64
  EXPECT_FALSE(guard->admits(800 * kMiB));  // 1000 > 960
  const std::string why = guard->refusalMessage();
  EXPECT_NE(why.find("enforces by throttling it"), std::string::npos) << why;
  EXPECT_NE(why.find("cgroup memory.high 1073741824"), std::string::npos) << why;
  // memory.high lowered while the search runs: read at every check, as memory.max is.
  write("/sys/fs/cgroup/job/memory.high", std::to_string(512 * kMiB));
  EXPECT_FALSE(guard->admits(300 * kMiB));  // 500 > 512 - 64
  EXPECT_TRUE(guard->admits(200 * kMiB));
}

// Hybrid systems mount cgroup2 at /sys/fs/cgroup/unified (without the memory controller) and
// the v1 memory controller beside it: the limit is found in v1.
TEST_F(ProcessMemoryTest, HybridSystemFindsTheV1MemoryLimit) {
  writeV1("/sys/fs/cgroup/memory/job", "536870912", "100");
  write("/sys/fs/cgroup/unified/job/cgroup.procs", "1\n");
  const auto levels = readCgroupMemoryLimits(
      "4:memory:/job\n0::/job\n",
      kV1MemoryMount + "31 22 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n", root());
  ASSERT_EQ(levels.size(), 1U);
  EXPECT_EQ(levels[0].version, 1);
  EXPECT_EQ(levels[0].limit_bytes, 536870912);
}

TEST_F(ProcessMemoryTest, MountPointWithAnEscapedSpace) {
  writeV1("/mnt/my mem/job", "1000000", "10");
  const auto levels = readCgroupMemoryLimits(
      "7:memory:/job\n", "40 30 0:35 / /mnt/my\\040mem rw - cgroup cgroup rw,memory\n", root());
  ASSERT_EQ(levels.size(), 1U);
  EXPECT_EQ(levels[0].dir, "/mnt/my mem/job");
}

// Catches a walk up from the process's cgroup that loops forever on a hierarchy mounted at "/"
// (the parent of "/" is "/"), adding a level each time when "/" holds a limit.
TEST_F(ProcessMemoryTest, HierarchyMountedAtTheRootEndsItsWalk) {
  writeV2("", "1073741824", "100");
  writeV2("/job", "max", "50");
  const auto levels =
      readCgroupMemoryLimits("0::/job/\n", "30 22 0:26 / / rw - cgroup2 cgroup2 rw\n", root());
  ASSERT_EQ(levels.size(), 1U);
  EXPECT_EQ(levels[0].dir, "/");
  EXPECT_EQ(levels[0].limit_bytes, 1073741824);
}

// Catches a mount of another part of the hierarchy taken for this process's: a bind mount of
// /other, or of /docker/ab while the process is in /docker/abcd, does not hold its limits.
TEST_F(ProcessMemoryTest, MountOfAnotherSubtreeIsNotThisProcesssLimit) {
  writeV1("/sys/fs/cgroup/memory/job", "2147483648", "1");
  writeV1("/mnt/other", "104857600", "1");
  writeV1("/mnt/ab", "104857600", "1");
  const auto levels = readCgroupMemoryLimits(
      "4:memory:/job\n",
      kV1MemoryMount + "41 30 0:35 /other /mnt/other rw - cgroup cgroup rw,memory\n", root());
  ASSERT_EQ(levels.size(), 1U);
  EXPECT_EQ(levels[0].limit_bytes, 2147483648);
  EXPECT_TRUE(readCgroupMemoryLimits("4:memory:/docker/abcd\n",
                                     "41 30 0:35 /docker/ab /mnt/ab rw - cgroup cgroup rw,memory\n",
                                     root())
                  .empty());
  // A cgroup namespace shows the mount's root outside it: the mount's top folder applies.
  const auto namespaced = readCgroupMemoryLimits(
      "4:memory:/\n", "41 30 0:35 /../.. /mnt/other rw - cgroup cgroup rw,memory\n", root());
  ASSERT_EQ(namespaced.size(), 1U);
  EXPECT_EQ(namespaced[0].dir, "/mnt/other");
}

TEST_F(ProcessMemoryTest, NoLimitAnywhereGivesNothing) {
  writeV1("/sys/fs/cgroup/memory", kV1Unlimited, "5");
  writeV2("/sys/fs/cgroup", "max", "5");
  EXPECT_TRUE(readCgroupMemoryLimits("4:memory:/\n0::/\n", kV1MemoryMount, root()).empty());
  EXPECT_TRUE(readCgroupMemoryLimits(
                  "0::/\n", "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", root())
                  .empty());
}

// Malformed /proc text and files: skipped, never thrown, never a limit made up.
TEST_F(ProcessMemoryTest, MalformedTextIsSkipped) {
  writeV1("/sys/fs/cgroup/memory/job", "12abc", "10");
  writeV1("/sys/fs/cgroup/memory/other", "99999999999999999999999", "10");
  const std::string bad_mounts =
      "garbage\n40 30 0:35 / /x - cgroup\n\n- - - -\n40 30 0:35 / /sys/fs/cgroup/memory rw - "
      "cgroup cgroup rw,memory\n";
  for (const std::string cgroup :
       {"4:memory:/job\n", "4:memory:/other\n", "memory\n", "4:memory:relative\n", ":::\n", ""}) {
    EXPECT_TRUE(readCgroupMemoryLimits(cgroup, bad_mounts, root()).empty()) << cgroup;
  }
  EXPECT_TRUE(readCgroupMemoryLimits("4:memory:/job\n", "", root()).empty());
}

TEST(MemoryStatTest, KeysOfEachVersion) {
  const std::string v1 =
      "active_file 7\ninactive_file 7\nmapped_file 7\ntotal_active_file 100\n"
      "total_inactive_file 20\ntotal_mapped_file 30\n";
  auto f = parseMemoryStat(v1.data(), v1.size(), 1);
  EXPECT_EQ(f.file_bytes, 120);
  EXPECT_EQ(f.mapped_file_bytes, 30);
  const std::string v2 = "anon 5\nactive_file 100\ninactive_file 20\nfile_mapped 30\nfile 999\n";
  f = parseMemoryStat(v2.data(), v2.size(), 2);
  EXPECT_EQ(f.file_bytes, 120);
  EXPECT_EQ(f.mapped_file_bytes, 30);
  // A file cut inside a line (pread into a fixed buffer) and a number too long: no overflow.
  const std::string cut = "active_file 99999999999999999999999999\ninactive_fi";
  f = parseMemoryStat(cut.data(), cut.size(), 2);
  EXPECT_GT(f.file_bytes, 0);
  EXPECT_EQ(f.mapped_file_bytes, 0);
  f = parseMemoryStat("", 0, 1);
  EXPECT_EQ(f.file_bytes, 0);
}

TEST(CgroupMemoryLimitTest, NeedStaysWithinUsage) {
  CgroupMemoryLimit level;
  level.usage_bytes = 100;
  level.file_bytes = 500;  // memory.stat read a moment later than the usage
  EXPECT_EQ(level.needBytes(), 0);
  level.mapped_file_bytes = 600;  // mapped larger than the file figure
  EXPECT_EQ(level.needBytes(), 100);
}

TEST(ProcessMemoryMarginTest, SixtyFourMiBOrTwoPercent) {
  EXPECT_EQ(processMemoryMarginBytes(1024 * kMiB), 64 * kMiB);
  EXPECT_EQ(processMemoryMarginBytes(3200 * kMiB), 64 * kMiB);
  EXPECT_EQ(processMemoryMarginBytes(10000 * kMiB), 200 * kMiB);
}

// The guard over a fake cgroup whose usage file the test rewrites.
TEST_F(ProcessMemoryTest, GuardRefusesPastLimitLessMarginAndAsksTheKernelAgain) {
  const std::string job = root() + "/sys/fs/cgroup/memory/job";
  write("/sys/fs/cgroup/memory/job/memory.usage_in_bytes", std::to_string(500 * kMiB));
  write("/sys/fs/cgroup/memory/job/memory.stat", "total_inactive_file 0\n");
  auto guard = ProcessMemoryGuard::forCgroups({v1Level(job, 1024 * kMiB)});
  ASSERT_NE(guard, nullptr);
  EXPECT_EQ(guard->baselineNeedBytes(), 500 * kMiB);
  EXPECT_EQ(guard->marginBytes(), 64 * kMiB);
  EXPECT_EQ(guard->describe(), "cgroup v1 memory.limit_in_bytes 1073741824 (" + job + ")");
  EXPECT_TRUE(guard->admits(400 * kMiB));   // 900 <= 1024 - 64
  EXPECT_FALSE(guard->admits(500 * kMiB));  // 1000 > 960
  const std::string why = guard->refusalMessage();
  EXPECT_NE(why.find("500.00 MiB in use + 500.00 MiB requested > 1.00 GiB less a margin of "
                     "64.00 MiB"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("(cgroup v1 memory.limit_in_bytes 1073741824 (" + job + "))"),
            std::string::npos)
      << why;
  // Another process in the cgroup gave memory back: the estimate (500 MiB) says no, the kernel's
  // figure says yes.
  write("/sys/fs/cgroup/memory/job/memory.usage_in_bytes", std::to_string(100 * kMiB));
  EXPECT_TRUE(guard->admits(800 * kMiB));  // 900 <= 960
  // 500 + 400 MiB (the first check, estimated from the need read at creation plus what this
  // process's anonymous memory grew by since: a few KiB) or 100 + 800 MiB (the kernel's figure).
  EXPECT_GE(guard->peakNeedBytes(), 900 * kMiB);
  EXPECT_LT(guard->peakNeedBytes(), 901 * kMiB);
  guard->resetPeak();
  EXPECT_EQ(guard->peakNeedBytes(), 100 * kMiB);
  // Page cache nobody maps is taken off the usage.
  write("/sys/fs/cgroup/memory/job/memory.usage_in_bytes", std::to_string(1000 * kMiB));
  write("/sys/fs/cgroup/memory/job/memory.stat",
        "total_inactive_file " + std::to_string(700 * kMiB) + "\n");
  guard->resetPeak();  // reads memory.stat
  EXPECT_EQ(guard->peakNeedBytes(), 300 * kMiB);
  EXPECT_TRUE(guard->admits(600 * kMiB));   // 300 + 600 <= 960
  EXPECT_FALSE(guard->admits(700 * kMiB));  // 300 + 700 > 960
}

// Catches a guard that reads the cgroup limit once (lowered from 1.5 GiB to 900 MiB while the
// search ran, the process was killed), or follows only its own memory between reads of
// memory.stat (three searches in one cgroup got two of them killed). The limit is read at every
// check, and between reads of memory.stat the cgroup's own usage is followed (it sees the other
// processes).
TEST_F(ProcessMemoryTest, GuardSeesALoweredLimitAndOtherProcessesAtOnce) {
  const std::string job = root() + "/sys/fs/cgroup/memory/job";
  writeV1("/sys/fs/cgroup/memory/job", std::to_string(1536 * kMiB), std::to_string(500 * kMiB));
  write("/sys/fs/cgroup/memory/job/memory.stat", "total_inactive_file 0\n");
  auto guard = ProcessMemoryGuard::forCgroups({v1Level(job, 1536 * kMiB)});
  ASSERT_NE(guard, nullptr);
  EXPECT_TRUE(guard->admits(800 * kMiB));  // 500 + 800 <= 1536 - 64
  EXPECT_TRUE(guard->limitChanges().empty());
  write("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", std::to_string(900 * kMiB));
  EXPECT_FALSE(guard->admits(800 * kMiB));  // 500 + 800 > 900 - 64
  // The report says so: trials before the change were measured against 1.5 GiB.
  const auto changes = guard->limitChanges();
  ASSERT_EQ(changes.size(), 1U);
  EXPECT_EQ(changes[0].rfind("cgroup v1 memory.limit_in_bytes 1610612736 (" + job +
                                 ") was changed while the trials ran, to 943718400:",
                             0),
            0U)
      << changes[0];
  EXPECT_NE(guard->refusalMessage().find("> 900.00 MiB less a margin of 64.00 MiB"),
            std::string::npos)
      << guard->refusalMessage();
  EXPECT_TRUE(guard->admits(300 * kMiB));  // 500 + 300 <= 836
  // Another process of the cgroup takes 400 MiB: seen at the next check, before any re-read of
  // memory.stat would be due.
  write("/sys/fs/cgroup/memory/job/memory.usage_in_bytes", std::to_string(900 * kMiB));
  EXPECT_FALSE(guard->admits(100 * kMiB));  // 900 + 100 > 836
  // Raised again, then lowered: every value, in order (a search that ran under each).
  write("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", std::to_string(2048 * kMiB));
  EXPECT_TRUE(guard->admits(800 * kMiB));  // 900 + 800 <= 2048 - 64
  write("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", std::to_string(1024 * kMiB));
  EXPECT_FALSE(guard->admits(100 * kMiB));  // 900 + 100 > 1024 - 64
  ASSERT_EQ(guard->limitChanges().size(), 1U);
  EXPECT_NE(guard->limitChanges()[0].find("to 943718400, then 2147483648, then 1073741824: "),
            std::string::npos)
      << guard->limitChanges()[0];
}

// A model file read cold leaves page cache in the cgroup; at the limit the kernel reclaims it as
// the process grows, so raw usage stays put while the need grows. Catches a guard that follows raw
// usage alone: it sees no growth and the process is killed (5 of 9 runs of ResNet-50 in a 650 MiB
// cgroup). Raw usage near the limit sends the guard to memory.stat.
TEST_F(ProcessMemoryTest, GuardSeesGrowthThatReclaimedPageCacheHides) {
  const std::string job = root() + "/sys/fs/cgroup/memory/job";
  writeV1("/sys/fs/cgroup/memory/job", std::to_string(1024 * kMiB), std::to_string(900 * kMiB));
  write("/sys/fs/cgroup/memory/job/memory.stat",
        "total_inactive_file " + std::to_string(500 * kMiB) + "\n");
  auto guard = ProcessMemoryGuard::forCgroups({v1Level(job, 1024 * kMiB)});
  ASSERT_NE(guard, nullptr);
  EXPECT_EQ(guard->baselineNeedBytes(), 400 * kMiB);
  EXPECT_TRUE(guard->admits(50 * kMiB));  // 400 + 50 <= 960
  // The process took 400 MiB more; the kernel gave back as much cache: usage is unchanged.
  write("/sys/fs/cgroup/memory/job/memory.stat",
        "total_inactive_file " + std::to_string(100 * kMiB) + "\n");
  EXPECT_FALSE(guard->admits(200 * kMiB));  // 800 + 200 > 960, though usage still says 900
  EXPECT_NE(guard->refusalMessage().find("800.00 MiB in use + 200.00 MiB requested"),
            std::string::npos)
      << guard->refusalMessage();
  EXPECT_TRUE(guard->admits(100 * kMiB));  // 800 + 100 <= 960
}

TEST_F(ProcessMemoryTest, GuardOverNoReadableCgroupIsNone) {
  CgroupMemoryLimit level;
  level.version = 2;
  level.dir = root() + "/missing";
  level.limit_bytes = 1024 * kMiB;
  EXPECT_EQ(ProcessMemoryGuard::forCgroups({level}), nullptr);
  EXPECT_EQ(ProcessMemoryGuard::forCgroups({}), nullptr);
}

// This process, on whatever machine runs the test: a guard exists (cgroup or system memory), and
// a request of all the memory in the world is refused while a small one is admitted.
TEST(ProcessMemoryGuardTest, ThisProcessHasAGuardThatRefusesTheImpossible) {
  auto guard = ProcessMemoryGuard::forThisProcess();
  ASSERT_NE(guard, nullptr);
  EXPECT_NE(guard->describe().find("system memory"), std::string::npos) << guard->describe();
  EXPECT_TRUE(guard->admits(ProcessMemoryGuard::kCheckFromBytes));
  EXPECT_FALSE(guard->admits(std::int64_t{1} << 60));
  EXPECT_NE(guard->refusalMessage().find("would pass a memory limit"), std::string::npos);
  EXPECT_GT(guard->baselineNeedBytes(), 0);
}

}  // namespace process_memory_test
}  // namespace
}  // namespace autobatch::detail
