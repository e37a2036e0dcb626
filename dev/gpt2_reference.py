#!/usr/bin/python3
"""PyTorch reference for train_gpt: GPT-2 forward, backward and AdamW steps.

Writes an initial model, a token shard and the values train_gpt must reproduce
(step-1 logits, loss and gradients; per-step losses and gradient norms; the
parameters after K steps). The tests run train_gpt on the same model and shard
and compare.

Runs only under Debian's python3-torch:  /usr/bin/python3 dev/gpt2_reference.py --out DIR
See dev/README.md for the CLI and the layout of reference.bin.

--device cuda runs the training on the GPU (fp32 matmuls without TF32); the initial weights and
tokens are drawn on the CPU either way, and --self-check always runs on the CPU.

Precision: --precision fp32 (default) computes everything in float32, as
train_gpt's fp32 mode does, except that the gradient norm is accumulated in
float64 so the reference value itself carries no summation-order noise.
--precision fp64 computes everything in float64 (for extra-tight checks); the
outputs are still written as float32. Both modes start from the same fp32
initial weights that model.bin holds.
"""

import argparse
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_common as common  # noqa: E402  (tokens, the training step, the file writers, the CLI; checks torch)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MODEL_MAGIC, MODEL_VERSION_FP32 = 20240326, 3
REFERENCE_VERSION = 1
LN_EPS = 1e-5

PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# Only matrices are weight-decayed, never biases or LayerNorm parameters.
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def param_shapes(cfg):
    L, C, Vp, maxT = cfg.layers, cfg.channels, cfg.padded_vocab, cfg.max_seq_len
    return {
        "wte": (Vp, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


def read_model_file(path):
    """An fp32 (version 3) GPT-2 model file as (cfg, {name: tensor}) in param_shapes' layout."""
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    if h[0] != MODEL_MAGIC or h[1] != MODEL_VERSION_FP32:
        raise ValueError(f"{path}: expected an fp32 GPT-2 model file (magic {MODEL_MAGIC}, version 3)")
    cfg = argparse.Namespace(max_seq_len=h[2], vocab=h[3], layers=h[4], heads=h[5], channels=h[6], padded_vocab=h[7])
    body = torch.frombuffer(bytearray(raw[1024:]), dtype=torch.float32)
    params, at = {}, 0
    for name, shape in param_shapes(cfg).items():
        n = math.prod(shape)
        params[name] = body[at:at + n].view(shape)
        at += n
    if at != body.numel():
        raise ValueError(f"{path}: {body.numel()} values in the body, the header describes {at}")
    return cfg, params


def init_params(cfg):
    """Initial weights in fp32, drawn in llm.c tensor order from one seeded generator."""
    gen = torch.Generator().manual_seed(cfg.seed)
    shapes = param_shapes(cfg)

    def normal(name, std):
        return torch.randn(shapes[name], generator=gen, dtype=torch.float32) * std

    params = {}
    for name in PARAM_NAMES:
        shape = shapes[name]
        if name in ("ln1w", "ln2w", "lnfw"):
            params[name] = 1.0 + normal(name, 0.1) if cfg.perturb_ln else torch.ones(shape)
        elif name in ("ln1b", "ln2b", "lnfb"):
            params[name] = normal(name, 0.1) if cfg.perturb_ln else torch.zeros(shape)
        elif name in ("qkvb", "attprojb", "fcb", "fcprojb"):
            params[name] = normal(name, 0.02) if cfg.perturb_biases else torch.zeros(shape)
        elif name in ("attprojw", "fcprojw"):
            # Residual-branch output projections are scaled down by depth (GPT-2).
            params[name] = normal(name, 0.02 / math.sqrt(2 * cfg.layers))
        else:
            params[name] = normal(name, 0.02)
    params["wte"][cfg.vocab:] = 0.0
    return params


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def causal_self_attention(x, qkvw, qkvb, projw, projb, n_head):
    B, T, C = x.shape
    HS = C // n_head
    qkv = x @ qkvw.t() + qkvb
    # Columns [0:C] are q, [C:2C] k, [2C:3C] v; head h owns channels h*HS:(h+1)*HS of each.
    q, k, v = (qkv[..., i * C:(i + 1) * C].view(B, T, n_head, HS).transpose(1, 2) for i in range(3))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
    future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    y = (probs @ v).transpose(1, 2).reshape(B, T, C)
    return y @ projw.t() + projb


def forward(params, inputs, targets, cfg):
    """Returns (logits over the padded vocab, mean cross-entropy over the first V columns)."""
    logits = model_logits(params, inputs, cfg)
    B, T = inputs.shape
    loss = F.cross_entropy(logits[..., :cfg.vocab].reshape(B * T, cfg.vocab), targets.reshape(B * T))
    return logits, loss


def model_logits(params, inputs, cfg):
    """Logits over the padded vocab at every position of inputs (B, T)."""
    p = params
    B, T = inputs.shape
    C = cfg.channels
    x = p["wte"][inputs] + p["wpe"][:T]
    for layer in range(cfg.layers):
        h = F.layer_norm(x, (C,), p["ln1w"][layer], p["ln1b"][layer], LN_EPS)
        x = x + causal_self_attention(h, p["qkvw"][layer], p["qkvb"][layer],
                                      p["attprojw"][layer], p["attprojb"][layer], cfg.heads)
        h = F.layer_norm(x, (C,), p["ln2w"][layer], p["ln2b"][layer], LN_EPS)
        h = gelu_tanh(h @ p["fcw"][layer].t() + p["fcb"][layer])
        x = x + h @ p["fcprojw"][layer].t() + p["fcprojb"][layer]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], LN_EPS)
    return x @ p["wte"].t()


GRAPH = common.Graph(PARAM_NAMES, DECAYED, forward)


def greedy_decode(initial, tokens, cfg):
    """Greedy decoding by full recomputation (no cache) in float64 from the initial weights: the
    first --prompt-tokens tokens of the shard, then --generate-tokens tokens, each the argmax
    (lowest id on ties) of the last position's logits over the first V columns."""
    params = {name: t.double() for name, t in initial.items()}
    sequence = [int(t) for t in tokens[:cfg.prompt_tokens]]
    generated, step_logits = [], []
    with torch.no_grad():
        for _ in range(cfg.generate_tokens):
            logits = model_logits(params, torch.tensor([sequence]), cfg)[0, -1, :cfg.vocab]
            token = int(torch.argmax(logits))
            generated.append(token)
            step_logits.append([float(x) for x in logits])
            sequence.append(token)
    return {"prompt": [int(t) for t in tokens[:cfg.prompt_tokens]], "tokens": generated, "logits": step_logits}


def self_check(initial, tokens, cfg):
    """fp64 checks that the graph and the optimizer are what this file claims.

    1. Central finite differences of the step-1 loss against autograd, for one
       entry of every tensor (plus a padded wte row, whose gradient must be 0).
    2. The hand-written AdamW step against torch.optim.AdamW (same formula).
    """
    padded_row = [("wte", cfg.vocab * cfg.channels)] if cfg.padded_vocab > cfg.vocab else []
    worst, params, grads = common.finite_differences(initial, tokens, cfg, GRAPH, padded_row)
    fd_ok = worst < 1e-5

    # Clip-free single step through both optimizers, from the same gradients.
    mine = {name: t.detach().clone() for name, t in params.items()}
    m = {name: torch.zeros_like(t) for name, t in mine.items()}
    v = {name: torch.zeros_like(t) for name, t in mine.items()}
    common.adamw_update(mine, grads, m, v, 1, cfg, GRAPH)
    theirs = {name: t.detach().clone().requires_grad_(True) for name, t in params.items()}
    groups = [{"params": [theirs[n] for n in PARAM_NAMES if n in DECAYED], "weight_decay": cfg.weight_decay},
              {"params": [theirs[n] for n in PARAM_NAMES if n not in DECAYED], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    for name in PARAM_NAMES:
        theirs[name].grad = grads[name].clone()
    optimizer.step()
    adam_diff = max(float((mine[n] - theirs[n].detach()).abs().max()) for n in PARAM_NAMES)
    adam_ok = adam_diff < 1e-12
    print(f"self-check: finite differences worst err {worst:.1e} ({'ok' if fd_ok else 'FAIL'}); "
          f"AdamW vs torch.optim.AdamW max abs diff {adam_diff:.1e} ({'ok' if adam_ok else 'FAIL'})")
    return fd_ok and adam_ok


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_size_args(ap, vocab=500, padded_vocab_help="default: vocab rounded up to 128", seq_len=32, steps=10)
    common.add_training_args(ap)
    ap.add_argument("--perturb-ln", action=argparse.BooleanOptionalAction, default=True,
                    help="LayerNorm w = 1 + 0.1 N(0,1), b = 0.1 N(0,1) instead of 1 / 0")
    ap.add_argument("--perturb-biases", action=argparse.BooleanOptionalAction, default=True,
                    help="linear biases 0.02 N(0,1) instead of 0")
    ap.add_argument("--prompt-tokens", type=int, default=8, help="generate.json: prompt length (shard tokens)")
    ap.add_argument("--generate-tokens", type=int, default=12, help="generate.json: greedy tokens after the prompt")
    ap.add_argument("--device", default="cpu", help="torch device for the training, e.g. cuda (default: cpu)")
    ap.add_argument("--self-check", action="store_true",
                    help="also verify gradients by finite differences and AdamW against torch (fp64)")
    cfg = ap.parse_args(argv)
    if cfg.padded_vocab is None:
        cfg.padded_vocab = (cfg.vocab + 127) // 128 * 128

    def own_problems(cfg):
        problems = []
        if cfg.channels % cfg.heads:
            problems.append(f"--channels {cfg.channels} must be a multiple of --heads {cfg.heads}")
        if cfg.prompt_tokens < 1 or cfg.generate_tokens < 1 or cfg.prompt_tokens + cfg.generate_tokens > cfg.max_seq_len:
            problems.append("--prompt-tokens and --generate-tokens must be >= 1, their sum at most --max-seq-len")
        return problems

    return common.check_args(ap, cfg, ("layers", "heads", "channels", "vocab", "max_seq_len", "batch", "seq_len",
                                       "steps"), own_problems)


def main(argv):
    cfg = parse_args(argv)
    dtype = common.torch_setup(cfg)
    initial = init_params(cfg)
    model_header = common.header([MODEL_MAGIC, MODEL_VERSION_FP32, cfg.max_seq_len, cfg.vocab, cfg.layers,
                                  cfg.heads, cfg.channels, cfg.padded_vocab])

    def write_generate(tokens):
        with open(os.path.join(cfg.out, "generate.json"), "w") as f:
            json.dump(greedy_decode(initial, tokens, cfg), f)
            f.write("\n")

    describe = (f"gpt2_reference: {cfg.out}: L={cfg.layers} NH={cfg.heads} C={cfg.channels} V={cfg.vocab} "
                f"Vp={cfg.padded_vocab} maxT={cfg.max_seq_len} B={cfg.batch} T={cfg.seq_len} K={cfg.steps} "
                f"{cfg.precision}")
    return common.run(cfg, dtype, GRAPH, initial, model_header,
                      lambda count: common.reference_header(cfg, REFERENCE_VERSION, count), describe, self_check,
                      cfg.device, write_generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
