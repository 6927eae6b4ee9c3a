#include <hdf5.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "shardbench/trace/h5.h"

namespace sb {
namespace {

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

hid_t compound_type(const std::vector<Column>& columns, size_t row_size) {
  hid_t t = H5_CHECK(H5Tcreate(H5T_COMPOUND, row_size));
  H5Id str(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(str, 64));
  H5_CHECK(H5Tset_strpad(str, H5T_STR_NULLTERM));
  for (const Column& c : columns) {
    const hid_t type = c.type == Column::I32   ? H5T_NATIVE_INT32
                       : c.type == Column::I64 ? H5T_NATIVE_INT64
                       : c.type == Column::F64 ? H5T_NATIVE_DOUBLE
                                               : hid_t(str);
    H5_CHECK(H5Tinsert(t, c.name.c_str(), c.offset, type));
  }
  return t;
}

// A name of its own for every run's temporary (host and process of rank 0), so two runs
// writing the same --out never share one.
std::string unique_temporary(const std::string& path, MPI_Comm comm) {
  char tag[128];
  std::snprintf(tag, sizeof tag, "%s", temporary_tag(".tmp").c_str());
  MPI_CHECK(MPI_Bcast(tag, sizeof tag, MPI_CHAR, 0, comm));
  return path + tag;
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash + 1);
}

// "dir/run.h5" -> "dir/run-N.h5"
std::string suffixed(const std::string& path, int n) {
  const size_t slash = path.find_last_of('/'), dot = path.find_last_of('.');
  const bool ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string stem = ext ? path.substr(0, dot) : path, tail = ext ? path.substr(dot) : "";
  return stem + "-" + std::to_string(n) + tail;
}

// Reads a closed result back: it opens (HDF5 refuses a truncated file) and every table has
// the rows written and reads in full. Returns what is wrong, or "" for a sound file. Some
// MPI-IO layers report success for writes the filesystem refused (Open MPI 4.1's OMPIO on a
// full disk), so the file is checked, not only the return codes.
std::string unsound(const std::string& path, const std::vector<std::pair<std::string, unsigned long long>>& tables) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return "it does not open as HDF5";
  H5Id file(f, H5Fclose);
  for (const auto& [name, rows] : tables) {
    const hid_t d = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    if (d < 0) return "table " + name + " is missing";
    H5Id dset(d, H5Dclose);
    H5Id space(H5Dget_space(dset), H5Sclose);
    hsize_t n = 0;
    if (space < 0 || H5Sget_simple_extent_dims(space, &n, nullptr) != 1 || n != rows)
      return "table " + name + " has " + std::to_string(n) + " rows of the " + std::to_string(rows) + " written";
    H5Id type(H5Dget_type(dset), H5Tclose);
    std::vector<char> buf(std::max<size_t>(1, n * H5Tget_size(type)));
    if (n > 0 && H5Dread(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
      return "table " + name + " does not read back";
  }
  return "";
}

// Whether `path` is already this run's failure record (another rank of it timed out later
// than the one that wrote it, after its claim went): its start_time and command are root's.
bool same_run_record(const std::string& path, const std::vector<Attr>& root) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_file_locking(fapl, false, true);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  if (f < 0) return false;
  H5Id file(f, H5Fclose);
  int matched = 0;
  for (const Attr& a : root) {
    if (a.name != "start_time" && a.name != "command") continue;
    const hid_t at = H5Aopen(file, a.name.c_str(), H5P_DEFAULT);
    if (at < 0) return false;
    H5Id attr(at, H5Aclose);
    H5Id type(vlen_string_type(), H5Tclose);
    char* text = nullptr;
    if (H5Aread(attr, type, &text) < 0) return false;
    const bool same = text && a.text == text;
    H5free_memory(text);
    if (!same) return false;
    ++matched;
  }
  return matched == 2;
}

}  // namespace

ResultFile::ResultFile(std::string path, MPI_Comm comm, bool overwrite, int64_t local_bytes)
    : path_(std::move(path)), tmp_(unique_temporary(path_, comm)), comm_(comm), overwrite_(overwrite) {
  // Room for the tables and the metadata (a conservative 1 MiB), checked before anything is
  // written: a full disk is named, not found out by a failing H5Dwrite.
  int64_t needed = 0;
  MPI_CHECK(MPI_Allreduce(&local_bytes, &needed, 1, MPI_INT64_T, MPI_SUM, comm));
  needed += 1 << 20;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int64_t avail = rank == 0 ? free_bytes(directory_of(path_)) : 0;
  MPI_CHECK(MPI_Bcast(&avail, 1, MPI_INT64_T, 0, comm));
  if (avail >= 0 && avail < needed)
    throw RunFailure("No space left on device: '" + directory_of(path_) + "' has " + std::to_string(avail) +
                     " bytes free, the result " + path_ + " needs about " + std::to_string(needed) +
                     " bytes; nothing was written");
  register_temporary(tmp_, needed);
  // Rank 0 creates the temporary (never another's: the name is this process's) and holds
  // its lock until the file is published or removed: a later run takes it for stale only
  // once every rank is gone (remove_stale_temporaries).
  if (rank == 0 && (lock_fd_ = create_locked_temporary(tmp_)) < 0)
    SB_FATAL("cannot create " + tmp_ + ": " + std::strerror(errno));
  H5_CHECK(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));  // errors are reported by H5_CHECK
  H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
  H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
  H5_CHECK(H5Pset_file_locking(fapl, false, true));  // the lock above is the one that counts
  file_ = H5_CHECK(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  // Test only (core/fault.h): hold the temporary open before any table is written, so that
  // a test can fill the disk after the space check passed (the other ranks wait in the first
  // collective).
  if (const InjectedFault delay = injected_fault(Fault::WriteDelay))
    if (rank == 0) sleep(delay.seconds);
}

ResultFile::~ResultFile() {
  if (!committed_) {
    if (file_ >= 0) H5Fclose(file_);
    int rank = 0;
    MPI_Comm_rank(comm_, &rank);
    if (rank == 0) std::remove(tmp_.c_str());
    forget_temporary(tmp_);
  }
  if (lock_fd_ >= 0) close(lock_fd_);
}

int64_t ResultFile::group(const std::string& name) {
  if (name.empty() || name == "/") return H5_CHECK(H5Gopen2(file_, "/", H5P_DEFAULT));
  if (H5Lexists(file_, name.c_str(), H5P_DEFAULT) > 0) return H5_CHECK(H5Gopen2(file_, name.c_str(), H5P_DEFAULT));
  return H5_CHECK(H5Gcreate2(file_, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
}

void ResultFile::attributes(const std::string& name, const std::vector<Attr>& attrs) {
  H5Id g(group(name), H5Gclose);
  for (const Attr& a : attrs) write_attr(g, a);
}

void ResultFile::names_attribute(const std::string& object, const std::string& name,
                                 const std::vector<std::string>& names) {
  std::vector<const char*> ptrs;
  for (const auto& n : names) ptrs.push_back(n.c_str());
  hsize_t n = ptrs.size();
  H5Id obj(H5_CHECK(H5Oopen(file_, object.c_str(), H5P_DEFAULT)), H5Oclose);
  H5Id space(H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  H5Id type(vlen_string_type(), H5Tclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(attr, type, ptrs.data()));
}

void ResultFile::write_rows(const std::string& name, const std::vector<Column>& columns, size_t row_size,
                            const void* rows, size_t n) {
  const size_t slash = name.find_last_of('/');
  if (slash != std::string::npos) H5Id g(group(name.substr(0, slash)), H5Gclose);
  unsigned long long local = n, offset = 0, total = 0;
  MPI_CHECK(MPI_Exscan(&local, &offset, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm_));
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  if (rank == 0) offset = 0;  // MPI_Exscan leaves rank 0's result undefined
  MPI_CHECK(MPI_Allreduce(&local, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm_));
  H5Id type(compound_type(columns, row_size), H5Tclose);
  hsize_t dims = total;
  H5Id fspace(H5_CHECK(H5Screate_simple(1, &dims, nullptr)), H5Sclose);
  H5Id dset(H5_CHECK(H5Dcreate2(file_, name.c_str(), type, fspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
            H5Dclose);
  if (total == 0) return;
  tables_.emplace_back(name, total);
  hsize_t start = offset, count = local, mdims = std::max<hsize_t>(local, 1);
  H5Id mspace(H5_CHECK(H5Screate_simple(1, &mdims, nullptr)), H5Sclose);
  if (local > 0) {
    H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  } else {  // a rank without rows still takes part in the collective write
    H5_CHECK(H5Sselect_none(fspace));
    H5_CHECK(H5Sselect_none(mspace));
  }
  H5Id xfer(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
  H5_CHECK(H5Pset_dxpl_mpio(xfer, H5FD_MPIO_COLLECTIVE));
  std::vector<char> dummy(row_size, 0);
  H5_CHECK(H5Dwrite(dset, type, mspace, fspace, xfer, local > 0 ? rows : dummy.data()));
}

// Publishes the temporary under the final name. Without --overwrite the name is taken only
// if free at this moment: a run that lost the race to another with the same --out keeps its
// result under a suffixed name and ends with ResultKeptAside (exit 6) on every rank.
void ResultFile::commit() {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  if (const InjectedFault delay = injected_fault(Fault::PublishDelay))  // test only: races, signals
    if (rank == 0) sleep(delay.seconds);
  H5_CHECK(H5Fclose(file_));
  file_ = -1;
  MPI_CHECK(MPI_Barrier(comm_));
  char kept[4096] = "";  // rank 0: the suffixed name when the final one was taken
  if (rank == 0) {
    const std::string wrong = unsound(tmp_, tables_);
    if (!wrong.empty()) {
      const std::string cause = disk_space_cause();
      SB_FATAL("the result written to " + tmp_ + " does not read back (" + wrong +
               ") although every write reported success" + (cause.empty() ? "" : ": " + cause));
    }
    // On stable storage before it gets the final name: a node crash cannot leave a
    // truncated file there.
    if (const int err = sync_path(tmp_, O_RDONLY)) {
      const std::string cause = disk_space_cause();
      SB_FATAL("fsync " + tmp_ + ": " + (cause.empty() ? std::strerror(err) : cause));
    }
    int err = publish_temporary(tmp_, path_, overwrite_);
    for (int n = 2; err == EEXIST && n < 10000; ++n) {
      const std::string other = suffixed(path_, n);
      err = publish_temporary(tmp_, other, false);
      if (err == 0) std::snprintf(kept, sizeof kept, "%s", other.c_str());
    }
    if (err != 0) SB_FATAL("cannot publish " + tmp_ + " as " + path_ + ": " + std::strerror(err));
    sync_path(directory_of(path_), O_RDONLY | O_DIRECTORY);  // the new name itself
  }
  forget_temporary(tmp_);
  MPI_CHECK(MPI_Bcast(kept, sizeof kept, MPI_CHAR, 0, comm_));
  committed_ = true;
  if (kept[0])
    throw ResultKeptAside("--out '" + path_ + "' was written by another run while this one ran: this result is kept as '" +
                     kept + "'");
}

bool write_failure_record(const std::string& path, const std::string& run_tag, const std::vector<Attr>& root,
                          const std::vector<Attr>& provenance) {
  // The temporary's name is the run's, created exclusively: of the ranks whose watchdogs
  // fire, the first writes the record and the others find the name taken.
  const std::string tmp = path + run_tag;
  const int lock = create_locked_temporary(tmp);  // held until published, as ResultFile's
  if (lock < 0 && errno == EEXIST) {
    // Another rank writes it. This rank's exit makes mpirun end every rank, the writer too:
    // wait for the record (bounded: it may go to a suffixed name, or its writer be stuck).
    for (int i = 0; i < 200 && !same_run_record(path, root); ++i) usleep(50000);
    return false;
  }
  if (lock >= 0) register_temporary(tmp, 0);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_file_locking(fapl, false, true);
  const hid_t file = lock < 0 ? -1 : H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);  // this process only
  H5Pclose(fapl);
  bool ok = file >= 0;
  if (const InjectedFault delay = injected_fault(Fault::RecordDelay)) sleep(delay.seconds);  // test only
  if (ok) {
    const hid_t g = H5Gopen2(file, "/", H5P_DEFAULT);
    for (const Attr& a : root) write_attr(g, a);
    H5Gclose(g);
    const hid_t p = H5Gcreate2(file, "provenance", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (const Attr& a : provenance) write_attr(p, a);
    H5Gclose(p);
    ok = H5Fclose(file) >= 0 && sync_path(tmp, O_RDONLY) == 0;
  }
  int err = ok ? publish_temporary(tmp, path, false) : -1;
  const bool recorded = err == EEXIST && same_run_record(path, root);
  for (int n = 2; err == EEXIST && !recorded && n < 10000; ++n) err = publish_temporary(tmp, suffixed(path, n), false);
  if (err != 0) unlink(tmp.c_str());
  if (lock >= 0) close(lock);
  forget_temporary(tmp);
  // The run's name stays taken (empty, locked) until this process exits (remove_temporaries
  // in the watchdog): a rank whose watchdog fires later records nothing a second time.
  if (err == 0 && create_locked_temporary(tmp) >= 0) register_temporary(tmp, 0);
  return err == 0;
}

}  // namespace sb
