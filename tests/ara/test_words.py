import itertools

import pytest
import torch

from pyro_ext.ara.words import (
    attack_candidates,
    good_word_insertion,
    originating_instances,
    word_deletion,
)


def all_rows(num_features, device):
    return torch.cartesian_prod(*[torch.tensor([0.0, 1.0], device=device)] * num_features)


def linear_proba(weights):
    return lambda z: torch.sigmoid(z @ weights + 0.3)


@pytest.mark.parametrize("insert", [True, False])
def test_attack_candidates(insert, device):
    x = torch.tensor([0.0, 1, 0, 0, 1, 0], device=device)
    candidates = attack_candidates(x, 2, insert)
    free = 4 if insert else 2
    assert candidates.shape == (1 + free + free * (free - 1) // 2, 6)
    assert (candidates[0] == x).all()
    assert torch.unique(candidates, dim=0).shape[0] == candidates.shape[0]
    flips = (candidates - x).abs().sum(-1)
    assert (flips <= 2).all() and (flips[1:] >= flips[:-1]).all()
    assert ((candidates >= x) if insert else (candidates <= x)).all()
    assert attack_candidates(x, 0, insert).shape == (1, 6)


def test_originating_instances_invert_insertion(device):
    rows = all_rows(4, device)
    for x_prime in rows:
        origins = originating_instances(x_prime, 2)
        assert (origins[0] == x_prime).all()
        reaches = [(attack_candidates(x, 2) == x_prime).all(-1).any() for x in rows]
        expected = rows[torch.stack(reaches)]
        assert {tuple(r.tolist()) for r in origins} == {tuple(r.tolist()) for r in expected}


@pytest.mark.parametrize("attack,insert", [(good_word_insertion, True), (word_deletion, False)])
def test_attack_is_exact_argmin(attack, insert, device):
    weights = torch.tensor([0.8, -1.5, -0.7, 0.4, -0.2, 1.1], device=device)
    predict_proba = linear_proba(weights)
    x = (torch.rand(20, 6, device=device) < 0.5).float()
    y = torch.randint(0, 2, (20,), device=device)
    attacked = attack(x, predict_proba, 2, y)
    for row, label, result in zip(x, y, attacked):
        if label == 0:
            assert (result == row).all()
            continue
        free = (row == (0 if insert else 1)).nonzero().squeeze(-1).tolist()
        best = min(
            float(predict_proba(flipped))
            for k in range(3)
            for subset in itertools.combinations(free, k)
            for flipped in [
                row.clone().index_fill_(
                    0, torch.tensor(subset, device=device).long(), float(insert)
                )
            ]
        )
        assert float(predict_proba(result)) == pytest.approx(best, abs=1e-6)
        assert (result - row).abs().sum() <= 2
    # Without labels every row is attacked.
    assert (attack(x, predict_proba, 2) == attack(x, predict_proba, 2, torch.ones_like(y))).all()
    assert (attack(x, predict_proba, 0, y) == x).all()


def test_accepts_numpy_scores():
    weights = torch.tensor([1.0, -1.0, 0.5])
    attacked = good_word_insertion(
        torch.tensor([[1.0, 0, 0]]), lambda z: torch.sigmoid(z @ weights).numpy(), 1
    )
    assert attacked.tolist() == [[1.0, 1.0, 0.0]]


def test_bad_input():
    x = torch.zeros(2, 54)
    predict_proba = linear_proba(torch.zeros(54))
    with pytest.raises(ValueError, match="n=60 exceeds the 54 features"):
        good_word_insertion(x, predict_proba, 60)
    with pytest.raises(ValueError, match="integer >= 0"):
        good_word_insertion(x, predict_proba, -1)
    with pytest.raises(TypeError, match="attacker budget n must be an integer >= 0"):
        word_deletion(x, predict_proba, 1.5)
    with pytest.raises(TypeError, match="attacker budget n must be an integer >= 0"):
        good_word_insertion(x, predict_proba, True)
    with pytest.raises(ValueError, match="binary"):
        good_word_insertion(x + 0.5, predict_proba, 2)
    with pytest.raises(ValueError, match="labels"):
        good_word_insertion(x, predict_proba, 2, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="single row"):
        attack_candidates(x, 2)
