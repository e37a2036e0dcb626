#!/usr/bin/env bash
# Every kernel that declares __launch_bounds__(N[, M]) opens with LAUNCH_BOUNDS_GUARD(N) — the same
# N — as its first statement: the CPU build cannot carry the attribute's value to the launch
# (simt/simt.h), so the guard is what makes it refuse a launch over the bound as a GPU does
# (kernels/common.cuh; docs/SIMT.md, "Launches"). A kernel without it would run over its bound on
# the CPU and fail only on a GPU.
# usage: launch_bounds.sh cpu|gpu   (the sources are the same for both builds)
set -euo pipefail
cd "$(dirname "$0")/../.."
mapfile -t files < <(git ls-files 'kernels/*.cuh' 'src/*' 'test/*.cu' 'test/*.cuh' 'test/*.h' 'train_gpt.cu' |
                     while read -r f; do [ -e "$f" ] && echo "$f"; done)
/usr/bin/python3 - "${files[@]}" <<'EOF'
import re, sys

def strip_comments(text):
    # Comments become spaces (newlines kept, so line numbers stay right); strings are left alone.
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            out.append(text[i:j + 1]); i = j + 1
        else:
            out.append(text[i]); i += 1
    return ''.join(out)

def balanced(text, open_at):
    # text[open_at] == '(': the index of its ')'.
    depth = 0
    for k in range(open_at, len(text)):
        depth += {'(': 1, ')': -1}.get(text[k], 0)
        if depth == 0:
            return k
    return -1

def first_argument(args):
    depth = 0
    for k, c in enumerate(args):
        if c in '(<[': depth += 1
        elif c in ')>]': depth -= 1
        elif c == ',' and depth == 0: return args[:k]
    return args

def normal(expr):
    return re.sub(r'\s+', '', expr)

failures = 0
for path in sys.argv[1:]:
    text = strip_comments(open(path, encoding='utf-8').read())
    for m in re.finditer(r'\b__launch_bounds__\s*\(', text):
        line = text.count('\n', 0, m.start()) + 1
        close = balanced(text, m.end() - 1)
        if text[:m.start()].rstrip().endswith('#define') or close < 0:
            continue
        bound = normal(first_argument(text[m.end():close]))
        body = text.find('{', close)
        guard = re.match(r'\s*LAUNCH_BOUNDS_GUARD\s*\(', text[body + 1:]) if body >= 0 else None
        found = None
        if guard:
            open_at = body + 1 + guard.end() - 1
            found = normal(text[open_at + 1:balanced(text, open_at)])
        if found != bound:
            failures += 1
            print(f'FAIL: {path}:{line}: a kernel declared __launch_bounds__({bound}) must open with '
                  f'LAUNCH_BOUNDS_GUARD({bound}); (kernels/common.cuh)' +
                  ('' if found is None else f', found LAUNCH_BOUNDS_GUARD({found})'))
print(f'ok: every __launch_bounds__ kernel in {len(sys.argv) - 1} files opens with its guard' if failures == 0
      else f'{failures} kernel(s) without their LAUNCH_BOUNDS_GUARD')
sys.exit(1 if failures else 0)
EOF
