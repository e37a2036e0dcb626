#!/usr/bin/python3
"""PyTorch reference for train_gpt: Llama 3 with Mixtral-style mixture-of-experts blocks.

dev/llama_reference.py's model (its attention, RMSNorm, RoPE, init, flags and training step,
imported from there) with every block's SwiGLU MLP replaced by E SwiGLU experts and a router,
in Mixtral's arithmetic as Hugging Face's MixtralSparseMoeBlock and load_balancing_loss_func
compute it (facts only; written here from their description). On x, the ln2 output of one
position: the router's logits x·routerᵀ in fp32, probs = softmax over all E (fp32), the top K
experts by probability (equal probabilities: the lower index first), gates = those K probs over
their sum, out = Σ_k gate_k · w2_j(silu(w1_j x) ⊙ w3_j x). The auxiliary load-balancing loss pools
the tokens of every layer: R = L·B·T rows, f_e = (the (row, k) choices of expert e) / R, P_e = the
mean of probs[·][e] over the rows, aux = E · Σ_e f_e·P_e (f carries no gradient). A step trains on
cross-entropy + --aux-loss-coef · aux.

--router sigmoid (router kind 1, DeepSeek-V3's aux-loss-free balancing): scores = sigmoid(logits)
(fp32), the top K of scores + expert_bias[layer] chosen (equal keys: the lower index first), gates =
the K scores over their sum; no auxiliary loss. expert_bias (L, E, zeros at first) is a parameter
without gradient (AdamW leaves it as it is) and moves after each AdamW step, outside the gradient:
bias[l][e] += --bias-rate · sign(mean_e(count[l]) − count[l][e]), count[l][e] the step's (row, k)
choices of expert e in layer l (B·T rows), compared in integers.

Writes model.bin in train_gpt's Llama 3 model file format with the mixture-of-experts extension,
train.bin, and reference.bin version 3 (dev/README.md); test/model compares train_gpt with it.
Runs only under Debian's python3-torch:  /usr/bin/python3 dev/mixtral_reference.py --out DIR
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as llama  # noqa: E402  (the Llama model, its flags and file headers)
import reference_common as common  # noqa: E402  (tokens, the training step, the file writers; checks torch)
import numpy as np  # noqa: E402
import torch  # noqa: E402

REFERENCE_VERSION = 3  # version 2's header and sections, then the mixture's (dev/README.md)
ROUTER_SOFTMAX_TOPK, ROUTER_SIGMOID_TOPK = 0, 1  # model file slot 28: Mixtral's router, DeepSeek-V3's
# Model file slots of the mixture-of-experts extension (docs/FORMATS.md, "Llama 3 model file").
EXPERTS_SLOT, TOP_K_SLOT, ROUTER_KIND_SLOT, AUX_COEF_SLOT = 26, 27, 28, 29
# reference.bin version 3's own header slots, after version 2's 0..19.
REF_EXPERTS_SLOT, REF_TOP_K_SLOT, REF_ROUTER_KIND_SLOT, REF_AUX_COEF_SLOT = 20, 21, 22, 23
REF_BIAS_RATE_SLOT = 24  # the sigmoid router's --bias-rate bits (0 for softmax)

# train_gpt's parameter layout with experts, in file order: the router between ln2w and the experts.
# The sigmoid router's expert_bias (L, E) after the experts, not decayed.
NAMES = ["wte", "ln1w", "qkvw", "attprojw", "ln2w", "router", "fcw", "fc2w", "fcprojw", "expert_bias", "lnfw",
         "lm_head"]
DECAYED = llama.DECAYED | {"router"}


def sigmoid_router(cfg):
    return cfg.router == "sigmoid"


def router_kind(cfg):
    return ROUTER_SIGMOID_TOPK if sigmoid_router(cfg) else ROUTER_SOFTMAX_TOPK


def param_names(cfg):
    return [n for n in NAMES if (n != "lm_head" or not cfg.tied) and (n != "expert_bias" or sigmoid_router(cfg))]


def param_shapes(cfg):
    """Llama's shapes with E experts: fcw and fc2w (L, E·H, C) — expert j's w1 (w3) in rows j·H ..
    j·H+H-1 —, fcprojw (L, E·C, H) — expert j's w2 in rows j·C .. j·C+C-1 —, router (L, E, C)."""
    L, C, H, E = cfg.layers, cfg.channels, cfg.hidden, cfg.experts
    shapes = llama.param_shapes(cfg)
    shapes.update(router=(L, E, C), fcw=(L, E * H, C), fc2w=(L, E * H, C), fcprojw=(L, E * C, H),
                  expert_bias=(L, E))
    return shapes


def init_params(cfg):
    """Llama's initial weights at these shapes (the same generator and order, so with E = 1 every
    tensor but the router is the dense reference's), and the router N(0, --router-std) from its own
    generator (seed + 1): a spread of logits that keeps routing decisions away from ties."""
    params = llama.init_params(cfg, param_shapes(cfg))
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    router = torch.randn(param_shapes(cfg)["router"], generator=gen, dtype=torch.float32) * cfg.router_std
    params["expert_bias"] = torch.zeros(param_shapes(cfg)["expert_bias"], dtype=torch.float32)
    return {name: router if name == "router" else params[name] for name in param_names(cfg)}


def top_k_experts(probs, k):
    """The k experts of highest probability per row, best first; equal probabilities in index order
    (a stable sort: torch.topk promises no order among ties)."""
    return torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]


def route(x, router, k, bias=None):
    """x (N, C): probs (N, E) softmax of the fp32 logits, chosen (N, k) expert ids, gates (N, k) and
    the selection's keys (N, E). With bias (E; the sigmoid router): probs are the scores
    sigmoid(logits), keys scores + bias (no gradient: the bias only selects)."""
    logits = llama.wide(x) @ llama.wide(router).t()
    if bias is None:
        probs = torch.softmax(logits, dim=-1)
        keys = probs
    else:
        probs = torch.sigmoid(logits)
        keys = probs.detach() + bias.detach().to(probs.dtype)
    chosen = top_k_experts(keys, k)
    top = probs.gather(1, chosen)
    return probs, chosen, top / top.sum(-1, keepdim=True), keys


def expert_weights(params, layer, expert, cfg):
    """Expert j's w1, w3 (H×C) and w2 (C×H) as row blocks of fcw, fc2w and fcprojw."""
    H, C = cfg.hidden, cfg.channels
    return (params["fcw"][layer][expert * H:(expert + 1) * H], params["fc2w"][layer][expert * H:(expert + 1) * H],
            params["fcprojw"][layer][expert * C:(expert + 1) * C])


def moe_mlp(h, params, layer, cfg, routing):
    """One block's experts on h (B, T, C): each expert runs on the rows routed to it, its output
    scaled by their gates and added at those rows. Appends (probs, chosen) to routing."""
    x = h.reshape(-1, h.shape[-1])
    bias = params["expert_bias"][layer] if sigmoid_router(cfg) else None
    probs, chosen, gates, keys = route(x, params["router"][layer], cfg.top_k, bias)
    routing.append((probs, chosen, keys))
    out = torch.zeros_like(x)
    for expert in range(cfg.experts):
        rows, slot = torch.nonzero(chosen == expert, as_tuple=True)
        if rows.numel():
            y = llama.swiglu(x[rows], *expert_weights(params, layer, expert, cfg))
            out = out.index_add(0, rows, y * gates[rows, slot, None].type_as(y))
    return out.view(h.shape)


def load_balancing_loss(routing, experts):
    """E · Σ_e f_e·P_e over the rows of every layer; f (counts of the one-hot choices) is a constant."""
    probs = torch.cat([r[0] for r in routing])
    chosen = torch.cat([r[1] for r in routing])
    rows = probs.shape[0]
    fraction = torch.bincount(chosen.reshape(-1), minlength=experts).to(probs.dtype) / rows
    return experts * (fraction * probs.mean(0)).sum()


def forward(params, inputs, targets, cfg):
    """(logits, cross-entropy + coef·aux, stats): the step's cross-entropy, aux and routing."""
    routing = []
    logits = llama.model_logits(params, inputs, cfg, lambda h, p, layer, c: moe_mlp(h, p, layer, c, routing))
    ce = llama.cross_entropy(logits, targets, cfg)
    if sigmoid_router(cfg):  # no auxiliary loss; + 0·bias gives the bias its (zero) gradient for AdamW
        aux = torch.zeros((), dtype=ce.dtype)
        loss = ce + 0.0 * params["expert_bias"].sum()
    else:
        aux = load_balancing_loss(routing, cfg.experts)
        loss = ce + cfg.aux_loss_coef * aux if cfg.aux_loss_coef else ce
    stats = dict(ce=float(ce), aux=float(aux), probs=torch.stack([r[0].detach() for r in routing]),
                 chosen=torch.stack([r[1] for r in routing]), keys=torch.stack([r[2].detach() for r in routing]),
                 sigmoid=sigmoid_router(cfg))
    return logits, loss, stats


def router_margin(keys, chosen, sigmoid):
    """The smallest gap between a row's K-th choice and the best expert left out, in logits
    (softmax: log-probabilities) or in score + bias (sigmoid, the bias included): how far the routing
    is from a tie another implementation's rounding could break the other way."""
    k = chosen.shape[-1]
    if k == keys.shape[-1]:
        return None
    ordered = torch.sort(keys, dim=-1, descending=True).values
    if sigmoid:
        return float((ordered[..., k - 1] - ordered[..., k]).min())
    return float((ordered[..., k - 1].log() - ordered[..., k].log()).min())


def update_expert_bias(params, stats, cfg):
    """After AdamW: bias[l][e] += rate·sign(mean_e(count[l]) − count[l][e]) from the step's choices,
    compared in integers (E·count against the layer's total), added in fp32."""
    with torch.no_grad():
        bias = params["expert_bias"]
        for layer, chosen in enumerate(stats["chosen"]):
            count = torch.bincount(chosen.reshape(-1), minlength=cfg.experts).to(torch.int64)
            sign = torch.sign(count.sum() - cfg.experts * count).to(bias.dtype)
            bias[layer].add_(sign * cfg.bias_rate)


def report(stats):
    """reference.bin's sections 7-10 and reference.json's keys of the mixture (dev/README.md)."""
    first = stats[0]
    sections = [torch.tensor([s["ce"] for s in stats]), torch.tensor([s["aux"] for s in stats]),
                first["probs"], first["chosen"].to(torch.float64)]
    experts = first["probs"].shape[-1]
    summary = dict(ce_losses=[s["ce"] for s in stats], aux_losses=[s["aux"] for s in stats],
                   expert_counts=[[torch.bincount(c.reshape(-1), minlength=experts).tolist() for c in s["chosen"]]
                                  for s in stats],
                   router_margins=[router_margin(s["keys"], s["chosen"], s["sigmoid"])
                                   for s in stats])
    return sections, summary


def graph(cfg):
    return common.Graph(param_names(cfg), DECAYED, forward, report,
                        update_expert_bias if sigmoid_router(cfg) else None)


def model_header(cfg):
    """Llama's header (train_gpt's extension) with the experts' slots 26..29."""
    h = llama.model_header(cfg)
    h[EXPERTS_SLOT], h[TOP_K_SLOT], h[ROUTER_KIND_SLOT] = cfg.experts, cfg.top_k, router_kind(cfg)
    h[AUX_COEF_SLOT] = llama.float_bits(cfg.aux_loss_coef)
    return h


def reference_header(cfg, num_params):
    """Version 3: version 2's slots 0..19, then E, K, the router kind, the aux coefficient's bits and
    the sigmoid router's bias rate's bits (0 for softmax)."""
    h = llama.reference_header(cfg, num_params, REFERENCE_VERSION)
    h[REF_EXPERTS_SLOT], h[REF_TOP_K_SLOT], h[REF_ROUTER_KIND_SLOT] = cfg.experts, cfg.top_k, router_kind(cfg)
    h[REF_AUX_COEF_SLOT] = llama.float_bits(cfg.aux_loss_coef)
    h[REF_BIAS_RATE_SLOT] = llama.float_bits(cfg.bias_rate) if sigmoid_router(cfg) else 0
    return h


# ---- --self-check: the reference against itself, in fp64

def dense_moe_mlp(h, params, layer, cfg):
    """The mixture written the other way: every expert on every row, weighted by an (N, E) gate
    matrix that is zero off the chosen experts. Must equal moe_mlp."""
    x = h.reshape(-1, h.shape[-1])
    bias = params["expert_bias"][layer] if sigmoid_router(cfg) else None
    _, chosen, gates, _ = route(x, params["router"][layer], cfg.top_k, bias)
    weights = torch.zeros(x.shape[0], cfg.experts, dtype=gates.dtype).scatter(1, chosen, gates)
    out = sum(weights[:, e, None] * llama.swiglu(x, *expert_weights(params, layer, e, cfg)) for e in range(cfg.experts))
    return out.view(h.shape)


def hf_style_aux(probs, chosen, experts):
    """load_balancing_loss_func's formulation: the mean over rows of the one-hot choices per k
    (K, E) times the mean probability per expert, summed, times E."""
    per_k = torch.nn.functional.one_hot(chosen, experts).to(probs.dtype).mean(0)
    return experts * (per_k * probs.mean(0)[None]).sum()


def expert_probes(cfg):
    """One entry of every expert's w1, w3, w2 and router row in every layer (an expert no token
    chose has gradient 0 there), beyond finite_differences' one per tensor."""
    L, E, H, C = cfg.layers, cfg.experts, cfg.hidden, cfg.channels
    probes = []
    for layer in range(L):
        for expert in range(E):
            spot = 7919 * (layer * E + expert + 1)  # a prime stride: a different row and column each time
            block = layer * E + expert
            probes += [("fcw", block * H * C + spot % (H * C)), ("fc2w", block * H * C + (spot + 1) % (H * C)),
                       ("fcprojw", block * C * H + spot % (C * H)), ("router", block * C + spot % C)]
    return probes


def hugging_face_losses(cfg, tokens):
    """Step 1's cross-entropy and aux loss by hf_llama_check.py's forward (Hugging Face's Mixtral
    arithmetic in float64, written separately: q/k in rotate-half order, its routing and aux
    formula) from model.bin as written, so the file's layout is checked too."""
    import hf_llama_check as hf  # here: only the self-check needs it
    path = os.path.join(cfg.out, "model.bin")
    window = tokens[:cfg.batch * cfg.seq_len + 1].astype("int64")
    rows = np.stack([window[b * cfg.seq_len:(b + 1) * cfg.seq_len + 1] for b in range(cfg.batch)])
    return hf.forward_loss(hf.hf_config(hf.read_model_bin(path)[1], "fp32"), hf.expected_from_model_bin(path), rows)


def check(ok, what):
    print(f"  {what}: {'ok' if ok else 'FAIL'}")
    return ok


def self_check(initial, tokens, cfg):
    """Finite differences of the objective (router included, through the aux loss) against autograd;
    the gather-and-add experts against the dense formulation; the tie rule; a uniform router's aux
    loss = K; the aux loss as Hugging Face's formula; step 1's losses by hf_llama_check.py's separate
    Hugging Face forward of model.bin; with E = K = 1 and no aux loss, the dense Llama reference's
    losses, norms and weights exactly. --router sigmoid: the finite differences, the gathered experts,
    the tie rule and the bias update's rule (the rest are the softmax router's)."""
    results = []
    worst, params, grads = common.finite_differences(initial, tokens, cfg, graph(cfg), expert_probes(cfg))
    results.append(check(worst < 1e-5, f"finite differences worst err {worst:.1e}"))

    inputs, targets = common.step_batch(tokens, cfg, 0)
    with torch.no_grad():
        h = torch.randn(cfg.batch, cfg.seq_len, cfg.channels, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(cfg.seed + 2))
        diff = max(float((moe_mlp(h, params, l, cfg, []) - dense_moe_mlp(h, params, l, cfg)).abs().max())
                   for l in range(cfg.layers))
        results.append(check(diff < 1e-12, f"gathered experts = every expert under a zero-padded gate matrix "
                                           f"(max diff {diff:.1e})"))
        ties = torch.tensor([[0.3, 0.2, 0.3, 0.2], [0.25] * 4, [0.1, 0.4, 0.4, 0.1]])
        results.append(check(top_k_experts(ties, 3).tolist() == [[0, 2, 1], [0, 1, 2], [1, 2, 0]],
                             "ties go to the lower index"))
    if sigmoid_router(cfg):
        results.append(check_bias_update(cfg))
        ok = all(results)
        print(f"self-check: {'ok' if ok else 'FAIL'}")
        return ok
    with torch.no_grad():
        uniform = {**params, "router": torch.zeros_like(params["router"])}
        _, _, stats = forward(uniform, inputs, targets, cfg)
        first_k = list(range(cfg.top_k))
        results.append(check(abs(stats["aux"] - cfg.top_k) < 1e-12 and
                             all(row == first_k for row in stats["chosen"].reshape(-1, cfg.top_k).tolist()),
                             f"a uniform router: aux {stats['aux']:.15f} = K, experts 0..K-1 everywhere"))
        _, _, stats = forward(params, inputs, targets, cfg)
        probs, chosen = stats["probs"].reshape(-1, cfg.experts), stats["chosen"].reshape(-1, cfg.top_k)
        hf_aux = float(hf_style_aux(probs, chosen, cfg.experts))
        results.append(check(abs(hf_aux - stats["aux"]) < 1e-12, f"aux {stats['aux']:.9f} = Hugging Face's formula's"))
        hf_ce, hf_aux = hugging_face_losses(cfg, tokens)
        error = max(abs(hf_ce - stats["ce"]) / stats["ce"], abs(hf_aux - stats["aux"]) / stats["aux"])
        results.append(check(error < 1e-6, f"hf_llama_check.py's Mixtral forward of model.bin: cross-entropy {hf_ce:.9f}, "
                                           f"aux {hf_aux:.9f} (relative {error:.1e})"))
    if cfg.aux_loss_coef and cfg.top_k < cfg.experts:  # with K = E every f_e is 1: aux = E, a constant
        no_aux = argparse.Namespace(**{**vars(cfg), "aux_loss_coef": 0.0})
        plain = common.forward_backward({n: t.detach().clone().requires_grad_(True) for n, t in params.items()},
                                        inputs, targets, no_aux, graph(no_aux))[2]["router"]
        share = float((grads["router"] - plain).norm() / grads["router"].norm())
        results.append(check(share > 1e-3, f"the aux loss moves the router's gradient ({share:.1%} of it)"))
    results.append(check_single_expert_is_dense(cfg, tokens))
    ok = all(results)
    print(f"self-check: {'ok' if ok else 'FAIL'}")
    return ok


def check_bias_update(cfg):
    """The bias rule on counts written out: an expert above its layer's mean falls, one below rises,
    one at the mean stays."""
    E = cfg.experts
    params = {"expert_bias": torch.zeros(2, E)}
    chosen = torch.stack([torch.tensor([[0, 1]] * 3 + [[0, 2]]), torch.tensor([[e % E, (e + 1) % E] for e in range(4)])])
    update_expert_bias(params, dict(chosen=chosen), argparse.Namespace(experts=E, bias_rate=0.5))
    counts = [torch.bincount(c.reshape(-1), minlength=E).double() for c in chosen]
    want = torch.stack([torch.sign(c.mean() - c) * 0.5 for c in counts]).float()
    return check(torch.equal(params["expert_bias"], want), f"the bias update's signs {params['expert_bias'].tolist()}")


def check_single_expert_is_dense(cfg, tokens):
    """E = K = 1 without aux loss trains exactly as llama_reference.py's dense model (fp32): the one
    expert's gate is 1 and the router's gradient 0."""
    one = argparse.Namespace(**{**vars(cfg), "experts": 1, "top_k": 1, "aux_loss_coef": 0.0})
    _, moe_losses, moe_norms, moe_final, _ = common.train(init_params(one), tokens, one, torch.float32, graph(one))
    _, dense_losses, dense_norms, dense_final, _ = common.train(llama.init_params(one), tokens, one, torch.float32,
                                                                llama.graph(one))
    same = (moe_losses == dense_losses and moe_norms == dense_norms and
            all(torch.equal(moe_final[n], dense_final[n]) for n in llama.param_names(one)))
    return check(same, f"E = K = 1: the dense Llama's {cfg.steps} losses, norms and final weights, bit for bit")


def parse_args(argv):
    def own_flags(ap):
        ap.add_argument("--router-std", type=float, default=0.2,
                        help="the router's initial std (its logits' spread keeps routing away from ties)")
        ap.add_argument("--aux-loss-coef", type=float, default=0.02,
                        help="the load-balancing loss's coefficient (Mixtral's router_aux_loss_coef); 0: none")
        ap.add_argument("--router", choices=["softmax", "sigmoid"], default="softmax",
                        help="softmax: Mixtral's (kind 0); sigmoid: DeepSeek-V3's with the balancing bias (kind 1)")
        ap.add_argument("--bias-rate", type=float, default=1e-3,
                        help="the sigmoid router's bias step per optimizer step")
        ap.add_argument("--min-router-margin", type=float, default=1e-4,
                        help="refuse a run whose routing comes closer to a tie than this (logits); 0: no limit")

    def own_problems(cfg):
        problems = []
        if cfg.experts < 1 or cfg.top_k < 1 or cfg.top_k > cfg.experts:
            problems.append(f"--experts {cfg.experts} and --top-k {cfg.top_k} must satisfy 1 <= top-k <= experts")
        if cfg.aux_loss_coef < 0:
            problems.append("--aux-loss-coef must be >= 0")
        if cfg.router == "sigmoid" and cfg.aux_loss_coef != 0:
            problems.append("--router sigmoid takes no auxiliary loss: give --aux-loss-coef 0")
        if cfg.bias_rate < 0:
            problems.append("--bias-rate must be >= 0")
        return problems

    own_sizes = [("--channels", "--experts", dict(type=int, default=4, help="E, experts per block")),
                 ("--channels", "--top-k", dict(type=int, default=2, help="K, experts per token"))]
    return llama.parse_args(argv, __doc__.split("\n")[0], own_sizes, own_flags, own_problems)


def main(argv):
    cfg = parse_args(argv)
    dtype = common.torch_setup(cfg)
    llama.assert_rope_bends(cfg)
    describe = (f"mixtral_reference: {cfg.out}: L={cfg.layers} NH={cfg.heads} NKV={cfg.kv_heads} C={cfg.channels} "
                f"E={cfg.experts} K={cfg.top_k} H={cfg.hidden} {cfg.router} router aux {cfg.aux_loss_coef} "
                f"bias rate {cfg.bias_rate} V={cfg.vocab} "
                f"Vp={cfg.padded_vocab} B={cfg.batch} T={cfg.seq_len} steps={cfg.steps} rope {cfg.rope} "
                f"{'tied' if cfg.tied else 'untied'} {cfg.precision}")
    status = common.run(cfg, dtype, graph(cfg), init_params(cfg), model_header(cfg),
                        lambda count: reference_header(cfg, count), describe, self_check)
    with open(os.path.join(cfg.out, "reference.json")) as f:
        summary = json.load(f)
    margins = [m for m in summary["router_margins"] if m is not None]
    if margins:
        print(f"mixtral_reference: cross-entropy {summary['ce_losses'][0]:.6f} -> {summary['ce_losses'][-1]:.6f}, "
              f"aux {summary['aux_losses'][0]:.6f} -> {summary['aux_losses'][-1]:.6f}, "
              f"closest routing decision {min(margins):.1e} "
              f"({'score + bias' if sigmoid_router(cfg) else 'logits'})")
        if min(margins) < cfg.min_router_margin:
            print(f"mixtral_reference: a routing decision within {min(margins):.1e} of a tie (--min-router-margin "
                  f"{cfg.min_router_margin}): another implementation could route differently; pick another --seed")
            return 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
