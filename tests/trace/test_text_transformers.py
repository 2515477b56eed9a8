"""Text transformers (issue 63): ``nn.Embedding`` / ``F.embedding`` (token and position tables, ``padding_idx``,
the table tied to the output layer), positions from ``torch.arange(t)`` with ``t`` read from the input's size,
and dropout inside ``scaled_dot_product_attention`` in training mode, drawn as the model draws it. The target is
a nanoGPT-style GPT (``tests/models/zoo_gpt.py``) trained with ``symgrad.bind`` beside autograd in float64."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, trace, trace_modes
from tests.helpers import load_yaml
from tests.models.zoo_gpt import GPT


def _generated(tmp_path, *texts):
    """Each spec generated into ``tmp_path``; the first one's module path."""
    paths = []
    for text in texts:
        built = build_text(text, "traced.yaml")
        for name, content in built.rendered.files.items():
            (tmp_path / name).write_text(content)
        paths.append(tmp_path / f"{built.graph.spec.name}.py")
    return paths[0]


@pytest.fixture(scope="module")
def gpt_module(tmp_path_factory):
    """The GPT traced in train and eval mode at idx [2, 5], generated: (the train-mode spec, the module path)."""
    torch.manual_seed(0)
    model = GPT().double()
    train_text, eval_text = trace_modes(model, {"idx": (2, 5)}, "parameters", "tiny_gpt", dtypes={"idx": "int64"})
    assert eval_text is not None and "op: dropout" not in eval_text and "attention_probabilities" not in eval_text
    return train_text, _generated(tmp_path_factory.mktemp("gpt"), train_text, eval_text)


def test_a_nanogpt_trains_with_dropout_equal_to_autograd_and_evaluates_without_a_new_trace(gpt_module, monkeypatch):
    text, path = gpt_module
    spec = load_yaml(text)
    assert "lm_head_weight" not in spec["inputs"]  # the tied table is one input, read by the embedding and the head
    ops = [layer["op"] for layer in spec["layers"]]
    assert ops.count("dropout") == 4 and "attention_probabilities" in ops and "embedding" in ops
    position = next(
        layer for layer in spec["layers"] if layer["op"] == "narrow" and layer["in"] == "transformer_wpe_weight"
    )
    assert position["length"] == {"like": "idx", "dims": [1]}  # torch.arange(t): t read from idx at run time
    torch.manual_seed(0)
    model = GPT().double()
    reference = copy.deepcopy(model)
    fast = symgrad.bind(path, model)
    monkeypatch.setattr(symgrad.trace, "trace", None)  # nothing below traces again
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.5) for net in (model, reference)]
    for step in range(3):  # another batch and length than traced
        idx = torch.randint(0, 11, (3, 7))
        targets = torch.randint(0, 11, (3, 7))
        targets[0, :2] = -1  # ignored positions
        losses = []
        for net, optimizer in zip((fast, reference), optimizers):
            optimizer.zero_grad()
            torch.manual_seed(100 + step)  # the same dropout masks: drawn by the same calls, in the same order
            logits = net(idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        assert torch.equal(losses[0], losses[1]), (step, losses)  # the forward is the model's, bit for bit
    for (key, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert (ours - theirs).abs().max().item() <= 1e-10, key
    assert model.lm_head.weight is model.transformer.wte.weight
    model.eval()
    reference.eval()
    idx = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        assert (fast(idx) - reference(idx)).abs().max().item() <= 1e-12


def test_the_attention_dropout_masks_are_the_models_own_draws_bit_for_bit(gpt_module):
    """Same seed: the same logits, to the bit (float64 and float32: the CPU math kernel's steps, the same
    draws); another seed: other masks, so that the test above cannot pass by chance."""
    _, path = gpt_module
    for dtype in (torch.float64, torch.float32):
        torch.manual_seed(0)
        model = GPT().to(dtype)
        reference = copy.deepcopy(model)
        fast = symgrad.bind(path, model)
        idx = torch.randint(0, 11, (4, 6))
        torch.manual_seed(3)
        ours = fast(idx)
        torch.manual_seed(3)
        theirs = reference(idx)
        torch.manual_seed(4)
        other = reference(idx)
        assert torch.equal(ours, theirs), dtype
        assert (other - theirs).abs().max().item() > 1e-3


class Padded(nn.Module):
    """Token ids with a padding token (0) whose row gets no gradient, and learned positions."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(6, 4, padding_idx=0)
        self.positions = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 6)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device).unsqueeze(0)  # [1, T], as GPT-2 makes them
        return self.head(torch.tanh(self.tokens(idx) + self.positions(positions)))


def test_padding_idx_gets_no_gradient_and_positions_follow_the_length(tmp_path):
    torch.manual_seed(1)
    model = Padded().double()
    text = trace(model, {"idx": (2, 3)}, "parameters", "padded", dtypes={"idx": "int64"})
    assert "padding_idx: 0" in text and "length: {like: idx, dims: [1]}" in text
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    idx = torch.tensor([[0, 3, 0, 5, 1], [2, 0, 0, 4, 4], [1, 1, 2, 0, 3]])  # another batch and length
    targets = torch.randint(0, 6, (3, 5))
    for net in (fast, reference):
        F.cross_entropy(net(idx).transpose(1, 2), targets).backward()
    assert model.tokens.weight.grad[0].abs().max().item() == 0 and model.tokens.weight.grad[1:].abs().max().item() > 0
    assert (
        model.positions.weight.grad[5:].abs().max().item() == 0
        and model.positions.weight.grad[4].abs().max().item() > 0
    )
    for (key, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(ours.grad, theirs.grad, rtol=0, atol=1e-12), key


@pytest.mark.parametrize(
    "argument, words",
    [
        ({"max_norm": 1.0}, "max_norm"),
        ({"sparse": True}, "sparse"),
        ({"scale_grad_by_freq": True}, "scale_grad_by_freq"),
    ],
)
def test_embedding_arguments_the_backward_does_not_follow_are_refused_at_the_users_line(argument, words):
    table = nn.Embedding(5, 3, **argument).double()

    def forward(x, idx):
        return x * table(idx)

    with pytest.raises(TraceError, match=rf"test_text_transformers.py:\d+: error: 'embedding'.*{words}") as error:
        trace(forward, {"x": (2, 3), "idx": (2,)}, dtypes={"idx": "int64"}, loss=LossChoice("half_sq_error"))
    assert len(str(error.value).splitlines()) == 1


def test_an_embedding_spec_reads_as_the_op(tmp_path):
    """The emitted forward is F.embedding, the gradient an index_add of the gradient rows (autograd's
    embedding_backward, equal to it bit for bit on the CPU), with padding_idx's row filled with 0."""
    text = (
        "name: table\ninputs:\n  w: {shape: [5, 3]}\n  i: {shape: [2, 4], dtype: int64}\n  y: {shape: [2, 4, 3]}\nlayers:\n"
        "  - {op: embedding, in: i, weight: w, padding_idx: 2}\nloss: {op: half_sq_error, target: y}\nwrt: [w]\n"
    )
    built = build_text(text, "table.yaml")
    code = built.rendered.files["table.py"]
    assert "F.embedding(i, w, padding_idx=2)" in code and ".index_fill(0, i.new_tensor([2]), 0)" in code
    module = module_from_source(code, "table")
    w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    i = torch.tensor([[2, 0, 0, 4], [1, 2, 0, 0]])
    y = torch.randn(2, 4, 3, dtype=torch.float64)
    (expected,) = torch.autograd.grad(0.5 * (F.embedding(i, w, padding_idx=2) - y).pow(2).sum(), [w])
    assert torch.equal(module.gradients(w=w.detach(), i=i, y=y).w, expected)


class Conv1D(nn.Module):
    """transformers' ``pytorch_utils.Conv1D`` (GPT-2's linear layers, the weight stored [in, out]), as written there."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.3)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class BertStyleEmbeddings(nn.Module):
    """BERT's embeddings as transformers writes them: ``input_ids.view(-1, T)``, positions sliced from a
    ``position_ids`` buffer (``self.position_ids[:, :seq_length]``), token types passed in; then GPT-2's Conv1D."""

    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(7, 6, padding_idx=0)
        self.position_embeddings = nn.Embedding(12, 6)
        self.token_type_embeddings = nn.Embedding(2, 6)
        self.register_buffer("position_ids", torch.arange(12).expand((1, -1)), persistent=False)
        self.proj = Conv1D(4, 6)

    def forward(self, input_ids, token_type_ids):
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        batch_size, seq_length = input_shape
        position_ids = self.position_ids[:, 0:seq_length]
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.proj(torch.tanh(embeddings + self.position_embeddings(position_ids)))


def test_bert_style_position_ids_sliced_from_a_buffer_and_gpt2_conv1d_train_as_autograd(tmp_path):
    """Slicing the position_ids buffer is a read, not a write (it was refused as one); the rows at the whole
    buffer are narrowed to the length read from input_ids at run time; Conv1D's addmm is one op."""
    torch.manual_seed(2)
    model = BertStyleEmbeddings().double()
    text = trace(
        model,
        {"input_ids": (2, 3), "token_type_ids": (2, 3)},
        "parameters",
        "bert_style",
        dtypes={"input_ids": "int64", "token_type_ids": "int64"},
    )
    assert "op: addmm" in text and "length: {like: input_ids, dims: [1]}" in text, text
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    idx, types = torch.randint(0, 7, (3, 5)), torch.randint(0, 2, (3, 5))  # another batch and length
    outputs = [net(idx, types) for net in (fast, reference)]
    assert torch.equal(outputs[0], outputs[1])  # torch.addmm itself: the model's values bit for bit
    for output in outputs:
        (output * torch.linspace(-1, 1, 4, dtype=torch.float64)).sum().backward()
    for (key, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert (ours.grad - theirs.grad).abs().max().item() <= 1e-12, key


def test_a_cache_started_as_an_empty_tensor_is_concatenated_as_pytorch_does():
    """transformers' DynamicLayer starts its cache as ``torch.tensor([])`` and concatenates each step's keys to
    it; PyTorch's cat leaves a 1-d empty tensor out, so the cache is the keys (GPT-2 called as it is, with its
    cache on, was refused at that cat)."""

    def attend(x, w):
        keys = torch.tensor([], dtype=x.dtype, device=x.device)
        keys = torch.cat([keys, x @ w], dim=-2)
        return torch.tanh(keys)

    text = trace(attend, {"x": (2, 3, 4), "w": (4, 4)}, name="cached", loss=LossChoice("half_sq_error"))
    spec = load_yaml(text)
    assert [layer["op"] for layer in spec["layers"]] == ["matmul", "tanh"], text
    module = module_from_source(build_text(text, "cached.yaml").rendered.files["cached.py"], "cached")
    x, w = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True), torch.randn(4, 4, dtype=torch.float64)
    target = torch.randn(3, 5, 4, dtype=torch.float64)
    (expected,) = torch.autograd.grad(0.5 * (attend(x, w) - target).pow(2).sum(), [x])
    got = module.gradients(x=x.detach(), w=w, **{spec["loss"]["target"]: target}).x
    assert (got - expected).abs().max().item() <= 1e-12


class MaskedAttention(nn.Module):
    """Self-attention with dropout reading a padding mask given as transformers' 4-d additive form (0 where a key
    is attended, the dtype's most negative number where it is padding), [B, 1, 1 or T, T]."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)

    def forward(self, x, attention_mask):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 2).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.2 if self.training else 0.0)
        return y.transpose(1, 2).reshape(B, T, 4)


def test_a_padding_mask_in_the_4d_additive_form_trains_with_attention_dropout_as_autograd(tmp_path):
    torch.manual_seed(3)
    model = MaskedAttention().double()
    text = trace(model, {"x": (2, 3, 4), "attention_mask": (2, 1, 1, 3)}, "parameters", "masked")
    assert "attn_mask: attention_mask" in text and "op: attention_probabilities" in text, text
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    keep = torch.ones(3, 5)
    keep[0, -2:] = 0  # the first sequence is padded
    mask = torch.zeros(3, 1, 1, 5, dtype=torch.float64).masked_fill(
        keep[:, None, None] == 0, torch.finfo(torch.float64).min
    )
    outputs = []
    for net in (fast, reference):
        torch.manual_seed(9)
        outputs.append(net(x, mask))
        (outputs[-1] * torch.linspace(-1, 1, 4, dtype=torch.float64)).sum().backward()
    assert torch.equal(outputs[0], outputs[1])
    for (key, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert (ours.grad - theirs.grad).abs().max().item() <= 1e-12, key


class BufferedTypes(nn.Module):
    """BERT's token types when none are passed (modeling_bert.py:91-93): its type buffer, expanded and gathered
    at the positions sliced from the position buffer, expanded to the batch. Here neither buffer is BERT's
    plain one (types 0, 1, 2 in turn; positions a permutation), so that a wrong pick or corner shows."""

    def __init__(self):
        super().__init__()
        self.token_type_embeddings = nn.Embedding(3, 3)
        self.register_buffer("position_ids", (torch.arange(8) * 5 % 8).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", (torch.arange(8) % 3).view(1, -1), persistent=False)

    def forward(self, x):
        batch_size, seq_length = x.shape[:2]
        position_ids = self.position_ids[:, :seq_length]
        buffered = torch.gather(self.token_type_ids.expand(position_ids.shape[0], -1), dim=1, index=position_ids)
        return torch.tanh(x * self.token_type_embeddings(buffered.expand(batch_size, seq_length)))


def test_ids_gathered_from_an_integer_buffer_are_the_tables_rows_read_at_run_time(tmp_path):
    """Traced at [2, 3, 3], the ids are the table's rows at the whole type buffer, picked at the position
    buffer, narrowed to the length and expanded to the batch read from x; equal to autograd at [3, 5, 3]."""
    torch.manual_seed(4)
    model = BufferedTypes().double()
    text = trace(model, {"x": (2, 3, 3)}, "parameters", "buffered_types")
    ops = [layer["op"] for layer in load_yaml(text)["layers"]]
    assert ops[:5] == ["embedding", "index", "reshape", "narrow", "expand"], text
    reference = copy.deepcopy(model)
    fast = symgrad.bind(_generated(tmp_path, text), model)
    x = torch.randn(3, 5, 3, dtype=torch.float64)
    outputs = [net(x) for net in (fast, reference)]
    assert (outputs[0] - outputs[1]).abs().max().item() <= 1e-12
    for output in outputs:
        (output * torch.tensor([0.3, -1.1, 0.7], dtype=torch.float64)).sum().backward()
    weights = model.token_type_embeddings.weight, reference.token_type_embeddings.weight
    assert weights[1].grad.abs().sum(1).min() > 0  # every type's row is read at this length
    assert (weights[0].grad - weights[1].grad).abs().max().item() <= 1e-12


def test_ids_gathered_from_an_integer_buffer_otherwise_are_refused_with_a_fix_that_needs_no_edit():
    """Ids gathered along a dim whose other dims are not 1 (not BERT's form) stay refused, naming the fix."""

    class Gathers(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(3, 3)
            self.register_buffer("ids", torch.arange(6).view(2, 3) % 3, persistent=False)
            self.register_buffer("at", torch.tensor([[2, 0, 1], [1, 1, 0]]), persistent=False)

        def forward(self, x):
            return x * self.table(torch.gather(self.ids, 1, self.at))

    with pytest.raises(TraceError) as error:
        trace(Gathers().double(), {"x": (2, 3, 3)}, loss=LossChoice("half_sq_error"))
    (line,) = str(error.value).splitlines()
    assert "test_text_transformers.py:" in line and "gathers integers" in line and "token_type_ids=" in line, line
