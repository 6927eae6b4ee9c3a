// Result files: parallel HDF5, written collectively by every rank of a communicator.
// Tables are datasets of compound rows; each rank writes its own contiguous slice in one
// collective MPI-IO write (offsets from MPI_Exscan), so nothing is gathered to rank 0 and
// memory stays bounded by each rank's own rows. Attributes are written collectively with
// identical values on every rank. The file lives under a temporary name of its own
// (`PATH.<host>.<pid>.tmp`) until commit() publishes it: a file under the final name is
// always complete, and never replaces another run's file unless asked to.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sb {

// One string or numeric attribute (metadata, provenance, summary).
struct Attr {
  std::string name;
  std::string text;  // used when is_text
  double number = 0;
  bool is_text = true;
  bool is_integer = false;
  static Attr str(std::string n, std::string v) { return {std::move(n), std::move(v), 0, true, false}; }
  static Attr num(std::string n, double v) { return {std::move(n), "", v, false, false}; }
  static Attr integer(std::string n, int64_t v) { return {std::move(n), "", double(v), false, true}; }
};

// One column of a table: its name, type and offset in the row struct.
struct Column {
  enum Type { I32, I64, F64, Str64 };  // Str64: char[64], NUL-terminated
  std::string name;
  Type type;
  size_t offset;
};
#define SB_COLUMN(Row, field, type) ::sb::Column{#field, ::sb::Column::type, offsetof(Row, field)}

class ResultFile {
 public:
  // overwrite: replace an existing PATH at commit (--overwrite); otherwise never.
  // local_bytes: this rank's table bytes; with the metadata they must fit the free space of
  // PATH's filesystem, or RunFailure names the shortfall before anything is written.
  ResultFile(std::string path, MPI_Comm comm, bool overwrite = false, int64_t local_bytes = 0);
  ~ResultFile();  // an uncommitted file is closed and its temporary removed
  ResultFile(const ResultFile&) = delete;
  ResultFile& operator=(const ResultFile&) = delete;

  // Attributes of a group ("" or "/" for the root; other groups are created on first use).
  void attributes(const std::string& group, const std::vector<Attr>& attrs);
  // A string-array attribute on a dataset or group (e.g. the names of enum codes).
  void names_attribute(const std::string& object, const std::string& name, const std::vector<std::string>& names);
  // Every rank's rows of one table ("group/name" creates the group).
  template <class Row>
  void table(const std::string& name, const std::vector<Column>& columns, const std::vector<Row>& rows) {
    write_rows(name, columns, sizeof(Row), rows.data(), rows.size());
  }
  // Publishes the file. Without overwrite, when another run took PATH meanwhile, the result
  // is kept as PATH-N and a UsageError (on every rank) says so.
  void commit();

 private:
  void write_rows(const std::string& name, const std::vector<Column>& columns, size_t row_size,
                  const void* rows, size_t n);
  int64_t group(const std::string& name);
  std::string path_, tmp_;
  MPI_Comm comm_;
  bool overwrite_;
  int64_t file_ = -1;
  int lock_fd_ = -1;  // rank 0: the temporary's lock (create_locked_temporary)
  bool committed_ = false;
  std::vector<std::pair<std::string, unsigned long long>> tables_;  // name, rows: checked before publishing
};

// A small file of root attributes and a `provenance` group and no tables, written by this
// process alone (no MPI: usable from the watchdog while other ranks hang), published without
// clobbering like ResultFile. Its temporary is PATH + run_tag, the tag (temporary_tag
// ".failed.tmp") of the run's rank 0 on every rank, so that one record is written however
// many ranks' watchdogs fire: false when another process of the run holds the name (or the
// record could not be written). It is found stale like ResultFile's. The caller writes
// schema_version and status = failed into `root`: readers take such a file as a failed
// result without tables.
bool write_failure_record(const std::string& path, const std::string& run_tag, const std::vector<Attr>& root,
                          const std::vector<Attr>& provenance);

}  // namespace sb
