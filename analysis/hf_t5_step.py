#!/usr/bin/env python3
"""One training step of Hugging Face transformers' T5ForConditionalGeneration on the shapes of a
shardbench preset: the baseline a user would reach for, eager and under torch.compile, timed on
the same GPU as shardbench's CUDA backend (scripts/gpu-check.sh runs both in one job).

The model is built from a T5Config of the preset (random initialisation, dropout 0, 32
buckets / max distance 128), fp32 weights under bf16 autocast, and a fused AdamW (weight
decay 0, so the update is shardbench's Adam). The study's presets: ReLU feed-forward, tied
embeddings. T5 v1.1 and Flan-T5 presets (t5-v1_1-xl, flan-t5-xxl, ...): feed_forward_proj
"gated-gelu" and the released checkpoints' layout, one input embedding `shared` for encoder
and decoder and a separate lm_head (two vocab x d_model matrices). transformers 5.17 builds
neither from T5Config(tie_word_embeddings=False): the config comes back tied (one matrix),
and set to False after construction the encoder's and decoder's input embeddings are untied
too (four). So the script ties both input embeddings to `shared` itself and keeps the head
separate (no d_model^-0.5 rescale: T5ForConditionalGeneration rescales only a tied head).

Both parameter counts are printed, Hugging Face's (unique parameters of the module) and
shardbench's (`fsdp_perf --plan`'s param_count, where the programs are built under --bin),
and the script fails when they differ: e.g. t5-v1_1-xl 2,849,757,184, flan-t5-xxl
11,135,332,352, t5-611m 611,838,976. analysis/torch_t5_step.py stays the bit-exact reference
of shardbench's math; this script is the performance baseline.

Prints one line per step (STEP step=.. loss=.. ms=..) and a summary for machines:
  HF step_ms=228.3 tflops=279.1 mode=compile checkpointing=0 ... params=... sb_params=...
TFLOPS use shardbench's model-FLOP formula (3 x forward matmul FLOPs), read from the program's
own plan of the same shapes as torch_t5_step.py reads it (--bin), so the figures compare with
ddp_perf/fsdp_perf's.

Exit status: 0 measured; 1 failed (out of memory included, with the reason); 3 not available
here (no transformers, no PyTorch, or no CUDA device): gpu-check prints the reason and skips
the row.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import runner  # noqa: E402
import torch_t5_step  # noqa: E402  (PRESETS and the plan's FLOP count: one place for each)

NOT_AVAILABLE = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv):
    p = cli.parser(__doc__, __file__)
    p.add_argument("--model", default="t5-611m", choices=sorted(torch_t5_step.PRESETS),
                   help="shardbench preset whose shapes to build (default: %(default)s)")
    p.add_argument("--layers", type=int, help="encoder and decoder layers each (default: the preset's)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=512, help="encoder tokens per sequence (default: %(default)s)")
    p.add_argument("--dec-seq-len", type=int, help="decoder tokens per sequence (default: --seq-len)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps first; torch.compile compiles in the first (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="wrap the model in torch.compile (default: eager)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="Hugging Face gradient checkpointing: recompute each block in backward")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                   help="bf16: fp32 weights under bf16 autocast (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default: %(default)s)")
    p.add_argument("--device", default="cuda", help="torch device (default: %(default)s)")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                   help="folder of ddp_perf and fsdp_perf: the plan's FLOP count and shardbench's parameter count "
                        "(default: build/bin of this checkout)")
    a = p.parse_args(argv)
    d, ff, layers, heads, dkv, vocab, ffn, tie = torch_t5_step.PRESETS[a.model]
    a.d_model, a.d_ff, a.heads, a.d_kv, a.vocab, a.ffn, a.tie = d, ff, heads, dkv, vocab, ffn, tie
    a.layers = a.layers or layers
    a.dec_seq_len = a.dec_seq_len or a.seq_len
    for name in ("layers", "batch", "seq_len", "dec_seq_len", "steps"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name)}")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0, got {a.warmup}")
    return a


def unique_parameters(model):
    """Elements of the module's distinct parameters (a tied matrix counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def build(torch, transformers, a, device):
    cfg = transformers.T5Config(
        vocab_size=a.vocab, d_model=a.d_model, d_kv=a.d_kv, d_ff=a.d_ff, num_layers=a.layers,
        num_decoder_layers=a.layers, num_heads=a.heads, relative_attention_num_buckets=32,
        relative_attention_max_distance=128, dropout_rate=0.0, layer_norm_epsilon=1e-6,
        feed_forward_proj=a.ffn, tie_word_embeddings=a.tie, use_cache=False,
        decoder_start_token_id=0, pad_token_id=0)
    cfg.tie_word_embeddings = a.tie  # transformers 5.17 returns True whatever was passed
    model = transformers.T5ForConditionalGeneration(cfg)
    if not a.tie:  # the checkpoints' layout: both stacks read `shared`, the head is its own
        model.encoder.embed_tokens = model.shared
        model.decoder.embed_tokens = model.shared
    model = model.to(device)
    model.train()
    if a.activation_checkpointing:
        model.gradient_checkpointing_enable()
    # As built (after .to() and checkpointing, which must not re-tie anything); a tied model's
    # layout is transformers' own (the parameter count, checked by the caller, says if it is one matrix).
    shared = model.shared.weight
    layout = (model.encoder.embed_tokens.weight is shared, model.decoder.embed_tokens.weight is shared,
              model.lm_head.weight is not shared, not model.config.tie_word_embeddings)
    if not a.tie and not all(layout):
        raise RuntimeError(f"the model is not the checkpoints' layout (encoder, decoder embeddings = shared, head "
                           f"{'tied' if a.tie else 'untied'}, config tie_word_embeddings {a.tie}): {layout}")
    return model


def shardbench_parameters(a):
    """param_count of fsdp_perf --plan for the same shape, or None where it is not built."""
    if not os.access(os.path.join(a.bin, "fsdp_perf"), os.X_OK):
        return None
    code, plan = runner.plan("fsdp_perf", ["--model", a.model, "--layers", str(a.layers), "--batch", "1", "--seq-len", "1",
                                           "--world-size", "1"], a.bin)
    if code not in (0, 3):
        raise RuntimeError(f"{os.path.join(a.bin, 'fsdp_perf')} --plan failed: {plan}")
    return plan["param_count"]


def main(argv):
    a = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"hf_t5_step: not available: PyTorch is not installed ({e})", file=sys.stderr)
        return NOT_AVAILABLE
    try:
        import transformers
    except ImportError as e:
        print(f"hf_t5_step: not available: transformers is not installed ({e})", file=sys.stderr)
        return NOT_AVAILABLE
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("hf_t5_step: not available: no CUDA device visible to PyTorch", file=sys.stderr)
        return NOT_AVAILABLE
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        model = build(torch, transformers, a, device)
        n_params = unique_parameters(model)
        sb_params = shardbench_parameters(a)
        print(f"# parameters: Hugging Face {n_params:,}, shardbench "
              f"{'(not built)' if sb_params is None else f'{sb_params:,}'} ({a.model}, {a.layers}+{a.layers} layers, "
              f"{a.ffn}, {'tied' if a.tie else 'untied'} head)", flush=True)
        if sb_params is not None and sb_params != n_params:
            print(f"hf_t5_step: error: parameter counts differ: Hugging Face {n_params:,}, shardbench {sb_params:,}",
                  file=sys.stderr)
            return 1
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                **({"fused": True} if cuda else {}))
        step_fn = model
        if a.compile:
            step_fn = torch.compile(model)
        gen = torch.Generator(device="cpu").manual_seed(1234)
        model_flops = torch_t5_step.plan_flops(a)[0]
        print(f"# torch {torch.__version__} transformers {transformers.__version__} "
              f"device {torch.cuda.get_device_name(device) if cuda else 'cpu'} params {n_params:,} "
              f"mode {'compile' if a.compile else 'eager'} checkpointing {int(a.activation_checkpointing)}",
              flush=True)
        times = []
        for step in range(1, a.warmup + a.steps + 1):
            enc = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=gen).to(device)
            dec = torch.randint(0, a.vocab, (a.batch, a.dec_seq_len), generator=gen).to(device)
            lab = torch.randint(0, a.vocab, (a.batch, a.dec_seq_len), generator=gen).to(device)
            sync()
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                loss = step_fn(input_ids=enc, decoder_input_ids=dec, labels=lab).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            dt = time.perf_counter() - t0
            warm = step <= a.warmup
            if not warm:
                times.append(dt)
            print(f"STEP step={step} loss={loss.item():.6f} ms={dt * 1e3:.3f}{' (warm-up)' if warm else ''}",
                  flush=True)
    except torch.cuda.OutOfMemoryError as e:
        print(f"hf_t5_step: error: CUDA out of memory at {a.model} layers {a.layers} batch {a.batch} "
              f"seq {a.seq_len} ({str(e).splitlines()[0]})", file=sys.stderr)
        return 1
    t = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0
    print(f"HF step_ms={t * 1e3:.3f} tflops={model_flops / t / 1e12 if model_flops else float('nan'):.4f} mode={'compile' if a.compile else 'eager'} "
          f"checkpointing={int(a.activation_checkpointing)} dtype={a.dtype} model={a.model} layers={a.layers} "
          f"batch={a.batch} seq={a.seq_len} dec_seq={a.dec_seq_len} params={n_params} "
          f"sb_params={'-' if sb_params is None else sb_params} peak_mem_gib={peak:.2f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main, sys.argv[1:]))
