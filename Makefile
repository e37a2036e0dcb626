# train_gpt — one source tree, two builds:
#   make            ./train_gpt      nvcc, sm_80 + sm_90a (+ compute_90 PTX), cuBLASLt, NCCL, MPI
#   make cpu        ./train_gpt_cpu  g++ over simt/ (CUDA semantics on CPU fibers)
#   make test       CPU test suite in both thread orders + GPU build compile check
#   make test-gpu   the same suite built with nvcc, run on a GPU
#   make run        train: GPU binary when a GPU is present, else the CPU build on a small model
#   make ptx-report ptxas registers / spills / shared memory per kernel → build/ptx-report.txt (.tsv: the
#                   table make test's CPU build checks launches against, docs/SIMT.md)
#   make gpu-deps   on a networked Debian machine: the OpenMPI, Catch2, nlohmann-json, PCRE2 .debs and
#                   the GPT-2 vocabulary a bare GPU machine needs → build/gpu-deps/ (scripts/gpu_deps.sh)
#   make gpu-acceptance  on a GPU machine: build, test-gpu, sanitizers, PyTorch parity, determinism,
#                   ceilings, throughput → build/acceptance/summary.md (scripts/gpu_acceptance.sh)
#   make gpu-pack   here (the CUDA toolkit, no GPU): gpu-pack/, everything a GPU node needs to run
#                   scripts/gpu_quick.sh, the short-job proof (scripts/gpu_pack.sh; docs/GPU.md)
#   make gpu-quick  on a GPU node, from gpu-pack/: scripts/gpu_quick.sh $(QUICK_SECONDS) (420) →
#                   gpu-quick/summary.md
#   make bench      build/bench_attention (nvcc): attention timings, flash vs simple vs PyTorch, run on a GPU

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CXX       ?= g++
PYTHON    ?= /usr/bin/python3
BUILD     := build

MPI_COMPILE := $(shell mpicxx --showme:compile 2>/dev/null)
MPI_LINK    := $(shell mpicxx --showme:link 2>/dev/null)

# ---- CPU build (g++ over simt/)
CPU_FLAGS := -std=c++17 -O2 -g -DSIMT -fno-strict-aliasing -Wall -Wextra -Werror -pthread \
             -I. -isystem $(CUDA_HOME)/include $(MPI_COMPILE) -MMD -MP
CPU_LIBS  := -rdynamic -lboost_context -lopenblas -ldl -pthread $(MPI_LINK)

# ---- GPU build (nvcc)
# Machine code for A100 (sm_80) and H100/H200 (sm_90a), plus compute_90 PTX that the driver
# compiles at load time on GPUs newer than both (sm_90a code runs on sm_90 chips only).
GPU_ARCH  := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
             -gencode arch=compute_90,code=compute_90
# Device code compressed for size (a driver of CUDA 13's 580 series or later decompresses it at load):
# half the bytes, so that the binaries and tests a GPU node needs travel in make gpu-pack's 48 MiB.
GPU_FLAGS := -std=c++17 -O3 -lineinfo $(GPU_ARCH) -compress-mode=size -Werror all-warnings -Xcompiler -Wall,-Wextra \
             -I. $(MPI_COMPILE) -MMD -MP
GPU_LIBS  := -lcublasLt -lnccl $(MPI_LINK)

# Host-only code (src/*/*.cpp: no CUDA, no element-type templates), compiled once by the host
# compiler into one archive that both trainers, the tests and tokenize link: touching one of these
# files recompiles it alone. The tokenizer (src/tokenizer/) needs pcre2.
HOST_SRCS  := $(wildcard src/*/*.cpp)
HOST_OBJS  := $(HOST_SRCS:%.cpp=$(BUILD)/host/%.o)
HOST_LIB   := $(BUILD)/host/libtrain_gpt_host.a
HOST_FLAGS := -std=c++17 -O2 -g -Wall -Wextra -Werror -pthread -I. -isystem $(CUDA_HOME)/include $(MPI_COMPILE) -MMD -MP
HOST_LIBS  := -lpcre2-8

SIMT_SRCS  := $(wildcard simt/*.cpp)
SIMT_OBJS  := $(SIMT_SRCS:%.cpp=$(BUILD)/cpu/%.o)
# Tests by kind: test/kernels, test/host, test/model (Catch2, .cu: both builds), test/simt (the
# CPU build's stand-ins, .cpp), test/mpi (multi-rank, run under mpirun by
# test/checks/distributed_nccl.sh, not by the single-process runner); test/checks (end to end) and
# test/lint (the tree's shape) are scripts run by test/run_tests.sh.
KERNEL_TESTS := $(wildcard test/kernels/test_*.cu test/host/test_*.cu test/model/test_*.cu)
SIMT_TESTS   := $(wildcard test/simt/simt_*.cpp)
CPU_TEST_BINS := $(KERNEL_TESTS:test/%.cu=$(BUILD)/cpu/test/%) $(SIMT_TESTS:test/%.cpp=$(BUILD)/cpu/test/%)
GPU_TEST_BINS := $(KERNEL_TESTS:test/%.cu=$(BUILD)/gpu/test/%)
MPI_TESTS         := $(wildcard test/mpi/mpi_*.cu)
CPU_MPI_TEST_BINS := $(MPI_TESTS:test/%.cu=$(BUILD)/cpu/test/%)
GPU_MPI_TEST_BINS := $(MPI_TESTS:test/%.cu=$(BUILD)/gpu/test/%)
# What a check script may need: the binaries, the tests it runs and the PyTorch reference.
CHECK_DEPS = train_gpt_cpu tokenize $(CPU_MPI_TEST_BINS) $(REFERENCES)

.PHONY: all gpu cpu test test-one check test-gpu gpu-check ptx-report bench run clean check-nvcc gpu-deps gpu-acceptance \
        gpu-pack gpu-quick
.DEFAULT_GOAL := all

all: gpu
gpu: check-nvcc train_gpt tokenize
cpu: train_gpt_cpu tokenize

check-nvcc:
	@command -v $(NVCC) >/dev/null 2>&1 || { echo "nvcc not found at $(NVCC): install the CUDA toolkit and set CUDA_HOME (or run 'make cpu' for the CPU build)"; exit 1; }

# ---- binaries
train_gpt: $(BUILD)/gpu/train_gpt.o $(HOST_LIB)
	$(NVCC) $(GPU_ARCH) -o $@ $^ $(GPU_LIBS) $(HOST_LIBS)

train_gpt_cpu: $(BUILD)/cpu/train_gpt.o $(SIMT_OBJS) $(HOST_LIB)
	$(CXX) -o $@ $^ $(CPU_LIBS) $(HOST_LIBS)

$(HOST_LIB): $(HOST_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/host/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(HOST_FLAGS) -c $< -o $@

# ---- objects: .cu sources are C++ to g++ (-x c++), CUDA to nvcc
$(BUILD)/cpu/%.o: %.cu
	@mkdir -p $(@D)
	$(CXX) $(CPU_FLAGS) -x c++ -c $< -o $@

$(BUILD)/cpu/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(CPU_FLAGS) -c $< -o $@

# ptxas reports each kernel's registers, spills and shared memory into NAME.o.ptxas
# (read by make ptx-report); compiler warnings are errors and are shown.
$(BUILD)/gpu/%.o: %.cu
	@mkdir -p $(@D)
	@echo "nvcc $<"
	@$(NVCC) $(GPU_FLAGS) -Xptxas -v -c $< -o $@ 2> $@.ptxas || { grep -v '^ptxas info\|^    [0-9]* bytes stack' $@.ptxas; exit 1; }
	@grep -v '^ptxas info\|^    [0-9]* bytes stack' $@.ptxas || true

# ---- tests
$(BUILD)/cpu/test/%: $(BUILD)/cpu/test/%.o $(BUILD)/host/test/catch_main.o $(SIMT_OBJS) $(HOST_LIB)
	$(CXX) -o $@ $^ $(CPU_LIBS) $(HOST_LIBS)

$(BUILD)/gpu/test/%: $(BUILD)/gpu/test/%.o $(BUILD)/host/test/catch_main.o $(HOST_LIB)
	$(NVCC) $(GPU_ARCH) -o $@ $^ $(GPU_LIBS) $(HOST_LIBS)

.PRECIOUS: $(BUILD)/cpu/%.o $(BUILD)/gpu/%.o

# PyTorch reference outputs the model tests compare against (generated, never committed).
REFERENCE_DIR := $(BUILD)/reference
# Llama 3 (dev/llama_reference.py, test/model/test_llama.cu): GQA NH=4 NKV=2, T=37; untied with
# 3.1's RoPE scaling, tied with 3.2's. Mixtral-style experts (dev/mixtral_reference.py): the same
# Llama with E=4 experts, top-2, with and without the aux loss, and with the sigmoid router; seed 23 keeps every step's routing
# at least 4e-3 (logits) from a tie.
REFERENCES    := $(REFERENCE_DIR)/tiny/reference.bin $(REFERENCE_DIR)/llama-untied31/reference.bin \
                 $(REFERENCE_DIR)/llama-tied32/reference.bin $(REFERENCE_DIR)/mixtral/reference.bin \
                 $(REFERENCE_DIR)/mixtral-noaux/reference.bin $(REFERENCE_DIR)/mixtral-sigmoid/reference.bin
$(REFERENCE_DIR)/tiny/reference.bin: dev/gpt2_reference.py dev/reference_common.py
	$(PYTHON) dev/gpt2_reference.py --out $(@D) > /dev/null
$(REFERENCE_DIR)/llama-untied31/reference.bin: dev/llama_reference.py dev/reference_common.py
	$(PYTHON) dev/llama_reference.py --out $(@D) --no-tied --rope 3.1 > /dev/null
$(REFERENCE_DIR)/llama-tied32/reference.bin: dev/llama_reference.py dev/reference_common.py
	$(PYTHON) dev/llama_reference.py --out $(@D) --tied --rope 3.2 > /dev/null
MIXTRAL_REFERENCE := dev/mixtral_reference.py --experts 4 --top-k 2 --no-tied --rope 3.1 --seed 23
$(REFERENCE_DIR)/mixtral/reference.bin: dev/mixtral_reference.py dev/llama_reference.py dev/reference_common.py
	$(PYTHON) $(MIXTRAL_REFERENCE) --out $(@D) --aux-loss-coef 0.02 > /dev/null
$(REFERENCE_DIR)/mixtral-noaux/reference.bin: dev/mixtral_reference.py dev/llama_reference.py dev/reference_common.py
	$(PYTHON) $(MIXTRAL_REFERENCE) --out $(@D) --aux-loss-coef 0 > /dev/null
# DeepSeek-V3's sigmoid router with the balancing bias, E=8 (a multiple of 8, as the sigmoid router
# needs); seed 25 keeps every step's choice at least 2.9e-4 (score + bias) from a tie.
$(REFERENCE_DIR)/mixtral-sigmoid/reference.bin: dev/mixtral_reference.py dev/llama_reference.py dev/reference_common.py
	$(PYTHON) dev/mixtral_reference.py --experts 8 --top-k 2 --no-tied --rope 3.1 --seed 25 --router sigmoid \
	  --bias-rate 0.01 --aux-loss-coef 0 --out $(@D) > /dev/null

test: $(CPU_TEST_BINS) $(CHECK_DEPS)
	@bash test/run_tests.sh cpu $(CPU_TEST_BINS)

# One test binary, both thread orders: make test-one T=test_gelu (or T=simt_nccl).
test-one:
	@test -n "$(T)" || { echo "usage: make test-one T=NAME (a file under test/kernels, host, model or simt)"; exit 2; }
	@bin="$(filter %/$(T),$(CPU_TEST_BINS))"; test -n "$$bin" || { echo "no test named $(T): $(notdir $(CPU_TEST_BINS))"; exit 2; }; \
	  $(MAKE) --no-print-directory $$bin $(REFERENCES) && bash test/run_tests.sh --only cpu $$bin

# One check script: make check C=cli_train (test/checks or test/lint).
check:
	@test -n "$(C)" || { echo "usage: make check C=NAME (a script under test/checks or test/lint)"; exit 2; }
	@script=$$(ls test/checks/$(C).sh test/lint/$(C).sh 2>/dev/null | head -n 1); \
	  test -n "$$script" || { echo "no check named $(C) in test/checks or test/lint"; exit 2; }; \
	  $(MAKE) --no-print-directory $(CHECK_DEPS) >/dev/null && bash "$$script" cpu

test-gpu: check-nvcc $(GPU_TEST_BINS) $(GPU_MPI_TEST_BINS) train_gpt tokenize $(REFERENCES)
	@bash test/run_tests.sh gpu $(GPU_TEST_BINS)

# Compiles (never runs) the GPU build so it cannot rot on machines without a GPU.
gpu-check: check-nvcc train_gpt $(GPU_TEST_BINS:$(BUILD)/gpu/test/%=$(BUILD)/gpu/test/%.o) \
           $(GPU_MPI_TEST_BINS:$(BUILD)/gpu/test/%=$(BUILD)/gpu/test/%.o)

ptx-report: gpu-check
	@bash scripts/ptx_report.sh $(BUILD)/ptx-report.txt \
	  $(BUILD)/gpu/train_gpt.o.ptxas $(GPU_TEST_BINS:%=%.o.ptxas)

# Kernel benchmarks: built here, run on a GPU machine (dev/README.md).
bench: check-nvcc $(BUILD)/bench_attention

$(BUILD)/bench_attention: $(BUILD)/gpu/dev/bench_attention.o
	$(NVCC) $(GPU_ARCH) -o $@ $^

run:
	@bash scripts/run.sh

gpu-deps:
	@bash scripts/gpu_deps.sh

gpu-acceptance:
	@bash scripts/gpu_acceptance.sh

gpu-pack: check-nvcc
	@bash scripts/gpu_pack.sh

QUICK_SECONDS ?= 420
gpu-quick:
	@bash scripts/gpu_quick.sh $(QUICK_SECONDS)

clean:
	rm -rf $(BUILD) train_gpt train_gpt_cpu tokenize gpu-pack gpu-quick

# Dependency files of the objects only (build/ also holds other trees, e.g. make gpu-acceptance's
# unpacked packages, whose etc/libibverbs.d is a directory).
-include $(shell find $(BUILD)/cpu $(BUILD)/gpu $(BUILD)/host -name '*.d' -type f 2>/dev/null)

# ---- tokenize: GPT-2 or Llama 3 BPE text → token shards (host-only tool; sources in data/tokenize/, the
# tokenizer library in src/tokenizer/)
TOKENIZE_OBJS := $(patsubst %.cpp,$(BUILD)/host/%.o,$(wildcard data/tokenize/*.cpp))

tokenize: $(TOKENIZE_OBJS) $(HOST_LIB)
	$(CXX) -pthread -o $@ $^ $(HOST_LIBS)
