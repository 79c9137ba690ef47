// PyTorch memory snapshots (core/include/gpumem/snapshot.hpp, core/src/io/pickle.hpp): the
// files of tests/data/snapshots, written by make_snapshots.py with Python's own pickle, read
// into measured peaks worked by hand there; hostile pickles refused with clear errors.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "gpumem/json.hpp"
#include "gpumem/snapshot.hpp"
#include "gpumem/pickle.hpp"

#ifndef GPUMEM_TEST_DATA
#define GPUMEM_TEST_DATA "tests/data"
#endif

namespace {

using gpumem::MeasuredMemory;
using gpumem::ReadMemorySnapshot;
constexpr std::int64_t KiB = 1024, MiB = 1024 * KiB;

std::string ReadBytes(const std::string& name) {
  std::ifstream in(std::string(GPUMEM_TEST_DATA) + "/snapshots/" + name, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

MeasuredMemory Measured(const std::string& name) {
  const auto r = ReadMemorySnapshot(ReadBytes(name));
  INFO((r.errors.empty() ? std::string() : r.errors.front().field + ": " + r.errors.front().message));
  REQUIRE(r.ok());
  return r.measured;
}

std::string FirstError(std::string_view bytes) {
  const auto r = ReadMemorySnapshot(bytes);
  REQUIRE_FALSE(r.ok());
  return r.errors.front().field + ": " + r.errors.front().message;
}

// A string literal's bytes without its terminating NUL (pickles hold NULs, so no strlen).
template <std::size_t N>
std::string Bytes(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

std::int64_t MaxAllocated(const MeasuredMemory& m) {
  std::int64_t peak = 0;
  for (const auto& p : m.timeline) peak = std::max(peak, p.allocatedBytes);
  return peak;
}

}  // namespace

TEST_CASE("snapshot: one device read back to the hand-worked peaks", "[snapshot]") {
  const MeasuredMemory m = Measured("simple.pickle");
  CHECK(m.device == 0);
  CHECK(m.deviceCount == 1);
  CHECK(m.traceEntries == 10);
  // Before the window: 512 KiB allocated in a 2 MiB segment (reconstructed from the end state).
  CHECK(m.startAllocatedBytes == 512 * KiB);
  CHECK(m.startReservedBytes == 2 * MiB);
  CHECK(m.peakAllocatedBytes == 21 * MiB + 512 * KiB);  // entry 3: 0.5 + 1 + 20 MiB
  CHECK(m.peakAllocatedIndex == 3);
  CHECK(m.peakReservedBytes == 22 * MiB);
  CHECK(m.segments.count == 1);
  CHECK(m.segments.largeCount == 1);
  CHECK(m.segments.blockCount == 3);
  CHECK(m.segments.reservedBytes == 2 * MiB);
  CHECK(m.segments.allocatedBytes == 768 * KiB);
  CHECK(m.segments.inactiveBytes == 1280 * KiB);
  CHECK(m.segments.largestInactiveBlockBytes == 1280 * KiB);
  CHECK(m.segments.fragmentation == 0.0);
  REQUIRE(m.timeline.size() == 11);  // the start and one point per entry
  CHECK(m.timeline[3].allocatedBytes == 21 * MiB + 512 * KiB);
  CHECK(m.timeline[3].timeMicros == 1020);
  CHECK(m.timeline[4].allocatedBytes == 20 * MiB + 512 * KiB);  // free_requested lowers allocated
  CHECK(m.timeline[5].allocatedBytes == 20 * MiB + 512 * KiB);  // free_completed does not again
  CHECK(m.timeline[8].reservedBytes == 2 * MiB);                // segment_free
  CHECK(m.timeline.back().allocatedBytes == 768 * KiB);          // = the segments' state
  CHECK(m.notes.empty());
}

TEST_CASE("snapshot: protocols 2 4 and 5 read the same", "[snapshot]") {
  const MeasuredMemory p4 = Measured("simple.pickle");
  for (const char* name : {"simple_protocol2.pickle", "simple_protocol5.pickle"}) {
    const MeasuredMemory m = Measured(name);
    CHECK(m.peakAllocatedBytes == p4.peakAllocatedBytes);
    CHECK(m.peakReservedBytes == p4.peakReservedBytes);
    CHECK(m.timeline.size() == p4.timeline.size());
    CHECK(m.segments.inactiveBytes == p4.segments.inactiveBytes);
  }
}

TEST_CASE("snapshot: two devices show the larger with pending frees and fragmentation", "[snapshot]") {
  const MeasuredMemory m = Measured("two_devices.pickle");
  CHECK(m.device == 1);
  CHECK(m.deviceCount == 2);
  CHECK(m.peakAllocatedBytes == 20 * MiB);
  CHECK(m.peakReservedBytes == 20 * MiB);
  CHECK(m.startAllocatedBytes == 0);
  CHECK(m.segments.allocatedBytes == 8 * MiB);
  CHECK(m.segments.activeBytes == 12 * MiB);  // the 4 MiB awaiting another stream is active
  CHECK(m.segments.inactiveBytes == 8 * MiB);
  CHECK(m.segments.inactiveBlockCount == 2);
  CHECK(m.segments.fragmentation == Approx(0.25));  // 1 − 6 MiB / 8 MiB
  CHECK(m.timeline.back().allocatedBytes == 8 * MiB);
}

TEST_CASE("snapshot: an older trace without free_requested or times", "[snapshot]") {
  const MeasuredMemory m = Measured("old_trace.pickle");
  CHECK(m.peakAllocatedBytes == 3 * MiB);  // free_completed is the only free: it counts
  CHECK(m.peakReservedBytes == 4 * MiB);
  CHECK(m.segments.allocatedBytes == 1 * MiB);  // from allocated_size (no blocks)
  CHECK(m.oomCount == 1);
  CHECK(m.timeline.front().timeMicros == -1);
  REQUIRE(m.notes.size() == 1);
  CHECK_THAT(m.notes[0], Catch::Contains("out-of-memory"));
}

TEST_CASE("snapshot: a long trace is thinned and keeps its peaks", "[snapshot]") {
  const MeasuredMemory m = Measured("long_trace.pickle");
  CHECK(m.traceEntries == 5000);
  // make_snapshots.py's independent forward replay prints these two.
  CHECK(m.peakAllocatedBytes == 33649664);
  CHECK(m.peakReservedBytes == 64 * MiB);
  CHECK(m.timeline.size() <= 2000);
  CHECK(m.timeline.size() > 1000);
  CHECK(MaxAllocated(m) == m.peakAllocatedBytes);
  CHECK(m.timeline.back().index == 5000);
  for (std::size_t i = 1; i < m.timeline.size(); ++i) CHECK(m.timeline[i].index > m.timeline[i - 1].index);
  const auto small = ReadMemorySnapshot(ReadBytes("long_trace.pickle"), 10);
  REQUIRE(small.ok());
  CHECK(small.measured.timeline.size() <= 10);
  CHECK(MaxAllocated(small.measured) == m.peakAllocatedBytes);
}

TEST_CASE("snapshot: pickles that would run code are refused by opcode name", "[snapshot]") {
  // Python's pickle of a datetime.date: STACK_GLOBAL then REDUCE.
  CHECK_THAT(FirstError(ReadBytes("hostile_reduce.pickle")), Catch::Contains("STACK_GLOBAL") &&
                                                                  Catch::Contains("nothing was executed"));
  // Protocol 2's os.system call, written by hand: GLOBAL comes first and stops the read.
  CHECK_THAT(FirstError(Bytes("\x80\x02" "cos\nsystem\n(X\x04\x00\x00\x00" "echotR.")),
             Catch::Contains("GLOBAL (0x63)"));
  CHECK_THAT(FirstError(Bytes("\x80\x02N)R.")), Catch::Contains("REDUCE"));
  CHECK_THAT(FirstError(Bytes("\x80\x02N}b.")), Catch::Contains("BUILD"));
  CHECK_THAT(FirstError(Bytes("\x80\x02N)\x81.")), Catch::Contains("NEWOBJ"));
  CHECK_THAT(FirstError(Bytes("\x80\x02X\x01\x00\x00\x00xQ.")), Catch::Contains("BINPERSID"));
}

TEST_CASE("snapshot: every truncation of a snapshot is an error", "[snapshot]") {
  const std::string whole = ReadBytes("simple.pickle");
  for (std::size_t n = 0; n < whole.size(); ++n) {
    const auto r = ReadMemorySnapshot(std::string_view(whole).substr(0, n));
    CHECK_FALSE(r.ok());
  }
  // Protocol 4 frames its body, so a cut file is caught at the FRAME; protocol 2 at the end.
  CHECK_THAT(FirstError(whole.substr(0, whole.size() - 1)), Catch::Contains("FRAME longer than the rest"));
  const std::string p2 = ReadBytes("simple_protocol2.pickle");
  CHECK_THAT(FirstError(p2.substr(0, p2.size() - 1)), Catch::Contains("ends before its STOP"));
}

TEST_CASE("snapshot: deep nesting huge counts and memo bombs stay bounded", "[snapshot]") {
  CHECK_THAT(FirstError("\x80\x04" + std::string(100000, '(')), Catch::Contains("nested deeper than 256"));
  // A chain of a million lists, each appended into the one below: no recursion, no crash.
  std::string chain = "\x80\x04" + std::string(1000000, ']') + std::string(999999, 'a') + ".";
  CHECK_THAT(FirstError(chain), Catch::Contains("holds a list, not the dict"));
  // Lengths far beyond the file: BINUNICODE 4 GiB, BINUNICODE8 2^63, LONG4, FRAME.
  CHECK_THAT(FirstError(Bytes("\x80\x04X\xff\xff\xff\xff")), Catch::Contains("truncated"));
  CHECK_THAT(FirstError(Bytes("\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x80")), Catch::Contains("truncated"));
  CHECK_THAT(FirstError(Bytes("\x80\x04\x8b\xff\xff\xff\x7f")), Catch::Contains("truncated"));
  CHECK_THAT(FirstError(Bytes("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff")), Catch::Contains("FRAME"));
  CHECK_THAT(FirstError(ReadBytes("hostile_memo_bomb.pickle")), Catch::Contains("repeats shared values"));
  // One valid segment with 100,000 filler keys, listed 300,000 times by memo reference: each
  // visit scans its keys, so an unbounded walk would take ~10^11 steps; the budget counts keys.
  std::string wide = Bytes("\x80\x02}X\x08\x00\x00\x00" "segments](}q\x01(") +
                     Bytes("X\x0a\x00\x00\x00" "total_sizeK\x00X\x0e\x00\x00\x00" "allocated_sizeK\x00");
  for (int i = 0; i < 100000; ++i) wide += "K\x01K\x01";
  wide += "u";
  for (int i = 0; i < 300000; ++i) wide += "h\x01";
  wide += "es.";
  CHECK_THAT(FirstError(wide), Catch::Contains("repeats shared values"));
  const std::string tooLarge(gpumem::pickle::kMaxPickleBytes + 1, 'N');
  CHECK_THAT(FirstError(tooLarge), Catch::Contains("read up to 64 MiB"));
}

TEST_CASE("snapshot: other malformed pickles name what is wrong", "[snapshot]") {
  CHECK_THAT(FirstError(Bytes("\x80\x06N.")), Catch::Contains("protocol 6"));
  CHECK_THAT(FirstError("(dp0\n."), Catch::Contains("PUT"));
  CHECK_THAT(FirstError(Bytes("\x80\x02\xff")), Catch::Contains("unknown opcode 0xff"));
  CHECK_THAT(FirstError(Bytes("\x80\x02h\x05.")), Catch::Contains("memo entry 5"));
  CHECK_THAT(FirstError(Bytes("\x80\x02NN.")), Catch::Contains("2 values on the stack"));
  CHECK_THAT(FirstError(Bytes("\x80\x02" "a.")), Catch::Contains("stack is empty"));
  CHECK_THAT(FirstError(Bytes("\x80\x02Na.")), Catch::Contains("APPEND has no container"));
  // A dict that is not a snapshot, and a segment with a wrong type, by their paths.
  CHECK_THAT(FirstError(Bytes("\x80\x02}X\x01\x00\x00\x00" "aK\x01s.")), Catch::Contains("snapshot.segments: missing"));
  const std::string badSegment = Bytes("\x80\x02}X\x08\x00\x00\x00" "segments]}X\x0a\x00\x00\x00" "total_sizeX\x01\x00\x00\x00" "xsas.");
  CHECK_THAT(FirstError(badSegment), Catch::Contains("snapshot.segments[0].total_size: must be an int, not a str"));
}

TEST_CASE("snapshot: the unpickler reads values exactly", "[snapshot]") {
  // [True, None, -2, 1.5, 2**40, -(2**63), 2**64, b"xyz", (1, "é")] as Python's pickle.dumps(…, 4) writes it.
  static const char kBytes[] =
      "\x80\x04\x95\x41\x00\x00\x00\x00\x00\x00\x00]\x94(\x88NJ\xfe\xff\xff\xffG?\xf8\x00\x00\x00\x00\x00\x00"
      "\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x09\x00\x00\x00\x00\x00\x00"
      "\x00\x00\x01""C\x03xyz\x94K\x01\x8c\x02\xc3\xa9\x94\x86\x94" "e.";
  const std::string bytes(kBytes, sizeof kBytes - 1);
  REQUIRE(bytes.size() == 76);
  const auto r = gpumem::pickle::Unpickle(bytes);
  INFO(r.error);
  REQUIRE(r.ok());
  const auto& doc = r.document;
  const auto& list = doc.at(doc.root);
  REQUIRE(list.kind == gpumem::pickle::Kind::List);
  REQUIRE(list.items.size() == 9);
  CHECK(doc.at(list.items[0]).integer == 1);
  CHECK(doc.at(list.items[1]).kind == gpumem::pickle::Kind::None);
  CHECK(doc.at(list.items[2]).integer == -2);
  CHECK(doc.at(list.items[3]).real == 1.5);
  CHECK(doc.at(list.items[4]).integer == (std::int64_t{1} << 40));
  CHECK(doc.at(list.items[5]).integer == INT64_MIN);
  CHECK(doc.at(list.items[6]).kind == gpumem::pickle::Kind::BigInt);
  CHECK(doc.at(list.items[7]).byteSize == 3);
  const auto& tuple = doc.at(list.items[8]);
  REQUIRE(tuple.items.size() == 2);
  CHECK(doc.at(tuple.items[1]).text == "\xc3\xa9");
}

TEST_CASE("snapshot: CompareSnapshotJson puts the estimate beside the measurement", "[snapshot]") {
  const std::string snapshot = ReadBytes("simple.pickle");
  const auto alone = nlohmann::json::parse(gpumem::CompareSnapshotJson(snapshot, ""));
  REQUIRE(alone["ok"] == true);
  CHECK(alone["measured"]["peakAllocatedBytes"] == 21 * MiB + 512 * KiB);
  CHECK(alone["measured"]["peakReservedBytes"] == 22 * MiB);
  CHECK(alone["measured"]["timeline"].size() == 11);
  CHECK(alone["estimate"].is_null());

  std::ifstream in(GPUMEM_TEST_DATA "/mlp.json");
  const std::string setup(std::istreambuf_iterator<char>(in), {});
  const auto both = nlohmann::json::parse(gpumem::CompareSnapshotJson(snapshot, setup));
  REQUIRE(both["ok"] == true);
  const auto estimate = gpumem::EstimateFromJson(setup);
  REQUIRE(estimate.ok());
  const std::int64_t peak = estimate.estimate.peak.totalBytes;
  CHECK(both["estimate"]["peakBytes"] == peak);
  CHECK(both["estimate"]["timeline"].size() > 2);
  // Like for like: the allocator simulation's allocated and reserved peaks against the snapshot's.
  const gpumem::DeviceEstimate& d = estimate.estimate.device;
  CHECK(both["estimate"]["peakAllocatedBytes"] == d.peakAllocatedBytes);
  CHECK(both["estimate"]["peakReservedBytes"] == d.peakReservedBytes);
  CHECK(both["comparison"]["estimateMinusPeakAllocatedBytes"] == d.peakAllocatedBytes - (21 * MiB + 512 * KiB));
  CHECK(both["comparison"]["estimateMinusPeakReservedBytes"] == d.peakReservedBytes - 22 * MiB);

  // Errors of both inputs in one envelope: the snapshot's, then the setup's.
  const auto bad = nlohmann::json::parse(gpumem::CompareSnapshotJson(Bytes("\x80\x02N)R."),
                                                                     R"({"training":{"batchSize":0}})"));
  REQUIRE(bad["ok"] == false);
  REQUIRE(bad["errors"].size() == 2);
  CHECK(bad["errors"][0]["field"] == "snapshot");
  CHECK(bad["errors"][1]["field"] == "training.batchSize");
}
