// Communicators split from others: ncclCommSplit (the CPU build's MPI stand-in simt/nccl.cpp, or
// NCCL on GPUs) and src/dist/comm.h's Communicator(parent, color, key, name), against host loops
// over what every rank contributed. Runs under mpirun (test/checks/distributed_nccl.sh: 2 and 4
// ranks; 1 on a one-GPU machine); it is named mpi_* so the single-process test runner does not
// pick it up.
//
// With R ranks the groups have G = 2 ranks when R is even (else 1): "consecutive" groups
// (color = rank / G: {0,1} {2,3} with 4 ranks, a tensor-parallel layout) and "strided" ones
// (color = rank % (R / G): {0,2} {1,3}, the data-parallel groups of the same grid). A group's ranks
// are ordered by key, ties by rank in the parent; its collectives involve its ranks only.
// src/dist/parallel_groups.h's grid for every --tp that divides the world: which world ranks form
// each TP and DP group, in which order (the checkpoint loader takes TP rank = world rank mod --tp);
// and for every --tp x --pp that does (4 ranks: TP 1 x PP 2 x DP 2, TP 2 x PP 2, TP 1 x PP 4, ...),
// the TP, PP and DP groups of the DP x PP x TP grid, written here as plain coordinate formulas.
#include "test/test_util.h"
#include "src/dist/comm.h"
#include "src/dist/parallel_groups.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

Communicator& world() {
  static Communicator instance{CommOptions{}};
  return instance;
}

int ranks() { return world().world_size(); }
int me() { return world().rank(); }
int group_size() { return ranks() % 2 == 0 ? 2 : 1; }

using RankFn = std::function<int(int)>;  // of a rank in the world
const RankFn kConsecutive = [](int r) { return r / group_size(); };
const RankFn kStrided = [](int r) { return r % (ranks() / group_size()); };

// The world ranks of `rank`'s group, in the group's rank order: by key, ties by world rank.
std::vector<int> group_of(int rank, const RankFn& color, const RankFn& key) {
  std::vector<int> members;
  for (int r = 0; r < ranks(); ++r)
    if (color(r) == color(rank)) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return key(a) < key(b); });
  return members;
}
int index_in(const std::vector<int>& members, int rank) {
  return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
}

float contribution(int rank, size_t i) {
  return static_cast<float>(((rank + 1) * 37 + static_cast<int>(i % 101) * 13) % 97) / 16.0f - 3.0f +
         0.001953125f * static_cast<float>(rank);
}
std::vector<float> inputs_of(int rank, size_t n, int salt = 0) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = contribution(rank + salt, i);
  return values;
}
// Element-wise sum over `members` (in their order, in fp32) of their inputs.
std::vector<float> sum_over(const std::vector<int>& members, size_t n, int salt = 0) {
  std::vector<float> sum(n, 0.0f);
  for (int r : members) {
    const std::vector<float> x = inputs_of(r, n, salt);
    for (size_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  return sum;
}
// `members`' inputs one after the other.
std::vector<float> concatenated(const std::vector<int>& members, size_t n) {
  std::vector<float> all;
  for (int r : members) {
    const std::vector<float> x = inputs_of(r, n);
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

// Polls ncclCommGetAsyncError while `status` is ncclInProgress; the final status.
ncclResult_t settle(ncclComm_t c, ncclResult_t status) {
  while (status == ncclInProgress) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(c, &status) != ncclSuccess) return ncclInternalError;
  }
  return status;
}

// An NCCL communicator of its own over the world's ranks, set up.
ncclComm_t nccl_world(bool blocking) {
  ncclUniqueId id;
  if (me() == 0) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(id.internal, sizeof(id.internal), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t c = nullptr;
  const ncclResult_t status = ncclCommInitRankConfig(&c, ranks(), id, me(), &config);
  REQUIRE(settle(c, status) == ncclSuccess);
  return c;
}

// ncclCommSplit of `parent`, polled on the parent to its end (NCCL completes a split there and
// fills *newcomm then); the child or NULL.
ncclComm_t split(ncclComm_t parent, int color, int key, ncclConfig_t* config = nullptr) {
  ncclComm_t child = nullptr;
  REQUIRE(settle(parent, ncclCommSplit(parent, color, key, &child, config)) == ncclSuccess);
  return child;
}

// Finalize polled to its end, then destroy: what a non-blocking communicator needs.
void finalize_and_destroy(ncclComm_t c) {
  REQUIRE(settle(c, ncclCommFinalize(c)) == ncclSuccess);
  REQUIRE(ncclCommDestroy(c) == ncclSuccess);
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CUDA_CHECK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// An all-reduce (sum) on `c` of this rank's inputs, checked against the sum over `members`.
void check_all_reduce(ncclComm_t c, const std::vector<int>& members, size_t n, cudaStream_t stream, int salt = 0) {
  test::DeviceBuffer<float> data(inputs_of(me(), n, salt));
  REQUIRE(settle(c, ncclAllReduce(data.ptr, data.ptr, n, ncclFloat32, ncclSum, c, stream)) == ncclSuccess);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CHECK(test::all_close<float>("all-reduce", data.download(), sum_over(members, n, salt)));
}

// An all-gather on `c`: the members' inputs in the group's rank order.
void check_all_gather(ncclComm_t c, const std::vector<int>& members, size_t n, cudaStream_t stream) {
  test::DeviceBuffer<float> send(inputs_of(me(), n)), recv(n * members.size());
  REQUIRE(settle(c, ncclAllGather(send.ptr, recv.ptr, n, ncclFloat32, c, stream)) == ncclSuccess);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CHECK(test::all_close<float>("all-gather", recv.download(), concatenated(members, n)));
}

// The world ranks of `c`'s members in its rank order, as they tell each other (an all-gather).
std::vector<int> world_ranks_of(Communicator& c) {
  test::DeviceBuffer<float> ranks_in(std::vector<float>(c.world_size(), -1.0f));
  const float mine = static_cast<float>(me());
  CUDA_CHECK(cudaMemcpy(ranks_in.ptr + c.rank(), &mine, sizeof(float), cudaMemcpyHostToDevice));
  c.ordered_with(cudaStreamLegacy, [&] { c.all_gather(ranks_in.ptr + c.rank(), ranks_in.ptr, 1); });
  std::vector<int> members;
  for (float r : ranks_in.download()) members.push_back(static_cast<int>(r));
  return members;
}

}  // namespace

TEST_CASE("ncclCommSplit groups the ranks by color and orders each group by key", "[nccl][split]") {
  Stream stream;
  const struct {
    const char* name;
    RankFn color;
  } layouts[] = {{"consecutive", kConsecutive}, {"strided", kStrided}};
  const struct {
    const char* name;
    RankFn key;
  } orders[] = {{"keys ascending", [](int r) { return r; }},
                {"keys reversing the order", [](int r) { return ranks() - r; }},
                {"equal keys (parent order)", [](int) { return 7; }}};
  for (bool blocking : {true, false}) {
    ncclComm_t parent = nccl_world(blocking);
    for (const auto& layout : layouts)
      for (const auto& order : orders) {
        INFO((blocking ? "blocking" : "non-blocking") << " parent, " << layout.name << " groups, " << order.name);
        const std::vector<int> members = group_of(me(), layout.color, order.key);
        ncclComm_t child = split(parent, layout.color(me()), order.key(me()));
        REQUIRE(child != nullptr);
        int count = 0, rank = -1;
        CHECK(ncclCommCount(child, &count) == ncclSuccess);
        CHECK(ncclCommUserRank(child, &rank) == ncclSuccess);
        CHECK(count == static_cast<int>(members.size()));
        CHECK(rank == index_in(members, me()));
        check_all_gather(child, members, 9, stream.s);
        check_all_reduce(child, members, 301, stream.s);
        if (blocking) REQUIRE(ncclCommDestroy(child) == ncclSuccess);  // blocking as its parent is
        else finalize_and_destroy(child);
      }
    if (blocking) REQUIRE(ncclCommDestroy(parent) == ncclSuccess);
    else finalize_and_destroy(parent);
  }
}

TEST_CASE("ncclCommSplit with NCCL_SPLIT_NOCOLOR leaves a rank out", "[nccl][split]") {
  Stream stream;
  ncclComm_t parent = nccl_world(false);
  const int out = ranks() - 1;
  const RankFn color = [out](int r) { return r == out ? NCCL_SPLIT_NOCOLOR : 0; };
  ncclComm_t child = split(parent, color(me()), me());
  if (me() == out) {
    CHECK(child == nullptr);
  } else {
    REQUIRE(child != nullptr);
    std::vector<int> members;
    for (int r = 0; r < out; ++r) members.push_back(r);
    int count = 0;
    CHECK(ncclCommCount(child, &count) == ncclSuccess);
    CHECK(count == ranks() - 1);
    check_all_reduce(child, members, 77, stream.s);
    finalize_and_destroy(child);
  }
  // The parent, every rank of it, still works.
  std::vector<int> everyone(ranks());
  for (int r = 0; r < ranks(); ++r) everyone[r] = r;
  check_all_reduce(parent, everyone, 50, stream.s);
  finalize_and_destroy(parent);
}

TEST_CASE("collectives on a parent and the communicators split from it interleave", "[nccl][split]") {
  Stream stream;
  std::vector<int> everyone(ranks());
  for (int r = 0; r < ranks(); ++r) everyone[r] = r;
  const RankFn by_rank = [](int r) { return r; };
  ncclComm_t parent = nccl_world(false);
  ncclComm_t tp = split(parent, kConsecutive(me()), me());
  check_all_reduce(parent, everyone, 64, stream.s, 1);
  ncclComm_t dp = split(parent, kStrided(me()), me());
  const std::vector<int> tp_members = group_of(me(), kConsecutive, by_rank);
  const std::vector<int> dp_members = group_of(me(), kStrided, by_rank);
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    check_all_reduce(tp, tp_members, 33, stream.s, round);
    check_all_reduce(parent, everyone, 33, stream.s, round);
    check_all_gather(dp, dp_members, 5, stream.s);
    check_all_reduce(dp, dp_members, 17, stream.s, round + 2);
    check_all_gather(parent, everyone, 4, stream.s);
    check_all_gather(tp, tp_members, 6, stream.s);
  }
  // Children first, then their parent.
  finalize_and_destroy(tp);
  finalize_and_destroy(dp);
  check_all_reduce(parent, everyone, 8, stream.s);
  finalize_and_destroy(parent);
}

TEST_CASE("a split communicator's error and abort leave its parent working", "[nccl][split]") {
  Stream stream;
  std::vector<int> everyone(ranks());
  for (int r = 0; r < ranks(); ++r) everyone[r] = r;
  ncclComm_t parent = nccl_world(false);
  ncclComm_t child = split(parent, kConsecutive(me()), me());
  REQUIRE(child != nullptr);
  // Planted, on every rank: a root outside the group poisons the non-blocking child for good.
  test::DeviceBuffer<float> data(8);
  CHECK(ncclBroadcast(data.ptr, data.ptr, 8, ncclFloat32, group_size(), child, stream.s) == ncclInvalidArgument);
  ncclResult_t async_error = ncclSuccess;
  CHECK(ncclCommGetAsyncError(child, &async_error) == ncclSuccess);
  CHECK(async_error == ncclInvalidArgument);
  CHECK(ncclCommGetAsyncError(parent, &async_error) == ncclSuccess);
  CHECK(async_error == ncclSuccess);
  check_all_reduce(parent, everyone, 40, stream.s);
  // Only the abort remains for the child; the parent goes on, and splits again.
  CHECK(ncclCommAbort(child) == ncclSuccess);
  check_all_reduce(parent, everyone, 41, stream.s);
  ncclComm_t again = split(parent, kStrided(me()), me());
  check_all_reduce(again, group_of(me(), kStrided, [](int r) { return r; }), 42, stream.s);
  finalize_and_destroy(again);
  finalize_and_destroy(parent);
}

// ---- src/dist/comm.h's split communicators: a DP × TP grid of the world

TEST_CASE("Communicator split: ranks, sizes and group-local collectives", "[nccl][split][communicator]") {
  const int G = group_size();
  world().counts() = {};
  Communicator tp(world(), me() / G, me(), "tensor-parallel");
  Communicator dp(world(), me() % G, me(), "data-parallel");
  const RankFn by_rank = [](int r) { return r; };
  const std::vector<int> tp_members = group_of(me(), [G](int r) { return r / G; }, by_rank);
  const std::vector<int> dp_members = group_of(me(), [G](int r) { return r % G; }, by_rank);
  CHECK(tp.world_size() == G);
  CHECK(tp.rank() == me() % G);
  CHECK(dp.world_size() == ranks() / G);
  CHECK(dp.rank() == me() / G);
  CHECK(tp.local_rank() == world().local_rank());
  CHECK(dp.launcher() == world().launcher());
  CHECK(tp.stream() != world().stream());
  CHECK(tp.stream() != dp.stream());
  // How the watchdog's messages name this rank.
  CHECK(world().describe() == "rank " + std::to_string(me()));
  CHECK(tp.describe() == "rank " + std::to_string(me()) + " (tensor-parallel rank " + std::to_string(me() % G) +
                             " of " + std::to_string(G) + ")");

  // All-reduce on the tensor-parallel group.
  test::DeviceBuffer<float> data(inputs_of(me(), 129));
  tp.wait_for(cudaStreamLegacy);
  tp.all_reduce(data.ptr, 129, ncclSum);
  CHECK(test::all_close<float>("tensor-parallel all-reduce", data.download(), sum_over(tp_members, 129)));
  // All-gather on the data-parallel group, in place.
  const size_t n = 11;
  test::DeviceBuffer<float> gathered(n * dp.world_size());
  CUDA_CHECK(cudaMemcpy(gathered.ptr + dp.rank() * n, inputs_of(me(), n).data(), n * sizeof(float),
                        cudaMemcpyHostToDevice));
  dp.wait_for(cudaStreamLegacy);
  dp.all_gather(gathered.ptr + dp.rank() * n, gathered.ptr, n);
  CHECK(test::all_close<float>("data-parallel all-gather", gathered.download(), concatenated(dp_members, n)));
  // Reduce-scatter on the tensor-parallel group: block r of the group's sum on group rank r.
  const size_t block = 7;
  test::DeviceBuffer<float> send(inputs_of(me(), block * G)), recv(block);
  tp.wait_for(cudaStreamLegacy);
  tp.reduce_scatter(send.ptr, recv.ptr, block, ncclAvg);
  std::vector<float> want = sum_over(tp_members, block * G);
  want = std::vector<float>(want.begin() + tp.rank() * block, want.begin() + (tp.rank() + 1) * block);
  for (float& x : want) x /= static_cast<float>(G);
  CHECK(test::all_close<float>("tensor-parallel reduce-scatter", recv.download(), want));
  // Host sums and the barrier.
  double dp_sum = 0.0;
  for (int r : dp_members) dp_sum += r + 0.5;
  CHECK(dp.sum(me() + 0.5) == dp_sum);
  tp.barrier();

  // Each communicator counts its own collectives.
  CHECK(tp.counts().all_reduce == 2);  // and the barrier's
  CHECK(tp.counts().reduce_scatter == 1);
  CHECK(tp.counts().all_gather == 0);
  CHECK(dp.counts().all_gather == 1);
  CHECK(dp.counts().all_reduce == 1);
  CHECK(world().counts().all_reduce == 0);
  CHECK(world().counts().all_gather == 0);

  // The world communicator still works, between and after the groups' collectives.
  const double world_total = world().sum(static_cast<double>(me()));
  CHECK(world_total == ranks() * (ranks() - 1) / 2.0);
  CHECK(tp.sum(1.0) == G);
  test::DeviceBuffer<float> everywhere(inputs_of(me(), 31));
  world().wait_for(cudaStreamLegacy);
  world().all_reduce(everywhere.ptr, 31, ncclSum);
  std::vector<int> everyone(ranks());
  for (int r = 0; r < ranks(); ++r) everyone[r] = r;
  CHECK(test::all_close<float>("world all-reduce", everywhere.download(), sum_over(everyone, 31)));
  CHECK(world().counts().all_reduce == 2);
}

// NCCL kernels of two communicators that run at once on one GPU may deadlock: a collective issued
// on one communicator after another's runs after it (comm.h), with no ordering by the caller. The
// CPU build's stream checker ends this process ("simt: stream hazard: ... two communicators")
// where two of them are left unordered; the results are checked on both builds.
TEST_CASE("Communicator split: collectives of several communicators run in the order the host issued them",
          "[nccl][split][communicator]") {
  const int G = group_size();
  Communicator tp(world(), me() / G, me(), "tensor-parallel");
  Communicator dp(world(), me() % G, me(), "data-parallel");
  const RankFn by_rank = [](int r) { return r; };
  const std::vector<int> tp_members = group_of(me(), [G](int r) { return r / G; }, by_rank);
  const std::vector<int> dp_members = group_of(me(), [G](int r) { return r % G; }, by_rank);
  std::vector<int> everyone(ranks());
  for (int r = 0; r < ranks(); ++r) everyone[r] = r;
  test::DeviceBuffer<float> a(inputs_of(me(), 33)), b(inputs_of(me(), 17)), c(inputs_of(me(), 9));
  for (Communicator* comm : {&tp, &dp, &world()}) comm->wait_for(cudaStreamLegacy);
  for (int round = 0; round < 2; ++round) {  // the second round: each after the other two's first
    tp.all_reduce(a.ptr, 33, ncclAvg);
    dp.all_reduce(b.ptr, 17, ncclAvg);
    world().all_reduce(c.ptr, 9, ncclAvg);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  // An average of averages over the same ranks is the average.
  const auto average = [](const std::vector<int>& members, size_t n) {
    std::vector<float> sum = sum_over(members, n);
    for (float& x : sum) x /= static_cast<float>(members.size());
    return sum;
  };
  CHECK(test::all_close<float>("tensor-parallel all-reduces", a.download(), average(tp_members, 33)));
  CHECK(test::all_close<float>("data-parallel all-reduces", b.download(), average(dp_members, 17)));
  CHECK(test::all_close<float>("world all-reduces", c.download(), average(everyone, 9)));
}

TEST_CASE("Communicator split: keys order the group; a split of a split", "[nccl][split][communicator]") {
  Communicator reversed(world(), 0, ranks() - me(), "reversed");
  CHECK(reversed.world_size() == ranks());
  CHECK(reversed.rank() == ranks() - 1 - me());
  // Gathered in the group's order: the world's ranks backwards.
  const size_t n = 3;
  test::DeviceBuffer<float> send(inputs_of(me(), n)), recv(n * ranks());
  reversed.wait_for(cudaStreamLegacy);
  reversed.all_gather(send.ptr, recv.ptr, n);
  std::vector<int> backwards;
  for (int r = ranks() - 1; r >= 0; --r) backwards.push_back(r);
  CHECK(test::all_close<float>("all-gather in key order", recv.download(), concatenated(backwards, n)));
  // Pairs of the reversed group's ranks.
  const int G = group_size();
  Communicator pairs(reversed, reversed.rank() / G, reversed.rank(), "pair");
  CHECK(pairs.world_size() == G);
  CHECK(pairs.rank() == reversed.rank() % G);
  double want = 0.0;
  for (int r = 0; r < ranks(); ++r)
    if ((ranks() - 1 - r) / G == reversed.rank() / G) want += r;
  CHECK(pairs.sum(static_cast<double>(me())) == want);
}

TEST_CASE("Communicator split: bad arguments name the communicator", "[nccl][split][communicator]") {
  CHECK_THROWS_AS(Communicator(world(), -1, 0, "tensor-parallel"), CommArgumentError);
  Communicator tp(world(), me() / group_size(), me(), "tensor-parallel");
  test::DeviceBuffer<float> data(4);
  CHECK_THROWS_WITH(tp.broadcast(data.ptr, 4, group_size()),
                    Catch::Contains("on the tensor-parallel communicator: root " + std::to_string(group_size()) +
                                    " is not a rank of " + std::to_string(group_size())));
  tp.barrier();  // still usable, the ranks still in step
  world().barrier();
}

TEST_CASE("ParallelGroups: TP groups of consecutive ranks, DP groups of one TP rank each", "[nccl][split][groups]") {
  for (int tp = 1; tp <= ranks(); ++tp) {
    if (ranks() % tp != 0) continue;
    INFO("--tp " << tp << " over " << ranks() << " ranks");
    ParallelGroups groups(world(), tp);
    // Group k of TP holds world ranks [k·tp, (k+1)·tp); DP group t holds t, t + tp, t + 2·tp, ...;
    // each in world-rank order.
    std::vector<int> tp_members, dp_members;
    for (int r = 0; r < ranks(); ++r) {
      if (r / tp == me() / tp) tp_members.push_back(r);
      if (r % tp == me() % tp) dp_members.push_back(r);
    }
    CHECK(groups.tp_size() == tp);
    CHECK(groups.dp().world_size() == ranks() / tp);
    CHECK(groups.dp().rank() == me() / tp);
    CHECK(world_ranks_of(groups.dp()) == dp_members);
    if (tp == 1) {
      CHECK(groups.tp() == nullptr);
      CHECK(&groups.dp() == &world());
      continue;
    }
    REQUIRE(groups.tp() != nullptr);
    CHECK(groups.tp()->rank() == me() % tp);
    CHECK(world_ranks_of(*groups.tp()) == tp_members);
  }
  world().barrier();
}

TEST_CASE("ParallelGroups: the DP x PP x TP grid, TP innermost, then the stages, then the replicas",
          "[nccl][split][groups]") {
  for (int tp = 1; tp <= ranks(); ++tp) {
    for (int pp = 1; tp * pp <= ranks(); ++pp) {
      if (ranks() % (tp * pp) != 0) continue;
      INFO("--tp " << tp << " --pp " << pp << " over " << ranks() << " ranks");
      ParallelGroups groups(world(), tp, pp);
      // World rank r = (d·pp + s)·tp + t.
      auto t_of = [&](int r) { return r % tp; };
      auto s_of = [&](int r) { return r / tp % pp; };
      auto d_of = [&](int r) { return r / (tp * pp); };
      std::vector<int> tp_members, pp_members, dp_members;
      for (int r = 0; r < ranks(); ++r) {
        if (d_of(r) == d_of(me()) && s_of(r) == s_of(me())) tp_members.push_back(r);  // by t
        if (d_of(r) == d_of(me()) && t_of(r) == t_of(me())) pp_members.push_back(r);  // by s
        if (s_of(r) == s_of(me()) && t_of(r) == t_of(me())) dp_members.push_back(r);  // by d
      }
      CHECK(groups.tp_size() == tp);
      CHECK(groups.pp_size() == pp);
      CHECK(groups.pp_rank() == s_of(me()));
      CHECK(groups.dp().world_size() == ranks() / (tp * pp));
      CHECK(groups.dp().rank() == d_of(me()));
      CHECK(world_ranks_of(groups.dp()) == dp_members);
      if (tp > 1) {
        REQUIRE(groups.tp() != nullptr);
        CHECK(groups.tp()->rank() == t_of(me()));
        CHECK(world_ranks_of(*groups.tp()) == tp_members);
      } else {
        CHECK(groups.tp() == nullptr);
      }
      if (pp > 1) {
        REQUIRE(groups.pp() != nullptr);
        CHECK(groups.pp()->rank() == s_of(me()));
        CHECK(world_ranks_of(*groups.pp()) == pp_members);
      } else {
        CHECK(groups.pp() == nullptr);
      }
      if (tp * pp == 1) CHECK(&groups.dp() == &world());
      groups.set_purpose("the grid test's check", "after the split");
      world().barrier();
    }
  }
}

TEST_CASE("ParallelGroups with --cp: the CP ranks are the inner part of the replica index", "[nccl][split][groups][cp]") {
  for (int tp = 1; tp <= ranks(); ++tp)
    for (int pp = 1; tp * pp <= ranks(); ++pp)
      for (int cp = 2; tp * pp * cp <= ranks(); ++cp) {
        if (ranks() % (tp * pp * cp) != 0) continue;
        INFO("--tp " << tp << " --pp " << pp << " --cp " << cp << " over " << ranks() << " ranks");
        ParallelGroups groups(world(), tp, pp, cp);
        // World rank = ((d·cp + c)·pp + s)·tp + t.
        auto t_of = [&](int r) { return r % tp; };
        auto s_of = [&](int r) { return r / tp % pp; };
        auto c_of = [&](int r) { return r / (tp * pp) % cp; };
        auto d_of = [&](int r) { return r / (tp * pp * cp); };
        std::vector<int> cp_members, pp_members, dp_members;
        for (int r = 0; r < ranks(); ++r) {
          if (d_of(r) == d_of(me()) && s_of(r) == s_of(me()) && t_of(r) == t_of(me())) cp_members.push_back(r);  // by c
          if (d_of(r) == d_of(me()) && c_of(r) == c_of(me()) && t_of(r) == t_of(me())) pp_members.push_back(r);  // by s
          if (s_of(r) == s_of(me()) && t_of(r) == t_of(me())) dp_members.push_back(r);  // by (d, c)
        }
        REQUIRE(groups.cp() != nullptr);
        CHECK(groups.cp_size() == cp);
        CHECK(groups.cp()->rank() == c_of(me()));
        CHECK(world_ranks_of(*groups.cp()) == cp_members);
        // Gradients are summed over the CP ranks with the data-parallel ones; data is read per d.
        CHECK(world_ranks_of(groups.dp()) == dp_members);
        CHECK(groups.data_rank() == d_of(me()));
        CHECK(groups.data_ranks() == ranks() / (tp * pp * cp));
        if (pp > 1) CHECK(world_ranks_of(*groups.pp()) == pp_members);
        world().barrier();
      }
}
