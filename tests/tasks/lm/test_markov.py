"""The synthetic LM corpus: a Markov chain whose entropy rate is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from params.errors import ConfigError
from tasks.lm import markov


@pytest.fixture(scope="module")
def chain() -> markov.MarkovChain:
    return markov.make_markov_chain(num_states=32, num_successors=4, seed=1234)


def test_chain_is_sparse_stochastic_and_stationary(chain):
    p = chain.transitions
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    assert ((p > 0).sum(axis=1) == 4).all()
    np.testing.assert_allclose(chain.stationary @ p, chain.stationary, atol=1e-12)
    assert chain.stationary.min() > 0  # irreducible: every state is visited
    assert np.isclose(chain.stationary.sum(), 1.0)


def test_entropy_rate_matches_monte_carlo(chain):
    states = markov.sample(chain, num_sequences=400, length=500, seed=7)
    nll = -np.log(chain.transitions[states[:, :-1], states[:, 1:]])
    estimate = nll.mean()
    # Standard error from independent sequences (tokens within one are correlated).
    stderr = nll.mean(axis=1).std() / np.sqrt(len(nll))
    assert abs(estimate - markov.entropy_rate(chain)) < 4 * stderr + 1e-3
    assert 0.5 < markov.entropy_rate(chain) < np.log(4)  # sparse: below log(successors)


def test_achievable_log_pplx_matches_monte_carlo(chain):
    length = 32
    states = markov.sample(chain, num_sequences=20000, length=length, seed=8)
    first = -np.log(chain.stationary[states[:, 0]])
    rest = -np.log(chain.transitions[states[:, :-1], states[:, 1:]])
    per_sequence = (first + rest.sum(axis=1)) / length
    want = markov.achievable_log_pplx(chain, length)
    assert abs(per_sequence.mean() - want) < 4 * per_sequence.std() / np.sqrt(len(per_sequence))
    # The closed form mixes H(pi) for the first token with H for the others.
    h, h_pi = markov.entropy_rate(chain), markov.stationary_entropy(chain)
    assert want == pytest.approx((h_pi + (length - 1) * h) / length)
    assert h < want < h_pi
    # token_entropies is a lower-variance estimate of the same quantity.
    entropies = markov.token_entropies(chain, states)
    assert abs(entropies.mean() - want) < 0.01


def test_first_state_is_drawn_from_pi(chain):
    states = markov.sample(chain, num_sequences=50000, length=2, seed=9)
    freq = np.bincount(states[:, 0], minlength=chain.num_states) / len(states)
    np.testing.assert_allclose(freq, chain.stationary, atol=0.01)


def test_generation_is_deterministic_by_seed():
    a = markov.make_markov_chain(16, 3, seed=5)
    b = markov.make_markov_chain(16, 3, seed=5)
    c = markov.make_markov_chain(16, 3, seed=6)
    np.testing.assert_array_equal(a.transitions, b.transitions)
    assert not np.array_equal(a.transitions, c.transitions)
    np.testing.assert_array_equal(markov.sample(a, 5, 10, seed=1), markov.sample(b, 5, 10, seed=1))
    assert not np.array_equal(markov.sample(a, 5, 10, seed=1), markov.sample(a, 5, 10, seed=2))


def test_bad_chain_settings_are_config_errors():
    with pytest.raises(ConfigError, match="num_successors"):
        markov.make_markov_chain(4, 5, seed=1)
