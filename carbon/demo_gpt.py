"""The demo's model and training loop: a small character-level GPT written in
plain PyTorch (torch.nn modules, torch.nn.functional, torch.optim), trained on
the text that ships with carbon (carbon/data/corpus.txt).

Nothing here imports carbon: the demo trains this same code once as it is and
once under ``carbon.enabled(seed=...)`` (carbon/demo.py), which makes the same
torch calls run carbon's exact kernels.

The training step (``train``), for a batch of B sequences of T tokens split
into k micro-batches of B/k sequences (gradient accumulation)::

    for each micro-batch m:
        loss_m = F.cross_entropy(logits_m, targets_m, reduction="sum") / (B * T)
        loss_m.backward()                     # gradients add up in p.grad
    clip_grad_norm_(parameters, 1.0); AdamW step

The loss of every micro-batch is divided by the token count of the *whole*
batch, so with k = 1 this is the mean cross-entropy, and with B*T a power of
two the division is exact (a change of exponent). Each micro-batch therefore
sees the same per-token gradients as the whole batch; under carbon every
activation and every per-token gradient is the same bits whatever k. What k
changes is the parameter gradients: each is a sum over tokens, computed by
carbon as one exact sum rounded once *per backward pass*, so k micro-batches
give RN(RN(S_1) + ... + RN(S_k)) where one batch gives RN(S_1 + ... + S_k).
These differ in the last bit for some elements, and the runs diverge from
there. (With dropout > 0 the split also changes the masks: each micro-batch
is its own draw. The demo's model has no dropout.) That is not a failure of determinism — the same k gives the same bits
at any thread count and on any device — but float32 gradient accumulation
rounds each partial sum, and no loss formulation can undo a rounding that
autograd has already done. carbon/demo.py reports it this way.

Batches are drawn with Python's ``random.Random(seed)`` (not torch's RNG),
so every configuration — plain or carbon, any device — sees the same data.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, ContextManager, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GPTConfig", "GPT", "CharData", "load_corpus", "TrainConfig", "TrainResult", "train", "GOLDEN"]


# --------------------------------------------------------------------------
# Data


def load_corpus() -> str:
    """The demo corpus shipped with carbon (carbon/data/corpus.txt, public domain)."""
    return resources.files("carbon").joinpath("data", "corpus.txt").read_text(encoding="utf-8")


class CharData:
    """Character-level tokenizer and batch sampler over ``text``: the
    vocabulary is the sorted set of characters; token i of the vocabulary
    is ``chars[i]``."""

    def __init__(self, text: str) -> None:
        if len(text) < 2:
            raise ValueError("CharData: the text must have at least 2 characters")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.tokens = torch.tensor([self.stoi[c] for c in text], dtype=torch.int64)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> List[int]:
        return [self.stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batches(self, batch_size: int, block_size: int, seed: int):
        """An endless iterator of (x, y) CPU int64 tensors [batch_size, block_size]:
        windows at offsets from ``random.Random(seed)``; y is x shifted by one."""
        if block_size + 1 > len(self.tokens):
            raise ValueError(f"CharData: block_size {block_size} is too long for a text of {len(self.tokens)} characters")
        rng = random.Random(seed)
        high = len(self.tokens) - block_size - 1
        while True:
            starts = [rng.randint(0, high) for _ in range(batch_size)]
            x = torch.stack([self.tokens[s:s + block_size] for s in starts])
            y = torch.stack([self.tokens[s + 1:s + block_size + 1] for s in starts])
            yield x, y


# --------------------------------------------------------------------------
# Model (plain PyTorch)


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.n_embd % cfg.n_head != 0:
            raise ValueError(f"GPTConfig: n_embd ({cfg.n_embd}) must be a multiple of n_head ({cfg.n_head})")
        self.n_head, self.n_embd, self.dropout = cfg.n_head, cfg.n_embd, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` pre-LayerNorm blocks, a final
    LayerNorm and a linear head (untied). Weights ~ N(0, 0.02) (the output
    projections of each block N(0, 0.02/sqrt(2 n_layer)), as GPT-2), biases 0."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        """Logits [B, T, vocab] for token ids ``idx`` [B, T] (T <= block_size)."""
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"GPT: sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------
# Training


@dataclass
class TrainConfig:
    """One training run. ``batch_size`` sequences of ``model.block_size``
    tokens per step, split into ``micro_batches`` (must divide batch_size)."""

    steps: int = 250
    batch_size: int = 16
    micro_batches: int = 1
    lr: float = 3e-3
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0
    device: str = "cpu"
    threads: Optional[int] = None  # torch.set_num_threads for the run (None: leave as is)
    model: Dict[str, Any] = field(default_factory=lambda: dict(block_size=32, n_layer=2, n_head=4, n_embd=64,
                                                                  dropout=0.0))


@dataclass
class TrainResult:
    losses: List[float]
    model: GPT
    optimizer: torch.optim.Optimizer
    seconds: float

    @property
    def final_loss(self) -> float:
        return self.losses[-1]


def train(cfg: TrainConfig, data: Optional[CharData] = None,
          context: Optional[Callable[[], ContextManager]] = None,
          progress: Optional[Callable[[int, float], None]] = None) -> TrainResult:
    """Build the GPT (its initialization draws from torch's random ops) and
    train it for ``cfg.steps`` steps with torch.optim.AdamW and
    torch.nn.utils.clip_grad_norm_, all inside ``context()`` (e.g.
    ``lambda: carbon.enabled(seed=0)``; default: ``torch.manual_seed(cfg.seed)``
    only). ``progress(step, loss)`` is called after every step. Returns the
    per-step losses (Python floats), the model and optimizer (on cfg.device)
    and the wall time."""
    if cfg.steps < 1:
        raise ValueError(f"train: steps must be >= 1, got {cfg.steps}")
    if cfg.micro_batches < 1 or cfg.batch_size % cfg.micro_batches != 0:
        raise ValueError(f"train: micro_batches ({cfg.micro_batches}) must divide batch_size ({cfg.batch_size})")
    data = data or CharData(load_corpus())
    model_cfg = GPTConfig(vocab_size=data.vocab_size, **cfg.model)
    device = torch.device(cfg.device)
    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    losses: List[float] = []
    start = time.perf_counter()
    try:
        torch.manual_seed(cfg.seed)  # plain PyTorch's initialization and dropout (carbon: the context's seed)
        with (context() if context is not None else _no_context()):
            model = GPT(model_cfg).to(device)
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99),
                                          weight_decay=cfg.weight_decay)
            batches = data.batches(cfg.batch_size, model_cfg.block_size, cfg.seed)
            n_tokens = cfg.batch_size * model_cfg.block_size
            for step in range(cfg.steps):
                x, y = next(batches)
                optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                for xm, ym in zip(x.chunk(cfg.micro_batches), y.chunk(cfg.micro_batches)):
                    xm, ym = xm.to(device), ym.to(device)
                    logits = model(xm)
                    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ym.view(-1), reduction="sum") / n_tokens
                    loss.backward()
                    step_loss += loss.item()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                optimizer.step()
                losses.append(step_loss)
                if progress is not None:
                    progress(step, step_loss)
            if device.type == "cuda":
                torch.cuda.synchronize()
    finally:
        torch.set_num_threads(threads_before)
    return TrainResult(losses, model, optimizer, time.perf_counter() - start)


class _no_context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# The short run whose carbon fingerprint (model and optimizer) is committed in
# tests/demo_golden.txt; tests/test_demo.py checks it on the CPU and
# ``python -m carbon demo`` on every device it runs on.
GOLDEN = TrainConfig(steps=4, batch_size=4, micro_batches=1, seed=1234,
                     model=dict(block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.1))
