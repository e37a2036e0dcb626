#!/usr/bin/python3
"""Draws a pipeline schedule's unit-cost timeline as a PNG.

usage: dev/pipeline_timeline.py TIMELINE.json -o FILE.png [--cell PIXELS]

TIMELINE.json is what src/dist/pipeline_check.h's pipeline_timeline_json writes: the schedule's
kind and shape, the makespan, and per rank its computations (op F, B, BI or W, micro-batch, chunk,
start, cost). One row per rank, one column of --cell pixels per time unit; forwards blue,
backwards (and zb-h1's input backwards) green, weight backwards orange, idle white, each box a
shade lighter for later micro-batches so that neighbours stay apart. Prints the bubble
(idle / (ranks · makespan)). Python's standard library only (zlib writes the PNG), so it runs where
matplotlib is missing.
"""
import argparse
import json
import struct
import sys
import zlib

COLOURS = {"F": (66, 120, 200), "B": (60, 160, 90), "BI": (60, 160, 90), "W": (230, 140, 40)}
WHITE = (255, 255, 255)
GRID = (200, 200, 200)


def shade(colour, microbatch):
    """Lightens a colour a little per micro-batch, cycling every four."""
    step = (microbatch % 4) * 0.15
    return tuple(int(c + (255 - c) * step) for c in colour)


def write_png(path, pixels):
    """Writes rows of (r, g, b) tuples as an 8-bit RGB PNG."""
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in pixels)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) +
                chunk(b"IEND", b""))


def draw(timeline, cell):
    ranks = timeline["ranks"]
    makespan = timeline["makespan"]
    row_height = cell * 2
    width, height = makespan * cell + 1, len(ranks) * row_height + 1
    pixels = [[WHITE] * width for _ in range(height)]
    for r, actions in enumerate(ranks):
        top = r * row_height
        for a in actions:
            colour = shade(COLOURS[a["op"]], a["microbatch"])
            left, right = a["start"] * cell, (a["start"] + a["cost"]) * cell
            for y in range(top + 1, top + row_height):
                for x in range(left + 1, right):
                    pixels[y][x] = colour
        for x in range(width):
            pixels[top][x] = GRID
    for x in range(width):
        pixels[height - 1][x] = GRID
    return pixels


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("timeline")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--cell", type=int, default=12)
    args = parser.parse_args()
    try:
        with open(args.timeline) as f:
            timeline = json.load(f)
        ranks, makespan = timeline["ranks"], timeline["makespan"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"{args.timeline}: not a pipeline timeline ({e})")
    if args.cell < 2:
        sys.exit("--cell: at least 2 pixels")
    write_png(args.output, draw(timeline, args.cell))
    busy = sum(a["cost"] for actions in ranks for a in actions)
    print(f"{timeline['kind']} p={timeline['stages']} m={timeline['microbatches']} v={timeline['virtual_stages']}: "
          f"makespan {makespan}, bubble {1 - busy / (len(ranks) * makespan):.4f} -> {args.output}")


if __name__ == "__main__":
    main()
