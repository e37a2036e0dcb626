#!/usr/bin/python3
"""PyTorch reference for train_gpt: Llama 3 forward, backward and AdamW steps.

The Llama counterpart of dev/gpt2_reference.py (same CLI shape, same outputs, same training
conventions): writes an initial model in train_gpt's Llama 3 model file format, a token shard
and the values train_gpt must reproduce (step-1 logits, loss and gradients; per-step losses and
gradient norms; the parameters after K steps). test/model/test_llama.cu compares.

The arithmetic follows Meta's llama model.py (facts only; written here from its description):
RMSNorm normalizes x in fp32, casts to the storage type, then multiplies by the weight (eps
1e-5); RoPE rotates adjacent pairs (2i, 2i+1) of each q and k head by e^{i·p·f_i}, f_i =
θ^(-2i/HS), with Llama 3.1's frequency scaling (3.2: factor 32); grouped-query attention, query
head h reading K/V head h // (NH/NKV) (here by expanding K and V per group, as model.py does);
the MLP is w2(silu(w1 x) * w3 x); no biases; the lm head is wte (tied) or its own matrix.

Runs only under Debian's python3-torch:  /usr/bin/python3 dev/llama_reference.py --out DIR
See dev/README.md for the CLI and the layout of reference.bin.
"""

import argparse
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_common as common  # noqa: E402  (tokens, the training step, the file writers, the CLI; checks torch)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

LLAMA_MODEL_MAGIC, MODEL_VERSION_FP32 = 20240803, 3
LLAMA_EXTENSION_SLOT = 16
REFERENCE_VERSION = 2  # version 2: the Llama header below

# train_gpt's parameter layout for Llama (the tensors it has), in file order.
ALL_NAMES = ["wte", "ln1w", "qkvw", "attprojw", "ln2w", "fcw", "fc2w", "fcprojw", "lnfw", "lm_head"]
DECAYED = {"wte", "qkvw", "attprojw", "fcw", "fc2w", "fcprojw", "lm_head"}
ROPE_FACTORS = {"3.1": 8.0, "3.2": 32.0}  # Llama 3.1 / 3.2 scaling factor; low 1, high 4


def llama_hidden_size(channels, ffn_dim_multiplier, multiple_of):
    hidden = int(2 * 4 * channels / 3)
    hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def param_names(cfg):
    return [n for n in ALL_NAMES if n != "lm_head" or not cfg.tied]


def param_shapes(cfg):
    L, C, Vp, H, HS = cfg.layers, cfg.channels, cfg.padded_vocab, cfg.hidden, cfg.channels // cfg.heads
    qkv = (cfg.heads + 2 * cfg.kv_heads) * HS
    return {"wte": (Vp, C), "ln1w": (L, C), "qkvw": (L, qkv, C), "attprojw": (L, C, C), "ln2w": (L, C),
            "fcw": (L, H, C), "fc2w": (L, H, C), "fcprojw": (L, C, H), "lnfw": (C,), "lm_head": (Vp, C)}


def init_params(cfg, shapes=None):
    """Initial fp32 weights, drawn in layout order from one seeded generator: GPT-2's scheme
    (weights N(0, 0.02), wo and w2 N(0, 0.02/sqrt(2L)), padded vocabulary rows 0) except qkvw,
    N(0, --qkv-std), so that the attention scores vary and RoPE's rotation shows; with
    --perturb-norms the RMSNorm weights are 1 + 0.1·N(0,1) so their gradients matter. shapes:
    other shapes for the same names (mixtral_reference.py's experts), drawn the same way."""
    gen = torch.Generator().manual_seed(cfg.seed)
    shapes = shapes or param_shapes(cfg)
    params = {}
    for name in param_names(cfg):
        noise = torch.randn(shapes[name], generator=gen, dtype=torch.float32)
        if name in ("ln1w", "ln2w", "lnfw"):
            params[name] = 1.0 + 0.1 * noise if cfg.perturb_norms else torch.ones(shapes[name])
        elif name == "qkvw":
            params[name] = noise * cfg.qkv_std
        elif name in ("attprojw", "fcprojw"):
            params[name] = noise * (0.02 / math.sqrt(2 * cfg.layers))
        else:
            params[name] = noise * 0.02
    for name in ("wte", "lm_head"):
        if name in params:
            params[name][cfg.vocab:] = 0.0
    return params


def rope_frequencies(cfg, dtype):
    """The HS/2 frequencies, fp32 step by step as model.py forms them, then Llama 3.1's scaling."""
    HS = cfg.channels // cfg.heads
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, HS, 2)[: HS // 2].float() / HS))
    if cfg.rope != "none":
        factor, low, high, context = ROPE_FACTORS[cfg.rope], 1.0, 4.0, cfg.original_context
        scaled = []
        for f in freqs.tolist():
            wavelength = 2 * math.pi / f
            if wavelength < context / high:
                scaled.append(f)
            elif wavelength > context / low:
                scaled.append(f / factor)
            else:
                smooth = (context / wavelength - low) / (high - low)
                scaled.append((1 - smooth) * f / factor + smooth * f)
        freqs = torch.tensor(scaled, dtype=torch.float32)
    return freqs.to(dtype)


def rope_cos_sin(cfg, T, dtype):
    angles = torch.outer(torch.arange(T).float(), rope_frequencies(cfg, torch.float32)).to(dtype)  # (T, HS/2)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """x (B, T, heads, HS): pair (2i, 2i+1) is x[2i] + i·x[2i+1], multiplied by cos + i·sin."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([re * c - im * s, re * s + im * c], dim=-1).flatten(-2)


def wide(x):
    """model.py's x.float(): at least fp32 (fp64 stays fp64 for --precision fp64 and the self-check)."""
    return x if x.dtype == torch.float64 else x.float()


def rms_norm(x, weight, eps):
    normed = wide(x) * torch.rsqrt(wide(x).pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def attention(x, wqkv, wo, cfg, cos, sin):
    B, T, C = x.shape
    NH, NKV = cfg.heads, cfg.kv_heads
    HS = C // NH
    qkv = x @ wqkv.t()  # rows of wqkv: [wq; wk; wv]
    q = qkv[..., :C].view(B, T, NH, HS)
    k = qkv[..., C:C + NKV * HS].view(B, T, NKV, HS)
    v = qkv[..., C + NKV * HS:].view(B, T, NKV, HS)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    group = NH // NKV  # each K/V head serves `group` consecutive query heads
    k = k[:, :, :, None, :].expand(B, T, NKV, group, HS).reshape(B, T, NH, HS)
    v = v[:, :, :, None, :].expand(B, T, NKV, group, HS).reshape(B, T, NH, HS)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    probs = torch.softmax(wide(scores.masked_fill(future, float("-inf"))), dim=-1).type_as(q)
    y = (probs @ v).transpose(1, 2).reshape(B, T, C)
    return y @ wo.t()


def swiglu(h, w1, w3, w2):
    return (F.silu(h @ w1.t()) * (h @ w3.t())) @ w2.t()


def dense_mlp(h, params, layer, cfg):
    return swiglu(h, params["fcw"][layer], params["fc2w"][layer], params["fcprojw"][layer])


def model_logits(params, inputs, cfg, mlp=dense_mlp):
    """The logits over the padded vocabulary; mlp(ln2 output, params, layer, cfg) is each block's MLP."""
    p = params
    T = inputs.shape[1]
    cos, sin = rope_cos_sin(cfg, T, p["wte"].dtype)
    x = p["wte"][inputs]
    for layer in range(cfg.layers):
        x = x + attention(rms_norm(x, p["ln1w"][layer], cfg.norm_eps), p["qkvw"][layer], p["attprojw"][layer],
                          cfg, cos, sin)
        x = x + mlp(rms_norm(x, p["ln2w"][layer], cfg.norm_eps), p, layer, cfg)
    x = rms_norm(x, p["lnfw"], cfg.norm_eps)
    return x @ p["wte" if cfg.tied else "lm_head"].t()


def cross_entropy(logits, targets, cfg):
    """Mean cross-entropy over B·T positions of the first V columns (the padded ones never count)."""
    return F.cross_entropy(logits[..., :cfg.vocab].reshape(-1, cfg.vocab), targets.reshape(-1))


def forward(params, inputs, targets, cfg):
    logits = model_logits(params, inputs, cfg)
    return logits, cross_entropy(logits, targets, cfg)


def graph(cfg):
    return common.Graph(param_names(cfg), DECAYED, forward)


def float_bits(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


def model_header(cfg):
    """llm.c's Llama 3 header (magic 20240803) with train_gpt's extension (docs/FORMATS.md)."""
    scaled = cfg.rope != "none"
    factor = ROPE_FACTORS.get(cfg.rope, 0.0)
    h = common.header([LLAMA_MODEL_MAGIC, MODEL_VERSION_FP32, cfg.max_seq_len, cfg.vocab, cfg.layers, cfg.heads,
                     cfg.kv_heads, cfg.channels])
    h[11] = int(cfg.rope_theta)
    h[12] = 1 if scaled else 0
    h[14], h[15] = 3, 2 if factor == 32.0 else 1
    h[LLAMA_EXTENSION_SLOT] = 1
    h[17], h[18], h[19] = cfg.padded_vocab, cfg.hidden, 1 if cfg.tied else 0
    h[20] = cfg.original_context if scaled else 0
    h[21] = float_bits(cfg.norm_eps)
    h[22] = float_bits(cfg.rope_theta)
    h[23] = float_bits(factor)
    h[24] = float_bits(1.0 if scaled else 0.0)
    h[25] = float_bits(4.0 if scaled else 0.0)
    return h


def reference_header(cfg, num_params, version=REFERENCE_VERSION):
    """Version 2: version 1's fields, then the Llama shape and the float32 bits of θ, the factor and eps
    (mixtral_reference.py's version 3 adds its own after them)."""
    h = common.reference_header(cfg, version, num_params,
                                [cfg.kv_heads, cfg.hidden, 1 if cfg.tied else 0, 1 if cfg.rope != "none" else 0,
                                 cfg.original_context])
    h[17], h[18], h[19] = float_bits(cfg.rope_theta), float_bits(ROPE_FACTORS.get(cfg.rope, 0.0)), float_bits(cfg.norm_eps)
    return h


def self_check(initial, tokens, cfg):
    """fp64: central finite differences of the step-1 loss against autograd, one entry of every tensor."""
    worst = common.finite_differences(initial, tokens, cfg, graph(cfg))[0]
    ok = worst < 1e-5
    print(f"self-check: finite differences worst err {worst:.1e} ({'ok' if ok else 'FAIL'})")
    return ok


def parse_args(argv, description=__doc__.split("\n")[0], own_sizes=(), own_flags=None, own_problems=None):
    """Llama's flags and checks; a script that extends it (mixtral_reference.py) adds own_sizes (as
    common.add_size_args's own), own_flags(ap) at the end and own_problems(cfg) to the checks."""
    ap = argparse.ArgumentParser(description=description)
    own_sizes = [("--heads", "--kv-heads", dict(type=int, default=2)),
                 ("--channels", "--hidden",
                  dict(type=int, default=None, help="MLP width H (default: Llama's rule, multiple_of 32)")),
                 *own_sizes]
    common.add_size_args(ap, vocab=250, padded_vocab_help="default: vocab rounded up to 8", seq_len=37, steps=8,
                         own=own_sizes)
    ap.add_argument("--tied", action=argparse.BooleanOptionalAction, default=False,
                    help="the lm head is wte (Llama 3.2) instead of its own lm_head (3.1)")
    ap.add_argument("--rope", choices=["none", "3.1", "3.2"], default="3.1",
                    help="RoPE frequency scaling: none, Llama 3.1's (factor 8) or 3.2's (factor 32)")
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--original-context", type=int, default=64,
                    help="the scaling's original context (Meta: 8192; small so it bends this head size's frequencies)")
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    common.add_training_args(ap)
    ap.add_argument("--perturb-norms", action=argparse.BooleanOptionalAction, default=True,
                    help="RMSNorm weights 1 + 0.1 N(0,1) instead of 1")
    ap.add_argument("--qkv-std", type=float, default=0.08,
                    help="qkvw's initial std (GPT-2's 0.02 leaves attention nearly uniform, blind to RoPE)")
    ap.add_argument("--self-check", action="store_true", help="also verify gradients by finite differences (fp64)")
    if own_flags:
        own_flags(ap)
    cfg = ap.parse_args(argv)
    if cfg.padded_vocab is None:
        cfg.padded_vocab = (cfg.vocab + 7) // 8 * 8
    if cfg.hidden is None:
        cfg.hidden = llama_hidden_size(cfg.channels, 1.0, 32)

    def llama_problems(cfg):
        problems = own_problems(cfg) if own_problems else []
        if cfg.channels % cfg.heads or (cfg.channels // cfg.heads) % 2:
            problems.append(f"--channels {cfg.channels} must be --heads {cfg.heads} times an even head size")
        if cfg.heads % cfg.kv_heads:
            problems.append(f"--heads {cfg.heads} must be a multiple of --kv-heads {cfg.kv_heads}")
        if cfg.rope_theta != int(cfg.rope_theta):
            problems.append("--rope-theta must be a whole number (llm.c's header slot is an int)")
        return problems

    return common.check_args(ap, cfg, ("layers", "heads", "kv_heads", "channels", "hidden", "vocab", "max_seq_len",
                                       "batch", "seq_len", "steps"), llama_problems)


def assert_rope_bends(cfg):
    if cfg.rope != "none":
        # The scaling must bend this head size's frequencies, or the test could not tell 3.1 from
        # 3.2 from none: some frequency kept, some divided by the factor, some smoothly between.
        plain = rope_frequencies(argparse.Namespace(**{**vars(cfg), "rope": "none"}), torch.float64)
        ratio = (plain / rope_frequencies(cfg, torch.float64)).tolist()
        factor = ROPE_FACTORS[cfg.rope]
        kinds = {"kept" if abs(r - 1) < 1e-6 else "divided" if abs(r - factor) < 1e-4 else "smooth" for r in ratio}
        assert kinds == {"kept", "divided", "smooth"}, f"RoPE scaling leaves {kinds} at this shape: pick --original-context"


def main(argv):
    cfg = parse_args(argv)
    dtype = common.torch_setup(cfg)
    assert_rope_bends(cfg)
    describe = (f"llama_reference: {cfg.out}: L={cfg.layers} NH={cfg.heads} NKV={cfg.kv_heads} C={cfg.channels} "
                f"H={cfg.hidden} V={cfg.vocab} Vp={cfg.padded_vocab} B={cfg.batch} T={cfg.seq_len} K={cfg.steps} "
                f"rope {cfg.rope} {'tied' if cfg.tied else 'untied'} {cfg.precision}")
    return common.run(cfg, dtype, graph(cfg), init_params(cfg), model_header(cfg),
                      lambda count: reference_header(cfg, count), describe, self_check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
