"""An argument of the forward named as one of the model's buffers (transformers' BERT: ``position_ids`` and
``token_type_ids`` are both ``forward`` arguments and buffers of its embeddings; here at the top level, where
the names meet). The argument is data, the buffer a model tensor: before, the spec gave the argument the
buffer's ``source`` (the trace named both ``position_ids``) and bind read the buffer where the caller passed
ids (a permuted ``position_ids`` trained on the buffer's, silently), or refused to run."""

from __future__ import annotations

import copy

import torch
from torch import nn

import symgrad
from symgrad.trace import trace
from tests.helpers import load_yaml
from tests.trace.test_text_transformers import _generated


class Positions(nn.Module):
    def __init__(self):
        super().__init__()
        self.position_embeddings = nn.Embedding(6, 3)
        self.register_buffer("position_ids", torch.arange(6).expand((1, -1)), persistent=False)

    def forward(self, x, position_ids=None):
        if position_ids is None:
            position_ids = self.position_ids[:, : x.shape[1]]
        return torch.tanh(x * self.position_embeddings(position_ids))


def test_the_argument_is_read_where_the_caller_passes_it_not_the_buffer_of_its_name(tmp_path):
    torch.manual_seed(3)
    model = Positions().double()
    text = trace(model, {"x": (2, 4, 3), "position_ids": (1, 4)}, "parameters", "net", dtypes={"position_ids": "int64"})
    inputs = load_yaml(text)["inputs"]
    assert "source" not in inputs["position_ids"], inputs
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    x = torch.randn(3, 5, 3, dtype=torch.float64)
    ids = torch.tensor([[5, 0, 3, 3, 1]])
    outputs = [net(x, position_ids=ids) for net in (fast, reference)]
    assert (outputs[0] - outputs[1]).abs().max().item() <= 1e-12
    for output in outputs:
        (output * torch.tensor([0.3, -1.1, 0.7], dtype=torch.float64)).sum().backward()
    grads = model.position_embeddings.weight.grad, reference.position_embeddings.weight.grad
    assert grads[1][2].abs().sum() == 0 and grads[1][5].abs().sum() > 0  # the rows the ids pick, not the buffer's
    assert (grads[0] - grads[1]).abs().max().item() <= 1e-12


class TypesAtPositions(nn.Module):
    """BERT's token types when position_ids are passed and token_type_ids not (modeling_bert.py:91-93): the type
    buffer gathered at the caller's position_ids, here [1, T], expanded to the batch."""

    def __init__(self):
        super().__init__()
        self.token_type_embeddings = nn.Embedding(3, 3)
        self.register_buffer("position_ids", torch.arange(8).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", (torch.arange(8) % 3).view(1, -1), persistent=False)

    def forward(self, x, position_ids):
        batch_size, seq_length = x.shape[:2]
        buffered = torch.gather(self.token_type_ids.expand(position_ids.shape[0], -1), dim=1, index=position_ids)
        return torch.tanh(x * self.token_type_embeddings(buffered.expand(batch_size, seq_length)))


def test_types_gathered_at_passed_positions_follow_their_length(tmp_path):
    """Traced at length 3, run at 5: before, the rows were reshaped to the traced [1, 3, 3] and a call at
    another length refused ('shape [1, 3, 3] is invalid for input of size 15'); transformers' BERT called with
    position_ids [1, T] the same (benchmarks/upstream_transformers.py's model, at [3, 7])."""
    torch.manual_seed(2)
    model = TypesAtPositions().double()
    shapes = {"x": (2, 3, 3), "position_ids": (1, 3)}
    text = trace(model, shapes, "parameters", "net", dtypes={"position_ids": "int64"})
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    x, ids = torch.randn(3, 5, 3, dtype=torch.float64), torch.tensor([[6, 1, 2, 7, 3]])
    outputs = [net(x, position_ids=ids) for net in (fast, reference)]
    assert (outputs[0] - outputs[1]).abs().max().item() <= 1e-12
    for output in outputs:
        (output * torch.tensor([0.3, -1.1, 0.7], dtype=torch.float64)).sum().backward()
    grads = model.token_type_embeddings.weight.grad, reference.token_type_embeddings.weight.grad
    assert grads[1].abs().sum(1).min() > 0
    assert (grads[0] - grads[1]).abs().max().item() <= 1e-12
