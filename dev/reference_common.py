"""What dev/gpt2_reference.py, dev/llama_reference.py and dev/mixtral_reference.py share: the token
stream and its batches, one training step (loss, gradients, global-norm clipping, AdamW), the
shard, reference.bin and reference.json writers, the finite-difference probe of --self-check and
the common CLI flags.

A model enters as a Graph: its parameter names in file order, the weight-decayed ones and its
forward(params, inputs, targets, cfg) -> (logits over the padded vocab, the loss it trains on), or
(logits, loss, stats) where it has more to report per step (the mixture of experts: cross-entropy,
auxiliary loss, routing); then its report(per-step stats) -> (float32 sections appended to
reference.bin, keys added to reference.json).
Runs only under Debian's python3-torch (see dev/README.md).
"""

import json
import math
import os
import sys
from collections import namedtuple

try:
    import numpy as np
    import torch
except ImportError:
    sys.exit(f"{os.path.basename(sys.argv[0])} needs Debian's python3-torch: run it with /usr/bin/python3")

SHARD_MAGIC, SHARD_VERSION = 20240520, 1
REFERENCE_MAGIC = 20261121
HEADER_INTS = 256

Graph = namedtuple("Graph", "names decayed forward report after_step", defaults=(None, None))

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


def flat(tensors, graph):
    return torch.cat([tensors[name].detach().reshape(-1) for name in graph.names])


def global_grad_norm(grads):
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))


def adamw_update(params, grads, m, v, step, cfg, graph):
    """One AdamW step (step counts from 1); decoupled decay uses the pre-update weights."""
    correction1 = 1.0 - cfg.beta1 ** step
    correction2 = 1.0 - cfg.beta2 ** step
    with torch.no_grad():
        for name in graph.names:
            g = grads[name]
            m[name].mul_(cfg.beta1).add_((1.0 - cfg.beta1) * g)
            v[name].mul_(cfg.beta2).add_((1.0 - cfg.beta2) * g * g)
            update = (m[name] / correction1) / (torch.sqrt(v[name] / correction2) + cfg.eps)
            if name in graph.decayed:
                update = update + cfg.weight_decay * params[name]
            params[name].sub_(cfg.lr * update)


def forward_backward(params, inputs, targets, cfg, graph):
    for t in params.values():
        t.grad = None
    logits, loss, *stats = graph.forward(params, inputs, targets, cfg)
    loss.backward()
    grads = {name: params[name].grad.detach().clone() for name in graph.names}
    return logits.detach(), float(loss), grads, (stats[0] if stats else None)


def train(initial, tokens, cfg, dtype, graph, device="cpu"):
    """K clipped AdamW steps from the initial weights: (step-1 logits, loss and gradients before
    clipping), the per-step losses and gradient norms, the parameters after K steps and the
    per-step stats of a forward that reports them (else Nones)."""
    params = {name: t.to(device, dtype).clone().requires_grad_(True) for name, t in initial.items()}
    m = {name: torch.zeros_like(t) for name, t in params.items()}
    v = {name: torch.zeros_like(t) for name, t in params.items()}
    losses, norms, stats = [], [], []
    first = None
    for step in range(cfg.steps):
        inputs, targets = step_batch(tokens, cfg, step, device)
        logits, loss, grads, step_stats = forward_backward(params, inputs, targets, cfg, graph)
        stats.append(step_stats)
        if step == 0:  # copied: clipping below scales the gradients in place
            first = (logits, loss, {name: g.clone() for name, g in grads.items()})
        norm = global_grad_norm(grads)
        losses.append(loss)
        norms.append(norm)
        if cfg.grad_clip > 0 and norm > cfg.grad_clip:
            scale = cfg.grad_clip / norm
            for g in grads.values():
                g.mul_(scale)
        adamw_update(params, grads, m, v, step + 1, cfg, graph)
        if graph.after_step is not None:  # an update outside the gradient, from the step's stats
            graph.after_step(params, step_stats, cfg)
    return first, losses, norms, params, stats


def header(values):
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:len(values)] = values
    return h


def reference_header(cfg, version, num_params, extra=()):
    """reference.bin's header: the fields both versions share, then the version's own."""
    return header([REFERENCE_MAGIC, version, cfg.batch, cfg.seq_len, cfg.steps, cfg.layers, cfg.heads,
                   cfg.channels, cfg.vocab, cfg.padded_vocab, cfg.max_seq_len, num_params, *extra])


def write_outputs(cfg, graph, model_header, make_reference_header, initial, tokens, first, losses, norms, final,
                  stats):
    """model.bin (model_header, then the initial weights), train.bin, reference.bin
    (make_reference_header(number of parameters), then its sections, then graph.report's) and
    reference.json."""
    os.makedirs(cfg.out, exist_ok=True)
    num_params = sum(t.numel() for t in initial.values())

    with open(os.path.join(cfg.out, "model.bin"), "wb") as f:
        f.write(model_header.tobytes())
        f.write(flat(initial, graph).numpy().astype("<f4").tobytes())

    with open(os.path.join(cfg.out, "train.bin"), "wb") as f:
        f.write(header([SHARD_MAGIC, SHARD_VERSION, len(tokens)]).tobytes())
        f.write(tokens.astype("<u2").tobytes())

    logits, loss, grads = first
    sections = [logits.reshape(-1), torch.tensor([loss]), flat(grads, graph),
                torch.tensor(losses), torch.tensor(norms), flat(final, graph)]
    own_sections, own_summary = graph.report(stats) if graph.report else ([], {})
    sections += [section.reshape(-1) for section in own_sections]
    with open(os.path.join(cfg.out, "reference.bin"), "wb") as f:
        f.write(make_reference_header(num_params).tobytes())
        for section in sections:
            f.write(section.double().cpu().numpy().astype("<f4").tobytes())

    summary = {key: val for key, val in vars(cfg).items() if key not in ("out", "self_check")}
    summary.update(num_params=num_params, num_tokens=len(tokens), losses=losses, grad_norms=norms, **own_summary)
    with open(os.path.join(cfg.out, "reference.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return num_params


def run(cfg, dtype, graph, initial, model_header, make_reference_header, describe, self_check, device="cpu",
        more_outputs=None):
    """A reference script's whole run from its initial weights: draws the tokens, trains, writes the
    outputs (more_outputs(tokens), if given, writes the script's own), prints `describe` with the
    run's figures and, with --self-check, runs self_check(initial, tokens, cfg). Returns the exit status."""
    tokens = make_tokens(cfg)
    first, losses, norms, final, stats = train(initial, tokens, cfg, dtype, graph, device)
    num_params = write_outputs(cfg, graph, model_header, make_reference_header, initial, tokens, first, losses, norms,
                               final, stats)
    if more_outputs is not None:
        more_outputs(tokens)
    print(f"{describe} params={num_params} loss {losses[0]:.6f} -> {losses[-1]:.6f} "
          f"norm {norms[0]:.4f} -> {norms[-1]:.4f}")
    if cfg.self_check and not self_check(initial, tokens, cfg):
        return 1
    return 0


def finite_differences(initial, tokens, cfg, graph, extra_probes=()):
    """fp64 central finite differences of the step-1 loss against autograd, for one seeded entry
    of every tensor plus extra_probes ((name, flat index) pairs). Returns (worst relative error,
    the fp64 parameters, their autograd gradients)."""
    inputs, targets = step_batch(tokens, cfg, 0)
    params = {name: t.double().clone().requires_grad_(True) for name, t in initial.items()}
    _, _, grads, _ = forward_backward(params, inputs, targets, cfg, graph)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    probes = [(name, int(torch.randint(params[name].numel(), (1,), generator=gen))) for name in graph.names]
    probes += list(extra_probes)
    step_size = 1e-5
    worst = 0.0
    with torch.no_grad():
        for name, index in probes:
            entry = params[name].view(-1)
            saved = float(entry[index])
            entry[index] = saved + step_size
            plus = float(graph.forward(params, inputs, targets, cfg)[1])
            entry[index] = saved - step_size
            minus = float(graph.forward(params, inputs, targets, cfg)[1])
            entry[index] = saved
            numeric = (plus - minus) / (2 * step_size)
            analytic = float(grads[name].view(-1)[index])
            # Central differences at this step are good to ~1e-10 absolute in fp64.
            error = abs(numeric - analytic) / (abs(analytic) + 1e-4)
            worst = max(worst, error)
            print(f"  {name}[{index}]: autograd {analytic:+.9e}  finite-diff {numeric:+.9e}  err {error:.1e}")
    return worst, params, grads


def add_size_args(ap, vocab, padded_vocab_help, seq_len, steps, own=()):
    """--out and the shape flags both scripts take (their defaults differ). own: a script's own
    flags as (after_flag, flag, add_argument keywords), added right after after_flag, since the
    order of the flags is the order of reference.json's keys."""
    shared = [("--out", dict(required=True, help="output directory (created if missing)")),
              ("--layers", dict(type=int, default=2)),
              ("--heads", dict(type=int, default=4)),
              ("--channels", dict(type=int, default=64)),
              ("--vocab", dict(type=int, default=vocab)),
              ("--padded-vocab", dict(type=int, default=None, help=padded_vocab_help)),
              ("--max-seq-len", dict(type=int, default=64)),
              ("--batch", dict(type=int, default=2)),
              ("--seq-len", dict(type=int, default=seq_len)),
              ("--steps", dict(type=int, default=steps)),
              ("--seed", dict(type=int, default=1337))]
    for flag, keywords in shared:
        ap.add_argument(flag, **keywords)
        for after, own_flag, own_keywords in own:
            if after == flag:
                ap.add_argument(own_flag, **own_keywords)


def add_training_args(ap):
    """The optimizer, clipping, precision and token-stream flags."""
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    ap.add_argument("--precision", choices=["fp32", "fp64"], default="fp32")
    ap.add_argument("--tokens", choices=["markov", "uniform"], default="markov",
                    help="token stream: a seeded sparse Markov chain (learnable) or uniform i.i.d.")


def check_args(ap, cfg, sizes, own_problems):
    """Exits through ap.error with one line naming every bad flag: first any of `sizes` below 1,
    then (those known good) own_problems(cfg) and what both scripts refuse. Returns cfg."""
    problems = [f"--{name.replace('_', '-')} must be >= 1" for name in sizes if getattr(cfg, name) < 1]
    if problems:
        ap.error("; ".join(problems))
    problems = own_problems(cfg)
    if cfg.vocab > 65536:
        problems.append(f"--vocab {cfg.vocab} does not fit uint16 token ids (max 65536)")
    if cfg.padded_vocab < cfg.vocab:
        problems.append(f"--padded-vocab {cfg.padded_vocab} is smaller than --vocab {cfg.vocab}")
    if cfg.seq_len > cfg.max_seq_len:
        problems.append(f"--seq-len {cfg.seq_len} exceeds --max-seq-len {cfg.max_seq_len}")
    if cfg.grad_clip < 0:
        problems.append("--grad-clip must be >= 0")
    if problems:
        ap.error("; ".join(problems))
    return cfg


def torch_setup(cfg):
    """Deterministic single-threaded torch without TF32; returns the training dtype."""
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch.float64 if cfg.precision == "fp64" else torch.float32
