import pytest
import torch

from pyro_ext.ara.naive_bayes import BernoulliNaiveBayes
from pyro_ext.datasets import load_spambase


@pytest.fixture(scope="module")
def spam():
    return load_spambase(binarized=True, dtype=torch.float64)


@pytest.mark.parametrize("alpha", [1.0, 1e-10])
def test_matches_sklearn_bernoulli_nb(spam, alpha, device):
    sklearn_nb = pytest.importorskip("sklearn.naive_bayes")
    x, y = spam
    train, test = slice(0, 3000), slice(3000, None)
    reference = sklearn_nb.BernoulliNB(alpha=alpha).fit(x[train].numpy(), y[train].numpy())
    nb = BernoulliNaiveBayes(alpha=alpha).fit(x[train].to(device), y[train].to(device))
    x_test = x[test].to(device)
    expected_joint = torch.as_tensor(reference.predict_joint_log_proba(x[test].numpy()))
    assert torch.allclose(nb.log_joint(x_test).cpu(), expected_joint, rtol=1e-6, atol=1e-6)
    assert torch.allclose(nb.log_prior.cpu(), torch.as_tensor(reference.class_log_prior_))
    expected_proba = torch.as_tensor(reference.predict_proba(x[test].numpy())[:, 1])
    assert torch.allclose(nb.predict_proba(x_test).cpu(), expected_proba, atol=1e-6)
    assert (nb.predict(x_test).cpu() == torch.as_tensor(reference.predict(x[test].numpy()))).all()
    assert nb.predict(x_test).dtype == torch.long


def test_shapes_and_consistency(device):
    x = torch.tensor([[0.0, 1, 1], [1, 0, 1], [1, 1, 0], [0, 0, 1]], device=device)
    y = torch.tensor([0, 1, 1, 0], device=device)
    nb = BernoulliNaiveBayes().fit(x, y)
    batch = x.expand(5, 4, 3)
    assert nb.log_likelihood(batch).shape == (5, 4, 2)
    joint = nb.log_joint(x)
    assert torch.allclose(joint, nb.log_likelihood(x) + nb.log_prior)
    assert torch.allclose(nb.predict_proba(x), joint.softmax(-1)[:, 1])
    # p(x | y) sums to one over the 2^3 binary vectors.
    grid = torch.cartesian_prod(*[torch.tensor([0.0, 1.0], device=device)] * 3)
    assert torch.allclose(nb.log_likelihood(grid).exp().sum(0), torch.ones(2, device=device))


def test_bad_input():
    x = torch.tensor([[0.0, 1], [1, 0]])
    with pytest.raises(ValueError, match="not fitted"):
        BernoulliNaiveBayes().predict(x)
    with pytest.raises(ValueError, match="binary"):
        BernoulliNaiveBayes().fit(x * 2, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="labels"):
        BernoulliNaiveBayes().fit(x, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="matching rows"):
        BernoulliNaiveBayes().fit(x, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="both labels"):
        BernoulliNaiveBayes().fit(x, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="alpha"):
        BernoulliNaiveBayes(alpha=-1.0)
    nb = BernoulliNaiveBayes().fit(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="binary"):
        nb.predict_proba(torch.tensor([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="features"):
        nb.predict_proba(torch.tensor([[0.0, 1.0, 1.0]]))
