"""Forward permutation traversal (PAPERS.md section 3): follow a permutation H times.

Token format (n = n_nodes, H_max = hops_max; `vocab_size(n, H_max)` = n + 3 + H_max):

    ids 0 .. n-1         the nodes
    PAD   = n            right padding when train.seq_len is longer than needed
    BOS   = n + 1        opens every example
    QUERY = n + 2        separates the permutation from the question
    HOP_h = n + 2 + h    the hop count h, for h = 1 .. H_max

    position  0     1 .. 2n                  2n+1    2n+2   2n+3     2n+4
    token     BOS   x1 p(x1) ... xn p(xn)    QUERY   s      HOP_H    answer = p^H(s)

The n (node, image) pairs list the whole permutation p, in a random order; s is the start node.
The model reads tokens 0 .. 2n+3 and predicts the answer at position 2n+3 (the HOP token), so
`inputs` = tokens[:-1], `targets` = tokens[1:], and T = `seq_len(n)` = 2n + 4; a longer
train.seq_len is padded on the right with PAD (mask off; inputs[2n+4] is then the answer token,
which only the padded positions after the answer position can see under causal attention).

Fields of one example (a batch stacks them; B = local batch size):

    inputs, targets  (T,) int32
    mask             (T,) bool     True only at answer_pos: only the answer is supervised
    answer_pos       ()   int32    2n + 3, where the answer and every hop label are read
    answer           ()   int32    p^H(s) (= targets[answer_pos])
    start            ()   int32    s
    hops             ()   int32    H, uniform in [hops_min, hops_max]
    hop_labels       (H_max,) int32  hop_labels[j-1] = p^j(s), the node after hop j; 0 past H
    hop_mask         (H_max,) bool   True for j <= H

Intermediate supervision: hop j's label supervises loop boundary j (the output of loop j at
answer_pos). When n_loops != H, `loop_labels` gives the convention: one hop per loop; loops
after the walk has ended (j > H) hold the answer; the last loop always answers, so with
n_loops < H the last loop has to do the remaining hops at once. `loop_labels` is what a trainer
or a probe should call rather than indexing hop_labels itself. An unshared model (one loop) is
supervised at its layer boundaries instead (`layer_labels`): with L layers and H hops, the
boundary after layer l carries the node after l*H/L hops where that is a whole number (after
layers 4, 8, ... for 32 layers and 8 hops: the depth at which the looped 4 x 8 model's loop
boundaries sit), and nothing elsewhere.

Shortcut: answering s itself is right exactly when the length of s's cycle divides H. For a
uniformly random permutation the cycle length of a given node is uniform on 1..n, so the
shortcut is right with probability #{d <= n : d | H} / n (`shortcut_probability`);
`shortcut_accuracy` measures it on a batch. Report it beside every accuracy.

Train and eval never share a permutation: each permutation belongs to eval when a hash of it
is 0 modulo EVAL_MODULUS (1/16 of all permutations), and every example is drawn by rejection
from its own class. Example i of a split is a pure function of (seed, split, i).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from loopscale.config.schema import DataConfig
from loopscale.errors import UsageError

SPECIALS = 3  # PAD, BOS, QUERY
EVAL_MODULUS = 16
SPLIT_CODES = {"train": 0, "eval": 1}


def vocab_size(n_nodes: int, hops_max: int) -> int:
    return n_nodes + SPECIALS + hops_max


def seq_len(n_nodes: int) -> int:
    """Model input length T: BOS, 2n pair tokens, QUERY, start, HOP (the answer is a target)."""
    return 2 * n_nodes + 4


def pad_id(n_nodes: int) -> int:
    return n_nodes


def bos_id(n_nodes: int) -> int:
    return n_nodes + 1


def query_id(n_nodes: int) -> int:
    return n_nodes + 2


def hop_id(n_nodes: int, hops: int) -> int:
    return n_nodes + 2 + hops


def is_eval_permutation(perm: np.ndarray) -> bool:
    """The fixed train/eval partition of all permutations (independent of the seed)."""
    digest = hashlib.blake2b(np.asarray(perm, "<u2").tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % EVAL_MODULUS == 0


def follow(perm: np.ndarray, start: int, hops: int) -> np.ndarray:
    """[p(s), p^2(s), ..., p^hops(s)]."""
    out = np.empty(hops, np.int32)
    node = start
    for j in range(hops):
        node = int(perm[node])
        out[j] = node
    return out


def cycle_length(perm: np.ndarray, start: int) -> int:
    node, n = int(perm[start]), 1
    while node != start:
        node, n = int(perm[node]), n + 1
    return n


@dataclasses.dataclass(frozen=True)
class PermutationTask:
    """Makes example i of a split; picklable so grain can run it in worker processes."""

    n_nodes: int
    hops_min: int
    hops_max: int
    seed: int
    split: str
    length: int  # T, at least seq_len(n_nodes)

    def __post_init__(self):
        if self.n_nodes < 4:
            # below 4 nodes a hash partition can leave one split with no permutation at all
            raise UsageError(f"data.n_nodes={self.n_nodes} must be at least 4")
        if self.n_nodes >= 2**16:
            raise UsageError(f"data.n_nodes={self.n_nodes} must be below 65536")
        if not 1 <= self.hops_min <= self.hops_max:
            raise UsageError(
                f"data.hops_min={self.hops_min} and data.hops_max={self.hops_max} must satisfy "
                "1 <= hops_min <= hops_max"
            )
        if self.length < seq_len(self.n_nodes):
            raise UsageError(
                f"train.seq_len={self.length} is shorter than the permutation task needs "
                f"(2 * n_nodes + 4 = {seq_len(self.n_nodes)})"
            )
        if self.seed < 0:
            raise UsageError(f"seed={self.seed} must be non-negative")
        if self.split not in SPLIT_CODES:
            raise ValueError(f"split must be one of {sorted(SPLIT_CODES)}, not {self.split!r}")

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.n_nodes, self.hops_max)

    def _permutation(self, rng: np.random.Generator) -> np.ndarray:
        want_eval = self.split == "eval"
        while True:  # expected tries: 16 for eval, 16/15 for train
            perm = rng.permutation(self.n_nodes)
            if is_eval_permutation(perm) == want_eval:
                return perm

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        n = self.n_nodes
        rng = np.random.default_rng([self.seed, SPLIT_CODES[self.split], int(index)])
        perm = self._permutation(rng)
        order = rng.permutation(n)  # the order the pairs are listed in
        start = int(rng.integers(n))
        hops = int(rng.integers(self.hops_min, self.hops_max + 1))
        walk = follow(perm, start, hops)

        tokens = np.full(self.length + 1, pad_id(n), np.int32)
        tokens[0] = bos_id(n)
        tokens[1 : 2 * n + 1 : 2] = order
        tokens[2 : 2 * n + 2 : 2] = perm[order]
        tokens[2 * n + 1] = query_id(n)
        tokens[2 * n + 2] = start
        tokens[2 * n + 3] = hop_id(n, hops)
        tokens[2 * n + 4] = walk[-1]
        answer_pos = 2 * n + 3
        mask = np.zeros(self.length, bool)
        mask[answer_pos] = True
        hop_labels = np.zeros(self.hops_max, np.int32)
        hop_labels[:hops] = walk
        return {
            "inputs": tokens[:-1],
            "targets": tokens[1:],
            "mask": mask,
            "answer_pos": np.int32(answer_pos),
            "answer": np.int32(walk[-1]),
            "start": np.int32(start),
            "hops": np.int32(hops),
            "hop_labels": hop_labels,
            "hop_mask": np.arange(1, self.hops_max + 1) <= hops,
        }


def make_task(data: DataConfig, seed: int, split: str, length: int) -> PermutationTask:
    return PermutationTask(data.n_nodes, data.hops_min, data.hops_max, seed, split, length)


def loop_labels(batch: dict[str, np.ndarray], n_loops: int) -> np.ndarray:
    """(B, n_loops) int32: the node loop boundary j (1-based) is supervised with at answer_pos.

    j < n_loops: the node after min(j, H) hops (one hop per loop, then hold the answer);
    j = n_loops: the answer, whatever H is (the last loop is the model's output)."""
    hop_labels, hops = np.asarray(batch["hop_labels"]), np.asarray(batch["hops"])
    j = np.arange(1, n_loops + 1)[None, :]
    idx = np.minimum(j, hops[:, None]) - 1
    labels = np.take_along_axis(hop_labels, np.minimum(idx, hop_labels.shape[1] - 1), axis=1)
    labels[:, -1] = np.asarray(batch["answer"])
    return labels.astype(np.int32)


def layer_labels(batch: dict[str, np.ndarray], n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels, mask), each (B, n_layers - 1): the node the boundary after layer l (1-based,
    l < n_layers; the last layer is the answer's) is supervised with, and whether it is."""
    hop_labels, hops = np.asarray(batch["hop_labels"]), np.asarray(batch["hops"])
    layer = np.arange(1, n_layers)[None, :]
    done = layer * hops[:, None]
    mask = (done % n_layers == 0) & (done > 0)
    idx = np.clip(done // n_layers - 1, 0, hop_labels.shape[1] - 1)
    labels = np.where(mask, np.take_along_axis(hop_labels, idx, axis=1), 0)
    return labels.astype(np.int32), mask


def supervision_labels(batch: dict[str, np.ndarray], n_loops: int, n_layers: int) -> dict:
    """The extra batch fields intermediate supervision trains on: loop boundaries of a looped
    model (`loop_labels`), layer boundaries of an unshared one (`layer_labels` and its mask)."""
    if n_loops > 1:
        return {"loop_labels": loop_labels(batch, n_loops)}
    labels, mask = layer_labels(batch, n_layers)
    return {"layer_labels": labels, "layer_label_mask": mask}


def corrupt_start(batch: dict[str, np.ndarray], n_nodes: int, rng: np.random.Generator
                  ) -> dict[str, np.ndarray]:
    """Each example's corrupted twin, for activation patching: the same permutation, listing
    and hop count from another start node s' = (s + r) mod n, r uniform in 1 .. n-1. Its answer
    p^H(s') always differs from p^H(s), since p^H is a bijection. Returns `inputs` (the start
    token replaced, and the answer token where padding after the answer position shows it),
    `start` and `answer`, as the clean batch's fields."""
    inputs = np.array(batch["inputs"], np.int32)
    B, n = inputs.shape[0], n_nodes
    start = (np.asarray(batch["start"]) + rng.integers(1, n, size=B)) % n
    perm = np.empty((B, n), np.int64)
    perm[np.arange(B)[:, None], inputs[:, 1:2 * n + 1:2]] = inputs[:, 2:2 * n + 2:2]
    answer = np.array([follow(perm[b], int(start[b]), int(batch["hops"][b]))[-1]
                       for b in range(B)], np.int32)
    inputs[:, 2 * n + 2] = start
    if inputs.shape[1] > 2 * n + 4:
        inputs[:, 2 * n + 4] = answer
    return {"inputs": inputs, "start": start.astype(np.int32), "answer": answer}


def shortcut_accuracy(batch: dict[str, np.ndarray]) -> float:
    """Fraction of examples where answering the start node is right (its cycle length divides H)."""
    return float(np.mean(np.asarray(batch["start"]) == np.asarray(batch["answer"])))


def shortcut_probability(n_nodes: int, hops_min: int, hops_max: int) -> float:
    """Expected shortcut accuracy for uniform permutations and H uniform in [hops_min, hops_max]."""
    per_h = [
        sum(1 for d in range(1, n_nodes + 1) if h % d == 0) / n_nodes
        for h in range(hops_min, hops_max + 1)
    ]
    return float(np.mean(per_h))
