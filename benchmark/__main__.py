"""`python -m benchmark`: see benchmark/suite.py."""

from benchmark.suite import main

main()
