// The training programs' result file (docs/trace-format.md) over ResultFile.
#include <array>
#include <cstdio>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/trace/trace.h"

namespace sb {
namespace {

struct EventRow {
  int32_t rank, step, phase, op, unit, lane;
  double start, end;
  int64_t bytes;
  double flops;
  int32_t m, n, k, batch, trans;
  int32_t ranks;
  int64_t sent_bytes;
  int64_t request;
  int32_t axis;
  int32_t peer;
};
struct MeshRow {
  int32_t rank, pp, dp_replicate, dp_shard, tp;
};
struct MemoryRow {
  int32_t rank, step;
  double time;
  int64_t bytes[kMemCategories];
  int64_t total;
};
struct PeakRow {
  int32_t rank;
  int64_t bytes[kMemCategories];
  int64_t total;
};
struct RankRow {
  int32_t rank;
  char host[64];
  char device[64];
};

const std::vector<Column> kStepColumns = {
    SB_COLUMN(StepRow, rank, I32),          SB_COLUMN(StepRow, step, I32),
    SB_COLUMN(StepRow, warmup, I32),        SB_COLUMN(StepRow, time, F64),
    SB_COLUMN(StepRow, compute, F64),       SB_COLUMN(StepRow, communication, F64),
    SB_COLUMN(StepRow, exposed_comm, F64),  SB_COLUMN(StepRow, overhead, F64),
    SB_COLUMN(StepRow, gemm_time, F64),     SB_COLUMN(StepRow, gemm_flops, F64),
    SB_COLUMN(StepRow, model_tflops, F64),  SB_COLUMN(StepRow, hardware_tflops, F64),
    SB_COLUMN(StepRow, tokens_per_s, F64),  SB_COLUMN(StepRow, loss, F64),
    SB_COLUMN(StepRow, comm_bytes, I64),    SB_COLUMN(StepRow, peak_memory, I64),
    SB_COLUMN(StepRow, device_used, I64),    SB_COLUMN(StepRow, loss_scale, F64),
    SB_COLUMN(StepRow, skipped, I32),       SB_COLUMN(StepRow, sent_bytes, I64),
    SB_COLUMN(StepRow, idle, F64),
};

const std::vector<Column> kEventColumns = {
    SB_COLUMN(EventRow, rank, I32),  SB_COLUMN(EventRow, step, I32),  SB_COLUMN(EventRow, phase, I32),
    SB_COLUMN(EventRow, op, I32),    SB_COLUMN(EventRow, unit, I32),  SB_COLUMN(EventRow, lane, I32),
    SB_COLUMN(EventRow, start, F64), SB_COLUMN(EventRow, end, F64),   SB_COLUMN(EventRow, bytes, I64),
    SB_COLUMN(EventRow, flops, F64), SB_COLUMN(EventRow, m, I32),     SB_COLUMN(EventRow, n, I32),
    SB_COLUMN(EventRow, k, I32),     SB_COLUMN(EventRow, batch, I32), SB_COLUMN(EventRow, trans, I32),
    SB_COLUMN(EventRow, ranks, I32), SB_COLUMN(EventRow, sent_bytes, I64), SB_COLUMN(EventRow, request, I64),
    SB_COLUMN(EventRow, axis, I32),  SB_COLUMN(EventRow, peer, I32),
};

// Per-category byte columns named after the categories, then `total`.
std::vector<Column> category_columns(std::vector<Column> head, size_t bytes_offset, size_t total_offset) {
  for (int c = 0; c < kMemCategories; ++c)
    head.push_back({mem_category_name(MemCategory(c)), Column::I64, bytes_offset + c * sizeof(int64_t)});
  head.push_back({"total", Column::I64, total_offset});
  return head;
}

template <class E>
std::vector<std::string> enum_names(int n, const char* (*name)(E)) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back(name(E(i)));
  return v;
}

}  // namespace

void write_provenance(ResultFile& f, const std::vector<Attr>& provenance, const std::string& host,
                      const std::string& device, MPI_Comm comm) {
  f.attributes("provenance", provenance);
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  RankRow r{};
  r.rank = rank;
  std::snprintf(r.host, sizeof r.host, "%s", host.c_str());
  std::snprintf(r.device, sizeof r.device, "%s", device.c_str());
  f.table("provenance/ranks",
          {SB_COLUMN(RankRow, rank, I32), SB_COLUMN(RankRow, host, Str64), SB_COLUMN(RankRow, device, Str64)},
          std::vector<RankRow>{r});
}

void write_trace(const std::string& path, const TraceData& d, MPI_Comm comm, bool overwrite) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const int64_t bytes = int64_t(d.steps.size() * sizeof(StepRow)) +
                        int64_t((d.events ? d.events->size() : 0) * sizeof(EventRow)) +
                        int64_t((d.memory ? d.memory->size() : 0) * sizeof(MemoryRow)) +
                        int64_t((d.host_memory ? d.host_memory->size() : 0) * sizeof(MemoryRow)) +
                        2 * sizeof(PeakRow) + sizeof(RankRow);
  ResultFile f(path, comm, overwrite, bytes);
  std::vector<Attr> root = {Attr::integer("schema_version", kSchemaVersion)};
  root.insert(root.end(), d.run.begin(), d.run.end());
  f.attributes("/", root);
  write_provenance(f, d.provenance, d.host, d.device, comm);
  f.attributes("plan", d.plan);

  std::vector<StepRow> steps = d.steps;
  for (StepRow& s : steps) s.rank = rank;
  f.table("steps", kStepColumns, steps);

  std::vector<EventRow> events;
  if (d.events) {
    // A send's or receive's peer as a world rank (the backend knows its communicator's numbering).
    std::array<std::vector<int>, kAxes> groups;
    for (int a = 0; a < kAxes; ++a) groups[size_t(a)] = d.layout.group(Axis(a));
    events.reserve(d.events->size());
    for (const TraceEvent& e : *d.events) {
      const OpEvent& o = e.op;
      const bool known = o.peer >= 0 && o.axis >= 0 && o.peer < int(groups[size_t(o.axis)].size());
      events.push_back(EventRow{rank, e.step, int(o.phase), int(o.kind), o.unit, o.lane, o.start, o.end, o.bytes,
                                o.flops, o.gemm[0], o.gemm[1], o.gemm[2], o.gemm[3], o.gemm[4], o.ranks,
                                bytes_sent(o), o.request, o.axis, known ? groups[size_t(o.axis)][size_t(o.peer)] : -1});
    }
  }
  f.table("events", kEventColumns, events);
  f.names_attribute("events", "phase_names", enum_names(int(Phase::kCount), phase_name));
  f.names_attribute("events", "op_names", enum_names(int(OpKind::kCount), op_kind_name));
  f.names_attribute("events", "axis_names", enum_names(kAxes, axis_name));
  if (!d.unit_names.empty()) f.names_attribute("events", "unit_names", d.unit_names);

  // Each rank's coordinates on the mesh: the ranks of a collective's group are those that
  // share every coordinate but its axis's.
  const std::array<int, kAxes> c = d.layout.coords();
  const MeshRow mesh{rank, c[size_t(Axis::Pipeline)], c[size_t(Axis::Replicate)], c[size_t(Axis::Shard)],
                     c[size_t(Axis::Tensor)]};
  f.table("mesh",
          {SB_COLUMN(MeshRow, rank, I32), SB_COLUMN(MeshRow, pp, I32), SB_COLUMN(MeshRow, dp_replicate, I32),
           SB_COLUMN(MeshRow, dp_shard, I32), SB_COLUMN(MeshRow, tp, I32)},
          std::vector<MeshRow>{mesh});

  // The device ledger (/memory, /memory_peaks) and the host ledger (/host_memory,
  // /host_memory_peaks: CPU offload's alloc_host), in the same columns.
  auto ledger = [&](const char* samples, const char* peaks, const std::vector<MemorySample>* in,
                    const MemBytes& peak_bytes, int64_t peak_total) {
    std::vector<MemoryRow> memory;
    if (in) {
      memory.reserve(in->size());
      for (const MemorySample& m : *in) {
        MemoryRow r{rank, m.step, m.time, {}, 0};
        for (int c = 0; c < kMemCategories; ++c) r.total += (r.bytes[c] = m.bytes[c]);
        memory.push_back(r);
      }
    }
    f.table(samples,
            category_columns({SB_COLUMN(MemoryRow, rank, I32), SB_COLUMN(MemoryRow, step, I32),
                              SB_COLUMN(MemoryRow, time, F64)},
                             offsetof(MemoryRow, bytes), offsetof(MemoryRow, total)),
            memory);
    PeakRow peak{rank, {}, peak_total};
    for (int c = 0; c < kMemCategories; ++c) peak.bytes[c] = peak_bytes[c];
    f.table(peaks,
            category_columns({SB_COLUMN(PeakRow, rank, I32)}, offsetof(PeakRow, bytes), offsetof(PeakRow, total)),
            std::vector<PeakRow>{peak});
  };
  ledger("memory", "memory_peaks", d.memory, d.peak, d.peak_total);
  ledger("host_memory", "host_memory_peaks", d.host_memory, d.host_peak, d.host_peak_total);
  f.commit();
}

}  // namespace sb
