"""Train a tiny character-level GPT on text bundled with Python with symgrad's explicit gradients, and the
same model from the same seed with autograd.

The text is the docstrings of a few standard-library modules (``inspect.getdoc``: nothing is downloaded),
one character a token. The model is written as nanoGPT writes it: token and position embeddings (positions
``torch.arange(t)``, ``t`` read from the batch), the token table tied to the output layer, causal
``scaled_dot_product_attention`` with dropout inside it, LayerNorm, a GELU MLP and residual dropout. It is
traced once without a loss (``symgrad.trace_modes``: its train and eval modes), generated into a temporary
folder and bound (``symgrad.bind``): the bound model returns the logits, and the next-token cross-entropy
over the flattened logits (``ignore_index`` for the character after a document's end), AdamW and the
sampling are plain PyTorch. A deep copy trains with autograd, each step drawing its dropout masks from the
same seed (on the CPU the bound model draws the model's own masks). The script prints both loss curves, the
largest relative difference of the parameters at the end, and a sample of each model in eval mode (its
length grows one character a step: the positions follow it, with no new trace); in float64 the two
runs must agree to 1e-10, else it exits 1::

    python examples/train_tiny_gpt.py                     # float64, 150 steps: seconds on 2 CPU cores
    python examples/train_tiny_gpt.py --dtype float32     # the curves agree to rounding
    python examples/train_tiny_gpt.py --steps 3 --layers 1 --embd 16   # a quick check of the agreement
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad

MODULES = ("collections", "functools", "itertools", "textwrap", "string", "json", "heapq", "bisect", "random")
"""Whose docstrings are the text (a module's docstring, one document each)."""


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (part.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for part in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.1):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT and GPT-2

    def forward(self, idx):
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def corpus() -> tuple[torch.Tensor, list[str], int]:
    """The docstrings as one tensor of character ids, the characters, and the id of the document separator."""
    documents = [inspect.getdoc(importlib.import_module(name)) or "" for name in MODULES]
    separator = "\0"
    text = separator.join(documents)
    characters = sorted(set(text))
    ids = {character: index for index, character in enumerate(characters)}
    return torch.tensor([ids[character] for character in text], dtype=torch.int64), characters, ids[separator]


def batch(data: torch.Tensor, size: int, length: int, separator: int, generator: torch.Generator):
    """``size`` random windows of ``length`` characters and the characters that follow them; the character
    after a document's end is no target (``-1``, the loss's ignore_index)."""
    starts = torch.randint(0, len(data) - length - 1, (size,), generator=generator)
    inputs = torch.stack([data[start : start + length] for start in starts])
    targets = torch.stack([data[start + 1 : start + length + 1] for start in starts])
    return inputs, targets.masked_fill(inputs == separator, -1)


def sample(model: nn.Module, prompt: torch.Tensor, count: int, block_size: int) -> torch.Tensor:
    """``count`` characters after ``prompt``, each drawn from the model's next-character probabilities (a
    generator of its own, seeded: two models with equal logits write the same text), in eval mode."""
    model.eval()
    idx, generator = prompt, torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _ in range(count):
            logits = model(idx[:, -block_size:])  # 4, 5, ... characters: the positions follow, no new trace
            drawn = torch.multinomial(torch.softmax(logits[:, -1], -1), 1, generator=generator)
            idx = torch.cat([idx, drawn], dim=1)
    model.train()
    return idx[:, prompt.shape[1] :]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--block", type=int, default=32, help="context length (traced at 8)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embd", type=int, default=32)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sample", type=int, default=60, help="characters each model writes at the end")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)  # tiny matrices: threads only spin
    data, characters, separator = corpus()
    frequencies = torch.bincount(data).double() / len(data)
    frequencies = frequencies[frequencies > 0]
    print(
        f"text: docstrings of {', '.join(MODULES)}: {len(data)} characters, {len(characters)} distinct; "
        f"the characters' frequencies alone score a loss of {-(frequencies * frequencies.log()).sum().item():.2f}"
    )

    torch.manual_seed(0)
    model = GPT(len(characters), args.block, args.layers, 2, args.embd, args.dropout).to(dtype)
    reference = copy.deepcopy(model)  # trained with autograd from the same weights
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        traced = max(2, min(8, args.block - 2))  # a length within the table of positions, at the second run's too
        train_spec, eval_spec = symgrad.trace_modes(
            model, {"idx": (2, traced)}, wrt="parameters", name="tiny_gpt", dtypes={"idx": "int64"}
        )
        for text in (train_spec, eval_spec):
            symgrad.generate(text=text, label="tiny_gpt.yaml").write(folder)
        fast = symgrad.bind(Path(folder) / "tiny_gpt.py", model)
        print(f"traced, generated and bound in {time.perf_counter() - started:.1f} s")
        runs = {"symgrad": (fast, model), "autograd": (reference, reference)}
        optimizers = {name: torch.optim.AdamW(trained.parameters(), lr=args.lr) for name, (_, trained) in runs.items()}
        curves: dict[str, list[float]] = {name: [] for name in runs}
        generator = torch.Generator().manual_seed(1)
        started = time.perf_counter()
        for step in range(args.steps):
            inputs, targets = batch(data, args.batch, args.block, separator, generator)
            for name, (runner, _) in runs.items():
                torch.manual_seed(1000 + step)  # the same dropout masks for both
                logits = runner(inputs)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
                optimizers[name].zero_grad()
                loss.backward()
                optimizers[name].step()
                curves[name].append(loss.item())
            if step % max(args.steps // 10, 1) == 0 or step == args.steps - 1:
                print(
                    f"step {step:4d}: loss symgrad {curves['symgrad'][-1]:.12f} autograd {curves['autograd'][-1]:.12f}"
                )
        print(f"{args.steps} steps of both in {time.perf_counter() - started:.1f} s")
        prompt = data[:4].unsqueeze(0)
        samples = {
            name: "".join(characters[i] for i in sample(runner, prompt, args.sample, args.block)[0].tolist())
            for name, (runner, _) in runs.items()
        }
    for name, text in samples.items():
        print(f"{name} writes: {text!r}")
    difference = max(
        ((p - q).abs().max() / q.abs().max().clamp_min(1e-30)).item()
        for p, q in zip(model.parameters(), reference.parameters())
    )
    curve = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(curves["symgrad"], curves["autograd"]))
    ok = dtype != torch.float64 or max(difference, curve) <= 1e-10
    print(
        f"largest relative difference: parameters {difference:.2e}, loss curve {curve:.2e} "
        + ("[ok]" if ok else "[above 1e-10]")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
