#!/usr/bin/python3
"""hf_llama_check.py — Hugging Face Llama and Mixtral directories for the tests, written from the
safetensors format and transformers' Llama and Mixtral conventions, independently of train_gpt's C++:

  make DIR [--vocab V --layers L --heads NH --kv-heads NKV --channels C --hidden H --max-seq-len T
            --seed S --tied --dtype fp32|bf16 --rope-scaling --experts E --top-k K --aux-loss-coef X]
  make DIR --model-bin FILE [--dtype fp32|bf16]
      a random tiny LlamaForCausalLM directory (config.json, model.safetensors); with --experts E > 0
      a MixtralForCausalLM (E experts per block, K per token, router_aux_loss_coef X); with
      --model-bin, the directory of a train_gpt model file's weights (Llama or mixture of experts)
  edit SRC DST [--set KEY=JSON ...] [--drop TENSOR ...] [--shards N]
      SRC copied to DST with config.json keys replaced, tensors dropped, the tensors split over N
      model-0000K-of-0000N.safetensors files with model.safetensors.index.json
  check DIR [--model-bin FILE] [--data SHARD --batch B --seq-len T --loss X [--tolerance R] [--with-aux]]
      DIR's names, shapes, dtypes and header padding; with --model-bin, every tensor equals the
      train_gpt model file's (q_proj/k_proj rows in Hugging Face's rotate-half order; a mixture's
      experts, E, K and aux coefficient too); with --data, the mean loss of the shard's first B x T
      tokens by a forward pass written here (RMSNorm, rotate-half RoPE with Llama 3 scaling, GQA,
      SwiGLU or Mixtral's experts) equals X within R relative: the cross-entropy (train_gpt's
      validation loss), or with --with-aux cross-entropy + router_aux_loss_coef · the load-balancing
      loss; where transformers is importable, {Llama,Mixtral}ForCausalLM.from_pretrained(DIR) gives it too.

Exit 0 when every check holds, 1 with a line per failure. torch, numpy and the standard library only.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_gpt2 import read_safetensors, write_json, write_safetensors  # noqa: E402  (format helpers only)

LLAMA_MODEL_MAGIC = 20240803
HEADER_INTS = 256
SHARD_IDS = {20240520: np.uint16, 20240801: np.uint32}  # GPT-2's and Llama 3's token shards
# The model file's mixture-of-experts slots (docs/FORMATS.md): E, K, router kind, aux coefficient bits.
EXPERTS_SLOT, TOP_K_SLOT, ROUTER_KIND_SLOT, AUX_COEF_SLOT = 26, 27, 28, 29


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """Round to nearest even, as torch does."""
    return torch.from_numpy(np.ascontiguousarray(values, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def hf_names(cfg):
    """(name, shape, permuted heads) of every tensor a LlamaForCausalLM of cfg holds."""
    C, V, H, NH = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    NKV, HS = cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    E = experts(cfg)
    out = [("model.embed_tokens.weight", [V, C], 0)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", [C], 0), (p + "self_attn.q_proj.weight", [NH * HS, C], NH),
                (p + "self_attn.k_proj.weight", [NKV * HS, C], NKV), (p + "self_attn.v_proj.weight", [NKV * HS, C], 0),
                (p + "self_attn.o_proj.weight", [C, C], 0), (p + "post_attention_layernorm.weight", [C], 0)]
        if E:
            out.append((p + "block_sparse_moe.gate.weight", [E, C], 0))
            for j in range(E):
                out += [(p + f"block_sparse_moe.experts.{j}.w1.weight", [H, C], 0),
                        (p + f"block_sparse_moe.experts.{j}.w2.weight", [C, H], 0),
                        (p + f"block_sparse_moe.experts.{j}.w3.weight", [H, C], 0)]
        else:
            out += [(p + "mlp.gate_proj.weight", [H, C], 0), (p + "mlp.up_proj.weight", [H, C], 0),
                    (p + "mlp.down_proj.weight", [C, H], 0)]
    out.append(("model.norm.weight", [C], 0))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [V, C], 0))
    return out


def experts(cfg):
    """E of a Mixtral config.json, 0 for Llama's."""
    return cfg.get("num_local_experts", 0) if cfg.get("model_type") == "mixtral" else 0


def to_rotate_half(w, heads):
    """transformers' conversion of Meta's q/k: w.view(heads, HS/2, 2, C).transpose(1, 2)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def hf_config(s, dtype):
    """config.json of a LlamaForCausalLM, or with s["E"] > 0 a MixtralForCausalLM (its keys as
    Mixtral's own config.json has them: no attention_bias or mlp_bias), from the shape s."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s["C"],
           "intermediate_size": s["H"], "num_hidden_layers": s["L"], "num_attention_heads": s["NH"],
           "num_key_value_heads": s["NKV"], "vocab_size": s["V"], "max_position_embeddings": s["maxT"],
           "rms_norm_eps": s["eps"], "rope_theta": s["theta"], "tie_word_embeddings": bool(s["tied"]),
           "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
           "torch_dtype": "float32" if dtype == "fp32" else "bfloat16", "rope_scaling": s["rope_scaling"]}
    if s["E"]:
        del cfg["attention_bias"], cfg["mlp_bias"]
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=s["E"],
                   num_experts_per_tok=s["K"], router_aux_loss_coef=s["aux_coef"], output_router_logits=False,
                   router_jitter_noise=0.0, sliding_window=None, attention_dropout=0.0)
    return cfg


def cmd_make(a):
    if a.model_bin:
        named = list(expected_from_model_bin(a.model_bin).items())
        cfg = hf_config(read_model_bin(a.model_bin)[1], a.dtype)
    else:
        rng = np.random.default_rng(a.seed)
        rope_scaling = None
        if a.rope_scaling:  # an original context below the sequence length, so every band of the scaling is used
            rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16}
        cfg = hf_config(dict(C=a.channels, H=a.hidden, L=a.layers, NH=a.heads, NKV=a.kv_heads, V=a.vocab,
                             maxT=a.max_seq_len, eps=1e-5, theta=500000.0, tied=a.tied, rope_scaling=rope_scaling,
                             E=a.experts, K=a.top_k, aux_coef=a.aux_loss_coef), a.dtype)
        named = []
        for name, shape, _ in hf_names(cfg):
            if name.endswith("norm.weight"):
                w = 1.0 + 0.1 * rng.standard_normal(shape)
            else:
                # q and k large enough that attention is far from uniform, so RoPE's order matters to the
                # loss; the router's logits spread, so routing decisions are far from ties
                scale = (0.15 if ("q_proj" in name or "k_proj" in name) else 0.08 if "embed" in name else
                         0.2 if name.endswith("moe.gate.weight") else 0.05)
                w = scale * rng.standard_normal(shape)
            named.append((name, w))
    named = [(name, np.asarray(w, np.float32) if a.dtype == "fp32" else f32_to_bf16(w)) for name, w in named]
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


def float_of(bits):
    """A float32 header slot as the shortest decimal that reads back to it (0.02, not 0.0199999995)."""
    return float(str(np.array([bits], np.int32).view(np.float32)[0]))


def read_model_bin(path):
    """A train_gpt Llama model file (extended header; with slot 26 = E > 0, the mixture of experts) as
    {our tensor name: float32 array} and the shape and settings its header gives."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw, np.int32, HEADER_INTS)
    assert h[0] == LLAMA_MODEL_MAGIC and h[16] == 1, f"{path}: not a train_gpt Llama model file"
    T, V, L, NH, NKV, C, Vp, H, tied = (int(h[i]) for i in (2, 3, 4, 5, 6, 7, 17, 18, 19))
    E, K, router_kind = (int(h[i]) for i in (EXPERTS_SLOT, TOP_K_SLOT, ROUTER_KIND_SLOT))
    HS, width = C // NH, max(E, 1)  # the experts' tensors hold E blocks (the dense MLP one)
    body = np.frombuffer(raw, np.float32 if h[1] == 3 else np.uint16, offset=HEADER_INTS * 4)
    if h[1] != 3:
        body = bf16_to_f32(body)
    sizes = [("wte", Vp * C), ("ln1w", L * C), ("qkvw", L * (NH + 2 * NKV) * HS * C), ("attprojw", L * C * C),
             ("ln2w", L * C), ("router", L * E * C), ("fcw", L * width * H * C), ("fc2w", L * width * H * C),
             ("fcprojw", L * width * C * H), ("expert_bias", L * E if E and router_kind == 1 else 0), ("lnfw", C),
             ("lm_head", 0 if tied else Vp * C)]
    out, at = {}, 0
    for name, n in sizes:
        out[name] = body[at:at + n]
        at += n
    assert at == body.size, f"{path}: body of {body.size} values, expected {at}"
    rope_scaling = None
    if h[12]:
        rope_scaling = {"rope_type": "llama3", "factor": float_of(h[23]), "low_freq_factor": float_of(h[24]),
                        "high_freq_factor": float_of(h[25]), "original_max_position_embeddings": int(h[20])}
    return out, dict(V=V, L=L, NH=NH, NKV=NKV, C=C, H=H, HS=HS, tied=tied, maxT=T, eps=float_of(h[21]),
                     theta=float_of(h[22]), rope_scaling=rope_scaling, E=E, K=K, router_kind=router_kind,
                     aux_coef=float_of(h[AUX_COEF_SLOT]))


def expected_from_model_bin(path):
    """Our model file's tensors under Hugging Face's names, q/k in rotate-half order."""
    t, s = read_model_bin(path)
    V, L, NH, NKV, C, H, HS, E = (s[k] for k in ("V", "L", "NH", "NKV", "C", "H", "HS", "E"))
    assert s["router_kind"] == 0, f"{path}: router kind {s['router_kind']}: Mixtral's is 0 (softmax, top-k)"
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
        if not E:
            out[p + "mlp.gate_proj.weight"] = t["fcw"].reshape(L, H, C)[l]
            out[p + "mlp.up_proj.weight"] = t["fc2w"].reshape(L, H, C)[l]
            out[p + "mlp.down_proj.weight"] = t["fcprojw"].reshape(L, C, H)[l]
            continue
        # Expert j: w1 and w3 rows j·H .. j·H+H-1 of fcw and fc2w, w2 rows j·C .. j·C+C-1 of fcprojw.
        out[p + "block_sparse_moe.gate.weight"] = t["router"].reshape(L, E, C)[l]
        for j in range(E):
            q = p + f"block_sparse_moe.experts.{j}."
            out[q + "w1.weight"] = t["fcw"].reshape(L, E, H, C)[l, j]
            out[q + "w2.weight"] = t["fcprojw"].reshape(L, E, C, H)[l, j]
            out[q + "w3.weight"] = t["fc2w"].reshape(L, E, H, C)[l, j]
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


def mixtral_experts(h, W, p, cfg):
    """MixtralSparseMoeBlock on h (B, T, C): softmax over the E router logits, the K most probable
    experts (equal probabilities: the lower index first), their probabilities renormalised to sum
    1, the weighted sum of their SwiGLU outputs. Returns it, the probabilities and the choices."""
    E, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    x = h.reshape(-1, h.shape[-1])
    probs = (x @ W[p + "block_sparse_moe.gate.weight"].T).softmax(-1)
    top, chosen = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, chosen = top[:, :K], chosen[:, :K]
    weights = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for j in range(E):
        q = p + f"block_sparse_moe.experts.{j}."
        y = (torch.nn.functional.silu(x @ W[q + "w1.weight"].T) * (x @ W[q + "w3.weight"].T)) @ W[q + "w2.weight"].T
        out = out + (weights * (chosen == j)).sum(-1, keepdim=True) * y  # 0 on the rows j does not serve
    return out.view(h.shape), probs, chosen


def load_balancing_loss(probs, chosen, experts):
    """load_balancing_loss_func: every layer's rows pooled; the one-hot choices' mean per k (K, E)
    times the mean probability per expert, summed, times E."""
    probs, chosen = torch.cat(probs), torch.cat(chosen)
    per_k = torch.nn.functional.one_hot(chosen, experts).double().mean(0)
    return experts * (per_k * probs.mean(0)[None]).sum().item()


def forward_loss(cfg, w, tokens):
    """(mean next-token cross-entropy of tokens (B, T+1), Mixtral's load-balancing loss or None) by
    Hugging Face's Llama or Mixtral arithmetic, in float64."""
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
    probs, chosen = [], []
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
        if experts(cfg):
            out, layer_probs, layer_chosen = mixtral_experts(h, W, p, cfg)
            x = x + out
            probs.append(layer_probs)
            chosen.append(layer_chosen)
            continue
        gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    logits = rms(x, W["model.norm.weight"]) @ head.T
    ce = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), y.reshape(-1)).item()
    return ce, (load_balancing_loss(probs, chosen, experts(cfg)) if experts(cfg) else None)


def shard_tokens(path, count):
    """The first count ids of a token shard, GPT-2's (uint16) or Llama 3's (uint32)."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw, np.int32, HEADER_INTS)
    return np.frombuffer(raw, SHARD_IDS[int(h[0])], int(h[2]), HEADER_INTS * 4)[:count].astype(np.int64)


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
        s = read_model_bin(a.model_bin)[1]
        if experts(cfg):
            for key, ours in (("num_local_experts", "E"), ("num_experts_per_tok", "K"), ("router_aux_loss_coef", "aux_coef")):
                if not np.float32(cfg.get(key, -1)) == np.float32(s[ours]):
                    problems.append(f"config.json's {key} {cfg.get(key)} is not {a.model_bin}'s {s[ours]}")
        elif s["E"]:
            problems.append(f"{a.model_bin} has {s['E']} experts per block; config.json's model_type is {cfg.get('model_type')}")
        if not problems:
            for name, value in expected_from_model_bin(a.model_bin).items():
                if name in tensors and not np.array_equal(tensors[name], value.reshape(tensors[name].shape)):
                    problems.append(f"{name}: values differ from {a.model_bin}'s (q/k rotate-half order?)")
    if a.with_aux and not experts(cfg):
        problems.append("--with-aux: config.json is not a Mixtral's (no load-balancing loss)")
    if a.data and not problems:
        n = a.batch * a.seq_len + 1
        flat = shard_tokens(a.data, n)
        tokens = np.stack([flat[b * a.seq_len:(b + 1) * a.seq_len + 1] for b in range(a.batch)])
        ce, aux = forward_loss(cfg, tensors, tokens)
        coef = cfg.get("router_aux_loss_coef", 0.0)
        loss = ce + coef * aux if a.with_aux else ce
        what = f"cross-entropy {ce:.6f} + {coef} x aux {aux:.6f}" if a.with_aux else "cross-entropy"
        if aux is not None and not a.with_aux:
            what += f" (load-balancing loss {aux:.6f}, not included)"
        rel = abs(loss - a.loss) / abs(a.loss)
        print(f"loss here {loss:.6f} ({what}), train_gpt {a.loss:.6f} (relative {rel:.1e})")
        if rel > a.tolerance:
            problems.append(f"forward loss {loss:.6f} differs from train_gpt's {a.loss:.6f} (relative {rel:.1e})")
        try:
            import transformers  # noqa: F401  (absent on Debian; present on the GPU machine)
        except ImportError:
            print("transformers not importable: its from_pretrained check skipped")
        else:
            kind = "MixtralForCausalLM" if experts(cfg) else "LlamaForCausalLM"
            model = getattr(transformers, kind).from_pretrained(a.dir, torch_dtype=torch.float32).eval()
            with torch.no_grad():
                out = model(torch.from_numpy(tokens[:, :-1]), output_router_logits=a.with_aux or None)
            hf_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).double(),
                                                        torch.from_numpy(tokens[:, 1:]).reshape(-1)).item()
            if a.with_aux:
                print(f"transformers {transformers.__version__} {kind}: cross-entropy {hf_loss:.6f}, "
                      f"aux {float(out.aux_loss):.6f}")
                hf_loss += coef * float(out.aux_loss)
            print(f"transformers {transformers.__version__} {kind} loss {hf_loss:.6f}")
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
    m.add_argument("--experts", type=int, default=0, help="E > 0: a MixtralForCausalLM with E experts per block")
    m.add_argument("--top-k", type=int, default=2, help="experts per token (Mixtral's num_experts_per_tok)")
    m.add_argument("--aux-loss-coef", type=float, default=0.02, help="Mixtral's router_aux_loss_coef")
    m.add_argument("--model-bin", help="write this train_gpt model file's weights instead of random ones")
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
    c.add_argument("--with-aux", action="store_true",
                   help="X includes router_aux_loss_coef x the load-balancing loss (default: cross-entropy only)")
    a = ap.parse_args()
    if a.cmd == "make":
        return cmd_make(a) or 0
    return cmd_check(a) if a.cmd == "check" else cmd_edit(a)


if __name__ == "__main__":
    sys.exit(main())
