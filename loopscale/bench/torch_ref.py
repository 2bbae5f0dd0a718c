"""The FLT authors' looped model as a PyTorch eager train step, for the JAX-vs-PyTorch figure.

A minimal re-implementation (not a copy) of the `FLT` path of the study's released code
(nanochat/gpt.py of FuRuF-11/FullyLoopedTransformer): token embedding; K loops, each restarting
from norm(e) through the same L blocks, where a block is x + Attn(q = norm(h), kv = norm(x)) with
h the previous loop's normalised output (no h on loop 1), then x + MLP(norm(x)); attention with
bias-free projections, rotary positions, parameter-free qk-norm and PyTorch's fused causal
`scaled_dot_product_attention`; relu^2 MLP of width 4d; parameter-free RMSNorm; untied head on
h of the last loop, logits soft-capped at 15, mean cross-entropy (their `END` loss); one AdamW
step (their recipe puts Muon on the block matrices; loopscale's `flt.py:tiny` uses AdamW
throughout, and so does this step, to time the same optimiser). float32, eager, torch's
default number of threads (one a core). torch is optional: `available()` says whether it is
installed.
"""

from __future__ import annotations

import importlib.util
import math
import os

from loopscale.config import Config


def available() -> bool:
    return importlib.util.find_spec("torch") is not None


def make_step(config: Config, seed: int = 0):
    """() -> None: one eager forward, backward and AdamW step of the model of `config`
    (`experiments/flt.py`: its d_model, heads, layers, loops, vocabulary, batch and length).

    Unless the environment says otherwise, torch's OpenMP threads sleep when idle
    (OMP_WAIT_POLICY=PASSIVE, read when torch loads): spinning, they take the cores from the
    JAX step timed next to them, and on a machine other processes share, an OpenMP barrier
    waits whole scheduler slices (measured here under load 7: median 1.1-4.7 s a step spinning,
    0.22 s sleeping)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import torch.nn.functional as F
    from torch import nn

    m, t = config.model, config.train
    D, H, L, K, V = m.d_model, m.n_heads, m.n_unique, m.n_loops, m.vocab_size
    Dh = m.d_head
    torch.manual_seed(seed)

    def norm(x):
        return F.rms_norm(x, (x.size(-1),), eps=m.norm_eps)

    freq = 1.0 / (m.rope_base ** (torch.arange(0, Dh, 2, dtype=torch.float32) / Dh))
    angles = torch.outer(torch.arange(t.seq_len, dtype=torch.float32), freq)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]

    def rope(x):  # (B, T, H, Dh), first/second half split
        x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_q, self.c_k, self.c_v = (nn.Linear(D, H * Dh, bias=False) for _ in range(3))
            self.c_proj = nn.Linear(H * Dh, D, bias=False)
            self.c_fc = nn.Linear(D, 4 * D, bias=False)
            self.mlp_proj = nn.Linear(4 * D, D, bias=False)

        def forward(self, x, h):
            B, T, _ = x.shape
            xn = norm(x)
            qn = xn if h is None else norm(h)
            q = norm(rope(self.c_q(qn).view(B, T, H, Dh))).transpose(1, 2)
            k = norm(rope(self.c_k(xn).view(B, T, H, Dh))).transpose(1, 2)
            v = self.c_v(xn).view(B, T, H, Dh).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, H * Dh))
            return x + self.mlp_proj(F.relu(self.c_fc(norm(x))).square())

    class LoopedGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, D)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lm_head = nn.Linear(D, V, bias=False)

        def forward(self, idx, targets):
            e = self.wte(idx)
            h = None
            for _ in range(K):
                x = norm(e)
                for block in self.blocks:
                    x = block(x, h)
                h = norm(x)
            logits = self.lm_head(h).float()
            logits = m.logit_softcap * torch.tanh(logits / m.logit_softcap) \
                if m.logit_softcap else logits
            return F.cross_entropy(logits.view(-1, V), targets.reshape(-1))

    model = LoopedGPT()
    for p in model.parameters():
        nn.init.normal_(p, std=1.0 / math.sqrt(D))
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(t.b1, t.b2), eps=t.eps,
                            weight_decay=t.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (t.batch_size, t.seq_len + 1), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        opt.step()
        loss.item()  # eager already ran it; this keeps the call symmetric with the JAX step

    return step


def version() -> str:
    import torch

    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
