#include "autobatch/run/rank_group.h"

#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(double s) {
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%.1f s", s);
  return text.data();
}

std::string key(const char* kind, int rank) {
  return std::string(kind) + "/" + std::to_string(rank);
}

// The store's host must resolve before the store is tried: otherwise c10d retries the name for
// the whole --rank-timeout and the failure read as a port in use (issue 27, row 21). A name that
// does not exist is bad input (exit 2); a resolver that cannot answer now is a failure to agree.
void checkResolves(const RankInfo& info) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(info.master_addr.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (rc == 0) return;
  const std::string why = std::string(gai_strerror(rc)) + " (getaddrinfo)";
  if (rc == EAI_AGAIN) {
    throw RankError("ranks could not agree: rank " + std::to_string(info.rank) +
                    " could not resolve the store host '" + info.master_addr + "' (" +
                    info.master_addr_origin + ") now: " + why);
  }
  throw Error("store host (" + info.master_addr_origin +
              "): expected a host name or address this machine can resolve, but got '" +
              info.master_addr + "': " + why + "; give rank 0's host in --master-addr or " +
              "MASTER_ADDR");
}

// Why hosting failed: the port is taken, or the store's own client could not reach the address
// (not an address of this machine).
std::string hostFailure(const RankInfo& info, const std::string& error) {
  const std::string port = std::to_string(info.master_port);
  if (error.find("EADDRINUSE") != std::string::npos ||
      error.find("ddress already in use") != std::string::npos) {
    return " could not host the store: port " + port + " is in use (pass another --master-port)";
  }
  return " could not host the store at " + info.master_addr + ":" + port + " (" +
         info.master_addr_origin + "; rank 0 hosts it, so it must be an address of rank 0's " +
         "machine)";
}

}  // namespace

struct RankGroup::Impl {
  RankInfo info;
  RankGroupOptions options;
  bool hosts = false;
  c10::intrusive_ptr<c10d::Store> store;

  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread heartbeat;

  std::string where() const {
    return info.master_addr + ":" + std::to_string(info.master_port) +
           (info.use_agent_store ? " (the torchrun agent's store)" : " (hosted by rank 0)");
  }

  // What a store error means here, for the message: the host went away or never came.
  [[noreturn]] void lost(const std::string& doing, const c10::Error& e) const {
    throw RankError("ranks could not agree: rank " + std::to_string(info.rank) +
                    " lost the store at " + where() + " while " + doing +
                    (info.use_agent_store ? "" : "; did rank 0 die?") + " (" +
                    e.what_without_backtrace() + ")");
  }

  void beat(const c10::intrusive_ptr<c10d::Store>& own) {
    std::int64_t count = 0;
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      lock.unlock();
      try {
        own->set(key("hb", info.rank), std::to_string(++count));
      } catch (const c10::Error&) {
        // The store is gone (its host died): exchange() reports it; a thread must not throw.
        return;
      }
      lock.lock();
      wake.wait_for(lock, std::chrono::duration<double>(options.heartbeat_interval_s),
                    [this] { return stop; });
    }
  }

  void stopHeartbeat() noexcept {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_all();
    if (heartbeat.joinable()) heartbeat.join();
  }

  // Every rank's `kind/<r>` record, waited for as long as its heartbeat advances (a slow rank is
  // waited for; one silent for timeout_s is dead). `other(r)`, when given, is asked about a rank
  // whose record is missing: it may throw (a rank that published something else instead).
  std::map<int, std::string> collect(const char* kind,
                                     const std::function<void(int)>& other) const {
    std::map<int, std::string> records;
    const int world = info.world_size;
    const auto start = Clock::now();
    std::map<int, std::pair<std::string, Clock::time_point>> last;
    for (int r = 0; r < world; ++r) last[r] = {"", start};
    while (static_cast<int>(records.size()) < world) {
      std::vector<int> dead;
      std::string why;
      const auto now = Clock::now();
      for (int r = 0; r < world; ++r) {
        if (records.contains(r)) continue;
        if (store->check({key(kind, r)})) {
          records[r] = store->get_to_str(key(kind, r));
          continue;
        }
        if (other) other(r);
        std::string beat = store->check({key("hb", r)}) ? store->get_to_str(key("hb", r)) : "";
        if (beat != last[r].first) last[r] = {beat, now};
        const double silent = std::chrono::duration<double>(now - last[r].second).count();
        if (silent > options.timeout_s) {
          dead.push_back(r);
          why += (why.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                 (beat.empty() ? " never arrived"
                               : " stopped its heartbeat (last #" + beat + ") " + seconds(silent) +
                                     " ago: it died or hung");
        }
      }
      if (!dead.empty()) {
        std::string names;
        for (int r : dead) names += (names.empty() ? "" : ", ") + std::to_string(r);
        throw RankError("ranks could not agree: no " +
                        std::string(std::string_view(kind) == "job" ? "job record" : "result") +
                        " from rank(s) " + names + " within " + seconds(options.timeout_s) +
                        " (--rank-timeout): " + why);
      }
      if (static_cast<int>(records.size()) < world) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    return records;
  }

  // The host waits until every rank has read the reports, then may take the store away. It stops
  // waiting for a rank whose heartbeat has been silent for --rank-timeout (dead: it will never
  // read), but keeps waiting for one still beating: a rank still searching when another failed
  // comes to the exchange later and must find the store there to learn which rank failed (under
  // load, a fixed wait of one timeout let it find the store gone and blame rank 0). Bounded by
  // kMaxReaderWaitS all the same: a rank whose heartbeat thread lives on while it hangs.
  void waitForReaders(const char* read_key = "read") const {
    if (!hosts) return;
    constexpr double kMaxReaderWaitS = 600.0;
    const auto start = Clock::now();
    const auto hard_deadline =
        start + std::chrono::duration<double>(std::max(options.timeout_s, kMaxReaderWaitS));
    for (int r = 0; r < info.world_size; ++r) {
      std::string beat;
      auto changed = start;
      while (!store->check({key(read_key, r)}) && Clock::now() < hard_deadline) {
        const std::string now_beat =
            store->check({key("hb", r)}) ? store->get_to_str(key("hb", r)) : "";
        const auto now = Clock::now();
        if (now_beat != beat) {
          beat = now_beat;
          changed = now;
        }
        if (std::chrono::duration<double>(now - changed).count() > options.timeout_s) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
};

RankGroup::RankGroup(const RankInfo& info, const RankGroupOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (!(options.timeout_s > 0) || !(options.heartbeat_interval_s > 0)) {
    throw Error("rank timeout and heartbeat interval: expected > 0 s, but got " +
                std::to_string(options.timeout_s) + " and " +
                std::to_string(options.heartbeat_interval_s));
  }
  Impl& m = *impl_;
  m.info = info;
  m.options = options;
  m.hosts = !info.use_agent_store && info.rank == 0;
  checkResolves(info);
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(info.master_port);
  o.isServer = m.hosts;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(options.timeout_s * 1000));
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(info.master_addr, o);
    m.store = c10::make_intrusive<c10d::PrefixStore>(options.prefix, tcp);
    m.store->set(key("hb", info.rank), "0");
  } catch (const c10::Error& e) {
    throw RankError("ranks could not agree: rank " + std::to_string(info.rank) +
                    (m.hosts ? hostFailure(info, e.what_without_backtrace())
                             : " could not reach the store at " + m.where() + " within " +
                                   seconds(options.timeout_s) + " (--rank-timeout)") +
                    ": " + e.what_without_backtrace());
  }
  m.heartbeat = std::thread(&Impl::beat, &m, m.store->clone());
}

RankGroup::~RankGroup() { impl_->stopHeartbeat(); }

std::string RankGroup::describe() const {
  const auto& i = impl_->info;
  return "rank " + std::to_string(i.rank) + " of " + std::to_string(i.world_size) + " (" +
         i.source + "), store " + impl_->where();
}

void RankGroup::compareJob(const JobFields& mine) {
  Impl& m = *impl_;
  try {
    m.store->set(key("job", m.info.rank), encodeJobFields(mine, m.options.version));
  } catch (const c10::Error& e) {
    m.lost("publishing its job record", e);
  }
  // A rank that published a result without a job record failed before this round (abandon) or
  // runs an autobatch without it: said at once, never waited for until the timeout.
  const auto other = [&m](int r) {
    if (!m.store->check({key("result", r)})) return;
    const RankReport theirs = decodeRankReport(m.store->get_to_str(key("result", r)));
    if (theirs.protocol == kRankProtocol && theirs.status != "ok") {
      throw RankError("ranks could not agree: rank " + std::to_string(r) +
                      " failed before comparing the job (" + theirs.status + "); see its log");
    }
    throw RankError("ranks disagree on the autobatch version: rank " + std::to_string(r) +
                    " published a result without a job record (an autobatch without the job " +
                    "comparison" + (theirs.version.empty() ? "" : ", version " + theirs.version) +
                    "), this rank runs " +
                    (m.options.version.empty() ? "another" : "autobatch " + m.options.version) +
                    "; run the same autobatch on every rank");
  };
  try {
    std::vector<JobRecord> records;
    for (auto& [r, text] : m.collect("job", other)) records.push_back(decodeJobFields(text));
    m.store->set(key("jobread", m.info.rank), "1");
    compareJobRecords(records);
  } catch (const RankError&) {
    // Every rank read the same records and fails the same way: the host keeps the store until
    // they have (a rank that found it gone would blame rank 0).
    try {
      m.store->set(key("jobread", m.info.rank), "1");
      m.waitForReaders("jobread");
    } catch (const c10::Error&) {
      // The store is gone; the RankError says what happened first.
    }
    throw;
  } catch (const c10::Error& e) {
    m.lost("waiting for the other ranks' job records", e);
  }
}

Agreement RankGroup::exchange(const RankReport& report) {
  Impl& m = *impl_;
  const int world = m.info.world_size;
  RankReport mine = report;
  mine.protocol = kRankProtocol;
  mine.version = m.options.version;
  try {
    m.store->set(key("result", m.info.rank), encodeRankReport(mine));
  } catch (const c10::Error& e) {
    m.lost("publishing its result", e);
  }
  try {
    std::vector<RankReport> all;
    for (auto& [r, text] : m.collect("result", nullptr)) {
      all.push_back(r == m.info.rank ? mine : decodeRankReport(text));
    }
    m.store->set(key("read", m.info.rank), "1");
    Agreement agreement = agree(std::move(all), world);
    m.waitForReaders();
    return agreement;
  } catch (const RankError&) {
    // Others may still be reading a failure this rank saw: let them, then fail.
    try {
      m.store->set(key("read", m.info.rank), "1");
      m.waitForReaders();
    } catch (const c10::Error&) {
      // The store is gone; the RankError below says what happened first.
    }
    throw;
  } catch (const c10::Error& e) {
    m.lost("waiting for the other ranks' results", e);
  }
}

void RankGroup::abandon(const std::string& status) noexcept {
  Impl& m = *impl_;
  RankReport failed;
  failed.rank = m.info.rank;
  failed.status = status;
  failed.version = m.options.version;
  try {
    m.store->set(key("result", m.info.rank), encodeRankReport(failed));
    m.store->set(key("read", m.info.rank), "1");
    m.waitForReaders();
  } catch (...) {  // best effort by contract: the others time out instead
  }
}

}  // namespace autobatch
