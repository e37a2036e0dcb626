#!/usr/bin/python3
"""Exports a train_gpt model file as a Hugging Face GPT-2 directory.

usage: dev/export_hf.py MODEL.bin OUT_DIR

Writes OUT_DIR/config.json and OUT_DIR/model.safetensors (the model file's dtype: fp32 or bf16),
loadable by transformers' GPT2LMHeadModel.from_pretrained(OUT_DIR). The vocabulary is unpadded
(V rows of wte), the lm head is tied to wte. Formats and names: dev/hf_gpt2.py.
"""
import argparse
import os

import hf_gpt2


def run(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="train_gpt / llm.c model file (version 3 fp32 or 5 bf16)")
    ap.add_argument("out_dir", help="output directory (created if missing; its config.json and "
                                    "model.safetensors are replaced)")
    args = ap.parse_args(argv)
    cfg, tensors, dtype = hf_gpt2.read_model(args.model)
    if tensors["wte"][cfg["V"]:].any():
        raise hf_gpt2.FormatError(f"{args.model}: padded vocabulary rows {cfg['V']}..{cfg['Vp'] - 1} of wte are "
                                  "not zero; the export would drop them")
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        raise hf_gpt2.FormatError(f"{args.out_dir}: cannot create: {e.strerror}")
    metadata = {"format": "pt", "source": os.path.basename(args.model), "exporter": "train_gpt dev/export_hf.py"}
    # Each file is written beside its destination and renamed, so a failure leaves no half file.
    for name, write in (("model.safetensors",
                         lambda p: hf_gpt2.write_safetensors(p, hf_gpt2.to_hf(cfg, tensors), dtype, metadata)),
                        ("config.json", lambda p: hf_gpt2.write_json(p, hf_gpt2.hf_config(cfg, dtype)))):
        hf_gpt2.write_replacing(os.path.join(args.out_dir, name), write)
    parameters = sum(v.size for _, v in hf_gpt2.to_hf(cfg, tensors))
    print(f"{args.out_dir}: GPT-2 L={cfg['L']} NH={cfg['NH']} C={cfg['C']} V={cfg['V']} maxT={cfg['maxT']}, "
          f"{parameters:,} parameters ({dtype})")


if __name__ == "__main__":
    hf_gpt2.main(run, None)
