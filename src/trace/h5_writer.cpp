// Writes a run's trace with parallel HDF5: every table is one dataset of compound rows with
// a `rank` column; each rank writes its own contiguous slice in one collective MPI-IO
// write (offsets from MPI_Exscan), so nothing is gathered to rank 0 and memory stays
// bounded by each rank's own rows, at 8 ranks or 512. Attributes are written collectively
// with identical values on every rank, as parallel HDF5 requires.
#include <hdf5.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "shardbench/check.h"
#include "shardbench/trace.h"

namespace sb {
namespace {

constexpr int kSchemaVersion = 1;
constexpr int kNameLength = 64;

// RAII owner of an HDF5 identifier.
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  operator hid_t() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

hid_t vlen_string_type() {
  hid_t t = H5_CHECK(H5Tcopy(H5T_C_S1));
  H5_CHECK(H5Tset_size(t, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(t, H5T_CSET_UTF8));
  return t;
}

void write_attr(hid_t loc, const Attr& a) {
  H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  if (a.is_text) {
    H5Id type(vlen_string_type(), H5Tclose);
    H5Id attr(H5_CHECK(H5Acreate2(loc, a.name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
    const char* s = a.text.c_str();
    H5_CHECK(H5Awrite(attr, type, &s));
  } else if (a.is_integer) {
    const int64_t v = int64_t(a.number);
    H5Id attr(H5_CHECK(H5Acreate2(loc, a.name.c_str(), H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT)),
              H5Aclose);
    H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &v));
  } else {
    H5Id attr(H5_CHECK(H5Acreate2(loc, a.name.c_str(), H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT)),
              H5Aclose);
    H5_CHECK(H5Awrite(attr, H5T_NATIVE_DOUBLE, &a.number));
  }
}

void write_names_attr(hid_t loc, const char* name, const std::vector<const char*>& names) {
  hsize_t n = names.size();
  H5Id space(H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  H5Id type(vlen_string_type(), H5Tclose);
  H5Id attr(H5_CHECK(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(attr, type, names.data()));
}

// One collective write of every rank's rows into dataset `name` of `loc`.
template <class Row>
hid_t write_table(hid_t loc, const char* name, hid_t type, const std::vector<Row>& rows, MPI_Comm comm) {
  unsigned long long local = rows.size(), offset = 0, total = 0;
  MPI_CHECK(MPI_Exscan(&local, &offset, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm));
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  if (rank == 0) offset = 0;  // MPI_Exscan leaves rank 0's result undefined
  MPI_CHECK(MPI_Allreduce(&local, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm));
  hsize_t dims = total;
  H5Id fspace(H5_CHECK(H5Screate_simple(1, &dims, nullptr)), H5Sclose);
  hid_t dset = H5_CHECK(H5Dcreate2(loc, name, type, fspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (total == 0) return dset;
  hsize_t start = offset, count = local, mdims = std::max<hsize_t>(local, 1);
  H5Id mspace(H5_CHECK(H5Screate_simple(1, &mdims, nullptr)), H5Sclose);
  if (local > 0) {
    H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  } else {
    H5_CHECK(H5Sselect_none(fspace));
    H5_CHECK(H5Sselect_none(mspace));
  }
  H5Id xfer(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
  H5_CHECK(H5Pset_dxpl_mpio(xfer, H5FD_MPIO_COLLECTIVE));
  static const Row dummy{};
  H5_CHECK(H5Dwrite(dset, type, mspace, fspace, xfer, local > 0 ? rows.data() : &dummy));
  return dset;
}

// ---- row types: plain structs, described to HDF5 field by field ----
struct EventRow {
  int32_t rank, step, phase, op, unit, lane;
  double start, end;
  int64_t bytes;
  double flops;
  int32_t m, n, k, batch, trans;
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
  char host[kNameLength];
  char device[kNameLength];
};

#define SB_FIELD(T, type, Row, field) H5_CHECK(H5Tinsert(T, #field, HOFFSET(Row, field), type))

hid_t step_type() {
  hid_t t = H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(StepRow)));
  SB_FIELD(t, H5T_NATIVE_INT32, StepRow, rank);
  SB_FIELD(t, H5T_NATIVE_INT32, StepRow, step);
  SB_FIELD(t, H5T_NATIVE_INT32, StepRow, warmup);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, time);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, compute);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, communication);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, exposed_comm);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, overhead);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, gemm_time);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, gemm_flops);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, model_tflops);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, hardware_tflops);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, tokens_per_s);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, StepRow, loss);
  SB_FIELD(t, H5T_NATIVE_INT64, StepRow, comm_bytes);
  SB_FIELD(t, H5T_NATIVE_INT64, StepRow, peak_memory);
  return t;
}

hid_t event_type() {
  hid_t t = H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(EventRow)));
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, rank);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, step);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, phase);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, op);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, unit);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, lane);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, EventRow, start);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, EventRow, end);
  SB_FIELD(t, H5T_NATIVE_INT64, EventRow, bytes);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, EventRow, flops);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, m);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, n);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, k);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, batch);
  SB_FIELD(t, H5T_NATIVE_INT32, EventRow, trans);
  return t;
}

// Per-category byte columns named after the categories, then `total`.
void insert_categories(hid_t t, size_t bytes_offset, size_t total_offset) {
  for (int c = 0; c < kMemCategories; ++c)
    H5_CHECK(H5Tinsert(t, mem_category_name(MemCategory(c)), bytes_offset + c * sizeof(int64_t), H5T_NATIVE_INT64));
  H5_CHECK(H5Tinsert(t, "total", total_offset, H5T_NATIVE_INT64));
}

hid_t memory_type() {
  hid_t t = H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(MemoryRow)));
  SB_FIELD(t, H5T_NATIVE_INT32, MemoryRow, rank);
  SB_FIELD(t, H5T_NATIVE_INT32, MemoryRow, step);
  SB_FIELD(t, H5T_NATIVE_DOUBLE, MemoryRow, time);
  insert_categories(t, HOFFSET(MemoryRow, bytes), HOFFSET(MemoryRow, total));
  return t;
}

hid_t peak_type() {
  hid_t t = H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(PeakRow)));
  SB_FIELD(t, H5T_NATIVE_INT32, PeakRow, rank);
  insert_categories(t, HOFFSET(PeakRow, bytes), HOFFSET(PeakRow, total));
  return t;
}

hid_t rank_type() {
  hid_t t = H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(RankRow)));
  SB_FIELD(t, H5T_NATIVE_INT32, RankRow, rank);
  H5Id s(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(s, kNameLength));
  H5_CHECK(H5Tset_strpad(s, H5T_STR_NULLTERM));
  SB_FIELD(t, s, RankRow, host);
  SB_FIELD(t, s, RankRow, device);
  return t;
}

void write_rows(hid_t loc, const char* name, hid_t (*make_type)(), const auto& rows, MPI_Comm comm) {
  H5Id type(make_type(), H5Tclose);
  H5Id dset(write_table(loc, name, type, rows, comm), H5Dclose);
}

std::vector<const char*> names(int n, const char* (*name_of)(int)) {
  std::vector<const char*> v;
  for (int i = 0; i < n; ++i) v.push_back(name_of(i));
  return v;
}

}  // namespace

std::string temporary_path(const std::string& path) { return path + ".tmp"; }

void write_trace(const std::string& path, const TraceData& d, MPI_Comm comm) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  H5_CHECK(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));  // errors are reported by H5_CHECK
  const std::string tmp = temporary_path(path);
  {
    H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
    H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
    H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
    H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
    H5Id file(H5_CHECK(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)), H5Fclose);

    write_attr(file, Attr::integer("schema_version", kSchemaVersion));
    for (const Attr& a : d.run) write_attr(file, a);
    {
      H5Id g(H5_CHECK(H5Gcreate2(file, "provenance", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
      for (const Attr& a : d.provenance) write_attr(g, a);
      RankRow r{};
      r.rank = rank;
      std::snprintf(r.host, sizeof r.host, "%s", d.host.c_str());
      std::snprintf(r.device, sizeof r.device, "%s", d.device.c_str());
      write_rows(g, "ranks", rank_type, std::vector<RankRow>{r}, comm);
    }
    {
      H5Id g(H5_CHECK(H5Gcreate2(file, "plan", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
      for (const Attr& a : d.plan) write_attr(g, a);
    }

    std::vector<StepRow> steps = d.steps;
    for (StepRow& s : steps) s.rank = rank;
    write_rows(file, "steps", step_type, steps, comm);

    std::vector<EventRow> events;
    if (d.events) {
      events.reserve(d.events->size());
      for (const TraceEvent& e : *d.events) {
        const OpEvent& o = e.op;
        events.push_back(EventRow{rank, e.step, int(o.phase), int(o.kind), o.unit, o.lane, o.start, o.end,
                                  o.bytes, o.flops, o.gemm[0], o.gemm[1], o.gemm[2], o.gemm[3], o.gemm[4]});
      }
    }
    {
      H5Id type(event_type(), H5Tclose);
      H5Id dset(write_table(file, "events", type, events, comm), H5Dclose);
      write_names_attr(dset, "phase_names", names(int(Phase::kCount), [](int i) { return phase_name(Phase(i)); }));
      write_names_attr(dset, "op_names", names(int(OpKind::kCount), [](int i) { return op_kind_name(OpKind(i)); }));
    }
    std::vector<MemoryRow> memory;
    if (d.memory) {
      memory.reserve(d.memory->size());
      for (const MemorySample& m : *d.memory) {
        MemoryRow r{rank, m.step, m.time, {}, 0};
        for (int c = 0; c < kMemCategories; ++c) r.total += (r.bytes[c] = m.bytes[c]);
        memory.push_back(r);
      }
    }
    write_rows(file, "memory", memory_type, memory, comm);
    PeakRow peak{rank, {}, d.peak_total};
    for (int c = 0; c < kMemCategories; ++c) peak.bytes[c] = d.peak[c];
    write_rows(file, "memory_peaks", peak_type, std::vector<PeakRow>{peak}, comm);
  }
  // Only a complete file gets the final name.
  MPI_CHECK(MPI_Barrier(comm));
  if (rank == 0 && std::rename(tmp.c_str(), path.c_str()) != 0)
    SB_FATAL("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  MPI_CHECK(MPI_Barrier(comm));
}

}  // namespace sb
