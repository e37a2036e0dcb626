#!/usr/bin/python3
"""Imports a Hugging Face GPT-2 directory as a train_gpt model file (for --init-from).

usage: dev/import_hf.py HF_DIR MODEL.bin [--padded-vocab N] [--dtype fp32|bf16]

Reads HF_DIR/config.json and HF_DIR/model.safetensors (F32 or BF16; names with or without the
"transformer." prefix; a stored lm_head.weight must equal wte). The model file keeps the
safetensors dtype unless --dtype says otherwise (fp32 → bf16 rounds to nearest even).
Formats and names: dev/hf_gpt2.py.
"""
import argparse

import numpy as np

import hf_gpt2


def to_bf16_bits(values):
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest, ties to even
    return rounded.astype(np.uint16)


def run(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir", help="directory with config.json and model.safetensors")
    ap.add_argument("model", help="model file to write (replaced atomically)")
    ap.add_argument("--padded-vocab", type=int, default=None,
                    help="rows of wte in the model file (default: the vocabulary rounded up to 128)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                    help="model file dtype (default: the safetensors dtype)")
    args = ap.parse_args(argv)
    cfg, tensors, dtype = hf_gpt2.from_hf(args.hf_dir, args.padded_vocab)
    if args.dtype is not None and args.dtype != dtype:
        if args.dtype == "bf16":
            tensors = {k: to_bf16_bits(v) for k, v in tensors.items()}
        else:
            tensors = {k: (v.astype(np.uint32) << 16).view(np.float32) for k, v in tensors.items()}
        dtype = args.dtype
    hf_gpt2.write_replacing(args.model, lambda path: hf_gpt2.write_model(path, cfg, tensors, dtype))
    print(f"{args.model}: GPT-2 L={cfg['L']} NH={cfg['NH']} C={cfg['C']} V={cfg['V']} Vp={cfg['Vp']} "
          f"maxT={cfg['maxT']} ({dtype})")


if __name__ == "__main__":
    hf_gpt2.main(run, None)
