# train_gpt — one source tree, two builds:
#   make            ./train_gpt      nvcc, sm_80 + sm_90a (+ compute_90 PTX), cuBLASLt, NCCL, MPI
#   make cpu        ./train_gpt_cpu  g++ over simt/ (CUDA semantics on CPU fibers)
#   make test       CPU test suite in both thread orders + GPU build compile check
#   make test-gpu   the same suite built with nvcc, run on a GPU
#   make run        train: GPU binary when a GPU is present, else the CPU build on a small model
#   make ptx-report ptxas registers / spills / shared memory per kernel → build/ptx-report.txt
#   make gpu-deps   on a networked Debian machine: the OpenMPI, Catch2, nlohmann-json, PCRE2 .debs and
#                   the GPT-2 vocabulary a bare GPU machine needs → build/gpu-deps/ (scripts/gpu_deps.sh)
#   make gpu-acceptance  on a GPU machine: build, test-gpu, sanitizers, PyTorch parity, determinism,
#                   ceilings, throughput → build/acceptance/summary.md (scripts/gpu_acceptance.sh)
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
GPU_FLAGS := -std=c++17 -O3 -lineinfo $(GPU_ARCH) -Werror all-warnings -Xcompiler -Wall,-Wextra \
             -I. $(MPI_COMPILE) -MMD -MP
GPU_LIBS  := -lcublasLt -lnccl $(MPI_LINK)

# The GPT-2 tokenizer of data/tokenize/ (prompts and generated text of --generate, --sample-every),
# linked into train_gpt as host objects.
BPE_SRCS := data/tokenize/gpt2_bpe.cpp data/tokenize/sha256.cpp
BPE_LIBS := -lpcre2-8

SIMT_SRCS  := $(wildcard simt/*.cpp)
SIMT_OBJS  := $(SIMT_SRCS:%.cpp=$(BUILD)/cpu/%.o)
KERNEL_TESTS := $(wildcard test/test_*.cu)
SIMT_TESTS   := $(wildcard test/simt_*.cpp)
CPU_TEST_BINS := $(KERNEL_TESTS:test/%.cu=$(BUILD)/cpu/test/%) $(SIMT_TESTS:test/%.cpp=$(BUILD)/cpu/test/%)
GPU_TEST_BINS := $(KERNEL_TESTS:test/%.cu=$(BUILD)/gpu/test/%)
# Multi-rank tests (test/mpi_*.cu) run under mpirun from test/checks/distributed_nccl.sh, not by
# the single-process runner.
MPI_TESTS         := $(wildcard test/mpi_*.cu)
CPU_MPI_TEST_BINS := $(MPI_TESTS:test/%.cu=$(BUILD)/cpu/test/%)
GPU_MPI_TEST_BINS := $(MPI_TESTS:test/%.cu=$(BUILD)/gpu/test/%)

.PHONY: all gpu cpu test test-gpu gpu-check ptx-report bench run clean check-nvcc gpu-deps gpu-acceptance
.DEFAULT_GOAL := all

all: gpu
gpu: check-nvcc train_gpt tokenize
cpu: train_gpt_cpu tokenize

check-nvcc:
	@command -v $(NVCC) >/dev/null 2>&1 || { echo "nvcc not found at $(NVCC): install the CUDA toolkit and set CUDA_HOME (or run 'make cpu' for the CPU build)"; exit 1; }

# ---- binaries
train_gpt: $(BUILD)/gpu/train_gpt.o $(BPE_SRCS:%.cpp=$(BUILD)/gpu/%.o)
	$(NVCC) $(GPU_ARCH) -o $@ $^ $(GPU_LIBS) $(BPE_LIBS)

train_gpt_cpu: $(BUILD)/cpu/train_gpt.o $(SIMT_OBJS) $(BPE_SRCS:%.cpp=$(BUILD)/cpu/%.o)
	$(CXX) -o $@ $^ $(CPU_LIBS) $(BPE_LIBS)

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

$(BUILD)/gpu/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -I. -isystem $(CUDA_HOME)/include -MMD -MP -c $< -o $@

# ---- tests
$(BUILD)/cpu/test/%: $(BUILD)/cpu/test/%.o $(BUILD)/cpu/test/catch_main.o $(SIMT_OBJS)
	$(CXX) -o $@ $^ $(CPU_LIBS)

$(BUILD)/gpu/test/%: $(BUILD)/gpu/test/%.o $(BUILD)/gpu/test/catch_main.o
	$(NVCC) $(GPU_ARCH) -o $@ $^ $(GPU_LIBS)

.PRECIOUS: $(BUILD)/cpu/%.o $(BUILD)/gpu/%.o

# PyTorch reference outputs the model tests compare against (generated, never committed).
REFERENCE_DIR := $(BUILD)/reference
REFERENCES    := $(REFERENCE_DIR)/tiny/reference.bin
$(REFERENCE_DIR)/tiny/reference.bin: dev/gpt2_reference.py
	$(PYTHON) dev/gpt2_reference.py --out $(@D) > /dev/null

test: $(CPU_TEST_BINS) $(CPU_MPI_TEST_BINS) train_gpt_cpu tokenize $(REFERENCES)
	@bash test/run_tests.sh cpu $(CPU_TEST_BINS)

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

clean:
	rm -rf $(BUILD) train_gpt train_gpt_cpu tokenize

# Dependency files of the objects only (build/ also holds other trees, e.g. make gpu-acceptance's
# unpacked packages, whose etc/libibverbs.d is a directory).
-include $(shell find $(BUILD)/cpu $(BUILD)/gpu $(BUILD)/tokenize -name '*.d' -type f 2>/dev/null)

# ---- tokenize: GPT-2 BPE text → token shards (host-only tool; sources in data/tokenize/)
TOKENIZE_OBJS := $(patsubst data/tokenize/%.cpp,$(BUILD)/tokenize/%.o,$(wildcard data/tokenize/*.cpp))

tokenize: $(TOKENIZE_OBJS)
	$(CXX) -pthread -o $@ $^ -lpcre2-8

$(BUILD)/tokenize/%.o: data/tokenize/%.cpp
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror -pthread -MMD -MP -c $< -o $@
