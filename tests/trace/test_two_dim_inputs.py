"""A number computed from dim 1 of a 2-dim input ([N, T] floats, or token ids for an Embedding) is never frozen
silently. The run at another dim 1 (``rerun.dim_one_pins``) changed inputs of 3 or more dims alone, so the
mean of ``torch.arange(x.shape[1])`` over a float [N, T] was the traced T's number at any T, and a model scaling
by ``ids.shape[1] - 1`` did not trace at all (the size, an int that carries its dims, reached the YAML writer:
"RepresenterError ... bug in symgrad's tracer"). Now 2-dim inputs get that run too: where the model runs there
and the spec differs, dim 1 is checked at its traced size, an int64 input's where the first layer reads it
(``emb_checked = _size_check(emb, ids.shape[1] == 6, ...)``), and the generated module and ``symgrad.bind``
refuse another T in one line. Where dim 1 is a feature count (an MLP on [N, F]) the model does not run at
another, and nothing is checked (its ``* x.shape[1]`` is the same tracer bug before); where every number is read at
run time (``h[:, -1]``) nothing is checked either. Each test but that last one fails before."""

from __future__ import annotations

import pytest
import torch

from symgrad.check import module_from_source
from symgrad.trace import trace
from tests.helpers import bound_matches, generated_matches, load_yaml, model_in_folder, write_generated

SOURCE = """
import torch
import torch.nn as nn


class Floats(nn.Module):  # [N, T] floats: the token mean scaled by the mean position, made in forward from T
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 4)

    def forward(self, x):
        h = self.lin(x.unsqueeze(-1).expand(-1, -1, 5) * 1.0)
        return h.mean(1) * torch.arange(x.shape[1]).to(h.dtype).mean()


class Ids(nn.Module):  # [N, T] token ids: the last token scaled by T - 1
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 4)
        self.lin = nn.Linear(4, 3)

    def forward(self, ids):
        h = self.lin(self.emb(ids))
        return h[:, -1] * (ids.shape[1] - 1)


class Scaled(nn.Module):  # [N, T, C] floats scaled by T: a size as a number (was the same tracer bug)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * x.shape[1]


class Last(nn.Module):  # [N, T] token ids, the last token's features: read at run time, nothing to check
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 4)
        self.lin = nn.Linear(4, 3)

    def forward(self, ids):
        return self.lin(self.emb(ids))[:, -1]


class Limited(nn.Module):  # nanoGPT's positions: a table of 8, `assert t <= 8`, a branch on T kept at ids' reader
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(20, 4)
        self.wpe = nn.Embedding(8, 4)

    def forward(self, ids):
        t = ids.shape[1]
        assert t <= 8
        return (self.wte(ids) + self.wpe(torch.arange(t))).mean(1)


class Features(nn.Module):  # [N, F]: dim 1 is a feature count; the model does not run at another
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * x.shape[1])


class Paired(nn.Module):  # BERT-style ids and token types, both [N, T], added: they run only at one T together
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(20, 4)
        self.wtt = nn.Embedding(2, 4)
        self.lin = nn.Linear(4, 3)

    def forward(self, ids, types):
        return self.lin(self.wte(ids) + self.wtt(types)).sum(1) / (ids.shape[1] - 1)


class Padded(nn.Module):  # T padded to a multiple of 4: pad 0 at T = 8 and at 2T = 16 alike, 3 at T + 1
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.pad(self.fc(x), (0, 0, 0, (-x.shape[1]) % 4)).mean(1)


class Extra(nn.Module):  # x [N, T, C] scaled by T beside extra [N, K] of any K: only x follows its dim 1
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, extra):
        return self.fc(x).mean(1) * x.shape[1] + extra.mean(1, keepdim=True)
"""


def load(folder, name):
    return model_in_folder(folder, SOURCE, "two_dim_models", name)


def data(name: str, batch: int, tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if name in ("Ids", "Last", "Limited"):
        return torch.randint(0, 20, (batch, tokens), generator=generator)
    shape = (batch, tokens, 4) if name == "Scaled" else (batch, tokens)
    return torch.randn(*shape, dtype=torch.float64, generator=generator)


def traced(folder, name: str, shape: tuple, key: str = "x") -> tuple:
    """``name`` traced at ``shape``, its module generated into ``folder``: (the spec, the module)."""
    dtypes = {key: "int64"} if key == "ids" else None
    text = trace(load(folder, name), {key: shape}, "parameters", name.lower(), dtypes=dtypes)
    write_generated(folder, text, name.lower())
    return text, module_from_source((folder / f"{name.lower()}.py").read_text(), f"{name.lower()}_generated")


def refusal_of(call, *said: str) -> str:
    with pytest.raises(ValueError) as raised:
        call()
    text = str(raised.value)
    assert "\n" not in text, text
    for each in said:
        assert each in text, (each, text)
    return text


PINNED = [  # model, input, traced shape, what the refusal names at another T
    ("Floats", "x", (2, 6), ("two_dim_models.py:13:", "x.shape[1] == 6", "the argument other of mul")),
    ("Ids", "ids", (2, 6), ("two_dim_models.py:24:", "ids.shape[1] == 6", "the argument other of mul")),
    ("Scaled", "x", (2, 6, 4), ("two_dim_models.py:33:", "x.shape[1] == 6", "the argument other of mul")),
]


@pytest.mark.parametrize("name, key, shape, said", PINNED, ids=[case[0] for case in PINNED])
def test_dim_one_is_checked_where_a_number_follows_it(tmp_path, name, key, shape, said):
    """At the traced T and another batch: the generated module's forward is the model's and its float64 gradients
    autograd's through the original module, the bound model's too; at T = 9 both refuse in one line naming the
    dim, its traced size, the model's line and the fix (which works: traced at 9 it runs there)."""
    text, module = traced(tmp_path, name, shape, key)
    assert f"left: {{like: {key}, dims: [1]}}, right: 6, relation: eq" in text, text
    model = load(tmp_path, name)
    generated_matches(model, module, data(name, 3, 6))
    params = {k: value.detach().clone() for k, value in model.state_dict().items()}
    fix = ("as traced (the argument other of mul there follows it)", "(fix: ", "trace it at these sizes too")
    refusal_of(lambda: module.forward(data(name, 3, 9), params), *said, *fix)
    bound = bound_matches(load(tmp_path, name), tmp_path / f"{name.lower()}.py", data(name, 3, 6))
    refusal_of(lambda: bound(data(name, 3, 9)), *said, *fix)
    again = tmp_path / "again"
    again.mkdir()
    _, module = traced(again, name, (shape[0], 9, *shape[2:]), key)  # the fix as printed
    generated_matches(load(tmp_path, name), module, data(name, 3, 9))


def test_token_ids_are_checked_where_the_embedding_reads_them(tmp_path):
    text, _ = traced(tmp_path, "Ids", (2, 6), "ids")
    layers = [line.strip() for line in text.splitlines() if line.strip().startswith("- {op:")]
    assert layers[0].startswith("- {op: embedding, in: ids,"), layers
    assert layers[1].startswith("- {op: size_check, in: emb, left: {like: ids, dims: [1]}, right: 6,"), layers
    assert layers[2].startswith("- {op: linear, in: emb_checked,"), layers


def test_a_branch_on_token_ids_length_is_checked_where_they_are_read(tmp_path):
    """``assert t <= 8`` (a table of 8 positions): the model fails its assert at 2T and runs at T + 1, where the
    comparison's sides differ, so its check stays (it was dropped as fixed: the second run changes the batch
    alone) and sits after the embedding that reads ids. At T = 7 the generated module equals the model; at
    T = 9 it refuses in one line, where it raised torch's narrow error on the table of 8 (fails before)."""
    text, module = traced(tmp_path, "Limited", (2, 6), "ids")
    embedding, check = load_yaml(text)["layers"][:2]
    assert embedding["op"] == "embedding" and embedding["in"] == "ids", text
    assert check["op"] == "size_check" and check["in"] == embedding["out"] and check["relation"] == "le", text
    model = load(tmp_path, "Limited")
    generated_matches(model, module, data("Limited", 3, 7))  # another batch and T, below the table's length
    params = {k: value.detach().clone() for k, value in model.state_dict().items()}
    refusal_of(lambda: module.forward(data("Limited", 3, 9), params), "two_dim_models.py:54:", "shape[1] <= 8")


def test_an_index_read_at_run_time_needs_no_check(tmp_path):
    text, module = traced(tmp_path, "Last", (2, 6), "ids")
    assert "size_check" not in text, text
    generated_matches(load(tmp_path, "Last"), module, data("Last", 3, 9))


def test_a_feature_count_in_dim_one_is_not_checked(tmp_path):
    text, _ = traced(tmp_path, "Features", (2, 5))
    assert "size_check" not in text, text
    bound_matches(load(tmp_path, "Features"), tmp_path / "features.py", data("Features", 3, 5))


def test_a_sequence_beside_a_target_of_classes_is_still_checked(tmp_path):
    """x [N, T, C] and a float target [N, K] (a loss function around the model): at 2T for both the loss fails
    (the target's K doubled), so each input's dim 1 changes alone; x's follows T (the mean position), and is
    checked, the target's is not (fails with both changed together: nothing checked)."""
    from symgrad.pipeline import build_text

    model = load(tmp_path, "Scaled")

    def loss(x, target):
        return 0.5 * (model(x).mean(1) - target).pow(2).sum()

    text = trace(loss, {"x": (2, 6, 4), "target": (2, 4)}, name="scaled_loss")
    checks = [layer for layer in load_yaml(text)["layers"] if layer["op"] == "size_check"]
    assert [(check["in"], check["right"]) for check in checks] == [("x", 6)], text
    module = module_from_source(build_text(text, "scaled_loss.yaml").rendered.files["scaled_loss.py"], "scaled_loss")
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    params = {f"model_{key.replace('.', '_')}": value for key, value in state.items()}  # read from the closure
    target = torch.randn(3, 4, dtype=torch.float64)
    refusal_of(lambda: module.forward(data("Scaled", 3, 9), target, **params), "x.shape[1] == 6")


def _loss_module(text: str, name: str):
    from symgrad.pipeline import build_text

    return module_from_source(build_text(text, f"{name}.yaml").rendered.files[f"{name}.py"], name)


def _closure_params(model) -> dict:
    return {f"model_{key.replace('.', '_')}": value.detach().clone() for key, value in model.state_dict().items()}


def test_a_float_sequence_beside_a_target_is_checked(tmp_path):
    """A float [N, T] in a loss function with a float target [N, 4]: the run with both dims 1 changed fails at
    the loss, and a float 2-dim input was not changed alone (taken for a target): its T was held at 6 without a
    word (at T = 9 the generated loss 21.1 against the model's 45.6, reviewer RA). Now the inputs of each dim-1
    size change together, a size at a time: x's is checked, the target's is not. At T = 6 the loss is the
    model's; at T = 9 one line."""
    model = load(tmp_path, "Floats")

    def loss(x, target):
        return 0.5 * (model(x) - target).pow(2).sum()

    text = trace(loss, {"x": (2, 6), "target": (2, 4)}, name="floats_loss")
    checks = [layer for layer in load_yaml(text)["layers"] if layer["op"] == "size_check"]
    assert [(check["in"], check["right"]) for check in checks] == [("x", 6)], text
    module = _loss_module(text, "floats_loss")
    target = torch.randn(3, 4, dtype=torch.float64)
    got = module.forward(data("Floats", 3, 6), target, **_closure_params(model))
    got = got[0] if isinstance(got, tuple) else got
    assert torch.allclose(got, loss(data("Floats", 3, 6), target), rtol=1e-12, atol=0), got
    refusal_of(lambda: module.forward(data("Floats", 3, 9), target, **_closure_params(model)), "x.shape[1] == 6")


def test_token_ids_and_types_that_share_t_change_together(tmp_path):
    """ids and token types [N, T] added, in a loss function with a float target [N, 3]: with every dim 1
    changed the loss fails, with ids or types alone the add fails, so nothing was checked (at T = 9 the loss
    off by 1.04, reviewer RA). The inputs of one traced size change together: their T is checked."""
    model = load(tmp_path, "Paired")

    def loss(ids, types, target):
        return 0.5 * (model(ids, types) - target).pow(2).sum()

    dtypes = {"ids": "int64", "types": "int64"}
    text = trace(loss, {"ids": (2, 6), "types": (2, 6), "target": (2, 3)}, name="paired_loss", dtypes=dtypes)
    assert "dims: [1]}, right: 6, relation: eq" in text, text
    module = _loss_module(text, "paired_loss")
    generator = torch.Generator().manual_seed(3)
    target = torch.randn(3, 3, dtype=torch.float64, generator=generator)
    for tokens in (6, 9):
        ids = torch.randint(0, 20, (3, tokens), generator=generator)
        types = torch.randint(0, 2, (3, tokens), generator=generator)

        def call():
            got = module.forward(ids, types, target, **_closure_params(model))
            return got[0] if isinstance(got, tuple) else got

        if tokens == 6:
            assert torch.allclose(call(), loss(ids, types, target), rtol=1e-12, atol=0)
        else:
            refusal_of(call, ".shape[1] == 6")


def test_a_size_that_doubling_leaves_alike_is_checked_at_one_more(tmp_path):
    """T padded to a multiple of 4: traced at T = 8, the run at 2T pads 0 as the trace did, so nothing differed
    and the pad was held at 0 (silently off at T = 6, 7, 9, reviewer RA). Where 2T shows nothing the run at
    T + 1 is made too: x's dim 1 is checked."""
    text, module = traced(tmp_path, "Padded", (2, 8, 4))
    assert "left: {like: x, dims: [1]}, right: 8, relation: eq" in text, text
    model = load(tmp_path, "Padded")
    x = torch.randn(3, 8, 4, dtype=torch.float64)
    params = {k: value.detach().clone() for k, value in model.state_dict().items()}
    assert torch.equal(module.forward(x, params)[0], model(x))
    refusal_of(lambda: module.forward(torch.randn(3, 9, 4, dtype=torch.float64), params), "x.shape[1] == 8")


def test_only_the_input_whose_dim_one_differs_is_checked(tmp_path):
    """x [N, T, C] scaled by T beside extra [N, K] of any K: the run with both changed differs (x's T), and
    both were checked, so the model was refused at another K with "extra.shape[1] == 3" (reviewer RA). Each
    size's inputs change alone: only x is checked; another K runs and equals the model."""
    model = load(tmp_path, "Extra")
    text = trace(model, {"x": (2, 6, 4), "extra": (2, 3)}, "parameters", "extra")
    checks = [layer for layer in load_yaml(text)["layers"] if layer["op"] == "size_check"]
    assert [check["left"]["like"] for check in checks] == ["x"], text
    write_generated(tmp_path, text, "extra")
    module = module_from_source((tmp_path / "extra.py").read_text(), "extra_generated")
    params = {k: value.detach().clone() for k, value in model.state_dict().items()}
    x, extra = torch.randn(3, 6, 4, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    assert torch.equal(module.forward(x, extra, params)[0], model(x, extra))
