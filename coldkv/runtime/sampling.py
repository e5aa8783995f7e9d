"""Next-token sampling: greedy at temperature 0, else temperature, top-k, top-p; seeded."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


class Sampler:
    """Draws from one numpy Generator seeded once, so a run is reproducible token for token."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """logits [vocab] -> token id."""
        if self.params.temperature == 0:
            return int(np.argmax(logits))
        probs = self.probs(logits)
        return int(self.rng.choice(probs.shape[0], p=probs))

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The distribution a draw comes from (temperature > 0): float64 [vocab], zero outside
        the top-k / top-p set."""
        p = self.params
        z = logits.astype(np.float64) / p.temperature
        if 0 < p.top_k < z.shape[0]:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z = np.where(z < kth, -np.inf, z)
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        if p.top_p < 1:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cum, p.top_p)) + 1]  # smallest set reaching top_p
            mask = np.zeros_like(probs)
            mask[keep] = probs[keep]
            probs = mask / mask.sum()
        return probs
