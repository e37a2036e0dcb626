// bench_attention.cu — times causal attention forward, backward and both on a GPU for the flash
// kernels (kernels/flash_attention.cuh), the simple kernels (kernels/attention.cuh) and, when
// python3 has torch with CUDA, PyTorch's scaled_dot_product_attention (dev/bench_attention_sdpa.py),
// all on the same bf16 inputs, and checks that the three agree. Grouped-query shapes (NKV < NH)
// run flash and simple only, and each is set beside the multi-head shape of the same B, NH, T and
// HD when that is in the list too (flash TFLOP/s, GQA over MHA). GPU build only: make bench.
//
// usage: build/bench_attention [--shape B,NH,T,HD[,NKV]]... [--iters N] [--warmup N] [--python PATH] [--no-torch]
#include "kernels/attention.cuh"
#include "kernels/flash_attention.cuh"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

struct Shape {
  int B, NH, T, HD;
  int NKV = 0;  // K/V heads (grouped-query attention); 0: NH
  int kv_heads() const { return NKV ? NKV : NH; }
};

struct Options {
  std::vector<Shape> shapes;
  int iters = 20, warmup = 3;
  std::string python = "python3", sdpa_script;
  bool torch = true;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_attention: %s\nusage: bench_attention [--shape B,NH,T,HD[,NKV]]... [--iters N (>= 20)] "
               "[--warmup N] [--python PATH] [--no-torch]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  std::string self = argv[0];
  o.sdpa_script = (self.find('/') == std::string::npos ? std::string(".") : self.substr(0, self.rfind('/'))) +
                  "/../dev/bench_attention_sdpa.py";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--shape") {
      Shape s;
      std::string v = value();
      const int fields = std::sscanf(v.c_str(), "%d,%d,%d,%d,%d", &s.B, &s.NH, &s.T, &s.HD, &s.NKV);
      if ((fields != 4 && fields != 5) || s.B < 1 || s.NH < 1 || s.T < 1 || !flash_attention_supports(s.HD) ||
          (fields == 5 && (s.NKV < 1 || s.NH % s.NKV != 0))) {
        usage(("--shape wants B,NH,T,HD[,NKV] with HD 64 or 128 and NKV dividing NH; got " + v).c_str());
      }
      o.shapes.push_back(s);
    } else if (a == "--iters") {
      o.iters = std::atoi(value().c_str());
      if (o.iters < 20) usage("--iters must be at least 20");
    } else if (a == "--warmup") {
      o.warmup = std::max(0, std::atoi(value().c_str()));
    } else if (a == "--python") {
      o.python = value();
    } else if (a == "--no-torch") {
      o.torch = false;
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  // GPT-2's and larger models' heads; Llama 3.1 8B's (32 query heads on 8 K/V heads) beside the
  // multi-head attention of the same query heads.
  if (o.shapes.empty()) {
    o.shapes = {{8, 12, 1024, 64}, {4, 16, 2048, 64}, {2, 16, 4096, 128}, {64, 12, 1024, 64},
                {2, 32, 2048, 128}, {2, 32, 2048, 128, 8}};
  }
  return o;
}

// Median of `iters` event-timed runs after `warmup` untimed ones.
template <typename Run>
float median_ms(const Run& run, int iters, int warmup) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) run();
  std::vector<float> ms(iters);
  for (float& m : ms) {
    CUDA_CHECK(cudaEventRecord(start));
    run();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&m, start, stop));
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return iters % 2 ? ms[iters / 2] : 0.5f * (ms[iters / 2 - 1] + ms[iters / 2]);
}

struct Timings {
  float forward = NAN, backward = NAN, both = NAN;
};

std::vector<float> to_floats(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = __bfloat162float(v[i]);
  return r;
}

template <typename T>
std::vector<T> download(const T* device, size_t n) {
  std::vector<T> host(n);
  CUDA_CHECK(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Worst |got − want| / (2^-7·(|want| + max|want|)) over each column block of the rows (block p
// is widths[p] wide, the blocks make up a row): bf16 keeps 8 significant bits (rounding error up
// to 2^-8), both sides round, and errors of P or dS rounded to bf16 are bounded by the magnitudes
// of the sums, which max|want| stands in for. At most 1 means agreement; NaN anywhere gives infinity.
std::vector<double> worst_ratio(const std::vector<float>& got, const std::vector<float>& want,
                                const std::vector<int>& widths) {
  const size_t parts = widths.size();
  std::vector<int> part_of_column;
  for (size_t p = 0; p < parts; ++p) part_of_column.insert(part_of_column.end(), widths[p], static_cast<int>(p));
  std::vector<double> max_want(parts, 0.0), worst(parts, 0.0);
  for (size_t i = 0; i < want.size(); ++i) {
    const int p = part_of_column[i % part_of_column.size()];
    max_want[p] = std::max(max_want[p], static_cast<double>(std::fabs(want[i])));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const int p = part_of_column[i % part_of_column.size()];
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = err / (0x1p-7 * (std::fabs(want[i]) + max_want[p]));
    worst[p] = std::isnan(ratio) ? INFINITY : std::max(worst[p], ratio);
  }
  return worst;
}

// Runs dev/bench_attention_sdpa.py on the inputs; false (and torch switched off) when it
// reports that torch or CUDA is missing.
bool run_pytorch(Options& o, const Shape& s, const std::vector<bf16>& qkv, const std::vector<bf16>& dout,
                 Timings& t, std::vector<float>& out, std::vector<float>& dqkv) {
  char dir[] = "/tmp/bench_attention.XXXXXX";
  if (!mkdtemp(dir)) {
    std::perror("bench_attention: mkdtemp");
    std::exit(1);
  }
  const std::string in_path = std::string(dir) + "/in.bin", out_path = std::string(dir) + "/out.bin";
  FILE* f = std::fopen(in_path.c_str(), "wb");
  const int header[6] = {s.B, s.NH, s.T, s.HD, o.iters, o.warmup};
  bool ok = f && std::fwrite(header, sizeof header, 1, f) == 1 &&
            std::fwrite(qkv.data(), sizeof(bf16), qkv.size(), f) == qkv.size() &&
            std::fwrite(dout.data(), sizeof(bf16), dout.size(), f) == dout.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::fprintf(stderr, "bench_attention: cannot write %s\n", in_path.c_str());
    std::exit(1);
  }
  const std::string command = "'" + o.python + "' '" + o.sdpa_script + "' '" + in_path + "' '" + out_path + "'";
  std::fflush(stdout);  // the script's messages come after ours
  const int status = std::system(command.c_str());
  bool have = false;
  if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    const size_t n_out = out.size(), n_dqkv = dqkv.size();
    std::vector<bf16> out_bits(n_out), dqkv_bits(n_dqkv);
    float ms[3];
    f = std::fopen(out_path.c_str(), "rb");
    have = f && std::fread(ms, sizeof ms, 1, f) == 1 && std::fread(out_bits.data(), sizeof(bf16), n_out, f) == n_out &&
           std::fread(dqkv_bits.data(), sizeof(bf16), n_dqkv, f) == n_dqkv;
    if (f) std::fclose(f);
    if (have) {
      t = {ms[0], ms[1], ms[2]};
      out = to_floats(out_bits);
      dqkv = to_floats(dqkv_bits);
    } else {
      std::fprintf(stderr, "bench_attention: %s wrote no complete result\n", o.sdpa_script.c_str());
    }
  } else if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    std::printf("pytorch: not available (above); comparing flash and simple only\n");
    o.torch = false;
  } else {
    std::fprintf(stderr, "bench_attention: %s failed (status %d)\n", command.c_str(), status);
  }
  std::remove(in_path.c_str());
  std::remove(out_path.c_str());
  rmdir(dir);
  return have;
}

// Times one shape into `flash` (the flash kernels' times); false if the implementations disagree.
bool bench(Options& o, const Shape& s, Timings& flash) {
  const int B = s.B, NH = s.NH, NKV = s.kv_heads(), T = s.T, C = NH * s.HD, KV = NKV * s.HD;
  const size_t qkv_n = static_cast<size_t>(B) * T * (C + 2 * KV), out_n = static_cast<size_t>(B) * T * C;
  const size_t lse_n = static_cast<size_t>(B) * NH * T;
  std::mt19937_64 rng(1234 + T);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<bf16> qkv_host(qkv_n), dout_host(out_n);
  for (bf16& x : qkv_host) x = __float2bfloat16(normal(rng));
  for (bf16& x : dout_host) x = __float2bfloat16(normal(rng));

  bf16 *qkv, *dout, *out[2], *dqkv[2];
  float *lse[2], *scratch;
  CUDA_CHECK(cudaMalloc(&qkv, qkv_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&dout, out_n * sizeof(bf16)));
  for (int i = 0; i < 2; ++i) {
    CUDA_CHECK(cudaMalloc(&out[i], out_n * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&dqkv[i], qkv_n * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&lse[i], lse_n * sizeof(float)));
  }
  CUDA_CHECK(cudaMalloc(&scratch, std::max(flash_attention_backward_scratch_bytes(B, T, NH),
                                           attention_backward_scratch_bytes(B, T, NH))));
  CUDA_CHECK(cudaMemcpy(qkv, qkv_host.data(), qkv_n * sizeof(bf16), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dout, dout_host.data(), out_n * sizeof(bf16), cudaMemcpyHostToDevice));

  // [0] flash, [1] simple; each backward consumes its own forward's out and lse.
  auto forward = [&](int k) {
    if (k == 0) flash_attention_forward(out[0], lse[0], qkv, B, T, C, NH, NKV, nullptr);
    else attention_forward<bf16>(out[1], lse[1], qkv, B, T, C, NH, NKV, nullptr);
  };
  auto backward = [&](int k) {
    if (k == 0) flash_attention_backward(dqkv[0], scratch, dout, qkv, out[0], lse[0], B, T, C, NH, NKV, nullptr);
    else attention_backward<bf16>(dqkv[1], scratch, dout, qkv, out[1], lse[1], B, T, C, NH, NKV, nullptr);
  };
  Timings t[3];
  for (int k = 0; k < 2; ++k) {
    t[k].forward = median_ms([&] { forward(k); }, o.iters, o.warmup);
    t[k].backward = median_ms([&] { backward(k); }, o.iters, o.warmup);
    t[k].both = median_ms([&] { forward(k); backward(k); }, o.iters, o.warmup);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> outs[3], dqkvs[3], lses[2];
  for (int k = 0; k < 2; ++k) {
    outs[k] = to_floats(download(out[k], out_n));
    dqkvs[k] = to_floats(download(dqkv[k], qkv_n));
    lses[k] = download(lse[k], lse_n);
  }
  outs[2].resize(out_n);
  dqkvs[2].resize(qkv_n);
  // dev/bench_attention_sdpa.py reads the multi-head layout only.
  const bool have_torch = o.torch && NKV == NH && run_pytorch(o, s, qkv_host, dout_host, t[2], outs[2], dqkvs[2]);
  flash = t[0];

  const double forward_flop = 2.0 * B * NH * static_cast<double>(T) * T * s.HD;  // 2 products, causal half
  const double backward_flop = 2.5 * forward_flop;
  std::printf("\nB=%d NH=%d NKV=%d T=%d HD=%d: forward %.1f GFLOP, backward %.1f GFLOP (causal)\n", B, NH, NKV, T,
              s.HD, forward_flop * 1e-9, backward_flop * 1e-9);
  std::printf("  %-8s %9s %8s %9s %8s %9s %8s   %s\n", "", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "both ms",
              "TFLOP/s", "worst error / bf16 tolerance vs flash (<= 1 agrees)");
  const char* names[3] = {"flash", "simple", "pytorch"};
  bool agree = true;
  for (int k = 0; k < (have_torch ? 3 : 2); ++k) {
    std::printf("  %-8s %9.3f %8.1f %9.3f %8.1f %9.3f %8.1f  ", names[k], t[k].forward,
                forward_flop / t[k].forward * 1e-9, t[k].backward, backward_flop / t[k].backward * 1e-9, t[k].both,
                (forward_flop + backward_flop) / t[k].both * 1e-9);
    if (k == 0) {
      std::printf(" (reference)\n");
      continue;
    }
    const double out_ratio = worst_ratio(outs[k], outs[0], {C})[0];
    const std::vector<double> grad = worst_ratio(dqkvs[k], dqkvs[0], {C, KV, KV});
    std::printf(" out %.2f  dq %.2f  dk %.2f  dv %.2f", out_ratio, grad[0], grad[1], grad[2]);
    agree = agree && out_ratio <= 1 && grad[0] <= 1 && grad[1] <= 1 && grad[2] <= 1;
    if (k == 1) {  // lse: fp32 statistics on both sides
      double lse_err = 0.0;
      for (size_t i = 0; i < lse_n; ++i) {
        const double e = std::fabs(static_cast<double>(lses[1][i]) - lses[0][i]) / (1.0 + std::fabs(lses[0][i]));
        lse_err = std::isnan(e) ? INFINITY : std::max(lse_err, e);
      }
      std::printf("  lse %.1e (<= 1e-4)", lse_err);
      agree = agree && lse_err <= 1e-4;
    }
    std::printf("\n");
  }
  if (!agree) std::printf("  FAIL: the implementations disagree beyond bf16 tolerance\n");

  for (int i = 0; i < 2; ++i) {
    CUDA_CHECK(cudaFree(out[i]));
    CUDA_CHECK(cudaFree(dqkv[i]));
    CUDA_CHECK(cudaFree(lse[i]));
  }
  CUDA_CHECK(cudaFree(qkv));
  CUDA_CHECK(cudaFree(dout));
  CUDA_CHECK(cudaFree(scratch));
  return agree;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("bench_attention: no CUDA device (%s); it times kernels on a GPU\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    return 1;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs); median of %d runs after %d warm-up\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, o.iters, o.warmup);
  bool agree = true;
  std::vector<Timings> flash(o.shapes.size());
  for (size_t i = 0; i < o.shapes.size(); ++i) agree = bench(o, o.shapes[i], flash[i]) && agree;
  // Grouped-query beside multi-head attention of the same query heads: same FLOPs, so the ratio of
  // times is the ratio of TFLOP/s (issue 32 asks GQA for at least 95% of MHA's).
  for (size_t g = 0; g < o.shapes.size(); ++g) {
    const Shape& q = o.shapes[g];
    if (q.kv_heads() == q.NH) continue;
    for (size_t m = 0; m < o.shapes.size(); ++m) {
      const Shape& h = o.shapes[m];
      if (h.kv_heads() != h.NH || h.B != q.B || h.NH != q.NH || h.T != q.T || h.HD != q.HD) continue;
      std::printf("\nflash GQA (NKV=%d) / MHA TFLOP/s at B=%d NH=%d T=%d HD=%d: forward %.1f%%, backward %.1f%%, "
                  "both %.1f%%\n", q.kv_heads(), q.B, q.NH, q.T, q.HD, 100.0 * flash[m].forward / flash[g].forward,
                  100.0 * flash[m].backward / flash[g].backward, 100.0 * flash[m].both / flash[g].both);
      break;
    }
  }
  return agree ? 0 : 1;
}
