// Tests for detect_launch (src/dist/rendezvous.h): rank, world size, local rank and whether MPI carries
// the NCCL id, for each launcher's environment — none, mpirun, srun, srun --mpi=pmix (PMIx sets
// PMIX_RANK and no OMPI_COMM_WORLD_*), mpirun inside a SLURM job — and the malformed ones.
#include "src/dist/rendezvous.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <stdexcept>
#include <utility>
#include <vector>

namespace {

// Sets exactly the given launcher variables (every other one unset) for one test case.
class LaunchEnvironment {
 public:
  explicit LaunchEnvironment(const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const char* name : kNames) unsetenv(name);
    for (const auto& [name, value] : vars) setenv(name, value, 1);
  }
  ~LaunchEnvironment() {
    for (const char* name : kNames) unsetenv(name);
  }

 private:
  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "SLURM_NTASKS",         "SLURM_PROCID",         "SLURM_LOCALID",
                                           "PMIX_RANK",            "PMIX_NAMESPACE"};
};

}  // namespace

TEST_CASE("no launcher: one process, no MPI") {
  LaunchEnvironment env({});
  const LaunchInfo info = detect_launch();
  CHECK(info.rank == 0);
  CHECK(info.world_size == 1);
  CHECK(info.local_rank == 0);
  CHECK_FALSE(info.uses_mpi);
  CHECK(info.source == "single process");
}

TEST_CASE("mpirun: OpenMPI's variables, MPI carries the id") {
  LaunchEnvironment env({{"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  const LaunchInfo info = detect_launch();
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.uses_mpi);
  CHECK(info.source == "mpirun");
}

TEST_CASE("srun without MPI: SLURM's variables, the id needs --rendezvous") {
  LaunchEnvironment env({{"SLURM_NTASKS", "16"}, {"SLURM_PROCID", "9"}, {"SLURM_LOCALID", "1"}});
  const LaunchInfo info = detect_launch();
  CHECK(info.rank == 9);
  CHECK(info.world_size == 16);
  CHECK(info.local_rank == 1);
  CHECK_FALSE(info.uses_mpi);
  CHECK(info.source == "SLURM");
}

TEST_CASE("srun --mpi=pmix: SLURM's numbering, MPI carries the id") {
  LaunchEnvironment env({{"SLURM_NTASKS", "4"},
                         {"SLURM_PROCID", "3"},
                         {"SLURM_LOCALID", "1"},
                         {"PMIX_RANK", "3"},
                         {"PMIX_NAMESPACE", "slurm.pmix.12.0"}});
  const LaunchInfo info = detect_launch();
  CHECK(info.rank == 3);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.uses_mpi);
  CHECK(info.source == "SLURM (PMIx)");
}

TEST_CASE("mpirun inside a SLURM job: mpirun's variables win over the job's") {
  LaunchEnvironment env({{"SLURM_NTASKS", "1"},
                         {"SLURM_PROCID", "0"},
                         {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_RANK", "1"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  const LaunchInfo info = detect_launch();
  CHECK(info.rank == 1);
  CHECK(info.world_size == 2);
  CHECK(info.uses_mpi);
  CHECK(info.source == "mpirun");
}

TEST_CASE("malformed launch variables are errors naming them") {
  {
    LaunchEnvironment env({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "two"}});
    CHECK_THROWS_WITH(detect_launch(), Catch::Contains("SLURM_PROCID='two'"));
  }
  {
    LaunchEnvironment env({{"SLURM_NTASKS", "2"}, {"PMIX_RANK", "0"}});
    CHECK_THROWS_WITH(detect_launch(), Catch::Contains("SLURM_PROCID is not"));
  }
  {
    LaunchEnvironment env({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "2"}, {"PMIX_RANK", "2"}});
    CHECK_THROWS_WITH(detect_launch(), Catch::Contains("rank 2 is not in [0, world size 2)"));
  }
}
