// collective_perf: collective bandwidth in the nccl-tests conventions, over the backend.
namespace sb {
int run_collective_perf(int argc, char** argv);
}

int main(int argc, char** argv) { return sb::run_collective_perf(argc, argv); }
