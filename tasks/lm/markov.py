"""A random sparse Markov chain whose entropy rate is known in closed form.

The chain over ``num_states`` symbols gives each state ``num_successors`` successors with random
(Dirichlet) probabilities. Successor ``i + 1 (mod n)`` is always among them, so the chain is
irreducible, and state 0 always has a self-loop, so it is aperiodic: the stationary distribution
``pi`` is unique and a sequence started from ``pi`` is stationary.

For such a sequence ``x_1..x_T`` the best possible per-token log-perplexity (nats) is
``(H(pi) + (T - 1) * H) / T``: the first token has entropy ``H(pi)``, each later one the entropy rate
``H = -sum_i pi_i sum_j P_ij log P_ij``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from params.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class MarkovChain:
    """Transition matrix ``[n, n]`` (rows sum to 1) and its stationary distribution ``[n]``."""

    transitions: np.ndarray
    stationary: np.ndarray

    @property
    def num_states(self) -> int:
        return self.transitions.shape[0]


def _row_entropies(transitions: np.ndarray) -> np.ndarray:
    p = transitions
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis=1)


def stationary_distribution(transitions: np.ndarray) -> np.ndarray:
    """The ``pi`` with ``pi P = pi`` and ``sum(pi) = 1`` (least squares on the stacked system)."""
    n = transitions.shape[0]
    a = np.vstack([transitions.T - np.eye(n), np.ones((1, n))])
    b = np.concatenate([np.zeros(n), [1.0]])
    pi, *_ = np.linalg.lstsq(a, b, rcond=None)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def make_markov_chain(
    num_states: int, num_successors: int, seed: int, concentration: float = 1.0
) -> MarkovChain:
    """A random sparse chain; the same arguments always give the same chain."""
    if num_states < 2 or not 1 <= num_successors <= num_states:
        raise ConfigError(
            f"Markov chain: need num_states >= 2 and 1 <= num_successors <= num_states, got "
            f"{num_states} and {num_successors}"
        )
    rng = np.random.RandomState(seed)
    transitions = np.zeros((num_states, num_states))
    for i in range(num_states):
        required = [(i + 1) % num_states] + ([0] if i == 0 else [])
        others = [j for j in rng.permutation(num_states) if j not in required]
        successors = (required + others)[: max(num_successors, len(required))]
        transitions[i, successors] = rng.dirichlet([concentration] * len(successors))
    return MarkovChain(transitions, stationary_distribution(transitions))


def entropy_rate(chain: MarkovChain) -> float:
    """``H = -sum_i pi_i sum_j P_ij log P_ij`` in nats per token."""
    return float(np.dot(chain.stationary, _row_entropies(chain.transitions)))


def stationary_entropy(chain: MarkovChain) -> float:
    """``H(pi)``: the entropy of the first token of a stationary sequence."""
    pi = chain.stationary[chain.stationary > 0]
    return float(-np.sum(pi * np.log(pi)))


def achievable_log_pplx(chain: MarkovChain, length: int) -> float:
    """The lowest expected per-token log-perplexity of a model on sequences of ``length`` tokens."""
    return (stationary_entropy(chain) + (length - 1) * entropy_rate(chain)) / length


def sample(chain: MarkovChain, num_sequences: int, length: int, seed: int) -> np.ndarray:
    """``[num_sequences, length]`` state sequences, each started from ``pi``; deterministic by seed."""
    rng = np.random.RandomState(seed)
    cumulative = np.cumsum(chain.transitions, axis=1)
    states = np.empty((num_sequences, length), dtype=np.int64)
    states[:, 0] = rng.choice(chain.num_states, size=num_sequences, p=chain.stationary)
    for t in range(1, length):
        u = rng.random_sample(num_sequences)[:, None]
        nxt = (u > cumulative[states[:, t - 1]]).sum(axis=1)
        states[:, t] = np.minimum(nxt, chain.num_states - 1)
    return states


def token_entropies(chain: MarkovChain, states: np.ndarray) -> np.ndarray:
    """The entropy (nats) of the distribution each token of ``states [..., T]`` was drawn from:
    ``H(pi)`` for the first, ``H(P[x_{t-1}])`` after. Their mean is an unbiased, low-variance
    estimate of ``achievable_log_pplx`` on those very sequences."""
    rows = _row_entropies(chain.transitions)
    out = np.empty(states.shape, dtype=np.float64)
    out[..., 0] = stationary_entropy(chain)
    out[..., 1:] = rows[states[..., :-1]]
    return out
