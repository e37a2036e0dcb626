# eval_file.py — writes llm.c's multiple-choice eval file (docs/FORMATS.md) for the checks that
# need one: write_eval_file(path, [(label, context ids, [completion ids, ...]), ...]).
import struct


def write_eval_file(path, examples):
    stream, longest = [], 0
    for i, (label, ctx, comps) in enumerate(examples):
        ex = [65535, 0, i, label, len(comps), len(ctx)] + list(ctx)
        for c in comps:
            ex += [len(c)] + list(c)
        ex[1] = 2 * len(ex)  # the example's bytes
        longest = max(longest, ex[1])
        stream += ex
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240522, 1, len(examples), longest, *[0] * 252))
        f.write(struct.pack(f"<{len(stream)}H", *stream))
