"""The demo tour's chapters run (quick mode) and print their results."""

import pytest

from pyro_ext import demo


@pytest.mark.parametrize("chapter", sorted(demo.CHAPTERS))
def test_demo_chapter_runs_quick(chapter, capsys):
    demo.main(["--chapter", chapter, "--quick"])
    out = capsys.readouterr().out
    assert "== Chapter" in out
    assert "nan" not in out.lower()
