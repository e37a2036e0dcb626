#!/usr/bin/env bash
# Runs a command on this machine made to look like a bare GPU machine for building, so that it can
# build only against an unpacked package prefix, the CUDA toolkit and the C/C++ base: make
# gpu-acceptance's dry run (scripts/gpu_acceptance.sh) proves with it that the packages make
# gpu-deps stages suffice. Hidden, in a private mount namespace (the rest of the system sees no
# change), by overlays whose top layer holds whiteouts:
#   - every header under /usr/include and /usr/local/include that is not a file of the C/C++ base
#     (scripts/gpu_deps.sh --base), and every link name or static library (lib*.so, lib*.a) in
#     /usr/lib and /usr/lib/<triplet> that a -dev package outside the base installs;
#   - every file under /usr/bin, /usr/include and /usr/lib of the prefix's packages (its MANIFEST)
#     installed here, or that the prefix holds: OpenMPI's wrappers and tree among them.
# Versioned shared libraries (libX.so.N) stay: the system's own programs (grep, make, the
# compilers) load them.
# usage: hide_system_copies.sh PREFIX COMMAND [ARG...]   (needs root, or user namespaces)
set -uo pipefail
die() { echo "hide_system_copies: $*" >&2; exit 1; }
[ $# -ge 2 ] || die "usage: hide_system_copies.sh PREFIX COMMAND [ARG...]"
prefix=$(cd "$1" && pwd) || die "no prefix directory $1"
shift
[ -f "$prefix/MANIFEST" ] || die "$prefix/MANIFEST is missing: not a prefix unpacked by scripts/gpu_acceptance.sh"

# First pass: start again inside a new mount namespace (as another user, one mapped to root in a
# new user namespace).
if [ -z "${HIDE_SYSTEM_COPIES_NAMESPACE:-}" ]; then
  options=(--mount)
  [ "$(id -u)" -eq 0 ] || options+=(--map-root-user)
  unshare "${options[@]}" true 2>/dev/null ||
    die "cannot make a mount namespace (unshare ${options[*]}): run as root, or where user namespaces are allowed"
  HIDE_SYSTEM_COPIES_NAMESPACE=1 exec unshare "${options[@]}" bash "$0" "$prefix" "$@"
fi

layer=$(mktemp -d) || die "cannot make a temporary directory"
mapfile -t staged < <(awk '!/^#/ && NF { print $1 }' "$prefix/MANIFEST")
mapfile -t base_patterns < <(bash "$(dirname "$0")/gpu_deps.sh" --base)
mapfile -t base < <(dpkg-query -W -f '${Package}\n' | while read -r package; do
                      for pattern in "${base_patterns[@]}"; do
                        # shellcheck disable=SC2053  # the pattern is a glob on purpose
                        [[ $package == $pattern ]] && { echo "$package"; break; }
                      done
                    done)
[ ${#base[@]} -gt 0 ] || die "none of the C/C++ base's packages (${base_patterns[*]}) is installed here"
dpkg-query -L "${base[@]}" > "$layer.base" 2>/dev/null
mapfile -t dev < <(dpkg-query -W -f '${Package}\n' | grep -- '-dev$')
dpkg-query -L "${dev[@]}" > "$layer.dev" 2>/dev/null
{ dpkg-query -L "${staged[@]}" 2>/dev/null
  (cd "$prefix" && find usr/bin usr/include usr/lib ! -type d 2>/dev/null | sed 's|^|/|'); } > "$layer.staged"
# A whiteout (a character device 0/0) in an overlay's top layer hides that name below it.
hidden=$(python3 - "$layer" "$layer.base" "$layer.dev" "$layer.staged" <<'EOF'
import glob, os, re, stat, sys

layer, base_list, dev_list, staged_list = sys.argv[1:5]
base = {os.path.normpath(line.strip()) for line in open(base_list) if line.startswith("/")}
dev = {os.path.normpath(line.strip()) for line in open(dev_list) if line.startswith("/")}
base_dirs = {os.path.dirname(p) for p in base}
base_dirs |= {d for p in list(base_dirs) for d in [p] + [p[:i] for i in range(len(p)) if p[i] == "/"]}
hidden = set()


def covered(path):  # hidden itself, or under a hidden directory
    while path != "/":
        if path in hidden:
            return True
        path = os.path.dirname(path)
    return False


def hide(path):
    if not covered(path):
        os.makedirs(layer + os.path.dirname(path), exist_ok=True)
        os.mknod(layer + path, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        hidden.add(path)


def hide_headers(directory):  # all below directory but the base's files (a directory without any: whole)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False) and entry.path in base_dirs:
            hide_headers(entry.path)
        elif entry.path not in base:
            hide(entry.path)


for directory in ("/usr/include", "/usr/local/include"):
    if os.path.isdir(directory):
        hide_headers(directory)
for directory in ["/usr/lib"] + glob.glob("/usr/lib/*-linux-gnu"):
    for entry in os.scandir(directory):
        if re.fullmatch(r"lib.*\.(so|a)", entry.name) and entry.path in dev and entry.path not in base:
            hide(entry.path)
for path in sorted({os.path.normpath(line.strip()) for line in open(staged_list)}):
    if not re.match(r"/usr/(bin|include|lib)/", path) or re.search(r"\.so\.[0-9]", os.path.basename(path)):
        continue
    if os.path.lexists(path) and not (os.path.isdir(path) and not os.path.islink(path)):
        hide(path)
print(len(hidden))
EOF
) || die "cannot make the whiteouts in $layer"
for top in usr/bin usr/include usr/lib usr/local/include; do
  [ -d "$layer/$top" ] || continue
  mount -t overlay overlay -o "lowerdir=$layer/$top:/$top" "/$top" ||
    die "cannot mount an overlay on /$top (overlayfs, whiteouts in $layer/$top)"
done
echo "hide_system_copies: $hidden names hidden: headers and link names outside the C/C++ base (${#base[@]} packages), files of ${#staged[@]} staged packages" >&2
exec "$@"
