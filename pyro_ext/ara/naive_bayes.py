"""Bernoulli naive Bayes, the generative classifier of the spam experiments of thesis chapter 3."""

import torch

from ..ops.validation import check_positive

__all__ = ["BernoulliNaiveBayes", "check_binary", "check_labels"]


def _first(mask):
    """The index of the first ``True`` of ``mask``, as a tuple of ints."""
    return tuple(int(i) for i in mask.nonzero()[0])


def check_binary(x, name="x"):
    """
    Raise unless ``x`` holds only 0/1 word-presence indicators: ``TypeError`` for a
    non-tensor or a complex tensor, ``ValueError`` naming the first other value (NaN too).
    """
    if not torch.is_tensor(x):
        raise TypeError(
            f"{name} must be a tensor of 0/1 word-presence features, got {type(x).__name__}"
        )
    if x.is_complex():
        raise TypeError(f"{name} must be a real tensor of 0/1 features, got dtype {x.dtype}")
    bad = (x != 0) & (x != 1)
    if x.numel() and bad.any():
        index = _first(bad)
        raise ValueError(
            f"{name} must be binary (0/1) word-presence features, got {x[index].item()} at "
            f"{name}[{', '.join(map(str, index))}]"
        )


def check_labels(y, num_rows):
    """Raise unless ``y`` is a vector of ``num_rows`` labels in {0, 1}: ``TypeError`` for a
    non-tensor, ``ValueError`` naming the first wrong label."""
    if not torch.is_tensor(y):
        raise TypeError(f"y must be a 1-d tensor of labels in {{0, 1}}, got {type(y).__name__}")
    if y.dim() != 1:
        raise ValueError(
            f"y must be a 1-d tensor of labels in {{0, 1}}, got shape {tuple(y.shape)}"
        )
    if y.shape[0] != num_rows:
        raise ValueError(f"x and y must have matching rows, got {num_rows} and {y.shape[0]}")
    if y.is_complex():
        raise TypeError(f"y labels must be real numbers in {{0, 1}}, got dtype {y.dtype}")
    bad = (y != 0) & (y != 1)
    if y.numel() and bad.any():
        (index,) = _first(bad)
        raise ValueError(f"y labels must be in {{0, 1}}, got {y[index].item()} at y[{index}]")


class BernoulliNaiveBayes:
    """
    Bernoulli naive Bayes with Laplace (additive) smoothing, in torch.

    Estimates the classifier's beliefs :math:`p_C(y)` and :math:`p_C(x \\mid y) = \\prod_d
    \\theta_{yd}^{x_d} (1 - \\theta_{yd})^{1 - x_d}` from clean training data (Algorithm 3.1,
    training phase), with :math:`\\theta_{yd} = (N_{yd} + \\alpha) / (N_y + 2\\alpha)`. It matches
    :class:`sklearn.naive_bayes.BernoulliNB` with the same ``alpha`` (empirical class prior).

    :param float alpha: Additive smoothing pseudo-count, ``> 0``. ``alpha = 0`` (maximum
        likelihood) is refused: a word never seen in one class gets probability 0 there,
        and a message with it has log-likelihood ``-inf`` in that class (``0 * -inf =
        NaN`` in the matrix product, and ``NaN`` log-odds when both classes are ruled
        out). sklearn clips ``alpha`` to ``1e-10``; pass such a small value instead.
    """

    def __init__(self, alpha=1.0):
        try:
            self.alpha = check_positive(alpha, "alpha")
        except ValueError as error:
            raise ValueError(
                f"{error}: with alpha = 0 a word never seen in one class gives NaN "
                "probabilities; use a small value such as 1e-10 (what sklearn's BernoulliNB "
                "clips alpha to)"
            ) from None
        self.log_prior = None

    def fit(self, x, y):
        """
        :param torch.Tensor x: Binary features, shape ``(N, D)``.
        :param torch.Tensor y: Labels in {0, 1}, shape ``(N,)``; 1 is malicious (spam).
        :returns: ``self``
        """
        check_binary(x)
        if x.dim() != 2:
            raise ValueError(f"x must have shape (N, D), got {tuple(x.shape)}")
        check_labels(y, x.shape[0])
        counts = torch.stack([(y == c).sum() for c in (0, 1)]).to(x.dtype)
        if (counts == 0).any():
            raise ValueError("y must contain both labels 0 and 1")
        word_counts = torch.stack([x[y == c].sum(0) for c in (0, 1)])
        theta = (word_counts + self.alpha) / (counts.unsqueeze(-1) + 2 * self.alpha)
        self.log_prior = counts.log() - counts.sum().log()
        self.feature_log_prob = theta.log()
        self.feature_log1m_prob = (-theta).log1p()
        return self

    def _check_input(self, x):
        if self.log_prior is None:
            raise ValueError("BernoulliNaiveBayes is not fitted: call fit(x, y) first")
        check_binary(x)
        if x.dim() < 1:
            raise ValueError("x must have a feature dimension, shape (..., D), got a 0-d tensor")
        if x.shape[-1] != self.feature_log_prob.shape[-1]:
            raise ValueError(
                f"x has {x.shape[-1]} features, the classifier {self.feature_log_prob.shape[-1]}"
            )
        return x.to(self.feature_log_prob)

    def log_likelihood(self, x):
        """:returns: :math:`\\log p_C(x \\mid y)` for ``y = 0, 1``, shape ``(..., 2)``."""
        x = self._check_input(x)
        return x @ self.feature_log_prob.T + (1 - x) @ self.feature_log1m_prob.T

    def log_joint(self, x):
        """:returns: :math:`\\log p_C(x \\mid y) + \\log p_C(y)`, shape ``x.shape[:-1] + (2,)``."""
        return self.log_likelihood(x) + self.log_prior

    def logit(self, x):
        """:returns: The log-odds :math:`\\log p_C(y=1 \\mid x) / p_C(y=0 \\mid x)`."""
        log_joint = self.log_joint(x)
        return log_joint[..., 1] - log_joint[..., 0]

    def predict_proba(self, x):
        """:returns: :math:`p_C(y = 1 \\mid x)` (eq. 3.3 uses it with the 0-1 utility)."""
        return torch.sigmoid(self.logit(x))

    def predict(self, x):
        """:returns: Labels ``(N,)``, ``torch.long``, maximising the posterior (eq. 3.3)."""
        return (self.logit(x) > 0).long()
