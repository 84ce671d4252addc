"""Scaling-law fits of the loss: ``L(N, D) = E + A / N^alpha + B / D^beta`` (nats per token, ``N``
parameters, ``D`` training tokens), and the parameter and token counts that minimise it at a
compute budget (``vtrain-fast optimal --fit``). Pure Python: no kernel reads these fits.

Sources: Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models", Eq. 4 and Eq. 10
(Approach 3; the kernels' ``loss`` column is this fit, :func:`vtrain_fast.model.totals.chinchilla_loss`,
from the constants of :mod:`vtrain_fast.model.records`); Besiroglu, Erdil, Barnett, You 2024 (Epoch
AI), "Chinchilla Scaling: A replication attempt", arXiv:2404.10102, Table 1; Sardana, Portes,
Doubov, Frankle 2024, "Beyond Chinchilla-Optimal", arXiv:2401.00448, Sec. 2 (lifetime compute with
inference).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.records import CHINCHILLA_A, CHINCHILLA_ALPHA, CHINCHILLA_B, CHINCHILLA_BETA, CHINCHILLA_E


@dataclass(frozen=True)
class LossFit:
    """One fit of the parametric loss ``L(N, D) = E + A / N^alpha + B / D^beta`` (nats per token,
    ``N`` parameters, ``D`` training tokens).

    Attributes
    ----------
    name : str
        Key in :data:`LOSS_FITS` (``vtrain-fast optimal --fit``).
    E, A, B, alpha, beta : float
        The fitted constants.
    source : str
        Paper, equation or table.
    """

    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    def loss(self, num_parameters, num_tokens):
        """``E + A / N^alpha + B / D^beta``, nats per token (numbers or numpy arrays)."""
        return self.E + self.A / num_parameters ** self.alpha + self.B / num_tokens ** self.beta

    def compute_optimal(self, flops):
        """``(N, D)`` minimising :meth:`loss` at fixed training FLOPs ``C = 6 N D``: ``N = G (C/6)^a``,
        ``D = (C/6) / N``, ``G = (alpha A / (beta B))^(1/(alpha+beta))``, ``a = beta / (alpha+beta)``
        (Hoffmann et al. 2022, Eq. 4). ``flops`` in FLOPs (a number or a numpy array)."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        n = g * (flops / 6.0) ** (self.beta / (self.alpha + self.beta))
        return n, flops / 6.0 / n

    def optimal_with_inference(self, flops: float, inference_tokens: float) -> tuple[float, float]:
        """``(N, D)`` minimising :meth:`loss` at fixed lifetime FLOPs ``C = 6 N D + 2 N D_inf``:
        training on ``D`` tokens plus serving ``D_inf = inference_tokens`` tokens at ``2 N`` FLOPs
        each (Sardana, Portes, Doubov, Frankle 2024, "Beyond Chinchilla-Optimal: Accounting for
        Inference in Language Model Scaling Laws", arXiv:2401.00448, Sec. 2, the compute
        formulation). No closed form (the paper solves it numerically): a golden-section search
        over ``log N`` on ``D = (C - 2 N D_inf) / (6 N) > 0``, along which the loss has a single
        minimum. ``inference_tokens = 0`` gives :meth:`compute_optimal`.

        Raises
        ------
        ValueError
            ``flops`` or ``inference_tokens`` negative or not finite (a caller's bug: the
            command checks its input first).
        """
        if not (math.isfinite(flops) and flops > 0 and math.isfinite(inference_tokens) and inference_tokens >= 0):
            raise ValueError(f"flops {flops!r} and inference_tokens {inference_tokens!r}: positive and finite")
        if inference_tokens == 0:
            n, d = self.compute_optimal(flops)
            return float(n), float(d)

        def loss_at(log_n):
            n = math.exp(log_n)
            d = (flops - 2.0 * n * inference_tokens) / (6.0 * n)
            return self.loss(n, d) if d > 0 else math.inf

        lo, hi = math.log(1.0), math.log(flops / (2.0 * inference_tokens)) - 1e-12   # D > 0 below hi
        r = (math.sqrt(5.0) - 1.0) / 2.0
        a, b = hi - r * (hi - lo), lo + r * (hi - lo)
        fa, fb = loss_at(a), loss_at(b)
        for _ in range(200):
            if fa <= fb:
                hi, b, fb = b, a, fa
                a = hi - r * (hi - lo)
                fa = loss_at(a)
            else:
                lo, a, fa = a, b, fb
                b = lo + r * (hi - lo)
                fb = loss_at(b)
        n = math.exp((lo + hi) / 2.0)
        return n, (flops - 2.0 * n * inference_tokens) / (6.0 * n)


# The loss fits a caller can choose (the kernels' ``loss`` column is always ``hoffmann``'s, from
# the constants above; other fits are computed in Python from num_parameters and num_tokens).
LOSS_FITS = {f.name: f for f in (
    LossFit("hoffmann", CHINCHILLA_E, CHINCHILLA_A, CHINCHILLA_B, CHINCHILLA_ALPHA, CHINCHILLA_BETA,
            "Hoffmann et al. 2022, 'Training Compute-Optimal Large Language Models', Eq. 10 (Approach 3, "
            "the rounded constants of the paper's body)"),
    LossFit("epoch", 1.8172, 482.01, 2085.43, 0.3478, 0.3658,
            "Besiroglu, Erdil, Barnett, You 2024 (Epoch AI), 'Chinchilla Scaling: A replication attempt', "
            "arXiv:2404.10102, Table 1 (their estimate of Approach 3 on the data reconstructed from "
            "Hoffmann et al.'s Figure 4)"),
)}
