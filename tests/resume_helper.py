"""A tiny training run for the resume test: an MLP of carbon.nn.Linear with
carbon.tanh, a mean-squared loss through carbon.mean, gradient clipping and
carbon.optim.AdamW; optionally a carbon.nn.Dropout between the layers whose
masks are drawn from its own carbon.Generator (one draw per step). And the
main flow: a plain torch.nn model with torch.nn.Dropout and torch.optim.AdamW
trained under carbon.enabled (init and masks from carbon.default_generator).
Used in-process and from a fresh subprocess."""

from __future__ import annotations

import hashlib
import sys

import torch

import carbon


P_DROP = 0.25
DROPOUT_SEED = 2**63 + 2025  # above 2**63: the checkpoint must keep all 64 bits of the seed


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(carbon.nn.Linear(12, 32), torch.nn.Identity(), carbon.nn.Linear(32, 4))
    opt = carbon.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    return model, opt


def make_with_dropout():
    """make()'s model and optimizer (same initial weights) with carbon.nn.Dropout(P_DROP) drawing from a fresh
    carbon.Generator(seed=DROPOUT_SEED) in place of the Identity; returns (model, opt, generator)."""
    model, opt = make()
    generator = carbon.Generator(seed=DROPOUT_SEED)
    model[1] = carbon.nn.Dropout(P_DROP, generator=generator)  # no parameters: opt is unchanged
    return model, opt, generator


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 12, generator=g), torch.randn(16, 4, generator=g)


def train(model, opt, start: int, stop: int) -> None:
    for step in range(start, stop):
        x, y = batch(step)
        h = model[1](carbon.tanh(model[0](x)))  # Identity, or dropout (one draw of its generator)
        d = model[2](h) - y
        loss = carbon.mean(d * d)
        opt.zero_grad()
        loss.backward()
        carbon.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()


def digest(model, opt) -> str:
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    for p in model.parameters():
        for key, value in sorted(opt.state[p].items()):
            h.update(key.encode())
            h.update(value.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def resume(path: str, start: int, stop: int) -> None:
    """Fresh process: build, load the checkpoint, train on, print the digest."""
    model, opt = make()
    torch.manual_seed(12345)  # a different global state must not matter
    extra = carbon.load(path, model=model, optimizer=opt)
    assert extra["step"] == start, extra
    train(model, opt, start, stop)
    print(digest(model, opt))


def generator_state(generator) -> str:
    """The generator's state (seed and offset, 16 bytes) in hex."""
    return bytes(generator.get_state().tolist()).hex()


def resume_with_dropout(path: str, start: int, stop: int) -> None:
    """Fresh process, the dropout model: build, load model, optimizer and generator, train on, print the digest
    and the generator's state (two lines)."""
    model, opt, generator = make_with_dropout()
    torch.manual_seed(12345)  # different global states must not matter
    carbon.manual_seed(12345)
    extra = carbon.load(path, model=model, optimizer=opt, generator=generator)
    assert extra["step"] == start, extra
    assert model[1].generator is generator
    train(model, opt, start, stop)
    print(digest(model, opt))
    print(generator_state(generator))


# ---- the main flow: plain torch.nn / torch.optim under carbon.enabled ---------------------------------------------

ENABLE_SEED = 2**63 + 77  # seeds carbon.default_generator: the init and every dropout mask come from it


def make_plain():
    """An ordinary torch model and optimizer -- torch.nn.Linear, GELU, Dropout(P_DROP), Linear and
    torch.optim.AdamW -- to be built while carbon is enabled: the Linear layers' init (uniform_) draws from
    carbon.default_generator."""
    assert carbon.is_enabled()
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Dropout(P_DROP),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    return model, opt


def plain_batches(stop: int):
    """Fixed data for steps 0..stop-1, made outside carbon (while enabled, torch.randn would draw from
    carbon.default_generator, whatever its generator= says)."""
    assert not carbon.is_enabled()
    return [batch(step) for step in range(stop)]


def train_plain(model, opt, data, start: int, stop: int) -> None:
    """Steps start..stop-1 of plain torch code; to run while carbon is enabled (its dropout draws one mask of
    carbon.default_generator per step, AdamW's step is carbon's)."""
    assert carbon.is_enabled()
    model.train()
    for step in range(start, stop):
        x, y = data[step]
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()


def resume_plain(path: str, start: int, stop: int) -> None:
    """Fresh process, the main flow: enable carbon with another seed, build the model (its init, drawn from the
    default generator, is overwritten by the load), load model, optimizer and carbon.default_generator -- after
    enabling, so the loaded state wins over enable's seed and the init's draws -- train on, print the digest and
    the default generator's state (two lines)."""
    data = plain_batches(stop)
    with carbon.enabled(seed=12345):
        model, opt = make_plain()
        torch.manual_seed(54321)  # while enabled this also reseeds carbon.default_generator: must not matter
        extra = carbon.load(path, model=model, optimizer=opt, generator=carbon.default_generator)
        assert extra["step"] == start, extra
        train_plain(model, opt, data, start, stop)
    print(digest(model, opt))
    print(generator_state(carbon.default_generator))


if __name__ == "__main__":
    resume(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
