"""``python -m pyro_ext.demo``: the demo tour (see :mod:`pyro_ext.demo`)."""

from pyro_ext.demo import main

if __name__ == "__main__":
    main()
