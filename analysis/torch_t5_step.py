#!/usr/bin/env python3
"""The synthetic T5 training step of shardbench, written directly in PyTorch: the reference
that scripts/gpu-check.sh times our CUDA backend against, on the same shapes and GPU.

Same model as src/model/t5*.cpp (Hugging Face T5 semantics, no `transformers` needed): RMS
norm without bias (T5LayerNorm), attention without 1/sqrt(d_kv) scaling, relative position
bias (HF bucketing; one table per stack, used by every block of it; none in cross-attention),
ReLU feed-forward or T5 v1.1's gated GELU (--ffn gated-gelu: wo(gelu_tanh(wi_0 x) * wi_1 x)),
LM head tied to the shared embedding with the d_model^-0.5 rescale or a separate lm_head
without it (--tie-embeddings no; the v1.1 and Flan-T5 presets), mean token cross-entropy,
Adam (bias-corrected, no weight decay). fp32 by default (TF32 off, as in the CUDA backend
unless SB_CUDA_TF32=1); --dtype bf16 runs forward and loss under bf16 autocast.

Prints one line per step (LOSS step=.. loss=.. ms=..) and a summary for machines:
  TORCH step_ms=412.345 tflops=12.3456 dtype=fp32 ... (median over the timed steps)
TFLOPS use shardbench's one FLOP formula (src/model/spec.cpp), read from the program's own
plan of the same shapes (`ddp_perf --plan --schedule-json` from --bin, nothing allocated;
without it TFLOPS are not printed): 3 × forward matmul FLOPs, attention scores/context and LM
head included; with --activation-checkpointing the hardware figure (hw_tflops) adds the
recomputed block forwards.

--init shardbench reproduces shardbench's initial weights and tokens exactly (the same
counter-based hash, src/model/data.cpp), so on the CPU
  python3 analysis/torch_t5_step.py --model t5-tiny --device cpu --init shardbench \
      --batch 2 --seq-len 12 --dec-seq-len 8 --steps 3 --warmup 0
prints the losses that `ddp_perf --model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8`
prints on one rank (to about 1e-6).
"""
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli  # noqa: E402
import runner  # noqa: E402

try:
    import numpy as np
except ImportError as e:  # PyTorch installs bring numpy; a bare interpreter may not have it
    sys.exit(f"torch_t5_step: error: numpy is not installed ({e}); run with the python that has PyTorch")

# The presets of src/model/spec.cpp: d_model, d_ff, layers, heads, d_kv, vocab, ffn, tied LM
# head (tests/analysis_tests.sh checks them against the programs' own, fsdp_perf --plan).
PRESETS = {
    "t5-611m": (1024, 2816, 24, 16, 64, 32128, "relu", True),
    "t5-2.28b": (2048, 5120, 24, 32, 64, 32128, "relu", True),
    "t5-11.3b": (1024, 65536, 24, 128, 128, 32128, "relu", True),
    "t5-small": (256, 1024, 4, 4, 64, 8192, "relu", True),
    "t5-tiny": (32, 64, 2, 2, 8, 96, "relu", True),
}
# T5 v1.1 and Flan-T5 (Hugging Face's configurations): gated GELU, untied head.
for _family in ("t5-v1_1-", "flan-t5-"):
    for _size, (_d, _ff, _layers, _heads) in {"small": (512, 1024, 8, 6), "base": (768, 2048, 12, 12),
                                               "large": (1024, 2816, 24, 16), "xl": (2048, 5120, 24, 32),
                                               "xxl": (4096, 10240, 24, 64)}.items():
        PRESETS[_family + _size] = (_d, _ff, _layers, _heads, 64, 32128, "gated-gelu", False)
NORM_EPS = 1e-6  # T5LayerNorm variance_epsilon


def parse_args(argv):
    p = cli.parser(__doc__, __file__)
    p.add_argument("--model", default="t5-11.3b", choices=sorted(PRESETS), help="preset (default: t5-11.3b)")
    for flag in ("d-model", "d-ff", "layers", "heads", "d-kv", "vocab"):
        p.add_argument("--" + flag, type=int,
                       help=f"override the preset's {flag.replace('-', '_')} (default: the preset's)")
    p.add_argument("--ffn", choices=["relu", "gated-gelu"], help="feed-forward block (default: the preset's)")
    p.add_argument("--tie-embeddings", choices=["yes", "no"],
                   help="LM head: the shared embedding (yes) or a matrix of its own (no) (default: the preset's)")
    p.add_argument("--num-buckets", type=int, default=32, help="relative-attention buckets (default: 32)")
    p.add_argument("--max-distance", type=int, default=128, help="relative-attention max distance (default: 128)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default: 8)")
    p.add_argument("--seq-len", type=int, default=512, help="encoder tokens per sequence (default: 512)")
    p.add_argument("--dec-seq-len", type=int, help="decoder tokens per sequence (default: --seq-len)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default: 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default: 2)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="fp32, or bf16: forward and loss under bf16 autocast (default: fp32)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 in fp32 matmuls (SB_CUDA_TF32=1 equivalent)")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in backward")
    p.add_argument("--sdpa", action="store_true",
                   help="attention through F.scaled_dot_product_attention (fused kernels) instead of matmuls")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: 0.001)")
    p.add_argument("--seed", type=int, default=1234, help="seed of weights and tokens (default: 1234)")
    p.add_argument("--init", default="random", choices=["random", "shardbench"],
                   help="random, or shardbench: bit-identical initial weights and tokens to shardbench's "
                        "(default: random)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (a smoke test) (default: cuda)")
    p.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"),
                   help="folder of ddp_perf, whose plan gives the FLOP count (default: build/bin of this checkout)")
    a = p.parse_args(argv)
    d, ff, layers, heads, dkv, vocab, ffn, tie = PRESETS[a.model]
    a.ffn = a.ffn or ffn
    a.tie = tie if a.tie_embeddings is None else a.tie_embeddings == "yes"
    a.d_model = a.d_model or d
    a.d_ff = a.d_ff or ff
    a.layers = a.layers or layers
    a.heads = a.heads or heads
    a.d_kv = a.d_kv or dkv
    a.vocab = a.vocab or vocab
    a.dec_seq_len = a.dec_seq_len or a.seq_len
    for name in ("d_model", "d_ff", "layers", "heads", "d_kv", "vocab", "batch", "seq_len", "dec_seq_len", "steps"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


# ---------------------------------------------------------------- FLOPs (the program's plan)
def plan_flops(a):
    """(model, hardware) FLOPs of one step at these shapes, from the program's own plan (the
    one formula, src/model/spec.cpp); (None, None) with the reason printed when the program
    cannot run here."""
    shape = [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("d_model", "d_ff", "layers", "heads", "d_kv", "vocab")]
    shape += [f"--ffn={a.ffn}", f"--tie-embeddings={'yes' if a.tie else 'no'}"]
    flags = ["--model", a.model, *shape, f"--batch={a.batch}", f"--seq-len={a.seq_len}", f"--dec-seq-len={a.dec_seq_len}",
             "--world-size", "1", "--mem-limit-gib", "1e6"] + (["--activation-checkpointing"] if a.activation_checkpointing
                                                               else [])
    try:
        code, s = runner.plan("ddp_perf", flags, a.bin, own_session=True)  # an MPI singleton's own session folder
    except cli.BadInput as e:
        print(f"# no FLOP count: {e}", flush=True)
        return None, None
    if code != 0:
        print(f"# no FLOP count: ddp_perf --plan {' '.join(flags)} failed: "
              f"{s if isinstance(s, str) else 'does not fit'}", flush=True)
        return None, None
    return s["model_flops_per_step"], s["hardware_flops_per_step"]


# ---------------------------------------------------------------- shardbench's hash (rng.h)
U64 = np.uint64


def mix64(x):
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic, like C++)."""
    x = np.asarray(x, dtype=U64)
    with np.errstate(over="ignore"):
        x = x + U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> U64(27))) * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


def hash_index(key, i):
    return mix64(mix64(U64(key)) ^ np.asarray(i, dtype=U64))


def combine_key(a, b):
    return int(mix64(U64((int(a) * 0x100000001B3) & (2**64 - 1)) ^ U64(b)))


def uniform_pm1(key, n):
    h = hash_index(key, np.arange(n, dtype=U64))
    return (h >> U64(40)).astype(np.float32) * np.float32(2.0 / 16777216.0) - np.float32(1.0)


# ---------------------------------------------------------------- the model
def unit_layout(a):
    """Every tensor by its random stream (TensorSpec::stream_block in model.h): block 0 the
    tensors outside the blocks (shardbench's first layout, one root unit; its units now are
    embedding, bridge and head: model_units in spec.cpp), blocks 1..2L the encoder's, then the
    decoder's: (name, shape, init scale or None for ones). The order gives each tensor's
    index in its init key."""
    inner = a.heads * a.d_kv

    def linear(name, out, inp):
        return (name, (out, inp), float(np.float32(1.0) / np.sqrt(np.float32(inp))))

    def attention(p):
        return [linear(p + ".q", inner, a.d_model), linear(p + ".k", inner, a.d_model),
                linear(p + ".v", inner, a.d_model), linear(p + ".o", a.d_model, inner)]

    units = [("root", [("shared", (a.vocab, a.d_model), 1.0), ("encoder.final_norm", (a.d_model,), None),
                       ("decoder.final_norm", (a.d_model,), None)])]
    if not a.tie:
        units[0][1].append(linear("lm_head", a.vocab, a.d_model))
    for stack in ("encoder", "decoder"):
        for l in range(a.layers):
            t = [("rel_bias", (a.num_buckets, a.heads), 0.5)] if l == 0 else []
            t += [("ln1", (a.d_model,), None)] + attention("self") + [("ln2", (a.d_model,), None)]
            if stack == "decoder":
                t += attention("cross") + [("ln3", (a.d_model,), None)]
            if a.ffn == "gated-gelu":
                t += [linear("wi_0", a.d_ff, a.d_model), linear("wi_1", a.d_ff, a.d_model)]
            else:
                t += [linear("wi", a.d_ff, a.d_model)]
            t += [linear("wo", a.d_model, a.d_ff)]
            units.append((f"{stack}.{l}", t))
    return units


def init_params(torch, a, device):
    params = {}
    gen = torch.Generator().manual_seed(a.seed)
    for u, (unit, tensors) in enumerate(unit_layout(a)):
        for ti, (name, shape, scale) in enumerate(tensors):
            n = int(np.prod(shape))
            if scale is None:
                v = torch.ones(shape)
            elif a.init == "shardbench":
                key = combine_key(combine_key(a.seed, u), ti)
                v = torch.from_numpy(np.float32(scale) * uniform_pm1(key, n)).reshape(shape)
            else:
                v = (torch.rand(shape, generator=gen) * 2 - 1) * scale
            params[f"{unit}.{name}"] = torch.nn.Parameter(v.to(device))
    return params


def make_tokens(a, step):
    """src/model/data.cpp make_tokens for sequences 0..batch-1 of `step`."""
    B, Te, Td = a.batch, a.seq_len, a.dec_seq_len
    enc = np.zeros((B, Te), np.int64)
    labels = np.zeros((B, Td), np.int64)
    for b in range(B):
        key = combine_key(combine_key(a.seed, step), b)
        enc[b] = hash_index(key, np.arange(Te)) % U64(a.vocab)
        labels[b] = hash_index(key, np.arange(Te, Te + Td)) % U64(a.vocab)
    dec = np.concatenate([np.zeros((B, 1), np.int64), labels[:, :-1]], axis=1)
    return enc, dec, labels


def relative_position_bucket(torch, rel, bidirectional, num_buckets, max_distance):
    """Hugging Face T5Attention._relative_position_bucket (relative = key − query)."""
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).to(torch.long) * num_buckets
        rel = torch.abs(rel)
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, rel, large)


class T5:
    def __init__(self, torch, a, params, device):
        self.torch, self.a, self.p = torch, a, params
        self.F = torch.nn.functional
        self.buckets = []
        for bidirectional, T in ((True, a.seq_len), (False, a.dec_seq_len)):
            pos = torch.arange(T, device=device)
            self.buckets.append(relative_position_bucket(torch, pos[None, :] - pos[:, None], bidirectional,
                                                         a.num_buckets, a.max_distance))

    def norm(self, x, w):  # T5LayerNorm: the variance in fp32 even under autocast
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * self.torch.rsqrt(var + NORM_EPS)).to(x.dtype) * w

    def attention(self, pre, x, kv, bias, causal):
        a, torch = self.a, self.torch
        B, tq, tk, H, dkv = x.shape[0], x.shape[1], kv.shape[1], a.heads, a.d_kv
        heads = lambda t, n: t.view(B, n, H, dkv).transpose(1, 2)  # [B, H, n, dkv]
        q = heads(self.F.linear(x, self.p[pre + ".q"]), tq)
        k = heads(self.F.linear(kv, self.p[pre + ".k"]), tk)
        v = heads(self.F.linear(kv, self.p[pre + ".v"]), tk)
        mask = None
        if causal:
            mask = torch.triu(torch.full((tq, tk), float("-inf"), device=x.device), diagonal=1)
        if bias is not None:
            mask = bias if mask is None else bias + mask
        if self.a.sdpa:
            ctx = self.F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype),
                                                      scale=1.0)
        else:
            scores = q @ k.transpose(-1, -2)  # T5: no 1/sqrt(d_kv)
            if mask is not None:
                scores = scores + mask
            ctx = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        return self.F.linear(ctx.transpose(1, 2).reshape(B, tq, H * dkv), self.p[pre + ".o"])

    def block(self, stack, l, x, bias, enc_out):
        p = f"{stack}.{l}."
        xn = self.norm(x, self.p[p + "ln1"])
        x = x + self.attention(p + "self", xn, xn, bias, stack == "decoder")  # causal in the decoder
        ln = p + "ln2"
        if stack == "decoder":
            x = x + self.attention(p + "cross", self.norm(x, self.p[p + "ln2"]), enc_out, None, False)
            ln = p + "ln3"
        xn = self.norm(x, self.p[ln])
        if self.a.ffn == "gated-gelu":  # HF's "gelu_new" is the tanh form
            h = self.F.gelu(self.F.linear(xn, self.p[p + "wi_0"]), approximate="tanh") * \
                self.F.linear(xn, self.p[p + "wi_1"])
        else:
            h = self.F.relu(self.F.linear(xn, self.p[p + "wi"]))
        return x + self.F.linear(h, self.p[p + "wo"])

    def run_stack(self, stack, x, enc_out=None):
        table = self.p[f"{stack}.0.rel_bias"]
        bias = table[self.buckets[stack == "decoder"]].permute(2, 0, 1)  # [H, T, T]
        for l in range(self.a.layers):
            if self.a.activation_checkpointing:
                x = self.torch.utils.checkpoint.checkpoint(self.block, stack, l, x, bias, enc_out,
                                                           use_reentrant=False)
            else:
                x = self.block(stack, l, x, bias, enc_out)
        return x

    def loss(self, enc_ids, dec_ids, labels):
        shared = self.p["root.shared"]
        enc = self.norm(self.run_stack("encoder", shared[enc_ids]), self.p["root.encoder.final_norm"])
        dec = self.run_stack("decoder", shared[dec_ids], enc)
        hn = self.norm(dec, self.p["root.decoder.final_norm"])
        if self.a.tie:  # HF rescales only a tied head
            logits = self.F.linear(hn * (self.a.d_model ** -0.5), shared)
        else:
            logits = self.F.linear(hn, self.p["root.lm_head"])
        return self.F.cross_entropy(logits.float().view(-1, self.a.vocab), labels.view(-1))


def main(argv):
    a = parse_args(argv)
    try:
        import torch
        import torch.utils.checkpoint  # noqa: F401  (torch.utils.checkpoint.checkpoint)
    except ImportError as e:
        print(f"torch_t5_step: error: PyTorch is not installed ({e})", file=sys.stderr)
        return 1
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("torch_t5_step: error: no CUDA device visible to PyTorch (torch.cuda.is_available() is False); "
              "use --device cpu for a smoke test", file=sys.stderr)
        return 1
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if a.sdpa and (sdpa is None or "scale" not in (sdpa.__doc__ or "")):
        print("torch_t5_step: error: --sdpa needs PyTorch >= 2.1 (the scale argument)", file=sys.stderr)
        return 1
    device = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    params = init_params(torch, a, device)
    model = T5(torch, a, params, device)
    adam_kw = {"fused": True} if cuda and "fused" in torch.optim.Adam.__init__.__code__.co_varnames else {}
    opt = torch.optim.Adam(params.values(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, **adam_kw)
    model_flops, hw_flops = plan_flops(a)
    n_params = sum(p.numel() for p in params.values())
    print(f"# torch {torch.__version__} device {torch.cuda.get_device_name(device) if cuda else 'cpu'} "
          f"params {n_params:,} dtype {a.dtype} tf32 {a.tf32} activation checkpointing "
          f"{a.activation_checkpointing} sdpa {a.sdpa}",
          flush=True)

    times, losses = [], []
    for step in range(1, a.warmup + a.steps + 1):
        enc, dec, lab = (torch.from_numpy(t).to(device) for t in make_tokens(a, step))
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = model.loss(enc, dec, lab)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        warm = step <= a.warmup
        if not warm:
            times.append(dt)
        print(f"LOSS step={step} loss={losses[-1]:.6f} ms={dt * 1e3:.3f}{' (warm-up)' if warm else ''}", flush=True)

    t = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0
    tflops = lambda flops: f"{flops / t / 1e12:.4f}" if flops else "nan"  # noqa: E731
    print(f"TORCH step_ms={t * 1e3:.3f} tflops={tflops(model_flops)} hw_tflops={tflops(hw_flops)} "
          f"dtype={a.dtype} tf32={int(a.tf32)} activation_checkpointing={int(a.activation_checkpointing)} "
          f"sdpa={int(a.sdpa)} "
          f"d_model={a.d_model} d_ff={a.d_ff} layers={a.layers} heads={a.heads} d_kv={a.d_kv} vocab={a.vocab} "
          f"ffn={a.ffn} tie_embeddings={int(a.tie)} "
          f"batch={a.batch} seq={a.seq_len} dec_seq={a.dec_seq_len} params={n_params} "
          f"peak_mem_gib={peak:.2f} loss={losses[-1]:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(__file__, main, sys.argv[1:]))
