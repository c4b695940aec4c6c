"""The public API of pyro_ext.ara: the names the issue fixes, and every export resolves."""

import pyro_ext.ara as ara


def test_api_floor_names():
    from pyro_ext.ara import (  # noqa: F401
        ACRA,
        ARATrainer,
        BernoulliNaiveBayes,
        fgsm,
        good_word_insertion,
        pgd,
        security_evaluation_curve,
    )


def test_all_exports_resolve():
    assert sorted(ara.__all__) == sorted(set(ara.__all__))
    for name in ara.__all__:
        assert getattr(ara, name).__module__.startswith("pyro_ext.ara.")
