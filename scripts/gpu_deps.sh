#!/usr/bin/env bash
# make gpu-deps: downloads (never installs) the Debian packages that the GPU build, make test-gpu and
# make gpu-acceptance need beyond a CUDA toolkit into build/gpu-deps/, with a MANIFEST, and copies
# the GPT-2 vocabulary there (git-ignored, so it does not travel with the tree), so that a GPU
# machine without network or root can unpack them into a local prefix (scripts/gpu_acceptance.sh
# does). test/checks/gpu_deps_closure.sh checks that the list covers every header and library.
# usage: gpu_deps.sh            download into build/gpu-deps (needs apt-get and network)
#        gpu_deps.sh --check DIR   verify a staged directory (manifest, files, size, architecture,
#                                  the vocabulary's sha256)
#        gpu_deps.sh --list     print the staged package names, one a line
#        gpu_deps.sh --base     print the C/C++ base's package names (shell patterns), one a line
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# The staged packages travel with the working tree to a GPU machine (scripts/gpu_acceptance.sh);
# the tool that lends one carries at most 64 MiB in all, so the packages get at most 48 of it.
limit_mib=48

# The GPT-2 vocabulary (test/checks/generate.sh, --generate): its files and the header whose
# constants hold their sha256 values.
vocab_dir=data/gpt2_bpe
vocab_header=src/tokenizer/gpt2_bpe.h
vocab_files=(encoder.json:kEncoderJsonSha256 vocab.bpe:kVocabBpeSha256)

# Staged, with why. OpenMPI 4.1 (Debian 12): the GPU build includes mpi.h and links libmpi and
# libmpi_cxx; make test-gpu's distributed_nccl check starts its ranks with mpirun.
packages=(
  libopenmpi-dev        # mpi.h, the libmpi/libmpi_cxx link names, mpicxx's wrapper data
  libopenmpi3           # libmpi, libopen-rte, libopen-pal and the MCA components they load
  openmpi-bin           # mpirun (orterun), orted, opal_wrapper (mpicxx)
  openmpi-common        # help texts and default parameters in share/openmpi, read at run time
  # libopenmpi3's run-time dependencies (the closure is checked against apt below):
  libevent-core-2.1-7 libevent-pthreads-2.1-7   # event loop linked by libopen-pal/libopen-rte
  libhwloc15                                    # topology, linked by libmpi and libopen-pal
  libpmix2 libmunge2                            # PMIx: how mpirun and the ranks find each other
  libucx0 libnuma1                              # the UCX transport component
  libfabric1 libatomic1                         # the libfabric transport component
  libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200  # verbs under UCX/libfabric
  libpsm2-2 libpsm-infinipath1                  # the Omni-Path/InfiniPath transport components
  # Header-only:
  catch2                # Catch2 2.x: every test/*.cu
  nlohmann-json3-dev    # nlohmann/json.hpp: configuration files, checkpoint manifests
  # PCRE2: the GPT-2 tokenizer (train_gpt's --generate, ./tokenize) includes pcre2.h, links -lpcre2-8.
  libpcre2-dev          # pcre2.h and the libpcre2-8.so link name
  libpcre2-8-0          # libpcre2-8.so.0 itself
)
# The C/C++ base that every machine building C++ has and that is never staged: the C library,
# libstdc++, gcc's headers and run-time libraries, and the libraries every Debian/Ubuntu image has.
# test/checks/gpu_deps_closure.sh accepts their files; the dry run (scripts/hide_system_copies.sh)
# leaves only their headers and link names visible.
base=(libc6 libc6-dev linux-libc-dev libcrypt1 libcrypt-dev 'libstdc++6' 'libstdc++-*-dev' libgcc-s1 'libgcc-*-dev'
      'gcc-*-base' zlib1g libudev1 libuuid1)

# Dependencies that apt names but that are not staged, with why.
not_staged=(
  libc6 libgcc-s1 gcc-12-base libstdc++6 zlib1g libudev1 libuuid1   # in every Debian/Ubuntu base image
  libc-dev              # the C library's headers (libc6-dev): part of the C/C++ toolchain nvcc needs
  adduser               # used only by libibverbs1's maintainer scripts; dpkg -x runs none
  openssh-client ssh-client   # mpirun needs it only to start ranks on other machines
  libhwloc-plugins      # optional hwloc plugins pulling X11, OpenCL, libxml2 and ICU (~15 MiB)
  # libopenmpi-dev's Fortran compiler and -dev packages: a C++ build against mpi.h needs none.
  gfortran-12 gfortran-mod-15 libibverbs-dev libhwloc-dev libevent-dev libpmix-dev zlib1g-dev
  libjs-jquery libjs-jquery-ui
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3   # libpcre2-dev's other widths: only -lpcre2-8 is linked
)

die() { echo "gpu-deps: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# The sha256 that $vocab_header's constant $1 holds.
vocab_sha256() {
  sed -n "/$1/,/;/p" "$vocab_header" | grep -o '[0-9a-f]\{64\}' | head -n 1
}

# Whether file $1 is vocabulary file $2 (name:constant of vocab_files) with its sha256.
vocab_verified() {
  local sha
  sha=$(vocab_sha256 "${2#*:}")
  [ -n "$sha" ] || die "no sha256 for ${2%%:*} in $vocab_header (constant ${2#*:})"
  [ -f "$1" ] && echo "$sha  $1" | sha256sum --check --status
}

# Verifies a staged directory: MANIFEST present and naming every package of the list above, every
# listed .deb present with its size, no .deb that the MANIFEST does not list, the packages'
# architecture this machine's, the vocabulary files with their sha256, the total at most
# limit_mib. Prints one line either way.
check_staged() {
  local dir=$1 manifest=$1/MANIFEST total=0 count=0 name arch file bytes actual machine entry
  [ -d "$dir" ] || die "$dir is missing: run 'make gpu-deps' on a networked Debian machine and bring $dir along"
  [ -f "$manifest" ] || die "$manifest is missing ($dir was not made by make gpu-deps): rerun make gpu-deps"
  machine=$(dpkg --print-architecture 2>/dev/null || uname -m)
  [ "$machine" = x86_64 ] && machine=amd64
  [ "$machine" = aarch64 ] && machine=arm64
  while read -r name _ arch file bytes; do
    case $name in '#'* | '') continue ;; esac
    [ -f "$dir/$file" ] || die "$dir/$file (listed in $manifest) is missing: rerun make gpu-deps"
    actual=$(stat -c %s "$dir/$file")
    [ "$actual" = "$bytes" ] || die "$dir/$file has $actual bytes, $manifest says $bytes: rerun make gpu-deps"
    [ "$arch" = all ] || [ "$arch" = "$machine" ] ||
      die "$dir/$file is for $arch, this machine is $machine: run make gpu-deps on a machine of the same architecture"
    total=$((total + actual)); count=$((count + 1))
  done < "$manifest"
  [ "$count" -gt 0 ] || die "$manifest lists no packages: rerun make gpu-deps"
  for name in "${packages[@]}"; do
    awk -v n="$name" '$1 == n { found = 1 } END { exit !found }' "$manifest" ||
      die "$manifest lacks $name, which scripts/gpu_deps.sh stages ($dir is older than its list): rerun make gpu-deps"
  done
  for file in "$dir"/*.deb; do
    [ -e "$file" ] || continue
    grep -q " ${file##*/} " "$manifest" || die "$file is not listed in $manifest: rerun make gpu-deps"
  done
  for entry in "${vocab_files[@]}"; do
    file=$dir/gpt2_bpe/${entry%%:*}
    [ -f "$file" ] || die "$file (the GPT-2 vocabulary) is missing: rerun make gpu-deps"
    vocab_verified "$file" "$entry" || die "$file is not the GPT-2 vocabulary (sha256 differs from $vocab_header's): rerun make gpu-deps"
    total=$((total + $(stat -c %s "$file")))
  done
  [ "$total" -le $((limit_mib * 1048576)) ] ||
    die "$dir holds $(mib "$total") MiB of packages, over the $limit_mib MiB limit"
  echo "gpu-deps: $dir: $count packages and the GPT-2 vocabulary, $(mib "$total") MiB (limit $limit_mib MiB)"
}

# Every dependency of a staged package is staged or listed in not_staged (an alternative group
# "a | b" needs one of its members), so a Debian update that adds a library is noticed here.
check_closure() {
  local package='' line dep alternative=0 group_ok=0 problems=0
  local depends_re='^ ([ |])(Pre)?Depends: <?([^ >]+)>?$'
  declare -A known=()
  for dep in "${packages[@]}" "${not_staged[@]}"; do known[$dep]=1; done
  while IFS= read -r line; do
    # A package name starts a block; "  Depends: x" ends a dependency group, " |Depends: x"
    # continues it; deeper lines list the providers of a virtual package.
    if [[ $line != ' '* ]]; then package=$line; continue; fi
    [[ $line =~ $depends_re ]] || continue
    dep=${BASH_REMATCH[3]}
    [ -n "${known[$dep]:-}" ] && group_ok=1
    if [ "${BASH_REMATCH[1]}" = "|" ]; then alternative=1; continue; fi
    if [ "$group_ok" -eq 0 ]; then
      echo "gpu-deps: $package needs $dep$([ "$alternative" -eq 1 ] && echo ' (or an alternative)'), which is neither staged nor listed as not needed in scripts/gpu_deps.sh" >&2
      problems=$((problems + 1))
    fi
    alternative=0; group_ok=0
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "${packages[@]}" 2>/dev/null)
  [ "$problems" -eq 0 ]
}

case ${1:-} in
  --check) [ $# -eq 2 ] || die "usage: gpu_deps.sh --check DIR"; check_staged "$2"; exit 0 ;;
  --list) [ $# -eq 1 ] || die "--list takes no argument"; printf '%s\n' "${packages[@]}"; exit 0 ;;
  --base) [ $# -eq 1 ] || die "--base takes no argument"; printf '%s\n' "${base[@]}"; exit 0 ;;
  '') ;;
  *) die "unknown argument '$1' (usage: gpu_deps.sh [--check DIR | --list | --base])" ;;
esac

command -v apt-get >/dev/null 2>&1 || die "apt-get not found: run make gpu-deps on a networked Debian machine"
compgen -G '/var/lib/apt/lists/*Packages*' >/dev/null || die "apt has no package lists: run 'apt-get update' first"
check_closure || die "the package lists in scripts/gpu_deps.sh are out of date (see above)"

out=build/gpu-deps
staging=$out.tmp
rm -rf "$staging"
mkdir -p "$staging" || die "cannot create $staging"
trap 'rm -rf "$staging"' EXIT
apt_options=()
# As root, apt downloads as the user _apt, who cannot write into a directory that only root may
# write; it then warns and downloads as root anyway, so ask for that directly.
[ "$(id -u)" -eq 0 ] && apt_options=(-o APT::Sandbox::User=root)
if ! (cd "$staging" && apt-get "${apt_options[@]}" download -q "${packages[@]}" > download.log 2>&1); then
  tail -n 5 "$staging/download.log" >&2
  die "apt-get download failed (no network, or stale lists: run 'apt-get update')"
fi
rm -f "$staging/download.log"
mkdir -p "$staging/gpt2_bpe"
for entry in "${vocab_files[@]}"; do
  file=$vocab_dir/${entry%%:*}
  vocab_verified "$file" "$entry" ||
    die "$file is missing or not the GPT-2 vocabulary (sha256): run scripts/install_deps.sh"
  cp "$file" "$staging/gpt2_bpe/" || die "cannot copy $file to $staging/gpt2_bpe"
done
{
  echo "# make gpu-deps, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# package version architecture file bytes"
  for file in "$staging"/*.deb; do
    echo "$(dpkg-deb -f "$file" Package Version Architecture | awk '{ printf "%s ", $2 }')${file##*/} $(stat -c %s "$file")"
  done
} > "$staging/MANIFEST"
[ "$(grep -vc '^#' "$staging/MANIFEST")" -eq "${#packages[@]}" ] ||
  die "apt-get download gave $(grep -vc '^#' "$staging/MANIFEST") packages for ${#packages[@]} names"
check_staged "$staging" >/dev/null
rm -rf "$out"
mv "$staging" "$out" || die "cannot move $staging to $out"
check_staged "$out"
