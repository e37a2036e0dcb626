"""hf_gpt2.py — train_gpt model files <-> Hugging Face GPT-2 directories, for export_hf.py and
import_hf.py. Standard library and numpy only (Debian has neither safetensors nor transformers).

Model file (docs/FORMATS.md): 256 int32 header (magic 20240326, version 3 = fp32 / 5 = bf16,
maxT, V, L, NH, C, Vp), then 16 tensors in llm.c order, nn.Linear (out, in) layout, wte padded
to Vp rows (rows V..Vp-1 zero).

safetensors: u64 little-endian header length n, n bytes of JSON {name: {"dtype", "shape",
"data_offsets": [begin, end]}, optional "__metadata__"}, then the raw little-endian tensors, each
at its offsets relative to the end of the header.

Hugging Face GPT-2 (GPT2LMHeadModel): names under "transformer." (a GPT2Model saved alone has no
prefix; both are read), linear weights in Conv1D layout (in, out) — the transpose of nn.Linear's —
wte unpadded (V rows), the lm head tied to wte and so not stored.
"""
import json
import math
import os
import struct
import sys

import numpy as np

MODEL_MAGIC = 20240326
HEADER_INTS = 256
LLMC_ORDER = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
              "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# Per-layer tensors: their Hugging Face name within block h.N, and whether the weight is a
# Conv1D (stored transposed).
LAYER_NAMES = {
    "ln1w": ("ln_1.weight", False), "ln1b": ("ln_1.bias", False),
    "qkvw": ("attn.c_attn.weight", True), "qkvb": ("attn.c_attn.bias", False),
    "attprojw": ("attn.c_proj.weight", True), "attprojb": ("attn.c_proj.bias", False),
    "ln2w": ("ln_2.weight", False), "ln2b": ("ln_2.bias", False),
    "fcw": ("mlp.c_fc.weight", True), "fcb": ("mlp.c_fc.bias", False),
    "fcprojw": ("mlp.c_proj.weight", True), "fcprojb": ("mlp.c_proj.bias", False),
}
MODEL_NAMES = {"wte": "wte.weight", "wpe": "wpe.weight", "lnfw": "ln_f.weight", "lnfb": "ln_f.bias"}
# Buffers some GPT-2 checkpoints carry (the causal mask), not parameters.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


class FormatError(Exception):
    """A bad input file: the message names it and what was wrong."""


def shapes(cfg):
    """Each tensor's shape in the model file (llm.c layout)."""
    L, C, Vp, T = cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]
    return {"wte": (Vp, C), "wpe": (T, C), "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C),
            "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C),
            "fcw": (L, 4 * C, C), "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
            "lnfw": (C,), "lnfb": (C,)}


def read_model(path):
    """(config dict, {name: array}, dtype "fp32"|"bf16"); bf16 tensors as uint16 bit patterns."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FormatError(f"{path}: cannot read: {e.strerror}")
    if len(data) < 4 * HEADER_INTS:
        raise FormatError(f"{path}: {len(data)} bytes, shorter than the {4 * HEADER_INTS}-byte model header")
    header = struct.unpack_from(f"<{HEADER_INTS}i", data)
    if header[0] != MODEL_MAGIC:
        raise FormatError(f"{path}: magic {header[0]}, expected {MODEL_MAGIC} (a train_gpt / llm.c model file)")
    if header[1] not in (3, 5):
        raise FormatError(f"{path}: version {header[1]}, expected 3 (fp32) or 5 (bf16)")
    cfg = dict(zip(["maxT", "V", "L", "NH", "C", "Vp"], header[2:8]))
    if min(cfg.values()) < 1 or cfg["Vp"] < cfg["V"] or cfg["C"] % cfg["NH"] != 0:
        raise FormatError(f"{path}: implausible configuration {cfg}")
    dtype = "fp32" if header[1] == 3 else "bf16"
    element = np.dtype("<f4") if dtype == "fp32" else np.dtype("<u2")
    sizes = {name: int(np.prod(shape)) for name, shape in shapes(cfg).items()}
    expected = 4 * HEADER_INTS + sum(sizes.values()) * element.itemsize
    if len(data) != expected:
        raise FormatError(f"{path}: {len(data)} bytes, expected {expected} for {cfg} ({dtype})")
    tensors, offset = {}, 4 * HEADER_INTS
    for name in LLMC_ORDER:
        n = sizes[name]
        tensors[name] = np.frombuffer(data, element, n, offset).reshape(shapes(cfg)[name])
        offset += n * element.itemsize
    return cfg, tensors, dtype


def write_model(path, cfg, tensors, dtype):
    header = [0] * HEADER_INTS
    header[:8] = [MODEL_MAGIC, 3 if dtype == "fp32" else 5, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"],
                  cfg["Vp"]]
    element = np.dtype("<f4") if dtype == "fp32" else np.dtype("<u2")
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        for name in LLMC_ORDER:
            f.write(np.ascontiguousarray(tensors[name], element).tobytes())


SAFETENSORS_DTYPES = {"fp32": ("F32", np.dtype("<f4")), "bf16": ("BF16", np.dtype("<u2"))}


def write_safetensors(path, named, dtype, metadata):
    """named: [(name, array)] in file order, arrays already of the dtype's element type."""
    tag, element = SAFETENSORS_DTYPES[dtype]
    header, offset = {"__metadata__": metadata}, 0
    for name, array in named:
        end = offset + array.size * element.itemsize
        header[name] = {"dtype": tag, "shape": list(array.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # tensors start 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, array in named:
            f.write(np.ascontiguousarray(array, element).tobytes())


def write_replacing(path, write):
    """Calls write(path + ".tmp"), then renames it over path; on any failure (a full disk, an
    interrupt) the temporary file is removed and path is left as it was."""
    temporary = path + ".tmp"
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def read_safetensors(path):
    """{name: array} (BF16 as uint16 bit patterns) and the dtype name ("fp32"|"bf16") they share."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FormatError(f"{path}: cannot read: {e.strerror}")
    if len(data) < 8:
        raise FormatError(f"{path}: {len(data)} bytes, too short for a safetensors file")
    (n,) = struct.unpack_from("<Q", data)
    if 8 + n > len(data):
        raise FormatError(f"{path}: header length {n} exceeds the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise FormatError(f"{path}: header is not JSON: {e}")
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is a JSON {type(header).__name__}, expected an object of tensors")
    by_tag = {tag: (name, element) for name, (tag, element) in SAFETENSORS_DTYPES.items()}
    tensors, dtypes, body = {}, set(), 8 + n

    def whole_numbers(value, length=None):
        return (isinstance(value, list) and (length is None or len(value) == length) and
                all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value))

    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise FormatError(f"{path}: tensor {name}: {info!r} is not an object with dtype, shape, data_offsets")
        if info.get("dtype") not in by_tag:
            raise FormatError(f"{path}: tensor {name} has dtype {info.get('dtype')}, expected F32 or BF16")
        if not whole_numbers(info.get("shape")):
            raise FormatError(f"{path}: tensor {name}: shape {info.get('shape')!r}, expected a list of whole numbers")
        if not whole_numbers(info.get("data_offsets"), 2):
            raise FormatError(f"{path}: tensor {name}: data_offsets {info.get('data_offsets')!r}, "
                              "expected [begin, end] in bytes")
        dtype_name, element = by_tag[info["dtype"]]
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"])
        if end - begin != count * element.itemsize or body + end > len(data):
            raise FormatError(f"{path}: tensor {name}: offsets {begin}..{end} do not fit its shape or the file")
        tensors[name] = np.frombuffer(data, element, count, body + begin).reshape(info["shape"])
        dtypes.add(dtype_name)
    if len(dtypes) > 1:
        raise FormatError(f"{path}: tensors of mixed dtypes {sorted(dtypes)}; expected one")
    return tensors, (dtypes.pop() if dtypes else "fp32")


def hf_config(cfg, dtype):
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["V"], "n_positions": cfg["maxT"], "n_ctx": cfg["maxT"], "n_embd": cfg["C"],
        "n_layer": cfg["L"], "n_head": cfg["NH"], "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "bos_token_id": 50256, "eos_token_id": 50256,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "torch_dtype": "float32" if dtype == "fp32" else "bfloat16",
    }


def to_hf(cfg, tensors):
    """[(name, array)] in Hugging Face names and layouts."""
    named = [("transformer.wte.weight", tensors["wte"][:cfg["V"]]), ("transformer.wpe.weight", tensors["wpe"])]
    for layer in range(cfg["L"]):
        for name in LLMC_ORDER[2:14]:
            hf_name, conv1d = LAYER_NAMES[name]
            value = tensors[name][layer]
            named.append((f"transformer.h.{layer}.{hf_name}", value.T if conv1d else value))
    named += [("transformer.ln_f.weight", tensors["lnfw"]), ("transformer.ln_f.bias", tensors["lnfb"])]
    return named


def from_hf(directory, padded_vocab=None):
    """(config dict, {llm.c name: array}, dtype) from a Hugging Face GPT-2 directory."""
    config_path, weights_path = f"{directory}/config.json", f"{directory}/model.safetensors"
    try:
        with open(config_path) as f:
            hf = json.load(f)
    except OSError as e:
        raise FormatError(f"{config_path}: cannot read: {e.strerror}")
    except ValueError as e:
        raise FormatError(f"{config_path}: not JSON: {e}")
    cfg = trainable_config(hf, config_path, padded_vocab)
    V = cfg["V"]
    raw, dtype = read_safetensors(weights_path)
    named = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in raw.items()}
    if hf.get("tie_word_embeddings", True) is not True and "lm_head.weight" not in named:
        raise FormatError(f"{config_path}: tie_word_embeddings {hf['tie_word_embeddings']!r} and no lm_head.weight "
                          f"in {weights_path}; train_gpt ties the head to wte")
    if "lm_head.weight" in named:
        lm_head = named.pop("lm_head.weight")
        if not np.array_equal(lm_head, named.get("wte.weight")):
            raise FormatError(f"{weights_path}: lm_head.weight differs from wte.weight; train_gpt ties them")

    def take(name, shape):
        if name not in named:
            raise FormatError(f"{weights_path}: missing tensor {name}")
        value = named.pop(name)
        if tuple(value.shape) != tuple(shape):
            raise FormatError(f"{weights_path}: tensor {name} has shape {list(value.shape)}, expected {list(shape)}")
        finite = np.isfinite(value) if dtype == "fp32" else (value & 0x7F80) != 0x7F80  # bf16: exponent all ones
        if not finite.all():
            raise FormatError(f"{weights_path}: tensor {name}: {int((~finite).sum())} non-finite value(s) "
                              "(NaN or infinity); train_gpt refuses such a model")
        return value

    want = shapes(cfg)
    element = np.dtype("<f4") if dtype == "fp32" else np.dtype("<u2")
    tensors = {"wte": np.zeros(want["wte"], element)}
    tensors["wte"][:V] = take("wte.weight", (V, cfg["C"]))
    tensors["wpe"] = take("wpe.weight", want["wpe"])
    for name in LLMC_ORDER[2:14]:
        hf_name, conv1d = LAYER_NAMES[name]
        per_layer = want[name][1:]
        stored = per_layer[::-1] if conv1d else per_layer
        tensors[name] = np.stack([take(f"h.{layer}.{hf_name}", stored).T if conv1d else
                                  take(f"h.{layer}.{hf_name}", stored) for layer in range(cfg["L"])])
    tensors["lnfw"] = take("ln_f.weight", want["lnfw"])
    tensors["lnfb"] = take("ln_f.bias", want["lnfb"])
    extra = [k for k in named if not k.endswith(IGNORED_SUFFIXES)]
    if extra:
        raise FormatError(f"{weights_path}: unexpected tensors {extra[:5]} (not a GPT-2 model train_gpt can hold)")
    return cfg, tensors, dtype


def trainable_config(hf, config_path, padded_vocab):
    """The model file's configuration from config.json, or FormatError for anything train_gpt cannot
    run as GPT-2 (its checks: src/gpt2_config.h): sizes that are not positive int32 numbers, a head
    size C/NH that is not a multiple of 8 up to 128, another MLP width, activation, layernorm epsilon
    or attention scaling, cross-attention."""
    if not isinstance(hf, dict):
        raise FormatError(f"{config_path}: a JSON {type(hf).__name__}, expected an object")
    if hf.get("model_type") != "gpt2":
        raise FormatError(f"{config_path}: model_type {hf.get('model_type')!r}, expected 'gpt2'")
    sizes = {}
    for key in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd"):
        value = hf.get(key)
        if key not in hf:
            raise FormatError(f"{config_path}: no {key}")
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**31:
            raise FormatError(f"{config_path}: {key} {value!r}, expected a whole number from 1 to {2**31 - 1}")
        sizes[key] = value
    C, NH, V = sizes["n_embd"], sizes["n_head"], sizes["vocab_size"]
    if C % NH != 0 or (C // NH) % 8 != 0 or C // NH > 128:
        raise FormatError(f"{config_path}: n_embd {C} / n_head {NH}: train_gpt needs a head size n_embd/n_head "
                          "that is a whole multiple of 8 and at most 128")
    if hf.get("n_inner") not in (None, 4 * C):
        raise FormatError(f"{config_path}: n_inner {hf['n_inner']!r}, expected 4·n_embd (train_gpt's MLP)")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise FormatError(f"{config_path}: activation_function {hf['activation_function']!r}, expected the tanh GELU")
    # The settings whose other values change what the model computes; train_gpt implements GPT-2's.
    expected = {"layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "add_cross_attention": False}
    for key, value in expected.items():
        given = hf.get(key, value)
        same = (isinstance(given, (int, float)) and not isinstance(given, bool) and math.isclose(given, value)
                if isinstance(value, float) else given is value)
        if not same:
            raise FormatError(f"{config_path}: {key} {given!r}: train_gpt implements only {json.dumps(value)}")
    Vp = (V + 127) // 128 * 128 if padded_vocab is None else padded_vocab
    if Vp < V or Vp % 8 != 0 or Vp >= 2**31:
        raise FormatError(f"--padded-vocab {Vp}: expected a multiple of 8, at least the vocabulary ({V})")
    return {"maxT": sizes["n_positions"], "V": V, "L": sizes["n_layer"], "NH": NH, "C": C, "Vp": Vp}


def main(run, argv):
    """Runs a command-line tool: one line on stderr and exit status 1 for a bad input."""
    try:
        run(argv)
    except FormatError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # writing: a full disk, a missing permission; a rename names its destination
        print(f"error: {e.filename2 or e.filename}: {e.strerror}", file=sys.stderr)
        sys.exit(1)
