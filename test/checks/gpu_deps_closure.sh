#!/usr/bin/env bash
# make gpu-deps stages everything the GPU build reads beyond the CUDA toolkit and the C/C++ base:
# every header that nvcc -M lists for train_gpt.cu and the test sources (and g++ -M for the host
# sources the GPU build and make test-gpu compile: the tokenizer, Catch2's main), and every library
# that the GPU binaries' -l flags name (a link traced by the linker, then ldd of its output)
# resolves to the CUDA toolkit, the C/C++ base (libc, libstdc++, gcc) or a package that
# scripts/gpu_deps.sh stages. A file of any other package, or of none, fails, named with its
# package (dpkg -S) and the source or flags that need it. The sources and flags come from the
# Makefile, the staged list from scripts/gpu_deps.sh --list.
# usage: gpu_deps_closure.sh cpu|gpu   (gpu: skipped; a GPU machine builds with what is staged)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda/bin/nvcc
[ -x "$nvcc" ] || { echo "FAIL: no nvcc at $nvcc (set CUDA_HOME)"; exit 1; }
command -v dpkg-query >/dev/null || { echo "FAIL: dpkg-query not found: the closure is checked on Debian"; exit 1; }

make_var() { make --no-print-directory -s --eval="print-var-$1: ; @echo \$($1)" "print-var-$1"; }
read -r -a gpu_flags <<< "$(make_var GPU_FLAGS)"
read -r -a gpu_arch <<< "$(make_var GPU_ARCH)"
read -r -a gpu_libs <<< "$(make_var GPU_LIBS) $(make_var HOST_LIBS)"
read -r -a cu_sources <<< "train_gpt.cu $(make_var KERNEL_TESTS) $(make_var MPI_TESTS)"
read -r -a cpp_sources <<< "$(make_var HOST_SRCS) $(make_var TOKENIZE_OBJS | tr ' ' '\n' |
                              sed 's|^build/host/||; s|\.o$|.cpp|' | sort -u | paste -sd ' ') test/catch_main.cpp"
mapfile -t staged < <(bash scripts/gpu_deps.sh --list)
base=$(bash scripts/gpu_deps.sh --base | paste -sd ' ')
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Lines "FILE<TAB>NEEDED BY": every header the sources include ...
compile_flags=()
for flag in "${gpu_flags[@]}"; do
  case $flag in -MMD | -MP) ;; *) compile_flags+=("$flag") ;; esac
done
for source in "${cu_sources[@]}" "${cpp_sources[@]}"; do
  [ -f "$source" ] || { fail "$source (named by the Makefile) is missing"; continue; }
  if [[ $source == *.cu ]]; then
    "$nvcc" "${compile_flags[@]}" -M "$source" -o "$tmp/deps" 2> "$tmp/err"
  else
    g++ -std=c++17 -I. -isystem "$cuda/include" -M "$source" -o "$tmp/deps" 2> "$tmp/err"
  fi || { fail "cannot list the headers of $source: $(head -n 3 "$tmp/err")"; continue; }
  sed 's/^[^:]*://; s/\\$//' "$tmp/deps" | tr -s ' ' '\n' | grep '^/' | sed "s|\$|\theader of $source|"
done > "$tmp/needed"

# ... and the libraries of the GPU binaries' -l flags: a program linked with them (every one kept,
# nvcc's temporary files aside), the files the linker opened, and what the loader then maps.
echo 'int main() { return 0; }' > "$tmp/empty.cu"
mkdir -p "$tmp/nvcc"
if TMPDIR=$tmp/nvcc "$nvcc" "${gpu_arch[@]}" -o "$tmp/linked" "$tmp/empty.cu" -Xlinker --no-as-needed \
     -Xlinker --trace "${gpu_libs[@]}" > "$tmp/trace" 2>&1; then
  grep '^/' "$tmp/trace" | grep -v "^$tmp/" | sed 's/^\(.*\)(.*)$/\1/' |
    sed "s|\$|\tlinked by ${gpu_libs[*]}|" >> "$tmp/needed"
  while read -r name _ path _; do
    if [ "$path" = not ]; then fail "library $name (loaded by a program linked with ${gpu_libs[*]}) is not found here"
    elif [[ $path == /* ]]; then printf '%s\tloaded by a program linked with %s\n' "$path" "${gpu_libs[*]}"; fi
  done < <(ldd "$tmp/linked" | grep '=>') >> "$tmp/needed"
else
  fail "linking with ${gpu_libs[*]} failed: $(grep -m 3 -iE 'error|cannot find' "$tmp/trace")"
fi

# Each file outside the toolkit and the tree, by the packages that own it (dpkg -S of the path, of
# the file a link name leads to and of their /usr-merged twins, /lib/x and /usr/lib/x): the C/C++
# base (scripts/gpu_deps.sh --base) or a staged package.
cat > "$tmp/classify.py" <<'EOF'
import collections, fnmatch, os, subprocess, sys

needed_file, toolkit, tree, base, staged = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), set(sys.argv[5:])
needed_by = collections.defaultdict(set)
for line in open(needed_file):
    path, _, why = line.rstrip("\n").partition("\t")
    needed_by[path].add(why)


def candidates(path):
    names = []
    for name in (os.path.normpath(path), os.path.realpath(path)):
        names.append(name)
        if name.startswith(("/usr/lib/", "/usr/bin/")):
            names.append(name[len("/usr"):])
        elif name.startswith(("/lib/", "/bin/")):
            names.append("/usr" + name)
    return names


outside = {p: candidates(p) for p in needed_by if not os.path.realpath(p).startswith((toolkit + "/", tree + "/"))}
queries = sorted({c for cs in outside.values() for c in cs})
answer = subprocess.run(["dpkg-query", "-S", *queries], capture_output=True, text=True).stdout
owner = {}
for line in answer.splitlines():
    packages, sep, path = line.partition(": /")
    if sep and not line.startswith("diversion"):
        owner["/" + path] = packages.split(",")[0].split(":")[0].strip()
counts, problems = collections.Counter(toolkit=len(needed_by) - len(outside)), []
for path, cs in sorted(outside.items()):
    packages = sorted({owner[c] for c in cs if c in owner})
    why = sorted(needed_by[path])
    why = "; ".join(why[:2]) + (f" and {len(why) - 2} more" if len(why) > 2 else "")
    path = os.path.normpath(path)
    if not packages:
        problems.append(f"{path} ({why}) belongs to no package (dpkg -S finds none): stage it or stop needing it")
    missing = [p for p in packages if p not in staged and not any(fnmatch.fnmatch(p, b) for b in base)]
    for package in missing:
        problems.append(f"{path} ({why}) comes from package {package}, which scripts/gpu_deps.sh does not stage: "
                        f"add {package} to its packages (it checks their dependencies with apt)")
    if packages and not missing:
        counts["staged" if any(p in staged for p in packages) else "C/C++ base"] += 1
for problem in problems:
    print("FAIL:", problem)
print(f"{len(needed_by)} files needed: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
sys.exit(1 if problems else 0)
EOF
python3 "$tmp/classify.py" "$tmp/needed" "$(realpath "$cuda")" "$PWD" "$base" "${staged[@]}" || failures=$((failures + 1))

echo "${#cu_sources[@]} CUDA and ${#cpp_sources[@]} C++ sources; -l flags: ${gpu_libs[*]}"
[ "$failures" -eq 0 ] && echo "ok: every header and library the GPU build needs is in the toolkit, the C/C++ base or scripts/gpu_deps.sh's packages"
[ "$failures" -eq 0 ]
