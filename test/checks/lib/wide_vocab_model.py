# wide_vocab_model.py — writes a tiny GPT-2 model file (docs/FORMATS.md, "Model file", fp32) whose
# vocabulary is Llama 3's size (V = 128256 by default), for the checks that feed a model of that
# vocabulary the files of each tokenizer. dev/gpt2_reference.py cannot: it writes uint16 shards.
# usage: wide_vocab_model.py OUT [VOCAB]
import struct
import sys

import numpy as np

sys.path.insert(0, "dev")
import gpt2_reference as ref  # noqa: E402  (param_shapes: the tensor order of the file)


class Config:
    pass


out = sys.argv[1]
cfg = Config()
cfg.vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 128256
cfg.padded_vocab = (cfg.vocab + 127) // 128 * 128
cfg.layers, cfg.heads, cfg.channels, cfg.max_seq_len = 1, 2, 32, 32
rng = np.random.default_rng(3)
with open(out, "wb") as f:
    f.write(struct.pack("<256i", 20240326, 3, cfg.max_seq_len, cfg.vocab, cfg.layers, cfg.heads, cfg.channels,
                        cfg.padded_vocab, *[0] * 248))
    for name, shape in ref.param_shapes(cfg).items():
        if name in ("ln1w", "ln2w", "lnfw"):
            values = np.ones(shape)
        elif name.endswith("b"):
            values = np.zeros(shape)
        else:
            values = rng.normal(0.0, 0.02, shape)
        f.write(values.astype("<f4").tobytes())
