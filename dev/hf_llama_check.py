#!/usr/bin/python3
"""hf_llama_check.py — Hugging Face Llama directories for test/checks/hf_llama.sh, written from the
safetensors format and transformers' Llama conventions, independently of train_gpt's C++:

  make DIR [--vocab V --layers L --heads NH --kv-heads NKV --channels C --hidden H --max-seq-len T
            --seed S --tied --dtype fp32|bf16 --rope-scaling]
      a random tiny LlamaForCausalLM directory (config.json, model.safetensors)
  edit SRC DST [--set KEY=JSON ...] [--drop TENSOR ...] [--shards N]
      SRC copied to DST with config.json keys replaced, tensors dropped, the tensors split over N
      model-0000K-of-0000N.safetensors files with model.safetensors.index.json
  check DIR [--model-bin FILE] [--data SHARD --batch B --seq-len T --loss X [--tolerance R]]
      DIR's names, shapes, dtypes and header padding; with --model-bin, every tensor equals the
      train_gpt model file's (q_proj/k_proj rows in Hugging Face's rotate-half order); with --data,
      the mean loss of the shard's first B x T tokens by a forward pass written here (RMSNorm,
      rotate-half RoPE with Llama 3 scaling, GQA, SwiGLU) equals X within R relative; where
      transformers is importable, LlamaForCausalLM.from_pretrained(DIR) gives it too.

Exit 0 when every check holds, 1 with a line per failure. torch, numpy and the standard library only.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_gpt2 import read_safetensors, write_json, write_safetensors  # noqa: E402  (format helpers only)

LLAMA_MODEL_MAGIC = 20240803
HEADER_INTS = 256


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """Round to nearest even, as torch does."""
    return torch.from_numpy(np.ascontiguousarray(values, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def hf_names(cfg):
    """(name, shape, permuted heads) of every tensor a LlamaForCausalLM of cfg holds."""
    C, V, H, NH = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    NKV, HS = cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    out = [("model.embed_tokens.weight", [V, C], 0)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", [C], 0), (p + "self_attn.q_proj.weight", [NH * HS, C], NH),
                (p + "self_attn.k_proj.weight", [NKV * HS, C], NKV), (p + "self_attn.v_proj.weight", [NKV * HS, C], 0),
                (p + "self_attn.o_proj.weight", [C, C], 0), (p + "post_attention_layernorm.weight", [C], 0),
                (p + "mlp.gate_proj.weight", [H, C], 0), (p + "mlp.up_proj.weight", [H, C], 0),
                (p + "mlp.down_proj.weight", [C, H], 0)]
    out.append(("model.norm.weight", [C], 0))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [V, C], 0))
    return out


def to_rotate_half(w, heads):
    """transformers' conversion of Meta's q/k: w.view(heads, HS/2, 2, C).transpose(1, 2)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def cmd_make(a):
    rng = np.random.default_rng(a.seed)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.channels,
           "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "vocab_size": a.vocab, "max_position_embeddings": a.max_seq_len,
           "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": a.tied, "attention_bias": False,
           "mlp_bias": False, "hidden_act": "silu", "torch_dtype": "float32" if a.dtype == "fp32" else "bfloat16",
           "rope_scaling": None}
    if a.rope_scaling:  # an original context below the sequence length, so every band of the scaling is used
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16}
    named = []
    for name, shape, _ in hf_names(cfg):
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            # q and k large enough that attention is far from uniform, so RoPE's order matters to the loss
            scale = 0.15 if ("q_proj" in name or "k_proj" in name) else 0.08 if "embed" in name else 0.05
            w = scale * rng.standard_normal(shape)
        w = w.astype(np.float32)
        named.append((name, w if a.dtype == "fp32" else f32_to_bf16(w)))
    os.makedirs(a.dir, exist_ok=True)
    write_safetensors(os.path.join(a.dir, "model.safetensors"), named, a.dtype, {"format": "pt"})
    write_json(os.path.join(a.dir, "config.json"), cfg)


def read_dir(d):
    """{name: float32 array}, {name: dtype tag}, and the problems found in the files' headers."""
    problems, tensors, tags = [], {}, {}
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    for f in files:
        path = os.path.join(d, f)
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        if n % 8:
            problems.append(f"{path}: header of {n} bytes, not padded to a multiple of 8")
        for name, info in header.items():
            if name != "__metadata__":
                tags[name] = info["dtype"]
        arrays, dtype = read_safetensors(path)
        for name, arr in arrays.items():
            tensors[name] = bf16_to_f32(arr) if dtype == "bf16" else arr.astype(np.float32)
    return tensors, tags, problems


def read_model_bin(path):
    """A train_gpt Llama model file (extended header) as {our tensor name: float32 array} and its header."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw, np.int32, HEADER_INTS)
    assert h[0] == LLAMA_MODEL_MAGIC and h[16] == 1, f"{path}: not a train_gpt Llama model file"
    T, V, L, NH, NKV, C, Vp, H, tied = (int(h[i]) for i in (2, 3, 4, 5, 6, 7, 17, 18, 19))
    HS = C // NH
    body = np.frombuffer(raw, np.float32 if h[1] == 3 else np.uint16, offset=HEADER_INTS * 4)
    if h[1] != 3:
        body = bf16_to_f32(body)
    sizes = [("wte", Vp * C), ("ln1w", L * C), ("qkvw", L * (NH + 2 * NKV) * HS * C), ("attprojw", L * C * C),
             ("ln2w", L * C), ("fcw", L * H * C), ("fc2w", L * H * C), ("fcprojw", L * C * H), ("lnfw", C),
             ("lm_head", 0 if tied else Vp * C)]
    out, at = {}, 0
    for name, n in sizes:
        out[name] = body[at:at + n]
        at += n
    assert at == body.size, f"{path}: body of {body.size} values, expected {at}"
    return out, dict(V=V, L=L, NH=NH, NKV=NKV, C=C, H=H, HS=HS, tied=tied)


def expected_from_model_bin(path):
    """Our model file's tensors under Hugging Face's names, q/k in rotate-half order."""
    t, s = read_model_bin(path)
    V, L, NH, NKV, C, H, HS = (s[k] for k in ("V", "L", "NH", "NKV", "C", "H", "HS"))
    qkv_rows = (NH + 2 * NKV) * HS
    out = {"model.embed_tokens.weight": t["wte"].reshape(-1, C)[:V], "model.norm.weight": t["lnfw"]}
    if not s["tied"]:
        out["lm_head.weight"] = t["lm_head"].reshape(-1, C)[:V]
    for l in range(L):
        p = f"model.layers.{l}."
        qkv = t["qkvw"].reshape(L, qkv_rows, C)[l]
        out[p + "self_attn.q_proj.weight"] = to_rotate_half(qkv[:NH * HS], NH)
        out[p + "self_attn.k_proj.weight"] = to_rotate_half(qkv[NH * HS:(NH + NKV) * HS], NKV)
        out[p + "self_attn.v_proj.weight"] = qkv[(NH + NKV) * HS:]
        out[p + "self_attn.o_proj.weight"] = t["attprojw"].reshape(L, C, C)[l]
        out[p + "input_layernorm.weight"] = t["ln1w"].reshape(L, C)[l]
        out[p + "post_attention_layernorm.weight"] = t["ln2w"].reshape(L, C)[l]
        out[p + "mlp.gate_proj.weight"] = t["fcw"].reshape(L, H, C)[l]
        out[p + "mlp.up_proj.weight"] = t["fc2w"].reshape(L, H, C)[l]
        out[p + "mlp.down_proj.weight"] = t["fcprojw"].reshape(L, C, H)[l]
    return out


def rope_inv_freq(cfg, HS):
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, HS, 2, dtype=torch.float32) / HS))
    s = cfg.get("rope_scaling")
    if not s:
        return inv
    factor, low, high, orig = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (orig / wavelen - low) / (high - low)
    mid = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(wavelen > orig / low, inv / factor, torch.where(wavelen < orig / high, inv, mid))


def forward_loss(cfg, w, tokens):
    """Mean next-token loss of tokens (B, T+1) by Hugging Face's Llama arithmetic, in float64."""
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    HS, eps = C // NH, cfg.get("rms_norm_eps", 1e-6)
    W = {k: torch.from_numpy(np.array(v, np.float64)) for k, v in w.items()}
    x_ids, y = torch.from_numpy(tokens[:, :-1]), torch.from_numpy(tokens[:, 1:])
    B, T = x_ids.shape

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    freqs = torch.outer(torch.arange(T, dtype=torch.float32), rope_inv_freq(cfg, HS)).double()
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()

    def rotate(t):  # (B, heads, T, HS)
        half = torch.cat([-t[..., HS // 2:], t[..., :HS // 2]], -1)
        return t * cos + half * sin

    x = W["model.embed_tokens.weight"][x_ids]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HS).transpose(1, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(B, T, NKV, HS).transpose(1, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(B, T, NKV, HS).transpose(1, 2)
        q, k = rotate(q), rotate(k)
        k, v = (t.repeat_interleave(NH // NKV, dim=1) for t in (k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, C) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    logits = rms(x, W["model.norm.weight"]) @ head.T
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), y.reshape(-1)).item()


def shard_tokens(path, count):
    raw = open(path, "rb").read()
    h = np.frombuffer(raw, np.int32, HEADER_INTS)
    return np.frombuffer(raw, np.uint16, int(h[2]), HEADER_INTS * 4)[:count].astype(np.int64)


def cmd_check(a):
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    tensors, tags, problems = read_dir(a.dir)
    expected = hf_names(cfg)
    want_tag = {"float32": "F32", "bfloat16": "BF16"}[cfg["torch_dtype"]]
    if sorted(n for n, _, _ in expected) != sorted(tensors):
        problems.append(f"tensor names differ: missing {sorted(set(n for n, _, _ in expected) - set(tensors))}, "
                        f"extra {sorted(set(tensors) - set(n for n, _, _ in expected))}")
    for name, shape, _ in expected:
        if name in tensors and list(tensors[name].shape) != shape:
            problems.append(f"{name}: shape {list(tensors[name].shape)}, expected {shape}")
        if name in tags and tags[name] != want_tag:
            problems.append(f"{name}: dtype {tags[name]}, config.json's torch_dtype says {want_tag}")
    if a.model_bin:
        for name, value in expected_from_model_bin(a.model_bin).items():
            if name in tensors and not np.array_equal(tensors[name], value.reshape(tensors[name].shape)):
                problems.append(f"{name}: values differ from {a.model_bin}'s (q/k rotate-half order?)")
    if a.data:
        n = a.batch * a.seq_len + 1
        flat = shard_tokens(a.data, n)
        tokens = np.stack([flat[b * a.seq_len:(b + 1) * a.seq_len + 1] for b in range(a.batch)])
        loss = forward_loss(cfg, tensors, tokens)
        rel = abs(loss - a.loss) / abs(a.loss)
        print(f"loss here {loss:.6f}, train_gpt {a.loss:.6f} (relative {rel:.1e})")
        if rel > a.tolerance:
            problems.append(f"forward loss {loss:.6f} differs from train_gpt's {a.loss:.6f} (relative {rel:.1e})")
        try:
            import transformers  # noqa: F401  (absent on Debian; present on the GPU machine)
        except ImportError:
            print("transformers not importable: LlamaForCausalLM check skipped")
        else:
            model = transformers.LlamaForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
            with torch.no_grad():
                out = model(torch.from_numpy(tokens[:, :-1]), labels=torch.from_numpy(tokens[:, 1:]).contiguous())
            hf_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).double(),
                                                        torch.from_numpy(tokens[:, 1:]).reshape(-1)).item()
            print(f"transformers LlamaForCausalLM loss {hf_loss:.6f}")
            if abs(hf_loss - a.loss) / abs(a.loss) > a.tolerance:
                problems.append(f"transformers' loss {hf_loss:.6f} differs from train_gpt's {a.loss:.6f}")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


def cmd_edit(a):
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    for item in a.set:
        key, value = item.split("=", 1)
        cfg[key] = json.loads(value)
    tensors, tags, _ = read_dir(a.src)
    dtype = "bf16" if "BF16" in tags.values() else "fp32"
    named = [(n, f32_to_bf16(v) if dtype == "bf16" else v) for n, v in tensors.items() if n not in a.drop]
    os.makedirs(a.dst)
    write_json(os.path.join(a.dst, "config.json"), cfg)
    if a.shards == 1:
        write_safetensors(os.path.join(a.dst, "model.safetensors"), named, dtype, {"format": "pt"})
        return 0
    per = math.ceil(len(named) / a.shards)
    weight_map = {}
    for k in range(a.shards):
        file = f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors"
        part = named[k * per:(k + 1) * per]
        write_safetensors(os.path.join(a.dst, file), part, dtype, {"format": "pt"})
        weight_map.update({n: file for n, _ in part})
    write_json(os.path.join(a.dst, "model.safetensors.index.json"), {"metadata": {}, "weight_map": weight_map})
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    for flag, default in (("vocab", 512), ("layers", 2), ("heads", 4), ("kv-heads", 2), ("channels", 64),
                          ("hidden", 96), ("max-seq-len", 64), ("seed", 1)):
        m.add_argument("--" + flag, type=int, default=default)
    m.add_argument("--tied", action="store_true")
    m.add_argument("--rope-scaling", action="store_true")
    m.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    e = sub.add_parser("edit")
    e.add_argument("src")
    e.add_argument("dst")
    e.add_argument("--set", action="append", default=[])
    e.add_argument("--drop", action="append", default=[])
    e.add_argument("--shards", type=int, default=1)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--model-bin")
    c.add_argument("--data")
    c.add_argument("--batch", type=int, default=2)
    c.add_argument("--seq-len", type=int, default=32)
    c.add_argument("--loss", type=float)
    c.add_argument("--tolerance", type=float, default=1e-5)
    a = ap.parse_args()
    if a.cmd == "make":
        return cmd_make(a) or 0
    return cmd_check(a) if a.cmd == "check" else cmd_edit(a)


if __name__ == "__main__":
    sys.exit(main())
