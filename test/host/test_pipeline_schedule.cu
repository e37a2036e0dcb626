// Pipeline schedules as data (src/dist/pipeline_schedule.h, pipeline_check.h): for every kind, p in
// {1, 2, 3, 4, 8}, v in {1, 2, 3} (interleaved) and m from p to 3p+1, the tables pass the validator
// (matched transfers, no deadlock under blocking sends), every (micro-batch, chunk) is computed
// once on the rank holding the chunk (counted here, apart from the validator), the in-flight
// activations stay within bounds written here as plain formulas, and the unit-cost bubble is the
// closed form. The validator itself must catch broken tables: a missing send, sends out of order,
// a backward before its forward, work on the wrong rank, interleaved chunks out of model order,
// too many warm-up forwards, a deadlock only blocking sends reveal.
#include <catch2/catch.hpp>

#include "src/config/config.h"
#include "src/dist/pipeline_check.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

const PipelineKind kKinds[] = {PipelineKind::gpipe, PipelineKind::one_f_one_b, PipelineKind::interleaved,
                               PipelineKind::zb_h1};

std::vector<PipelineShape> every_shape() {
  std::vector<PipelineShape> shapes;
  for (PipelineKind kind : kKinds) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int v = 1; v <= (kind == PipelineKind::interleaved ? 3 : 1); ++v) {
        for (int m = p; m <= 3 * p + 1; ++m) shapes.push_back({p, m, v, kind});
      }
    }
  }
  return shapes;
}

std::string describe(const PipelineShape& s) {
  return std::string(pipeline_kind_name(s.kind)) + " p=" + std::to_string(s.stages) + " m=" +
         std::to_string(s.microbatches) + " v=" + std::to_string(s.virtual_stages);
}

// The tables, the validator's verdict and the unit-cost timeline, for failure messages.
std::string show(const PipelineShape& s, const std::vector<PipelineTable>& tables) {
  const PipelineCheck check = check_pipeline_schedule(s, tables);
  std::string text = describe(s) + "\n" + check.report();
  try {
    text += pipeline_timeline(s, time_pipeline_schedule(s, tables));
  } catch (const std::logic_error& e) {
    text += e.what();
  }
  return text;
}

// Rank r's most in-flight activations (a plain formula per kind).
int activation_bound(const PipelineShape& s, int r) {
  const int p = s.stages, m = s.microbatches, v = s.virtual_stages;
  switch (s.kind) {
    case PipelineKind::gpipe: return m;
    case PipelineKind::one_f_one_b:
    case PipelineKind::zb_h1: return p - r;
    case PipelineKind::interleaved: {
      if (v == 1) return p - r;
      const int first_group = p + (m % p + m / p - 1) / (m / p);  // p + ceil((m mod p) / (m div p))
      return std::min(2 * (p - r - 1) + (v - 1) * first_group + 1, m * v);
    }
  }
  return 0;
}

PipelineTable& erase_first(PipelineTable& table, PipelineOp op) {
  table.erase(std::find_if(table.begin(), table.end(), [op](const PipelineAction& a) { return a.op == op; }));
  return table;
}

}  // namespace

TEST_CASE("Every schedule is valid, deadlock-free and within its activation bound", "[pipeline_schedule]") {
  for (const PipelineShape& s : every_shape()) {
    const std::vector<PipelineTable> tables = build_pipeline_schedule(s);
    INFO(show(s, tables));
    const PipelineCheck check = check_pipeline_schedule(s, tables);
    REQUIRE(check.ok());
    // Each micro-batch's forward and backward (zb-h1: input and weight backward) run once per chunk,
    // on the rank that holds the chunk: rank r holds chunks r, r + p, ...
    const int chunks = s.stages * s.virtual_stages;
    std::vector<int> forwards(size_t(s.microbatches) * chunks, 0), backwards(forwards), weights(forwards);
    for (int r = 0; r < s.stages; ++r) {
      for (const PipelineAction& a : tables[r]) {
        if (!is_computation(a.op)) continue;
        CHECK(a.chunk % s.stages == r);
        const size_t at = size_t(a.microbatch) * chunks + a.chunk;
        if (a.op == PipelineOp::forward) ++forwards[at];
        if (a.op == PipelineOp::backward || a.op == PipelineOp::backward_input) ++backwards[at];
        if (a.op == PipelineOp::backward_weight) ++weights[at];
      }
    }
    const int weight_count = s.kind == PipelineKind::zb_h1 ? 1 : 0;
    for (size_t i = 0; i < forwards.size(); ++i) {
      CHECK(forwards[i] == 1);
      CHECK(backwards[i] == 1);
      CHECK(weights[i] == weight_count);
    }
    for (int r = 0; r < s.stages; ++r) {
      INFO("rank " << r);
      CHECK(check.peak_activations[r] <= activation_bound(s, r));
      if (s.kind == PipelineKind::zb_h1) CHECK(check.peak_held[r] <= s.stages);
    }
    // The known peaks: 1f1b's rank r holds exactly p - r; interleaved's rank 0, m a multiple of p,
    // p·v + p - 1 chunk activations (all m·v when there are fewer).
    if (s.kind == PipelineKind::one_f_one_b || s.kind == PipelineKind::zb_h1) {
      for (int r = 0; r < s.stages; ++r) CHECK(check.peak_activations[r] == s.stages - r);
    }
    if (s.kind == PipelineKind::interleaved && s.virtual_stages > 1 && s.microbatches % s.stages == 0) {
      CHECK(check.peak_activations[0] ==
            std::min(s.stages * s.virtual_stages + s.stages - 1, s.microbatches * s.virtual_stages));
    }
  }
}

TEST_CASE("The unit-cost bubble is each schedule's closed form", "[pipeline_schedule]") {
  for (const PipelineShape& s : every_shape()) {
    const std::vector<PipelineTable> tables = build_pipeline_schedule(s);
    INFO(show(s, tables));
    const PipelineTiming timing = time_pipeline_schedule(s, tables);
    const long p = s.stages, m = s.microbatches, v = s.virtual_stages;
    for (int r = 0; r < s.stages; ++r) CHECK(timing.busy[r] == 3 * m * v);
    switch (s.kind) {
      case PipelineKind::gpipe:
      case PipelineKind::one_f_one_b:
        CHECK(timing.makespan == 3 * (m + p - 1));
        CHECK(timing.bubble() == Approx(double(p - 1) / double(m + p - 1)).margin(1e-12));
        CHECK(timing.bubble_over_ideal() == Approx(double(p - 1) / double(m)).margin(1e-12));
        break;
      case PipelineKind::interleaved:
        CHECK(timing.makespan == 3 * (m * v + p - 1));
        CHECK(timing.bubble_over_ideal() == Approx(double(p - 1) / double(v * m)).margin(1e-12));
        break;
      case PipelineKind::zb_h1: {
        CHECK(timing.makespan == 3 * m + p - 1);
        CHECK(timing.bubble_over_ideal() == Approx(double(p - 1) / double(3 * m)).margin(1e-12));
        const PipelineShape one_f_one_b{s.stages, s.microbatches, 1, PipelineKind::one_f_one_b};
        const double theirs = time_pipeline_schedule(one_f_one_b, build_pipeline_schedule(one_f_one_b)).bubble();
        if (p > 1) CHECK(timing.bubble() < theirs);
        break;
      }
    }
  }
}

TEST_CASE("The validator catches broken tables", "[pipeline_schedule]") {
  const PipelineShape s{4, 6, 1, PipelineKind::one_f_one_b};
  const std::vector<PipelineTable> good = build_pipeline_schedule(s);
  REQUIRE(check_pipeline_schedule(s, good).ok());

  SECTION("a missing send") {
    std::vector<PipelineTable> t = good;
    erase_first(t[1], PipelineOp::send_activation);
    const PipelineCheck check = check_pipeline_schedule(s, t);
    REQUIRE_FALSE(check.ok());
    CHECK(check.errors[0] == "micro-batch 0 chunk 1: 0 activation sends (expected 1)");
  }
  SECTION("a missing receive") {
    std::vector<PipelineTable> t = good;
    erase_first(t[0], PipelineOp::recv_gradient);
    CHECK_FALSE(check_pipeline_schedule(s, t).ok());
  }
  SECTION("two sends to the same rank swapped") {
    std::vector<PipelineTable> t = good;
    std::vector<size_t> sends;
    for (size_t i = 0; i < t[0].size(); ++i) {
      if (t[0][i].op == PipelineOp::send_activation) sends.push_back(i);
    }
    std::swap(t[0][sends[1]], t[0][sends[2]]);
    const PipelineCheck check = check_pipeline_schedule(s, t);
    REQUIRE_FALSE(check.ok());
    CHECK(check.report().find("sends to rank 1 in another order than it receives") != std::string::npos);
  }
  SECTION("a backward before its forward") {
    std::vector<PipelineTable> t = good;
    auto forward = std::find_if(t[3].begin(), t[3].end(), [](const PipelineAction& a) { return a.op == PipelineOp::forward; });
    auto backward = std::find_if(t[3].begin(), t[3].end(), [](const PipelineAction& a) { return a.op == PipelineOp::backward; });
    std::iter_swap(forward, backward);
    CHECK_FALSE(check_pipeline_schedule(s, t).ok());
  }
  SECTION("a forward on the wrong rank") {
    std::vector<PipelineTable> t = good;
    const PipelineAction forward = *std::find_if(t[2].begin(), t[2].end(), [](const PipelineAction& a) {
      return a.op == PipelineOp::forward;
    });
    t[1].insert(t[1].begin(), forward);
    CHECK_FALSE(check_pipeline_schedule(s, t).ok());
  }
  SECTION("a forward run twice") {
    std::vector<PipelineTable> t = good;
    t[3].push_back({PipelineOp::forward, 5, 3, -1});
    CHECK_FALSE(check_pipeline_schedule(s, t).ok());
  }
  SECTION("interleaved chunks forwarded out of model order") {
    // Rank 0 runs micro-batch 0's second chunk (2) where its first (0) belongs.
    const PipelineShape il{2, 4, 2, PipelineKind::interleaved};
    std::vector<PipelineTable> t = build_pipeline_schedule(il);
    REQUIRE(check_pipeline_schedule(il, t).ok());
    auto forward = [&t](int chunk) {
      return std::find(t[0].begin(), t[0].end(), PipelineAction{PipelineOp::forward, 0, chunk, -1});
    };
    std::iter_swap(forward(0), forward(2));
    const PipelineCheck check = check_pipeline_schedule(il, t);
    REQUIRE_FALSE(check.ok());
    CHECK(check.report() ==
          "micro-batch 0 chunk 0: activation sent before the forward\n"
          "micro-batch 0 chunk 1: next chunk's forward before the activation arrives\n");
  }
  SECTION("more warm-up forwards than 1f1b allows") {
    // gpipe's tables are valid and deadlock-free, but rank 0 holds all m activations.
    const PipelineCheck check = check_pipeline_schedule(s, build_pipeline_schedule({4, 6, 1, PipelineKind::gpipe}));
    REQUIRE_FALSE(check.ok());
    CHECK(check.errors[0] == "rank 0 holds 6 activations (bound 4)");
  }
}

TEST_CASE("The validator finds a deadlock only blocking sends reveal", "[pipeline_schedule]") {
  // gpipe, p = 2, m = 2: rank 0 sends both activations before it receives a gradient, and rank 1
  // sends micro-batch 0's gradient before it receives micro-batch 1's activation. Every transfer
  // is matched and in order, and buffered sends would finish; blocking ones wait on each other.
  using Op = PipelineOp;
  const PipelineShape s{2, 2, 1, PipelineKind::gpipe};
  const std::vector<PipelineTable> tables = {
      {{Op::forward, 0, 0}, {Op::forward, 1, 0}, {Op::send_activation, 0, 0, 1}, {Op::send_activation, 1, 0, 1},
       {Op::recv_gradient, 0, 1, 1}, {Op::backward, 0, 0}, {Op::recv_gradient, 1, 1, 1}, {Op::backward, 1, 0}},
      {{Op::recv_activation, 0, 0, 0}, {Op::forward, 0, 1}, {Op::backward, 0, 1}, {Op::send_gradient, 0, 1, 0},
       {Op::recv_activation, 1, 0, 0}, {Op::forward, 1, 1}, {Op::backward, 1, 1}, {Op::send_gradient, 1, 1, 0}},
  };
  const PipelineCheck check = check_pipeline_schedule(s, tables);
  REQUIRE_FALSE(check.ok());
  CHECK(check.report() == "deadlock: rank 0 at sA1>1 rank 1 at sG0>0\n");
  // The same tables time out fine with sends that do not wait.
  CHECK(time_pipeline_schedule(s, tables).makespan == 10);
}

TEST_CASE("1f1b at p = 4, m = 8 as a timeline (docs/DISTRIBUTED.md)", "[pipeline_schedule]") {
  const PipelineShape s{4, 8, 1, PipelineKind::one_f_one_b};
  const PipelineTiming timing = time_pipeline_schedule(s, build_pipeline_schedule(s));
  CHECK(pipeline_timeline(s, timing) ==
        "r0 | F0 F1 F2 F3 .  .  .  .  .  .  B0 ~  F4 B1 ~  F5 B2 ~  F6 B3 ~  F7 B4 ~  .  B5 ~  .  B6 ~  .  B7 ~\n"
        "r1 | .  F0 F1 F2 .  .  .  .  B0 ~  F3 B1 ~  F4 B2 ~  F5 B3 ~  F6 B4 ~  F7 B5 ~  .  B6 ~  .  B7 ~  .  .\n"
        "r2 | .  .  F0 F1 .  .  B0 ~  F2 B1 ~  F3 B2 ~  F4 B3 ~  F5 B4 ~  F6 B5 ~  F7 B6 ~  .  B7 ~  .  .  .  .\n"
        "r3 | .  .  .  F0 B0 ~  F1 B1 ~  F2 B2 ~  F3 B3 ~  F4 B4 ~  F5 B5 ~  F6 B6 ~  F7 B7 ~  .  .  .  .  .  .\n");
  const nlohmann::json json = nlohmann::json::parse(pipeline_timeline_json(s, timing));
  CHECK(json["makespan"] == 33);
  CHECK(json["ranks"].size() == 4);
  CHECK(json["ranks"][3][1] == nlohmann::json::parse(R"({"op": "B", "microbatch": 0, "chunk": 3, "start": 4, "cost": 2})"));
}

TEST_CASE("Shapes no schedule exists for are refused in one line naming the flag", "[pipeline_schedule]") {
  auto message = [](const PipelineShape& s) {
    try {
      build_pipeline_schedule(s);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message({4, 3, 1, PipelineKind::one_f_one_b}) ==
        "--pp 4: 3 micro-batches per optimizer step (m: --total-batch-tokens / (--batch-size x --seq-len x "
        "data-parallel ranks)); every schedule needs m >= --pp");
  CHECK(message({2, 4, 2, PipelineKind::zb_h1}) ==
        "--pp-virtual: 2 chunks per rank need --pp-schedule interleaved (not zb-h1)");
  CHECK(message({0, 4, 1, PipelineKind::gpipe}).rfind("--pp: ", 0) == 0);
  CHECK(message({2, 4, 0, PipelineKind::interleaved}).rfind("--pp-virtual: ", 0) == 0);
  CHECK_THROWS_WITH(parse_pipeline_kind("zb"), "--pp-schedule: 'zb' is not one of gpipe, 1f1b, interleaved, zb-h1");
  for (PipelineKind kind : kKinds) CHECK(parse_pipeline_kind(pipeline_kind_name(kind)) == kind);
  // The flag table's --pp-schedule choices are exactly these kinds, in this order.
  std::vector<std::string> names;
  for (PipelineKind kind : kKinds) names.push_back(pipeline_kind_name(kind));
  CHECK(find_flag("pp-schedule")->choices == names);
}
