"""The information floor of a profile's decision: the least expected cost at which any
procedure, however it allocates its runs and whenever it stops, picks a configuration
within 5% of the best with probability at least `p_right` and recommends a candidate no
faster than the baseline with probability at most `p_false` (docs/analysis.md, "The
information floor").

The model: each finished run of configuration k is one observation of log T_k, Gaussian
with mean mu_k and a known spread sd (the same for every configuration), and costs its own
expected T, c_k. Which configurations are departed is taken as known (a procedure that must
also find it out can only cost more). For any procedure that meets the error rates on every
such model, and every alternative model lambda under which none of the right answers of mu
is right, the change-of-measure inequality of fixed-confidence best-arm identification
(Kaufmann, Cappe & Garivier, JMLR 17(1), 2016, Lemma 1; with costs, Kanarios, Zhang & Ying,
arXiv 2402.16710) bounds the expected numbers of runs N_k:

    sum_k N_k (mu_k - lambda_k)^2 / (2 sd^2)  >=  kl(p_right, p_lambda),

p_lambda the error the procedure may make under lambda by giving one of mu's answers:
`p_false` where each of them is then a candidate no faster than the baseline, 1 - p_right
otherwise. The floor is the least sum_k c_k N_k under every such inequality: a linear
program in N over a set of alternatives without end, solved by adding, for the allocation
found so far, the nearest alternative of each kind until none is violated (a cutting-plane
method; the value at every round is itself a lower bound, and the last is the floor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, linprog

WITHIN = 1.05


def kl_bernoulli(p: float, q: float) -> float:
    """kl(p, q) = p log(p/q) + (1-p) log((1-p)/(1-q)), the divergence of two coins."""
    def term(a, b):
        return 0.0 if a == 0 else a * math.log(a / b)
    return term(p, q) + term(1 - p, 1 - q)


@dataclass
class Floor:
    """The floor's value (in the units of `costs`), the expected runs per configuration that
    reach it, and the alternatives that bind (each: the configuration made best, and the
    error rate its inequality used)."""

    cost: float
    runs: list[float]
    binding: list[dict]
    right: list[int]


def right_answers(log_t: list[float], eligible: list[bool], within: float = WITHIN) -> list[int]:
    """The configurations within `within` of the best eligible one's T."""
    best = min(m for m, e in zip(log_t, eligible) if e)
    return [k for k, (m, e) in enumerate(zip(log_t, eligible))
            if e and m <= best + math.log(within) + 1e-12]


def _nearest(mu: np.ndarray, n: np.ndarray, b: int, right: list[int], eps: float) -> np.ndarray:
    """The alternative nearest to mu in the weighted distance sum_k n_k (lambda_k - mu_k)^2
    under which b is faster than every one of `right` by the margin eps (log of WITHIN):
    lambda_b = x and lambda_i = max(mu_i, x + eps), x the root of the derivative of that
    convex function of x (increasing, negative far below mu_b, not negative at mu_b)."""
    nb = max(float(n[b]), 1e-12)

    def slope(x):
        return nb * (x - mu[b]) + sum(n[i] * max(0.0, x + eps - mu[i]) for i in right)

    lo = min(mu[i] for i in right) - eps - 1.0
    while slope(lo) > 0:
        lo -= 1.0
    x = mu[b] if slope(mu[b]) <= 0 else brentq(slope, lo, mu[b], xtol=1e-12)
    lam = mu.copy()
    lam[b] = x
    for i in right:
        lam[i] = max(mu[i], x + eps)
    return lam


@dataclass
class _Alternatives:
    """What makes an alternative lambda bind: mu, the spread, the right answers under mu,
    the configurations a decision may pick, and the error rates allowed."""

    mu: np.ndarray
    sd: float
    right: list[int]
    pool: list[int]
    margin: float
    baseline: int
    p_right: float
    p_false: float

    def error_rate(self, lam) -> float | None:
        """What a correct procedure may give mu's answers with under lam: the error rate of
        the kind of error they all are there (None: some answer is right and no false
        recommendation under lam, so nothing bounds it)."""
        best = min(lam[k] for k in self.pool)
        wrong = all(lam[i] >= best + self.margin - 1e-9 for i in self.right)
        false = all(i != self.baseline and lam[i] >= lam[self.baseline] - 1e-9
                    for i in self.right)
        if wrong and false:
            return min(1 - self.p_right, self.p_false)
        if wrong or false:
            return (1 - self.p_right) if wrong else self.p_false
        return None

    def need(self, lam) -> float:
        """The right side of the inequality: kl(p_right, the error rate under lam)."""
        rate = self.error_rate(lam)
        return 0.0 if rate is None or rate >= self.p_right else kl_bernoulli(self.p_right, rate)

    def distance(self, lam) -> np.ndarray:
        """Per configuration, the divergence of one run under mu from one under lam."""
        return (self.mu - lam) ** 2 / (2 * self.sd * self.sd)


def information_floor(log_t: list[float], costs: list[float], eligible: list[bool],
                      sd: float, p_right: float = 0.9, p_false: float = 0.05,
                      baseline: int = 0, within: float = WITHIN,
                      rounds: int = 500) -> Floor:
    """The floor for configurations with true mean log T `log_t`, expected cost per run
    `costs`, `eligible` (the configurations a decision may pick: the reference's family,
    not departed; the baseline is one), and a per-run spread `sd` of log T.

    Two kinds of alternative bind: one under which a configuration b outside the right
    answers is faster than each of them by the margin (each answer then a wrong pick, which
    a procedure may give with probability 1 - p_right), and, where the baseline is not a
    right answer, one under which each of them is no faster than the baseline (each answer
    then a false recommendation, allowed p_false). Alternatives that make some answers wrong
    picks and the others false recommendations are left out: leaving inequalities out can
    only lower the value, so the floor stays a lower bound."""
    if sd <= 0:
        raise ValueError("the spread of log T must be positive")
    mu = np.asarray(log_t, dtype=float)
    right = right_answers(log_t, eligible, within)
    alt = _Alternatives(mu, sd, right, [k for k, e in enumerate(eligible) if e],
                        math.log(within), baseline, p_right, p_false)
    shapes = [(b, alt.margin) for b, e in enumerate(eligible) if e and b not in right]
    if baseline not in right:
        shapes.append((baseline, 0.0))
    if not shapes:  # every eligible configuration is a right pick: nothing to learn
        return Floor(0.0, [0.0] * len(mu), [], right)
    c = np.asarray(costs, dtype=float)
    n, cuts = _cutting_planes(alt, c, shapes, rounds)
    binding = []
    for row, nd, k in cuts:
        if nd > 0 and abs(float(np.dot(row, n)) - nd) <= 1e-6 * nd and k not in binding:
            binding.append(k)
    return Floor(float(np.dot(c, n)), [float(v) for v in n], binding, right)


def _cutting_planes(alt: _Alternatives, c: np.ndarray, shapes: list[tuple[int, float]],
                    rounds: int) -> tuple[np.ndarray, list[tuple]]:
    """The least-cost allocation under every alternative's inequality: solve over the
    alternatives found so far, add the nearest one of each shape that the allocation
    violates, until none is. Returns the allocation and the cuts (distance row, need,
    description)."""
    cuts: list[tuple] = []

    def add(lam, b, eps):
        cuts.append((alt.distance(lam), alt.need(lam),
                     {"made_best": b, "margin": eps, "error_rate": alt.error_rate(lam)}))

    n = np.ones(len(alt.mu))
    for b, eps in shapes:
        add(_nearest(alt.mu, n, b, alt.right, eps), b, eps)
    for _ in range(rounds):
        res = linprog(c, A_ub=-np.array([r for r, _, _ in cuts]),
                      b_ub=-np.array([nd for _, nd, _ in cuts]),
                      bounds=[(0, None)] * len(alt.mu), method="highs")
        if res.status != 0:
            raise RuntimeError(f"the floor's linear program failed: {res.message}")
        n = res.x
        added = False
        for b, eps in shapes:
            lam = _nearest(alt.mu, n, b, alt.right, eps)
            if float(np.dot(n, alt.distance(lam))) < alt.need(lam) * (1 - 1e-6):
                add(lam, b, eps)
                added = True
        if not added:
            break
    return n, cuts
