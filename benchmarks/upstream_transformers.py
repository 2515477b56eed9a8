"""transformers' own text and vision transformers (tiny configs, built from a config: no weights), traced in train
and eval mode without a loss (``symgrad.trace_modes``), generated, bound, and trained 3 SGD steps in train mode,
dropout on, beside autograd in float64 at another batch and length; then run in eval mode without a new trace.

    /work/upvenv/bin/python -m benchmarks.upstream_transformers [--only gpt2 ...]      # WITHOUT the torchvision stub

Not part of the suite and never run by CI (it needs transformers, pinned by ``../shared/upstream/setup.sh``). Its
``MODELS`` also join ``benchmarks.upstream_check`` through ``SYMGRAD_UPSTREAM_MODELS=benchmarks.upstream_transformers``
(that check traces with a loss after the model's output, in blocks form).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F


class Logits(torch.nn.Module):
    """A transformers model's ``.logits`` from keyword inputs (``use_cache=False`` where the model takes it)."""

    def __init__(self, model: torch.nn.Module, flat: bool = False, **fixed):
        super().__init__()
        self.inner, self.flat, self.fixed = model, flat, fixed

    def forward(self, input_ids):
        logits = self.inner(input_ids=input_ids, **self.fixed).logits
        return logits.flatten(0, 1) if self.flat else logits


class WithTypes(Logits):
    def forward(self, input_ids, token_type_ids):
        return self.inner(input_ids=input_ids, token_type_ids=token_type_ids).logits


class Pixels(Logits):
    def forward(self, pixel_values):
        return self.inner(pixel_values=pixel_values).logits


def _gpt2():
    import transformers

    config = transformers.GPT2Config(
        vocab_size=1000, n_positions=32, n_embd=16, n_layer=2, n_head=2, attn_implementation="sdpa"
    )
    return transformers.GPT2LMHeadModel(config)


def _bert():
    import transformers

    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
        attn_implementation="sdpa",
    )
    return transformers.BertForSequenceClassification(config)


def _vit():
    import transformers

    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=5,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        attn_implementation="sdpa",
    )
    return transformers.ViTForImageClassification(config)


def _ids(shape):
    return lambda generator: {"input_ids": torch.randint(0, 1000, shape, generator=generator)}


CASES = {  # label -> (build, traced shapes, dtypes, the checked inputs from a generator)
    "gpt2 (use_cache=False)": (
        lambda: Logits(_gpt2(), use_cache=False),
        {"input_ids": (2, 5)},
        {"input_ids": "int64"},
        _ids((3, 7)),
    ),
    "gpt2 (as called)": (lambda: Logits(_gpt2()), {"input_ids": (2, 5)}, {"input_ids": "int64"}, _ids((3, 7))),
    "bert (token_type_ids passed)": (
        lambda: WithTypes(_bert()),
        {"input_ids": (2, 5), "token_type_ids": (2, 5)},
        {"input_ids": "int64", "token_type_ids": "int64"},
        lambda g: {
            "input_ids": torch.randint(0, 1000, (3, 7), generator=g),
            "token_type_ids": torch.randint(0, 2, (3, 7), generator=g),
        },
    ),
    "bert (input_ids alone)": (lambda: Logits(_bert()), {"input_ids": (2, 5)}, {"input_ids": "int64"}, _ids((3, 7))),
    "vit": (
        lambda: Pixels(_vit()),
        {"pixel_values": (2, 3, 16, 16)},
        {},
        lambda g: {"pixel_values": torch.randn(3, 3, 16, 16, generator=g, dtype=torch.float64)},
    ),
}


def _flat_gpt2():
    return Logits(_gpt2(), flat=True)  # [N * T, V]: the check's cross-entropy over every position


def _bert_any_types():
    model = _bert()
    config = model.config
    config.type_vocab_size = 1000  # the check draws every int64 input below 1000
    model.bert.embeddings.token_type_embeddings = torch.nn.Embedding(1000, config.hidden_size)
    return WithTypes(model)


try:
    from .upstream_check import Model
except ImportError:  # the upstream check is not in this tree
    MODELS: dict = {}
else:
    MODELS = {  # joins benchmarks.upstream_check: SYMGRAD_UPSTREAM_MODELS=benchmarks.upstream_transformers
        "transformers gpt2": Model(
            "transformers",
            _flat_gpt2,
            {"input_ids": (2, 5)},
            {"input_ids": (3, 7)},
            dtypes={"input_ids": "int64"},
            stub=False,
        ),
        "transformers bert": Model(
            "transformers",
            _bert_any_types,
            {"input_ids": (2, 5), "token_type_ids": (2, 5)},
            {"input_ids": (3, 7), "token_type_ids": (3, 7)},
            dtypes={"input_ids": "int64", "token_type_ids": "int64"},
            stub=False,
        ),
        "transformers bert (input_ids alone)": Model(
            "transformers",
            lambda: Logits(_bert()),
            {"input_ids": (2, 5)},
            {"input_ids": (3, 7)},
            dtypes={"input_ids": "int64"},
            stub=False,
        ),
        "transformers vit": Model(
            "transformers",
            lambda: Pixels(_vit()),
            {"pixel_values": (2, 3, 16, 16)},
            {"pixel_values": (3, 3, 16, 16)},
            stub=False,
        ),
    }


def check(label: str) -> str:
    """One row: how far the bound model's training and eval run from autograd's, or where it stopped."""
    import symgrad

    build, shapes, dtypes, data = CASES[label]
    torch.manual_seed(0)
    model = build().double().train()
    reference = copy.deepcopy(model)
    started = time.perf_counter()
    try:
        train_text, eval_text = symgrad.trace_modes(model, shapes, "parameters", "model", dtypes=dtypes)
    except Exception as error:  # noqa: BLE001 - a row, not a crash
        return f"| {label} | refused at trace: {str(error).splitlines()[0][:300]} |"
    traced = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        for text in (train_text, eval_text):
            if text is not None:
                symgrad.generate(text=text, label="model.yaml").write(folder)
        try:
            bound = symgrad.bind(Path(folder) / "model.py", model)
        except Exception as error:  # noqa: BLE001 - a row, not a crash
            return f"| {label} | refused at bind: {str(error).splitlines()[0][:300]} |"
        optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
        generator = torch.Generator().manual_seed(1)
        worst_loss = 0.0
        for step in range(3):
            inputs = data(generator)
            losses = []
            for net, optimizer in zip((bound, reference), optimizers):
                optimizer.zero_grad()
                torch.manual_seed(100 + step)  # the same dropout masks
                logits = net(**inputs)
                if "input_ids" in inputs and logits.dim() == 3:  # next-token cross-entropy, flattened, ignore_index
                    targets = inputs["input_ids"][:, 1:].clone()
                    targets[0, :2] = -100
                    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=-100)
                else:
                    loss = F.cross_entropy(logits, torch.arange(logits.shape[0]) % logits.shape[1])
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
            worst_loss = max(worst_loss, abs(losses[0].item() - losses[1].item()))
        parameters = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
        model.eval()
        reference.eval()
        inputs = data(generator)
        with torch.no_grad():
            evaluated = (bound(**inputs) - reference(**inputs)).abs().max().item()
    dropout = train_text.count("op: dropout")
    return f"| {label} | {dropout} | {worst_loss:.1e} | {parameters:.1e} | {evaluated:.1e} | {traced:.1f} s |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| model | dropout layers (train) | loss diff, 3 steps | parameters after 3 steps | eval output | trace |")
    print("|---|---|---|---|---|---|")
    for label in CASES:
        if args.only and not any(word in label for word in args.only):
            continue
        print(check(label), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
