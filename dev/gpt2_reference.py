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
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("gpt2_reference.py needs Debian's python3-torch: run it with /usr/bin/python3")

MODEL_MAGIC, MODEL_VERSION_FP32 = 20240326, 3
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
REFERENCE_MAGIC, REFERENCE_VERSION = 20261121, 1
HEADER_INTS = 256
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


# --tokens markov: each token has len(MARKOV_SUCCESSOR_PROBS) likely successors, taken with
# these probabilities; with the remaining MARKOV_NOISE the next token is uniformly random.
MARKOV_SUCCESSOR_PROBS = (0.6, 0.25, 0.1)
MARKOV_NOISE = 1.0 - sum(MARKOV_SUCCESSOR_PROBS)


def make_tokens(cfg):
    """K·B·T + 1 tokens. uniform: i.i.d. in [0, V), so the loss stays near ln V whatever
    the model learns. markov: a seeded sparse Markov chain, so there is something to learn
    and the loss falls within a few steps."""
    count = cfg.steps * cfg.batch * cfg.seq_len + 1
    rng = np.random.default_rng(cfg.seed)
    if cfg.tokens == "uniform":
        return rng.integers(0, cfg.vocab, size=count, dtype=np.int64).astype(np.uint16)
    # Successors follow a Zipf law over token ids (p ∝ 1/(id+1)), as word frequencies do: a few
    # frequent tokens give the model a unigram to pick up in the first steps, the chain a bigram.
    zipf = 1.0 / np.arange(1, cfg.vocab + 1)
    successors = rng.choice(cfg.vocab, size=(cfg.vocab, len(MARKOV_SUCCESSOR_PROBS)), p=zipf / zipf.sum())
    choices = rng.choice(len(MARKOV_SUCCESSOR_PROBS) + 1, size=count,
                         p=list(MARKOV_SUCCESSOR_PROBS) + [MARKOV_NOISE])
    noise = rng.integers(0, cfg.vocab, size=count, dtype=np.int64)
    tokens = np.empty(count, dtype=np.int64)
    tokens[0] = noise[0]
    for i in range(1, count):
        pick = choices[i]
        tokens[i] = noise[i] if pick == len(MARKOV_SUCCESSOR_PROBS) else successors[tokens[i - 1], pick]
    return tokens.astype(np.uint16)


def step_batch(tokens, cfg, step, device="cpu"):
    BT = cfg.batch * cfg.seq_len
    window = torch.from_numpy(tokens[step * BT: step * BT + BT + 1].astype(np.int64)).to(device)
    inputs = window[:-1].view(cfg.batch, cfg.seq_len)
    targets = window[1:].view(cfg.batch, cfg.seq_len)
    return inputs, targets


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


def flat(tensors):
    return torch.cat([tensors[name].detach().reshape(-1) for name in PARAM_NAMES])


def global_grad_norm(grads):
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))


def adamw_update(params, grads, m, v, step, cfg):
    """One AdamW step (step counts from 1); decoupled decay uses the pre-update weights."""
    correction1 = 1.0 - cfg.beta1 ** step
    correction2 = 1.0 - cfg.beta2 ** step
    with torch.no_grad():
        for name in PARAM_NAMES:
            g = grads[name]
            m[name].mul_(cfg.beta1).add_((1.0 - cfg.beta1) * g)
            v[name].mul_(cfg.beta2).add_((1.0 - cfg.beta2) * g * g)
            update = (m[name] / correction1) / (torch.sqrt(v[name] / correction2) + cfg.eps)
            if name in DECAYED:
                update = update + cfg.weight_decay * params[name]
            params[name].sub_(cfg.lr * update)


def forward_backward(params, inputs, targets, cfg):
    for t in params.values():
        t.grad = None
    logits, loss = forward(params, inputs, targets, cfg)
    loss.backward()
    return logits.detach(), float(loss), {name: params[name].grad.detach().clone() for name in PARAM_NAMES}


def train(initial, tokens, cfg, dtype):
    params = {name: t.to(cfg.device, dtype).clone().requires_grad_(True) for name, t in initial.items()}
    m = {name: torch.zeros_like(t) for name, t in params.items()}
    v = {name: torch.zeros_like(t) for name, t in params.items()}
    losses, norms = [], []
    first = None
    for step in range(cfg.steps):
        inputs, targets = step_batch(tokens, cfg, step, cfg.device)
        logits, loss, grads = forward_backward(params, inputs, targets, cfg)
        if step == 0:  # copied: clipping below scales the gradients in place
            first = (logits, loss, {name: g.clone() for name, g in grads.items()})
        norm = global_grad_norm(grads)
        losses.append(loss)
        norms.append(norm)
        if cfg.grad_clip > 0 and norm > cfg.grad_clip:
            scale = cfg.grad_clip / norm
            for g in grads.values():
                g.mul_(scale)
        adamw_update(params, grads, m, v, step + 1, cfg)
    return first, losses, norms, params


def header(values):
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:len(values)] = values
    return h


def write_outputs(cfg, initial, tokens, first, losses, norms, final):
    os.makedirs(cfg.out, exist_ok=True)
    num_params = sum(t.numel() for t in initial.values())

    with open(os.path.join(cfg.out, "model.bin"), "wb") as f:
        f.write(header([MODEL_MAGIC, MODEL_VERSION_FP32, cfg.max_seq_len, cfg.vocab, cfg.layers,
                        cfg.heads, cfg.channels, cfg.padded_vocab]).tobytes())
        f.write(flat(initial).numpy().astype("<f4").tobytes())

    with open(os.path.join(cfg.out, "train.bin"), "wb") as f:
        f.write(header([SHARD_MAGIC, SHARD_VERSION, len(tokens)]).tobytes())
        f.write(tokens.astype("<u2").tobytes())

    logits, loss, grads = first
    sections = [logits.reshape(-1), torch.tensor([loss]), flat(grads),
                torch.tensor(losses), torch.tensor(norms), flat(final)]
    with open(os.path.join(cfg.out, "reference.bin"), "wb") as f:
        f.write(header([REFERENCE_MAGIC, REFERENCE_VERSION, cfg.batch, cfg.seq_len, cfg.steps,
                        cfg.layers, cfg.heads, cfg.channels, cfg.vocab, cfg.padded_vocab,
                        cfg.max_seq_len, num_params]).tobytes())
        for section in sections:
            f.write(section.double().cpu().numpy().astype("<f4").tobytes())

    summary = {key: val for key, val in vars(cfg).items() if key not in ("out", "self_check")}
    summary.update(num_params=num_params, num_tokens=len(tokens), losses=losses, grad_norms=norms)
    with open(os.path.join(cfg.out, "reference.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return num_params


def self_check(initial, tokens, cfg):
    """fp64 checks that the graph and the optimizer are what this file claims.

    1. Central finite differences of the step-1 loss against autograd, for one
       entry of every tensor (plus a padded wte row, whose gradient must be 0).
    2. The hand-written AdamW step against torch.optim.AdamW (same formula).
    """
    inputs, targets = step_batch(tokens, cfg, 0)
    params = {name: t.double().clone().requires_grad_(True) for name, t in initial.items()}
    _, _, grads = forward_backward(params, inputs, targets, cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    probes = [(name, int(torch.randint(params[name].numel(), (1,), generator=gen)))
              for name in PARAM_NAMES]
    if cfg.padded_vocab > cfg.vocab:
        probes.append(("wte", cfg.vocab * cfg.channels))
    step_size = 1e-5
    worst = 0.0
    with torch.no_grad():
        for name, index in probes:
            entry = params[name].view(-1)
            saved = float(entry[index])
            entry[index] = saved + step_size
            plus = float(forward(params, inputs, targets, cfg)[1])
            entry[index] = saved - step_size
            minus = float(forward(params, inputs, targets, cfg)[1])
            entry[index] = saved
            numeric = (plus - minus) / (2 * step_size)
            analytic = float(grads[name].view(-1)[index])
            # Central differences at this step are good to ~1e-10 absolute in fp64.
            error = abs(numeric - analytic) / (abs(analytic) + 1e-4)
            worst = max(worst, error)
            print(f"  {name}[{index}]: autograd {analytic:+.9e}  finite-diff {numeric:+.9e}  err {error:.1e}")
    fd_ok = worst < 1e-5

    # Clip-free single step through both optimizers, from the same gradients.
    mine = {name: t.detach().clone() for name, t in params.items()}
    m = {name: torch.zeros_like(t) for name, t in mine.items()}
    v = {name: torch.zeros_like(t) for name, t in mine.items()}
    adamw_update(mine, grads, m, v, 1, cfg)
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
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--padded-vocab", type=int, default=None, help="default: vocab rounded up to 128")
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    ap.add_argument("--precision", choices=["fp32", "fp64"], default="fp32")
    ap.add_argument("--tokens", choices=["markov", "uniform"], default="markov",
                    help="token stream: a seeded sparse Markov chain (learnable) or uniform i.i.d.")
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
    problems = []
    for name in ("layers", "heads", "channels", "vocab", "max_seq_len", "batch", "seq_len", "steps"):
        if getattr(cfg, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1")
    if cfg.channels % cfg.heads:
        problems.append(f"--channels {cfg.channels} must be a multiple of --heads {cfg.heads}")
    if cfg.vocab > 65536:
        problems.append(f"--vocab {cfg.vocab} does not fit uint16 token ids (max 65536)")
    if cfg.padded_vocab < cfg.vocab:
        problems.append(f"--padded-vocab {cfg.padded_vocab} is smaller than --vocab {cfg.vocab}")
    if cfg.prompt_tokens < 1 or cfg.generate_tokens < 1 or cfg.prompt_tokens + cfg.generate_tokens > cfg.max_seq_len:
        problems.append("--prompt-tokens and --generate-tokens must be >= 1, their sum at most --max-seq-len")
    if cfg.seq_len > cfg.max_seq_len:
        problems.append(f"--seq-len {cfg.seq_len} exceeds --max-seq-len {cfg.max_seq_len}")
    if cfg.grad_clip < 0:
        problems.append("--grad-clip must be >= 0")
    if problems:
        ap.error("; ".join(problems))
    return cfg


def main(argv):
    cfg = parse_args(argv)
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    dtype = torch.float64 if cfg.precision == "fp64" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False

    initial = init_params(cfg)
    tokens = make_tokens(cfg)
    first, losses, norms, final = train(initial, tokens, cfg, dtype)
    num_params = write_outputs(cfg, initial, tokens, first, losses, norms, final)
    with open(os.path.join(cfg.out, "generate.json"), "w") as f:
        json.dump(greedy_decode(initial, tokens, cfg), f)
        f.write("\n")
    print(f"gpt2_reference: {cfg.out}: L={cfg.layers} NH={cfg.heads} C={cfg.channels} V={cfg.vocab} "
          f"Vp={cfg.padded_vocab} maxT={cfg.max_seq_len} B={cfg.batch} T={cfg.seq_len} K={cfg.steps} "
          f"{cfg.precision} params={num_params} loss {losses[0]:.6f} -> {losses[-1]:.6f} "
          f"norm {norms[0]:.4f} -> {norms[-1]:.4f}")
    if cfg.self_check and not self_check(initial, tokens, cfg):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
