"""The Transformer LM family the capacity and plan benchmarks climb: ``lm.synthetic.GPipeTransformerLM``
at (layers, width) rungs, each rung larger than the last, and the knobs every rung shares."""

LADDER = [
    (8, w)
    for w in (128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1152, 1280, 1536, 1792, 2048)
]
QUICK_LADDER = [(4, 32), (8, 64)]  # 4 layers and more: a layer for each stage of gpipe_k4
BASE = {"num_heads": 4, "seq_length": 128, "batch_size": 8, "warmup_steps": 1, "max_steps": 10}
