#!/usr/bin/env bash
# Runs a command where this system's own copies of the packages unpacked into a prefix are hidden,
# so that it can build only against the prefix: make gpu-acceptance's dry run
# (scripts/gpu_acceptance.sh) proves with it that the packages make gpu-deps stages suffice.
# Hidden, in a private mount namespace (the rest of the system sees no change): every file and
# link under /usr/bin, /usr/include and /usr/lib that one of the prefix's packages (its MANIFEST)
# installs here, or that the prefix itself holds — headers, link names, static libraries,
# OpenMPI's wrappers and components — by overlays whose top layer holds whiteouts. Versioned
# shared libraries (libX.so.N) stay: the system's own programs (grep, make, the compilers) load them.
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
mapfile -t packages < <(awk '!/^#/ && NF { print $1 }' "$prefix/MANIFEST")
# A whiteout (a character device 0/0) in an overlay's top layer hides that name below it.
hidden=$({ dpkg-query -L "${packages[@]}" 2>/dev/null
           (cd "$prefix" && find usr/bin usr/include usr/lib ! -type d 2>/dev/null | sed 's|^|/|'); } |
         python3 -c '
import os, re, stat, sys
layer, hidden = sys.argv[1], 0
for path in sorted(set(line.strip() for line in sys.stdin)):
    if not re.match(r"/usr/(bin|include|lib)/", path) or re.search(r"\.so\.[0-9]", os.path.basename(path)):
        continue
    if not os.path.lexists(path) or (os.path.isdir(path) and not os.path.islink(path)):
        continue
    os.makedirs(layer + os.path.dirname(path), exist_ok=True)
    os.mknod(layer + path, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    hidden += 1
print(hidden)' "$layer") || die "cannot make the whiteouts in $layer"
for top in bin include lib; do
  [ -d "$layer/usr/$top" ] || continue
  mount -t overlay overlay -o "lowerdir=$layer/usr/$top:/usr/$top" "/usr/$top" ||
    die "cannot mount an overlay on /usr/$top (overlayfs, whiteouts in $layer/usr/$top)"
done
echo "hide_system_copies: $hidden system files of ${#packages[@]} staged packages hidden" >&2
exec "$@"
